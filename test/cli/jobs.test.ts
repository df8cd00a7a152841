// `idemq jobs` (list), `jobs show` (the attempt timeline), `jobs retry`,
// `jobs cancel` and `jobs reschedule`, run as real subprocesses: filters,
// table and --json, per-id results with the exit code of the first failure,
// and bad input that changes nothing; and the bulk actions (jobs
// retry|cancel|delete|run-now with filter flags): the count, the question,
// --yes, --dry-run, batches, and bad filters refused before connecting.
import { describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, jobRow, stateOf, states, unique } from "../helpers/jobs.ts";
import { claimJob, jobIn } from "../helpers/work.ts";

const db = useTestDatabase();

function jobs(args: string[]): Promise<CliResult> {
  return runCli(["jobs", ...args, "--database-url", db.url]);
}

function errorLines(result: CliResult): string[] {
  expect(result.stderr).not.toMatch(/^\s+at /m);
  const lines = result.stderr.trimEnd().split("\n");
  for (const line of lines) expect(line).toMatch(/^idemq: /);
  return lines;
}

/** Every column of idemq.jobs, to prove an operation left a row alone. */
async function snapshot(id: string): Promise<unknown> {
  const { rows } = await db.pool.query("SELECT * FROM idemq.jobs WHERE id = $1", [id]);
  return rows[0];
}

describe("idemq jobs (list)", () => {
  it("--json lists the jobs matching every filter, newest first, up to --limit", async () => {
    const queue = unique("q");
    const a = await jobIn(db.pool, "failed", { queue, task: "import" });
    const b = await jobIn(db.pool, "failed", { queue, task: "import", idempotency_key: unique("key") });
    const c = await jobIn(db.pool, "cancelled", { queue, task: "import" });
    await jobIn(db.pool, "failed", { queue, task: "other" });
    await jobIn(db.pool, "failed", { task: "import" }); // another queue

    const both = await jobs(["--queue", queue, "--task", "import", "--state", "failed,cancelled", "--json"]);
    expect(both).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(both.stdout).jobs.map((j: { id: string }) => j.id)).toEqual([c, b, a]);

    const limited = JSON.parse((await jobs(["--queue", queue, "--task", "import", "--limit", "2", "--json"])).stdout).jobs;
    expect(limited.map((j: { id: string }) => j.id)).toEqual([c, b]);

    const byKey = JSON.parse((await jobs(["--key", (await jobRow(db.pool, b)).idempotency_key!, "--json"])).stdout).jobs;
    expect(byKey).toHaveLength(1);
    expect(byKey[0]).toMatchObject({ id: b, state: "failed", queue, task: "import", attempt: 1, maxAttempts: 10 });
  });

  it("says when it stopped at --limit and how many more match (--json: limit, more, moreExact)", async () => {
    const queue = unique("q");
    const ids = [];
    for (let i = 0; i < 5; i++) ids.push(await jobIn(db.pool, "enqueued", { queue, task: "many" }));
    const limited = await jobs(["--queue", queue, "--limit", "2", "--json"]);
    expect(limited).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(limited.stdout)).toEqual({
      jobs: [expect.objectContaining({ id: ids[4] }), expect.objectContaining({ id: ids[3] })],
      limit: 2,
      more: 3,
      moreExact: true,
    });
    const human = await jobs(["--queue", queue, "--limit", "2"]);
    expect(human).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = human.stdout.trimEnd().split("\n");
    expect(lines).toHaveLength(4);
    expect(lines[3]).toBe("Stopped at --limit 2: 3 more match; raise --limit or narrow the filters.");
    // Exactly at the limit: nothing more, and no line says otherwise.
    const all = await jobs(["--queue", queue, "--limit", "5", "--json"]);
    expect(JSON.parse(all.stdout)).toMatchObject({ limit: 5, more: 0, moreExact: true });
    expect((await jobs(["--queue", queue, "--limit", "5"])).stdout).not.toContain("Stopped at");
  });

  it("counts no further than 10,000 past --limit: 10,000+ more", async () => {
    const queue = unique("q");
    // limit 1 + 10,000 counted + 1 that proves the count stopped.
    await db.pool.query(
      `SELECT idemq.enqueue_many(jobs => (SELECT jsonb_agg(jsonb_build_object('task', 'bulk', 'queue', $1::text)) FROM generate_series(1, 10002)))`,
      [queue],
    );
    const json = JSON.parse((await jobs(["--queue", queue, "--limit", "1", "--json"])).stdout);
    expect(json).toMatchObject({ limit: 1, more: 10000, moreExact: false });
    expect(json.jobs).toHaveLength(1);
    const human = await jobs(["--queue", queue, "--limit", "1"]);
    expect(human.stdout.trimEnd().split("\n").at(-1)).toBe("Stopped at --limit 1: 10,000+ more match; raise --limit or narrow the filters.");
    // One job fewer and the count is exact.
    await db.pool.query("DELETE FROM idemq.jobs WHERE id = (SELECT min(id) FROM idemq.jobs WHERE queue = $1)", [queue]);
    expect(JSON.parse((await jobs(["--queue", queue, "--limit", "1", "--json"])).stdout)).toMatchObject({ more: 10000, moreExact: true });
  });

  it("prints an aligned table with a header, and says when nothing matches", async () => {
    const queue = unique("q");
    const first = await jobIn(db.pool, "enqueued", { queue, task: "short" });
    const second = await jobIn(db.pool, "scheduled", { queue, task: "a_much_longer_task_name", idempotency_key: "k:1" });
    const result = await jobs(["--queue", queue]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatch(/^\s*ID {2}STATE +WAITING FOR {2}QUEUE +TASK +ATTEMPT {2}RUN AT +KEY +CREATED$/);
    // Every column starts at the same offset on every line.
    const start = (line: string, text: string) => line.indexOf(text);
    expect(start(lines[1]!, "scheduled")).toBe(start(lines[0]!, "STATE"));
    expect(start(lines[2]!, "enqueued")).toBe(start(lines[0]!, "STATE"));
    expect(start(lines[2]!, "worker")).toBe(start(lines[0]!, "WAITING FOR"));
    expect(lines[1]!.slice(start(lines[0]!, "WAITING FOR")).split(/\s+/)[0], "scheduled for tomorrow: not waiting for anything but its time").toBe("-");
    expect(start(lines[1]!, "a_much_longer_task_name")).toBe(start(lines[0]!, "TASK"));
    expect(start(lines[2]!, "short")).toBe(start(lines[0]!, "TASK"));
    expect(start(lines[1]!, "k:1")).toBe(start(lines[0]!, "KEY"));
    expect(lines[1]).toMatch(new RegExp(`^\\s*${second}\\b`));
    expect(lines[2]).toMatch(new RegExp(`^\\s*${first}\\b`));
    // run_at is 24 h after the enqueue; the CLI renders it a moment later, rounded to the second.
    expect(lines[1]).toMatch(/in (23h 59m|24h)/);

    const none = await jobs(["--queue", unique("empty")]);
    expect(none).toMatchObject({ code: EXIT.OK, stdout: "No jobs match.\n", stderr: "" });
  });

  it("an unknown state, a bad limit or an unknown subcommand: one line, exit 2", async () => {
    const state = await jobs(["--state", "failed,done"]);
    expect(state.code).toBe(EXIT.USAGE);
    expect(errorLines(state)).toEqual([expect.stringContaining('unknown state "done"; use one of scheduled, enqueued, processing')]);
    const limit = await jobs(["--limit", "0"]);
    expect(limit.code).toBe(EXIT.USAGE);
    expect(errorLines(limit)[0]).toContain("--limit must be an integer from 1");
    const sub = await jobs(["frobnicate"]);
    expect(sub.code).toBe(EXIT.USAGE);
    expect(errorLines(sub)).toEqual([expect.stringContaining("unknown command 'jobs frobnicate'; use jobs show, retry, cancel, delete, run-now or reschedule")]);
  });

  it("tells a job waiting for its concurrency key from one waiting for its parents, in the table, --json and jobs show", async () => {
    const queue = unique("cli-keys");
    const key = unique("customer");
    const parent = (await enqueue(db.pool, { queue: unique("cli-parents") })).job_id;
    const admitted = (await enqueue(db.pool, { queue, concurrency_key: key })).job_id;
    const keyed = (await enqueue(db.pool, { queue, concurrency_key: key })).job_id;
    const child = (await enqueue(db.pool, { queue, after: [parent] })).job_id;
    const table = await jobs(["--queue", queue]);
    expect(table.code).toBe(EXIT.OK);
    const rowOf = (id: string): string => table.stdout.split("\n").find((line) => line.trimStart().startsWith(`${id} `)) ?? "";
    expect(rowOf(keyed)).toMatch(/ awaiting +key /);
    expect(rowOf(child)).toMatch(/ awaiting +parents /);
    expect(rowOf(admitted)).toMatch(/ enqueued +worker /);
    const listed = JSON.parse((await jobs(["--queue", queue, "--json"])).stdout).jobs as { id: string; waitingFor: string | null; concurrencyKey: string | null }[];
    expect(listed.map((j) => [j.id, j.waitingFor, j.concurrencyKey])).toEqual([
      [child, "parents", null],
      [keyed, "concurrency_key", key],
      [admitted, null, key],
    ]);
    const shown = await jobs(["show", keyed]);
    expect(shown.stdout).toMatch(/waiting +for a place of its concurrency key/);
    expect(shown.stdout).toContain(key);
  });

  it("says why a runnable job is not running: paused, held, concurrency, rate or worker, in the table, --json and jobs show", async () => {
    const [paused, held, full, rated, free] = ["paused", "held", "full", "rated", "free"].map((t) => unique(`cli-${t}`)) as [string, string, string, string, string];
    const queue = unique("cli-why");
    const ids: Record<string, string> = {};
    for (const t of [paused, held, full, rated, free]) ids[t] = (await enqueue(db.pool, { task: t, queue })).job_id;
    await db.pool.query("SELECT idemq.pause(task => $1)", [paused]);
    for (const t of [held, full, rated]) ids[`${t}:other`] = (await enqueue(db.pool, { task: t, queue })).job_id;
    await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 1)", [full]);
    await db.pool.query("SELECT idemq.set_limit(task => $1, rate => 1, per => '1 hour')", [rated]);
    for (const t of [held, full, rated]) {
      const { rows } = await db.pool.query("SELECT job_id, attempt FROM idemq.claim(worker_id => 'w', tasks => $1)", [[t]]);
      expect(rows.map((r) => r.job_id)).toEqual([ids[t]]);
      if (t === held) {
        await db.pool.query("SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'task', until => now() + interval '1 hour')", [rows[0].job_id, rows[0].attempt]);
      }
    }
    const expected: [string, string][] = [
      [ids[paused]!, "paused"],
      [ids[`${held}:other`]!, "held"],
      [ids[`${full}:other`]!, "concurrency"],
      [ids[`${rated}:other`]!, "rate"],
      [ids[free]!, "worker"],
    ];

    const table = await jobs(["--queue", queue]);
    expect(table).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = table.stdout.trimEnd().split("\n");
    const cellOf = (id: string): string | undefined =>
      lines.find((line) => line.trimStart().startsWith(`${id} `))?.slice(lines[0]!.indexOf("WAITING FOR")).split(/\s+/)[0];
    expect(expected.map(([id]) => [id, cellOf(id)])).toEqual(expected);

    const listed = JSON.parse((await jobs(["--queue", queue, "--json"])).stdout).jobs as { id: string; waitingFor: string | null }[];
    const jsonOf = new Map(listed.map((j) => [j.id, j.waitingFor]));
    expect(expected.map(([id]) => [id, jsonOf.get(id)])).toEqual(expected.map(([id, w]) => [id, w === "worker" ? null : w]));

    expect((await jobs(["show", ids[`${full}:other`]!])).stdout).toMatch(/waiting +for a free slot: its queue's or task's concurrency limit has every slot held/);
    expect((await jobs(["show", ids[`${rated}:other`]!])).stdout).toMatch(/waiting +for its queue's or task's rate: no start left in this period/);
    expect((await jobs(["show", ids[paused]!])).stdout).toMatch(/waiting +for its queue or task to be resumed \(paused\)/);
    expect((await jobs(["show", ids[`${held}:other`]!])).stdout).toMatch(/waiting +for its queue's or task's hold to end/);
    expect((await jobs(["show", ids[free]!])).stdout).toMatch(/waiting +for a worker \(no pause, hold or limit/);
    expect((await jobs(["show", ids[held]!])).stdout, "the held job itself is scheduled for the hold's end").not.toMatch(/waiting +for/);
  });
});

describe("idemq jobs show", () => {
  it("--json: the job and a timeline of every attempt (failed, lost lease, snoozed, running)", async () => {
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "supplier_import", queue, payload: { supplier: 9 }, max_attempts: 5 });
    // Attempt 1 fails.
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'worker-a', queues => ARRAY[$1])", [queue]);
    await db.pool.query(
      `SELECT idemq.fail(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "TimeoutError", "message": "supplier timed out"}', retry_at => now())`,
      [id],
    );
    // Attempt 2 loses its lease and is rescued.
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'worker-b', queues => ARRAY[$1])", [queue]);
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [id]);
    await db.pool.query("SELECT idemq.rescue()");
    // Attempt 3 is snoozed (nothing recorded); attempt 4 is running.
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'worker-c', queues => ARRAY[$1])", [queue]);
    await db.pool.query("SELECT idemq.snooze(job_id => $1, attempt => 3, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), run_at => now())", [id]);
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'worker-d', queues => ARRAY[$1])", [queue]);
    const { rows } = await db.pool.query<{ locked_at: Date }>("SELECT locked_at FROM idemq.jobs WHERE id = $1", [id]);

    const result = await jobs(["show", id, "--json"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const shown = JSON.parse(result.stdout);
    expect(shown).toMatchObject({ id, task: "supplier_import", state: "processing", attempt: 4, maxAttempts: 5, lockedBy: "worker-d" });
    expect(shown.timeline).toEqual([
      {
        attempt: 1,
        claimedAt: expect.any(String),
        worker: "worker-a",
        outcome: "failed",
        endedAt: expect.any(String),
        error: { class: "TimeoutError", message: "supplier timed out" },
      },
      {
        attempt: 2,
        claimedAt: expect.any(String),
        worker: "worker-b",
        outcome: "lease_expired",
        endedAt: expect.any(String),
        error: { class: "LeaseExpired", message: expect.stringContaining("while worker-b held the job") },
      },
      { attempt: 3, claimedAt: null, worker: null, outcome: "snoozed", endedAt: null, error: null },
      { attempt: 4, claimedAt: rows[0]!.locked_at.toISOString(), worker: "worker-d", outcome: "running", endedAt: null, error: null },
    ]);
    for (const entry of shown.timeline.slice(0, 2)) {
      expect(Date.parse(entry.endedAt)).toBeGreaterThanOrEqual(Date.parse(entry.claimedAt));
    }
  });

  it("prints the job and one timeline line per attempt, ending with how it finished", async () => {
    const id = await jobIn(db.pool, "enqueued", { task: "send_invoice", payload: { orderId: 7 }, idempotency_key: unique("invoice") });
    const attempt = await claimJob(db.pool, id);
    await db.pool.query(
      `SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "SmtpError", "message": "421 try later"}', retry_at => now())`,
      [id, attempt],
    );
    const second = await claimJob(db.pool, id);
    await db.pool.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [id, second]);

    const result = await jobs(["show", id]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(new RegExp(`^job ${id} {2}send_invoice {2}\\(queue `));
    expect(lines).toContain("  attempts   2 of 10");
    expect(lines).toContain('  payload    {"orderId":7}');
    const timeline = lines.slice(lines.indexOf("timeline") + 1);
    expect(timeline).toHaveLength(4);
    expect(timeline[0]).toMatch(/^ {2}\S+Z {2}enqueued$/);
    expect(timeline[1]).toMatch(/^ {2}#1 {2}claimed \S+Z by test-worker, failed after \d+s: SmtpError: 421 try later$/);
    expect(timeline[2]).toMatch(/^ {2}#2 {2}claimed \S+Z, succeeded after \d+s$/);
    expect(timeline[3]).toMatch(/^ {2}\S+Z {2}succeeded$/);
  });

  it("counts attempts against the task's own limit that fail() recorded, not the job's default of 10", async () => {
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "capped", queue });
    for (let attempt = 1; attempt <= 3; attempt++) {
      await db.pool.query("UPDATE idemq.jobs SET run_at = now() WHERE id = $1", [id]);
      await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'w', queues => ARRAY[$1])", [queue]);
      await db.pool.query(
        `SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "E", "message": "no"}', max_attempts => 3)`,
        [id, attempt],
      );
    }
    expect(await stateOf(db.pool, id)).toBe("failed");
    const shown = await jobs(["show", id]);
    expect(shown).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(shown.stdout.split("\n")).toContain("  attempts   3 of 3 (the task's limit; the job's own is 10)");
    const json = JSON.parse((await jobs(["show", id, "--json"])).stdout);
    expect(json).toMatchObject({ attempt: 3, maxAttempts: 10, countedAttempts: 3, attemptLimit: 3, retries: [] });
    // The list counts the same way: its ATTEMPT column and each job of its --json.
    const listed = (await jobs(["--queue", queue])).stdout.trimEnd().split("\n");
    expect(listed[1]!.slice(listed[0]!.indexOf("ATTEMPT")).split(/\s+/)[0]).toBe("3/3");
    expect(JSON.parse((await jobs(["--queue", queue, "--json"])).stdout).jobs).toMatchObject([
      { id, attempt: 3, maxAttempts: 10, countedAttempts: 3, attemptLimit: 3 },
    ]);
  });

  it("shows an operator's retries and cancels in the timeline, and counts only the attempts since the retry", async () => {
    const queue = unique("q");
    const { job_id: id } = await enqueue(db.pool, { task: "flaky", queue, max_attempts: 1 });
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'worker-a', queues => ARRAY[$1])", [queue]);
    await db.pool.query(`SELECT idemq.fail(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => '{"class": "E", "message": "first"}')`, [id]);
    expect((await jobs(["retry", id])).code).toBe(EXIT.OK);
    await db.pool.query("SELECT * FROM idemq.claim(worker_id => 'worker-b', queues => ARRAY[$1])", [queue]);
    expect((await jobs(["cancel", id])).code).toBe(EXIT.OK); // while attempt 2 runs
    expect((await jobs(["retry", id])).code).toBe(EXIT.OK);

    const result = await jobs(["show", id]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    expect(lines).toContain("  attempts   0 of 1 (2 claims; 2 not counted: snoozes, hand-backs, attempts before a retry)");
    const timeline = lines.slice(lines.indexOf("timeline") + 1);
    expect(timeline).toEqual([
      expect.stringMatching(/^ {2}\S+Z {2}enqueued$/),
      expect.stringMatching(/^ {2}#1 {2}claimed \S+Z by worker-a, failed after \d+s: E: first$/),
      expect.stringMatching(/^ {2}\S+Z {2}failed$/),
      expect.stringMatching(/^ {2}\S+Z {2}retried by an operator \(fresh attempts\)$/),
      expect.stringMatching(/^ {2}#2 {2}claimed \S+Z by worker-b, cancelled while running after \d+s: Cancelled: cancelled by an operator while this attempt ran$/),
      expect.stringMatching(/^ {2}\S+Z {2}cancelled$/),
      expect.stringMatching(/^ {2}\S+Z {2}retried by an operator \(fresh attempts\)$/),
    ]);
    const json = JSON.parse((await jobs(["show", id, "--json"])).stdout);
    expect(json).toMatchObject({ state: "enqueued", attempt: 2, countedAttempts: 0, attemptLimit: 1 });
    // The list's ATTEMPT column counts only the attempts since the retry too (not 2/1).
    const listed = (await jobs(["--queue", queue])).stdout.trimEnd().split("\n");
    expect(listed[1]!.slice(listed[0]!.indexOf("ATTEMPT")).split(/\s+/)[0]).toBe("0/1");
    expect(JSON.parse((await jobs(["--queue", queue, "--json"])).stdout).jobs).toMatchObject([{ id, countedAttempts: 0, attemptLimit: 1 }]);
    expect(json.retries).toEqual([
      { afterAttempt: 1, previousState: "failed", finishedAt: expect.any(String), retriedAt: expect.any(String) },
      { afterAttempt: 2, previousState: "cancelled", finishedAt: expect.any(String), retriedAt: expect.any(String) },
    ]);
    // The timeline stays one entry per attempt: the retries are not attempts.
    expect(json.timeline.map((e: { attempt: number; outcome: string }) => [e.attempt, e.outcome])).toEqual([
      [1, "failed"],
      [2, "cancelled"],
    ]);
  });

  it("--stack prints each failed attempt's stack trace under it; without it, none", async () => {
    const id = await jobIn(db.pool, "enqueued", { task: "traced" });
    const attempt = await claimJob(db.pool, id);
    const stack = "TypeError: x is undefined\n    at run (tasks.ts:3:9)\n    at step (worker.ts:10:2)";
    await db.pool.query("SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => $3::jsonb)", [
      id,
      attempt,
      JSON.stringify({ class: "TypeError", message: "x is undefined", stack }),
    ]);
    const plain = (await jobs(["show", id])).stdout.trimEnd().split("\n");
    expect(plain.some((line) => line.includes("at run (tasks.ts:3:9)"))).toBe(false);
    const traced = await jobs(["show", id, "--stack"]);
    expect(traced).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = traced.stdout.trimEnd().split("\n");
    const at = lines.findIndex((line) => /^ {2}#1 {2}claimed .*: TypeError: x is undefined$/.test(line));
    expect(at).toBeGreaterThan(0);
    expect(lines.slice(at + 1, at + 4)).toEqual([
      "      TypeError: x is undefined",
      "          at run (tasks.ts:3:9)",
      "          at step (worker.ts:10:2)",
    ]);
    expect(lines.length).toBe(plain.length + 3);
  });

  it("an unknown id: exit 5 (IQ404), one line; a malformed id: exit 2", async () => {
    const missing = await jobs(["show", "999999999"]);
    expect(missing).toMatchObject({ code: EXIT.NOT_FOUND, stdout: "" });
    expect(errorLines(missing)).toEqual(["idemq: no job 999999999 (SQLSTATE IQ404); idemq jobs lists the jobs there are"]);
    const malformed = await jobs(["show", "42abc"]);
    expect(malformed).toMatchObject({ code: EXIT.USAGE, stdout: "" });
    expect(errorLines(malformed)).toEqual([expect.stringContaining('a job id is a positive integer such as 42, not "42abc"')]);
  });
});

describe("idemq jobs retry | cancel | reschedule", () => {
  it("retry --json: each id in turn; the failures are reported, the exit code is the first failure's", async () => {
    const failed = await jobIn(db.pool, "failed");
    const succeeded = await jobIn(db.pool, "succeeded");
    const cancelled = await jobIn(db.pool, "cancelled");
    const before = await snapshot(succeeded);

    const result = await jobs(["retry", failed, succeeded, "999999998", cancelled, "--json"]);
    expect(result.code).toBe(EXIT.INVALID_STATE);
    expect(JSON.parse(result.stdout)).toEqual({
      results: [
        { id: failed, ok: true, state: "enqueued" },
        {
          id: succeeded,
          ok: false,
          error: {
            code: "IQ412",
            message: expect.stringContaining(`retry: job ${succeeded} is succeeded`),
            hint: expect.any(String),
            detail: { jobId: succeeded, state: "succeeded" },
          },
        },
        { id: "999999998", ok: false, error: { code: "IQ404", message: expect.stringContaining("does not exist"), hint: expect.any(String) } },
        { id: cancelled, ok: true, state: "enqueued" },
      ],
    });
    expect(errorLines(result)).toEqual([
      expect.stringMatching(new RegExp(`^idemq: job ${succeeded}: retry: job ${succeeded} is succeeded`)),
      expect.stringMatching(/^idemq: job 999999998: retry: job 999999998 does not exist/),
    ]);
    expect(await stateOf(db.pool, failed)).toBe("enqueued");
    expect(await stateOf(db.pool, cancelled)).toBe("enqueued");
    expect(await snapshot(succeeded)).toEqual(before);
  });

  it("retry of a keyed job whose key another active job holds: exit 3 (IQ409), naming that job", async () => {
    const key = unique("key");
    const old = await jobIn(db.pool, "failed", { idempotency_key: key, task: "t", payload: { n: 1 } });
    const holder = await jobIn(db.pool, "enqueued", { idempotency_key: key, task: "t", payload: { n: 1 } });
    const result = await jobs(["retry", old]);
    expect(result.code).toBe(EXIT.REJECTED);
    expect(errorLines(result)).toEqual([expect.stringContaining(`(key ${key} is held by job ${holder})`)]);
    expect(await stateOf(db.pool, old)).toBe("failed");
  });

  it("cancel: active jobs become cancelled; the human answer lists them; a finished one is exit 6", async () => {
    const enqueued = await jobIn(db.pool, "enqueued");
    const processing = await jobIn(db.pool, "processing");
    const ok = await jobs(["cancel", enqueued, processing]);
    expect(ok).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(ok.stdout).toBe(`job ${enqueued}: cancelled, now cancelled\njob ${processing}: cancelled, now cancelled\n`);
    expect(await stateOf(db.pool, processing)).toBe("cancelled");

    const again = await jobs(["cancel", enqueued, "--json"]);
    expect(again.code).toBe(EXIT.INVALID_STATE);
    expect(JSON.parse(again.stdout).results).toEqual([
      { id: enqueued, ok: false, error: expect.objectContaining({ code: "IQ412", message: expect.stringContaining("already finished") }) },
    ]);
  });

  it("reschedule --delay uses the database clock; --run-at sets the time; a running job is exit 6", async () => {
    const a = await jobIn(db.pool, "enqueued");
    const delayed = await jobs(["reschedule", a, "--delay", "10m", "--json"]);
    expect(delayed).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(delayed.stdout)).toEqual({ results: [{ id: a, ok: true, state: "scheduled" }] });
    const { rows } = await db.pool.query<{ ahead_s: number }>(
      "SELECT extract(epoch FROM run_at - now())::float8 AS ahead_s FROM idemq.jobs WHERE id = $1",
      [a],
    );
    expect(rows[0]!.ahead_s).toBeGreaterThan(590);
    expect(rows[0]!.ahead_s).toBeLessThanOrEqual(600);

    const b = await jobIn(db.pool, "scheduled");
    const at = await jobs(["reschedule", b, "--run-at", "2000-01-01T00:00:00Z", "--json"]);
    expect(JSON.parse(at.stdout)).toEqual({ results: [{ id: b, ok: true, state: "enqueued" }] });
    expect((await jobRow(db.pool, b)).run_at.toISOString()).toBe("2000-01-01T00:00:00.000Z");

    const running = await jobIn(db.pool, "processing");
    const refused = await jobs(["reschedule", running, "--delay", "1m"]);
    expect(refused.code).toBe(EXIT.INVALID_STATE);
    expect(errorLines(refused)).toHaveLength(1);
  });

  it("bad input changes nothing: a malformed id among good ones, no time, a bad duration (exit 2)", async () => {
    const a = await jobIn(db.pool, "failed");
    const before = await snapshot(a);
    const cases: [string[], string][] = [
      [["retry", a, "x1"], 'a job id is a positive integer such as 42, not "x1"'],
      [["cancel"], "give job ids, filter flags (--state, --queue, --task, --error, ...) or --all for every job"],
      [["reschedule", a], "reschedule needs --run-at <time> or --delay <duration>"],
      [["reschedule", a, "--delay", "soon"], 'cannot read "soon"'],
    ];
    for (const [args, says] of cases) {
      const result = await jobs(args);
      expect(result.code, args.join(" ")).toBe(EXIT.USAGE);
      expect(result.stdout).toBe("");
      expect(errorLines(result)).toEqual([expect.stringContaining(says)]);
    }
    expect(await snapshot(a)).toEqual(before);
  });
});

describe("idemq jobs: the search filters", () => {
  it("--error (the last error), --payload with --task, --concurrency-key, --since/--until, --finished-since", async () => {
    const queue = unique("search");
    const failed = await jobIn(db.pool, "failed", { queue, task: "charge", payload: { customer: 42 } });
    const other = await jobIn(db.pool, "enqueued", { queue, task: "charge", payload: { customer: 7 }, concurrency_key: `${queue}:7` });
    const ids = async (args: string[]) => {
      const result = await jobs(["--queue", queue, ...args, "--json"]);
      expect(result, args.join(" ")).toMatchObject({ code: EXIT.OK, stderr: "" });
      return JSON.parse(result.stdout).jobs.map((j: { id: string }) => j.id);
    };
    expect(await ids(["--error", "TESTERROR: boom"])).toEqual([failed]);
    expect(await ids(["--task", "charge", "--payload", '{"customer": 7}'])).toEqual([other]);
    expect(await ids(["--concurrency-key", `${queue}:7`])).toEqual([other]);
    expect(await ids(["--since", "1h"])).toEqual([other, failed]);
    expect(await ids(["--until", "1h"])).toEqual([]);
    expect(await ids(["--finished-since", "2000-01-01T00:00:00Z"])).toEqual([failed]);
  });
});

describe("idemq jobs retry|cancel|delete|run-now with a filter (bulk)", () => {
  async function some(queue: string): Promise<{ failed: string[]; enqueued: string }> {
    const failed = [];
    for (let i = 0; i < 3; i++) failed.push(await jobIn(db.pool, "failed", { queue, task: "bulk" }));
    return { failed, enqueued: await jobIn(db.pool, "enqueued", { queue, task: "bulk" }) };
  }

  it("retry --yes --json: only the jobs retry takes, in batches of --batch-size; the answer counts them", async () => {
    const queue = unique("bulk");
    const { failed, enqueued } = await some(queue);
    const result = await jobs(["retry", "--queue", queue, "--yes", "--batch-size", "2", "--json"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(result.stdout)).toEqual({
      action: "retry", matched: 3, matchedExact: true, touched: 3, skipped: 0, batches: 2, dryRun: false, interrupted: false,
    });
    expect(await states(db.pool, [...failed, enqueued])).toEqual(Object.fromEntries([...failed, enqueued].map((id) => [id, "enqueued"])));
  });

  it("--dry-run says how many and changes nothing; the question takes y, anything else changes nothing (exit 2)", async () => {
    const queue = unique("bulk");
    const { failed, enqueued } = await some(queue);
    const before = await states(db.pool, [...failed, enqueued]);
    const dry = await jobs(["cancel", "--queue", queue, "--dry-run"]);
    expect(dry).toMatchObject({ code: EXIT.OK, stderr: "", stdout: "Cancel: 1 active job matches (dry run: nothing changed).\n" });
    const no = await runCli(["jobs", "delete", "--queue", queue, "--database-url", db.url], { input: "n\n" });
    expect(no.code).toBe(EXIT.USAGE);
    expect(no.stderr).toBe("Delete 3 finished jobs? [y/N] \nidemq: not confirmed: nothing changed (3 finished jobs match); --yes acts without asking\n");
    const silent = await runCli(["jobs", "delete", "--queue", queue, "--database-url", db.url], { input: "" });
    expect(silent.code).toBe(EXIT.USAGE);
    expect(await states(db.pool, [...failed, enqueued])).toEqual(before);
    const yes = await runCli(["jobs", "delete", "--queue", queue, "--database-url", db.url], { input: "y\n" });
    expect(yes).toMatchObject({ code: EXIT.OK, stdout: "Deleted 3 job(s) in 1 batch(es).\n" });
    expect(await states(db.pool, [...failed, enqueued])).toEqual({ [enqueued]: "enqueued" });
  });

  it("run-now enqueues the scheduled jobs; cancel with ids and a filter takes the ids the filter matches", async () => {
    const queue = unique("bulk");
    const scheduled = await jobIn(db.pool, "scheduled", { queue });
    const enqueued = await jobIn(db.pool, "enqueued", { queue });
    const now = await jobs(["run-now", "--queue", queue, "--yes", "--json"]);
    expect(JSON.parse(now.stdout)).toMatchObject({ action: "run_now", matched: 1, touched: 1 });
    expect(await stateOf(db.pool, scheduled)).toBe("enqueued");
    const cancel = await jobs(["cancel", scheduled, enqueued, "--task", "test_task", "--yes", "--json"]);
    expect(JSON.parse(cancel.stdout)).toMatchObject({ action: "cancel", matched: 2, touched: 2 });
    expect(await states(db.pool, [scheduled, enqueued])).toEqual({ [scheduled]: "cancelled", [enqueued]: "cancelled" });
    const none = await jobs(["retry", "--queue", unique("empty"), "--json"]);
    expect(JSON.parse(none.stdout)).toMatchObject({ matched: 0, touched: 0 });
  });

  it("bad filters are refused before connecting: one line, exit 2", async () => {
    const unreachable = "postgres://postgres@127.0.0.1:1/nowhere";
    const cases: [string[], string][] = [
      [["jobs", "--payload", '{"a": 1'], "--payload is not valid JSON"],
      [["jobs", "--task", "t", "--payload", "[1]"], "--payload must be a JSON object"],
      [["jobs", "--queue", "q", "--payload", '{"a": 1}'], "--payload needs --task (or --key, or job ids) beside it"],
      [["jobs", "--since", "yesterday"], "--since takes a time (2026-12-01T09:00:00Z) or how long ago"],
      [["jobs", "--finished-until", "5"], "--finished-until takes a time"],
      [["jobs", "delete"], "give job ids, filter flags"],
      [["jobs", "run-now", "--all", "--queue", "q"], "--all takes every job: give it alone"],
      [["jobs", "retry", "--queue", "q", "--batch-size", "0"], "--batch-size must be an integer from 1 to 10000"],
      [["jobs", "cancel", "--state", "finished"], 'unknown state "finished"'],
    ];
    for (const [args, says] of cases) {
      const result = await runCli([...args, "--database-url", unreachable]);
      expect(result.code, args.join(" ")).toBe(EXIT.USAGE);
      expect(errorLines(result), args.join(" ")).toEqual([expect.stringContaining(says)]);
    }
  });

  it("a filter SQL refuses (a key over 1000 characters) is exit 2 with the field named, nothing changed", async () => {
    const result = await jobs(["cancel", "--key", "k".repeat(1001), "--yes"]);
    expect(result.code).toBe(EXIT.USAGE);
    expect(errorLines(result)).toEqual([expect.stringContaining('filter field "key" must be a non-empty string of at most 1000 characters')]);
  });
});
