// What every workload shares: sizes, the run context, variants, metrics, and
// the fresh database each measurement runs in.

import pg from "pg";
import { createDatabase, databaseUrl, dropDatabase, installMeasurementExtensions, runDatabase } from "../db.ts";
import type { Mode, SystemName } from "../systems/types.ts";

export interface Sizes {
  bulk: number;
  single: number;
  singleConnections: number;
  process: number;
  latencyJobs: number;
  latencyGapMs: number;
  scaleFinished: number;
  scaleKeys: number;
  /** process.many-queues: runnable jobs in the one busy queue among the worker's 49 others. */
  otherBacklog: number;
  /** process.many-queues: claims timed on an empty queue after the run. */
  claimProbes: number;
}

export const FULL_SIZES: Sizes = {
  bulk: 20_000,
  single: 5_000,
  singleConnections: 10,
  process: 20_000,
  latencyJobs: 200,
  latencyGapMs: 20,
  scaleFinished: 1_000_000,
  scaleKeys: 100_000,
  otherBacklog: 200_000,
  claimProbes: 200,
};

export const QUICK_SIZES: Sizes = {
  bulk: 1_000,
  single: 200,
  singleConnections: 10,
  process: 1_000,
  latencyJobs: 30,
  latencyGapMs: 20,
  scaleFinished: 20_000,
  scaleKeys: 2_000,
  otherBacklog: 5_000,
  claimProbes: 20,
};

export interface Context {
  server: string;
  admin: pg.Client;
  sizes: Sizes;
  /** Name of the migrated template database of a system. */
  template(system: SystemName): string;
  /** The seeded template of a scale run, made on first use. */
  scaleTemplate(system: SystemName): Promise<string>;
  log(line: string): void;
  timeoutMs: number;
  /** CHECKPOINT before each measured window (off in --quick, where it would be most of the time). */
  checkpoints: boolean;
}

/** One system in one configuration: a column of the results. */
export interface Variant {
  label: string;
  system: SystemName;
  mode: Mode;
  /** SQL run on the run's database after the jobs are enqueued, before the worker starts (e.g. a retention setting). */
  setupSql?: string;
  /** idemq: the worker's own defaults (no prefetch), instead of the tuned settings. */
  defaults?: boolean;
  /** The task its jobs are, where the variants of a workload differ in it (process.steps): the report's settings line names it. */
  task?: string;
}

export type Metrics = Record<string, number | null>;

export interface Measured {
  metrics: Metrics;
  /** e.g. which idemq worker ran. */
  note?: string;
}

export interface Workload {
  id: string;
  title: string;
  variants: Variant[];
  /** Worker concurrency, for processing workloads (the report prints each variant's settings). */
  concurrency?: number;
  /** The variant whose ratio to every other one is reported; default "idemq". */
  subject?: string;
  /** The metric compared across systems (ratios), and whether more is better. */
  primary: string;
  higherIsBetter: boolean;
  run(ctx: Context, variant: Variant, round: number): Promise<Measured>;
}

export function variant(system: SystemName, mode: Mode, label?: string): Variant {
  return { system, mode, label: label ?? (system === "idemq" ? "idemq" : `${system}:${mode}`) };
}

/** idemq with nothing but its concurrency set: what a user gets by default, next to the tuned `idemq`. */
export function idemqDefaults(mode: Mode, label: string): Variant {
  return { ...variant("idemq", mode, label), defaults: true };
}

export interface FreshDatabase {
  name: string;
  url: string;
  client: pg.Client;
}

/**
 * Runs `fn` in a fresh copy of the system's template (or of `template`),
 * named bench_<system>_r<round>_<pid>, dropped afterwards whatever happens.
 */
export async function withFreshDatabase<T>(
  ctx: Context,
  system: SystemName,
  round: number,
  fn: (db: FreshDatabase) => Promise<T>,
  template = ctx.template(system),
): Promise<T> {
  const name = runDatabase(`bench_${system}_r${round}`);
  // Scale templates hold a million rows: copy their files rather than WAL-log them.
  await createDatabase(ctx.admin, name, template, template !== ctx.template(system));
  const url = databaseUrl(ctx.server, name);
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  await client.connect();
  try {
    await installMeasurementExtensions(client);
    return await fn({ name, url, client });
  } finally {
    await client.end().catch(() => {});
    await dropDatabase(ctx.admin, name);
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
