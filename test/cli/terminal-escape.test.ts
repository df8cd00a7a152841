// Anyone who can enqueue chooses the text the CLI prints to an operator's
// terminal. Run as real subprocesses: `idemq enqueue`, `jobs`, `jobs show`
// and `stats` show a task, queue, key, worker id, error and payload that hold
// terminal escapes (clear screen, set title, bell), C1 controls and a
// bidirectional override escaped in human output, and exactly as stored
// with --json.
import { describe, expect, it } from "vitest";
import { printable, printableLines } from "../../src/cli/terminal-text.ts";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";

const db = useTestDatabase();

const ESC = "\u001b";
const TASK = `x${ESC}[2J${ESC}]0;pwned\u0007`;
const SHOWN_TASK = "x\\x1b[2J\\x1b]0;pwned\\x07";
const RLO = "\u202e";

/** Any character a terminal acts on, other than the newlines between lines. */
const CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/u;

function expectPrintable(result: CliResult): void {
  expect(result.stdout, JSON.stringify(result.stdout)).not.toMatch(CONTROL);
  expect(result.stderr, JSON.stringify(result.stderr)).not.toMatch(CONTROL);
}

const cli = (args: string[]) => runCli([...args, "--database-url", db.url]);

describe("printable", () => {
  it("escapes C0 and C1 controls, DEL and bidirectional controls, and leaves other text alone", () => {
    expect(printable(TASK)).toBe(SHOWN_TASK);
    expect(printable(`a\nb\tc\rd\u007f\u009b${RLO}\u2066\u200f`)).toBe("a\\nb\\tc\\rd\\x7f\\x9b\\u202e\\u2066\\u200f");
    expect(printable("naïve 日本語 emoji 🎉 back\\slash")).toBe("naïve 日本語 emoji 🎉 back\\slash");
    expect(printable(printable(TASK)), "idempotent").toBe(SHOWN_TASK);
    expect(printableLines(`one${ESC}\ntwo`)).toBe("one\\x1b\ntwo");
  });
});

describe("human output escapes what anyone enqueued; --json keeps it exact", () => {
  const queue = `${unique("q")}${RLO}evil`;
  const key = `${unique("k")}${ESC}[31m${RLO}`;
  const payload = { note: `${RLO}gnp.exe`, csi: "\u009b2J", bell: "\u0007" };
  let jobId: string;

  it("idemq enqueue", async () => {
    const human = await cli(["enqueue", TASK, JSON.stringify(payload), "--queue", queue, "--key", key]);
    expect(human.code, human.stderr).toBe(EXIT.OK);
    expectPrintable(human);
    expect(human.stdout).toContain(SHOWN_TASK);
    expect(human.stdout).toContain(printable(queue));
    expect(human.stdout).toContain(printable(key));
    jobId = /job (\d+)/.exec(human.stdout)![1]!;

    const again = await cli(["enqueue", TASK, JSON.stringify(payload), "--queue", queue, "--key", key]);
    expect(again.stdout).toMatch(/^deduplicated: key /);
    expectPrintable(again);
    expect(again.stdout).toContain(printable(key));

    // Key reused for different work: the error line (stderr) and the job printed.
    const conflict = await cli(["enqueue", TASK, "{}", "--queue", queue, "--key", key]);
    expect(conflict.code).toBe(EXIT.KEY_CONFLICT);
    expectPrintable(conflict);
    expect(conflict.stdout).toContain(SHOWN_TASK);

    const json = await cli(["enqueue", TASK, JSON.stringify(payload), "--queue", queue, "--key", key, "--json"]);
    const parsed = JSON.parse(json.stdout);
    expect(parsed.job).toMatchObject({ id: jobId, task: TASK, queue, idempotencyKey: key, payload });
  });

  it("idemq jobs and jobs show, with a hostile worker id and error", async () => {
    const worker = `w${ESC}]0;owned\u0007${RLO}`;
    const { rows } = await db.pool.query("SELECT job_id AS id, attempt FROM idemq.claim(worker_id => $1, queues => ARRAY[$2])", [worker, queue]);
    expect(rows.map((r) => r.id)).toEqual([jobId]);
    await db.pool.query("SELECT idemq.fail(job_id => $1, attempt => $2, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1), error => $3::jsonb)", [
      jobId,
      rows[0].attempt,
      JSON.stringify({ class: `Err${ESC}[1m`, message: `boom ${ESC}[2J${RLO} done`, stack: `at ${ESC}c` }),
    ]);

    const list = await cli(["jobs", "--queue", queue]);
    expect(list.code, list.stderr).toBe(EXIT.OK);
    expectPrintable(list);
    expect(list.stdout).toContain(SHOWN_TASK);
    expect(list.stdout).toContain(printable(queue));
    const listed = JSON.parse((await cli(["jobs", "--queue", queue, "--json"])).stdout).jobs;
    expect(listed).toMatchObject([{ id: jobId, task: TASK, queue, idempotencyKey: key, payload }]);

    const show = await cli(["jobs", "show", jobId]);
    expect(show.code, show.stderr).toBe(EXIT.OK);
    expectPrintable(show);
    expect(show.stdout).toContain(`job ${jobId}  ${SHOWN_TASK}`);
    expect(show.stdout).toContain(`by ${printable(worker)}`);
    expect(show.stdout).toContain("Err\\x1b[1m: boom \\x1b[2J\\u202e done");
    expect(show.stdout).toContain("\\u202egnp.exe");
    const shown = JSON.parse((await cli(["jobs", "show", jobId, "--json"])).stdout);
    expect(shown).toMatchObject({ task: TASK, queue, idempotencyKey: key, payload, lockedBy: null });
    expect(shown.timeline[0]).toMatchObject({ worker, error: { class: `Err${ESC}[1m`, message: `boom ${ESC}[2J${RLO} done` } });
  });

  it("idemq stats", async () => {
    const human = await cli(["stats"]);
    expect(human.code, human.stderr).toBe(EXIT.OK);
    expectPrintable(human);
    expect(human.stdout).toContain(SHOWN_TASK);
    expect(human.stdout).toContain(printable(queue));
    const json = JSON.parse((await cli(["stats", "--json"])).stdout);
    expect(json.jobs).toContainEqual(expect.objectContaining({ queue, task: TASK, scheduled: 1 }));
  });

  it("an error line that quotes an argument (commander's, on stderr) is escaped too", async () => {
    const result = await cli(["jobs", "show", `1${ESC}[2J`]);
    expect(result.code).toBe(EXIT.USAGE);
    expectPrintable(result);
  });
});
