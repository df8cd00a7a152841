// Enqueue-to-handler latency: a worker (concurrency 10) waits idle on an empty
// queue; the bench process enqueues `latencyJobs` jobs one by one,
// `latencyGapMs` apart, each stamped with its enqueue time; the handler
// records now - stamp (one machine clock, sub-millisecond).

import { spawnWorker } from "../child.ts";
import { percentile, wallMs } from "../measure.ts";
import { SYSTEMS } from "../systems/index.ts";
import { NOOP_TASK } from "../systems/types.ts";
import { sleep, variant, withFreshDatabase, type Workload } from "./common.ts";

const CONCURRENCY = 10;
/** The worker is started, then left idle this long before the first job. */
const IDLE_MS = 500;

export const latencyWorkload: Workload = {
  id: "latency",
  concurrency: CONCURRENCY,
  title: "enqueue-to-handler latency, idle worker, concurrency 10",
  variants: [
    variant("idemq", "batched"),
    variant("graphile", "batched"),
    variant("graphile", "perjob"),
    variant("pgboss", "batched"),
    variant("pgboss", "perjob"),
    variant("raw", "batched"),
  ],
  primary: "p50_ms",
  higherIsBetter: false,
  run(ctx, v, round) {
    const system = SYSTEMS[v.system];
    const { latencyJobs: count, latencyGapMs: gap } = ctx.sizes;
    return withFreshDatabase(ctx, v.system, round, async (db) => {
      // The producer first: for pg-boss it switches the queue's NOTIFY on before the worker reads it.
      const producer = await system.producer(db.url, { connections: 1, notify: true });
      const child = spawnWorker(
        { system: v.system, mode: v.mode, concurrency: CONCURRENCY, url: db.url, expect: count, kind: "latency", notify: true },
        ctx.timeoutMs,
      );
      try {
        await child.ready;
        await sleep(IDLE_MS);
        const start = performance.now();
        for (let i = 0; i < count; i++) {
          const wait = start + i * gap - performance.now();
          if (wait > 0) await sleep(wait);
          await producer.enqueueOne({ task: NOOP_TASK, payload: { i, t: wallMs() } });
        }
        const result = await child.done;
        const l = result.latenciesMs;
        return {
          metrics: { p50_ms: percentile(l, 50), p95_ms: percentile(l, 95), max_ms: Math.max(...l) },
        };
      } finally {
        child.kill();
        await child.exited;
        await producer.close();
      }
    });
  },
};
