// One worker process: starts a system's worker and reports, over IPC, how
// long it took to process the expected number of jobs, the machine CPU over
// that window, its own CPU and that of its PostgreSQL backends, its peak RSS,
// and (latency runs) every job's enqueue-to-handler latency.
//
// Throughput window: from the first handler call until the database shows no
// unfinished job (so batched completions are counted), after the last call
// (kind "share": after this process's last call, however many it got).

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

// Round trips: every statement any pg client of this process sends (idemq,
// graphile-worker and pg-boss all use this one pg package).
let statements = 0;
const query = pg.Client.prototype.query as (...args: unknown[]) => unknown;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
  if (this !== monitor) statements++;
  return query.apply(this, args);
} as typeof pg.Client.prototype.query;
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
  if (config.kind === "latency" && payload.t !== undefined) latencies.push(sharedClockMs() - payload.t);
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
