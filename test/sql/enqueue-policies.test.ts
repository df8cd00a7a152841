// The duplicate-policy matrix of docs/design.md (idemq._policy_rejects, applied by
// enqueue): a key held by an active job always deduplicates; a key whose latest
// job is terminal follows the policy (a new job, or IQ409 with DETAIL); a key
// reused for different work while active raises IQ422, and once the job is
// terminal the policy decides (IQ409 wins). Payloads compare as jsonb.
// Jobs reach each state through the real functions (see helpers/jobs.ts).
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import {
  ACTIVE_STATES,
  count,
  enqueue,
  jobRow,
  keyRow,
  POLICIES,
  TERMINAL_STATES,
  unique,
  type Policy,
  type TerminalState,
} from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

// docs/design.md ("Enqueue"), "With a key whose latest job is terminal, duplicate_policy decides".
const MATRIX: Record<Policy, Record<TerminalState, "new job" | "reject">> = {
  allow_after_failed: { succeeded: "new job", failed: "new job", expired: "new job", cancelled: "new job" },
  reject_if_failed: { succeeded: "new job", failed: "reject", expired: "new job", cancelled: "new job" },
  reject_always: { succeeded: "reject", failed: "reject", expired: "reject", cancelled: "reject" },
  reject_if_succeeded: { succeeded: "reject", failed: "new job", expired: "new job", cancelled: "new job" },
};

const CASES = POLICIES.flatMap((policy) =>
  TERMINAL_STATES.map((state) => ({ policy, state, expected: MATRIX[policy][state] })),
);

describe("duplicate policy after a terminal job", () => {
  it.each(CASES)("$policy after $state: $expected", async ({ policy, state, expected }) => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const work = { task: "charge", payload: { order: 42 }, idempotency_key: key };
      const old = await jobIn(c, state, work);
      expect(await keyRow(c, key)).toMatchObject({ job_id: old, finished_state: state });

      if (expected === "new job") {
        const r = await enqueue(c, { ...work, duplicate_policy: policy });
        expect(r.deduplicated).toBe(false);
        expect(r.job_id).not.toBe(old);
        expect(await jobRow(c, r.job_id)).toMatchObject({ state: "enqueued", idempotency_key: key, task: "charge" });
        // The new job takes the key over; the old one is untouched.
        expect(await keyRow(c, key)).toMatchObject({ job_id: r.job_id, finished_state: null, finished_at: null });
        expect((await jobRow(c, old)).state).toBe(state);
      } else {
        const error = await expectSqlError(
          underSavepoint(c, () => enqueue(c, { ...work, duplicate_policy: policy })),
          {
            code: "IQ409",
            detail: { key, existing_job_id: Number(old), existing_state: state, policy },
          },
        );
        expect(error.message).toContain(key);
        expect(error.message).toContain(old);
        expect(error.message).toContain(state);
        expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = $1", [key])).toBe(1);
        expect(await keyRow(c, key)).toMatchObject({ job_id: old, finished_state: state });
      }
    });
  });

  it("the policy of the new call decides, not the policy the old job was enqueued with", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "succeeded", { task: "t", idempotency_key: key, duplicate_policy: "reject_always" });
      const r = await enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "allow_after_failed" });
      expect(r.job_id).not.toBe(old);
    });
  });

  it("IQ409 and IQ422 quote a key's newline and terminal escape escaped (no forged log line, no terminal control), DETAIL has it whole", async () => {
    await inRollback(db.pool, async (c) => {
      const key = `${unique("k")}"\nidemq: job 1 ok\u001b[2J\u009b\\`;
      const old = await jobIn(c, "succeeded", { task: "t", idempotency_key: key, duplicate_policy: "reject_if_succeeded" });
      // Control characters escaped, quotes and backslashes as they are.
      const escaped = key.replace("\n", "\\n").replace("\u001b", "\\u001b").replace("\u009b", "\\u009b");
      expect(escaped).toContain("\\n");
      const rejected = await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_if_succeeded" })),
        { code: "IQ409", message: `idempotency key "${escaped}" was used by job ${old}`, detail: { key } },
      );
      expect(rejected.message).not.toMatch(/[\n\u001b\u009b]/);
      const active = await enqueue(c, { task: "t2", idempotency_key: `${key}-active` });
      const conflict = await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "other", idempotency_key: `${key}-active` })),
        { code: "IQ422", message: `idempotency key "${escaped}-active" is held by active job ${active.job_id}`, detail: { key: `${key}-active` } },
      );
      expect(conflict.message).not.toMatch(/[\n\u001b\u009b]/);
    });
  });

  it("the latest job decides: a key taken over by a new job that then fails follows that failure", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const first = await jobIn(c, "succeeded", { task: "t", idempotency_key: key });
      const second = await jobIn(c, "failed", { task: "t", idempotency_key: key });
      expect(second).not.toBe(first);
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_if_failed" })),
        { code: "IQ409", detail: { key, existing_job_id: Number(second), existing_state: "failed" } },
      );
      const third = await enqueue(c, { task: "t", idempotency_key: key, duplicate_policy: "reject_if_succeeded" });
      expect(third.deduplicated).toBe(false);
    });
  });

  it("the default policy is allow_after_failed: a new job after a failure", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const old = await jobIn(c, "failed", { task: "t", idempotency_key: key });
      const r = await enqueue(c, { task: "t", idempotency_key: key });
      expect(r).toEqual({ job_id: expect.any(String), deduplicated: false });
      expect(r.job_id).not.toBe(old);
    });
  });
});

describe("a key held by an active job", () => {
  const ACTIVE_CASES = ACTIVE_STATES.flatMap((state) => POLICIES.map((policy) => ({ state, policy })));

  it.each(ACTIVE_CASES)("$state job: $policy deduplicates", async ({ state, policy }) => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const work = { task: "charge", payload: { order: 7 }, idempotency_key: key };
      const existing = await jobIn(c, state, work);
      const jobsBefore = await count(c, "SELECT 1 FROM idemq.jobs");
      const r = await enqueue(c, { ...work, duplicate_policy: policy });
      expect(r).toEqual({ job_id: existing, deduplicated: true });
      expect(await count(c, "SELECT 1 FROM idemq.jobs")).toBe(jobsBefore);
      expect((await jobRow(c, existing)).state).toBe(state);
      expect(await keyRow(c, key)).toMatchObject({ job_id: existing, finished_state: null });
    });
  });

  it.each(ACTIVE_STATES)("%s job: a different task with the same key raises IQ422", async (state) => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const existing = await jobIn(c, state, { task: "charge", payload: { order: 7 }, idempotency_key: key });
      const error = await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "refund", payload: { order: 7 }, idempotency_key: key })),
        { code: "IQ422", detail: { key, existing_job_id: Number(existing) } },
      );
      expect(error.message).toContain(key);
      expect(await count(c, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = $1", [key])).toBe(1);
    });
  });

  it.each(ACTIVE_STATES)("%s job: a different payload with the same key raises IQ422", async (state) => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const existing = await jobIn(c, state, { task: "charge", payload: { order: 7 }, idempotency_key: key });
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "charge", payload: { order: 8 }, idempotency_key: key })),
        { code: "IQ422", detail: { key, existing_job_id: Number(existing) } },
      );
      // An omitted payload is {} and differs too.
      await expectSqlError(
        underSavepoint(c, () => enqueue(c, { task: "charge", idempotency_key: key })),
        { code: "IQ422", detail: { key, existing_job_id: Number(existing) } },
      );
    });
  });

  it("IQ422 applies whatever the policy, while the job is active", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const existing = await jobIn(c, "enqueued", { task: "charge", payload: { order: 7 }, idempotency_key: key });
      for (const policy of POLICIES) {
        await expectSqlError(
          underSavepoint(c, () =>
            enqueue(c, { task: "charge", payload: { order: 9 }, idempotency_key: key, duplicate_policy: policy }),
          ),
          { code: "IQ422", detail: { key, existing_job_id: Number(existing) } },
        );
      }
    });
  });
});

describe("different work once the key's job is terminal: the policy decides", () => {
  const DIFFERENT_WORK_CASES = CASES.map((c) => ({ ...c, expected: c.expected === "reject" ? "IQ409" : "new job" }));

  it.each(DIFFERENT_WORK_CASES)(
    "$policy after $state with a different payload: $expected",
    async ({ policy, state, expected }) => {
      await inRollback(db.pool, async (c) => {
        const key = unique("k");
        const old = await jobIn(c, state, { task: "charge", payload: { order: 1 }, idempotency_key: key });
        const again = { task: "refund", payload: { order: 2 }, idempotency_key: key, duplicate_policy: policy };
        if (expected === "IQ409") {
          await expectSqlError(underSavepoint(c, () => enqueue(c, again)), {
            code: "IQ409",
            detail: { key, existing_job_id: Number(old), existing_state: state, policy },
          });
        } else {
          const r = await enqueue(c, again);
          expect(r.deduplicated).toBe(false);
          expect(await jobRow(c, r.job_id)).toMatchObject({ task: "refund", payload: { order: 2 }, state: "enqueued" });
          // The key now names the new work: the old work is what conflicts now.
          await expectSqlError(
            underSavepoint(c, () => enqueue(c, { task: "charge", payload: { order: 1 }, idempotency_key: key })),
            { code: "IQ422", detail: { key, existing_job_id: Number(r.job_id) } },
          );
        }
      });
    },
  );
});

describe("payloads compare as jsonb", () => {
  it("key order and whitespace differences are the same work", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const first = await enqueue(c, {
        task: "t",
        payloadText: '{"a": 1, "b": {"x": [1, 2, "s"], "y": null}}',
        idempotency_key: key,
      });
      const again = await enqueue(c, {
        task: "t",
        payloadText: '{  "b":{"y":null,   "x":[1,2,"s"]},"a":1}',
        idempotency_key: key,
      });
      expect(again).toEqual({ job_id: first.job_id, deduplicated: true });
    });
  });

  it("a duplicated object field (the last one wins in jsonb) is the same work as the object it stands for", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const first = await enqueue(c, { task: "t", payloadText: '{"a": 2}', idempotency_key: key });
      const again = await enqueue(c, { task: "t", payloadText: '{"a": 1, "a": 2}', idempotency_key: key });
      expect(again).toEqual({ job_id: first.job_id, deduplicated: true });
    });
  });

  it("numbers equal as jsonb (1 and 1.0, 100 and 1e2) are the same work", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const { rows } = await c.query(`SELECT '{"n": 1, "m": 100}'::jsonb = '{"n": 1.0, "m": 1e2}'::jsonb AS equal`);
      expect(rows[0].equal).toBe(true);
      const first = await enqueue(c, { task: "t", payloadText: '{"n": 1, "m": 100}', idempotency_key: key });
      const again = await enqueue(c, { task: "t", payloadText: '{"n": 1.0, "m": 1e2}', idempotency_key: key });
      expect(again).toEqual({ job_id: first.job_id, deduplicated: true });
    });
  });

  it("array order and value types do matter: [1, 2] vs [2, 1] and 1 vs \"1\" conflict", async () => {
    await inRollback(db.pool, async (c) => {
      const key = unique("k");
      const first = await enqueue(c, { task: "t", payload: { a: [1, 2], b: 1 }, idempotency_key: key });
      for (const payload of [{ a: [2, 1], b: 1 }, { a: [1, 2], b: "1" }]) {
        await expectSqlError(underSavepoint(c, () => enqueue(c, { task: "t", payload, idempotency_key: key })), {
          code: "IQ422",
          detail: { key, existing_job_id: Number(first.job_id) },
        });
      }
    });
  });
});
