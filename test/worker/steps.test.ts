// Durable steps through a real worker (docs/worker.md, "Durable steps"):
// replay returns recorded results without running fn; a transactional step's
// writes happen once across a retry; an external step calls its provider
// once; ctx.sleep ends the attempt without spending it or holding the slot;
// ctx.waitFor before and after the emit, and its timeout; misuse errors name
// the job and the step.
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, StepError, WaitTimeoutError, RESULT_BYTES, type JobContext } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 4 });
let client: Client;

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  await db.pool.query("CREATE TABLE public.step_writes (job_id bigint, note text)");
  // Which transaction wrote each effect outcome and step row (the test's own triggers; idemq has none of these).
  await db.pool.query(`
    CREATE TABLE public.step_tx (tbl text, job_id bigint, name text, tx bigint);
    CREATE FUNCTION public.note_tx() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO public.step_tx VALUES (TG_TABLE_NAME, NEW.job_id, to_jsonb(NEW)->>'name', txid_current());
      RETURN NULL;
    END $$;
    CREATE TRIGGER note_tx AFTER UPDATE ON idemq.effects FOR EACH ROW WHEN (NEW.status = 'done') EXECUTE FUNCTION public.note_tx();
    CREATE TRIGGER note_tx AFTER INSERT ON idemq.job_steps FOR EACH ROW EXECUTE FUNCTION public.note_tx();`);
});
afterEach(async () => {
  await stopWorkers();
});

async function finished(jobId: string) {
  return waitFor(
    async () => {
      const { rows } = await db.pool.query<{ state: string; result: unknown; attempt: number; uncounted: number; errors: { message: string }[] }>(
        "SELECT state, result, attempt, uncounted, errors FROM idemq.jobs WHERE id = $1",
        [jobId],
      );
      const row = rows[0];
      return row !== undefined && ["succeeded", "failed"].includes(row.state) ? row : undefined;
    },
    { what: `job ${jobId} to finish` },
  );
}

async function stateOf(jobId: string): Promise<string> {
  const { rows } = await db.pool.query<{ state: string }>("SELECT state FROM idemq.jobs WHERE id = $1", [jobId]);
  return rows[0]!.state;
}

describe("ctx.step", () => {
  it("a retry replays recorded steps without running fn: the transactional step's writes and the external call happen once", async () => {
    const queue = unique("replay");
    const calls = { write: 0, external: 0, after: 0 };
    const keys: string[] = [];
    await startTestWorker(
      db.url,
      {
        workflow: async (_p: unknown, ctx: JobContext) => {
          const written = await ctx.step("write", async (tx) => {
            calls.write++;
            await tx.query("INSERT INTO public.step_writes (job_id, note) VALUES ($1, 'once')", [ctx.job.id]);
            return { rows: 1 };
          });
          const charge = await ctx.step(
            "charge",
            (key) => {
              calls.external++;
              keys.push(key);
              return { chargeId: `ch_${calls.external}` };
            },
            { external: true },
          );
          calls.after++;
          if (ctx.job.attempt === 1) throw new Error("crash after two steps");
          return { written, charge };
        },
      },
      { queues: [queue] },
    );
    const { jobId } = await client.enqueue("workflow", {}, { queue, backoff: { kind: "fixed", delays: ["10ms"] } });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "succeeded", attempt: 2, result: { written: { rows: 1 }, charge: { chargeId: "ch_1" } } });
    expect(calls).toEqual({ write: 1, external: 1, after: 2 });
    expect(keys[0]).toMatch(new RegExp(`^idemq-job-${jobId}-step-[0-9a-f]{32}$`));
    // The external step's outcome and its ledger row were committed by one transaction (one WAL flush):
    // the writes' top-level transaction ids, as the test's triggers noted them (txid_current(), which a
    // savepoint does not change).
    const written = await db.pool.query<{ tbl: string; tx: string }>(
      "SELECT tbl, tx::text AS tx FROM public.step_tx WHERE tbl = 'effects' AND job_id = $1 OR tbl = 'job_steps' AND job_id = $1 AND name = 'charge' ORDER BY tbl",
      [jobId],
    );
    expect(written.rows.map((r) => r.tbl)).toEqual(["effects", "job_steps"]);
    expect(written.rows[0]!.tx).toBe(written.rows[1]!.tx);
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM public.step_writes WHERE job_id = $1", [jobId]);
    expect(rows[0].n).toBe(1);
    expect((await db.pool.query("SELECT name, kind, status, attempt FROM idemq.steps($1)", [jobId])).rows).toEqual([
      { name: "write", kind: "step", status: "done", attempt: 1 },
      { name: "charge", kind: "step", status: "done", attempt: 1 },
    ]);
  });

  it("an external step whose attempt lost its lease during the call still records the effect done: the next attempt does not call again", async () => {
    const queue = unique("lost-step");
    let calls = 0;
    await startTestWorker(
      db.url,
      {
        lost: async (_p: unknown, ctx: JobContext) => {
          const charge = await ctx.step(
            "charge",
            async () => {
              calls++;
              // The lease runs out and rescue hands the job on while the provider answers: step_record is fenced out (IQ410).
              await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [ctx.job.id]);
              await db.pool.query("SELECT idemq.rescue()");
              return { chargeId: `ch_${calls}` };
            },
            { external: true },
          );
          return { charge, attempt: ctx.job.attempt };
        },
      },
      // One slot: the next attempt cannot start (and claim the effect) before this one's handler is over.
      { queues: [queue], concurrency: 1 },
    );
    const { jobId } = await client.enqueue("lost", {}, { queue });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "succeeded", result: { charge: { chargeId: "ch_1" }, attempt: 2 } });
    expect(calls).toBe(1);
  });

  it("a transactional step whose fn throws rolls its writes back and records nothing; the retry runs it again", async () => {
    const queue = unique("rollback");
    let runs = 0;
    await startTestWorker(
      db.url,
      {
        flaky: async (_p: unknown, ctx: JobContext) =>
          ctx.step("write", async (tx) => {
            runs++;
            await tx.query("INSERT INTO public.step_writes (job_id, note) VALUES ($1, 'flaky')", [ctx.job.id]);
            if (runs === 1) throw new Error("fails after its write");
            return runs;
          }),
      },
      { queues: [queue] },
    );
    const { jobId } = await client.enqueue("flaky", {}, { queue, backoff: { kind: "fixed", delays: ["10ms"] } });
    expect(await finished(jobId)).toMatchObject({ state: "succeeded", result: 2 });
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM public.step_writes WHERE job_id = $1", [jobId]);
    expect(rows[0].n).toBe(1);
  });

  it("misuse fails the job at once with a StepError naming the job and the step", async () => {
    const queue = unique("misuse");
    const cases: Record<string, (ctx: JobContext) => Promise<unknown>> = {
      twice: async (ctx) => {
        await ctx.step("a", () => 1);
        await ctx.step("a", () => 2);
      },
      date: (ctx) => ctx.step("when", () => new Date()),
      nan: (ctx) => ctx.step("ratio", () => ({ r: Number.NaN })),
      big: (ctx) => ctx.step("blob", () => "x".repeat(RESULT_BYTES)),
    };
    await startTestWorker(db.url, Object.fromEntries(Object.entries(cases).map(([task, run]) => [task, (_p: unknown, ctx: JobContext) => run(ctx)])), {
      queues: [queue],
    });
    const expected: Record<string, RegExp> = {
      twice: /step "a": this step name is used twice in one run/,
      date: /step "when": the result is a Date, not a plain object/,
      nan: /step "ratio": the result\.r is NaN, which JSON cannot hold/,
      big: new RegExp(`step "blob": the result is ${RESULT_BYTES + 2} bytes of JSON, over the limit of ${RESULT_BYTES}`),
    };
    for (const task of Object.keys(cases)) {
      const { jobId } = await client.enqueue(task, {}, { queue });
      const job = await finished(jobId);
      expect(job.state, task).toBe("failed");
      expect(job.attempt, `${task}: permanent, not retried`).toBe(1);
      expect(job.errors[0]!.message).toMatch(`job ${jobId}, `);
      expect(job.errors[0]!.message).toMatch(expected[task]!);
    }
    expect(new StepError("1", "s", "x")).toBeInstanceOf(Error);
  });
});

describe("ctx.sleep", () => {
  it("ends the attempt without spending it and frees the slot: another job runs meanwhile; the replay passes the sleep once due", async () => {
    const queue = unique("sleep");
    const order: string[] = [];
    let before = 0;
    const w = await startTestWorker(
      db.url,
      {
        sleeper: async (_p: unknown, ctx: JobContext) => {
          await ctx.step("before", () => {
            before++;
            return null;
          });
          order.push(`sleeper attempt ${ctx.job.attempt}`);
          await ctx.sleep(1500);
          order.push("sleeper woke");
          return "rested";
        },
        other: () => {
          order.push("other");
        },
      },
      { queues: [queue], concurrency: 1 },
    );
    const { jobId } = await client.enqueue("sleeper", {}, { queue, maxAttempts: 1 });
    await waitFor(async () => (await stateOf(jobId)) === "scheduled", { what: "the sleeper to park" });
    // One slot: the other job can run only because the sleeping one holds none.
    const other = await client.enqueue("other", {}, { queue });
    expect((await finished(other.jobId)).state).toBe("succeeded");
    expect(await stateOf(jobId)).toBe("scheduled");
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "succeeded", result: "rested", attempt: 2, uncounted: 1 });
    expect(order).toEqual(["sleeper attempt 1", "other", "sleeper attempt 2", "sleeper woke"]);
    expect(before).toBe(1);
    expect(w.of("job:snoozed").map((e) => e.jobId)).toEqual([jobId]);
  });
});

describe("ctx.waitFor and client.emitEvent", () => {
  it("a job waiting for an event is parked (no slot held) and wakes with the payload when it is emitted, in the emitter's transaction", async () => {
    const queue = unique("wait");
    const event = unique("order.paid");
    await startTestWorker(
      db.url,
      { waiter: async (p: { order: string }, ctx: JobContext) => ctx.waitFor(event, { key: p.order, timeout: "1 hour" }) },
      { queues: [queue], concurrency: 1 },
    );
    const { jobId } = await client.enqueue("waiter", { order: "o-7" }, { queue });
    await waitFor(async () => (await stateOf(jobId)) === "scheduled", { what: "the waiter to park" });
    const tx = await db.pool.connect();
    try {
      await tx.query("BEGIN");
      expect(await client.emitEvent(event, { key: "o-7", payload: { amount: 42 }, client: tx })).toBe(1);
      await tx.query("ROLLBACK"); // not emitted after all
      expect(await stateOf(jobId)).toBe("scheduled");
      expect(await client.emitEvent(event, { key: "o-7", payload: { amount: 43 } })).toBe(1);
    } finally {
      tx.release();
    }
    expect(await finished(jobId)).toMatchObject({ state: "succeeded", result: { amount: 43 } });
  });

  it("an event emitted before the job reached its wait is not lost", async () => {
    const queue = unique("early");
    const event = unique("approved");
    const { jobId } = await client.enqueue("early", {}, { queue });
    await client.emitEvent(event, { payload: { by: "ops" } });
    await startTestWorker(db.url, { early: async (_p: unknown, ctx: JobContext) => ctx.waitFor(event, { timeout: "1 hour" }) }, { queues: [queue] });
    expect(await finished(jobId)).toMatchObject({ state: "succeeded", result: { by: "ops" }, attempt: 1 });
  });

  it("past its timeout the wait raises WaitTimeoutError; uncaught, the job fails at once, the timeout recorded", async () => {
    const queue = unique("timeout");
    const event = unique("never");
    let caught: unknown;
    await startTestWorker(
      db.url,
      {
        patient: async (_p: unknown, ctx: JobContext) => {
          try {
            return await ctx.waitFor(event, { key: "k", timeout: "1s" });
          } catch (error) {
            caught = error;
            throw error;
          }
        },
      },
      { queues: [queue] },
    );
    const { jobId } = await client.enqueue("patient", {}, { queue });
    const job = await finished(jobId);
    expect(job).toMatchObject({ state: "failed", attempt: 2, uncounted: 1 });
    expect(caught).toBeInstanceOf(WaitTimeoutError);
    expect(caught).toMatchObject({ jobId, step: "wait:1", event, key: "k" });
    expect(job.errors[0]!.message).toMatch(`job ${jobId}, step "wait:1": no event "${event}" with key "k" came before the wait's timeout`);
    expect((await db.pool.query("SELECT status FROM idemq.steps($1)", [jobId])).rows).toEqual([{ status: "timed_out" }]);
  });
  it("a replay whose wait asks for another event than the recorded one (the workflow changed while parked) fails at once with a StepError naming both", async () => {
    const queue = unique("changed");
    const before = unique("order.paid");
    const after = unique("order.settled");
    let version = 1;
    const attempts: number[] = [];
    await startTestWorker(
      db.url,
      {
        changed: async (_p: unknown, ctx: JobContext) => {
          attempts.push(ctx.job.attempt);
          return version === 1 ? ctx.waitFor(before, { key: "o-1", timeout: "1 hour" }) : ctx.waitFor(after, { timeout: "1 hour" });
        },
      },
      { queues: [queue] },
    );
    const { jobId } = await client.enqueue("changed", {}, { queue, maxAttempts: 5, backoff: { kind: "fixed", delays: ["10ms"] } });
    await waitFor(async () => (await stateOf(jobId)) === "scheduled", { what: "the waiter to park" });
    version = 2; // the new handler is deployed while the job is parked
    await db.pool.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [jobId]);
    const job = await finished(jobId);
    // Permanent: the attempt after the park fails the job; no retry meets the same record again.
    expect(job).toMatchObject({ state: "failed", attempt: 2, uncounted: 1 });
    expect(attempts).toEqual([1, 2]);
    expect(job.errors).toHaveLength(1);
    expect(job.errors[0]).toMatchObject({ class: "StepError" });
    expect(job.errors[0]!.message).toMatch(`job ${jobId}, step "wait:1": recorded as a wait for event "${before}" with key "o-1", but this run waits for event "${after}" without a key`);
    expect(job.errors[0]!.message).toMatch(/deploy the changed workflow as a new task name/);
    expect((await db.pool.query("SELECT status, event FROM idemq.steps($1)", [jobId])).rows).toEqual([{ status: "waiting", event: before }]);
  });
});
