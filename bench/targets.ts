// The target rows: issue 29's (speed against the peers, idemq at its
// defaults: `idemq:defaults`, default retention), issue 5's and 15's that
// issue 29 did not restate (many queues, defaults vs tuned, fairness, single
// enqueue, latency), and issue 26's (flow control): each a ratio of two
// measurements taken in the same round, or one measurement, and the bound
// its median must meet. Rows an issue gave a target that a later issue
// replaced (idemq tuned or at retention 0 against Graphile) are MEASURED
// rows below.

import { STEPS_PER_JOB } from "./systems/types.ts";

export interface Ref {
  workload: string;
  variant: string;
  metric: string;
}

export interface Target {
  row: string;
  num: Ref;
  /** Absent: the bound applies to num's value itself, in its metric's unit. */
  den?: Ref;
  op: ">=" | "<=";
  bound: number;
}

const ref = (workload: string, variant: string, metric: string): Ref => ({ workload, variant, metric });
const JPS = "jobs_per_s";

export const TARGETS: Target[] = [
  { row: "processing, batched, C=10, idemq defaults vs Graphile batched", num: ref("process.c10", "idemq:defaults", JPS), den: ref("process.c10", "graphile:batched", JPS), op: ">=", bound: 1.25 },
  { row: "processing, batched, C=50, idemq defaults vs Graphile batched", num: ref("process.c50", "idemq:defaults", JPS), den: ref("process.c50", "graphile:batched", JPS), op: ">=", bound: 1.25 },
  { row: "processing C=10: idemq defaults vs idemq tuned (prefetch 490)", num: ref("process.c10", "idemq:defaults", JPS), den: ref("process.c10", "idemq", JPS), op: ">=", bound: 0.9 },
  { row: "processing C=10: a non-binding concurrency limit (1000) vs no limit", num: ref("process.limit-nonbinding", "idemq:limit1000", JPS), den: ref("process.limit-nonbinding", "idemq", JPS), op: ">=", bound: 0.9 },
  { row: "processing C=10: keys of 20 jobs, K = 1, vs the same jobs without keys", num: ref("process.keys", "idemq:keys", JPS), den: ref("process.keys", "idemq:nokeys", JPS), op: ">=", bound: 0.8 },
  { row: "processing C=10: keyed jobs beside one key whose backlog waits vs alone", num: ref("process.keys", "idemq:keys-beside-busy", JPS), den: ref("process.keys", "idemq:keys", JPS), op: ">=", bound: 0.9 },
  { row: "claim finding nothing while a key's backlog waits (ms)", num: ref("process.keys", "idemq:keys-beside-busy", "claim_empty_ms"), op: "<=", bound: 2 },
  { row: "processing C=50: idemq defaults vs idemq tuned (prefetch 490)", num: ref("process.c50", "idemq:defaults", JPS), den: ref("process.c50", "idemq", JPS), op: ">=", bound: 0.9 },
  { row: "2 worker processes on one queue, defaults: most / fewest jobs", num: ref("share.c10", "idemq:defaults", "jobs_most"), den: ref("share.c10", "idemq:defaults", "jobs_fewest"), op: "<=", bound: 1.5 },
  { row: "transactional tasks, idemq defaults vs Graphile per-job default", num: ref("process.transactional.c10", "idemq:transactional:defaults", JPS), den: ref("process.transactional.c10", "graphile:perjob", JPS), op: ">=", bound: 1.3 },
  { row: "transactional tasks vs raw SQL one-per-transaction", num: ref("process.transactional.c10", "idemq:transactional", JPS), den: ref("process.transactional.c10", "raw:one-tx-per-job", JPS), op: ">=", bound: 0.9 },
  { row: "bulk enqueue vs Graphile add_jobs (no keys)", num: ref("enqueue.bulk", "idemq", JPS), den: ref("enqueue.bulk", "graphile", JPS), op: ">=", bound: 1.5 },
  { row: "bulk enqueue with keys vs Graphile add_jobs with jobKey", num: ref("enqueue.bulk-keyed", "idemq", JPS), den: ref("enqueue.bulk-keyed", "graphile", JPS), op: ">=", bound: 1.2 },
  { row: "single enqueue, 10 connections vs Graphile", num: ref("enqueue.single", "idemq", JPS), den: ref("enqueue.single", "graphile", JPS), op: ">=", bound: 2 },
  { row: "latency p50 vs Graphile (batched settings)", num: ref("latency", "idemq", "p50_ms"), den: ref("latency", "graphile:batched", "p50_ms"), op: "<=", bound: 0.8 },
  { row: "latency p95 vs Graphile (batched settings)", num: ref("latency", "idemq", "p95_ms"), den: ref("latency", "graphile:batched", "p95_ms"), op: "<=", bound: 0.8 },
  { row: "latency p50 vs Graphile (per-job defaults)", num: ref("latency", "idemq", "p50_ms"), den: ref("latency", "graphile:perjob", "p50_ms"), op: "<=", bound: 0.8 },
  { row: "latency p95 vs Graphile (per-job defaults)", num: ref("latency", "idemq", "p95_ms"), den: ref("latency", "graphile:perjob", "p95_ms"), op: "<=", bound: 0.8 },
  { row: "WAL bytes per job, batched C=10, idemq defaults vs Graphile batched", num: ref("process.c10", "idemq:defaults", "wal_bytes_per_job"), den: ref("process.c10", "graphile:batched", "wal_bytes_per_job"), op: "<=", bound: 0.9 },
  { row: "machine CPU per job, batched C=10, idemq defaults vs Graphile batched", num: ref("process.c10", "idemq:defaults", "cpu_us_per_job"), den: ref("process.c10", "graphile:batched", "cpu_us_per_job"), op: "<=", bound: 0.9 },
  { row: "finished jobs + keys retained vs empty table", num: ref("scale.retained", "idemq:retained", JPS), den: ref("scale.retained", "idemq:empty", JPS), op: ">=", bound: 0.8 },
  { row: "held xmin for the whole run vs clean run", num: ref("scale.held-xmin", "idemq:held", JPS), den: ref("scale.held-xmin", "idemq:clean", JPS), op: ">=", bound: 0.5 },
  { row: "worker peak RSS at C=50 vs Graphile batched", num: ref("process.c50", "idemq", "rss_mb"), den: ref("process.c50", "graphile:batched", "rss_mb"), op: "<=", bound: 1 },
  { row: "worker of one queue, 200,000 runnable in another vs other queues empty", num: ref("process.many-queues", "idemq:crowded", JPS), den: ref("process.many-queues", "idemq:alone", JPS), op: ">=", bound: 0.9 },
  { row: "worker of one task, 200,000 runnable of another task in its queue vs other queues empty", num: ref("process.many-queues", "idemq:crowded-task", JPS), den: ref("process.many-queues", "idemq:alone", JPS), op: ">=", bound: 0.9 },
  { row: "claim on an empty queue, 200,000 runnable elsewhere (ms)", num: ref("process.many-queues", "idemq:crowded", "claim_empty_queue_ms"), op: "<=", bound: 2 },
  { row: "claim of a task no job has, 200,000 runnable of another (ms)", num: ref("process.many-queues", "idemq:crowded", "claim_other_task_ms"), op: "<=", bound: 2 },
];

/**
 * Rows the issue gives no target for, reported as measured (no "met"): per
 * round, ((num - minus) / per) / den, each part optional but num.
 */
export interface MeasuredRow {
  row: string;
  num: Ref;
  /** Subtracted from num in the same round (a baseline: the cost of what is left). */
  minus?: Ref;
  /** num (less minus) divided by this (e.g. steps per job: a cost per step). */
  per?: number;
  /** Absent: a value in `unit`; present: a ratio. */
  den?: Ref;
  /** The value's unit, for rows without den. */
  unit?: string;
}

// Issue 28, item 8 (bench/workloads/steps.ts): per step, the steps10 (or
// external10) job's cost less the no-op job's, over its STEPS_PER_JOB (10)
// steps.
const STEPS = "process.steps";
const perStep = (kind: "transactional" | "external", metric: string, what: string, unit: string): MeasuredRow => ({
  row: `ctx.step, ${kind}, no-op fn: ${what} per step`,
  num: ref(STEPS, kind === "transactional" ? "idemq:steps10" : "idemq:external10", metric),
  minus: ref(STEPS, "idemq:nosteps", metric),
  per: STEPS_PER_JOB,
  unit,
});
const perStepRows = (kind: "transactional" | "external"): MeasuredRow[] => [
  perStep(kind, "worker_cpu_us_per_job", "worker process CPU", "µs"),
  perStep(kind, "backend_cpu_us_per_job", "its PostgreSQL backends' CPU", "µs"),
  perStep(kind, "cpu_us_per_job", "machine CPU", "µs"),
  perStep(kind, "wal_bytes_per_job", "WAL", "B"),
  perStep(kind, "statements_per_job", "worker round trips", "round trips"),
];

// A workflow's unit is a step (10 per job), a chain's a job.
const VS_CHAIN = `a workflow of ${STEPS_PER_JOB} steps per job vs ${STEPS_PER_JOB} jobs chained with \`after\``;
const perUnit = (metric: string, what: string): MeasuredRow => ({
  row: `${VS_CHAIN}: ${what} per unit`,
  num: ref(STEPS, "idemq:steps10", metric),
  per: STEPS_PER_JOB,
  den: ref(STEPS, "idemq:chain10", metric),
});

export const MEASURED: MeasuredRow[] = [
  // Earlier issues' targets for idemq tuned or at retention 0, replaced by issue 29's (at its defaults).
  { row: "processing, batched, C=10, idemq tuned (prefetch 490) vs Graphile batched", num: ref("process.c10", "idemq", JPS), den: ref("process.c10", "graphile:batched", JPS) },
  { row: "processing, batched, C=50, idemq tuned (prefetch 490) vs Graphile batched", num: ref("process.c50", "idemq", JPS), den: ref("process.c50", "graphile:batched", JPS) },
  { row: "processing, batched, C=10, retention 0 vs Graphile batched", num: ref("process.c10", "idemq:retention0", JPS), den: ref("process.c10", "graphile:batched", JPS) },
  { row: "processing, batched, C=50, retention 0 vs Graphile batched", num: ref("process.c50", "idemq:retention0", JPS), den: ref("process.c50", "graphile:batched", JPS) },
  { row: "WAL bytes per job, batched C=10, retention 0 vs Graphile batched", num: ref("process.c10", "idemq:retention0", "wal_bytes_per_job"), den: ref("process.c10", "graphile:batched", "wal_bytes_per_job") },
  { row: "machine CPU per job, batched C=50, idemq defaults vs Graphile batched", num: ref("process.c50", "idemq:defaults", "cpu_us_per_job"), den: ref("process.c50", "graphile:batched", "cpu_us_per_job") },
  { row: "bulk enqueue with keys vs Graphile add_jobs (no keys)", num: ref("enqueue.bulk-keyed", "idemq", JPS), den: ref("enqueue.bulk", "graphile", JPS) },
  ...perStepRows("transactional"),
  ...perStepRows("external"),
  { row: `${VS_CHAIN}: units of work/s`, num: ref(STEPS, "idemq:steps10", "units_per_s"), den: ref(STEPS, "idemq:chain10", "units_per_s") },
  perUnit("worker_cpu_us_per_job", "worker process CPU"),
  perUnit("backend_cpu_us_per_job", "its PostgreSQL backends' CPU"),
  perUnit("wal_bytes_per_job", "WAL"),
];
