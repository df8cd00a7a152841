// `idemq jobs show` of a job with durable steps and children (docs/design.md,
// "Durable steps", "Children and batches"), run as a real subprocess: after
// the attempt timeline, its step ledger (idemq.steps) and its children
// (idemq.children), in --json too; nothing extra for a job with neither; one
// line instead of the steps for a login whose role may not read them (the
// viewer), the rest of the job still shown.
import { afterAll, describe, expect, it } from "vitest";
import { EXIT } from "../../src/cli/exit-codes.ts";
import { installationRoles } from "../../src/roles.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, unique } from "../helpers/jobs.ts";
import { type ClaimedJob, jobIn } from "../helpers/work.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";
import { MARKUP, workflowJob } from "../helpers/workflow.ts";

const db = useTestDatabase();

afterAll(async () => {
  await dropLoginRoles();
});

const show = (id: string, extra: string[] = [], url = db.url) => runCli(["jobs", "show", id, ...extra, "--database-url", url]);

describe("idemq jobs show: steps and children", () => {
  it("--json has the step ledger and the children with their outcomes", async () => {
    const job = await workflowJob(db.pool);
    const result = await show(job.id, ["--json"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const shown = JSON.parse(result.stdout);
    expect(shown).toMatchObject({ id: job.id, state: "scheduled" });
    expect(shown.steps).toEqual([
      expect.objectContaining({ name: "charge", kind: "step", status: "done", result: { chargeId: "ch_1", note: MARKUP }, attempt: 1, over: true }),
      expect.objectContaining({ name: "cool-off", kind: "sleep", status: "sleeping", result: null, over: true }),
      expect.objectContaining({ name: "paid", kind: "wait", status: "waiting", event: job.event, eventKey: job.key, over: false }),
    ]);
    for (const step of shown.steps) expect(Number.isNaN(Date.parse(step.recordedAt))).toBe(false);
    expect(shown.children).toEqual([
      { name: "ship", jobId: job.shipped, state: "succeeded", result: { trackingId: "tr_9" }, lastError: null },
      {
        name: "<i>notify</i>",
        jobId: job.notified,
        state: "failed",
        result: null,
        lastError: expect.objectContaining({ class: "SmtpError", message: "mailbox <full>" }),
      },
    ]);
  });

  it("prints the steps (when, kind, name, status, result excerpt) and the children (name, id, state) after the timeline", async () => {
    const job = await workflowJob(db.pool);
    const result = await show(job.id);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    const steps = lines.slice(lines.indexOf("steps") + 1, lines.indexOf("children"));
    expect(lines.indexOf("steps")).toBeGreaterThan(lines.indexOf("timeline"));
    expect(steps).toEqual([
      expect.stringMatching(/^ {2}\S+Z {2}step {3}charge: done \(attempt 1\) {2}\{"note":"<script>alert\(1\)<\/script>","chargeId":"ch_1"\}$/),
      expect.stringMatching(/^ {2}\S+Z {2}sleep {2}cool-off: slept until \S+Z \(\d+s ago\) \(attempt 1\)$/),
      expect.stringMatching(
        new RegExp(`^ {2}\\S+Z {2}wait {3}paid: waiting for event ${job.event} key ${job.key}, times out \\S+Z \\(in (59m|1h)( \\d+s)?\\) \\(attempt 1\\)$`),
      ),
    ]);
    expect(lines.slice(lines.indexOf("children") + 1)).toEqual([
      `  ship  job ${job.shipped}  succeeded  {"trackingId":"tr_9"}`,
      `  <i>notify</i>  job ${job.notified}  failed: SmtpError: mailbox <full>`,
    ]);
  });

  it("escapes control characters in step names and results (they are user data)", async () => {
    const queue = unique("escape");
    const id = await makeJob(db.pool, { queue, task: "escape" });
    const { rows } = await db.pool.query<ClaimedJob>("SELECT * FROM idemq.claim('w', queues => ARRAY[$1], batch_size => 1, token => true)", [queue]);
    await db.pool.query("SELECT idemq.step_record($1, $2, $3, $4::jsonb, $5)", [id, rows[0]!.attempt, "evil\x1b[2J", JSON.stringify("\u202eok"), rows[0]!.lease_token]);
    const result = await show(id);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    expect(result.stdout).not.toMatch(/[\x1b\u202e]/);
    expect(result.stdout).toContain("  step   evil\\x1b[2J: done (attempt 1)  \"\\u202eok\"");
  });

  it("prints nothing extra for a job without steps or children ([] in --json)", async () => {
    const id = await jobIn(db.pool, "succeeded", { task: "plain" });
    const result = await show(id);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    expect(lines.at(-1)).toMatch(/^ {2}\S+Z {2}succeeded$/);
    expect(lines).not.toContain("steps");
    expect(lines).not.toContain("children");
    expect(JSON.parse((await show(id, ["--json"])).stdout)).toMatchObject({ id, steps: [], children: [] });
  });

  it("as the viewer role: the job and its children, and one line saying the steps need the worker or admin role", async () => {
    const job = await workflowJob(db.pool);
    const role = await createLoginRole("viewer", { memberOf: [(await installationRoles(db.pool)).viewer] });
    const result = await show(job.id, [], role.urlFor(db.name));
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    const lines = result.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(new RegExp(`^job ${job.id} {2}checkout `));
    expect(lines.slice(lines.indexOf("steps"), lines.indexOf("steps") + 2)).toEqual([
      "steps",
      "  (not shown: reading a job's steps needs the worker or admin role)",
    ]);
    expect(lines).toContain(`  ship  job ${job.shipped}  succeeded  {"trackingId":"tr_9"}`);
    const json = JSON.parse((await show(job.id, ["--json"], role.urlFor(db.name))).stdout);
    expect(json).toMatchObject({ id: job.id, steps: null, children: [{ name: "ship" }, { name: "<i>notify</i>" }] });
  });
});
