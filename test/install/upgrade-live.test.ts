// Upgrading a live installation from the released 0.1.0 package (issue 24):
// the 0.1.0 tarball (test/fixtures/releases/) is installed into a fresh app,
// its `idemq migrate` installs 0.1.0 into an empty database, and jobs wait in
// every state (enqueued, scheduled, awaiting a parent, retrying, with keys,
// guard rows, external effects and a schedule). A 0.1.0 worker process, logged
// in as a member of 0.1.0's cluster-wide idemq_worker, runs them while this
// checkout's `idemq migrate` upgrades the database under it. Then a worker of
// this checkout joins, logged in with a role granted by this checkout's
// `idemq roles grant`. Every job finishes, and the ledger its handlers write
// in their own transactions has exactly one row per job: no job lost, none run
// twice; the 0.1.0 worker keeps working through the upgrade and stops cleanly.
// Each later release adds its tarball and runs the same test from it.
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { killAllWorkers, startedWorker, type WorkerProcess } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const exec = promisify(execFile);
const RELEASE = "0.1.0";
const TARBALL = resolve(import.meta.dirname, "..", "fixtures", "releases", `idemq-${RELEASE}.tgz`);
const INSTALL_TIMEOUT_MS = 240_000;

// Plain JavaScript, as an app of 0.1.0 would have it: every handler writes its
// ledger row in the job's own transaction (transactional tasks), so a row means
// a committed run; `external` makes a claim-first effect whose call writes a row
// of its own.
const TASKS = `
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const row = (ctx, kind) => ctx.tx.query(
  "INSERT INTO public.upgrade_ledger (job_id, attempt, kind, worker_pid) VALUES ($1, $2, $3, $4)",
  [ctx.job.id, ctx.job.attempt, kind, process.pid]);
export const tasks = {
  step: { transactional: true, guardKey: (p) => "step:" + p.n, run: async (p, ctx) => { await row(ctx, "step"); await sleep(p.ms ?? 15); } },
  flaky: {
    transactional: true,
    backoff: { kind: "fixed", delays: ["300 milliseconds"] },
    run: async (p, ctx) => { if (ctx.job.attempt === 1) throw new Error("first attempt fails"); await row(ctx, "flaky"); },
  },
  ticked: { transactional: true, run: async (p, ctx) => { await row(ctx, "ticked"); } },
  external: {
    transactional: true,
    run: async (p, ctx) => {
      await ctx.effect("upgrade-effect:" + p.n, async () => ({ sent: p.n }));
      await row(ctx, "external");
    },
  },
};
`;

let tmp: string;
let oldCli: string;
const db = useTestDatabase({ empty: true, poolSize: 4 });

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), "idemq-upgrade-live-"));
  await writeFile(join(tmp, "package.json"), JSON.stringify({ name: "app-on-0-1-0", private: true, type: "module" }));
  await exec("npm", ["install", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error", TARBALL], {
    cwd: tmp,
    timeout: INSTALL_TIMEOUT_MS,
  });
  oldCli = join(tmp, "node_modules", "idemq", "bin", "idemq.js");
  await writeFile(join(tmp, "tasks.mjs"), TASKS);
}, INSTALL_TIMEOUT_MS);

afterAll(async () => {
  await killAllWorkers();
  // The database first: the logins hold privileges on its ledger table.
  await db.drop();
  await dropLoginRoles();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

async function oldIdemq(...args: string[]): Promise<{ stdout: string; stderr: string }> {
  return exec(process.execPath, [oldCli, ...args, "--database-url", db.url], { cwd: tmp, timeout: 60_000 });
}

async function count(sql: string, values: unknown[] = []): Promise<number> {
  return (await db.pool.query<{ n: number }>(sql, values)).rows[0]!.n;
}

describe(`an installation of ${RELEASE}, upgraded to this checkout while its worker runs`, () => {
  it("loses no job and runs none twice; the old worker keeps working through the upgrade and stops cleanly; a new worker joins", async () => {
    // ---- 0.1.0, installed by its own CLI.
    const installed = await oldIdemq("migrate", "--json");
    expect(JSON.parse(installed.stdout).applied).toEqual(["0001_release_0_1_0"]);
    await db.pool.query(`CREATE TABLE public.upgrade_ledger (
      job_id bigint NOT NULL, attempt int NOT NULL, kind text NOT NULL, worker_pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
    const oldLogin = await createLoginRole("upg_old", { memberOf: ["idemq_worker"] });
    await db.pool.query(`GRANT INSERT ON public.upgrade_ledger TO ${oldLogin.name}`);

    // ---- Jobs in every state, through 0.1.0's SQL.
    const jobs = (items: unknown[]) => db.pool.query("SELECT * FROM idemq.enqueue_many($1::jsonb)", [JSON.stringify(items)]);
    await jobs(Array.from({ length: 300 }, (_, n) => ({ task: "step", payload: { n }, idempotency_key: n % 3 === 0 ? `upgrade-key:${n}` : undefined })));
    const scheduled = await jobs(Array.from({ length: 20 }, (_, i) => ({ task: "step", payload: { n: 1000 + i }, run_at: new Date(Date.now() + 2_000).toISOString() })));
    expect(scheduled.rows.every((r) => r.outcome === "created")).toBe(true);
    const parent = (await db.pool.query("SELECT job_id FROM idemq.enqueue('step', '{\"n\": 2000, \"ms\": 200}')")).rows[0].job_id;
    await jobs(Array.from({ length: 10 }, (_, i) => ({ task: "step", payload: { n: 2001 + i }, after: [Number(parent)] })));
    await jobs(Array.from({ length: 10 }, (_, i) => ({ task: "flaky", payload: { n: i } })));
    await jobs(Array.from({ length: 10 }, (_, i) => ({ task: "external", payload: { n: i } })));
    await db.pool.query("SELECT idemq.schedule(name => 'upgrade-tick', cron => '* * * * * *', task => 'ticked')");
    expect(await count("SELECT count(*)::int AS n FROM idemq.jobs WHERE state = 'awaiting'")).toBe(10);
    expect(await count("SELECT count(*)::int AS n FROM idemq.jobs WHERE state = 'scheduled'")).toBe(20);

    // ---- The 0.1.0 worker runs; the upgrade happens while it is mid-stream.
    const old = await startedWorker({
      tasks: join(tmp, "tasks.mjs"),
      cli: oldCli,
      cwd: tmp,
      databaseUrl: oldLogin.urlFor(db.name),
      // The queue of the jobs enqueued before the upgrade; those after it are the new worker's.
      args: ["--concurrency", "4", "--queues", "default"],
    });
    await waitFor(async () => (await count("SELECT count(*)::int AS n FROM public.upgrade_ledger")) >= 40, { what: "the old worker to be mid-stream" });
    const upgraded = await runCli(["migrate", "--json", "--database-url", db.url], { timeoutMs: 120_000 });
    expect(upgraded.code, upgraded.stderr).toBe(0);
    expect(JSON.parse(upgraded.stdout).applied).toEqual(MIGRATION_NAMES.slice(1));
    // One line for the 0.1.0 login it kept working here, through this installation's worker role.
    expect(upgraded.stderr).toContain(`idemq: ${oldLogin.name} (a member of the cluster-wide idemq_worker) is now a member of idemq_${db.name}_worker`);
    const upgradedAt = new Date();
    const doneAtUpgrade = await count("SELECT count(*)::int AS n FROM public.upgrade_ledger");
    expect(await count("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = 'default' AND finished_at IS NULL"), "jobs left for the old worker after the upgrade").toBeGreaterThan(0);

    // ---- After the upgrade: new jobs, a tick of the schedule, and a worker of this checkout.
    await db.pool.query("SELECT * FROM idemq.enqueue_many($1::jsonb)", [
      JSON.stringify(Array.from({ length: 100 }, (_, i) => ({ task: "step", payload: { n: 3000 + i }, queue: "after-upgrade" }))),
    ]);
    // The schedule made at 0.1.0 fires after the upgrade (its first slot may still be ahead: tick until it has).
    await waitFor(
      async () => {
        await db.pool.query("SELECT idemq.tick()");
        return (await count("SELECT count(*)::int AS n FROM idemq.jobs WHERE task = 'ticked'")) > 0;
      },
      { what: "a tick to enqueue the schedule's job" },
    );
    await db.pool.query("SELECT idemq.unschedule(name => 'upgrade-tick')");
    const newLogin = await createLoginRole("upg_new");
    const granted = await runCli(["roles", "grant", newLogin.name, "--worker", "--database-url", db.url]);
    expect(granted.code, granted.stderr).toBe(0);
    await db.pool.query(`GRANT INSERT ON public.upgrade_ledger TO ${newLogin.name}`);
    const fresh = await startedWorker({ tasks: join(tmp, "tasks.mjs"), databaseUrl: newLogin.urlFor(db.name), args: ["--concurrency", "4"] });

    await waitFor(async () => (await count("SELECT count(*)::int AS n FROM idemq.jobs WHERE finished_at IS NULL")) === 0, {
      what: "every job to finish",
      timeoutMs: 120_000,
    });
    const stopped = async (worker: WorkerProcess) => {
      worker.child.kill("SIGTERM");
      return worker.exited;
    };
    expect(await stopped(old), old.stderr()).toEqual({ code: 0, signal: null });
    expect(await stopped(fresh), fresh.stderr()).toEqual({ code: 0, signal: null });

    // ---- Every job succeeded, each with exactly one committed run.
    const states = await db.pool.query<{ state: string; n: number }>("SELECT state::text, count(*)::int AS n FROM idemq.jobs GROUP BY 1 ORDER BY 1");
    const total = await count("SELECT count(*)::int AS n FROM idemq.jobs");
    expect(states.rows).toEqual([{ state: "succeeded", n: total }]);
    expect(total).toBeGreaterThanOrEqual(300 + 20 + 1 + 10 + 10 + 10 + 100 + 1);
    expect(await count("SELECT count(*)::int AS n FROM (SELECT job_id FROM public.upgrade_ledger GROUP BY job_id HAVING count(*) <> 1) d"), "a job run twice").toBe(0);
    expect(
      await count("SELECT count(*)::int AS n FROM idemq.jobs j WHERE NOT EXISTS (SELECT FROM public.upgrade_ledger l WHERE l.job_id = j.id)"),
      "a job with no run",
    ).toBe(0);
    expect(await count("SELECT count(*)::int AS n FROM public.upgrade_ledger WHERE kind = 'flaky' AND attempt = 2")).toBe(10);
    expect(await count("SELECT count(*)::int AS n FROM idemq.effects WHERE status = 'done' AND reclaims = 0")).toBe(10);
    expect(await count("SELECT count(*)::int AS n FROM public.upgrade_ledger WHERE kind = 'ticked'")).toBeGreaterThanOrEqual(1);

    // ---- The old worker kept working through the upgrade, with no error; both workers did work after it.
    // The message is the error events themselves (the end of stdout rarely holds them).
    const errors = (w: WorkerProcess) => JSON.stringify(w.events.filter((e) => e.event === "worker:error"));
    expect(old.count("worker:error"), errors(old)).toBe(0);
    expect(fresh.count("worker:error"), errors(fresh)).toBe(0);
    const after = await db.pool.query<{ pid: number; n: number }>(
      "SELECT worker_pid AS pid, count(*)::int AS n FROM public.upgrade_ledger WHERE at > $1 GROUP BY 1",
      [upgradedAt],
    );
    const byPid = new Map(after.rows.map((r) => [r.pid, r.n]));
    expect(byPid.get(old.pid) ?? 0, "the 0.1.0 worker ran jobs after the upgrade").toBeGreaterThan(0);
    expect(byPid.get(fresh.pid) ?? 0, "the new worker ran jobs").toBeGreaterThan(0);
    expect(doneAtUpgrade).toBeLessThan(total);
  }, 300_000);
});
