// idemq stats [--queue Q] [--task T] [--window minutes] [--watch [seconds]]
//
// Counts per queue, task and state, expired leases and the age of the oldest
// runnable job (per queue and task), and duplicate and rejection events per
// task, from idemq.stats(); throughput and failure rate over the last
// --window minutes from idemq.overview() (the admin's and the viewer's: another
// role gets the counts and a line saying the rates need one of those roles). --watch redraws every
// few seconds until Ctrl-C (exit 0); with --json it prints one JSON object
// per line.
import type { Command } from "commander";
import { InvalidArgumentError } from "commander";
import { isJobState, JOB_STATES, RUNNABLE_WAITS, type JobState, type RunnableWait, type ScopeWaitingReason } from "../../contract.ts";
import type { Client } from "../../client.ts";
import type { LimitRow, StatsRow } from "../../sql/index.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { recentRates } from "../../rates.ts";
import { age, table } from "../format.ts";
import { action, camelCase, emit } from "../output.ts";
import { renderLimits } from "./limit.ts";

interface Options extends CommonOptions {
  watch?: true | number;
  window: number;
  queue?: string;
  task?: string;
}

/** Which rows of stats() a report keeps. */
interface Filter {
  queue?: string | undefined;
  task?: string | undefined;
}

const DEFAULT_WATCH_SECONDS = 2;
const DEFAULT_WINDOW_MINUTES = 5;
const MAX_WINDOW_MINUTES = 1440;
/** PostgreSQL's insufficient_privilege: a role without EXECUTE on overview(). */
const NOT_PERMITTED = "42501";
const EVENT_METRICS = ["deduplicated", "rejected", "conflict", "guard_duplicate"] as const;
type EventMetric = (typeof EVENT_METRICS)[number];

// The report's keys are camelCase, as every command's --json (stats() names
// its metrics in snake_case: camelCase() maps them).
type Counts = Record<JobState | "leaseExpired", number> & { oldestRunnableSeconds: number | null };
/** Why a (queue, task)'s runnable jobs wait: stats()'s waiting_for, or "worker" when nothing holds them back. */
type Waiting = RunnableWait;
/** waitingFor: why its runnable jobs are not running; null when it has none. */
type JobCounts = { queue: string; task: string; waitingFor: Waiting | null } & Counts;
type EventCounts = { task: string } & Record<"deduplicated" | "rejected" | "conflict" | "guardDuplicate", number>;

/** Finishes within the window, per queue and task (recentRates()'s formula). */
interface RateRow {
  queue: string;
  task: string;
  succeeded: number;
  failed: number;
  perMinute: number;
  failureRate: number | null;
}

export interface StatsReport {
  at: string;
  jobs: JobCounts[];
  events: EventCounts[];
  totals: Counts;
  /**
   * The enqueued jobs (of the filter) split by why they are not running: the
   * waitingFor of their queue and task. Awaiting jobs (parents or a
   * concurrency key) and scheduled ones are in totals.
   */
  waiting: Record<Waiting, number>;
  /** The window the rates cover, and the rates; null (with ratesUnavailable saying why) for a role that may not call overview(). */
  windowMinutes: number;
  rates: RateRow[] | null;
  ratesUnavailable?: string;
  /** Flow control: the queues and tasks (of the filter) with a limit or a pause, and their use (limits()); null for a schema or role without it. */
  limits: LimitRow[] | null;
}

export function registerStatsCommand(program: Command): void {
  const command = program
    .command("stats")
    .description("counts per queue, task and state; expired leases; oldest runnable job; duplicates and rejections per task")
    .option("--watch [seconds]", `redraw every few seconds (default ${DEFAULT_WATCH_SECONDS}) until Ctrl-C`, parseSeconds)
    .option("--queue <queue>", "only this queue (events are per task, so none are shown)")
    .option("--task <task>", "only this task")
    .option("--window <minutes>", `throughput and failure rate over the last N minutes, 1 to ${MAX_WINDOW_MINUTES}`, parseWindow, DEFAULT_WINDOW_MINUTES)
    .action(
      action(async (_options: Options, cmd: Command) => {
        const options = cmd.optsWithGlobals<Options>();
        // --watch runs until stopped: other commands may use its embedded server meanwhile.
        await withClient({ ...options, share: options.watch !== undefined }, async (client) => {
          if (options.watch === undefined) {
            const report = await statsReport(client, options);
            emit(options, report, renderStats(report));
            return;
          }
          await watch(client, options, options.watch === true ? DEFAULT_WATCH_SECONDS : options.watch);
        });
      }),
    );
  databaseCommand(command, [
    "idemq stats",
    "idemq stats --watch 5",
    "idemq stats --json | jq '.totals.failed'",
    "idemq stats --queue emails --task send_invoice",
    "idemq stats --window 60          # rates over the last hour",
    "",
    "Rates (jobs finished per minute, the share of them that failed) come from",
    "idemq.overview(), the admin's and the viewer's; another role gets the counts without them.",
    "Events count deduplicated enqueues, bulk rejections, key conflicts and guard",
    "duplicates since install; a rejection raised by a single enqueue rolls back",
    "with its statement and is not counted by the database.",
  ]);
}

function parseWindow(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || n < 1 || n > MAX_WINDOW_MINUTES) {
    throw new InvalidArgumentError(`give the window in whole minutes, from 1 to ${MAX_WINDOW_MINUTES}, e.g. --window 15`);
  }
  return n;
}

function parseSeconds(value: string): number {
  const n = Number(value);
  if (!/^\d+(\.\d+)?$/.test(value.trim()) || !(n >= 0.1) || n > 3600) {
    throw new InvalidArgumentError("give the seconds between redraws, from 0.1 to 3600, e.g. --watch 5");
  }
  return n;
}

/**
 * stats() with --queue and --task applied to its rows: stats() takes no
 * filter, so the database counts every queue either way (one grouped scan).
 */
async function statsReport(client: Client, filter: Filter & { window: number }): Promise<StatsReport> {
  const kept = (row: { queue: string | null; task: string | null }) =>
    (filter.task === undefined || row.task === filter.task) && (filter.queue === undefined || row.queue === filter.queue);
  const report = toReport((await client.stats()).filter(kept));
  report.windowMinutes = filter.window;
  report.limits = await flowLimits(client, filter);
  try {
    // exactUpTo 0: the rates need no totals, so overview() counts none.
    const rows = await client.overview({ recent: `${filter.window} minutes`, exactUpTo: 0 });
    const finished = new Map<string, { queue: string; task: string; succeeded: number; failed: number }>();
    for (const row of rows) {
      if (row.queue === null || row.task === null || !kept(row)) continue;
      if (row.metric !== "succeeded_recent" && row.metric !== "failed_recent") continue;
      const id = JSON.stringify([row.queue, row.task]);
      const entry = finished.get(id) ?? { queue: row.queue, task: row.task, succeeded: 0, failed: 0 };
      entry[row.metric === "succeeded_recent" ? "succeeded" : "failed"] += row.value;
      finished.set(id, entry);
    }
    report.rates = [...finished.values()].map((f) => ({ ...f, ...recentRates(f.succeeded, f.failed, filter.window) }));
  } catch (error) {
    if ((error as { code?: string }).code !== NOT_PERMITTED) throw error;
    report.ratesUnavailable = "rates need EXECUTE on idemq.overview() (the installation's admin or viewer role, `idemq roles list`); the counts are complete";
  }
  return report;
}

/** limits() of the queue or task filtered on (a job obeys its queue's and its task's); null before 0.2.0 (no limits()). */
async function flowLimits(client: Client, filter: Filter): Promise<LimitRow[] | null> {
  try {
    return (await client.limits()).filter(
      (r) =>
        (filter.queue === undefined && filter.task === undefined) ||
        (r.queue !== null && r.queue === filter.queue) ||
        (r.task !== null && r.task === filter.task),
    );
  } catch (error) {
    // undefined_function: a schema before 0.2.0; insufficient_privilege: a role without limits() (the producer's).
    if (["42883", NOT_PERMITTED].includes((error as { code?: string }).code ?? "")) return null;
    throw error;
  }
}

function zeroStates(): Record<JobState | "leaseExpired", number> {
  return Object.fromEntries([...JOB_STATES, "leaseExpired"].map((metric) => [metric, 0])) as Record<JobState | "leaseExpired", number>;
}

function toReport(rows: readonly StatsRow[]): StatsReport {
  const jobs = new Map<string, JobCounts>();
  const events = new Map<string, EventCounts>();
  const totals: Counts = { ...zeroStates(), oldestRunnableSeconds: null };
  for (const row of rows) {
    if (row.queue === null) {
      if (!(EVENT_METRICS as readonly string[]).includes(row.metric) || row.task === null) continue;
      const entry =
        events.get(row.task) ??
        ({ task: row.task, ...Object.fromEntries(EVENT_METRICS.map((m) => [camelCase(m), 0])) } as EventCounts);
      entry[camelCase(row.metric as EventMetric) as keyof Omit<EventCounts, "task">] += row.value;
      events.set(row.task, entry);
      continue;
    }
    const id = JSON.stringify([row.queue, row.task]);
    const entry =
      jobs.get(id) ??
      ({ queue: row.queue, task: row.task ?? "", waitingFor: null, ...zeroStates(), oldestRunnableSeconds: null } as JobCounts);
    // On the enqueued and oldest_runnable_seconds rows: both say the same (one snapshot).
    if (row.waitingFor !== null) entry.waitingFor = row.waitingFor as ScopeWaitingReason;
    // StatsMetric (contract.ts) lacks oldest_runnable_seconds, which stats() also returns.
    const metric = row.metric as string;
    if (metric === "oldest_runnable_seconds") {
      entry.oldestRunnableSeconds = row.value;
      totals.oldestRunnableSeconds = Math.max(totals.oldestRunnableSeconds ?? 0, row.value);
    } else if (metric === "lease_expired") {
      entry.leaseExpired += row.value;
      totals.leaseExpired += row.value;
    } else if (isJobState(metric)) {
      entry[metric] += row.value;
      totals[metric] += row.value;
    }
    jobs.set(id, entry);
  }
  const waiting = Object.fromEntries(RUNNABLE_WAITS.map((w) => [w, 0])) as Record<Waiting, number>;
  for (const entry of jobs.values()) {
    if (entry.waitingFor === null && (entry.oldestRunnableSeconds !== null || entry.enqueued > 0)) entry.waitingFor = "worker";
    if (entry.waitingFor !== null) waiting[entry.waitingFor] += entry.enqueued;
  }
  return {
    at: new Date().toISOString(),
    jobs: [...jobs.values()],
    events: [...events.values()],
    totals,
    waiting,
    windowMinutes: 0,
    rates: null,
    limits: null,
  };
}

const STATE_HEADERS = [...JOB_STATES.map((s) => s.toUpperCase()), "LEASE EXPIRED", "OLDEST RUNNABLE"];

/** How the line under the table words each share of the enqueued jobs. */
const WAITING_PHRASES: Record<Waiting, string> = {
  worker: "wait for a worker",
  paused: "paused",
  held: "held (a hold of their queue or task)",
  concurrency: "wait for a slot (concurrency)",
  rate: "wait for the rate (no start left in the period)",
};

/** "Not running: 5 enqueued (3 wait for a worker, 2 wait for a slot (concurrency)); 1 awaiting (...); 4 scheduled." */
function notRunningLine(report: StatsReport): string | undefined {
  const shares = (Object.keys(WAITING_PHRASES) as Waiting[])
    .filter((w) => report.waiting[w] > 0)
    .map((w) => `${report.waiting[w]} ${WAITING_PHRASES[w]}`);
  const parts = [
    ...(shares.length === 0 ? [] : [`${report.totals.enqueued} enqueued (${shares.join(", ")})`]),
    ...(report.totals.awaiting === 0 ? [] : [`${report.totals.awaiting} awaiting (parents or a concurrency key: \`idemq jobs --state awaiting\` says which)`]),
    ...(report.totals.scheduled === 0 ? [] : [`${report.totals.scheduled} scheduled`]),
  ];
  return parts.length === 0 ? undefined : `Not running: ${parts.join("; ")}.`;
}

function renderStats(report: StatsReport): string[] {
  // Flow control under the counts: paused scopes and limits in use.
  const flow = report.limits === null || report.limits.length === 0 ? [] : ["", ...renderLimits(report.limits)];
  if (report.jobs.length === 0 && report.events.length === 0) return ["No jobs yet.", ...flow];
  const numbers = (counts: Counts) => [
    ...JOB_STATES.map((state) => String(counts[state])),
    String(counts.leaseExpired),
    counts.oldestRunnableSeconds === null ? "-" : age(counts.oldestRunnableSeconds * 1000),
  ];
  const numeric = STATE_HEADERS.map((_, i) => i + 2);
  const lines = table(
    ["QUEUE", "TASK", ...STATE_HEADERS, "WAITING FOR"],
    [...report.jobs.map((j) => [j.queue, j.task, ...numbers(j), j.waitingFor ?? "-"]), ["total", "", ...numbers(report.totals)]],
    numeric,
  );
  const notRunning = notRunningLine(report);
  if (notRunning !== undefined) lines.push("", notRunning);
  if (report.events.length > 0) {
    lines.push(
      "",
      ...table(
        ["TASK", "DEDUPLICATED", "REJECTED", "CONFLICT", "GUARD DUPLICATE"],
        report.events.map((e) => [e.task, String(e.deduplicated), String(e.rejected), String(e.conflict), String(e.guardDuplicate)]),
        [1, 2, 3, 4],
      ),
    );
  }
  if (report.rates !== null && report.rates.length > 0) {
    lines.push(
      "",
      ...table(
        ["QUEUE", "TASK", `SUCCEEDED (${report.windowMinutes} MIN)`, `FAILED (${report.windowMinutes} MIN)`, "PER MIN", "FAILURE RATE"],
        report.rates.map((r) => [
          r.queue,
          r.task,
          String(r.succeeded),
          String(r.failed),
          r.perMinute.toFixed(1),
          r.failureRate === null ? "-" : `${(100 * r.failureRate).toFixed(1)} %`,
        ]),
        [2, 3, 4, 5],
      ),
    );
  }
  if (report.ratesUnavailable !== undefined) lines.push("", `No rates: ${report.ratesUnavailable}.`);
  lines.push(...flow);
  if (report.totals.leaseExpired > 0) {
    lines.push("", `${report.totals.leaseExpired} job(s) hold an expired lease: run \`idemq rescue\` or start a worker.`);
  }
  return lines;
}

/** Redraws until SIGINT/SIGTERM, which end it normally (exit 0). */
async function watch(client: Client, options: Options, seconds: number): Promise<void> {
  let stopped = false;
  let wake: (() => void) | undefined;
  const stop = (): void => {
    stopped = true;
    wake?.();
  };
  const signals = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
  for (const signal of signals) process.on(signal, stop);
  try {
    const tty = process.stdout.isTTY === true && !options.json;
    while (!stopped) {
      const report = await statsReport(client, options);
      if (stopped) break;
      if (options.json) {
        emit(options, report, "");
      } else {
        const header = `idemq stats at ${report.at.replace(/\.\d{3}Z$/, "Z")} (every ${seconds}s; Ctrl-C to stop)`;
        process.stdout.write(`${tty ? "\x1b[H\x1b[2J" : ""}${[header, ...renderStats(report), ""].join("\n")}\n`);
      }
      await new Promise<void>((resolve) => {
        wake = resolve;
        const timer = setTimeout(resolve, seconds * 1000);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  } finally {
    for (const signal of signals) process.removeListener(signal, stop);
  }
}
