// Fairness: two idemq worker processes (bench/worker-child.ts, kind "share")
// on one queue. Both start and wait on the empty queue; then the jobs are
// enqueued in one call, and each process works until the database shows no
// unfinished job. Each one's count is its share; the ratio of the larger to
// the smaller says whether one worker hoarded jobs while the other idled.

import { spawnWorker, type WorkerChild } from "../child.ts";
import { SYSTEMS } from "../systems/index.ts";
import { NOOP_TASK, type BenchJob } from "../systems/types.ts";
import { idemqDefaults, variant, withFreshDatabase, type Workload } from "./common.ts";

const CONCURRENCY = 10;
const PROCESSES = 2;

export const shareWorkload: Workload = {
  id: "share.c10",
  title: `fairness: ${PROCESSES} worker processes on one queue, concurrency ${CONCURRENCY} each, no-op handlers`,
  concurrency: CONCURRENCY,
  subject: "idemq:defaults",
  variants: [idemqDefaults("batched", "idemq:defaults"), variant("idemq", "batched")],
  primary: "share_ratio",
  higherIsBetter: false,
  run(ctx, v, round) {
    const system = SYSTEMS[v.system];
    const count = ctx.sizes.process;
    return withFreshDatabase(ctx, v.system, round, async (db) => {
      const children: WorkerChild[] = [];
      const producer = await system.producer(db.url, { connections: 1 });
      try {
        for (let i = 0; i < PROCESSES; i++) {
          children.push(
            spawnWorker(
              { system: v.system, mode: v.mode, concurrency: CONCURRENCY, url: db.url, expect: count, kind: "share", notify: false, defaults: v.defaults ?? false },
              ctx.timeoutMs,
            ),
          );
        }
        await Promise.all(children.map((c) => c.ready));
        const jobs: BenchJob[] = Array.from({ length: count }, (_, i) => ({ task: NOOP_TASK, payload: { i } }));
        await producer.enqueueBulk(jobs);
        const results = await Promise.all(children.map((c) => c.done));
        const counts = results.map((r) => r.jobs);
        const done = counts.reduce((a, b) => a + b, 0);
        if (done !== count) throw new Error(`the workers ran ${done} handlers for ${count} jobs`);
        const [fewest, most] = [Math.min(...counts), Math.max(...counts)];
        return {
          metrics: {
            jobs_per_s: count / Math.max(...results.map((r) => r.seconds)),
            jobs_fewest: fewest,
            jobs_most: most,
            share_ratio: fewest === 0 ? null : most / fewest,
          },
        };
      } finally {
        for (const c of children) c.kill();
        await Promise.all(children.map((c) => c.exited));
        await producer.close();
      }
    });
  },
};
