// Part 2: an effect outside the database. Invoice emails go through a fake
// provider that honours Idempotency-Key. The provider accepts invoice 2 and,
// before the answer reaches the worker (so before effect_done), the demo
// SIGKILLs that worker. Once the lease runs out, another worker rescues the
// job, finds the stale effect claim and resends with the same key: the
// provider replays its first answer, and the customer has one email.
import { exactly } from "./figures.ts";
import { type DemoContext, endOfAttempt, type ScenarioResult, waitForEvent, waitForJobs, withDeadline, workerName } from "./scenario.ts";
import type { DemoWorker } from "./worker-processes.ts";

const INVOICES = ["INV-1001", "INV-1002", "INV-1003"] as const;
const CRASH_ON = "INV-1002";

export async function emailScenario(ctx: DemoContext, mailer: DemoWorker, lease: string): Promise<ScenarioResult> {
  const { client, progress, emailProvider: provider } = ctx;
  progress.section(`2. ${INVOICES.length} invoice emails; ${mailer.name} is killed after the provider accepts ${CRASH_ON}`);
  const customer = (invoice: string): string => `customer-${invoice.slice(4)}@example.com`;

  let killedAfter: string | undefined;
  let resolveKilled!: () => void;
  const killed = new Promise<void>((resolve) => (resolveKilled = resolve));
  provider.onDelivered = async (_email, key) => {
    if (killedAfter !== undefined || key !== `invoice-email:${CRASH_ON}`) return;
    killedAfter = key;
    progress.step(`provider accepted ${CRASH_ON} (Idempotency-Key ${key}); SIGKILL ${mailer.name} (pid ${mailer.pid}) before it records the send`);
    await mailer.kill();
    resolveKilled();
  };

  const narrate = (worker: DemoWorker): void => {
    worker.on("event", (e) => {
      if (e.task !== "send_invoice") return;
      const who = workerName(e.workerId);
      if (e.event === "job:start" && e.reclaimed) {
        progress.step(`${who} reclaimed job #${e.jobId} (attempt ${e.attempt}) after its lease ran out: the email may be out already`);
      }
      if (e.event === "job:success") progress.step(`${who} finished job #${e.jobId} (attempt ${e.attempt})`);
    });
  };
  narrate(mailer);

  const ids: string[] = [];
  let takeover: DemoWorker | undefined;
  try {
    for (const invoice of INVOICES) {
      const { jobId } = await client.enqueue(
        "send_invoice",
        { invoice, customer: customer(invoice) },
        { queue: "emails", idempotencyKey: `send-invoice:${invoice}` },
      );
      ids.push(jobId);
    }
    await withDeadline(killed, 60_000, () => `${mailer.name} never sent ${CRASH_ON}`, ctx.signal);
    progress.step(`job #${ids[INVOICES.indexOf(CRASH_ON)]} (${CRASH_ON}) stays processing under a dead worker until its ${lease} lease runs out; starting mailer-2`);
    takeover = ctx.startWorker({ name: "mailer-2", queues: ["emails"], concurrency: 1 });
    narrate(takeover);
    const finished = await waitForJobs(ctx, ids, "invoice emails", 60_000);
    // The workers' event lines about the last attempts may still be on their
    // way, except from the killed mailer: a job it completed can commit (a
    // batched complete_many) just before the SIGKILL that keeps its event line
    // from ever leaving the process. Nothing more will come from it; seen
    // 2026-12-04: "no worker reported the end of job #601 within 30 s".
    const killedId = `${mailer.name}:${mailer.pid}`; // worker-tasks.ts names workers name:pid
    for (const job of finished) {
      if (job.lockedBy === killedId) continue;
      await waitForEvent(ctx, [mailer, takeover], endOfAttempt(job), `the end of job #${job.id}`);
    }
  } finally {
    provider.onDelivered = undefined;
  }

  const jobs = await Promise.all(ids.map((id) => client.getJob(id)));
  const crashed = jobs[INVOICES.indexOf(CRASH_ON)]!;
  const crashErrors = crashed.errors as Array<{ attempt?: number; class?: string; message?: string; worker?: string }>;
  const inbox = INVOICES.map((invoice) => ({
    invoice,
    customer: customer(invoice),
    emails: provider.inbox.get(customer(invoice))?.length ?? 0,
  }));
  const delivered = [...provider.deliveriesByKey.values()].reduce((a, b) => a + b, 0);
  const reclaimedStarts = (takeover?.events ?? []).filter((e) => e.event === "job:start" && e.reclaimed && e.jobId === crashed.id);
  const s = "email";
  const figures = [
    exactly(s, "invoice jobs succeeded", INVOICES.length, jobs.filter((j) => j?.state === "succeeded").length),
    exactly(s, `${mailer.name} SIGKILLed after the provider accepted ${CRASH_ON}`, true, killedAfter !== undefined),
    exactly(s, `${CRASH_ON}: attempts (the killed one, then the reclaim)`, 2, crashed.attempt),
    exactly(s, `${CRASH_ON}: reclaimed by mailer-2 after the lease ran out`, 1, reclaimedStarts.length),
    exactly(s, "provider requests (one resend with the same key)", INVOICES.length + 1, provider.requests),
    exactly(s, "requests replayed by Idempotency-Key", 1, provider.replays),
    exactly(s, "emails delivered", INVOICES.length, delivered),
    exactly(s, "customers with more than one email", 0, inbox.filter((i) => i.emails > 1).length),
  ];
  const report = [
    `2. Effects outside the database: ${INVOICES.length} invoice emails through a provider that honours Idempotency-Key.`,
    `   ${mailer.name} was SIGKILLed after the provider accepted ${CRASH_ON} and before ctx.effect recorded it.`,
    `   Job #${crashed.id} (${CRASH_ON}):`,
    ...crashErrors.map((e) => `     attempt ${e.attempt} on ${workerName(e.worker)}: ${e.class}: ${e.message}`),
    `     attempt ${crashed.attempt} on mailer-2: effect claim stale -> resent with the same key -> provider replayed ${JSON.stringify(crashed.result)}`,
    `   Provider: ${provider.requests} requests, ${provider.replays} replayed, ${delivered} emails delivered; ` +
      inbox.map((i) => `${i.customer} got ${i.emails}`).join(", "),
  ];
  return {
    details: {
      invoices: INVOICES.length,
      crashedInvoice: CRASH_ON,
      killedWorker: { name: mailer.name, pid: mailer.pid, signal: "SIGKILL" },
      crashedJob: { id: crashed.id, state: crashed.state, attempts: crashed.attempt, errors: crashErrors.map(({ attempt, class: cls, message }) => ({ attempt, class: cls, message })), result: crashed.result },
      provider: { requests: provider.requests, replays: provider.replays, delivered },
      inbox,
    },
    figures,
    report,
  };
}
