// One worker process: starts a system's worker and reports, over IPC, how
// long it took to process the expected number of jobs, the machine CPU over
// that window, its own CPU and that of its PostgreSQL backends, its peak RSS,
// and (latency runs) every job's enqueue-to-handler latency.
//
// Throughput window: from the first handler call until the database shows no
// unfinished job (so batched completions are counted), after the last call
// (kind "share": after this process's last call, however many it got).

import { createRequire } from "node:module";
import pg from "pg";
import {
  backendCpuSeconds,
  machineCpuSeconds,
  readBackendCpu,
  readMachineCpu,
  sharedClockMs,
  type MachineCpu,
} from "./measure.ts";
import { SYSTEMS } from "./systems/index.ts";
import type { BenchPayload } from "./systems/types.ts";
import type { ChildConfig, ChildMessage, ParentMessage } from "./child.ts";

const config = JSON.parse(process.argv[2]!) as ChildConfig;

// Round trips: every statement any pg client of this process sends, through
// every copy of pg it loads: the peers use bench/node_modules' and idemq's
// dist/ the package's own (the root's node_modules); patching only the first
// left idemq's round trips out (0.000 per job). Latency runs also time each
// statement (sent, answered) on the shared clock, whether the caller awaits a
// promise or passes a callback (pg-pool does): where each job's latency went
// is read from them (pathOf).
let statements = 0;
const timing = config.kind === "latency";
const timed: { sent: number; answered: number }[] = [];
const rootPg = createRequire(new URL("../package.json", import.meta.url))("pg") as typeof pg;
for (const Client of new Set([pg.Client, rootPg.Client])) countStatements(Client);

function countStatements(Client: typeof pg.Client): void {
  const query = Client.prototype.query as (...args: unknown[]) => unknown;
  Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    if (this === monitor) return query.apply(this, args);
    statements++;
    const first = args[0] as { submit?: unknown } | undefined;
    if (!timing || (typeof first === "object" && first !== null && typeof first.submit === "function")) return query.apply(this, args);
    const entry = { sent: sharedClockMs(), answered: Number.NaN };
    timed.push(entry);
    const mark = () => {
      if (Number.isNaN(entry.answered)) entry.answered = sharedClockMs();
    };
    const last = args.length - 1;
    if (typeof args[last] === "function") {
      const callback = args[last] as (...r: unknown[]) => unknown;
      args[last] = function (this: unknown, ...r: unknown[]) {
        mark();
        return callback.apply(this, r);
      };
    }
    const result = query.apply(this, args) as Promise<unknown> | undefined;
    if (result !== undefined && typeof result.then === "function") result.then(mark, mark);
    return result;
  } as typeof pg.Client.prototype.query;
}

const system = SYSTEMS[config.system];

function send(message: ChildMessage): void {
  process.send!(message);
}

const monitor = new pg.Client({ connectionString: config.url });
monitor.on("error", () => {});
await monitor.connect();

let count = 0;
let started = 0;
let cpu0: MachineCpu | null = null;
let self0: NodeJS.CpuUsage | null = null;
let statements0 = 0;
let backends0: Promise<Map<number, number> | null> | null = null;
const latencies: number[] = [];
/** Latency runs: each job's enqueue stamp and handler call, on the shared clock. */
const handled: { stamp: number; handler: number }[] = [];

/**
 * Where one job's latency went, from the statements this process sent:
 * wake, from the stamp to the first statement sent after it (the enqueue's
 * commit, the wake-up's delivery: NOTIFY or a poll, and the worker's own code
 * until it asks); fetch, the round trip of the last statement answered before
 * the handler ran (the claim); dispatch, from that answer to the handler.
 */
function pathOf(job: { stamp: number; handler: number }): { wake: number; fetch: number; dispatch: number } | null {
  let first: number | undefined;
  let fetched: { sent: number; answered: number } | undefined;
  for (const s of timed) {
    if (s.sent < job.stamp || s.sent > job.handler) continue;
    if (first === undefined || s.sent < first) first = s.sent;
    if (s.answered <= job.handler && (fetched === undefined || s.answered > fetched.answered)) fetched = s;
  }
  if (first === undefined || fetched === undefined) return null;
  return { wake: first - job.stamp, fetch: fetched.answered - fetched.sent, dispatch: job.handler - fetched.answered };
}
let finishing = false;

function onJob(payload: BenchPayload): void {
  count++;
  if (count === 1) {
    started = performance.now();
    cpu0 = readMachineCpu();
    self0 = process.cpuUsage();
    statements0 = statements;
    backends0 = readBackendCpu(monitor).catch(() => null);
  }
  if (timing && payload.t !== undefined) {
    const now = sharedClockMs();
    latencies.push(now - payload.t);
    handled.push({ stamp: payload.t, handler: now });
  }
  // A share of a queue ends when the queue does: finish() waits for that.
  const last = config.kind === "share" ? count === 1 : count === config.expect;
  if (last && !finishing) {
    finishing = true;
    setImmediate(() => void finish().catch(fail));
  }
}

async function finish(): Promise<void> {
  while ((await system.remaining(monitor, config.queues)) > 0) await new Promise((r) => setTimeout(r, 2));
  const workerStatements = statements - statements0;
  const seconds = (performance.now() - started) / 1000;
  const machine = machineCpuSeconds(cpu0!, readMachineCpu());
  const self = process.cpuUsage(self0!);
  const before = await backends0!;
  const after = await readBackendCpu(monitor).catch(() => null);
  send({
    type: "done",
    result: {
      jobs: count,
      seconds,
      machineCpuSeconds: machine,
      workerCpuSeconds: (self.user + self.system) / 1e6,
      backendCpuSeconds: before && after ? backendCpuSeconds(before, after) : null,
      maxRssKb: process.resourceUsage().maxRSS,
      statements: workerStatements,
      latenciesMs: latencies,
      paths: handled.map(pathOf).filter((p) => p !== null),
    },
  });
  await Promise.race([worker.stop(), new Promise((r) => setTimeout(r, 5000))]).catch(() => {});
  await monitor.end().catch(() => {});
  process.exit(0);
}

// The parent reads this process's clock to prove it shares its own (bench/workloads/latency.ts).
process.on("message", (message: ParentMessage) => {
  if (message.type === "clock") send({ type: "clock", ms: sharedClockMs() });
});

function fail(err: unknown): void {
  send({ type: "error", message: err instanceof Error ? err.stack ?? err.message : String(err) });
  process.exit(1);
}

process.on("uncaughtException", fail);
process.on("unhandledRejection", fail);

const worker = await system.startWorker({
  url: config.url,
  concurrency: config.concurrency,
  mode: config.mode,
  notify: config.notify,
  ...(config.defaults ? { defaults: true } : {}),
  onJob,
  ...(config.queues ? { queues: config.queues } : {}),
});
send({ type: "ready" });
