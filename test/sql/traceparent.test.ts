// The trace context a job carries (idemq.jobs.traceparent): enqueue and
// enqueue_many store a W3C traceparent and refuse any other shape with 22023
// and a HINT, the table's CHECK holds the same rule (_is_traceparent), claim
// hands the stored value to the worker, and a duplicate enqueue returns the
// existing job's context (job_traceparent) and stores nothing of its own.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { enqueueMany, jobRow, makeJob, unique } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { claim } from "../helpers/work.ts";

const A = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const B = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

const db = useTestDatabase();

describe("traceparent: stored and claimed", () => {
  it("enqueue stores it, returns it as job_traceparent, and claim returns it to the worker", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("tp");
      const { rows } = await c.query("SELECT * FROM idemq.enqueue(task => 't', queue => $1, traceparent => $2)", [queue, A]);
      expect(rows[0]).toMatchObject({ deduplicated: false, job_traceparent: A });
      expect((await jobRow(c, rows[0].job_id)).traceparent).toBe(A);
      const [job] = await claim(c, { queues: [queue] });
      expect(job).toMatchObject({ job_id: rows[0].job_id, traceparent: A, reclaimed: false });
    });
  });

  it("without one the column is NULL, and claim returns NULL", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("tp");
      const id = await makeJob(c, { queue });
      expect((await jobRow(c, id)).traceparent).toBeNull();
      expect((await claim(c, { queues: [queue] }))[0]).toMatchObject({ job_id: id, traceparent: null });
    });
  });

  it("a duplicate returns the existing job's context and keeps it: the first enqueue's trace stays on the job", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const first = await c.query("SELECT * FROM idemq.enqueue(task => 't', idempotency_key => $1, traceparent => $2)", [key, A]);
      const again = await c.query("SELECT * FROM idemq.enqueue(task => 't', idempotency_key => $1, traceparent => $2)", [key, B]);
      expect(again.rows[0]).toEqual({ job_id: first.rows[0].job_id, deduplicated: true, job_traceparent: A });
      expect((await jobRow(c, first.rows[0].job_id)).traceparent).toBe(A);
      // A job created without a context: its duplicates learn there is none.
      const bare = unique("k");
      await c.query("SELECT * FROM idemq.enqueue(task => 't', idempotency_key => $1)", [bare]);
      const dup = await c.query("SELECT * FROM idemq.enqueue(task => 't', idempotency_key => $1, traceparent => $2)", [bare, B]);
      expect(dup.rows[0]).toMatchObject({ deduplicated: true, job_traceparent: null });
    });
  });

  it("enqueue_many stores each element's own; a duplicate element stores nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const rows = await enqueueMany(c, [
        { task: "t", traceparent: A },
        { task: "t", idempotency_key: key, traceparent: B },
        { task: "t", idempotency_key: key, traceparent: A },
        { task: "t" },
      ]);
      expect(rows.map((r) => r.outcome)).toEqual(["created", "created", "deduplicated", "created"]);
      expect((await jobRow(c, rows[0]!.job_id!)).traceparent).toBe(A);
      expect((await jobRow(c, rows[1]!.job_id!)).traceparent).toBe(B);
      expect((await jobRow(c, rows[3]!.job_id!)).traceparent).toBeNull();
    });
  });
});

describe("traceparent: refused shapes", () => {
  const malformed: [string, string][] = [
    ["not a traceparent at all", "abc"],
    ["upper-case hex", A.toUpperCase()],
    ["another version", "01" + A.slice(2)],
    ["an all-zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"],
    ["an all-zero parent id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"],
    ["a trailing field", A + "-extra"],
    ["empty", ""],
  ];
  for (const [what, value] of malformed) {
    it(`enqueue refuses ${what} with 22023, a HINT, and writes nothing`, async () => {
      await inRollback(db.pool, async (c) => {
        const queue = unique("tp-bad");
        await underSavepoint(c, () =>
          expectSqlError(c.query("SELECT * FROM idemq.enqueue(task => 't', queue => $1, traceparent => $2)", [queue, value]), {
            code: "22023",
            message: /^traceparent must be a W3C traceparent/,
            hint: /00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.*nothing was enqueued/,
          }),
        );
        expect((await c.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1", [queue])).rows[0].n).toBe(0);
      });
    });
  }

  it("enqueue_many names the element: a malformed string, and a value that is not a string", async () => {
    await inRollback(db.pool, async (c) => {
      await underSavepoint(c, () =>
        expectSqlError(enqueueMany(c, [{ task: "t" }, { task: "t", traceparent: "00-zz" }]), {
          code: "22023",
          message: /^jobs\[2\] traceparent must be a W3C traceparent/,
          hint: /element 2/,
        }),
      );
      await underSavepoint(c, () =>
        expectSqlError(enqueueMany(c, [{ task: "t", traceparent: 5 }]), {
          code: "22023",
          message: /^jobs\[1\] traceparent must be a string/,
        }),
      );
    });
  });

  it("the table's CHECK jobs_traceparent_w3c holds the same rule for any write", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { traceparent: A });
      await underSavepoint(c, () =>
        expectSqlError(c.query("UPDATE idemq.jobs SET traceparent = 'abc' WHERE id = $1", [id]), {
          code: "23514",
          constraint: "jobs_traceparent_w3c",
        }),
      );
      await c.query("UPDATE idemq.jobs SET traceparent = NULL WHERE id = $1", [id]);
      expect((await jobRow(c, id)).traceparent).toBeNull();
    });
  });
});
