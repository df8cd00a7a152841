// Enqueue-to-handler latency: a worker (concurrency 10) waits idle on an empty
// queue; the bench process enqueues `latencyJobs` jobs one by one,
// `latencyGapMs` apart, each stamped with its enqueue time; the handler
// records now - stamp. Stamp and reading are two processes' reads of one
// system-wide clock (sharedClockMs), which every run first proves is shared
// with its worker process (checkSharedClock), and a latency that cannot be
// (not above 0, or longer than the whole run) fails the run
// (checkLatencies): the same for every system.

import { spawnWorker } from "../child.ts";
import { percentile, sharedClockMs } from "../measure.ts";
import { SYSTEMS } from "../systems/index.ts";
import { NOOP_TASK } from "../systems/types.ts";
import { sleep, variant, withFreshDatabase, type Workload } from "./common.ts";

const CONCURRENCY = 10;
/** The worker is started, then left idle this long before the first job. */
const IDLE_MS = 500;
/** Reads of the worker's clock that must each fall between the bench's reads around it. */
const CLOCK_PROBES = 20;

/**
 * Proves the worker process reads the bench's clock: for each probe, the child's reading must lie
 * between the bench's readings just before the request and just after the answer. Two clocks
 * that disagree by more than an IPC round trip (about 0.1 ms; per-process wall-clock origins
 * disagreed by about 1 ms) fail here, before any latency is measured with them.
 */
export async function checkSharedClock(read: () => Promise<number>, probes = CLOCK_PROBES): Promise<void> {
  // First that the clock is process.hrtime's at all: a per-process wall clock on both sides would
  // pass the probes below whenever the wall clock was not stepped between the two processes' starts.
  const before = Number(process.hrtime.bigint()) / 1e6;
  const ours = sharedClockMs();
  const after = Number(process.hrtime.bigint()) / 1e6;
  if (!(ours >= before && ours <= after)) {
    throw new Error(
      `latency: sharedClockMs() read ${ours} ms, not process.hrtime's ${before}-${after} ms: it must read the monotonic ` +
        `clock every process of the machine shares (bench/measure.ts), not a per-process wall clock.`,
    );
  }
  const misses: string[] = [];
  for (let i = 0; i < probes; i++) {
    const before = sharedClockMs();
    const theirs = await read();
    const after = sharedClockMs();
    if (!(theirs >= before && theirs <= after)) {
      const off = theirs < before ? theirs - before : theirs - after;
      misses.push(`${off >= 0 ? "+" : ""}${off.toFixed(3)} ms`);
    }
  }
  if (misses.length > 0) {
    throw new Error(
      `latency: the worker process's clock is not the bench's: ${misses.length} of ${probes} readings fell outside ` +
        `the bench's readings around them (by ${misses.slice(0, 5).join(", ")}). Stamp and read every latency with ` +
        `sharedClockMs() (bench/measure.ts), one clock both processes share; a per-process clock makes latencies meaningless.`,
    );
  }
}

/**
 * A latency is a real delay only if it is above 0 (the job went through an enqueue, a commit
 * and a claim) and not longer than the whole run; anything else means the stamp and the reading
 * are not on one clock, or the payload lost its stamp. Fails the run naming what was wrong.
 */
export function checkLatencies(latencies: readonly number[], expected: number, runMs: number): void {
  const problems: string[] = [];
  if (latencies.length !== expected) problems.push(`${latencies.length} latencies for ${expected} jobs`);
  const bad = latencies.filter((l) => !Number.isFinite(l) || l <= 0 || l > runMs);
  if (bad.length > 0) {
    const shown = bad.slice(0, 5).map((l) => (Number.isFinite(l) ? `${l.toFixed(3)} ms` : String(l)));
    problems.push(`${bad.length} outside (0, ${runMs.toFixed(0)} ms], the run's length: ${shown.join(", ")}`);
  }
  if (problems.length > 0) {
    throw new Error(
      `latency: implausible measurements (${problems.join("; ")}). The enqueue stamp and the handler's reading ` +
        `must be sharedClockMs() (bench/measure.ts) and every job's payload must carry its stamp.`,
    );
  }
}

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
        await checkSharedClock(() => child.readClock());
        await sleep(IDLE_MS);
        const start = sharedClockMs();
        const enqueues: number[] = [];
        for (let i = 0; i < count; i++) {
          const wait = start + i * gap - sharedClockMs();
          if (wait > 0) await sleep(wait);
          const t = sharedClockMs();
          await producer.enqueueOne({ task: NOOP_TASK, payload: { i, t } });
          enqueues.push(sharedClockMs() - t);
        }
        const result = await child.done;
        const l = result.latenciesMs;
        checkLatencies(l, count, sharedClockMs() - start);
        const p = result.paths;
        return {
          metrics: {
            p50_ms: percentile(l, 50),
            p95_ms: percentile(l, 95),
            max_ms: Math.max(...l),
            enqueue_p50_ms: percentile(enqueues, 50),
            wake_p50_ms: percentile(p.map((x) => x.wake), 50),
            fetch_p50_ms: percentile(p.map((x) => x.fetch), 50),
            dispatch_p50_ms: percentile(p.map((x) => x.dispatch), 50),
          },
        };
      } finally {
        child.kill();
        await child.exited;
        await producer.close();
      }
    });
  },
};
