// Effects once: guard() for a transactional job's writes, and the effect
// claims (effect_claim, effect_done, effect_release) for effects outside the
// database.

import type pg from "pg";
import type { Duration, EffectStatus } from "../contract.ts";
import { integer, interval, jsonb, leaseToken, requiredText, text, toJobId } from "../encode.ts";
import type { JobAttempt } from "./attempts.ts";
import { call, callInline, scalar, type Queryable } from "./call.ts";

/**
 * BEGIN and guard() in one round trip: opens the transaction a transactional
 * job runs in. `begin` opens the transaction (BEGIN, perhaps followed by SET
 * LOCAL statements).
 */
export async function beginWithGuard(client: pg.ClientBase, key: string, task?: string, begin = "BEGIN"): Promise<boolean> {
  const rows = await callInline<"guard", { r: boolean }>(
    client,
    "guard",
    { key: requiredText(key, "key"), task: text(task, "task") },
    { before: begin },
  );
  return rows[0]!.r;
}

/** true: go ahead (in this transaction); false: another delivery already committed this effect. */
export function guard(db: Queryable, key: string, task?: string): Promise<boolean> {
  return scalar(db, "guard", { key: requiredText(key, "key"), task: text(task, "task") });
}

export interface EffectClaimResult {
  status: EffectStatus;
  /** What the effect returned, when status is `done`. */
  result: unknown;
}

export async function effectClaim(
  db: Queryable,
  key: string,
  owner: string,
  opts: {
    staleAfter?: Duration | undefined;
    /** The job attempt the claim is made for: a claim left by an earlier attempt of it is reclaimed at once. */
    attemptOf?: JobAttempt | undefined;
  } = {},
): Promise<EffectClaimResult> {
  const rows = await call<"effect_claim", { status: EffectStatus; result: unknown }>(db, "effect_claim", {
    key: requiredText(key, "key"),
    owner: requiredText(owner, "owner"),
    stale_after: interval(opts.staleAfter),
    job_id: opts.attemptOf === undefined ? undefined : toJobId(opts.attemptOf.jobId),
    attempt: opts.attemptOf === undefined ? undefined : integer(opts.attemptOf.attempt, "attempt"),
    lease_token: opts.attemptOf === undefined ? undefined : leaseToken(opts.attemptOf.leaseToken),
  });
  const row = rows[0]!;
  return { status: row.status, result: row.result };
}

export async function effectDone(db: Queryable, key: string, owner: string, result?: unknown): Promise<void> {
  await call(db, "effect_done", {
    key: requiredText(key, "key"),
    owner: requiredText(owner, "owner"),
    result: jsonb(result, "result") ?? null,
  });
}

/**
 * BEGIN and effect_done() in one round trip, on a connection whose
 * transaction goes on to record more with it (an external step's ledger
 * row: stepRecordAndCommit), so both commit with one WAL flush.
 */
export async function beginWithEffectDone(client: pg.ClientBase, key: string, owner: string, result?: unknown): Promise<void> {
  await callInline(
    client,
    "effect_done",
    { key: requiredText(key, "key"), owner: requiredText(owner, "owner"), result: jsonb(result, "result") ?? null },
    { before: "BEGIN" },
  );
}

export async function effectRelease(db: Queryable, key: string, owner: string): Promise<void> {
  await call(db, "effect_release", { key: requiredText(key, "key"), owner: requiredText(owner, "owner") });
}
