// Operator functions on the job zoo: cancel, retry, reschedule. Every case
// asserts the function's answer, the changed row, and that no other zoo row
// (job, key or dependency) moved.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, interleave, useTestDatabase } from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import {
  ACTIVE_ZOO,
  TERMINAL_ZOO,
  buildZoo,
  expectOnlyChanged,
  snapshot,
  type Zoo,
  type ZooName,
} from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 4 });


/** Runs `work` on a fresh zoo in a transaction that rolls back. */
function withZoo(work: (c: pg.PoolClient, zoo: Zoo) => Promise<void>): Promise<void> {
  return inRollback(db.pool, async (c) => work(c, await buildZoo(c)));
}

async function call(c: pg.ClientBase, fn: "cancel" | "retry", id: string): Promise<string> {
  const { rows } = await c.query<{ state: string }>(`SELECT idemq.${fn}(job_id => $1)::text AS state`, [id]);
  return rows[0]!.state;
}

async function reschedule(c: pg.ClientBase, id: string, runAt: string): Promise<string> {
  const { rows } = await c.query<{ state: string }>(
    `SELECT idemq.reschedule(job_id => $1, run_at => ${runAt})::text AS state`,
    [id],
  );
  return rows[0]!.state;
}

interface Facts {
  state: string;
  attempt: number;
  uncounted: number;
  max_attempts: number;
  locked_by: string | null;
  lease_expires_at: Date | null;
  finished_now: boolean | null;
  run_at_now: boolean;
  expires_at: Date | null;
  errors: number;
}

async function facts(c: pg.ClientBase, id: string): Promise<Facts> {
  const { rows } = await c.query<Facts>(
    `SELECT j.state::text AS state, j.attempt, j.uncounted, j.max_attempts, j.locked_by, j.lease_expires_at,
            j.finished_at = now() AS finished_now, j.run_at = now() AS run_at_now, j.expires_at,
            jsonb_array_length(j.errors) AS errors
       FROM idemq.jobs j WHERE j.id = $1`,
    [id],
  );
  return rows[0]!;
}

async function keyState(c: pg.ClientBase, key: string): Promise<{ job_id: string; finished_state: string | null } | undefined> {
  const { rows } = await c.query("SELECT job_id, finished_state::text AS finished_state FROM idemq.keys WHERE key = $1", [key]);
  return rows[0];
}

const PROCESSING_ZOO: readonly ZooName[] = ["processing", "leaseExpired", "lastAttempt"];

describe("cancel", () => {
  const simple = ACTIVE_ZOO.filter((n) => n !== "parent");

  it.each(simple)("cancel of the %s job -> cancelled; only its row and key change", async (name) => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      expect(await call(c, "cancel", zoo[name].id)).toBe("cancelled");
      expect(await facts(c, zoo[name].id)).toMatchObject({
        state: "cancelled",
        finished_now: true,
        locked_by: null,
        lease_expires_at: null,
        attempt: zoo[name].attempt,
      });
      expect(await keyState(c, zoo[name].key)).toEqual({ job_id: zoo[name].id, finished_state: "cancelled" });
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [name], keys: [name] });
    });
  });

  it("cancel of a parent (scheduled) -> cancelled, and its awaiting child is cancelled with a ParentNotSucceeded error", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      expect(await call(c, "cancel", zoo.parent.id)).toBe("cancelled");
      expect(await facts(c, zoo.parent.id)).toMatchObject({ state: "cancelled", finished_now: true });
      expect(await facts(c, zoo.awaiting.id)).toMatchObject({ state: "cancelled", finished_now: true, errors: 1 });
      const { rows } = await c.query("SELECT errors->0->>'class' AS class FROM idemq.jobs WHERE id = $1", [zoo.awaiting.id]);
      expect(rows[0].class).toBe("ParentNotSucceeded");
      expectOnlyChanged(before, await snapshot(c, zoo), {
        jobs: ["parent", "awaiting"],
        keys: ["parent", "awaiting"],
        dependenciesRemoved: [`${zoo.parent.id}->${zoo.awaiting.id}`],
      });
    });
  });

  it.each(PROCESSING_ZOO)(
    "after cancel of the %s job its worker is fenced out: complete/fail/snooze raise IQ410, heartbeat returns nothing",
    async (name) => {
      await withZoo(async (c, zoo) => {
        const { id, attempt } = zoo[name];
        await call(c, "cancel", id);
        const { rows: last } = await c.query(
          "SELECT errors->-1->>'class' AS class, (errors->-1->>'attempt')::int AS attempt FROM idemq.jobs WHERE id = $1",
          [id],
        );
        expect(last[0]).toEqual({ class: "Cancelled", attempt });
        const before = await snapshot(c, zoo);
        const detail = { job_id: Number(id), attempt, current_state: "cancelled" };
        await expectSqlError(
          underSavepoint(c, () => c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id, attempt])),
          { code: "IQ410", detail },
        );
        await expectSqlError(
          underSavepoint(c, () => c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '"late"')`, [id, attempt])),
          {
            code: "IQ410",
            detail,
          },
        );
        await expectSqlError(
          underSavepoint(c, () => c.query("SELECT idemq.snooze(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => now())", [id, attempt])),
          {
            code: "IQ410",
            detail,
          },
        );
        const beat = await c.query("SELECT * FROM idemq.heartbeat(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[(SELECT lease_token FROM idemq.jobs WHERE id = $1)])", [
          id,
          attempt,
        ]);
        expect(beat.rows).toEqual([]);
        expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
      });
    },
  );

  it.each(TERMINAL_ZOO)("cancel of the %s job -> IQ412 with DETAIL {job_id, state}; nothing changes", async (name) => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      await expectSqlError(underSavepoint(c, () => c.query("SELECT idemq.cancel(job_id => $1)", [zoo[name].id])), {
        code: "IQ412",
        detail: { job_id: Number(zoo[name].id), state: name },
        hint: /scheduled, enqueued, processing or awaiting/,
      });
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
    });
  });

  it("cancel of an unknown job -> IQ404; of NULL -> 22004; nothing changes", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.cancel(job_id => $1)", ["987654321"])),
        { code: "IQ404", hint: /id/ },
      );
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.cancel(job_id => NULL)", [])),
        { code: "22004" },
      );
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
    });
  });

  it("cancel waits for a worker completing the job, then raises IQ412 (state succeeded)", async () => {
    const { rows } = await db.pool.query<{ job_id: string }>(
      "SELECT job_id FROM idemq.enqueue(task => 'race', queue => 'race.cancel')",
    );
    const id = rows[0]!.job_id;
    const [worker, operator] = await Promise.all([db.newClient(), db.newClient()]);
    const claimed = await worker.query<{ attempt: number }>(
      "SELECT attempt FROM idemq.claim(worker_id => 'w', queues => ARRAY['race.cancel'])",
    );
    const run = await interleave(db.pool, {
      first: worker,
      holds: (c) =>
        c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [
          id,
          claimed.rows[0]!.attempt,
        ]),
      second: operator,
      blocks: (c) =>
        expectSqlError(c.query("SELECT idemq.cancel(job_id => $1)", [id]), {
          code: "IQ412",
          detail: { job_id: Number(id), state: "succeeded" },
        }),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    await run.second;
  });
});

describe("retry", () => {
  const retryable: ZooName[] = ["failed", "cancelled", "expired"];

  it.each(retryable)(
    "retry of the %s job -> enqueued now, attempts fresh (attempt kept, uncounted = attempt), errors kept and the retry recorded; only its row and key change",
    async (name) => {
      await withZoo(async (c, zoo) => {
        const before = await snapshot(c, zoo);
        const old = await facts(c, zoo[name].id);
        const { rows: ended } = await c.query<{ finished_at: Date }>("SELECT finished_at FROM idemq.jobs WHERE id = $1", [zoo[name].id]);
        expect(await call(c, "retry", zoo[name].id)).toBe("enqueued");
        expect(await facts(c, zoo[name].id)).toEqual({
          ...old,
          state: "enqueued",
          finished_now: null,
          run_at_now: true,
          uncounted: old.attempt,
          expires_at: null,
          errors: old.errors + 1,
        });
        const { rows: last } = await c.query(
          "SELECT (errors->-1) - 'retried_at' AS entry, (errors->-1->>'retried_at')::timestamptz = now() AS retried_now FROM idemq.jobs WHERE id = $1",
          [zoo[name].id],
        );
        expect(last[0]).toEqual({
          entry: {
            attempt: old.attempt,
            class: "Retried",
            message: `retried by an operator after the job was ${name}`,
            previous_state: name,
            finished_at: expect.any(String),
          },
          retried_now: true,
        });
        expect(new Date(last[0].entry.finished_at).getTime()).toBe(ended[0]!.finished_at.getTime());
        expect(await keyState(c, zoo[name].key)).toEqual({ job_id: zoo[name].id, finished_state: null });
        expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [name], keys: [name] });
      });
    },
  );

  it("a retried failed job gets max_attempts fresh attempts: attempt grows to 2, and failing it again exhausts it (1 of 1)", async () => {
    await withZoo(async (c, zoo) => {
      const { id } = zoo.failed;
      await call(c, "retry", id);
      const { rows } = await c.query<{ attempt: number }>(
        "SELECT attempt FROM idemq.claim(worker_id => 'w2', queues => ARRAY[$1::text])",
        [zoo.failed.queue],
      );
      expect(rows).toEqual([{ attempt: 2 }]);
      expect(await facts(c, id)).toMatchObject({ attempt: 2, uncounted: 1, max_attempts: 1, state: "processing" });
      const failed = await c.query(
        `SELECT f.state::text AS s FROM idemq.fail(job_id => $1, attempt => 2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "Again", "message": "again"}') f`,
        [id],
      );
      expect(failed.rows[0].s).toBe("failed");
      // The first failure, the retry, the second failure.
      expect(await facts(c, id)).toMatchObject({ errors: 3 });
    });
  });

  it("an old attempt's complete fails with IQ410 after retry, before and after the new claim; the new attempt completes", async () => {
    await withZoo(async (c, zoo) => {
      const { id } = zoo.failed;
      await call(c, "retry", id);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.complete(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id])),
        {
          code: "IQ410",
          detail: { job_id: Number(id), attempt: 1, current_state: "enqueued" },
        },
      );
      await c.query("SELECT * FROM idemq.claim(worker_id => 'w2', queues => ARRAY[$1::text])", [zoo.failed.queue]);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.complete(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id])),
        {
          code: "IQ410",
          detail: { job_id: Number(id), attempt: 1, current_state: "processing" },
        },
      );
      await c.query("SELECT idemq.complete(job_id => $1, attempt => 2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id]);
      expect((await facts(c, id)).state).toBe("succeeded");
    });
  });

  it("a cancelled processing job retried: the cancelled attempt stays fenced out", async () => {
    await withZoo(async (c, zoo) => {
      const { id, attempt } = zoo.processing;
      await call(c, "cancel", id);
      await call(c, "retry", id);
      const claimed = await c.query<{ attempt: number }>(
        "SELECT attempt FROM idemq.claim(worker_id => 'w2', queues => ARRAY[$1::text])",
        [zoo.processing.queue],
      );
      expect(claimed.rows).toEqual([{ attempt: attempt + 1 }]);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id, attempt])),
        {
          code: "IQ410",
          detail: { job_id: Number(id), attempt, current_state: "processing" },
        },
      );
    });
  });

  it("a retried expired job has no expires_at and can be claimed", async () => {
    await withZoo(async (c, zoo) => {
      await call(c, "retry", zoo.expired.id);
      expect((await facts(c, zoo.expired.id)).expires_at).toBeNull();
      const { rows } = await c.query("SELECT job_id AS id FROM idemq.claim(worker_id => 'w2', queues => ARRAY[$1::text])", [
        zoo.expired.queue,
      ]);
      expect(rows.map((r) => r.id)).toEqual([zoo.expired.id]);
    });
  });

  it("a retried cancelled job keeps a future expires_at", async () => {
    await inRollback(db.pool, async (c) => {
      const { rows } = await c.query<{ job_id: string }>(
        "SELECT job_id FROM idemq.enqueue(task => 't', expires_at => now() + interval '1 hour')",
      );
      const id = rows[0]!.job_id;
      await call(c, "cancel", id);
      await call(c, "retry", id);
      const r = await c.query("SELECT expires_at = now() + interval '1 hour' AS kept FROM idemq.jobs WHERE id = $1", [id]);
      expect(r.rows[0].kept).toBe(true);
    });
  });

  it.each(["succeeded", ...ACTIVE_ZOO] as ZooName[])(
    "retry of the %s job -> IQ412 with DETAIL {job_id, state}; nothing changes",
    async (name) => {
      await withZoo(async (c, zoo) => {
        const before = await snapshot(c, zoo);
        await expectSqlError(underSavepoint(c, () => c.query("SELECT idemq.retry(job_id => $1)", [zoo[name].id])), {
          code: "IQ412",
          detail: { job_id: Number(zoo[name].id), state: zoo[name].state },
          hint: name === "succeeded" ? /enqueue new work/ : /has not finished/,
        });
        expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
      });
    },
  );

  it("retry of a keyed failed job whose key is now held by another active job -> IQ409; nothing changes", async () => {
    await withZoo(async (c, zoo) => {
      // allow_after_failed: a new job takes the key of the failed one.
      const { rows } = await c.query<{ job_id: string }>(
        `SELECT job_id FROM idemq.enqueue(task => 'zoo_task', payload => '{"zoo": "failed"}', queue => 'zoo.failed-again',
           idempotency_key => 'zoo:failed')`,
      );
      const holder = rows[0]!.job_id;
      expect(holder).not.toBe(zoo.failed.id);
      const before = await snapshot(c, zoo);
      await expectSqlError(underSavepoint(c, () => c.query("SELECT idemq.retry(job_id => $1)", [zoo.failed.id])), {
        code: "IQ409",
        detail: { key: "zoo:failed", existing_job_id: Number(holder), existing_state: "enqueued", policy: null },
        hint: /cancel it first/,
      });
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
      expect(await keyState(c, "zoo:failed")).toEqual({ job_id: holder, finished_state: null });
    });
  });

  it("retry of a keyed failed job whose key's later job finished too: the key comes back to it", async () => {
    await withZoo(async (c, zoo) => {
      const { rows } = await c.query<{ job_id: string }>(
        `SELECT job_id FROM idemq.enqueue(task => 'zoo_task', payload => '{"zoo": "failed"}', queue => 'zoo.failed-again',
           idempotency_key => 'zoo:failed')`,
      );
      await call(c, "cancel", rows[0]!.job_id);
      expect(await call(c, "retry", zoo.failed.id)).toBe("enqueued");
      expect(await keyState(c, "zoo:failed")).toEqual({ job_id: zoo.failed.id, finished_state: null });
      // The key deduplicates to the retried job again.
      const again = await c.query(
        `SELECT job_id, deduplicated FROM idemq.enqueue(task => 'zoo_task', payload => '{"zoo": "failed"}', idempotency_key => 'zoo:failed')`,
      );
      expect(again.rows).toEqual([{ job_id: zoo.failed.id, deduplicated: true }]);
    });
  });

  it("retry of an unknown job -> IQ404; of NULL -> 22004", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.retry(job_id => $1)", ["987654321"])),
        { code: "IQ404" },
      );
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.retry(job_id => NULL)", [])),
        { code: "22004" },
      );
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
    });
  });
});

describe("reschedule", () => {
  async function runAtIs(c: pg.ClientBase, id: string, expr: string): Promise<boolean> {
    const { rows } = await c.query(`SELECT run_at = ${expr} AS same FROM idemq.jobs WHERE id = $1`, [id]);
    return rows[0].same;
  }

  it.each(["scheduled", "enqueued"] as ZooName[])(
    "reschedule of the %s job to the future -> scheduled at that time; only its row changes (key untouched)",
    async (name) => {
      await withZoo(async (c, zoo) => {
        const before = await snapshot(c, zoo);
        expect(await reschedule(c, zoo[name].id, "now() + interval '2 hours'")).toBe("scheduled");
        expect((await facts(c, zoo[name].id)).state).toBe("scheduled");
        expect(await runAtIs(c, zoo[name].id, "now() + interval '2 hours'")).toBe(true);
        expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [name] });
      });
    },
  );

  it.each(["scheduled", "enqueued"] as ZooName[])(
    "reschedule of the %s job to the past -> enqueued; only its row changes",
    async (name) => {
      await withZoo(async (c, zoo) => {
        const before = await snapshot(c, zoo);
        expect(await reschedule(c, zoo[name].id, "now() - interval '1 minute'")).toBe("enqueued");
        expect(await runAtIs(c, zoo[name].id, "now() - interval '1 minute'")).toBe(true);
        expect((await facts(c, zoo[name].id)).state).toBe("enqueued");
        const changedJobs: ZooName[] = name === "enqueued" ? ["enqueued"] : ["scheduled"];
        expectOnlyChanged(before, await snapshot(c, zoo), { jobs: changedJobs });
      });
    },
  );

  it("boundary: run_at = now() -> enqueued; now() + 1 microsecond -> scheduled", async () => {
    await withZoo(async (c, zoo) => {
      expect(await reschedule(c, zoo.scheduled.id, "now()")).toBe("enqueued");
      expect(await reschedule(c, zoo.scheduled.id, "now() + interval '1 microsecond'")).toBe("scheduled");
      expect(await reschedule(c, zoo.scheduled.id, "now()")).toBe("enqueued");
    });
  });

  it("reschedule of the awaiting job keeps it awaiting with the new run_at; it becomes scheduled when its parent succeeds", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      expect(await reschedule(c, zoo.awaiting.id, "now() + interval '3 hours'")).toBe("awaiting");
      expect((await facts(c, zoo.awaiting.id)).state).toBe("awaiting");
      expect(await runAtIs(c, zoo.awaiting.id, "now() + interval '3 hours'")).toBe(true);
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: ["awaiting"] });

      // Let the parent run now and succeed.
      expect(await reschedule(c, zoo.parent.id, "now()")).toBe("enqueued");
      const { rows } = await c.query<{ attempt: number }>(
        "SELECT attempt FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1::text])",
        [zoo.parent.queue],
      );
      await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [zoo.parent.id, rows[0]!.attempt]);
      expect((await facts(c, zoo.awaiting.id)).state).toBe("scheduled");
    });
  });

  it.each([...PROCESSING_ZOO, ...TERMINAL_ZOO])(
    "reschedule of the %s job -> IQ412 with DETAIL {job_id, state}; nothing changes",
    async (name) => {
      await withZoo(async (c, zoo) => {
        const before = await snapshot(c, zoo);
        await expectSqlError(
          underSavepoint(c, () => c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [zoo[name].id])),
          {
            code: "IQ412",
            detail: { job_id: Number(zoo[name].id), state: zoo[name].state },
            hint: zoo[name].state === "processing" ? /cancel it/ : /retry/,
          },
        );
        expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
      });
    },
  );

  it("reschedule with NULL run_at -> 22004; an unknown job -> IQ404; nothing changes", async () => {
    await withZoo(async (c, zoo) => {
      const before = await snapshot(c, zoo);
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.reschedule(job_id => $1, run_at => NULL)", [zoo.scheduled.id])),
        {
          code: "22004",
          hint: /run/,
        },
      );
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", ["987654321"])),
        { code: "IQ404" },
      );
      expectOnlyChanged(before, await snapshot(c, zoo), { jobs: [] });
    });
  });
});
