// Client-side contract checks that need no database: durations, backoff
// encoding, SQL error mapping and the shape of the generated calls. The SQL
// side of each guarantee is tested against a real PostgreSQL elsewhere.

import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { describe, expect, it, vi } from "vitest";
import {
  ACTIVE_STATES,
  ERROR_CODES,
  JOB_STATES,
  TERMINAL_STATES,
  type Backoff,
} from "../../src/contract.ts";
import { toBackoffJson } from "../../src/encode.ts";
import { toMilliseconds, toPgInterval } from "../../src/duration.ts";
import {
  BadArgumentError,
  DETAIL_SUBCLASSES,
  DuplicateJobError,
  EffectClaimLostError,
  ERROR_CLASSES,
  IdemqError,
  InvalidStateError,
  JobNotFoundError,
  KeyReuseError,
  LeaseLostError,
  PermanentError,
  fromPgError,
} from "../../src/errors.ts";
import { Client } from "../../src/client.ts";
import { buildCall, enqueue, enqueueMany, schedule, scheduleNext, type Queryable, type ScheduleDefinition } from "../../src/sql/index.ts";

function pgError(code: string, message: string, extra: { detail?: string; hint?: string } = {}): pg.DatabaseError {
  const err = new pg.DatabaseError(message, message.length, "error");
  err.code = code;
  err.severity = "ERROR";
  err.detail = extra.detail;
  err.hint = extra.hint;
  return err;
}

/** Records statements instead of running them (the SQL itself is tested elsewhere). */
function recorder(rows: Record<string, unknown>[] = [{}]) {
  const calls: { text: string; values: unknown[] }[] = [];
  const db: Queryable = {
    query: async (text: string, values?: unknown[]) => {
      calls.push({ text, values: values ?? [] });
      return { rows, command: "SELECT", rowCount: rows.length, oid: 0, fields: [] };
    },
  };
  return { db, calls };
}

describe("states", () => {
  it("active and terminal states partition the state list", () => {
    expect([...ACTIVE_STATES, ...TERMINAL_STATES].sort()).toEqual([...JOB_STATES].sort());
  });
});

describe("toPgInterval", () => {
  it.each([
    ["2s", "2 seconds"],
    ["5m", "5 minutes"],
    ["1h", "1 hour"],
    ["2 seconds", "2 seconds"],
    ["1 second", "1 second"],
    ["250ms", "250 milliseconds"],
    ["14 days", "14 days"],
    ["1.5h", "1.5 hours"],
    ["1h30m", "1 hour 30 minutes"],
    ["1h 30m", "1 hour 30 minutes"],
    ["2 mins, 3 secs", "2 minutes 3 seconds"],
    ["  2S ", "2 seconds"],
    ["3 months", "3 months"],
    ["00:00:30", "00:00:30"],
    ["1 day 02:00:00", "1 day 02:00:00"],
  ])("%j -> %j", (input, expected) => {
    expect(toPgInterval(input)).toBe(expected);
  });

  it("reads a number as milliseconds", () => {
    expect(toPgInterval(250)).toBe("250 milliseconds");
    expect(toPgInterval(0)).toBe("0 milliseconds");
    expect(toPgInterval(1)).toBe("1 millisecond");
  });

  it("refuses an unknown unit with a clear message and a hint", () => {
    let caught: unknown;
    try {
      toPgInterval("5 parsecs");
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(BadArgumentError);
    const err = caught as BadArgumentError;
    expect(err.message).toBe('invalid duration "5 parsecs": unknown unit "parsecs"');
    expect(err.code).toBe("IQ400");
    expect(err.hint).toMatch(/"2s"/);
  });

  it.each([
    ["", /empty/],
    ["   ", /empty/],
    ["500", /ambiguous/],
    ["abc", /cannot read "abc"/],
    ["5m-", /cannot read "-"/],
    ["-5s", /cannot read "-5s"/],
    ["2 s s", /cannot read "s"/],
    ["00:61", /hh:mm/],
  ])("refuses the string %j", (input, message) => {
    expect(() => toPgInterval(input)).toThrow(BadArgumentError);
    expect(() => toPgInterval(input)).toThrow(message);
  });

  it.each([-1, Number.NaN, Number.POSITIVE_INFINITY])("refuses the number %s", (input) => {
    expect(() => toPgInterval(input)).toThrow(/finite and not negative/);
  });

  it("refuses what is neither a string nor a number", () => {
    expect(() => toPgInterval(null as unknown as string)).toThrow(/expected a string or a number, got object/);
  });
});

describe("toMilliseconds", () => {
  it.each([
    ["250ms", 250],
    ["2s", 2000],
    ["1h30m", 5_400_000],
    ["00:00:30", 30_000],
    ["1 day 02:00:00", 93_600_000],
    [1500, 1500],
  ] as const)("%j -> %d", (input, expected) => {
    expect(toMilliseconds(input)).toBe(expected);
  });

  it("refuses calendar units, which have no fixed length", () => {
    expect(() => toMilliseconds("1 month")).toThrow(/no fixed length/);
  });
});

describe("toBackoffJson", () => {
  it("converts durations and leaves unset fields to SQL", () => {
    expect(toBackoffJson({ kind: "exponential", initial: "2s", max: "1h" })).toEqual({
      kind: "exponential",
      initial: "2 seconds",
      max: "1 hour",
    });
    expect(toBackoffJson({ kind: "fixed", delays: ["2s", 5000, "10 seconds"] })).toEqual({
      kind: "fixed",
      delays: ["2 seconds", "5000 milliseconds", "10 seconds"],
    });
    expect(toBackoffJson({ kind: "polynomial" })).toEqual({ kind: "polynomial" });
  });

  it("refuses the obvious mistakes", () => {
    expect(() => toBackoffJson({ kind: "fixed", delays: [] })).toThrow(/at least one delay/);
    expect(() => toBackoffJson({ kind: "linear" } as unknown as Backoff)).toThrow(/unknown backoff kind "linear"/);
    expect(() => toBackoffJson({ kind: "exponential" } as unknown as Backoff)).toThrow(/initial/);
    expect(() => toBackoffJson({ kind: "exponential", initial: "2 parsecs" })).toThrow(BadArgumentError);
  });
});

describe("fromPgError", () => {
  it("has one class per idemq error code", () => {
    expect(Object.keys(ERROR_CLASSES).sort()).toEqual(Object.keys(ERROR_CODES).sort());
  });

  it.each([
    ["IQ400", BadArgumentError],
    ["22023", BadArgumentError],
    ["22P02", BadArgumentError],
    ["IQ404", JobNotFoundError],
    ["IQ410", LeaseLostError],
    ["IQ412", InvalidStateError],
    ["IQ499", IdemqError],
  ] as const)("maps %s to %s", (code, cls) => {
    const original = pgError(code, "boom", { detail: "d", hint: "h" });
    const mapped = fromPgError(original);
    expect(mapped).toBeInstanceOf(cls);
    expect(mapped).toMatchObject({ code, message: "boom", detail: "d", hint: "h", name: cls.name });
    expect((mapped as Error).cause).toBe(original);
  });

  it("maps IQ410 by its DETAIL: a job's lease (job_id) to LeaseLostError, an effect claim (key, owner) to EffectClaimLostError", () => {
    const job = fromPgError(
      pgError("IQ410", "complete: lease lost", {
        detail: '{"job_id": 7, "attempt": 1, "current_state": "processing"}',
      }),
    );
    expect(job).toBeInstanceOf(LeaseLostError);
    expect(job).not.toBeInstanceOf(EffectClaimLostError);
    expect(job).toMatchObject({ code: "IQ410", name: "LeaseLostError" });

    const effect = fromPgError(
      pgError("IQ410", "effect_done: the claim ...", { detail: '{"key": "charge:1", "owner": "job:7:1@w"}' }),
    );
    expect(effect).toBeInstanceOf(EffectClaimLostError);
    // A subclass: code that catches every IQ410 as LeaseLostError still catches it.
    expect(effect).toBeInstanceOf(LeaseLostError);
    expect(effect).toMatchObject({ code: "IQ410", name: "EffectClaimLostError", key: "charge:1", owner: "job:7:1@w" });
  });

  it("refines only codes whose base class the subclass extends", () => {
    for (const [code, { cls }] of Object.entries(DETAIL_SUBCLASSES)) {
      expect(cls.prototype).toBeInstanceOf(ERROR_CLASSES[code as keyof typeof ERROR_CLASSES]);
    }
    expect(Object.keys(DETAIL_SUBCLASSES)).toEqual(["IQ410"]);
  });

  it("parses DuplicateJobError's DETAIL, keeping a large id exact", () => {
    const detail =
      '{"key": "invoice-email:42", "policy": "reject_always", "existing_state": "succeeded", "existing_job_id": 9007199254740993}';
    const mapped = fromPgError(pgError("IQ409", "key invoice-email:42 ...", { detail }));
    expect(mapped).toBeInstanceOf(DuplicateJobError);
    expect(mapped).toMatchObject({
      code: "IQ409",
      key: "invoice-email:42",
      existingJobId: "9007199254740993",
      existingState: "succeeded",
      policy: "reject_always",
      detail,
    });
  });

  it("maps retry()'s IQ409 (key held by another active job, policy null) to DuplicateJobError with policy null", () => {
    const detail = '{"key":"k","policy":null,"existing_state":"enqueued","existing_job_id":31}';
    const mapped = fromPgError(pgError("IQ409", "retry: idempotency key ...", { detail }));
    expect(mapped).toBeInstanceOf(DuplicateJobError);
    expect(mapped).toMatchObject({ key: "k", existingJobId: "31", existingState: "enqueued", policy: null });
  });

  it("accepts an id given as a JSON string", () => {
    const detail = '{"key":"k","existing_job_id":"12","existing_state":"failed","policy":"reject_if_failed"}';
    expect(fromPgError(pgError("IQ409", "m", { detail }))).toMatchObject({ existingJobId: "12" });
  });

  it("parses KeyReuseError's DETAIL and keeps extra fields", () => {
    const detail = '{"key":"k","existing_job_id":7,"existing_task":"credit"}';
    const mapped = fromPgError(pgError("IQ422", "m", { detail }));
    expect(mapped).toBeInstanceOf(KeyReuseError);
    expect(mapped).toMatchObject({ key: "k", existingJobId: "7", details: { existing_task: "credit" } });
  });

  it("still yields an IdemqError with the code when DETAIL breaks the contract", () => {
    for (const detail of [undefined, "not json", '{"key":"k"}', "[1]"]) {
      const mapped = fromPgError(pgError("IQ409", "m", detail === undefined ? {} : { detail }));
      expect(mapped).toBeInstanceOf(IdemqError);
      expect(mapped).not.toBeInstanceOf(DuplicateJobError);
      expect(mapped).toMatchObject({ code: "IQ409" });
    }
  });

  it("maps a plain object shaped like a DatabaseError", () => {
    const mapped = fromPgError({ code: "IQ404", message: "no such job", severity: "ERROR" });
    expect(mapped).toBeInstanceOf(JobNotFoundError);
  });

  it("returns every other error unchanged", () => {
    for (const err of [
      pgError("23505", "unique violation"),
      pgError("40001", "serialization failure"),
      Object.assign(new Error("write EPIPE"), { code: "EPIPE" }),
      new Error("plain"),
      "a string",
      undefined,
    ]) {
      expect(fromPgError(err)).toBe(err);
    }
  });

  it("leaves an IdemqError as it is", () => {
    const err = new LeaseLostError("lost", { code: "IQ410" });
    expect(fromPgError(err)).toBe(err);
  });

  it("gives client-built errors their class's code", () => {
    expect(new BadArgumentError("x").code).toBe("IQ400");
    expect(new DuplicateJobError("x", { detail: '{"key":"k","existing_job_id":1,"existing_state":"failed","policy":"reject_always"}' }).code).toBe("IQ409");
  });

  it("PermanentError is a plain Error subclass, not a database error", () => {
    const err = new PermanentError("bad card", { cause: "declined" });
    expect(err).toBeInstanceOf(Error);
    expect(err).not.toBeInstanceOf(IdemqError);
    expect(err.name).toBe("PermanentError");
    expect(err.cause).toBe("declined");
  });
});

describe("generated calls", () => {
  it("passes parameters in declaration order, whatever the caller's key order: by position up to the first one left out, by name after it", () => {
    const a = buildCall("enqueue", { task: "t", idempotency_key: "k", queue: "q" });
    const b = buildCall("enqueue", { queue: "q", idempotency_key: "k", task: "t" });
    expect(a.text).toBe("SELECT * FROM idemq.enqueue($1, queue => $2, idempotency_key => $3) AS r");
    expect(b).toEqual(a);
    expect(buildCall("enqueue", { task: "t", payload: "{}", queue: "q", priority: 2 }).text).toBe(
      "SELECT * FROM idemq.enqueue($1, $2, $3, priority => $4) AS r",
    );
    expect(buildCall("enqueue", { payload: "{}", task: "t" })).toEqual({
      text: "SELECT * FROM idemq.enqueue($1, $2) AS r",
      values: ["t", "{}"],
    });
  });

  it("leaves undefined options out and passes null as SQL NULL", () => {
    expect(buildCall("claim", { worker_id: "w", queues: null, lease: undefined })).toEqual({
      text: "SELECT * FROM idemq.claim($1, $2) AS r",
      values: ["w", null],
    });
    expect(buildCall("rescue", {}).text).toBe("SELECT * FROM idemq.rescue() AS r");
  });

  it("enqueue encodes payload as JSON, ids as strings, delay with the database clock", async () => {
    const { db, calls } = recorder([{ job_id: "9007199254740993", deduplicated: false }]);
    const res = await enqueue(db, "send", ["a", 1], {
      delay: "5m",
      after: [9007199254740993n, "12"],
      backoff: { kind: "fixed", delays: ["2s"] },
      duplicatePolicy: "reject_always",
    });
    expect(res).toEqual({ jobId: "9007199254740993", deduplicated: false });
    expect(calls[0]).toEqual({
      text:
        "SELECT * FROM idemq.enqueue($1, $2, run_at => statement_timestamp() + $3::interval, " +
        "duplicate_policy => $4, backoff => $5, after => $6) AS r",
      values: [
        "send",
        '["a",1]',
        "5 minutes",
        "reject_always",
        '{"kind":"fixed","delays":["2 seconds"]}',
        ["9007199254740993", "12"],
      ],
    });
  });

  it("enqueue refuses the obvious mistakes before any SQL", async () => {
    const { db, calls } = recorder();
    await expect(enqueue(db, "t", {}, { duplicatePolicy: "sometimes" as never })).rejects.toThrow(
      /unknown duplicate policy "sometimes"/,
    );
    await expect(enqueue(db, "t", {}, { runAt: new Date(), delay: "1s" })).rejects.toThrow(/runAt or delay/);
    await expect(enqueue(db, "t", {}, { delay: "5 parsecs" })).rejects.toThrow(BadArgumentError);
    await expect(enqueue(db, "", {})).rejects.toThrow(/task must be a non-empty string/);
    await expect(enqueue(db, "t", {}, { after: [1.5] })).rejects.toThrow(/after must be an integer/);
    await expect(enqueue(db, "t", { n: 1n })).rejects.toThrow(/payload is not JSON-serializable/);
    expect(calls).toEqual([]);
  });

  it("enqueueMany sends snake_case fields and exact numeric ids, and leaves unset fields out", async () => {
    const { db, calls } = recorder([{ ordinal: 1, job_id: "5", outcome: "created" }]);
    const res = await enqueueMany(db, [
      { task: "a", payload: { x: 1 }, maxAttempts: 3, after: ["9007199254740993"], runAt: "2030-01-01T00:00:00Z" },
      { task: "b" },
    ]);
    expect(res).toEqual([{ ordinal: 1, jobId: "5", outcome: "created" }]);
    expect(calls[0]!.text).toBe("SELECT * FROM idemq.enqueue_many($1) AS r ORDER BY r.ordinal");
    expect(calls[0]!.values).toEqual([
      '[{"task":"a","payload":{"x":1},"run_at":"2030-01-01T00:00:00Z","max_attempts":3,"after":[9007199254740993]},' +
        '{"task":"b"}]',
    ]);
  });

  it("schedule passes its parameters in declaration order, converts misfireGrace to an interval and leaves unset options out", async () => {
    const { db, calls } = recorder([{ r: new Date("2030-01-01T00:00:00Z") }]);
    const next = await schedule(db, {
      maxAttempts: 3,
      misfireGrace: "2m",
      overlap: "queue_one",
      task: "report",
      cron: "@every 5s",
      name: "n",
      payload: { a: [1] },
    });
    expect(next).toEqual(new Date("2030-01-01T00:00:00Z"));
    expect(calls[0]).toEqual({
      text:
        "SELECT * FROM idemq.schedule($1, $2, $3, $4, overlap => $5, " +
        "misfire_grace => $6, max_attempts => $7) AS r",
      values: ["n", "@every 5s", "report", '{"a":[1]}', "queue_one", "2 minutes", 3],
    });
  });

  it("schedule refuses an unknown option, a policy outside its union and a missing field before any SQL", async () => {
    const { db, calls } = recorder();
    const base = { name: "n", cron: "* * * * *", task: "t" };
    await expect(schedule(db, { ...base, timeZone: "UTC" } as unknown as ScheduleDefinition)).rejects.toThrow(
      /schedule "n": unknown option "timeZone"/,
    );
    await expect(schedule(db, { ...base, overlap: "sometimes" as never })).rejects.toThrow(
      /schedule "n": overlap must be one of skip, allow, queue_one, not "sometimes"/,
    );
    await expect(schedule(db, { ...base, misfire: "never" as never })).rejects.toThrow(/misfire must be one of once, skip, all/);
    await expect(schedule(db, { ...base, misfireGrace: "5 parsecs" })).rejects.toThrow(BadArgumentError);
    await expect(schedule(db, { name: "n", task: "t" } as unknown as ScheduleDefinition)).rejects.toThrow(/cron must be a non-empty string/);
    await expect(schedule(db, { ...base, priority: 1.5 })).rejects.toThrow(/priority must be an integer/);
    expect(calls).toEqual([]);
  });

  it("scheduleNext calls schedule_next with what is given and returns the slots", async () => {
    const { db, calls } = recorder([{ r: new Date("2030-01-01T00:00:00Z") }, { r: new Date("2030-01-02T00:00:00Z") }]);
    const slots = await scheduleNext(db, { cron: "@daily", count: 2 });
    expect(slots).toEqual([new Date("2030-01-01T00:00:00Z"), new Date("2030-01-02T00:00:00Z")]);
    expect(calls[0]).toEqual({ text: "SELECT * FROM idemq.schedule_next($1, count => $2) AS r", values: ["@daily", 2] });
  });

  it("maps SQL errors raised by a call", async () => {
    const db: Queryable = {
      query: async () => {
        throw pgError("IQ409", "rejected", {
          detail: '{"key":"k","existing_job_id":3,"existing_state":"succeeded","policy":"reject_always"}',
        });
      },
    };
    await expect(enqueue(db, "t", {}, { idempotencyKey: "k" })).rejects.toBeInstanceOf(DuplicateJobError);
  });
});

describe("Client", () => {
  it("accepts pg's Pool, PoolClient and Client as a transaction client (types)", () => {
    const check = (_q: Queryable) => undefined;
    // Type-level: compiled by tsc; nothing connects.
    const pool = new pg.Pool();
    check(pool);
    check(new pg.Client());
    check({} as pg.PoolClient);
    return pool.end();
  });

  it("ends only the pool it created", async () => {
    const own = new Client({ connectionString: "postgres://nobody@127.0.0.1:1/none" });
    await own.close();
    expect(own.pool.ended).toBe(true);
    await own.close(); // idempotent

    const pool = new pg.Pool();
    const borrowed = new Client(pool);
    expect(pool.listenerCount("error")).toBe(1);
    await borrowed.close();
    expect(pool.ended).toBe(false);
    expect(pool.listenerCount("error")).toBe(0);
    await pool.end();
  });

  it("emits enqueue:rejected for a raised IQ409 and rethrows it", async () => {
    const pool = new pg.Pool();
    const client = new Client({ pool });
    const tx: Queryable = {
      query: async () => {
        throw pgError("IQ409", "rejected", {
          detail: '{"key":"k","existing_job_id":3,"existing_state":"succeeded","policy":"reject_always"}',
        });
      },
    };
    const events: unknown[] = [];
    client.on("enqueue:rejected", (e) => events.push(e));
    await expect(client.enqueue("t", {}, { idempotencyKey: "k", client: tx })).rejects.toBeInstanceOf(
      DuplicateJobError,
    );
    expect(events).toMatchObject([{ task: "t", error: { existingJobId: "3" } }]);
    await client.close();
    await pool.end();
  });

  it("refuses a constructor argument it cannot use: with neither DATABASE_URL nor a running dev server, it says what to do", async () => {
    const empty = await mkdtemp(join(tmpdir(), "idemq-no-dev-"));
    vi.stubEnv("DATABASE_URL", "");
    vi.stubEnv("IDEMQ_DATA_DIR", join(empty, "pg"));
    try {
      expect(() => new Client({} as never)).toThrow(/connectionString.*DATABASE_URL is not set, and no embedded PostgreSQL is running in .*run `npx idemq dev`/s);
    } finally {
      vi.unstubAllEnvs();
      await rm(empty, { recursive: true, force: true });
    }
  });
});
