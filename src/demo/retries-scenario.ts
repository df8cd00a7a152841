// Part 3: retries. A supplier import that times out twice and succeeds on the
// third attempt, retried on the task's fixed backoff (200 ms, then 500 ms);
// and an import of a supplier that does not exist, which throws
// PermanentError and fails at once, without retries.
import { checked, exactly } from "./figures.ts";
import { type DemoContext, endOfAttempt, onAnyEvent, type ScenarioResult, waitForEvent, waitForJobs, workerName } from "./scenario.ts";
import type { WorkerEvent } from "./worker-processes.ts";

/** The backoff of import_supplier in worker-tasks.ts, in milliseconds. */
const BACKOFF_MS = [200, 500] as const;
/** How late a retry may start after its backoff (timers, a claim round trip on a busy machine) before the figure fails; the default polynomial backoff would wait 15 s or more. */
const SLACK_MS = 5000;

interface Attempt {
  attempt: number;
  worker: string;
  /** As the worker printed it (ISO 8601). */
  startedAt: string;
  durationMs?: number;
  outcome?: string;
  error?: string;
  /** Milliseconds between the end of the previous attempt and this one's start. */
  waitedMs?: number;
}

export async function retriesScenario(ctx: DemoContext): Promise<ScenarioResult> {
  const { client, progress, workers } = ctx;
  progress.section("3. A supplier import that times out twice, and an import that cannot succeed");
  const events: WorkerEvent[] = [];
  let acme = "";
  let globex = "";
  const stopListening = onAnyEvent(workers, (e) => {
    if (e.task !== "import_supplier") return;
    events.push(e);
    const who = workerName(e.workerId);
    const supplier = e.jobId === acme ? "acme" : "globex";
    if (e.event === "job:retry") {
      const start = events.find((s) => s.event === "job:start" && s.jobId === e.jobId && s.attempt === e.attempt);
      const end = start === undefined ? Date.parse(e.time) : Date.parse(start.time) + Number(e.durationMs);
      const retryIn = Math.round((Date.parse(String(e.retryAt)) - end) / 10) * 10;
      progress.step(`${who}: ${supplier} import, attempt ${e.attempt}: ${e.error?.class}: ${e.error?.message}; next attempt in ~${retryIn} ms`);
    } else if (e.event === "job:failed") {
      progress.step(`${who}: ${supplier} import, attempt ${e.attempt}: ${e.error?.class}: ${e.error?.message}; failed for good`);
    } else if (e.event === "job:success") {
      progress.step(`${who}: ${supplier} import, attempt ${e.attempt}: succeeded`);
    }
  });
  try {
    acme = (await client.enqueue("import_supplier", { supplier: "acme" }, { queue: "imports" })).jobId;
    globex = (await client.enqueue("import_supplier", { supplier: "globex" }, { queue: "imports" })).jobId;
    const jobs = await waitForJobs(ctx, [acme, globex], "supplier imports", 60_000);
    // The last attempt's event line may still be on its way from the worker.
    for (const job of jobs) {
      await waitForEvent(ctx, workers, endOfAttempt(job), `the end of job #${job.id}`);
    }
  } finally {
    stopListening();
  }

  const [acmeJob, globexJob] = await Promise.all([client.getJob(acme), client.getJob(globex)]);
  const acmeAttempts = attempts(events, acme);
  const errorClasses = (errors: unknown[]): string[] => errors.map((e) => String((e as { class?: unknown }).class));
  const acmeErrors = errorClasses(acmeJob!.errors);
  const globexErrors = errorClasses(globexJob!.errors);
  const s = "retries";
  // Attempt n + 1 waits out the n-th delay of the fixed backoff.
  const waitFigure = (n: number) => {
    const waited = acmeAttempts[n + 1]?.waitedMs;
    const backoff = BACKOFF_MS[n - 1]!;
    return checked(
      s,
      `acme: wait before attempt ${n + 1}`,
      `${backoff} ms backoff`,
      waited === undefined ? "no such attempt" : `${waited} ms`,
      // The retry time and the event times are whole milliseconds: a gap can read up to 2 ms short.
      waited !== undefined && waited >= backoff - 2 && waited <= backoff + SLACK_MS,
    );
  };
  const figures = [
    exactly(s, "acme: final state", "succeeded", acmeJob!.state),
    exactly(s, "acme: attempts", 3, acmeJob!.attempt),
    exactly(s, "acme: timeouts recorded in the job's errors", 2, acmeErrors.filter((c) => c === "SupplierTimeoutError").length),
    waitFigure(1),
    waitFigure(2),
    exactly(s, "globex: final state", "failed", globexJob!.state),
    exactly(s, "globex: attempts (PermanentError: no retry)", 1, globexJob!.attempt),
    exactly(s, "globex: error class", "PermanentError", globexErrors.join(", ")),
    exactly(s, "globex: requests to the supplier", 1, ctx.supplier.requests.get("globex") ?? 0),
  ];
  const line = (a: Attempt): string =>
    `     attempt ${a.attempt} on ${a.worker}` +
    (a.waitedMs === undefined ? "" : ` after ${a.waitedMs} ms`) +
    `: ${a.outcome ?? "?"}${a.error === undefined ? "" : ` (${a.error})`}`;
  const report = [
    "3. Retries with a fixed backoff (200ms, 500ms) and a permanent error:",
    `   job #${acme} import_supplier {"supplier":"acme"} -> ${acmeJob!.state}, ${acmeJob!.attempt} attempts`,
    ...acmeAttempts.slice(1).map(line),
    `   job #${globex} import_supplier {"supplier":"globex"} -> ${globexJob!.state}, ${globexJob!.attempt} attempt`,
    ...attempts(events, globex).slice(1).map(line),
  ];
  return {
    details: {
      acme: { jobId: acme, state: acmeJob!.state, attempts: acmeJob!.attempt, errors: acmeErrors, timeline: acmeAttempts.slice(1) },
      globex: { jobId: globex, state: globexJob!.state, attempts: globexJob!.attempt, errors: globexErrors, timeline: attempts(events, globex).slice(1) },
      backoffMs: BACKOFF_MS,
    },
    figures,
    report,
  };
}

/** The job's attempts from the workers' events, indexed by attempt number (index 0 unused). */
function attempts(events: readonly WorkerEvent[], jobId: string): Attempt[] {
  const list: Attempt[] = [];
  for (const e of events) {
    if (e.jobId !== jobId || e.attempt === undefined) continue;
    if (e.event === "job:start") {
      list[e.attempt] = { attempt: e.attempt, worker: workerName(e.workerId), startedAt: e.time };
      continue;
    }
    const a = list[e.attempt];
    if (a === undefined) continue;
    a.durationMs = typeof e.durationMs === "number" ? Math.round(e.durationMs * 10) / 10 : undefined;
    a.outcome = e.event.replace("job:", "");
    if (e.error !== undefined) a.error = `${e.error.class}: ${e.error.message}`;
  }
  for (let n = 2; n < list.length; n++) {
    const previous = list[n - 1];
    const current = list[n];
    if (previous?.durationMs !== undefined && current !== undefined) {
      current.waitedMs = Math.round(Date.parse(current.startedAt) - (Date.parse(previous.startedAt) + previous.durationMs));
    }
  }
  return Array.from(list, (a, i) => a ?? { attempt: i, worker: "?", startedAt: "" });
}
