// Part 1: at-least-once delivery, effects once. 100 orders, each credit job
// delivered three times (300 keyless jobs, three per order) to three worker
// processes at once. The guarded task (guardKey credit:order-N) writes one
// ledger row per order and reports the other deliveries as duplicates; the
// same task without the guard, run side by side, writes a row per delivery.
import { exactly } from "./figures.ts";
import { type DemoContext, onAnyEvent, type ScenarioResult, withDeadline, workerName } from "./scenario.ts";
import { renderTable } from "./summary-table.ts";
import type { WorkerEvent } from "./worker-processes.ts";

const ORDERS = 100;
const DELIVERIES = 3;
const TASKS = ["credit", "credit_unguarded"] as const;
type CreditTask = (typeof TASKS)[number];

export async function guardScenario(ctx: DemoContext): Promise<ScenarioResult> {
  const { client, progress, workers } = ctx;
  progress.section(`1. ${ORDERS} orders, each credit delivered ${DELIVERIES} times to ${workers.length} worker processes`);

  // Each order's deliveries sit side by side in the queue, so concurrent
  // workers pick them up at the same moment.
  const jobs = [];
  for (let orderId = 1; orderId <= ORDERS; orderId++) {
    for (const task of TASKS) {
      for (let d = 0; d < DELIVERIES; d++) jobs.push({ task, payload: { orderId, amount: 10 }, queue: "credits" });
    }
  }
  const total = jobs.length;
  const bar = progress.bar(`running ${total} credit jobs`, total);
  const ended = new Map<CreditTask, WorkerEvent[]>(TASKS.map((t) => [t, []]));
  let finished = 0;
  let resolveAll!: () => void;
  const allEnded = new Promise<void>((resolve) => (resolveAll = resolve));
  const stopListening = onAnyEvent(workers, (event) => {
    if (!TASKS.includes(event.task as CreditTask)) return;
    if (!["job:success", "job:duplicate", "job:failed"].includes(event.event)) return;
    ended.get(event.task as CreditTask)!.push(event);
    bar.update(++finished);
    if (finished >= total) resolveAll();
  });
  const started = performance.now();
  try {
    const outcomes = await client.enqueueMany(jobs);
    if (outcomes.some((o) => o.outcome !== "created")) throw new Error("enqueue_many did not create every credit job");
    await withDeadline(allEnded, 120_000, () => `credit jobs: ${finished} of ${total} finished after 120 s`, ctx.signal);
  } finally {
    stopListening();
  }
  const seconds = Math.round((performance.now() - started) / 100) / 10;
  bar.finish(`${total} credit jobs done in ${seconds} s`);

  const ledger = await ledgerCounts(ctx);
  const stats = await client.stats();
  const stat = (task: string, metric: string): number =>
    stats.filter((r) => r.task === task && r.metric === metric).reduce((sum, r) => sum + r.value, 0);
  const side = (task: CreditTask) => {
    const events = ended.get(task)!;
    const byWorker: Record<string, number> = {};
    for (const e of events) {
      const name = workerName(e.workerId);
      byWorker[name] = (byWorker[name] ?? 0) + 1;
    }
    return {
      jobs: ORDERS * DELIVERIES,
      succeeded: stat(task, "succeeded"),
      failed: stat(task, "failed"),
      ledgerRows: ledger.get(task)?.rows ?? 0,
      ordersCredited: ledger.get(task)?.orders ?? 0,
      ordersCreditedMoreThanOnce: ledger.get(task)?.overCredited ?? 0,
      duplicatesInStats: stat(task, "guard_duplicate"),
      duplicateEvents: events.filter((e) => e.event === "job:duplicate").length,
      jobsPerWorker: byWorker,
    };
  };
  const guarded = side("credit");
  const unguarded = side("credit_unguarded");
  const s = "guard";
  const figures = [
    exactly(s, "guarded: jobs succeeded", ORDERS * DELIVERIES, guarded.succeeded),
    exactly(s, "guarded: ledger rows", ORDERS, guarded.ledgerRows),
    exactly(s, "guarded: duplicates in stats() (guard_duplicate)", ORDERS * (DELIVERIES - 1), guarded.duplicatesInStats),
    exactly(s, "guarded: job:duplicate worker events", ORDERS * (DELIVERIES - 1), guarded.duplicateEvents),
    exactly(s, "guarded: orders credited more than once", 0, guarded.ordersCreditedMoreThanOnce),
    exactly(s, "unguarded: jobs succeeded", ORDERS * DELIVERIES, unguarded.succeeded),
    exactly(s, "unguarded: ledger rows", ORDERS * DELIVERIES, unguarded.ledgerRows),
    exactly(s, "unguarded: orders credited more than once", ORDERS, unguarded.ordersCreditedMoreThanOnce),
  ];
  const perWorker = (counts: Record<string, number>): string =>
    Object.entries(counts)
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([name, n]) => `${name} ${n}`)
      .join(", ");
  const report = [
    `1. At-least-once delivery, effects once: ${ORDERS} orders, each credit job delivered ${DELIVERIES} times`,
    `   (${ORDERS * DELIVERIES} keyless jobs per task) to ${workers.length} worker processes at once.`,
    "",
    ...renderTable(
      ["", "credit (guardKey credit:order-N)", "credit_unguarded (no guard)"],
      [
        ["deliveries run", guarded.succeeded, unguarded.succeeded],
        ["ledger rows written", guarded.ledgerRows, unguarded.ledgerRows],
        ["duplicates skipped (stats)", guarded.duplicatesInStats, unguarded.duplicatesInStats],
        ["orders credited more than once", guarded.ordersCreditedMoreThanOnce, unguarded.ordersCreditedMoreThanOnce],
        ["jobs per worker", perWorker(guarded.jobsPerWorker), perWorker(unguarded.jobsPerWorker)],
      ],
    ).map((line) => `   ${line}`),
    "",
    "   The guard row commits in the same transaction as the ledger row: a second delivery",
    "   finds it and completes without running the handler.",
  ];
  return {
    details: { orders: ORDERS, deliveriesPerOrder: DELIVERIES, workers: workers.length, seconds, guarded, unguarded },
    figures,
    report,
  };
}

async function ledgerCounts(ctx: DemoContext): Promise<Map<string, { rows: number; orders: number; overCredited: number }>> {
  const { rows } = await ctx.client.pool.query<{ task: string; rows: number; orders: number; over_credited: number }>(
    `SELECT task, sum(n)::int AS rows, count(*)::int AS orders, count(*) FILTER (WHERE n > 1)::int AS over_credited
       FROM (SELECT task, order_id, count(*) AS n FROM demo.ledger GROUP BY task, order_id) per_order
      GROUP BY task`,
  );
  return new Map(rows.map((r) => [r.task, { rows: r.rows, orders: r.orders, overCredited: r.over_credited }]));
}
