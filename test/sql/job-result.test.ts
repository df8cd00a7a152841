// idemq.job_result: a job's outcome, and with notify => true the NOTIFY
// idemq_results its finish sends, heard on another connection; no NOTIFY
// for a job nobody marked; a mark survives a retention of 0.
import pg from "pg";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";
import { makeJob, stateOf, unique } from "../helpers/jobs.ts";
import { claimJobRow } from "../helpers/work.ts";
import { RESULTS_CHANNEL } from "../../src/contract.ts";

const db = useTestDatabase();

interface Outcome {
  state: string;
  result: unknown;
  last_error: { class?: string; message?: string } | null;
  finished_at: Date | null;
}

async function outcome(id: string, notify = false): Promise<Outcome | undefined> {
  const { rows } = await db.pool.query<Outcome>("SELECT * FROM idemq.job_result(job_id => $1, notify => $2)", [id, notify]);
  return rows[0];
}

async function finish(id: string, result: unknown): Promise<void> {
  const job = await claimJobRow(db.pool, id);
  await db.pool.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => $3::jsonb, lease_token => $4)", [
    id,
    job.attempt,
    JSON.stringify(result),
    job.lease_token,
  ]);
}

/** A LISTEN idemq_results connection of its own, collecting payloads. */
let listener: pg.Client;
let heard: string[];

beforeEach(async () => {
  listener = new pg.Client({ connectionString: db.url });
  await listener.connect();
  heard = [];
  listener.on("notification", (n) => {
    if (n.channel === RESULTS_CHANNEL) heard.push(n.payload ?? "");
  });
  // The channel's TypeScript name: what the SQL notifies on is what Client.result listens to.
  await listener.query(`LISTEN ${RESULTS_CHANNEL}`);
});

afterEach(async () => {
  await listener.end();
});

/** Waits until the listener heard `payload`: a sentinel sent after a commit arrives after that commit's NOTIFYs. */
async function heardUpTo(sentinel: string): Promise<string[]> {
  await db.pool.query("SELECT pg_notify('idemq_results', $1)", [sentinel]);
  const deadline = Date.now() + 10_000;
  while (!heard.includes(sentinel)) {
    if (Date.now() > deadline) throw new Error(`sentinel ${sentinel} not heard`);
    await new Promise((r) => setTimeout(r, 5));
  }
  return heard.filter((p) => p !== sentinel);
}

describe("job_result", () => {
  it("says an active job's state with no result, a succeeded job's result, a failed job's latest error; no row for no job", async () => {
    const id = await makeJob(db.pool, { queue: unique("q") });
    expect(await outcome(id)).toMatchObject({ state: "enqueued", result: null, last_error: null, finished_at: null });
    await finish(id, { total: 3 });
    expect(await outcome(id)).toMatchObject({ state: "succeeded", result: { total: 3 }, last_error: null });
    const bad = await makeJob(db.pool, { queue: unique("q") });
    const job = await claimJobRow(db.pool, bad);
    await db.pool.query("SELECT idemq.fail(job_id => $1, attempt => $2, error => $3::jsonb, retryable => false, lease_token => $4)", [
      bad,
      job.attempt,
      JSON.stringify({ class: "Boom", message: "card declined" }),
      job.lease_token,
    ]);
    expect(await outcome(bad)).toMatchObject({ state: "failed", result: null, last_error: { class: "Boom", message: "card declined" } });
    expect(await outcome("999999999")).toBeUndefined();
  });

  it("notify => true: the finish NOTIFYs idemq_results with the id on the listener's connection; a job not marked sends none", async () => {
    const watched = await makeJob(db.pool, { queue: unique("q") });
    const other = await makeJob(db.pool, { queue: unique("q") });
    expect((await outcome(watched, true))?.state).toBe("enqueued");
    await finish(other, 1);
    await finish(watched, 2);
    expect(await heardUpTo(unique("sentinel"))).toEqual([watched]);
    expect(await outcome(watched)).toMatchObject({ state: "succeeded", result: 2 });
  });

  it("notifies for any way a job ends: a cancel", async () => {
    const id = await makeJob(db.pool, { queue: unique("q") });
    await outcome(id, true);
    await db.pool.query("SELECT idemq.cancel(job_id => $1)", [id]);
    expect(await heardUpTo(unique("sentinel"))).toEqual([id]);
    expect((await outcome(id))?.state).toBe("cancelled");
  });

  it("a marked job is kept by a succeeded retention of 0 for its reader (apply_retention deletes it later)", async () => {
    const queue = unique("zero");
    await db.pool.query("SELECT idemq.set_retention(state => 'succeeded', keep => '0', queue => $1)", [queue]);
    const kept = await makeJob(db.pool, { queue });
    const gone = await makeJob(db.pool, { queue });
    await outcome(kept, true);
    await finish(kept, "mine");
    await finish(gone, "nobody's");
    expect(await outcome(kept)).toMatchObject({ state: "succeeded", result: "mine" });
    expect(await stateOf(db.pool, gone)).toBeUndefined();
    expect(await heardUpTo(unique("sentinel"))).toEqual([kept]);
  });

  it("a mark on a finished job writes nothing and returns its outcome", async () => {
    const id = await makeJob(db.pool, { queue: unique("q") });
    await finish(id, "x");
    expect(await outcome(id, true)).toMatchObject({ state: "succeeded", result: "x" });
    const { rows } = await db.pool.query("SELECT result_watched FROM idemq.jobs WHERE id = $1", [id]);
    expect(rows).toEqual([{ result_watched: false }]);
  });

  it("refuses a NULL job_id or notify with 22004 naming it", async () => {
    await expectSqlError(db.pool.query("SELECT * FROM idemq.job_result(job_id => NULL)"), { code: "22004", message: /job_id must not be NULL/ });
    await expectSqlError(db.pool.query("SELECT * FROM idemq.job_result(job_id => 1, notify => NULL)"), {
      code: "22004",
      message: /notify must not be NULL/,
    });
  });
});
