// collectDatabaseMetrics(): the queue as the database sees it, read at scrape
// time through idemq.stats() (one statement, no locks) on a connection of its
// own, bounded by a short timeout, so a scrape never takes a worker's
// connection or waits on one. Scrapes that overlap share one stats() call.
// Every value is exact, and a scrape costs the same whatever the jobs table
// holds: stats() sums kept counts (idemq.job_counts) instead of counting jobs.
// When the database does not answer, the scrape still answers: these series
// are left out and idemq_database_up is 0.
import pg from "pg";
import { JOB_STATES, RUNNABLE_WAITS, type Duration, type RunnableWait, type STATS_EVENT_METRICS } from "../contract.ts";
import { toMilliseconds } from "../duration.ts";
import * as sql from "../sql/index.ts";
import type { LimitRow, StatsRow } from "../sql/index.ts";
import { timedCalls } from "../worker/worker-state.ts";
import { METRICS_DEFAULTS } from "./defaults.ts";
import { FLOW_GAUGES, fillFlowGauge } from "./flow-metrics.ts";
import { loadPromClient, registryOf } from "./prom-client.ts";
import type { MetricsRegistry } from "./registry.ts";
import type { MetricsHandle } from "./worker-metrics.ts";

export interface DatabaseMetricsOptions {
  /** Where to read stats() (it needs EXECUTE on idemq.stats: the installation's worker or admin role, or the owner). */
  connectionString?: string;
  /** Or a pool of yours (never ended here); one connection at a time is used. */
  pool?: pg.Pool;
  /** A prom-client Registry to add the metrics to; default: a new one. */
  registry?: MetricsRegistry;
  /** The longest a scrape waits for the database; default 2 seconds. */
  timeout?: Duration;
}

/** The event counters of stats() (queue NULL, per task, counted since install, never decreasing). */
const EVENT_COUNTERS = {
  deduplicated: ["idemq_enqueue_deduplicated_total", "Enqueues answered with the active job of their key (stats(): deduplicated)"],
  rejected: ["idemq_enqueue_rejected_total", "enqueue_many elements rejected by the duplicate policy (a rejection enqueue() raises rolls back and is not counted)"],
  conflict: ["idemq_enqueue_conflict_total", "enqueue_many elements whose key was held for different work"],
  guard_duplicate: ["idemq_guard_duplicates_total", "guard() calls that found the effect already committed"],
} as const satisfies Record<Exclude<(typeof STATS_EVENT_METRICS)[number], "lease_expired" | "oldest_runnable_seconds">, readonly [string, string]>;

interface Snapshot {
  rows: StatsRow[] | undefined;
  /** limits(): undefined when stats() failed, or on a database without it (before 0.2.0). */
  limits: LimitRow[] | undefined;
  seconds: number;
}

/**
 * Adds the database's metrics (docs/worker.md, "Metrics") to a registry.
 * Rejects with MetricsUnavailableError when prom-client is not installed.
 */
export async function collectDatabaseMetrics(options: DatabaseMetricsOptions): Promise<MetricsHandle> {
  const prom = await loadPromClient();
  const registry = registryOf(prom, options.registry);
  const registers = [registry];
  const timeoutMs = toMilliseconds(options.timeout ?? METRICS_DEFAULTS.databaseTimeout);
  let pool: pg.Pool;
  const ownsPool = options.pool === undefined;
  if (options.pool !== undefined) pool = options.pool;
  else if (typeof options.connectionString === "string" && options.connectionString !== "") {
    pool = new pg.Pool({
      connectionString: options.connectionString,
      fallback_application_name: METRICS_DEFAULTS.applicationName,
      max: 1,
      connectionTimeoutMillis: timeoutMs,
      keepAlive: true,
    });
    // An idle connection the server ends (a restart) must not end the process; the next scrape reconnects.
    pool.on("error", () => {});
  } else {
    throw new TypeError("collectDatabaseMetrics needs { connectionString } or { pool }");
  }
  const calls = timedCalls(pool, timeoutMs);

  let inFlight: Promise<Snapshot> | undefined;
  const snapshot = (): Promise<Snapshot> => {
    inFlight ??= (async () => {
      const started = performance.now();
      let rows: StatsRow[] | undefined;
      let limits: LimitRow[] | undefined;
      try {
        rows = await sql.stats(calls);
        limits = await sql.limits(calls).catch(() => undefined);
      } catch {
        rows = undefined; // idemq_database_up 0 says so; the scrape goes on
      }
      return { rows, limits, seconds: (performance.now() - started) / 1000 };
    })().finally(() => (inFlight = undefined));
    return inFlight;
  };

  const names: string[] = [];
  const gauge = <L extends string>(
    name: string,
    help: string,
    labelNames: readonly L[],
    fill: (set: (labels: Record<L, string>, value: number) => void, s: Snapshot) => void,
  ): void => {
    names.push(name);
    new prom.Gauge({
      name,
      help,
      labelNames,
      registers,
      async collect() {
        const s = await snapshot();
        this.reset();
        fill((labels, value) => this.set(labels as never, value), s);
      },
    });
  };

  gauge("idemq_database_up", "1 when this scrape read stats() from the database, 0 when it failed or timed out", [], (set, s) =>
    set({}, s.rows === undefined ? 0 : 1),
  );
  gauge("idemq_database_scrape_duration_seconds", "How long this scrape's stats() call took (or ran until it failed)", [], (set, s) =>
    set({}, s.seconds),
  );
  // Every state of each (queue, task) present, 0 included: stats() leaves zero counts out.
  gauge("idemq_jobs", "Jobs by queue, task and state; exact (stats(): the counts kept per state, not a count of the table)", ["queue", "task", "state"] as const, (set, s) => {
    for (const [queue, task, metrics] of byQueueAndTask(s.rows)) {
      for (const state of JOB_STATES) set({ queue, task, state }, metrics.get(state) ?? 0);
    }
  });
  gauge(
    "idemq_jobs_lease_expired",
    "Processing jobs whose lease ran out, not rescued yet; exact (stats(): lease_expired)",
    ["queue", "task"] as const,
    (set, s) => {
      for (const [queue, task, metrics] of byQueueAndTask(s.rows)) set({ queue, task }, metrics.get("lease_expired") ?? 0);
    },
  );
  gauge(
    "idemq_oldest_runnable_age_seconds",
    "Age of the oldest job claim() would hand out, by queue and task (0: none runnable); exact; max by (queue) for a queue",
    ["queue", "task"] as const,
    (set, s) => {
      for (const [queue, task, metrics] of byQueueAndTask(s.rows)) set({ queue, task }, metrics.get("oldest_runnable_seconds") ?? 0);
    },
  );
  // Every reason of each (queue, task) present, 0 included, as idemq_jobs: the
  // enqueued count goes to the one reason stats() gives its runnable jobs.
  gauge(
    "idemq_jobs_waiting",
    "Enqueued jobs by queue, task and why they are not running: paused, held, concurrency (no slot free), rate (no start left), worker (nothing holds them back); stats(): waiting_for",
    ["queue", "task", "reason"] as const,
    (set, s) => {
      const reasons = new Map<string, RunnableWait>();
      for (const row of s.rows ?? []) {
        if (row.metric === "enqueued" && row.queue !== null && row.task !== null && row.waitingFor !== null) {
          reasons.set(JSON.stringify([row.queue, row.task]), row.waitingFor as RunnableWait);
        }
      }
      for (const [queue, task, metrics] of byQueueAndTask(s.rows)) {
        const reason = reasons.get(JSON.stringify([queue, task])) ?? "worker";
        for (const r of RUNNABLE_WAITS) set({ queue, task, reason: r }, r === reason ? (metrics.get("enqueued") ?? 0) : 0);
      }
    },
  );
  for (const [name, help, value] of FLOW_GAUGES) {
    gauge(name, help, ["scope", "name"] as const, (set, s) => fillFlowGauge(value, s.limits, set));
  }
  for (const [metric, [name, help]] of Object.entries(EVENT_COUNTERS)) {
    names.push(name);
    new prom.Counter({
      name,
      help: `${help}; per task, since install; exact`,
      labelNames: ["task"] as const,
      registers,
      async collect() {
        const s = await snapshot();
        this.reset();
        for (const row of s.rows ?? []) {
          if (row.queue === null && row.metric === metric && row.task !== null) this.inc({ task: row.task }, row.value);
        }
      },
    });
  }

  return {
    registry,
    close: async () => {
      for (const name of names) registry.removeSingleMetric(name);
      await inFlight;
      if (ownsPool) await pool.end();
    },
  };
}

/** The rows of jobs (queue set), grouped by (queue, task): metric -> value. */
function byQueueAndTask(rows: StatsRow[] | undefined): Array<[string, string, Map<string, number>]> {
  const groups = new Map<string, [string, string, Map<string, number>]>();
  for (const row of rows ?? []) {
    if (row.queue === null || row.task === null) continue;
    const id = JSON.stringify([row.queue, row.task]);
    let group = groups.get(id);
    if (group === undefined) groups.set(id, (group = [row.queue, row.task, new Map()]));
    group[2].set(row.metric, row.value);
  }
  return [...groups.values()];
}
