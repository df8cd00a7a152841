// Enqueue workloads, run in the bench process itself (no worker):
// - bulk: all jobs in one call (idemq enqueueMany, Graphile addJobs = add_jobs,
//   pg-boss insert, raw INSERT ... SELECT FROM jsonb_to_recordset);
// - bulk with a key on every job;
// - single: one job per call and transaction, from `singleConnections`
//   connections at once.

import { SYSTEMS } from "../systems/index.ts";
import { NOOP_TASK, type BenchJob, type Producer } from "../systems/types.ts";
import { closeWalWindow, machineCpuSeconds, openWalWindow, readMachineCpu } from "../measure.ts";
import { checkpoint } from "../db.ts";
import { variant, withFreshDatabase, type Context, type Measured, type Variant, type Workload } from "./common.ts";

const SYSTEMS_ONCE: Variant[] = [
  variant("idemq", "batched"),
  variant("graphile", "batched", "graphile"),
  variant("pgboss", "batched", "pgboss"),
  variant("raw", "batched", "raw"),
];

function jobs(count: number, keyed: boolean, prefix: string): BenchJob[] {
  return Array.from({ length: count }, (_, i) => ({
    task: NOOP_TASK,
    payload: { i },
    ...(keyed ? { key: `${prefix}-${i}` } : {}),
  }));
}

/** Times `body` on a fresh database and measures WAL and machine CPU around it. */
async function measureEnqueue(
  ctx: Context,
  v: Variant,
  round: number,
  options: { connections: number; keyed: boolean; count: number },
  body: (producer: Producer) => Promise<void>,
): Promise<Measured> {
  const system = SYSTEMS[v.system];
  return withFreshDatabase(ctx, v.system, round, async (db) => {
    const producer = await system.producer(db.url, { connections: options.connections, keyed: options.keyed });
    try {
      // Warm-up: open every connection once (and let each system cache its plans).
      await Promise.all(
        jobs(options.connections, options.keyed, "warm").map((job) => producer.enqueueOne(job)),
      );
      if (ctx.checkpoints) await checkpoint(db.client);
      const walWindow = await openWalWindow(db.client);
      const cpu0 = readMachineCpu();
      const t0 = performance.now();
      await body(producer);
      const seconds = (performance.now() - t0) / 1000;
      const cpu = machineCpuSeconds(cpu0, readMachineCpu());
      const wal = await closeWalWindow(db.client, walWindow);
      const done = (await system.remaining(db.client)) - options.connections;
      if (done !== options.count) throw new Error(`${v.label}: expected ${options.count} new jobs, found ${done}`);
      return {
        metrics: {
          jobs_per_s: options.count / seconds,
          wal_bytes_per_job: wal.bytes / options.count,
          wal_attributed: wal.attributed ? 1 : 0,
          cpu_us_per_job: (cpu * 1e6) / options.count,
        },
      };
    } finally {
      await producer.close();
    }
  });
}

function bulk(keyed: boolean): Workload {
  return {
    id: keyed ? "enqueue.bulk-keyed" : "enqueue.bulk",
    title: keyed ? "bulk enqueue, a key on every job, one call" : "bulk enqueue, one call",
    variants: SYSTEMS_ONCE,
    primary: "jobs_per_s",
    higherIsBetter: true,
    run(ctx, v, round) {
      const count = ctx.sizes.bulk;
      const batch = jobs(count, keyed, `r${round}`);
      return measureEnqueue(ctx, v, round, { connections: 1, keyed, count }, (p) => p.enqueueBulk(batch));
    },
  };
}

const single: Workload = {
  id: "enqueue.single",
  title: "single enqueues, one transaction each, 10 connections",
  variants: SYSTEMS_ONCE,
  primary: "jobs_per_s",
  higherIsBetter: true,
  run(ctx, v, round) {
    const { single: count, singleConnections: connections } = ctx.sizes;
    const all = jobs(count, false, "");
    return measureEnqueue(ctx, v, round, { connections, keyed: false, count }, async (producer) => {
      let next = 0;
      await Promise.all(
        Array.from({ length: connections }, async () => {
          while (next < all.length) await producer.enqueueOne(all[next++]!);
        }),
      );
    });
  },
};

export const enqueueWorkloads: Workload[] = [bulk(false), bulk(true), single];
