// effect_claim / effect_done / effect_release: the claim-first record of an
// effect outside the database. Proven here: the four answers of effect_claim,
// the stale_after boundary, exactly one winner among concurrent (re)claimers
// on real connections, done being final, the owner checks (IQ410/IQ412), and
// a job's next attempt reclaiming at once the claim a fenced-out attempt left.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import {
  useTestDatabase,
  inRollback,
  interleave,
  expectSqlError,
} from "../helpers/db.ts";
import { underSavepoint } from "../helpers/savepoint.ts";
import { EffectClaimLostError, LeaseLostError } from "../../src/errors.ts";
import { effectDone, effectRelease } from "../../src/sql/index.ts";
import { makeJob, unique } from "../helpers/jobs.ts";
import { claimOne, expireLease, HOLDER_TOKEN, rescue } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });


type Queryable = pg.ClientBase | pg.Pool;
interface Claim {
  status: "claimed" | "reclaimed" | "done" | "busy";
  result: unknown;
}

async function claim(c: Queryable, key: string, owner: string, staleAfter?: string): Promise<Claim> {
  const { rows } =
    staleAfter === undefined
      ? await c.query<Claim>("SELECT * FROM idemq.effect_claim(key => $1, owner => $2)", [key, owner])
      : await c.query<Claim>("SELECT * FROM idemq.effect_claim(key => $1, owner => $2, stale_after => $3)", [
          key,
          owner,
          staleAfter,
        ]);
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

async function done(c: Queryable, key: string, owner: string, result: unknown): Promise<void> {
  await c.query("SELECT idemq.effect_done(key => $1, owner => $2, result => $3)", [key, owner, JSON.stringify(result)]);
}

async function record(c: Queryable, key: string) {
  const { rows } = await c.query("SELECT e.* FROM idemq.effects e WHERE e.key = $1", [key]);
  return rows[0] as
    | { key: string; owner: string; status: string; claimed_at: Date; reclaims: number; done_at: Date | null; result: unknown }
    | undefined;
}

/** Moves a claim's claimed_at to `age` before the current clock. */
async function age(c: Queryable, key: string, ageInterval: string): Promise<void> {
  await c.query("UPDATE idemq.effects SET claimed_at = clock_timestamp() - $2::interval WHERE key = $1", [key, ageInterval]);
}

describe("effect_claim answers", () => {
  it("no record: claimed (result NULL), and the record names the owner", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await claim(c, "e:first", "job:1:1")).toEqual({ status: "claimed", result: null });
      expect(await record(c, "e:first")).toMatchObject({ owner: "job:1:1", status: "claimed", reclaims: 0, done_at: null });
    });
  });

  it("a fresh claim answers busy to another owner, and leaves the record alone", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:busy", "owner-a");
      const before = await record(c, "e:busy");
      expect(await claim(c, "e:busy", "owner-b")).toEqual({ status: "busy", result: null });
      expect(await record(c, "e:busy")).toEqual(before);
    });
  });

  it("a fresh claim answers busy to the same owner too (a retry must not re-run it)", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:busy-self", "owner-a");
      expect(await claim(c, "e:busy-self", "owner-a")).toEqual({ status: "busy", result: null });
    });
  });

  it("stale_after boundary: a claim 1 s younger than stale_after is busy, 1 s older is reclaimed", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:stale", "owner-a", "1 hour");
      await age(c, "e:stale", "59 minutes 59 seconds");
      expect(await claim(c, "e:stale", "owner-b", "1 hour")).toEqual({ status: "busy", result: null });
      expect(await record(c, "e:stale")).toMatchObject({ owner: "owner-a", reclaims: 0 });

      await age(c, "e:stale", "1 hour 1 second");
      expect(await claim(c, "e:stale", "owner-b", "1 hour")).toEqual({ status: "reclaimed", result: null });
      const after = await record(c, "e:stale");
      expect(after).toMatchObject({ owner: "owner-b", status: "claimed", reclaims: 1 });
      // The reclaim restarts the clock: a third owner is busy again.
      expect(await claim(c, "e:stale", "owner-c", "1 hour")).toEqual({ status: "busy", result: null });
    });
  });

  it("the default stale_after is 10 minutes: 9 min 59 s -> busy, 10 min 1 s -> reclaimed", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:default-stale", "owner-a");
      await age(c, "e:default-stale", "9 minutes 59 seconds");
      expect((await claim(c, "e:default-stale", "owner-b")).status).toBe("busy");
      await age(c, "e:default-stale", "10 minutes 1 second");
      expect((await claim(c, "e:default-stale", "owner-b")).status).toBe("reclaimed");
    });
  });

  it("stale_after is the caller's: the same claim is busy for one caller and reclaimed for another", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:callers", "owner-a");
      await age(c, "e:callers", "5 minutes");
      expect((await claim(c, "e:callers", "owner-b", "10 minutes")).status).toBe("busy");
      expect((await claim(c, "e:callers", "owner-c", "1 minute")).status).toBe("reclaimed");
      expect(await record(c, "e:callers")).toMatchObject({ owner: "owner-c" });
    });
  });
});

/** effect_claim for a job attempt (as the worker calls it), with the lease token of whichever attempt holds the job (HOLDER_TOKEN). */
async function claimFor(c: Queryable, key: string, jobId: string, attempt: number): Promise<Claim> {
  const { rows } = await c.query<Claim>(
    `SELECT * FROM idemq.effect_claim(key => $1, owner => $2, job_id => $3, attempt => $4, lease_token => ${HOLDER_TOKEN("$3")})`,
    [key, `job:${jobId}:${attempt}`, jobId, attempt],
  );
  expect(rows).toHaveLength(1);
  return rows[0]!;
}

/** A job claimed, its lease lost and rescued, claimed again: returns the id, now at attempt 2. */
async function secondAttempt(c: Queryable): Promise<string> {
  const queue = unique("effect-attempts");
  const id = await makeJob(c, { queue });
  expect(await claimOne(c, { queues: [queue] })).toMatchObject({ job_id: id, attempt: 1 });
  return id;
}

describe("effect_claim for a job attempt", () => {
  it("a claim left by a fenced-out attempt of the same job is reclaimed by its next attempt at once, not after stale_after", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await secondAttempt(c);
      expect(await claimFor(c, "charge:1", id, 1)).toEqual({ status: "claimed", result: null });
      expect(await record(c, "charge:1")).toMatchObject({ job_id: id, attempt: 1 });
      await expireLease(c, id);
      expect(await rescue(c)).toBe(1);
      const queue = (await c.query<{ queue: string }>("SELECT queue FROM idemq.jobs WHERE id = $1", [id])).rows[0]!.queue;
      expect(await claimOne(c, { queues: [queue] })).toMatchObject({ job_id: id, attempt: 2 });

      // The claim is seconds old, far from the 10-minute stale_after.
      expect(await claimFor(c, "charge:1", id, 2)).toEqual({ status: "reclaimed", result: null });
      expect(await record(c, "charge:1")).toMatchObject({ owner: `job:${id}:2`, status: "claimed", reclaims: 1, job_id: id, attempt: 2 });
      // The same attempt asking again is busy: its own fresh claim.
      expect((await claimFor(c, "charge:1", id, 2)).status).toBe("busy");
    });
  });

  it("is busy for another job, for an attempt the caller does not hold, and for a claim made without a job", async () => {
    await inRollback(db.pool, async (c) => {
      const id = await secondAttempt(c);
      const other = await secondAttempt(c);
      expect((await claimFor(c, "charge:2", id, 1)).status).toBe("claimed");
      // Another job's attempt, though its attempt number is higher.
      await c.query("UPDATE idemq.jobs SET attempt = 5 WHERE id = $1", [other]);
      expect((await claimFor(c, "charge:2", other, 5)).status).toBe("busy");
      // A later attempt of the same job that nobody holds (the job is still at attempt 1).
      expect((await claimFor(c, "charge:2", id, 2)).status).toBe("busy");
      // A claim made without job_id is never taken over by a job's attempt.
      expect((await claim(c, "charge:3", "someone")).status).toBe("claimed");
      expect((await claimFor(c, "charge:3", id, 1)).status).toBe("busy");
      expect(await record(c, "charge:2")).toMatchObject({ owner: `job:${id}:1`, reclaims: 0 });
    });
  });
});

describe("effect_claim on real connections", () => {
  it("10 concurrent first claimers of 5 keys: exactly one claimed per key, the others busy", async () => {
    const clients = await Promise.all(Array.from({ length: 10 }, () => db.newClient()));
    try {
      for (let k = 0; k < 5; k++) {
        const key = `e:race-first-${k}`;
        const answers = await Promise.all(clients.map((c, i) => claim(c, key, `owner-${i}`)));
        expect(answers.filter((a) => a.status === "claimed")).toHaveLength(1);
        expect(answers.filter((a) => a.status === "busy")).toHaveLength(9);
        const winner = answers.findIndex((a) => a.status === "claimed");
        expect(await record(db.pool, key)).toMatchObject({ owner: `owner-${winner}`, reclaims: 0 });
      }
    } finally {
      await Promise.all(clients.map((c) => c.end()));
    }
  });

  it("10 concurrent reclaimers of a stale claim, 5 keys: exactly one reclaimed per key, the others busy", async () => {
    const clients = await Promise.all(Array.from({ length: 10 }, () => db.newClient()));
    try {
      for (let k = 0; k < 5; k++) {
        const key = `e:race-reclaim-${k}`;
        await claim(db.pool, key, "crashed-owner");
        await age(db.pool, key, "11 minutes");
        const answers = await Promise.all(clients.map((c, i) => claim(c, key, `owner-${i}`)));
        expect(answers.filter((a) => a.status === "reclaimed")).toHaveLength(1);
        expect(answers.filter((a) => a.status === "busy")).toHaveLength(9);
        const winner = answers.findIndex((a) => a.status === "reclaimed");
        expect(await record(db.pool, key)).toMatchObject({ owner: `owner-${winner}`, reclaims: 1, status: "claimed" });
      }
    } finally {
      await Promise.all(clients.map((c) => c.end()));
    }
  });

  async function staleClaimAndTwoSessions(key: string) {
    await claim(db.pool, key, "crashed-owner");
    await age(db.pool, key, "11 minutes");
    const [a, b] = await Promise.all([db.newClient(), db.newClient()]);
    return { a, b };
  }

  it("interleaving: A reclaims in an open transaction, B's claim blocks; A commits -> B busy", async () => {
    const key = "e:interleave-commit";
    const { a, b } = await staleClaimAndTwoSessions(key);
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => expect((await claim(c, key, "owner-a")).status).toBe("reclaimed"),
      second: b,
      blocks: (c) => claim(c, key, "owner-b"),
      end: "COMMIT",
    });
    expect(run.blockers).toEqual([run.firstPid]);
    expect(await run.second).toEqual({ status: "busy", result: null });
    expect(await record(db.pool, key)).toMatchObject({ owner: "owner-a", reclaims: 1 });
  });

  it("interleaving: A reclaims in an open transaction, B's claim blocks; A rolls back -> B reclaimed", async () => {
    const key = "e:interleave-rollback";
    const { a, b } = await staleClaimAndTwoSessions(key);
    const run = await interleave(db.pool, {
      first: a,
      holds: async (c) => expect((await claim(c, key, "owner-a")).status).toBe("reclaimed"),
      second: b,
      blocks: (c) => claim(c, key, "owner-b"),
      end: "ROLLBACK",
    });
    expect(await run.second).toEqual({ status: "reclaimed", result: null });
    expect(await record(db.pool, key)).toMatchObject({ owner: "owner-b", reclaims: 1 });
  });

  it("claim, call, done on 10 connections at once: the call runs once and every caller ends with its result", async () => {
    const key = "e:run-once";
    let calls = 0;
    const clients = await Promise.all(Array.from({ length: 10 }, () => db.newClient()));
    try {
      const results = await Promise.all(
        clients.map(async (c, i) => {
          // The effect(key, fn) loop a client runs: busy means "ask again", never "skip".
          for (;;) {
            const answer = await claim(c, key, `owner-${i}`);
            if (answer.status === "done") return answer.result;
            if (answer.status === "claimed" || answer.status === "reclaimed") {
              calls++;
              const result = { sent: true, by: i };
              await done(c, key, `owner-${i}`, result);
              return result;
            }
            await new Promise((r) => setImmediate(r));
          }
        }),
      );
      expect(calls).toBe(1);
      for (const result of results) expect(result).toEqual(results[0]);
      expect(await record(db.pool, key)).toMatchObject({ status: "done", result: results[0] });
    } finally {
      await Promise.all(clients.map((c) => c.end()));
    }
  });
});

describe("effect_done", () => {
  it("done is final: every later claim answers done with the stored result, even long after stale_after", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:done", "owner-a");
      await done(c, "e:done", "owner-a", { provider_id: "ch_1", amount: 10 });
      expect(await record(c, "e:done")).toMatchObject({ status: "done", result: { provider_id: "ch_1", amount: 10 } });
      await age(c, "e:done", "30 days");
      for (const [owner, staleAfter] of [
        ["owner-a", undefined],
        ["owner-b", "1 second"],
        ["owner-c", "10 minutes"],
      ] as const) {
        expect(await claim(c, "e:done", owner, staleAfter)).toEqual({
          status: "done",
          result: { provider_id: "ch_1", amount: 10 },
        });
      }
      expect(await record(c, "e:done")).toMatchObject({ owner: "owner-a", reclaims: 0 });
    });
  });

  it("a NULL result is stored as NULL: done with result NULL", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:done-null", "owner-a");
      await c.query("SELECT idemq.effect_done(key => 'e:done-null', owner => 'owner-a', result => NULL)");
      expect(await claim(c, "e:done-null", "owner-b")).toEqual({ status: "done", result: null });
    });
  });

  it("done by a non-owner raises IQ410 with DETAIL {key, owner} and leaves the claim as it was", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:not-mine", "owner-a");
      const before = await record(c, "e:not-mine");
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.effect_done(key => $1, owner => $2, result => '{}')", ["e:not-mine", "owner-b"])),
        {
          code: "IQ410",
          detail: { key: "e:not-mine", owner: "owner-b" },
          hint: /stale_after/,
        },
      );
      expect(await record(c, "e:not-mine")).toEqual(before);
    });
  });

  it("done by an owner whose stale claim was reclaimed raises IQ410; the new owner's done works", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:lost", "owner-a");
      await age(c, "e:lost", "11 minutes");
      expect((await claim(c, "e:lost", "owner-b")).status).toBe("reclaimed");
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.effect_done(key => $1, owner => $2, result => '{}')", ["e:lost", "owner-a"])),
        {
          code: "IQ410",
          detail: { key: "e:lost", owner: "owner-a" },
        },
      );
      await done(c, "e:lost", "owner-b", { by: "b" });
      expect(await claim(c, "e:lost", "owner-a")).toEqual({ status: "done", result: { by: "b" } });
      // And the old owner still cannot overwrite it.
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.effect_done(key => $1, owner => $2, result => '{}')", ["e:lost", "owner-a"])),
        {
          code: "IQ410",
          detail: { key: "e:lost", owner: "owner-a" },
        },
      );
    });
  });

  it("done for a key never claimed raises IQ410 and creates no record", async () => {
    await inRollback(db.pool, async (c) => {
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.effect_done(key => $1, owner => $2, result => '{}')", ["e:never", "owner-a"])),
        {
          code: "IQ410",
          detail: { key: "e:never", owner: "owner-a" },
        },
      );
      expect(await record(c, "e:never")).toBeUndefined();
    });
  });

  it("through the typed calls, a non-owner's done and release raise EffectClaimLostError (a LeaseLostError) with key and owner", async () => {
    for (const call of [
      () => effectDone(db.pool, "e:typed-not-mine", "owner-b", {}),
      () => effectRelease(db.pool, "e:typed-not-mine", "owner-b"),
    ]) {
      const error = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(EffectClaimLostError);
      expect(error).toBeInstanceOf(LeaseLostError);
      expect(error).toMatchObject({ code: "IQ410", key: "e:typed-not-mine", owner: "owner-b" });
    }
    expect(await record(db.pool, "e:typed-not-mine")).toBeUndefined();
  });

  it("done twice by the owner is a no-op: the first result and done_at stay", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:twice", "owner-a");
      await done(c, "e:twice", "owner-a", { n: 1 });
      await c.query("UPDATE idemq.effects SET done_at = done_at - interval '1 minute' WHERE key = 'e:twice'");
      const first = await record(c, "e:twice");
      await done(c, "e:twice", "owner-a", { n: 2 });
      expect(await record(c, "e:twice")).toEqual(first);
      expect(first).toMatchObject({ result: { n: 1 } });
    });
  });
});

describe("effect_release", () => {
  it("release by the owner deletes the claim: the next claim answers claimed (not reclaimed)", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:release", "owner-a");
      await c.query("SELECT idemq.effect_release(key => 'e:release', owner => 'owner-a')");
      expect(await record(c, "e:release")).toBeUndefined();
      expect(await claim(c, "e:release", "owner-b")).toEqual({ status: "claimed", result: null });
      expect(await record(c, "e:release")).toMatchObject({ owner: "owner-b", reclaims: 0 });
    });
  });

  it("release by a non-owner raises IQ410 with DETAIL {key, owner}; the claim stays", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:release-other", "owner-a");
      const before = await record(c, "e:release-other");
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.effect_release(key => $1, owner => $2)", ["e:release-other", "owner-b"])),
        {
          code: "IQ410",
          detail: { key: "e:release-other", owner: "owner-b" },
        },
      );
      expect(await record(c, "e:release-other")).toEqual(before);
    });
  });

  it("release of an unknown key raises IQ410", async () => {
    await inRollback(db.pool, async (c) => {
      await expectSqlError(
        underSavepoint(c, () => c.query("SELECT idemq.effect_release(key => $1, owner => $2)", ["e:unknown", "owner-a"])),
        {
          code: "IQ410",
          detail: { key: "e:unknown", owner: "owner-a" },
        },
      );
    });
  });

  it("release of a done effect raises IQ412 with DETAIL {key, status}, for its owner and anyone else; it stays done", async () => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "e:release-done", "owner-a");
      await done(c, "e:release-done", "owner-a", { ok: true });
      const before = await record(c, "e:release-done");
      for (const owner of ["owner-a", "owner-b"]) {
        await expectSqlError(
          underSavepoint(c, () => c.query("SELECT idemq.effect_release(key => $1, owner => $2)", ["e:release-done", owner])),
          {
            code: "IQ412",
            detail: { key: "e:release-done", status: "done" },
          },
        );
      }
      expect(await record(c, "e:release-done")).toEqual(before);
    });
  });
});

describe("bad input", () => {
  it.each([
    ["effect_claim NULL key", "SELECT * FROM idemq.effect_claim(key => NULL, owner => 'o')", "22004"],
    ["effect_claim NULL owner", "SELECT * FROM idemq.effect_claim(key => 'k', owner => NULL)", "22004"],
    ["effect_claim NULL stale_after", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => NULL)", "22004"],
    ["effect_claim empty key", "SELECT * FROM idemq.effect_claim(key => '', owner => 'o')", "22023"],
    ["effect_claim empty owner", "SELECT * FROM idemq.effect_claim(key => 'k', owner => '')", "22023"],
    ["effect_claim stale_after 0", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => '0 s')", "22023"],
    ["effect_claim negative stale_after", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', stale_after => '-1 minute')", "22023"],
    ["effect_claim job_id without attempt", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', job_id => 1)", "22023"],
    ["effect_claim attempt without job_id", "SELECT * FROM idemq.effect_claim(key => 'k', owner => 'o', attempt => 1)", "22023"],
    ["effect_done NULL key", "SELECT idemq.effect_done(key => NULL, owner => 'o', result => '{}')", "22004"],
    ["effect_done NULL owner", "SELECT idemq.effect_done(key => 'k', owner => NULL, result => '{}')", "22004"],
    ["effect_done empty key", "SELECT idemq.effect_done(key => '', owner => 'o', result => '{}')", "22023"],
    ["effect_done empty owner", "SELECT idemq.effect_done(key => 'k', owner => '', result => '{}')", "22023"],
    ["effect_release NULL key", "SELECT idemq.effect_release(key => NULL, owner => 'o')", "22004"],
    ["effect_release NULL owner", "SELECT idemq.effect_release(key => 'k', owner => NULL)", "22004"],
    ["effect_release empty key", "SELECT idemq.effect_release(key => '', owner => 'o')", "22023"],
    ["effect_release empty owner", "SELECT idemq.effect_release(key => 'k', owner => '')", "22023"],
  ])("%s -> %s with a HINT, nothing written", async (_name, sql, code) => {
    await inRollback(db.pool, async (c) => {
      await claim(c, "k", "someone");
      const before = await c.query("SELECT e.* FROM idemq.effects e ORDER BY key");
      const error = await expectSqlError(underSavepoint(c, () => c.query(sql, [])), { code });
      expect(error.hint ?? "").not.toBe("");
      const after = await c.query("SELECT e.* FROM idemq.effects e ORDER BY key");
      expect(after.rows).toEqual(before.rows);
    });
  });
});
