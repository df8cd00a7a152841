// Part 4: the duplicate policies at work on enqueue.
//   - the same key while its job is active: the same job id, deduplicated;
//   - reject_if_succeeded: rejected (IQ409) once the key's job succeeded,
//     with the existing job's id and state; a new job once it failed;
//   - the same key with a different payload while active: IQ422.
import { DuplicateJobError, KeyReuseError } from "../errors.ts";
import { exactly } from "./figures.ts";
import { type DemoContext, type ScenarioResult, waitForJobs } from "./scenario.ts";

export async function policiesScenario(ctx: DemoContext): Promise<ScenarioResult> {
  const { client, progress } = ctx;
  progress.section("4. Duplicate policies on enqueue");
  const s = "policies";
  const report = ["4. Duplicate policies on enqueue:"];

  // Deduplicated: a report scheduled for later, enqueued twice with one key.
  const reportKey = "report:2026-11";
  const first = await client.enqueue("monthly_report", { month: "2026-11" }, { idempotencyKey: reportKey, delay: "1h", queue: "reports" });
  const again = await client.enqueue("monthly_report", { month: "2026-11" }, { idempotencyKey: reportKey, delay: "1h", queue: "reports" });
  progress.step(`enqueue ${reportKey} twice: job #${first.jobId}, then job #${again.jobId} (deduplicated: ${again.deduplicated})`);
  report.push(
    `   enqueue key ${reportKey} twice (job still scheduled) -> #${first.jobId}, then #${again.jobId} deduplicated=${again.deduplicated}`,
  );

  // reject_if_succeeded: retry after a failure, never after a success.
  const policy = "reject_if_succeeded" as const;
  const paid = await client.enqueue("payout", { orderId: 7, amount: 40 }, { idempotencyKey: "payout:order-7", duplicatePolicy: policy, queue: "payouts" });
  const refused = await client.enqueue("payout", { orderId: 8, amount: 0 }, { idempotencyKey: "payout:order-8", duplicatePolicy: policy, queue: "payouts" });
  const [paidJob, refusedJob] = await waitForJobs(ctx, [paid.jobId, refused.jobId], "payouts");
  progress.step(`payout:order-7 job #${paid.jobId} ${paidJob!.state}; payout:order-8 job #${refused.jobId} ${refusedJob!.state} (amount 0)`);

  let rejection: DuplicateJobError | undefined;
  try {
    await client.enqueue("payout", { orderId: 7, amount: 40 }, { idempotencyKey: "payout:order-7", duplicatePolicy: policy, queue: "payouts" });
  } catch (error) {
    if (!(error instanceof DuplicateJobError)) throw error;
    rejection = error;
  }
  progress.step(
    rejection === undefined
      ? "payout:order-7 again: NOT rejected"
      : `payout:order-7 again: ${rejection.code} rejected, existing job #${rejection.existingJobId} (${rejection.existingState})`,
  );
  report.push(
    `   ${policy}, key payout:order-7 after job #${paid.jobId} ${paidJob!.state} -> ` +
      (rejection === undefined ? "not rejected" : `${rejection.code} DuplicateJobError: existing job #${rejection.existingJobId}, state ${rejection.existingState}`),
  );

  const retried = await client.enqueue("payout", { orderId: 8, amount: 25 }, { idempotencyKey: "payout:order-8", duplicatePolicy: policy, queue: "payouts" });
  const [retriedJob] = await waitForJobs(ctx, [retried.jobId], "payout retry");
  progress.step(`payout:order-8 again after its failure: new job #${retried.jobId}, ${retriedJob!.state}`);
  report.push(
    `   ${policy}, key payout:order-8 after job #${refused.jobId} ${refusedJob!.state} -> new job #${retried.jobId}, ${retriedJob!.state}`,
  );

  // The same key for different work while its job is active: a bug, so an error.
  let reuse: KeyReuseError | undefined;
  try {
    await client.enqueue("monthly_report", { month: "2026-12" }, { idempotencyKey: reportKey, delay: "1h", queue: "reports" });
  } catch (error) {
    if (!(error instanceof KeyReuseError)) throw error;
    reuse = error;
  }
  progress.step(reuse === undefined ? `${reportKey} with another payload: NOT refused` : `${reportKey} with another payload: ${reuse.code}`);
  report.push(
    `   key ${reportKey} with payload {"month":"2026-12"} -> ` +
      (reuse === undefined ? "accepted" : `${reuse.code} KeyReuseError (key held by job #${reuse.existingJobId})`),
  );

  const stats = await client.stats();
  const deduplicated = stats.filter((r) => r.task === "monthly_report" && r.metric === "deduplicated").reduce((n, r) => n + r.value, 0);
  const { rows } = await client.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM demo.payouts WHERE order_id = 8");
  const figures = [
    exactly(s, "same key while active: same job id", first.jobId, again.jobId),
    exactly(s, "same key while active: deduplicated", true, again.deduplicated),
    exactly(s, "deduplicated enqueues in stats()", 1, deduplicated),
    exactly(s, `${policy} after success: SQLSTATE`, "IQ409", rejection?.code ?? "none"),
    exactly(s, `${policy} after success: existing job id`, paid.jobId, rejection?.existingJobId ?? "none"),
    exactly(s, `${policy} after success: existing state`, "succeeded", rejection?.existingState ?? "none"),
    exactly(s, `${policy} after failure: a new job`, true, retried.jobId !== refused.jobId && !retried.deduplicated),
    exactly(s, "payout rows for order 8 (failed, then paid once)", 1, rows[0]!.n),
    exactly(s, "same key, different payload: SQLSTATE", "IQ422", reuse?.code ?? "none"),
    exactly(s, "same key, different payload: existing job id", first.jobId, reuse?.existingJobId ?? "none"),
  ];
  return {
    details: {
      deduplicated: { key: reportKey, firstJobId: first.jobId, secondJobId: again.jobId, deduplicated: again.deduplicated },
      rejectedAfterSuccess: rejection === undefined
        ? null
        : { code: rejection.code, key: rejection.key, existingJobId: rejection.existingJobId, existingState: rejection.existingState, policy: rejection.policy },
      newJobAfterFailure: { key: "payout:order-8", failedJobId: refused.jobId, newJobId: retried.jobId, state: retriedJob!.state },
      keyReuse: reuse === undefined ? null : { code: reuse.code, key: reuse.key, existingJobId: reuse.existingJobId },
    },
    figures,
    report,
  };
}
