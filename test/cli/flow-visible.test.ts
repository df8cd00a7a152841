// Flow control made visible outside the dashboard (issue 26, item 8), run as
// real subprocesses: `idemq stats` shows paused scopes and limits in use, and
// `idemq doctor`'s flow check warns about a paused queue with a backlog and a
// concurrency limit whose slots are all held while its jobs wait too long.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Finding } from "../../src/cli/commands/doctor.ts";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { Client } from "../../src/index.ts";
import { runCli } from "../helpers/cli.ts";
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

async function flowCheck(...args: string[]): Promise<{ code: number; flow: Finding }> {
  const result = await runCli(["doctor", "--json", "--database-url", db.url, ...args]);
  expect(result.stderr).toBe("");
  const out = JSON.parse(result.stdout) as { checks: Finding[] };
  return { code: result.code, flow: out.checks.find((c) => c.check === "flow")! };
}

/** Enqueues n jobs in the queue that became runnable an hour ago. */
async function waitingJobs(queue: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) await enqueue(db.pool, { queue });
  await db.pool.query("UPDATE idemq.jobs SET run_at = now() - interval '1 hour' WHERE queue = $1", [queue]);
}

describe("idemq doctor: flow", () => {
  it("is ok with no limits; warns about a paused queue with runnable jobs, naming the resume; ok again once resumed", async () => {
    expect((await flowCheck()).flow).toMatchObject({ status: "ok", message: "no limits and no pauses" });

    const queue = unique("incident");
    await waitingJobs(queue, 2);
    await client.pause({ queue });
    const { code, flow } = await flowCheck();
    expect(code).not.toBe(EXIT.OK);
    expect(flow).toMatchObject({
      status: "warning",
      message: expect.stringMatching(new RegExp(`^queue ${queue} is paused while 2 runnable job\\(s\\) wait, the oldest 1h`)),
      fix: `\`idemq resume --queue ${queue}\` once it may run again`,
      paused: [{ queue, runnable: 2, waitedSeconds: expect.any(Number) }],
    });

    await client.resume({ queue });
    expect((await flowCheck()).flow).toMatchObject({ status: "ok", paused: [] });
    await db.pool.query("DELETE FROM idemq.jobs WHERE queue = $1", [queue]);
  });

  it("a paused task with nothing runnable is not a finding", async () => {
    const task = unique("quiet");
    await client.pause({ task });
    expect((await flowCheck()).flow).toMatchObject({ status: "ok", paused: [] });
    await client.resume({ task });
  });

  it("warns about a saturated concurrency limit once its runnable jobs waited longer than --max-wait", async () => {
    const queue = unique("saturated");
    await client.setLimit({ queue, concurrency: 1 });
    await waitingJobs(queue, 3);
    expect(await claim(db.pool, { queues: [queue], batch_size: 3 })).toHaveLength(1);

    const { flow } = await flowCheck("--max-wait", "10m");
    expect(flow.status).toBe("warning");
    expect(flow.message).toMatch(new RegExp(`^queue ${queue}'s concurrency limit is saturated \\(1/1 slots held\\) while 2 runnable job\\(s\\) wait, the oldest 1h`));
    expect(flow.fix).toContain(`idemq limit set --queue ${queue} --concurrency <n>`);
    expect(flow.saturated).toEqual([{ queue, concurrency: 1, running: 1, runnable: 2, waitedSeconds: expect.any(Number) }]);

    // Saturated, but its jobs have not waited that long: reported, not warned about.
    const patient = await flowCheck("--max-wait", "2h");
    expect(patient.flow.status).toBe("ok");
    expect(patient.flow.message).toContain(`saturated now: queue ${queue}`);

    await client.setLimit({ queue, concurrency: 5 });
    expect((await flowCheck("--max-wait", "10m")).flow).toMatchObject({ status: "ok", saturated: [] });
  });
});

describe("idemq stats: flow control", () => {
  it("shows paused scopes and limits in use under the counts; --json carries limits(); --queue keeps its own", async () => {
    const queue = unique("limited");
    const other = unique("other");
    await client.setLimit({ queue, concurrency: 2, rate: 30, per: "1m" });
    await client.pause({ queue: other });
    await enqueue(db.pool, { queue });
    await enqueue(db.pool, { queue: other });
    expect(await claim(db.pool, { queues: [queue] })).toHaveLength(1);

    const human = await runCli(["stats", "--database-url", db.url]);
    expect(human).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = human.stdout.trimEnd().split("\n");
    expect(lines).toContainEqual(expect.stringMatching(/^SCOPE +LIMITS +PAUSED +HELD UNTIL +RUNNING +STARTED$/));
    expect(lines).toContainEqual(expect.stringMatching(new RegExp(`^queue ${queue} +concurrency 2, rate 30 per 1m +no +- +1/2 +1/30 in 1m$`)));
    expect(lines).toContainEqual(expect.stringMatching(new RegExp(`^queue ${other} +none +yes +- +- +-$`)));

    const json = await runCli(["stats", "--json", "--queue", queue, "--database-url", db.url]);
    expect(json).toMatchObject({ code: EXIT.OK, stderr: "" });
    const report = JSON.parse(json.stdout) as { limits: unknown[] };
    const mine = (await client.limits()).filter((r) => r.queue === queue);
    expect(report.limits).toEqual(JSON.parse(JSON.stringify(mine)));
    expect(report.limits).toHaveLength(1);
  });
});
