// ctx.progress(n): a handler reporting in a hot loop costs one write a
// second at most (the latest value), fenced by the attempt; job() and
// `idemq jobs show` show it; a value that is not a percentage throws.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, stateOf, unique } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 4 });

beforeAll(async () => {
  // Every write of a job's progress, as the database saw it.
  await db.pool.query(`
    CREATE TABLE public.progress_writes (job_id bigint, value smallint, at timestamptz DEFAULT clock_timestamp());
    CREATE FUNCTION public.log_progress() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO public.progress_writes (job_id, value) VALUES (NEW.id, NEW.progress); RETURN NEW; END $$;
    CREATE TRIGGER log_progress AFTER UPDATE OF progress ON idemq.jobs FOR EACH ROW
      WHEN (NEW.progress IS DISTINCT FROM OLD.progress AND NEW.progress IS NOT NULL) EXECUTE FUNCTION public.log_progress();`);
});

afterEach(async () => {
  await stopWorkers();
});

afterAll(async () => {
  await db.drop();
});

async function progressColumn(id: string): Promise<number | null> {
  return (await db.pool.query("SELECT progress FROM idemq.jobs WHERE id = $1", [id])).rows[0]!.progress;
}

describe("ctx.progress", () => {
  it("a hot loop writes the latest value once, a later report at least a second after; job() and jobs show read it", async () => {
    const queue = unique("progress");
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let id = "";
    const w = await startTestWorker(
      db.url,
      {
        crunch: async (_payload, ctx) => {
          for (let i = 0; i <= 100; i++) ctx.progress(Math.floor(i / 2)); // 101 calls, no await between them
          await waitFor(async () => (await progressColumn(ctx.job.id)) === 50, { what: "the hot loop's latest value written" });
          ctx.progress(60);
          ctx.progress(70);
          await waitFor(async () => (await progressColumn(ctx.job.id)) === 70, { what: "the next report written", timeoutMs: 5000 });
          await released;
          return "done";
        },
      },
      { queues: [queue] },
    );
    id = await makeJob(db.pool, { task: "crunch", queue });
    await waitFor(async () => (await progressColumn(id)) === 70, { what: "progress 70" });
    // Shown while the job runs.
    const { rows: shown } = await db.pool.query("SELECT state::text, progress FROM idemq.job(job_id => $1)", [id]);
    expect(shown).toEqual([{ state: "processing", progress: 70 }]);
    const cli = await runCli(["jobs", "show", id, "--database-url", db.url]);
    expect(cli.stdout).toMatch(/^ {2}progress {3}70 %$/m);
    release();
    await waitFor(async () => (await stateOf(db.pool, id)) === "succeeded", { what: "the job to succeed" });

    const { rows: writes } = await db.pool.query<{ value: number; at: Date }>("SELECT value, at FROM public.progress_writes WHERE job_id = $1 ORDER BY at", [id]);
    // 103 reports, two writes: each the latest value when it was written.
    expect(writes.map((r) => r.value)).toEqual([50, 70]);
    expect(writes[1]!.at.getTime() - writes[0]!.at.getTime()).toBeGreaterThanOrEqual(950);
    // Kept after the attempt ended.
    expect(await progressColumn(id)).toBe(70);
    expect(w.of("worker:error")).toEqual([]);
  }, 30_000);

  it.each([101, -1, 2.5, Number.NaN])("ctx.progress(%s) throws a TypeError in the handler, which fails the attempt", async (value) => {
    const queue = unique("progress-bad");
    await startTestWorker(db.url, { bad: { maxAttempts: 1, run: async (_p, ctx) => ctx.progress(value) } }, { queues: [queue] });
    const id = await makeJob(db.pool, { task: "bad", queue, max_attempts: 1 });
    await waitFor(async () => (await stateOf(db.pool, id)) === "failed", { what: "the attempt to fail" });
    const { rows } = await db.pool.query("SELECT errors->-1->>'class' AS class, errors->-1->>'message' AS message, progress FROM idemq.jobs WHERE id = $1", [id]);
    expect(rows[0]).toMatchObject({ class: "TypeError", progress: null });
    expect(rows[0].message).toMatch(/ctx\.progress: value must be an integer percentage from 0 to 100/);
  }, 30_000);
});
