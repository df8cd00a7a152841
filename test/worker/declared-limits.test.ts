// A task's declared limits (concurrencyLimit, rateLimit; issue 26 item 1):
// checked when the worker is created, with errors naming the task; applied
// at start() through declare_limit, lower-only: workers that disagree (a
// rolling deploy) leave the lowest stored, whatever order they start in; a
// stored lower limit (an operator's) is never raised, a higher one is
// lowered; a login without EXECUTE on declare_limit gets one warning and the
// worker runs on.
import pg from "pg";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createWorker, WorkerConfigError, type Worker, type WorkerOptions } from "../../src/index.ts";
import { installationRoles } from "../../src/roles.ts";
import { limits, setLimit } from "../../src/sql/index.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, stateOf, unique } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";

const db = useTestDatabase({ poolSize: 12 });
const workers: Worker[] = [];

afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop()));
});
afterAll(async () => {
  await db.drop();
  await dropLoginRoles();
});

type TaskConfig = Record<string, unknown>;

function worker(task: string, config: TaskConfig, options: Partial<WorkerOptions> = {}): { worker: Worker; logs: { level: string; message: string }[] } {
  const logs: { level: string; message: string }[] = [];
  const w = createWorker({ pool: db.pool, handleSignals: false, tasks: { [task]: { run: async () => {}, ...config } }, ...options } as WorkerOptions);
  w.on("log", (entry) => logs.push({ level: entry.level, message: entry.message }));
  workers.push(w);
  return { worker: w, logs };
}

async function stored(task: string) {
  const row = (await limits(db.pool)).find((l) => l.task === task);
  return row === undefined ? undefined : { concurrency: row.concurrency, rate: row.rate, per: row.per };
}

function refused(config: TaskConfig): string {
  try {
    createWorker({ connectionString: "postgres://nobody@127.0.0.1:1/never", handleSignals: false, tasks: { "send-sms": { run: async () => {}, ...config } } } as WorkerOptions);
  } catch (error) {
    expect(error).toBeInstanceOf(WorkerConfigError);
    return (error as Error).message;
  }
  throw new Error("createWorker accepted the task");
}

describe("declared limits: the config", () => {
  it("refuses a bad concurrencyLimit or rateLimit, naming the task and the option", () => {
    expect(refused({ concurrencyLimit: 0 })).toBe('task "send-sms": concurrencyLimit must be an integer from 1 to 10000, got number 0');
    expect(refused({ concurrencyLimit: 2.5 })).toBe('task "send-sms": concurrencyLimit must be an integer from 1 to 10000, got number 2.5');
    expect(refused({ concurrencyLimit: "5" })).toBe('task "send-sms": concurrencyLimit must be an integer from 1 to 10000, got the string "5"');
    expect(refused({ rateLimit: 100 })).toBe('task "send-sms": rateLimit must be { rate, per }, e.g. { rate: 100, per: "1 minute" }, got number 100');
    expect(refused({ rateLimit: { rate: 100 } })).toBe('task "send-sms": rateLimit must be { rate, per }, e.g. { rate: 100, per: "1 minute" }: per is missing');
    expect(refused({ rateLimit: { per: "1m" } })).toBe('task "send-sms": rateLimit must be { rate, per }, e.g. { rate: 100, per: "1 minute" }: rate is missing');
    expect(refused({ rateLimit: { rate: 0, per: "1m" } })).toBe('task "send-sms": rateLimit.rate must be an integer from 1 to 100000, got number 0');
    expect(refused({ rateLimit: { rate: 10, per: "500ms" } })).toMatch(/^task "send-sms": rateLimit.per must be at least 1 second/);
    expect(refused({ rateLimit: { rate: 10, per: "soon" } })).toMatch(/^task "send-sms": rateLimit.per: /);
    expect(refused({ rateLimit: { rate: 10, per: "1m", burst: 5 } })).toMatch(/^task "send-sms": rateLimit has an unknown option "burst"/);
  });
});

describe("declared limits at start", () => {
  it("a worker sets its task's limits when none are stored, and a restart with the same declaration writes nothing new", async () => {
    const task = unique("mail");
    const first = worker(task, { concurrencyLimit: 4, rateLimit: { rate: 100, per: "1 minute" } });
    await first.worker.start();
    expect(await stored(task)).toEqual({ concurrency: 4, rate: 100, per: "00:01:00" });
    expect(first.logs).toContainEqual({ level: "info", message: `task "${task}": applied concurrency 4, rate 100 per 1 minute` });
    const again = worker(task, { concurrencyLimit: 4, rateLimit: { rate: 100, per: "1 minute" } });
    await again.worker.start();
    expect(again.logs).toContainEqual({ level: "info", message: `task "${task}": already stored concurrency 4, rate 100 per 1 minute` });
  });

  it("workers that disagree, started at once (a rolling deploy), leave the lowest limit and the lowest rate, never a higher one", async () => {
    const task = unique("deploy");
    const declared = [7, 4, 9, 5, 6, 8];
    const rates = [
      { rate: 10, per: "1 second" }, // 10/s
      { rate: 100, per: "1 minute" }, // 1.67/s
      { rate: 500, per: "1 minute" }, // 8.3/s
      { rate: 4, per: "1 second" }, // 4/s
      { rate: 1000, per: "1 hour" }, // 0.28/s: the lowest
      { rate: 20, per: "10 seconds" }, // 2/s
    ];
    const started = declared.map((n, i) => worker(task, { concurrencyLimit: n, rateLimit: rates[i] }));
    await Promise.all(started.map((s) => s.worker.start()));
    expect(await stored(task)).toEqual({ concurrency: 4, rate: 1000, per: "01:00:00" });
    // A later worker declaring more (the old version, restarted) does not raise it, and says so.
    const old = worker(task, { concurrencyLimit: 9 });
    await old.worker.start();
    expect((await stored(task))?.concurrency).toBe(4);
    expect(old.logs).toContainEqual({
      level: "info",
      message: `task "${task}" declares concurrency 9; the stored concurrency 4, rate 1000 per 01:00:00 is kept where it is lower (a worker never raises a limit)`,
    });
  });

  it("an operator's lower limit is never raised by a worker; an operator's higher one is lowered to the declared limit at the next start", async () => {
    const task = unique("ops");
    await setLimit(db.pool, { task, concurrency: 2 });
    await worker(task, { concurrencyLimit: 5 }).worker.start();
    expect((await stored(task))?.concurrency).toBe(2);

    await setLimit(db.pool, { task, concurrency: 20 }); // raised by an operator above what the code declares
    await worker(task, { concurrencyLimit: 5 }).worker.start();
    expect((await stored(task))?.concurrency).toBe(5);
  });

  it("leaves the task's pause and the other fields alone: a rate-only declaration keeps the stored concurrency", async () => {
    const task = unique("keep");
    await setLimit(db.pool, { task, concurrency: 3 });
    await db.pool.query("SELECT idemq.pause(task => $1)", [task]);
    await worker(task, { rateLimit: { rate: 5, per: "1s" } }).worker.start();
    const row = (await limits(db.pool)).find((l) => l.task === task);
    expect(row).toMatchObject({ concurrency: 3, rate: 5, per: "00:00:01", paused: true });
  });

  it("a login with this installation's worker role declares limits (declare_limit is the worker's), and runs jobs", async () => {
    const role = await createLoginRole("declarer", { memberOf: [(await installationRoles(db.pool)).worker] });
    const task = unique("least");
    const w = createWorker({ connectionString: role.urlFor(db.name), handleSignals: false, tasks: { [task]: { run: async () => {}, concurrencyLimit: 3 } } });
    workers.push(w);
    await w.start();
    expect((await stored(task))?.concurrency).toBe(3);
    // The narrow function cannot raise a limit, and the worker role cannot call set_limit itself.
    const client = new pg.Client({ connectionString: role.urlFor(db.name) });
    await client.connect();
    try {
      await expect(client.query("SELECT idemq.set_limit(task => $1, concurrency => 100)", [task])).rejects.toMatchObject({ code: "42501" });
      await client.query("SELECT * FROM idemq.declare_limit(task => $1, concurrency => 100)", [task]);
    } finally {
      await client.end();
    }
    expect((await stored(task))?.concurrency).toBe(3);
  });

  it("a login that may not call declare_limit gets one warning naming the task and the fix, and the worker runs its jobs", async () => {
    const roles = await installationRoles(db.pool);
    const role = await createLoginRole("nodeclare", { memberOf: [roles.worker] });
    const task = unique("warned");
    await db.pool.query(`REVOKE EXECUTE ON FUNCTION idemq.declare_limit(text, int, int, interval) FROM ${roles.worker}`);
    try {
      const warnings: string[] = [];
      const w = createWorker({
        connectionString: role.urlFor(db.name),
        handleSignals: false,
        tasks: { [task]: { run: async () => {}, concurrencyLimit: 3 } },
      });
      w.on("log", (entry) => entry.level === "warn" && warnings.push(entry.message));
      workers.push(w);
      await w.start();
      const warned = warnings.filter((m) => m.includes(task));
      expect(warned).toHaveLength(1);
      expect(warned[0]).toMatch(
        new RegExp(`^task "${task}" declares concurrency 3 but this worker's database role may not apply it \\(42501: permission denied for function declare_limit\\); it runs on under the limits stored now: .*\`idemq limit set --task ${task} --concurrency 3\``),
      );
      expect(await stored(task)).toBeUndefined();
      const id = await makeJob(db.pool, { task });
      await waitFor(async () => (await stateOf(db.pool, id)) === "succeeded", { what: "the warned worker to run a job" });
    } finally {
      await db.pool.query(`GRANT EXECUTE ON FUNCTION idemq.declare_limit(text, int, int, interval) TO ${roles.worker}`);
    }
  });
});
