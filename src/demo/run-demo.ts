// `idemq demo`: real jobs on real worker processes against a fresh database,
// in four parts (guard, email, retries, policies). Each part returns its
// figures; the demo passes when every figure is what it should be.
import { relative } from "node:path";
import { Client } from "../client.ts";
import { createDemoDatabase } from "./demo-database.ts";
import { emailScenario } from "./email-scenario.ts";
import { startFakeEmailProvider, type FakeEmailProvider } from "./fake-email-provider.ts";
import { startFakeSupplier, type FakeSupplier } from "./fake-supplier.ts";
import type { Figure } from "./figures.ts";
import { guardScenario } from "./guard-scenario.ts";
import { policiesScenario } from "./policies-scenario.ts";
import type { Progress } from "./progress.ts";
import { retriesScenario } from "./retries-scenario.ts";
import type { DemoContext, ScenarioResult } from "./scenario.ts";
import { DEMO_TASKS_MODULE, DemoWorker, type DemoWorkerOptions } from "./worker-processes.ts";

export interface DemoOptions {
  /** A database on the server to use; the demo creates its own database next to it. */
  serverUrl: string;
  /** The server is the embedded one (on this machine). */
  embedded: boolean;
  /** Keep the demo's database for inspection. */
  keep: boolean;
  progress: Progress;
  /** Receives each part's report as it finishes (people's output; nothing with --json). */
  report: (lines: string[]) => void;
  /** Aborts the run (a signal): workers are stopped and the database dropped. */
  signal: AbortSignal;
}

export interface DemoResult {
  ok: boolean;
  seconds: number;
  database: { name: string; url: string; kept: boolean; embedded: boolean };
  guard: Record<string, unknown>;
  email: Record<string, unknown>;
  retries: Record<string, unknown>;
  policies: Record<string, unknown>;
  figures: Figure[];
}

/** Worker timings short enough for a demo (the defaults are 30 s leases, 2 s polls). */
const COMMON_SETTINGS = { POLL: "250ms" };
/** The mailers: one job at a time, a 2 s lease, rescue() every 250 ms, effect claims stale after 500 ms. */
const MAILER_SETTINGS = { LEASE: "2s", RESCUE: "250ms", PREFETCH: "0", STALE_AFTER: "500ms" };
const CREDIT_WORKERS = 3;
/** Per worker process: its pool holds concurrency + 4 connections at most. */
const CREDIT_CONCURRENCY = 4;

export async function runDemo(options: DemoOptions): Promise<DemoResult> {
  const { progress } = options;
  const started = performance.now();
  const db = await createDemoDatabase(options.serverUrl, { keep: options.keep, localServer: options.embedded });
  if (db.droppedLeftovers.length > 0) {
    progress.step(`dropped ${db.droppedLeftovers.join(", ")}, left by demo runs that were killed`);
  }
  progress.step(`created database ${db.name}${db.kept ? " (kept after the demo: --keep)" : " (dropped after the demo)"}`);
  const workers: DemoWorker[] = [];
  let client: Client | undefined;
  let provider: FakeEmailProvider | undefined;
  let supplier: FakeSupplier | undefined;
  const stopOnAbort = (): void => {
    for (const worker of workers) void worker.kill();
  };
  options.signal.addEventListener("abort", stopOnAbort, { once: true });
  try {
    [provider, supplier] = await Promise.all([startFakeEmailProvider(), startFakeSupplier({ slowRequests: 2 })]);
    const services = { EMAIL_URL: provider.url, SUPPLIER_URL: supplier.url };
    const startWorker = (o: Omit<DemoWorkerOptions, "databaseUrl">): DemoWorker => {
      options.signal.throwIfAborted();
      const worker = new DemoWorker({ ...o, databaseUrl: db.url, settings: { ...COMMON_SETTINGS, ...services, ...o.settings } });
      workers.push(worker);
      return worker;
    };
    const creditWorkers = Array.from({ length: CREDIT_WORKERS }, (_, i) =>
      startWorker({ name: `worker-${i + 1}`, queues: ["credits", "imports", "payouts"], concurrency: CREDIT_CONCURRENCY }),
    );
    const mailer = startWorker({ name: "mailer-1", queues: ["emails"], concurrency: 1, settings: MAILER_SETTINGS });
    progress.step(`starting ${workers.length} worker processes: idemq worker --tasks ${relative(process.cwd(), DEMO_TASKS_MODULE)} (${workers.map((w) => `${w.name} pid ${w.pid}`).join(", ")})`);
    await Promise.all(workers.map((w) => w.started()));
    progress.step("workers running");

    client = new Client({ connectionString: db.url, poolConfig: { max: 4 }, onError: () => {} });
    const ctx: DemoContext = {
      client,
      databaseUrl: db.url,
      progress,
      workers: creditWorkers,
      startWorker: (o) => startWorker({ ...o, settings: { ...MAILER_SETTINGS, ...o.settings } }),
      emailProvider: provider,
      supplier,
      signal: options.signal,
    };
    const run = async (part: (ctx: DemoContext) => Promise<ScenarioResult>): Promise<ScenarioResult> => {
      options.signal.throwIfAborted();
      const result = await part(ctx);
      options.report(result.report);
      return result;
    };
    const guard = await run(guardScenario);
    const email = await run((c) => emailScenario(c, mailer, MAILER_SETTINGS.LEASE));
    const retries = await run(retriesScenario);
    const policies = await run(policiesScenario);
    const figures = [guard, email, retries, policies].flatMap((r) => r.figures);
    return {
      ok: figures.every((f) => f.ok),
      seconds: Math.round((performance.now() - started) / 100) / 10,
      database: { name: db.name, url: db.url, kept: db.kept, embedded: options.embedded },
      guard: guard.details,
      email: email.details,
      retries: retries.details,
      policies: policies.details,
      figures,
    };
  } finally {
    options.signal.removeEventListener("abort", stopOnAbort);
    await Promise.all(workers.map((w) => w.stop()));
    await client?.close().catch(() => {});
    await provider?.close();
    await supplier?.close();
    await db.dispose();
  }
}
