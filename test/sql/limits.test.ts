// Limits (docs/design.md, "Limits"): each one is a row of idemq.settings read
// through idemq._limit, and each is tested at its boundary: just inside
// passes, just outside raises 22023 with a HINT, and a refused call writes
// nothing. Bytes are counted in UTF-8, so the boundaries are also crossed with
// a two-byte character.
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSqlError, freshDatabase, inRollback, type TestDatabase } from "../helpers/db.ts";
import { jobRow, makeJob, unique } from "../helpers/jobs.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { claimJob, claimOne, fail, makeDue } from "../helpers/work.ts";

let db: TestDatabase;
beforeAll(async () => {
  db = await freshDatabase({ poolSize: 4 });
});
afterAll(async () => {
  await db?.drop();
});

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
async function refused(c: pg.ClientBase, statement: string, values: unknown[] = [], message?: RegExp): Promise<Error> {
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
      key_bytes: 512,
      payload_bytes: 1048576,
      retention_cancelled_seconds: 2592000,
      retention_expired_seconds: 2592000,
      retention_failed_seconds: 2592000,
      retention_succeeded_seconds: 604800,
      worker_id_bytes: 256,
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
      const { rows } = await c.query("SELECT id FROM idemq.claim(worker_id => $1, queues => ARRAY[$2])", [wide, queue]);
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
      const error = await refused(c, "SELECT idemq.fail(job_id => $1, attempt => $2, error => $3::jsonb)", [
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
        await refused(c, "SELECT idemq.snooze(job_id => $1, attempt => $2, run_at => $3::timestamptz)", [id, attempt, bad], /snooze: run_at/);
        await refused(c, `SELECT idemq.fail(job_id => $1, attempt => $2, error => '"x"', retry_at => $3::timestamptz)`, [id, attempt, bad], /fail: retry_at/);
      }
      await c.query(`SELECT idemq.fail(job_id => $1, attempt => $2, error => '"x"', retry_at => '294000-01-01')`, [id, attempt]);
      expect((await jobRow(c, id)).state).toBe("scheduled");
      await c.query("SELECT idemq.reschedule(job_id => $1, run_at => now())", [id]);
      const again = (await claimOne(c, { queues: [queue] })).attempt;
      await c.query("SELECT idemq.snooze(job_id => $1, attempt => $2, run_at => '4713-01-01 BC')", [id, again]);
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
