// A job with a step ledger and children, made through the SQL functions as a
// worker would (claim with a lease token, step_record, sleep, spawn,
// await_event): what `jobs show` and the dashboard's job page display.
import { makeJob, type Queryable, unique } from "./jobs.ts";
import { claimJob, complete, fail, type ClaimedJob } from "./work.ts";

export interface WorkflowJob {
  id: string;
  /** The event its wait is parked on, and that wait's key. */
  event: string;
  key: string;
  /** Its children: `ship` succeeded with a result, `<i>notify</i>` failed. */
  shipped: string;
  notified: string;
}

/** Text a page must show escaped (results and names are user data). */
export const MARKUP = "<script>alert(1)</script>";

/**
 * A job that recorded a step (`charge`, its result holding MARKUP), passed a
 * sleep (`cool-off`), spawned two children (one succeeded, one failed) and
 * is parked on a wait (`paid`) for an event.
 */
export async function workflowJob(db: Queryable): Promise<WorkflowJob> {
  const queue = unique("workflow");
  const id = await makeJob(db, { queue, task: "checkout" });
  const { rows } = await db.query<ClaimedJob>(
    "SELECT * FROM idemq.claim('workflow-worker', queues => ARRAY[$1], batch_size => 1, token => true)",
    [queue],
  );
  const held = rows[0]!;
  const args = (name: string) => [id, held.attempt, name];
  await db.query("SELECT idemq.step_record($1, $2, $3, $4::jsonb, $5)", [...args("charge"), JSON.stringify({ chargeId: "ch_1", note: MARKUP }), held.lease_token]);
  const slept = await db.query<{ parked: boolean }>("SELECT * FROM idemq.sleep($1, $2, $3, now() - interval '1 second', $4)", [
    ...args("cool-off"),
    held.lease_token,
  ]);
  if (slept.rows[0]!.parked) throw new Error("a sleep whose time has passed parked the job");
  const kidsQueue = unique("workflow-kids");
  const kids = await db.query<{ name: string; child_job_id: string }>(
    "SELECT * FROM idemq.spawn(job_id => $1, attempt => $2, children => $3::jsonb, lease_token => $4)",
    [
      id,
      held.attempt,
      JSON.stringify([
        { name: "ship", task: "ship", queue: kidsQueue },
        { name: "<i>notify</i>", task: "notify", queue: kidsQueue },
      ]),
      held.lease_token,
    ],
  );
  const [shipped, notified] = kids.rows.map((r) => r.child_job_id) as [string, string];
  const event = unique("order.paid");
  const key = unique("order");
  const waited = await db.query<{ status: string }>("SELECT * FROM idemq.await_event($1, $2, $3, $4, $5, interval '1 hour', $6)", [
    ...args("paid"),
    event,
    key,
    held.lease_token,
  ]);
  if (waited.rows[0]!.status !== "waiting") throw new Error(`await_event: ${waited.rows[0]!.status}, not waiting`);
  // Children run one at a time in their own queue: ship first (spawn links them in order).
  await complete(db, shipped, await claimJob(db, shipped), { trackingId: "tr_9" });
  await fail(db, notified, await claimJob(db, notified), { class: "SmtpError", message: "mailbox <full>" }, { retryable: false });
  return { id, event, key, shipped, notified };
}
