// One named test per transition of docs/state-machine.md ("<from> -> <to> by
// <function>"), each driving a job into <from> through the real functions,
// calling <function>, and reading the state back; plus a check that the
// document's table and this file list the same transitions.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { enqueueMany, makeJob, sql, stateOf, unique, type EnqueueArgs } from "../helpers/jobs.ts";
import { claimJob, expireLease, fail, jobIn } from "../helpers/work.ts";
import { documentedTransitions, transitionName, type Transition as DocTransition } from "../helpers/state-machine-doc.ts";

const db = useTestDatabase({ poolSize: 4 });

type C = pg.ClientBase;
/** A job in a queue of its own (so claimJob takes exactly it), from the job factory. */
async function enq(c: C, args: EnqueueArgs = {}): Promise<{ id: string }> {
  return { id: await makeJob(c, { task: "sm", queue: unique("sm"), ...args }) };
}

/** The error the fail transitions record. */
const SM_ERROR = { class: "SmError", message: "x" };

/** A job in processing: { id, attempt }. */
async function processing(c: C, args: EnqueueArgs = {}): Promise<{ id: string; attempt: number }> {
  const job = await enq(c, args);
  return { ...job, attempt: await claimJob(c, job.id) };
}

/** One element through idemq.enqueue_many, in a queue of its own; returns its job id. */
async function enqMany(c: C, element: Record<string, unknown>): Promise<string> {
  const rows = await enqueueMany(c, [{ task: "sm", queue: unique("sm"), ...element }]);
  expect(rows.map((r) => r.outcome)).toEqual(["created"]);
  return rows[0]!.job_id!;
}

/** complete_and_take_next of one attempt, as worker 'sm-worker' of every queue and task. */
async function takeNext(c: C, job: { id: string; attempt: number }): Promise<void> {
  await c.query(
    `SELECT * FROM idemq.complete_and_take_next(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int],
       lease_tokens => ARRAY[(SELECT lease_token FROM idemq.jobs WHERE id = $1)], worker_id => 'sm-worker')`,
    [job.id, job.attempt],
  );
}

async function completeMany(c: C, job: { id: string; attempt: number }): Promise<void> {
  const { rows } = await c.query(
    "SELECT * FROM idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[(SELECT lease_token FROM idemq.jobs WHERE id = $1)]) AS id",
    [job.id, job.attempt],
  );
  expect(rows.map((r) => r.id)).toEqual([job.id]);
}

/** A processing job that spawned one child (in a queue of its own); its attempt and lease token, and the child's id. */
async function spawned(c: C, child: Record<string, unknown> = {}): Promise<{ id: string; attempt: number; token: string; child: string }> {
  const job = await processing(c);
  const token = (await c.query("SELECT lease_token FROM idemq.jobs WHERE id = $1", [job.id])).rows[0].lease_token;
  const { rows } = await c.query("SELECT child_job_id FROM idemq.spawn(job_id => $1, attempt => $2, children => $3::jsonb, lease_token => $4)", [
    job.id,
    job.attempt,
    JSON.stringify([{ name: "a", task: "sm", queue: unique("sm"), ...child }]),
    token,
  ]);
  return { ...job, token, child: rows[0].child_job_id };
}

async function park(c: C, job: { id: string; attempt: number; token: string }): Promise<void> {
  const { rows } = await c.query("SELECT idemq.wait_for_children(job_id => $1, attempt => $2, lease_token => $3) AS parked", [job.id, job.attempt, job.token]);
  expect(rows).toEqual([{ parked: true }]);
}

/** enqueue_batch of one job with a callback: [callback id, job id]. */
async function batch(c: C): Promise<string[]> {
  const { rows } = await c.query("SELECT job_id FROM idemq.enqueue_batch(jobs => $1::jsonb, callback => $2::jsonb) ORDER BY ordinal", [
    JSON.stringify([{ task: "sm", queue: unique("sm") }]),
    JSON.stringify({ task: "sm", queue: unique("sm") }),
  ]);
  return rows.map((r) => r.job_id);
}

interface Transition extends DocTransition {
  /** Makes a job in `from` (checked), runs `by`, returns the job id whose state is then checked against `to`. */
  run: (c: C, expectFrom: (id: string) => Promise<void>) => Promise<string>;
}

const T: Transition[] = [
  {
    from: "(new)", to: "enqueued", by: "enqueue",
    run: async (c) => (await enq(c)).id,
  },
  {
    from: "(new)", to: "enqueued", by: "enqueue_many",
    run: async (c) => {
      const { rows } = await c.query("SELECT job_id FROM idemq.enqueue_many('[{\"task\": \"sm\", \"queue\": \"sm.many\"}]')");
      return rows[0].job_id;
    },
  },
  {
    from: "(new)", to: "scheduled", by: "enqueue",
    run: async (c) => (await enq(c, { run_at: sql("now() + interval '1 minute'") })).id,
  },
  {
    from: "(new)", to: "scheduled", by: "enqueue_many",
    run: async (c) => (await enqMany(c, { run_at: "2100-01-01T00:00:00Z" })),
  },
  {
    from: "(new)", to: "awaiting", by: "enqueue",
    run: async (c) => {
      const parent = await enq(c);
      return (await enq(c, { after: [parent.id] })).id;
    },
  },
  {
    from: "(new)", to: "awaiting", by: "enqueue_many",
    run: async (c) => {
      const parent = await enq(c);
      return enqMany(c, { after: [Number(parent.id)] });
    },
  },
  {
    from: "(new)", to: "cancelled", by: "enqueue",
    run: async (c) => {
      const parent = await jobIn(c, "failed");
      return (await enq(c, { after: [parent] })).id;
    },
  },
  {
    from: "(new)", to: "cancelled", by: "enqueue_many",
    run: async (c) => {
      const parent = await jobIn(c, "failed");
      return enqMany(c, { after: [Number(parent)] });
    },
  },
  {
    from: "scheduled", to: "processing", by: "claim",
    run: async (c, from) => {
      const job = await enq(c, { run_at: sql("now() + interval '1 minute'") });
      await from(job.id);
      await c.query("UPDATE idemq.jobs SET run_at = now() WHERE id = $1", [job.id]);
      await claimJob(c, job.id);
      return job.id;
    },
  },
  {
    from: "scheduled", to: "enqueued", by: "reschedule",
    run: async (c, from) => {
      const job = await enq(c, { run_at: sql("now() + interval '1 minute'") });
      await from(job.id);
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [job.id]);
      return job.id;
    },
  },
  {
    from: "scheduled", to: "expired", by: "rescue",
    run: async (c, from) => {
      const job = await enq(c, { run_at: sql("now() + interval '1 minute'"), expires_at: sql("now() + interval '1 second'") });
      await from(job.id);
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [job.id]);
      await c.query("SELECT idemq.rescue()");
      return job.id;
    },
  },
  {
    from: "scheduled", to: "cancelled", by: "cancel",
    run: async (c, from) => {
      const job = await enq(c, { run_at: sql("now() + interval '1 minute'") });
      await from(job.id);
      await c.query("SELECT idemq.cancel(job_id => $1)", [job.id]);
      return job.id;
    },
  },
  {
    from: "enqueued", to: "processing", by: "claim",
    run: async (c, from) => {
      const job = await enq(c);
      await from(job.id);
      await claimJob(c, job.id);
      return job.id;
    },
  },
  {
    from: "enqueued", to: "scheduled", by: "reschedule",
    run: async (c, from) => {
      const job = await enq(c);
      await from(job.id);
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now() + interval '1 hour')", [job.id]);
      return job.id;
    },
  },
  {
    from: "enqueued", to: "expired", by: "rescue",
    run: async (c, from) => {
      const job = await enq(c, { expires_at: sql("now() + interval '1 second'") });
      await from(job.id);
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [job.id]);
      await c.query("SELECT idemq.rescue()");
      return job.id;
    },
  },
  {
    from: "enqueued", to: "cancelled", by: "cancel",
    run: async (c, from) => {
      const job = await enq(c);
      await from(job.id);
      await c.query("SELECT idemq.cancel(job_id => $1)", [job.id]);
      return job.id;
    },
  },
  {
    from: "processing", to: "succeeded", by: "complete",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [job.id, job.attempt]);
      return job.id;
    },
  },
  {
    from: "processing", to: "succeeded", by: "complete_many",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await completeMany(c, job);
      return job.id;
    },
  },
  {
    from: "processing", to: "succeeded", by: "complete_and_take_next",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await takeNext(c, job);
      return job.id;
    },
  },
  {
    from: "awaiting", to: "processing", by: "complete_and_take_next",
    run: async (c, from) => {
      const queue = unique("sm-next");
      const key = unique("sm-key");
      const first = await makeJob(c, { task: "sm", queue, concurrency_key: key });
      const next = await makeJob(c, { task: "sm", queue, concurrency_key: key });
      await from(next);
      await takeNext(c, { id: first, attempt: await claimJob(c, first) });
      return next;
    },
  },
  {
    from: "processing", to: "scheduled", by: "fail",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await fail(c, job.id, job.attempt, SM_ERROR, { retryable: true });
      return job.id;
    },
  },
  {
    from: "processing", to: "scheduled", by: "snooze",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await c.query("SELECT idemq.snooze(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => now() + interval '1 minute')", [
        job.id,
        job.attempt,
      ]);
      return job.id;
    },
  },
  {
    from: "processing", to: "scheduled", by: "hold",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await c.query(
        "SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'queue', until => now() + interval '1 minute', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))",
        [job.id, job.attempt],
      );
      return job.id;
    },
  },
  {
    from: "enqueued", to: "scheduled", by: "hold",
    run: async (c, from) => {
      // Another job of the held concurrency key (K = 2: both admitted).
      const queue = unique("sm");
      const key = unique("smk");
      await c.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [queue]);
      const first = await makeJob(c, { task: "sm", queue, concurrency_key: key, priority: 1 });
      const other = await makeJob(c, { task: "sm", queue, concurrency_key: key });
      const attempt = await claimJob(c, first);
      await from(other);
      await c.query(
        "SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'key', until => now() + interval '1 minute', lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))",
        [first, attempt],
      );
      return other;
    },
  },
  {
    from: "processing", to: "failed", by: "fail",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await fail(c, job.id, job.attempt, SM_ERROR, { retryable: false });
      return job.id;
    },
  },
  {
    from: "processing", to: "failed", by: "rescue",
    run: async (c, from) => {
      const job = await processing(c, { max_attempts: 1 });
      await from(job.id);
      await expireLease(c, job.id);
      await c.query("SELECT idemq.rescue()");
      return job.id;
    },
  },
  {
    from: "processing", to: "enqueued", by: "rescue",
    run: async (c, from) => {
      const job = await processing(c, { max_attempts: 2 });
      await from(job.id);
      await expireLease(c, job.id);
      await c.query("SELECT idemq.rescue()");
      return job.id;
    },
  },
  {
    from: "processing", to: "expired", by: "rescue",
    run: async (c, from) => {
      const job = await processing(c, { max_attempts: 2, expires_at: sql("now() + interval '1 minute'") });
      await from(job.id);
      await expireLease(c, job.id);
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [job.id]);
      await c.query("SELECT idemq.rescue()");
      return job.id;
    },
  },
  {
    from: "processing", to: "cancelled", by: "cancel",
    run: async (c, from) => {
      const job = await processing(c);
      await from(job.id);
      await c.query("SELECT idemq.cancel(job_id => $1)", [job.id]);
      return job.id;
    },
  },
  // The parent completes through either function; the trigger releases the child.
  ...(["complete", "complete_many", "complete_and_take_next"] as const).flatMap((by) =>
    ([["enqueued", {}], ["scheduled", { run_at: sql("now() + interval '1 hour'") }]] as const).map(
      ([to, args]): Transition => ({
        from: "awaiting", to, by,
        run: async (c, from) => {
          const parent = await processing(c);
          const child = await enq(c, { ...args, after: [parent.id] });
          await from(child.id);
          if (by === "complete") await c.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [parent.id, parent.attempt]);
          else if (by === "complete_many") await completeMany(c, parent);
          else await takeNext(c, parent);
          return child.id;
        },
      }),
    ),
  ),
  {
    from: "processing", to: "awaiting", by: "wait_for_children",
    run: async (c, from) => {
      const parent = await spawned(c);
      await from(parent.id);
      await park(c, parent);
      return parent.id;
    },
  },
  {
    from: "(new)", to: "enqueued", by: "spawn",
    run: async (c) => (await spawned(c)).child,
  },
  {
    from: "(new)", to: "awaiting", by: "enqueue_batch",
    run: async (c) => (await batch(c))[0]!,
  },
  {
    from: "(new)", to: "enqueued", by: "enqueue_batch",
    run: async (c) => (await batch(c))[1]!,
  },
  // A parent parked by wait_for_children is released by its last child's finish, whatever the child's outcome.
  ...(["fail", "cancel", "rescue"] as const).map(
    (by): Transition => ({
      from: "awaiting", to: "enqueued", by,
      run: async (c, from) => {
        const parent = await spawned(c, by === "rescue" ? { expires_at: "2100-01-01T00:00:00Z" } : {});
        await park(c, parent);
        await from(parent.id);
        if (by === "fail") {
          const attempt = await claimJob(c, parent.child);
          await fail(c, parent.child, attempt, SM_ERROR, { retryable: false });
        } else if (by === "cancel") {
          await c.query("SELECT idemq.cancel(job_id => $1)", [parent.child]);
        } else {
          await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [parent.child]);
          await c.query("SELECT idemq.rescue()");
          expect(await stateOf(c, parent.child), "the child").toBe("expired");
        }
        return parent.id;
      },
    }),
  ),
  {
    from: "awaiting", to: "cancelled", by: "cancel",
    run: async (c, from) => {
      const parent = await enq(c);
      const child = await enq(c, { after: [parent.id] });
      await from(child.id);
      await c.query("SELECT idemq.cancel(job_id => $1)", [child.id]);
      return child.id;
    },
  },
  {
    from: "awaiting", to: "cancelled", by: "fail",
    run: async (c, from) => {
      const parent = await processing(c);
      const child = await enq(c, { after: [parent.id] });
      await from(child.id);
      await fail(c, parent.id, parent.attempt, SM_ERROR, { retryable: false });
      return child.id;
    },
  },
  {
    from: "awaiting", to: "cancelled", by: "rescue",
    run: async (c, from) => {
      const parent = await enq(c, { expires_at: sql("now() + interval '1 second'") });
      const child = await enq(c, { after: [parent.id] });
      await from(child.id);
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [parent.id]);
      await c.query("SELECT idemq.rescue()");
      expect(await stateOf(c, parent.id), "the parent").toBe("expired");
      return child.id;
    },
  },
  {
    from: "awaiting", to: "expired", by: "rescue",
    run: async (c, from) => {
      const parent = await enq(c);
      const child = await enq(c, { expires_at: sql("now() + interval '1 second'"), after: [parent.id] });
      await from(child.id);
      await c.query("UPDATE idemq.jobs SET expires_at = now() WHERE id = $1", [child.id]);
      await c.query("SELECT idemq.rescue()");
      return child.id;
    },
  },
  ...(["failed", "cancelled", "expired"] as const).map(
    (state): Transition => ({
      from: state, to: "enqueued", by: "retry",
      run: async (c, from) => {
        const id = await jobIn(c, state);
        await from(id);
        await c.query("SELECT idemq.retry(job_id => $1)", [id]);
        return id;
      },
    }),
  ),
  ...(["succeeded", "failed", "expired", "cancelled"] as const).map(
    (state): Transition => ({
      from: state, to: "(deleted)", by: "purge",
      run: async (c, from) => {
        const id = await jobIn(c, state);
        await from(id);
        await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '2 days' WHERE id = $1", [id]);
        const { rows } = await c.query("SELECT idemq.purge(older_than => '1 day', states => ARRAY[$1]::idemq.job_state[]) AS n", [
          state,
        ]);
        expect(rows[0].n).toBe(1);
        return id;
      },
    }),
  ),
  ...(["succeeded", "failed", "expired", "cancelled"] as const).map(
    (state): Transition => ({
      from: state, to: "(deleted)", by: "apply_retention",
      run: async (c, from) => {
        const id = await jobIn(c, state);
        await from(id);
        await c.query("UPDATE idemq.jobs SET finished_at = now() - interval '31 days' WHERE id = $1", [id]);
        const { rows } = await c.query("SELECT idemq.apply_retention() AS n");
        expect(rows[0].n).toBe(1);
        return id;
      },
    }),
  ),
  ...(["complete", "complete_many", "complete_and_take_next"] as const).map(
    (fn): Transition => ({
      from: "processing", to: "(deleted)", by: fn,
      run: async (c, from) => {
        await c.query("SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds')");
        const id = await jobIn(c, "processing");
        await from(id);
        const call =
          fn === "complete"
            ? "SELECT idemq.complete(job_id => j.id, attempt => j.attempt, lease_token => j.lease_token) FROM idemq.jobs j WHERE j.id = $1"
            : `SELECT idemq.${fn}(job_ids => ARRAY[j.id], attempts => ARRAY[j.attempt], lease_tokens => ARRAY[j.lease_token]${
                fn === "complete_and_take_next" ? ", worker_id => 'sm-worker'" : ""
              }) FROM idemq.jobs j WHERE j.id = $1`;
        await c.query(call, [id]);
        return id;
      },
    }),
  ),
];

const name = transitionName;

describe("transitions", () => {
  it.each(T.map((t) => [name(t), t] as const))("%s", async (_name, t) => {
    await inRollback(db.pool, async (c) => {
      let checkedFrom = t.from === "(new)";
      const id = await t.run(c, async (jobId) => {
        expect(await stateOf(c, jobId), "state before").toBe(t.from);
        checkedFrom = true;
      });
      expect(checkedFrom, "the test checked the state before").toBe(true);
      expect(await stateOf(c, id), "state after").toBe(t.to === "(deleted)" ? undefined : t.to);
    });
  });
});

describe("docs/state-machine.md", () => {
  it("its transition table lists exactly the transitions tested here", () => {
    const rows = documentedTransitions().map(name);
    expect(rows.length).toBeGreaterThan(0);
    expect([...rows].sort()).toEqual(T.map(name).sort());
  });

  it("every state of idemq.job_state appears in the table as a source or a target", async () => {
    const { rows } = await db.pool.query<{ s: string }>("SELECT unnest(enum_range(NULL::idemq.job_state))::text AS s");
    const covered = new Set(T.flatMap((t) => [t.from, t.to]));
    for (const { s } of rows) expect(covered.has(s), s).toBe(true);
  });
});
