// ctx.effect(key, fn, { staleAfter, reconcile }): the claim-first protocol of
// docs/design.md ("Effects once") for an effect outside the database.
//
//   effect_claim -> claimed:   call fn(key), then effect_done with its result
//                   done:      return the stored result; fn is not called
//                   busy:      throw EffectBusyError; the worker snoozes the job
//                              (no attempt spent, never a skip: the other run
//                              may yet fail and release the claim)
//                   reclaimed: an earlier claim went stale (or an earlier attempt of
//                              this job left it: fenced out, it is reclaimed at
//                              once), its owner may have made
//                              the call: reconcile(key) first when given (it may
//                              return the earlier result), else call fn(key) again
//                              with the same key, so an API that honours
//                              idempotency keys replays instead of acting twice
//   fn throws a definite failure -> effect_release, so a later attempt claims afresh
//
// Every call runs on the pool in its own transaction, also in a transactional
// task: the claim must be committed before the external call is made.
import { createHash } from "node:crypto";
import * as sql from "../sql/index.ts";
import type { HeldJob } from "./held-jobs.ts";
import type { EffectOptions } from "./types.ts";
import type { WorkerState } from "./worker-state.ts";

/** effect_claim answered busy: a fresh claim on the key is held elsewhere. The job is snoozed, its attempt not spent. */
export class EffectBusyError extends Error {
  readonly key: string;
  constructor(key: string) {
    super(`effect "${key}" is claimed by another run that has not finished; retrying later`);
    this.name = "EffectBusyError";
    this.key = key;
  }
}

/**
 * The owner of an effect claim: one attempt of one job on one worker, and a
 * digest of the attempt's lease token. effect_done and effect_release trust
 * whoever names the owner, and a job's id, attempt and worker are no secret
 * (idemq.job() shows them to every worker): without the digest another
 * worker could finish or release this attempt's claims. A digest, not the
 * token: an owner appears in errors (EffectClaimLostError) and records.
 */
export function effectOwner(state: WorkerState, held: HeldJob): string {
  const digest = createHash("sha256").update(held.job.leaseToken).digest("hex").slice(0, 16);
  return `job:${held.job.id}:${held.job.attempt}@${state.settings.workerId}#${digest}`;
}

/** How an effect's outcome is recorded (effect_done): on its own by default; an external step records its ledger row with it. */
export type RecordDone = (key: string, owner: string, result: unknown) => Promise<void>;

export async function runEffect<T>(
  state: WorkerState,
  held: HeldJob,
  key: string,
  fn: (key: string) => Promise<T> | T,
  options: EffectOptions<T> = {},
  recordDone: RecordDone = (k, owner, result) => sql.effectDone(state.calls, k, owner, result),
): Promise<T> {
  if (typeof key !== "string" || key === "") throw new TypeError("ctx.effect: key must be a non-empty string");
  if (typeof fn !== "function") throw new TypeError("ctx.effect: fn must be a function (key) => result");
  // A lost lease (or a shutdown past its timeout): start no new external call.
  if (held.abortedBy !== undefined) throw held.abortedBy;
  const owner = effectOwner(state, held);
  const claim = await sql.effectClaim(state.calls, key, owner, {
    staleAfter: options.staleAfter,
    attemptOf: { jobId: held.job.id, attempt: held.job.attempt, leaseToken: held.job.leaseToken },
  });
  switch (claim.status) {
    case "done":
      return claim.result as T;
    case "busy":
      throw new EffectBusyError(key);
    case "reclaimed":
      if (options.reconcile !== undefined) {
        // A failing reconcile keeps the claim: nobody knows whether the effect happened.
        const earlier = await options.reconcile(key);
        if (earlier !== undefined) {
          await recordDone(key, owner, earlier);
          return earlier;
        }
      }
      break;
    case "claimed":
      break;
  }
  let result: T;
  try {
    result = await fn(key);
  } catch (error) {
    if (options.definiteFailure?.(error) ?? true) {
      try {
        await sql.effectRelease(state.calls, key, owner);
      } catch (releaseError) {
        // The claim stays and goes stale; the job's error is fn's.
        state.report(`effect_release of "${key}"`, releaseError);
      }
    }
    throw error;
  }
  await recordDone(key, owner, result);
  return result;
}
