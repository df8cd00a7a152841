// `idemq enqueue`, run as a real subprocess against a real database: payloads
// (JSON text, @file, stdin), options, deduplication, the IQ409 and IQ422 exit
// codes with the existing job printed, and bad input that changes nothing.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { count, jobRow, unique } from "../helpers/jobs.ts";
import { jobIn } from "../helpers/work.ts";

const db = useTestDatabase();
let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "idemq-cli-enqueue-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

function enqueue(args: string[], input?: string): Promise<CliResult> {
  return runCli(["enqueue", ...args, "--database-url", db.url], input === undefined ? {} : { input });
}

function oneErrorLine(result: CliResult): string {
  const lines = result.stderr.trimEnd().split("\n");
  expect(lines, result.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  expect(result.stderr).not.toMatch(/^\s+at /m);
  return lines[0]!;
}

const jobCount = () => count(db.pool, "SELECT 1 FROM idemq.jobs");

describe("idemq enqueue", () => {
  it("--json enqueues the task with its payload and options and prints the new job", async () => {
    const queue = unique("q");
    const key = unique("key");
    const result = await enqueue([
      "send_invoice",
      '{"orderId": 42}',
      "--key",
      key,
      "--policy",
      "reject_if_succeeded",
      "--queue",
      queue,
      "--priority",
      "5",
      "--max-attempts",
      "3",
      "--json",
    ]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const out = JSON.parse(result.stdout);
    expect(out).toMatchObject({
      deduplicated: false,
      job: { task: "send_invoice", queue, payload: { orderId: 42 }, state: "enqueued", priority: 5, maxAttempts: 3, idempotencyKey: key },
    });
    expect(out.jobId).toBe(out.job.id);
    const row = await jobRow(db.pool, out.jobId);
    expect(row).toMatchObject({ task: "send_invoice", queue, payload: { orderId: 42 }, priority: 5, max_attempts: 3, idempotency_key: key });
  });

  it("without a payload the SQL default {} applies, and the human answer names the job", async () => {
    const queue = unique("q");
    const result = await enqueue(["cleanup", "--queue", queue]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const id = /^enqueued job (\d+) \(cleanup, queue (\S+)\): enqueued, attempt 0\/10\n$/.exec(result.stdout);
    expect(id, result.stdout).not.toBeNull();
    expect(id![2]).toBe(queue);
    expect((await jobRow(db.pool, id![1]!)).payload).toEqual({});
  });

  it("reads the payload from @file.json and from stdin (-)", async () => {
    const file = join(dir, "payload.json");
    await writeFile(file, '{"supplier": 9, "lines": [1, 2]}\n');
    const fromFile = await enqueue(["import_supplier", `@${file}`, "--json"]);
    expect(fromFile).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect((await jobRow(db.pool, JSON.parse(fromFile.stdout).jobId)).payload).toEqual({ supplier: 9, lines: [1, 2] });

    const fromStdin = await enqueue(["credit", "-", "--json"], '{"account": 7, "amount": 10}');
    expect(fromStdin).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect((await jobRow(db.pool, JSON.parse(fromStdin.stdout).jobId)).payload).toEqual({ account: 7, amount: 10 });
  });

  it("--delay schedules by the database clock; --run-at at the given time; --after waits in awaiting", async () => {
    const delayed = await enqueue(["later", "--delay", "5m", "--json"]);
    expect(delayed.code, delayed.stderr).toBe(EXIT.OK);
    const { rows } = await db.pool.query<{ state: string; offset_s: number }>(
      "SELECT state, extract(epoch FROM run_at - created_at)::float8 AS offset_s FROM idemq.jobs WHERE id = $1",
      [JSON.parse(delayed.stdout).jobId],
    );
    expect(rows[0]!.state).toBe("scheduled");
    expect(rows[0]!.offset_s).toBeGreaterThanOrEqual(300);
    expect(rows[0]!.offset_s).toBeLessThan(301);

    const at = await enqueue(["at_time", "--run-at", "2099-01-02T03:04:05Z", "--json"]);
    expect(at.code, at.stderr).toBe(EXIT.OK);
    const atJob = await jobRow(db.pool, JSON.parse(at.stdout).jobId);
    expect(atJob.state).toBe("scheduled");
    expect(atJob.run_at.toISOString()).toBe("2099-01-02T03:04:05.000Z");

    const parent = await jobIn(db.pool, "enqueued");
    const child = await enqueue(["child", "--after", parent, "--json"]);
    expect(child.code, child.stderr).toBe(EXIT.OK);
    expect(JSON.parse(child.stdout).job.state).toBe("awaiting");
  });

  it("the same key while its job is active returns that job, deduplicated, exit 0", async () => {
    const key = unique("key");
    const first = JSON.parse((await enqueue(["send_invoice", '{"orderId": 1}', "--key", key, "--json"])).stdout);
    const again = await enqueue(["send_invoice", '{"orderId": 1}', "--key", key, "--json"]);
    expect(again).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(again.stdout)).toMatchObject({ jobId: first.jobId, deduplicated: true, job: { id: first.jobId } });
    const human = await enqueue(["send_invoice", '{"orderId": 1}', "--key", key]);
    expect(human.stdout).toBe(`deduplicated: key ${key} is held by job ${first.jobId} (send_invoice, queue default, key ${key}): enqueued, attempt 0/10; nothing enqueued\n`);
    expect(await count(db.pool, "SELECT 1 FROM idemq.jobs WHERE idempotency_key = $1", [key])).toBe(1);
  });

  it("a rejection by the policy (IQ409) prints the existing job, one line on stderr, exit 3, and adds no job", async () => {
    const key = unique("key");
    const existing = await jobIn(db.pool, "succeeded", { task: "send_invoice", payload: { orderId: 2 }, idempotency_key: key });
    const before = await jobCount();
    const result = await enqueue(["send_invoice", '{"orderId": 2}', "--key", key, "--policy", "reject_always", "--json"]);
    expect(result.code).toBe(EXIT.REJECTED);
    expect(JSON.parse(result.stdout)).toMatchObject({
      error: {
        code: "IQ409",
        message: expect.stringContaining(key),
        hint: expect.any(String),
        detail: { key, policy: "reject_always", existingJobId: existing, existingState: "succeeded" },
        existingJob: { id: existing, state: "succeeded", idempotencyKey: key },
      },
    });
    expect(oneErrorLine(result)).toContain("SQLSTATE IQ409");
    expect(await jobCount()).toBe(before);

    const human = await enqueue(["send_invoice", '{"orderId": 2}', "--key", key, "--policy", "reject_always"]);
    expect(human.code).toBe(EXIT.REJECTED);
    expect(human.stdout).toBe(`job ${existing} (send_invoice, queue ${(await jobRow(db.pool, existing)).queue}, key ${key}): succeeded, attempt 1/10\n`);
  });

  it("a key reused for different work (IQ422) prints the job holding it, exit 4, and adds no job", async () => {
    const key = unique("key");
    const holder = await jobIn(db.pool, "enqueued", { task: "send_invoice", payload: { orderId: 3 }, idempotency_key: key });
    const before = await jobCount();
    const result = await enqueue(["send_invoice", '{"orderId": 4}', "--key", key, "--json"]);
    expect(result.code).toBe(EXIT.KEY_CONFLICT);
    expect(JSON.parse(result.stdout)).toMatchObject({ error: { code: "IQ422", detail: { key, existingJobId: holder }, existingJob: { id: holder } } });
    expect(oneErrorLine(result)).toContain("SQLSTATE IQ422");
    expect(await jobCount()).toBe(before);
  });
});

describe("idemq enqueue: bad input is one line, exit 2, and changes nothing", () => {
  const cases: { name: string; args: string[]; input?: string; says: string[] }[] = [
    { name: "malformed JSON, with its position", args: ["t", '{"orderId": 42,}'], says: ['line 1 column 16 (position 15)', "not valid JSON"] },
    { name: "malformed JSON on stdin", args: ["t", "-"], input: '{\n  "a": tru\n}', says: ["the payload on stdin is not valid JSON", "line 2 column 8"] },
    { name: "a payload file that does not exist", args: ["t", "@/no/such/payload.json"], says: ["payload file /no/such/payload.json: no such file"] },
    {
      name: "an unknown policy, listing the valid ones",
      args: ["t", "--key", "k", "--policy", "reject_sometimes"],
      says: ["'reject_sometimes' is invalid", "allow_after_failed, reject_if_failed, reject_always, reject_if_succeeded"],
    },
    { name: "a duration with an unknown unit", args: ["t", "--delay", "5 parsecs"], says: ['unknown unit "parsecs"', "5m"] },
    {
      name: "a bare number as the delay: the units to add, not a library's rule about strings",
      args: ["t", "--delay", "5"],
      says: ["option '--delay <duration>' argument '5' is invalid. 5 has no unit: write 5s, 5m, 5h or 5d;"],
    },
    { name: "--run-at and --delay together", args: ["t", "--run-at", "2030-01-01T00:00:00Z", "--delay", "5m"], says: ["cannot be used with"] },
    { name: "a time that is not one", args: ["t", "--run-at", "next tuesday-ish"], says: ['cannot read "next tuesday-ish" as a time'] },
    { name: "max attempts below 1", args: ["t", "--max-attempts", "0"], says: ["--max-attempts must be an integer from 1"] },
    { name: "a parent id that is not an id", args: ["t", "--after", "12,abc"], says: ['a job id is a positive integer such as 42, not "abc"'] },
    { name: "a missing task", args: [], says: ["missing required argument 'task'"] },
    { name: "an empty task name (checked by SQL)", args: [" "], says: ["task"] },
    {
      name: "an idempotency key over key_bytes (checked by SQL): its size, the limit, an excerpt and the fix",
      args: ["t", "--key", "k".repeat(3000)],
      says: ["idempotency_key is 3000 bytes, over the limit of 512 bytes (key_bytes)", "(3000 characters)", "hash a long business key", "nothing was enqueued"],
    },
    {
      name: "a task name over task_bytes (checked by SQL)",
      args: ["t".repeat(300)],
      says: ["task is 300 bytes, over the limit of 256 bytes (task_bytes)", "an admin can raise task_bytes"],
    },
  ];
  for (const c of cases) {
    it(c.name, async () => {
      const before = await jobCount();
      const result = await enqueue(c.args, c.input);
      expect(result.code, result.stderr).toBe(EXIT.USAGE);
      expect(result.stdout).toBe("");
      const line = oneErrorLine(result);
      for (const text of c.says) expect(line).toContain(text);
      expect(await jobCount()).toBe(before);
    });
  }
});
