// Limits (docs/design.md, "Limits"): each one is a row of idemq.settings read
// through idemq._limit, and each is tested at its boundary: just inside
// passes, just outside raises 22023 with a HINT, and a refused call writes
// nothing. Bytes are counted in UTF-8, so the boundaries are also crossed with
// a two-byte character.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, inRollback, interleave, type PgError, useTestDatabase } from "../helpers/db.ts";
import { jobRow, makeJob, type Queryable, unique } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { claimJob, claimOne, fail, makeDue } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

const TABLES = ["jobs", "keys", "processed", "effects", "counters", "job_dependencies", "settings"];

/** Every idemq table's rows as JSON text: "nothing written" compares them whole. */
async function contents(c: pg.ClientBase): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const t of TABLES) {
    const { rows } = await c.query<{ rows: string | null }>(`SELECT (SELECT jsonb_agg(to_jsonb(x) ORDER BY to_jsonb(x)::text) FROM idemq.${t} x)::text AS rows`);
    out[t] = rows[0]!.rows ?? "[]";
  }
  return out;
}

/** Runs `statement`, which must raise 22023 with a HINT, and checks it wrote nothing. */
async function refused(c: pg.ClientBase, statement: string, values: unknown[] = [], message?: RegExp): Promise<PgError> {
  const before = await contents(c);
  const error = await expectSqlError(
    underSavepoint(c, () => c.query(statement, values)),
    { code: "22023", ...(message === undefined ? {} : { message }) },
  );
  expect(error.hint ?? "", `HINT of: ${error.message}`).not.toBe("");
  expect(await contents(c)).toEqual(before);
  return error;
}

async function limit(c: pg.ClientBase, name: string): Promise<number> {
  const { rows } = await c.query<{ v: string }>("SELECT idemq._limit($1) AS v", [name]);
  return Number(rows[0]!.v);
}

describe("idemq.settings and _limit", () => {
  it("holds each limit once, with its default, inside its range", async () => {
    const { rows } = await db.pool.query<{ name: string; value: string; min_value: string; max_value: string }>(
      "SELECT name, value, min_value, max_value FROM idemq.settings ORDER BY name",
    );
    expect(Object.fromEntries(rows.map((r) => [r.name, Number(r.value)]))).toEqual({
      duration_days: 36500,
      error_history: 20,
      error_message_chars: 4096,
      error_stack_chars: 16384,
      event_retention_seconds: 604800,
      jobs_per_call: 50000,
      key_bytes: 512,
      parents_per_job: 1000,
      payload_bytes: 1048576,
      retention_cancelled_seconds: 2592000,
      retention_expired_seconds: 2592000,
      retention_failed_seconds: 2592000,
      retention_succeeded_seconds: 604800,
      stopped_worker_seconds: 3600,
      task_bytes: 256,
      worker_id_bytes: 256,
      worker_names: 10000,
      worker_retention_seconds: 86400,
    });
    // key_bytes cannot be raised to where a btree entry fails (about 2,700 bytes).
    expect(rows.find((r) => r.name === "key_bytes")!.max_value).toBe("2000");
  });

  it("an admin's UPDATE changes a limit; a value outside its range is refused by the CHECK", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("UPDATE idemq.settings SET value = 8 WHERE name = 'key_bytes'");
      expect(await c.query("SELECT idemq.guard(key => '12345678') AS ok")).toMatchObject({ rows: [{ ok: true }] });
      await refused(c, "SELECT idemq.guard(key => '123456789')");
      await expectSqlError(
        underSavepoint(c, () => c.query("UPDATE idemq.settings SET value = 2001 WHERE name = 'key_bytes'")),
        { code: "23514", constraint: "settings_value_in_range" },
      );
    });
  });

  it("an unknown limit raises 42704 instead of letting a check pass", async () => {
    await expectSqlError(db.pool.query("SELECT idemq._limit('no_such_limit')"), { code: "42704", message: /no_such_limit/ });
  });
});

describe("key_bytes: guard and effect keys and owners", () => {
  const at = (bytes: number) => "k".repeat(bytes);
  // 'é' is two bytes: 256 of them are 512 bytes, one more 'k' is 513.
  const wide = "é".repeat(256);

  it("guard: a key of key_bytes bytes passes, one byte more is 22023 (not btree's 54000); nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "key_bytes");
      expect(max).toBe(512);
      for (const key of [at(max), wide]) {
        expect((await c.query("SELECT idemq.guard(key => $1) AS ok", [key])).rows[0].ok).toBe(true);
      }
      for (const key of [at(max + 1), `${wide}k`, at(3000)]) {
        await refused(c, "SELECT idemq.guard(key => $1, task => 't')", [key], /key is \d+ bytes, over the limit of 512 bytes/);
      }
    });
  });

  it("effect_claim, effect_done, effect_release: key and owner at the limit pass, one byte over is 22023; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "key_bytes");
      const key = at(max);
      const owner = "o".repeat(max);
      expect((await c.query("SELECT status FROM idemq.effect_claim(key => $1, owner => $2)", [key, owner])).rows).toEqual([
        { status: "claimed" },
      ]);
      await c.query("SELECT idemq.effect_done(key => $1, owner => $2, result => '{}')", [key, owner]);
      const k2 = `${"é".repeat(255)}kk`; // 512 bytes
      await c.query("SELECT * FROM idemq.effect_claim(key => $1, owner => 'o')", [k2]);
      await c.query("SELECT idemq.effect_release(key => $1, owner => 'o')", [k2]);

      const over = at(max + 1);
      await refused(c, "SELECT * FROM idemq.effect_claim(key => $1, owner => 'o')", [over], /effect_claim: key is 513 bytes/);
      await refused(c, "SELECT * FROM idemq.effect_claim(key => 'k', owner => $1)", [`${owner}o`], /effect_claim: owner is 513 bytes/);
      await refused(c, "SELECT idemq.effect_done(key => $1, owner => 'o', result => '{}')", [over], /effect_done: key/);
      await refused(c, "SELECT idemq.effect_done(key => $1, owner => $2, result => '{}')", [key, `${owner}o`], /effect_done: owner/);
      await refused(c, "SELECT idemq.effect_release(key => $1, owner => 'o')", [`${wide}k`], /effect_release: key/);
      await refused(c, "SELECT idemq.effect_release(key => 'k', owner => $1)", [`${owner}o`], /effect_release: owner/);
    });
  });

  it("a refused key is quoted by a short excerpt only", async () => {
    await inRollback(db.pool, async (c) => {
      const error = await refused(c, "SELECT idemq.guard(key => $1)", ["x".repeat(100_000)]);
      expect(error.message.length).toBeLessThan(250);
      expect(error.message).toContain("(100000 characters)");
    });
  });
});

// enqueue() and enqueue_many() check the same rules (_job_problem, the limits
// read once per call by _enqueue_limits): each limit is crossed by both, an
// enqueue_many element after a good one (so the message names jobs[2]).
describe("enqueue limits: enqueue and every enqueue_many element refuse alike", () => {
  /** enqueue(task => $1, <args>) with `values` after $1. */
  const one = (args: string) => `SELECT * FROM idemq.enqueue(task => $1${args})`;
  const many = "SELECT * FROM idemq.enqueue_many($1::jsonb)";
  const batch = (...jobs: unknown[]) => JSON.stringify([{ task: "t" }, ...jobs]);

  async function createdBoth(c: pg.ClientBase, args: string, values: unknown[], element: Record<string, unknown>): Promise<void> {
    const { rows } = await c.query(one(args), values);
    expect(rows).toHaveLength(1);
    const { rows: made } = await c.query<{ outcome: string }>(many, [batch(element)]);
    expect(made.map((r) => r.outcome)).toEqual(["created", "created"]);
  }

  async function refusedBoth(c: pg.ClientBase, args: string, values: unknown[], element: Record<string, unknown>, message: RegExp): Promise<PgError[]> {
    const single = await refused(c, one(args), values, message);
    const bulk = await refused(c, many, [batch(element)], new RegExp(`^jobs\\[2\\] ${message.source}`));
    expect(bulk.hint).toMatch(/element 2 .*nothing was enqueued/);
    expect(single.hint).toMatch(/nothing was enqueued/);
    return [single, bulk];
  }

  it("task_bytes: a task name of task_bytes bytes is enqueued, one byte more is 22023 (also in two-byte characters); nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "task_bytes");
      expect(max).toBe(256);
      for (const task of ["t".repeat(max), "é".repeat(max / 2)]) {
        await createdBoth(c, "", [task], { task });
      }
      for (const task of ["t".repeat(max + 1), `${"é".repeat(max / 2)}t`]) {
        const [single] = await refusedBoth(c, "", [task], { task }, /task is 257 bytes, over the limit of 256 bytes \(task_bytes\)/);
        expect(single!.hint).toMatch(/task_bytes/);
      }
    });
  });

  it("payload_bytes: a payload of payload_bytes bytes of JSON text is enqueued, one byte more is 22023, quoted by an excerpt; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "payload_bytes");
      expect(max).toBe(1048576);
      // {"s": "..."} is 9 bytes around the string, as jsonb prints it.
      const payload = (bytes: number) => ({ s: "x".repeat(bytes - 9) });
      expect(JSON.stringify(payload(max)).length).toBe(max - 1); // JSON.stringify leaves out the space
      await createdBoth(c, ", payload => $2", ["t", payload(max)], { task: "t", payload: payload(max) });
      // Counted in bytes: 'é' is two.
      const wide = { s: `${"é".repeat((max - 10) / 2)}x` };
      await createdBoth(c, ", payload => $2", ["t", wide], { task: "t", payload: wide });
      const over = payload(max + 1);
      const errors = await refusedBoth(c, ", payload => $2", ["t", over], { task: "t", payload: over },
        /payload is 1048577 bytes of JSON text, over the limit of 1048576 bytes \(payload_bytes\)/);
      for (const e of errors) {
        expect(e.message.length).toBeLessThan(250);
        expect(e.hint).toMatch(/payload_bytes/);
      }
    });
  });

  // A payload stored in more than 16 x payload_bytes + 8 bytes is refused by its
  // stored size, before anything prints or decodes it (_job_rule_broken's rule
  // 4); the error is the one its measured text gives. payload_bytes 1000 here:
  // the bound is 16,008 bytes.
  describe("payload_bytes by the stored size", () => {
    /** An object of `n` keys, each with a string of 90 bytes: about 100 bytes of text, and of jsonb, per key. */
    const objectOf = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, "x".repeat(90)]));

    it("over the bound: the same 22023, message and HINT as when the text is measured, from enqueue and from an enqueue_many element", async () => {
      await inRollback(db.pool, async (c) => {
        await c.query("UPDATE idemq.settings SET value = 1000 WHERE name = 'payload_bytes'");
        const big = objectOf(1000);
        const { rows } = await c.query<{ stored: number; text: number }>(
          "SELECT pg_column_size($1::jsonb) AS stored, octet_length($1::jsonb::text) AS text",
          [JSON.stringify(big)],
        );
        expect(rows[0]!.stored).toBeGreaterThan(16 * 1000 + 8);
        const [single] = await refusedBoth(c, ", payload => $2", ["t", big], { task: "t", payload: big },
          new RegExp(`payload is ${rows[0]!.text} bytes of JSON text, over the limit of 1000 bytes \\(payload_bytes\\): \\{"k0": "x{40}`));
        expect(single!.hint).toBe(
          "Store large data elsewhere (a table, object storage) and put its id in the payload; an admin can raise payload_bytes in idemq.settings. " +
            "Fix the argument; nothing was enqueued.",
        );
      });
    });

    it("the bound never refuses a payload that fits: the densest binary forms (zeros, nested empty arrays) of at most payload_bytes bytes of text are enqueued", async () => {
      await inRollback(db.pool, async (c) => {
        await c.query("UPDATE idemq.settings SET value = 1000 WHERE name = 'payload_bytes'");
        const zeros = { z: Array.from({ length: 330 }, () => 0) }; // "0, " each: 998 bytes of text
        const nested = { a: JSON.parse(`${"[".repeat(495)}${"]".repeat(495)}`) };
        for (const payload of [zeros, nested]) {
          const { rows } = await c.query<{ stored: number; text: number }>(
            "SELECT pg_column_size($1::jsonb) AS stored, octet_length($1::jsonb::text) AS text",
            [JSON.stringify(payload)],
          );
          expect(rows[0]!.text).toBeLessThanOrEqual(1000);
          expect(rows[0]!.stored, "stored larger than the text: what the bound must allow").toBeGreaterThan(rows[0]!.text * 3);
          await createdBoth(c, ", payload => $2", ["t", payload], { task: "t", payload });
        }
      });
    });

    it("enqueue_many keeps the order of problems: an earlier element's, the element's own shape and task problems, come first; its rules after payload_bytes and later elements' come after", async () => {
      await inRollback(db.pool, async (c) => {
        await c.query("UPDATE idemq.settings SET value = 1000 WHERE name = 'payload_bytes'");
        const big = objectOf(1000);
        const refusedMany = (jobs: unknown[], message: RegExp) => refused(c, many, [JSON.stringify(jobs)], message);
        await refusedMany([{ task: "" }, { task: "t", payload: big }], /^jobs\[1\] task must be a non-empty string/);
        await refusedMany([{ task: "t", payload: big, colour: "red" }], /^jobs\[1\] has an unknown field "colour"/);
        await refusedMany([{ task: "", payload: big }], /^jobs\[1\] task must be a non-empty string/);
        await refusedMany([{ task: "t".repeat(300), payload: big }], /^jobs\[1\] task is 300 bytes/);
        await refusedMany([{ task: "t", payload: big, queue: "" }], /^jobs\[1\] payload is \d+ bytes of JSON text, over the limit of 1000/);
        await refusedMany([{ task: "t", payload: big }, { task: "" }], /^jobs\[1\] payload is \d+ bytes/);
        // A later element that does not decode (a timestamp): the earlier oversized one still comes first.
        await refusedMany([{ task: "t" }, { task: "t", payload: big }, { task: "t", run_at: "not a time" }], /^jobs\[2\] payload is \d+ bytes/);
        await refusedMany([{ task: "t" }, { task: "t", payload: big }, { task: "t", payload: objectOf(2000) }], /^jobs\[2\] payload is \d+ bytes/);
        // Not an object: that rule comes first, as before.
        await refusedMany([{ task: "t", payload: Array.from({ length: 3000 }, () => "xxxxx") }], /^jobs\[1\] payload must be a JSON object, not \["xxxxx"/);
      });
    });

    it("enqueue_many never decodes an element whose payload its stored size refuses: refused with 22023 under a temp_file_limit the decoding would break", async () => {
      await inRollback(db.pool, async (c) => {
        await c.query("UPDATE idemq.settings SET value = 1000 WHERE name = 'payload_bytes'");
        // Decoding copies each element into tuplestores, spilled to temporary files past work_mem.
        await c.query("SET LOCAL work_mem = '64kB'");
        await c.query("SET LOCAL temp_file_limit = '256kB'");
        const jobs = JSON.stringify([{ task: "t" }, { task: "t", payload: objectOf(10_000) }]); // about 1 MB
        await refused(c, many, [jobs], /^jobs\[2\] payload is \d+ bytes of JSON text, over the limit of 1000 bytes/);
        // The same element decoded (its payload under the bound) spills and breaks the limit: what the refusal above avoids.
        await c.query("UPDATE idemq.settings SET value = 1000000 WHERE name = 'payload_bytes'");
        await expectSqlError(underSavepoint(c, () => c.query(many, [jobs])), { code: "53400" });
      });
    });
  });

  it("key_bytes: an idempotency key of key_bytes bytes is enqueued, one byte more is 22023 (not btree's 54000); nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "key_bytes");
      const keys = ["k".repeat(max), `${"é".repeat(max / 2 - 1)}kk`];
      for (const key of keys) {
        const { rows } = await c.query(one(", idempotency_key => $2"), ["t", key]);
        expect(rows).toMatchObject([{ deduplicated: false }]);
        const { rows: made } = await c.query<{ outcome: string }>(many, [batch({ task: "t", idempotency_key: `${key.slice(1)}z` })]);
        expect(made.map((r) => r.outcome)).toEqual(["created", "created"]);
      }
      for (const key of ["k".repeat(max + 1), `${"é".repeat(max / 2)}k`]) {
        await refusedBoth(c, ", idempotency_key => $2", ["t", key], { task: "t", idempotency_key: key },
          /idempotency_key is 513 bytes, over the limit of 512 bytes \(key_bytes\)/);
      }
      const [single] = await refusedBoth(c, ", idempotency_key => $2", ["t", "k".repeat(3000)], { task: "t", idempotency_key: "k".repeat(3000) },
        /idempotency_key is 3000 bytes/);
      expect(single!.message).toContain("(3000 characters)");
      expect(single!.message.length).toBeLessThan(250);
      expect(single!.hint).toMatch(/hash a long business key/);
    });
  });

  it("parents_per_job: a job after parents_per_job parents waits for them all; one parent more is 22023; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "parents_per_job");
      expect(max).toBe(1000);
      const { rows } = await c.query<{ job_id: string }>(
        "SELECT job_id::text FROM idemq.enqueue_many((SELECT jsonb_agg(jsonb_build_object('task', 'parent')) FROM generate_series(1, $1)))",
        [max],
      );
      const parents = rows.map((r) => r.job_id);
      const { rows: child } = await c.query<{ job_id: string }>(one(", after => $2::bigint[]"), ["t", parents]);
      expect((await jobRow(c, child[0]!.job_id)).state).toBe("awaiting");
      const { rows: made } = await c.query<{ job_id: string; outcome: string }>(many, [
        batch({ task: "t", after: parents.map(Number) }),
      ]);
      expect(made.map((r) => r.outcome)).toEqual(["created", "created"]);
      expect((await jobRow(c, made[1]!.job_id)).state).toBe("awaiting");
      expect(Number((await c.query("SELECT count(*) AS n FROM idemq.job_dependencies WHERE child_id = $1", [made[1]!.job_id])).rows[0].n)).toBe(max);

      const more = [...parents, parents[0]!];
      await refusedBoth(c, ", after => $2::bigint[]", ["t", more], { task: "t", after: more.map(Number) },
        /after names 1001 parents, over the limit of 1000 \(parents_per_job\)/);
    });
  });

  it("jobs_per_call: enqueue_many takes jobs_per_call jobs in one call (the bench's 20,000 among them), one more is 22023; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "jobs_per_call");
      expect(max).toBe(50000);
      const jobs = (n: number) => JSON.stringify(Array.from({ length: n }, (_, i) => ({ task: "bulk", payload: { i } })));
      // Refused first: "nothing written" compares every table, cheaper before 50,000 jobs exist.
      const error = await refused(c, many, [jobs(max + 1)], /^jobs has 50001 elements, over the limit of 50000 jobs per call \(jobs_per_call\)$/);
      expect(error.hint).toMatch(/Split the batch into calls of at most 50000 jobs/);
      const { rows } = await c.query<{ n: string }>(`SELECT count(*) AS n FROM idemq.enqueue_many($1::jsonb)`, [jobs(max)]);
      expect(Number(rows[0]!.n)).toBe(max);
      // Lowered by an admin, the limit applies to the next statement.
      await c.query("UPDATE idemq.settings SET value = 2 WHERE name = 'jobs_per_call'");
      expect((await c.query(many, [jobs(2)])).rows).toHaveLength(2);
      await expectSqlError(underSavepoint(c, () => c.query(many, [jobs(3)])), { code: "22023", message: /^jobs has 3 elements, over the limit of 2/ });
    });
  });

  it("run_at: a far finite time is enqueued; infinity and -infinity are 22023; nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      for (const far of ["294000-01-01T00:00:00Z", "4713-01-01 00:00:00Z BC"]) {
        await createdBoth(c, ", run_at => $2::timestamptz", ["t", far], { task: "t", run_at: far });
      }
      for (const bad of ["infinity", "-infinity"]) {
        const [single] = await refusedBoth(c, ", run_at => $2::timestamptz", ["t", bad], { task: "t", run_at: bad },
          new RegExp(`run_at must be a finite time, not ${bad}`));
        expect(single!.hint).toMatch(/Pass a real time/);
      }
    });
  });

  it("the limits are read from idemq.settings: an admin's lower value applies to both functions", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("UPDATE idemq.settings SET value = 4 WHERE name IN ('task_bytes', 'key_bytes', 'parents_per_job')");
      await c.query("UPDATE idemq.settings SET value = 20 WHERE name = 'payload_bytes'");
      await createdBoth(c, "", ["tttt"], { task: "tttt" });
      await refusedBoth(c, "", ["ttttt"], { task: "ttttt" }, /task is 5 bytes, over the limit of 4 bytes/);
      await createdBoth(c, ", payload => $2", ["t", { a: "x".repeat(11) }], { task: "t", payload: { a: "x".repeat(11) } });
      await refusedBoth(c, ", payload => $2", ["t", { a: "x".repeat(12) }], { task: "t", payload: { a: "x".repeat(12) } },
        /payload is 21 bytes of JSON text, over the limit of 20 bytes/);
      await refusedBoth(c, ", idempotency_key => $2", ["t", "kkkkk"], { task: "t", idempotency_key: "kkkkk" }, /idempotency_key is 5 bytes/);
      await refusedBoth(c, ", after => $2::bigint[]", ["t", [1, 2, 3, 4, 5]], { task: "t", after: [1, 2, 3, 4, 5] }, /after names 5 parents/);
    });
  });

  it("a limit row cannot go missing: deleting one raises 42704 and enqueue and enqueue_many still check the limit, never a silent pass", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("UPDATE idemq.settings SET value = 4 WHERE name = 'task_bytes'");
      await expectSqlError(underSavepoint(c, () => c.query("DELETE FROM idemq.settings WHERE name = 'task_bytes'")), {
        code: "42704",
        message: /task_bytes/,
      });
      await refusedBoth(c, "", ["ttttt"], { task: "ttttt" }, /task is 5 bytes, over the limit of 4 bytes/);
    });
  });

  describe("idemq.enqueue_limits: the row enqueues read, kept from idemq.settings (0023)", () => {
  const FIELDS = ["payload_bytes", "key_bytes", "task_bytes", "parents_per_job", "jobs_per_call", "duration_days"];

  /** The kept row, and the settings rows of its fields, as name -> value. */
  async function keptAndSettings(c: Queryable): Promise<{ kept: Array<Record<string, string>>; settings: Record<string, string> }> {
    const kept = await c.query<Record<string, string>>("SELECT * FROM idemq.enqueue_limits");
    const settings = await c.query<{ name: string; value: string }>("SELECT name, value FROM idemq.settings WHERE name = ANY ($1)", [FIELDS]);
    return { kept: kept.rows, settings: Object.fromEntries(settings.rows.map((r) => [r.name, r.value])) };
  }

  it("holds exactly one row, whose fields are the settings rows of their names: after install, after an UPDATE of one, of all, and of none", async () => {
    await inRollback(db.pool, async (c) => {
      const installed = await keptAndSettings(c);
      expect(Object.keys(installed.settings).sort()).toEqual([...FIELDS].sort());
      expect(installed.kept).toEqual([installed.settings]);
      await c.query("UPDATE idemq.settings SET value = 7 WHERE name = 'key_bytes'");
      const one = await keptAndSettings(c);
      expect(one.kept).toEqual([{ ...installed.settings, key_bytes: "7" }]);
      await c.query("UPDATE idemq.settings SET value = min_value WHERE name = ANY ($1)", [FIELDS]);
      const all = await keptAndSettings(c);
      expect(all.kept).toEqual([all.settings]);
      expect(all.settings).not.toEqual(installed.settings);
      await c.query("UPDATE idemq.settings SET value = value WHERE false");
      expect((await keptAndSettings(c)).kept).toEqual([all.settings]);
    });
  });

  it("two admins changing two limits at once leave both in the row: the second waits for the first and reads its change", async () => {
    const before = (await keptAndSettings(db.pool)).settings;
    const a = await db.pool.connect();
    const b = await db.pool.connect();
    try {
      const run = await interleave(db.pool, {
        first: a,
        holds: async (c) => {
          await c.query("UPDATE idemq.settings SET value = 11 WHERE name = 'task_bytes'");
          await b.query("BEGIN");
        },
        second: b,
        // b's trigger waits for the kept row a's trigger locked.
        blocks: (c) => c.query("UPDATE idemq.settings SET value = 13 WHERE name = 'key_bytes'"),
        end: "COMMIT",
      });
      expect(run.blockers).toEqual([run.firstPid]);
      await run.second;
      await b.query("COMMIT");
      expect((await keptAndSettings(a)).kept).toEqual([{ ...before, task_bytes: "11", key_bytes: "13" }]);
      // Enqueues see both: a task of 12 bytes and a key of 14 bytes are refused.
      await inRollback(db.pool, async (c) => {
        await refusedBoth(c, "", ["t".repeat(12)], { task: "t".repeat(12) }, /task is 12 bytes, over the limit of 11 bytes/);
        await refusedBoth(c, ", idempotency_key => $2", ["t", "k".repeat(14)], { task: "t", idempotency_key: "k".repeat(14) },
          /idempotency_key is 14 bytes, over the limit of 13 bytes/);
      });
    } finally {
      await a.query("ROLLBACK").catch(() => undefined);
      await b.query("ROLLBACK").catch(() => undefined);
      a.release();
      b.release();
      // The other tests of this file expect the limits as they were.
      for (const name of ["task_bytes", "key_bytes"]) {
        await db.pool.query("UPDATE idemq.settings SET value = $2 WHERE name = $1", [name, before[name]]);
      }
    }
    expect((await keptAndSettings(db.pool)).kept).toEqual([before]);
  });
});
});

describe("worker_id_bytes: claim", () => {
  it("a worker_id of worker_id_bytes bytes claims; one byte more is 22023 and claims nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const max = await limit(c, "worker_id_bytes");
      expect(max).toBe(256);
      const queue = unique("limits");
      const id = await makeJob(c, { queue });
      const before = await jobRow(c, id);
      await refused(c, "SELECT * FROM idemq.claim(worker_id => $1, queues => ARRAY[$2])", ["w".repeat(max + 1), queue], /worker_id is 257 bytes/);
      await refused(c, "SELECT * FROM idemq.claim(worker_id => $1, queues => ARRAY[$2])", [`${"é".repeat(128)}w`, queue]);
      expect(await jobRow(c, id)).toEqual(before);
      const wide = "é".repeat(128); // 256 bytes
      const { rows } = await c.query("SELECT job_id AS id FROM idemq.claim(worker_id => $1, queues => ARRAY[$2])", [wide, queue]);
      expect(rows.map((r) => r.id)).toEqual([id]);
      expect((await jobRow(c, id)).locked_by).toBe(wide);
    });
  });
});

describe("error history: fail() can always record a failure", () => {
  const errorsOf = async (c: pg.ClientBase, id: string) =>
    (await c.query<{ errors: Record<string, unknown>[] }>("SELECT errors FROM idemq.jobs WHERE id = $1", [id])).rows[0]!.errors;

  it("keeps the latest error_history entries: at the limit all of them, one failure more drops the oldest", async () => {
    await inRollback(db.pool, async (c) => {
      const keep = await limit(c, "error_history");
      const id = await makeJob(c, { queue: unique("limits"), max_attempts: keep + 5, backoff: { kind: "fixed", delays: ["0 s"] } });
      for (let attempt = 1; attempt <= keep; attempt++) {
        await claimJob(c, id);
        expect(await fail(c, id, attempt, { class: "Boom", message: `failure ${attempt}` })).toBe("scheduled");
        await makeDue(c, id);
      }
      expect((await errorsOf(c, id)).map((e) => e.attempt)).toEqual(Array.from({ length: keep }, (_, i) => i + 1));
      await claimJob(c, id);
      await fail(c, id, keep + 1, { class: "Boom", message: "one more" });
      const errors = await errorsOf(c, id);
      expect(errors.map((e) => e.attempt)).toEqual(Array.from({ length: keep }, (_, i) => i + 2));
      expect(errors.at(-1)).toMatchObject({ class: "Boom", message: "one more", attempt: keep + 1 });
    });
  });

  it("message and class at error_message_chars and stack at error_stack_chars are kept whole; one character more is cut, marked truncated", async () => {
    await inRollback(db.pool, async (c) => {
      const chars = await limit(c, "error_message_chars");
      const stackChars = await limit(c, "error_stack_chars");
      const id = await makeJob(c, { queue: unique("limits"), max_attempts: 5, backoff: { kind: "fixed", delays: ["0 s"] } });
      const exact = { class: "C".repeat(chars), message: "m".repeat(chars), stack: "s".repeat(stackChars), code: 7 };
      await claimJob(c, id);
      await fail(c, id, 1, exact);
      const [first] = await errorsOf(c, id);
      expect(first).toMatchObject(exact);
      expect(first).not.toHaveProperty("truncated");

      for (const [attempt, over] of [
        [2, { ...exact, message: "é".repeat(chars + 1) }],
        [3, { ...exact, stack: "s".repeat(stackChars + 1) }],
        [4, { ...exact, class: "C".repeat(chars + 1) }],
      ] as const) {
        await makeDue(c, id);
        await claimJob(c, id);
        await fail(c, id, attempt, over);
        const entry = (await errorsOf(c, id)).at(-1)!;
        expect(entry).toMatchObject({ attempt, truncated: true, code: 7 });
        expect((entry.message as string).length).toBe(chars);
        expect((entry.class as string).length).toBe(chars);
        expect((entry.stack as string).length).toBe(stackChars);
      }
    });
  });

  it("other fields are kept up to error_message_chars of JSON text, dropped beyond it", async () => {
    await inRollback(db.pool, async (c) => {
      const chars = await limit(c, "error_message_chars");
      const id = await makeJob(c, { queue: unique("limits"), max_attempts: 5, backoff: { kind: "fixed", delays: ["0 s"] } });
      // {"data": "..."} is the value's length plus 12 characters of JSON.
      const inside = { class: "E", message: "m", data: "d".repeat(chars - 12) };
      await claimJob(c, id);
      await fail(c, id, 1, inside);
      expect((await errorsOf(c, id))[0]).toMatchObject(inside);
      await makeDue(c, id);
      await claimJob(c, id);
      await fail(c, id, 2, { ...inside, data: "d".repeat(chars - 11) });
      const entry = (await errorsOf(c, id))[1]!;
      expect(entry).toMatchObject({ class: "E", message: "m", truncated: true, attempt: 2 });
      expect(entry).not.toHaveProperty("data");
    });
  });

  it("failures with large errors, more of them than the history keeps, are all recorded and the history stays bounded", async () => {
    await inRollback(db.pool, async (c) => {
      const keep = await limit(c, "error_history");
      const id = await makeJob(c, { queue: unique("limits"), max_attempts: keep + 10, backoff: { kind: "fixed", delays: ["0 s"] } });
      const big = "x".repeat(2_000_000);
      for (let attempt = 1; attempt <= keep + 2; attempt++) {
        await claimJob(c, id);
        expect(await fail(c, id, attempt, { class: "Big", message: big, stack: big, detail: big })).toBe("scheduled");
        await makeDue(c, id);
      }
      const { rows } = await c.query<{ n: number; bytes: number }>(
        "SELECT jsonb_array_length(errors) AS n, octet_length(errors::text) AS bytes FROM idemq.jobs WHERE id = $1",
        [id],
      );
      expect(rows[0]!.n).toBe(keep);
      const chars = await limit(c, "error_message_chars");
      const stackChars = await limit(c, "error_stack_chars");
      expect(rows[0]!.bytes).toBeLessThan(keep * (2 * chars + stackChars + 500));
    });
  });

  it("a refused error is quoted by a short excerpt only", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await makeJob(c, { queue: unique("limits") });
      const job = await claimJob(c, id);
      const error = await refused(c, "SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => $3::jsonb)", [
        id,
        job,
        JSON.stringify(Array.from({ length: 100_000 }, (_, i) => i)),
      ]);
      expect(error.message.length).toBeLessThan(250);
    });
  });
});

describe("instants: infinity and -infinity are refused where a job needs a real time", () => {
  it("reschedule, snooze and fail(retry_at): a finite time far away passes; infinity and -infinity are 22023, nothing written", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("limits");
      const id = await makeJob(c, { queue, max_attempts: 5 });
      for (const bad of ["infinity", "-infinity"]) {
        await refused(c, "SELECT idemq.reschedule(job_id => $1, run_at => $2::timestamptz)", [id, bad], /reschedule: run_at must be a finite time/);
      }
      expect(await c.query("SELECT idemq.reschedule(job_id => $1, run_at => '294000-01-01') AS s", [id])).toMatchObject({ rows: [{ s: "scheduled" }] });
      expect(await c.query("SELECT idemq.reschedule(job_id => $1, run_at => '4713-01-01 BC') AS s", [id])).toMatchObject({ rows: [{ s: "enqueued" }] });

      const attempt = (await claimOne(c, { queues: [queue] })).attempt;
      for (const bad of ["infinity", "-infinity"]) {
        await refused(c, "SELECT idemq.snooze(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => $3::timestamptz)", [id, attempt, bad], /snooze: run_at/);
        await refused(c, `SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '"x"', retry_at => $3::timestamptz)`, [id, attempt, bad], /fail: retry_at/);
      }
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '"x"', retry_at => '294000-01-01')`, [id, attempt]);
      expect((await jobRow(c, id)).state).toBe("scheduled");
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [id]);
      const again = (await claimOne(c, { queues: [queue] })).attempt;
      await c.query("SELECT idemq.snooze(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => '4713-01-01 BC')", [id, again]);
      expect((await jobRow(c, id)).state).toBe("scheduled");
    });
  });

  it("stats() does not fail on a run_at of -infinity already stored: the age is capped at the bigint maximum", async () => {
    await inRollback(db.pool, async (c) => {
      const queue = unique("limits");
      const id = await makeJob(c, { queue });
      const far = await makeJob(c, { queue: `${queue}-far` });
      // Stored before the functions refused it (or written by hand).
      await c.query("UPDATE idemq.jobs SET run_at = '-infinity' WHERE id = $1", [id]);
      await c.query("UPDATE idemq.jobs SET run_at = '4713-01-01 BC' WHERE id = $1", [far]);
      const { rows } = await c.query<{ queue: string; value: string }>(
        "SELECT queue, value FROM idemq.stats() WHERE metric = 'oldest_runnable_seconds' AND queue LIKE $1 ORDER BY queue",
        [`${queue}%`],
      );
      expect(rows[0]).toEqual({ queue, value: "9223372036854775807" });
      expect(Number(rows[1]!.value)).toBeGreaterThan(6700 * 365 * 86400);
    });
  });
});

describe("duration_days: retention and staleness cannot overflow a timestamp", () => {
  it("purge, prune_keys (older_than) and effect_claim (stale_after): duration_days passes, a day more is 22023; 2147483647 days is 22023, not 22008", async () => {
    await inRollback(db.pool, async (c) => {
      const days = await limit(c, "duration_days");
      expect(days).toBe(36500);
      expect((await c.query("SELECT idemq.purge(older_than => make_interval(days => $1)) AS n", [days])).rows[0].n).toBe(0);
      await c.query("SELECT idemq.prune_keys(older_than => make_interval(days => $1))", [days]);
      await c.query("SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => make_interval(days => $1))", [days]);
      for (const over of [`${days + 1} days`, "2147483647 days", "1000000 years"]) {
        await refused(c, "SELECT idemq.purge(older_than => $1::interval)", [over], /purge: older_than must be at most 36500 days/);
        await refused(c, "SELECT idemq.prune_keys(older_than => $1::interval)", [over], /prune_keys: older_than/);
        await refused(c, "SELECT * FROM idemq.effect_claim(key => 'k2', owner => 'o', stale_after => $1::interval)", [over], /stale_after/);
      }
    });
  });
});

describe("error messages quote a short prefix of bad input", () => {
  it("claim's queue and task lists, a backoff, purge's states", async () => {
    await inRollback(db.pool, async (c) => {
      const many = Array.from({ length: 10_000 }, (_, i) => `queue-${i}`);
      for (const [statement, values] of [
        ["SELECT * FROM idemq.claim(worker_id => 'w', queues => $1::text[])", [[...many, ""]]],
        ["SELECT * FROM idemq.claim(worker_id => 'w', tasks => $1::text[])", [[...many, ""]]],
        ["SELECT * FROM idemq.retry_horizon(backoff => $1::jsonb, counted_attempts => 1, max_attempts => 3)", [JSON.stringify({ kind: "fixed", delays: [...many] })]],
        ["SELECT * FROM idemq.retry_horizon(backoff => $1::jsonb, counted_attempts => 1, max_attempts => 3)", [JSON.stringify({ kind: "x".repeat(100_000) })]],
        ["SELECT idemq.purge(older_than => '1 day', states => $1::idemq.job_state[])", [[...Array(10_000).fill("failed"), "enqueued"]]],
      ] as const) {
        const error = await refused(c, statement, [...values]);
        expect(error.message.length, error.message.slice(0, 300)).toBeLessThan(300);
      }
    });
  });
});

describe("docs/design.md", () => {
  it('the "Limits" table lists every row of idemq.settings with its default and range', async () => {
    const { readFileSync } = await import("node:fs");
    const design = readFileSync(new URL("../../docs/design.md", import.meta.url), "utf8");
    const section = design.split("\n## Limits\n")[1]?.split("\n## ")[0] ?? "";
    const documented = [...section.matchAll(/^\| `(\w+)` \| (\d+) \| (\d+)\.\.(\d+) \|/gm)].map((m) => [m[1], m[2], m[3], m[4]]);
    const { rows } = await db.pool.query<{ name: string; value: string; min_value: string; max_value: string }>(
      "SELECT name, value::text, min_value::text, max_value::text FROM idemq.settings ORDER BY name",
    );
    expect(documented.sort()).toEqual(rows.map((r) => [r.name, r.value, r.min_value, r.max_value]));
  });
});
