// Durable steps in SQL (docs/design.md, "Durable steps"): step_record and
// steps (the ledger, fenced like complete), sleep (parks without spending an
// attempt), await_event and emit (matching, parking, waking, timeouts), the
// ledger's deletion with its job and the events' retention.
import { describe, expect, it } from "vitest";
import { STEP_KINDS, RESULT_BYTES, STEP_STATUSES } from "../../src/contract.ts";
import { backendPid, expectSqlError, inRollback, useTestDatabase, waitUntilBlocked } from "../helpers/db.ts";
import { jobRow, makeJob, unique } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { makeDue, type ClaimedJob } from "../helpers/work.ts";
import type pg from "pg";

const db = useTestDatabase();

type Db = pg.ClientBase | pg.Pool;

/** A job in its own queue, claimed with a lease token. */
async function heldJob(c: Db, args: Record<string, unknown> = {}): Promise<ClaimedJob> {
  const id = await makeJob(c, { queue: unique("steps"), ...args });
  const { queue } = await jobRow(c, id);
  const { rows } = await c.query<ClaimedJob & { id: string }>(
    "SELECT * FROM idemq.claim('w1', queues => ARRAY[$1], batch_size => 1, token => true)",
    [queue],
  );
  expect(rows.map((r) => r.job_id)).toEqual([id]);
  return rows[0]!;
}

async function reclaim(c: Db, job: ClaimedJob): Promise<ClaimedJob> {
  await makeDue(c, job.job_id);
  const { rows } = await c.query<ClaimedJob>(
    "SELECT * FROM idemq.claim('w1', queues => ARRAY[$1], batch_size => 1, token => true)",
    [job.queue],
  );
  expect(rows.map((r) => r.job_id)).toEqual([job.job_id]);
  return rows[0]!;
}

const record = (c: Db, j: ClaimedJob, name: string, result: unknown) =>
  c.query("SELECT idemq.step_record($1, $2, $3, $4::jsonb, $5)", [j.job_id, j.attempt, name, JSON.stringify(result), j.lease_token]);

async function steps(c: Db, id: string) {
  const { rows } = await c.query<{ name: string; kind: string; status: string; result: unknown; attempt: number; over: boolean; event_key: string | null }>(
    "SELECT * FROM idemq.steps($1)",
    [id],
  );
  return rows;
}

async function sleep(c: Db, j: ClaimedJob, name: string, wakeAt: string) {
  const { rows } = await c.query<{ parked: boolean; run_at: Date }>(
    `SELECT * FROM idemq.sleep($1, $2, $3, ${wakeAt}, $4)`,
    [j.job_id, j.attempt, name, j.lease_token],
  );
  return rows[0]!;
}

async function awaitEvent(c: Db, j: ClaimedJob, name: string, event: string, key: string | null, timeout = "1 hour") {
  const { rows } = await c.query<{ status: string; payload: unknown }>(
    "SELECT * FROM idemq.await_event($1, $2, $3, $4, $5, $6::interval, $7)",
    [j.job_id, j.attempt, name, event, key, timeout, j.lease_token],
  );
  return rows[0]!;
}

async function emit(c: Db, event: string, key: string | null, payload: unknown = {}): Promise<number> {
  const { rows } = await c.query<{ n: number }>("SELECT idemq.emit($1, $2, $3::jsonb) AS n", [event, key, JSON.stringify(payload)]);
  return rows[0]!.n;
}

describe("step_record and steps", () => {
  it("records a held job's step with its result; steps() reads it back, over, with the attempt that recorded it", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c);
      await record(c, j, "charge", { chargeId: "ch_1" });
      await c.query("SELECT idemq.step_record($1, $2, 'nothing', lease_token => $3)", [j.job_id, j.attempt, j.lease_token]);
      expect(await steps(c, j.job_id)).toMatchObject([
        { name: "charge", kind: "step", status: "done", result: { chargeId: "ch_1" }, attempt: 1, over: true },
        { name: "nothing", kind: "step", status: "done", result: null, over: true },
      ]);
      expect(await steps(c, "999999999")).toEqual([]);
    });
  });

  it("a name is recorded once: 23505 naming the job and the step", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c);
      await record(c, j, "charge", 1);
      await underSavepoint(c, () =>
        expectSqlError(record(c, j, "charge", 2), { code: "23505", detail: { job_id: Number(j.job_id), name: "charge" }, message: `job ${j.job_id}` }),
      );
      expect((await steps(c, j.job_id)).map((s) => s.result)).toEqual([1]);
    });
  });

  it("is fenced: an earlier attempt, a wrong token or a job not held records nothing (IQ410)", async () => {
    await inRollback(db.pool, async (c) => {
      const first = await heldJob(c);
      await c.query("SELECT idemq.snooze($1, $2, now(), $3)", [first.job_id, first.attempt, first.lease_token]);
      const second = await reclaim(c, first);
      await underSavepoint(c, () => expectSqlError(record(c, first, "a", 1), { code: "IQ410", detail: { job_id: Number(first.job_id), attempt: 1 } }));
      await underSavepoint(c, () =>
        expectSqlError(record(c, { ...second, lease_token: first.lease_token }, "a", 1), { code: "IQ410" }),
      );
      await c.query("SELECT idemq.complete($1, $2, lease_token => $3)", [second.job_id, second.attempt, second.lease_token]);
      await underSavepoint(c, () => expectSqlError(record(c, second, "a", 1), { code: "IQ410", detail: { current_state: "succeeded" } }));
      expect(await steps(c, first.job_id)).toEqual([]);
    });
  });

  it("the result limit is RESULT_BYTES of JSON text: at the limit kept, one byte over refused, naming job and step", async () => {
    await inRollback(db.pool, async (c) => {
      expect((await c.query("SELECT idemq._result_limit() AS n")).rows[0].n).toBe(RESULT_BYTES);
      const j = await heldJob(c);
      const atLimit = "x".repeat(RESULT_BYTES - 2); // the JSON string's two quotes
      await record(c, j, "big", atLimit);
      await underSavepoint(c, () =>
        expectSqlError(record(c, j, "too-big", atLimit + "x"), {
          code: "22023",
          message: `job ${j.job_id}, step "too-big": the result is ${RESULT_BYTES + 1} bytes`,
        }),
      );
    });
  });

  it("the ledger's kinds and statuses are src/contract.ts's", async () => {
    const { rows } = await db.pool.query<{ def: string }>(
      "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conname IN ('job_steps_kind_known', 'job_steps_status_of_kind') ORDER BY conname",
    );
    const quoted = (def: string) => [...def.matchAll(/'([a-z_]+)'::text/g)].map((m) => m[1]);
    expect(quoted(rows[0]!.def)).toEqual([...STEP_KINDS]);
    expect(new Set(quoted(rows[1]!.def))).toEqual(new Set([...STEP_KINDS, ...STEP_STATUSES]));
  });

  it("is deleted with its job (the foreign key: purge, retention, delete)", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c);
      await record(c, j, "a", 1);
      await c.query("SELECT idemq.complete($1, $2, lease_token => $3)", [j.job_id, j.attempt, j.lease_token]);
      await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '400 days' WHERE id = $1", [j.job_id]);
      await c.query("SELECT idemq.purge(older_than => interval '1 day')");
      expect(await jobRow(c, j.job_id).catch(() => undefined)).toBeUndefined();
      expect((await c.query("SELECT count(*)::int AS n FROM idemq.job_steps WHERE job_id = $1", [j.job_id])).rows[0].n).toBe(0);
    });
  });
});

describe("sleep", () => {
  it("parks the job until the wake time without spending an attempt; a replay keeps the recorded time and passes it once due", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c, { max_attempts: 1 });
      const first = await sleep(c, j, "sleep:1", "now() + interval '1 hour'");
      expect(first.parked).toBe(true);
      expect(await jobRow(c, j.job_id)).toMatchObject({ state: "scheduled", attempt: 1, locked_by: null, errors: [] });
      const { rows } = await c.query("SELECT run_at = now() + interval '1 hour' AS at, uncounted FROM idemq.jobs WHERE id = $1", [j.job_id]);
      expect(rows[0]).toEqual({ at: true, uncounted: 1 });
      expect(await steps(c, j.job_id)).toMatchObject([{ name: "sleep:1", kind: "sleep", status: "sleeping", over: false }]);

      // Claimed early (run now): the sleep parks the job again at the recorded time, not a new one.
      const early = await reclaim(c, j);
      const again = await sleep(c, early, "sleep:1", "now() + interval '5 hours'");
      expect(again).toEqual({ parked: true, run_at: first.run_at });

      // The time has come: over, the job stays held.
      await c.query("UPDATE idemq.job_steps SET wake_at = now() - interval '1 second' WHERE job_id = $1", [j.job_id]);
      const due = await reclaim(c, early);
      expect((await sleep(c, due, "sleep:1", "now() + interval '1 hour'")).parked).toBe(false);
      expect((await jobRow(c, j.job_id)).state).toBe("processing");
      expect((await steps(c, j.job_id))[0]!.over).toBe(true);
      // max_attempts 1, three claims: the sleeps spent none of it.
      await c.query("SELECT idemq.complete($1, $2, lease_token => $3)", [due.job_id, due.attempt, due.lease_token]);
      expect(await jobRow(c, j.job_id)).toMatchObject({ state: "succeeded", attempt: 3 });
    });
  });

  it("a name recorded as another kind of step: 22023 naming the job, the step and the fix", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c);
      await record(c, j, "sleep:1", 1);
      await underSavepoint(c, () =>
        expectSqlError(sleep(c, j, "sleep:1", "now()"), { code: "22023", message: `job ${j.job_id} recorded step "sleep:1" as a step`, hint: /Changing a workflow/ }),
      );
    });
  });

  it("is fenced like complete", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c);
      await underSavepoint(c, () => expectSqlError(sleep(c, { ...j, attempt: 2 }, "s", "now()"), { code: "IQ410" }));
      expect(await steps(c, j.job_id)).toEqual([]);
    });
  });
});

describe("await_event and emit", () => {
  it("a wait before the emit parks the job; emit records the payload and makes it runnable; the replay gets the payload", async () => {
    await inRollback(db.pool, async (c) => {
      const event = unique("order.paid");
      const j = await heldJob(c, { max_attempts: 1 });
      expect(await awaitEvent(c, j, "wait:1", event, "o-1")).toEqual({ status: "waiting", payload: null });
      const parked = await c.query("SELECT state, run_at = now() + interval '1 hour' AS at_timeout, uncounted FROM idemq.jobs WHERE id = $1", [j.job_id]);
      expect(parked.rows[0]).toEqual({ state: "scheduled", at_timeout: true, uncounted: 1 });

      expect(await emit(c, event, "o-2", { other: true })).toBe(0); // another key
      expect(await emit(c, event, null)).toBe(0); // no key is not any key
      expect(await emit(c, event, "o-1", { amount: 42 })).toBe(1);
      const woken = await c.query("SELECT state, run_at <= now() AS due FROM idemq.jobs WHERE id = $1", [j.job_id]);
      expect(woken.rows[0]).toEqual({ state: "scheduled", due: true });
      expect(await steps(c, j.job_id)).toMatchObject([{ name: "wait:1", kind: "wait", status: "received", result: { amount: 42 }, over: true }]);

      const replay = await reclaim(c, j);
      expect(await awaitEvent(c, replay, "wait:1", event, "o-1")).toEqual({ status: "received", payload: { amount: 42 } });
      expect((await jobRow(c, j.job_id)).state).toBe("processing");
    });
  });

  it("an event emitted before the job reached its wait is not lost; one emitted before the job was created is not taken", async () => {
    await inRollback(db.pool, async (c) => {
      const event = unique("approved");
      await emit(c, event, "k", { n: 0 });
      // Emitted before the job existed (emitted_at before created_at).
      await c.query("UPDATE idemq.events SET emitted_at = now() - interval '1 minute' WHERE event = $1", [event]);
      const j = await heldJob(c);
      await emit(c, event, "k", { n: 1 });
      await emit(c, event, "k", { n: 2 });
      // The first event since the job was created, then the next for a second wait on the same pair.
      expect(await awaitEvent(c, j, "wait:1", event, "k")).toEqual({ status: "received", payload: { n: 1 } });
      expect(await awaitEvent(c, j, "wait:2", event, "k")).toEqual({ status: "received", payload: { n: 2 } });
      expect((await awaitEvent(c, j, "wait:3", event, "k")).status).toBe("waiting");
    });
  });

  it("times out at the deadline recorded by the first call; a later emit does not undo it", async () => {
    await inRollback(db.pool, async (c) => {
      const event = unique("never");
      const j = await heldJob(c);
      expect((await awaitEvent(c, j, "wait:1", event, null, "10 minutes")).status).toBe("waiting");
      await c.query("UPDATE idemq.job_steps SET wake_at = now() - interval '1 second' WHERE job_id = $1", [j.job_id]);
      const late = await reclaim(c, j);
      expect(await awaitEvent(c, late, "wait:1", event, null, "10 minutes")).toEqual({ status: "timed_out", payload: null });
      expect(await emit(c, event, null)).toBe(0);
      expect(await awaitEvent(c, late, "wait:1", event, null)).toEqual({ status: "timed_out", payload: null });
      expect((await jobRow(c, j.job_id)).state).toBe("processing");
    });
  });

  it("a replay waiting on another event under the same name: 22023 naming both", async () => {
    await inRollback(db.pool, async (c) => {
      const j = await heldJob(c);
      await awaitEvent(c, j, "wait:1", "a", null);
      const again = await reclaim(c, j);
      await underSavepoint(c, () =>
        expectSqlError(awaitEvent(c, again, "wait:1", "b", null), { code: "22023", message: /recorded step "wait:1" as a wait for \(a, NULL\), not a wait for \(b, NULL\)/ }),
      );
    });
  });

  it("emit rolls back with its transaction: no event, no wake-up", async () => {
    await inRollback(db.pool, async (c) => {
      const event = unique("rolled-back");
      const j = await heldJob(c);
      await awaitEvent(c, j, "wait:1", event, null);
      await c.query("SAVEPOINT e");
      expect(await emit(c, event, null)).toBe(1);
      await c.query("ROLLBACK TO SAVEPOINT e");
      expect(await steps(c, j.job_id)).toMatchObject([{ status: "waiting" }]);
      expect((await c.query("SELECT count(*)::int AS n FROM idemq.events WHERE event = $1", [event])).rows[0].n).toBe(0);
    });
  });

  it("a wait and an emit on one pair at once: the wait blocks on the emit's lock and, once it commits, takes its event; another pair is not held up", async () => {
    const event = unique("race");
    const emitter = await db.newClient();
    const waiter = await db.newClient();
    const other = await db.newClient();
    const held = await heldJob(waiter);
    const waiterPid = await backendPid(waiter);
    const bystander = await heldJob(other);
    await emitter.query("BEGIN");
    await emit(emitter, event, "k", { first: true });
    const waiting = awaitEvent(waiter, held, "wait:1", event, "k");
    expect(await waitUntilBlocked(other, waiterPid)).toEqual([await backendPid(emitter)]);
    expect((await awaitEvent(other, bystander, "wait:1", unique("other"), "k")).status).toBe("waiting");
    await emitter.query("COMMIT");
    expect(await waiting).toEqual({ status: "received", payload: { first: true } });
  });
});

describe("events' retention", () => {
  it("apply_retention deletes events older than event_retention_seconds and keeps the rest", async () => {
    await inRollback(db.pool, async (c) => {
      const event = unique("old");
      await emit(c, event, "a");
      await emit(c, event, "b");
      await c.query(
        "UPDATE idemq.events SET emitted_at = now() - make_interval(secs => (SELECT value FROM idemq.settings WHERE name = 'event_retention_seconds') + 1) WHERE event = $1 AND key = 'a'",
        [event],
      );
      await c.query("SELECT idemq.apply_retention()");
      expect((await c.query("SELECT key FROM idemq.events WHERE event = $1", [event])).rows).toEqual([{ key: "b" }]);
    });
  });
});
