// What every part of the demo gets and gives back.
import type { Client } from "../client.ts";
import { isTerminalState } from "../contract.ts";
import type { Job } from "../job-reads.ts";
import { JOB_END_EVENTS } from "../worker/events.ts";
import type { Figure } from "./figures.ts";
import type { FakeEmailProvider } from "./fake-email-provider.ts";
import type { FakeSupplier } from "./fake-supplier.ts";
import type { Progress } from "./progress.ts";
import type { DemoWorker, DemoWorkerOptions, WorkerEvent } from "./worker-processes.ts";

export interface DemoContext {
  /** A Client on the demo's database. */
  client: Client;
  databaseUrl: string;
  progress: Progress;
  /** The worker processes running the credit, import and payout queues. */
  workers: readonly DemoWorker[];
  /** Starts another worker process (stopped with the others at the end). */
  startWorker(options: Omit<DemoWorkerOptions, "databaseUrl">): DemoWorker;
  emailProvider: FakeEmailProvider;
  supplier: FakeSupplier;
  /** Aborted when the demo is interrupted (a signal). */
  signal: AbortSignal;
}

export interface ScenarioResult {
  /** Machine-readable results (the --json output's section). */
  details: Record<string, unknown>;
  figures: Figure[];
  /** What it showed, for people (stdout, without --json). */
  report: string[];
}

/** Polls the jobs until each is terminal; returns them in the order of `ids`. */
export async function waitForJobs(ctx: DemoContext, ids: readonly string[], what: string, timeoutMs = 60_000): Promise<Job[]> {
  const { client, signal } = ctx;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    signal.throwIfAborted();
    const jobs = await Promise.all(ids.map((id) => client.getJob(id)));
    if (jobs.every((job) => job !== null && isTerminalState(job.state))) return jobs as Job[];
    if (Date.now() > deadline) {
      const states = jobs.map((job, i) => `#${ids[i]} ${job?.state ?? "missing"}`).join(", ");
      throw new Error(`${what}: jobs not finished after ${timeoutMs / 1000} s (${states})`);
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Every event of every worker, as it happens. */
export function onAnyEvent(workers: Iterable<DemoWorker>, listener: (event: WorkerEvent) => void): () => void {
  const list = [...workers];
  for (const worker of list) worker.on("event", listener);
  return () => {
    for (const worker of list) worker.off("event", listener);
  };
}

/** The event that ends this attempt of the job (how it ended: success, retry, failed...). */
export function endOfAttempt(job: { id: string; attempt: number }): (event: WorkerEvent) => boolean {
  const endings: readonly string[] = JOB_END_EVENTS;
  return (event) => event.jobId === job.id && event.attempt === job.attempt && endings.includes(event.event);
}

/**
 * The first event of any of the workers that matches, seen already or still to
 * come. A job's state in the database can change before the worker's event
 * line about it has reached the demo.
 */
export async function waitForEvent(
  ctx: DemoContext,
  workers: Iterable<DemoWorker>,
  match: (event: WorkerEvent) => boolean,
  what: string,
  timeoutMs = 30_000,
): Promise<WorkerEvent> {
  const list = [...workers];
  for (const worker of list) {
    const seen = worker.events.find(match);
    if (seen !== undefined) return seen;
  }
  let stopListening = (): void => {};
  try {
    return await withDeadline(
      new Promise<WorkerEvent>((resolve) => {
        stopListening = onAnyEvent(list, (event) => {
          if (match(event)) resolve(event);
        });
      }),
      timeoutMs,
      () => `no worker reported ${what} within ${timeoutMs / 1000} s`,
      ctx.signal,
    );
  } finally {
    stopListening();
  }
}

/** Rejects with `message` when `work` has not settled after ms, or at once when `signal` aborts. */
export async function withDeadline<T>(work: Promise<T>, ms: number, message: () => string, signal: AbortSignal): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      work,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(message())), ms);
        onAbort = () => reject(signal.reason);
        if (signal.aborted) onAbort();
        else signal.addEventListener("abort", onAbort, { once: true });
      }),
    ]);
  } finally {
    clearTimeout(timer);
    if (onAbort !== undefined) signal.removeEventListener("abort", onAbort);
  }
}

/** The name part of a demo worker id ("mailer-1:1234" -> "mailer-1"). */
export function workerName(workerId: unknown): string {
  return String(workerId ?? "?").split(":")[0]!;
}
