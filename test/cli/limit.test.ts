// `idemq limit set|clear|list`, `idemq pause`, `idemq resume`, run as real
// subprocesses: --json is what the Client reads, the list shows each scope's
// limits and use (slots held, starts in the window), pause really holds a
// queue's jobs back from claim(), and bad input is one line naming what was
// wrong and how to fix it, exit 2 (or 5 for a clear of nothing), nothing written.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { Client } from "../../src/index.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, unique } from "../helpers/jobs.ts";
import { claim } from "../helpers/work.ts";

const db = useTestDatabase();
let client: Client;
beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterAll(async () => {
  await client.close();
});

function cli(args: string[]): Promise<CliResult> {
  return runCli([...args, "--database-url", db.url]);
}

/** A failure's stderr: one line starting "idemq: ", no stack trace. */
function errorLine(result: CliResult): string {
  expect(result.stderr).not.toMatch(/^\s+at /m);
  const lines = result.stderr.trimEnd().split("\n");
  expect(lines, result.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  return lines[0]!;
}

async function limitRow(queue: string): Promise<unknown> {
  return JSON.parse(JSON.stringify((await client.limits()).find((r) => r.queue === queue) ?? null));
}

describe("idemq limit set / list / clear", () => {
  it("--json sets a queue's limits and prints the row the Client reads; set again keeps the fields not given", async () => {
    const queue = unique("emails");
    const set = await cli(["limit", "set", "--queue", queue, "--concurrency", "3", "--rate", "10", "--per", "1m", "--json"]);
    expect(set, set.stderr).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(set.stdout)).toEqual(await limitRow(queue));
    expect(JSON.parse(set.stdout)).toMatchObject({ queue, task: null, concurrency: 3, rate: 10, per: "00:01:00", paused: false });

    const raised = await cli(["limit", "set", "--queue", queue, "--concurrency", "4"]);
    expect(raised).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(raised.stdout).toBe(`set queue ${queue}: concurrency 4, rate 10 per 1m\n`);
    expect(await limitRow(queue)).toMatchObject({ concurrency: 4, rate: 10 });
  });

  it("list shows each scope's limits, pause, slots held and starts in the window", async () => {
    const queue = unique("partner");
    const task = unique("charge");
    expect((await cli(["limit", "set", "--queue", queue, "--concurrency", "3", "--rate", "10", "--per", "1m"])).code).toBe(EXIT.OK);
    expect((await cli(["pause", "--task", task])).code).toBe(EXIT.OK);
    await enqueue(db.pool, { queue, task: "t" });
    await enqueue(db.pool, { queue, task: "t" });
    expect(await claim(db.pool, { queues: [queue], batch_size: 2 })).toHaveLength(2);

    const list = await cli(["limit", "list"]);
    expect(list).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = list.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^SCOPE +LIMITS +PAUSED +HELD UNTIL +RUNNING +STARTED$/);
    expect(lines).toContainEqual(expect.stringMatching(new RegExp(`^queue ${queue} +concurrency 3, rate 10 per 1m +no +- +2/3 +2/10 in 1m$`)));
    expect(lines).toContainEqual(expect.stringMatching(new RegExp(`^task ${task} +none +yes +- +- +-$`)));

    const json = await cli(["limit", "--json"]);
    expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(json.stdout)).toEqual(JSON.parse(JSON.stringify(await client.limits())));
  });

  it("clear removes the limits (exit 0), and a second clear finds none: exit 5, one line, --json error not_found", async () => {
    const queue = unique("gone");
    await client.setLimit({ queue, concurrency: 2 });
    const cleared = await cli(["limit", "clear", "--queue", queue, "--json"]);
    expect(cleared).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(cleared.stdout)).toEqual({ queue, task: null, cleared: true });
    expect(await limitRow(queue)).toBeNull();

    const again = await cli(["limit", "clear", "--queue", queue, "--json"]);
    expect(again.code).toBe(EXIT.NOT_FOUND);
    expect(errorLine(again)).toBe(`idemq: queue ${queue} has no limit; nothing cleared (\`idemq limit list\` shows them)`);
    expect(JSON.parse(again.stdout)).toMatchObject({ error: { code: "not_found" } });
  });

  it("a value SQL refuses is its message and hint in one line, exit 2, nothing written", async () => {
    const queue = unique("fast");
    const result = await cli(["limit", "set", "--queue", queue, "--rate", "5", "--per", "500ms", "--json"]);
    expect(result.code).toBe(EXIT.USAGE);
    expect(errorLine(result)).toMatch(/^idemq: set_limit: per must be at least 1 second, not 00:00:00\.5 \(SQLSTATE 22023\); scale both/);
    expect(JSON.parse(result.stdout)).toMatchObject({ error: { code: "22023", hint: expect.stringContaining("per => '1 second'") } });
    const tooMany = await cli(["limit", "set", "--queue", queue, "--concurrency", "20000"]);
    expect(tooMany.code).toBe(EXIT.USAGE);
    expect(errorLine(tooMany)).toMatch(/concurrency must be between 1 and 10000, not 20000/);
    expect(await limitRow(queue)).toBeNull();
  });

  it("refuses bad calls before opening the database: no scope, both, rate without per, no limit, a zero", async () => {
    // An unreachable URL: each of these must fail on its arguments, never reach it.
    const offline = (args: string[]) => runCli([...args, "--database-url", "postgres://nobody@127.0.0.1:1/none"]);
    const cases: [string[], RegExp][] = [
      [["limit", "set", "--concurrency", "2"], /limit set: give exactly one of --queue and --task, not neither \(e\.g\. --queue emails/],
      [["limit", "set", "--queue", "a", "--task", "b", "--concurrency", "2"], /not both/],
      [["limit", "set", "--queue", "a", "--rate", "5"], /--rate and --per go together \(got --rate without --per\), e\.g\. --rate 100 --per 1m/],
      [["limit", "set", "--queue", "a"], /give at least one limit: --concurrency N, --rate N --per D or --per-key N/],
      [["limit", "set", "--queue", "a", "--concurrency", "0"], /--concurrency must be an integer from 1/],
      [["limit", "set", "--queue", "a", "--rate", "5", "--per", "5"], /5 has no unit: write 5s/],
      [["pause"], /pause: give exactly one of --queue and --task, not neither/],
      [["resume", "--queue", "a", "--task", "b"], /resume: give exactly one of --queue and --task, not both/],
    ];
    for (const [args, message] of cases) {
      const result = await offline(args);
      expect(result.code, args.join(" ")).toBe(EXIT.USAGE);
      expect(errorLine(result), args.join(" ")).toMatch(message);
    }
  });
});

describe("idemq limit keys", () => {
  it("lists the concurrency keys held now and until when; --json is what the Client reads", async () => {
    const queue = unique("keyed");
    const key = unique("customer");
    await enqueue(db.pool, { queue, concurrency_key: key });
    const [job] = await claim(db.pool, { queues: [queue], token: true });
    const { rows } = await db.pool.query<{ held: Date }>(
      "SELECT idemq.hold(job_id => $1, attempt => $2, scope => 'key', until => now() + interval '1 hour', lease_token => $3) AS held",
      [job!.job_id, job!.attempt, job!.lease_token],
    );
    const list = await cli(["limit", "keys"]);
    expect(list).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = list.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^CONCURRENCY KEY +HELD UNTIL$/);
    expect(lines).toContainEqual(expect.stringMatching(new RegExp(`^${key} +${rows[0]!.held.toISOString().replace(/\./g, "\\.")}$`)));

    const json = await cli(["limit", "keys", "--json"]);
    expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(json.stdout)).toEqual(JSON.parse(JSON.stringify(await client.heldKeys())));
    expect(JSON.parse(json.stdout)).toContainEqual({ concurrencyKey: key, heldUntil: rows[0]!.held.toISOString() });
  });
});

describe("idemq pause / resume", () => {
  it("pause holds the queue's jobs back from every claim until resume; a second pause changes nothing", async () => {
    const queue = unique("incident");
    const { job_id } = await enqueue(db.pool, { queue });

    const paused = await cli(["pause", "--queue", queue, "--json"]);
    expect(paused).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(JSON.parse(paused.stdout)).toEqual({ queue, task: null, paused: true, changed: true });
    expect(await claim(db.pool, { queues: [queue] })).toEqual([]);

    const again = await cli(["pause", "--queue", queue]);
    expect(again).toMatchObject({ code: EXIT.OK, stdout: `queue ${queue} was already paused; nothing changed\n` });

    const resumed = await cli(["resume", "--queue", queue]);
    expect(resumed).toMatchObject({ code: EXIT.OK, stdout: `resumed queue ${queue}\n`, stderr: "" });
    expect((await claim(db.pool, { queues: [queue] })).map((j) => j.job_id)).toEqual([job_id]);

    const notPaused = await cli(["resume", "--queue", queue, "--json"]);
    expect(JSON.parse(notPaused.stdout)).toEqual({ queue, task: null, paused: false, changed: false });
  });
});
