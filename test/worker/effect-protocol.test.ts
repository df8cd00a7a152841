// ctx.effect, status by status, with the claim records set up directly in
// SQL (a stale claim is one whose claimed_at is moved an hour back):
//   done      -> the stored result, fn not called
//   reclaimed -> reconcile(key) first; its answer is recorded, or, when it
//                returns undefined, fn(key) runs again with the same key
//   fn throws -> effect_release (definite failure), or the claim is kept
//                when definiteFailure says the outcome is unknown
//   claim lost -> effect_done raises EffectClaimLostError: the attempt fails
//                like any error (the job's own lease is intact)
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Client, type Job } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { startTestWorker, stopWorkers, type TestWorker } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
let w: TestWorker;
/** Calls of fn and reconcile, by effect key. */
const calls: Array<{ what: "fn" | "reconcile"; key: string }> = [];

class Unreachable extends Error {}

type Payload = { key: string; reconcileAnswer?: unknown; fail?: "definite" | "unknown"; stolen?: true };

beforeAll(async () => {
  client = new Client({ pool: db.pool });
  w = await startTestWorker(db.url, {
    charge: {
      maxAttempts: 1,
      run: (p: Payload, ctx) =>
        ctx.effect(
          p.key,
          async (key) => {
            calls.push({ what: "fn", key });
            // Another owner took the claim while the call ran: effect_done will refuse.
            if (p.stolen) await db.pool.query("UPDATE idemq.effects SET owner = 'thief' WHERE key = $1", [key]);
            if (p.fail !== undefined) throw new Unreachable("the payment API did not answer");
            return { chargeId: `ch-${key}` };
          },
          {
            staleAfter: "1 minute",
            ...(p.reconcileAnswer === undefined
              ? {}
              : {
                  reconcile: async (key: string) => {
                    calls.push({ what: "reconcile", key });
                    return p.reconcileAnswer === null ? undefined : p.reconcileAnswer;
                  },
                }),
            definiteFailure: () => p.fail !== "unknown",
          },
        ),
    },
  });
});
afterEach(() => {
  expect(w.of("worker:error")).toEqual([]);
});
afterAll(async () => {
  await stopWorkers();
});

async function run(payload: Payload): Promise<Job> {
  const { jobId } = await client.enqueue("charge", payload);
  return waitFor(
    async () => {
      const job = await client.getJob(jobId);
      return job?.state === "succeeded" || job?.state === "failed" ? job : undefined;
    },
    { what: `job ${jobId} to finish` },
  );
}

/** A claim by a dead owner, gone stale an hour ago. */
async function staleClaim(key: string): Promise<void> {
  await db.pool.query("SELECT * FROM idemq.effect_claim(key => $1, owner => 'dead-worker')", [key]);
  await db.pool.query("UPDATE idemq.effects SET claimed_at = now() - interval '1 hour' WHERE key = $1", [key]);
}

async function effect(key: string) {
  const { rows } = await db.pool.query("SELECT status, owner, reclaims, result FROM idemq.effects WHERE key = $1", [key]);
  return rows[0];
}

const callsFor = (key: string) => calls.filter((c) => c.key === key).map((c) => c.what);

describe("ctx.effect", () => {
  it("claimed: calls fn once with the key and records its result", async () => {
    const job = await run({ key: "charge:1" });
    expect(job).toMatchObject({ state: "succeeded", result: { chargeId: "ch-charge:1" } });
    expect(callsFor("charge:1")).toEqual(["fn"]);
    expect(await effect("charge:1")).toMatchObject({ status: "done", reclaims: 0, result: { chargeId: "ch-charge:1" } });
  });

  it("done: returns the stored result without calling fn", async () => {
    await db.pool.query("SELECT * FROM idemq.effect_claim(key => 'charge:2', owner => 'earlier')");
    await db.pool.query(`SELECT idemq.effect_done(key => 'charge:2', owner => 'earlier', result => '{"chargeId": "stored"}')`);
    const job = await run({ key: "charge:2" });
    expect(job).toMatchObject({ state: "succeeded", result: { chargeId: "stored" } });
    expect(callsFor("charge:2")).toEqual([]);
  });

  it("reclaimed with reconcile finding the earlier result: records it, fn is not called", async () => {
    await staleClaim("charge:3");
    const job = await run({ key: "charge:3", reconcileAnswer: { chargeId: "found-upstream" } });
    expect(job).toMatchObject({ state: "succeeded", result: { chargeId: "found-upstream" } });
    expect(callsFor("charge:3")).toEqual(["reconcile"]);
    expect(await effect("charge:3")).toMatchObject({ status: "done", reclaims: 1, result: { chargeId: "found-upstream" } });
  });

  it("reclaimed with reconcile finding nothing: fn runs again with the same key", async () => {
    await staleClaim("charge:4");
    const job = await run({ key: "charge:4", reconcileAnswer: null });
    expect(job).toMatchObject({ state: "succeeded", result: { chargeId: "ch-charge:4" } });
    expect(callsFor("charge:4")).toEqual(["reconcile", "fn"]);
    expect(await effect("charge:4")).toMatchObject({ status: "done", reclaims: 1 });
  });

  it("reclaimed without reconcile: fn runs again with the same key", async () => {
    await staleClaim("charge:5");
    const job = await run({ key: "charge:5" });
    expect(job).toMatchObject({ state: "succeeded", result: { chargeId: "ch-charge:5" } });
    expect(callsFor("charge:5")).toEqual(["fn"]);
    expect((await effect("charge:5"))!.owner).toContain(`job:${job.id}:1@`);
  });

  it("fn fails definitely: the claim is released, so the next attempt claims afresh", async () => {
    const job = await run({ key: "charge:6", fail: "definite" });
    expect(job).toMatchObject({ state: "failed" });
    expect(job.errors[0]).toMatchObject({ class: "Unreachable", message: "the payment API did not answer" });
    expect(await effect("charge:6")).toBeUndefined();
  });

  it("fn fails with an unknown outcome: the claim is kept, to be reclaimed once stale", async () => {
    const job = await run({ key: "charge:7", fail: "unknown" });
    expect(job).toMatchObject({ state: "failed" });
    expect(await effect("charge:7")).toMatchObject({ status: "claimed", reclaims: 0 });
    expect((await effect("charge:7"))!.owner).toContain(`job:${job.id}:1@`);
  });

  it("claim taken by another owner before effect_done: EffectClaimLostError fails the attempt, not job:lease-lost", async () => {
    const job = await run({ key: "charge:8", stolen: true });
    expect(job).toMatchObject({ state: "failed" });
    expect(job.errors[0]).toMatchObject({ class: "EffectClaimLostError" });
    expect(w.of("job:lease-lost").filter((e) => e.jobId === job.id)).toEqual([]);
    expect(w.of("job:failed").filter((e) => e.jobId === job.id)).toHaveLength(1);
    expect(await effect("charge:8")).toMatchObject({ status: "claimed", owner: "thief" });
  });
});
