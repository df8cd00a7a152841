// The jobs this worker holds a lease on, and the only module that adds them,
// moves them from phase to phase and removes them. Every other module asks it.
//
// A held job is in one of four phases:
//
//   claimed   claim() returned it; it waits in the buffer for a free slot.
//             Heartbeats keep its lease.
//             -> started   a slot is free (startNext)
//             -> released  the worker stops before it started (releaseClaimed),
//                          or it is beyond the buffer's byte budget
//                          (releaseOverBudget); the caller gives it back
//                          with snooze to now
//             -> removed   a heartbeat found its lease gone (fenceOut): no
//                          attempt ran, nothing is left to record
//   started   its handler runs (for a transactional task: on its own
//             transaction). It holds a slot. Heartbeats keep its lease; one
//             that finds the lease gone sets `fencedOut` and aborts ctx.signal.
//             -> finished  the handler is over (finish); a transactional task
//                          gets here before its complete() commits, so a
//                          heartbeat that sees the commit is not a loss
//             -> released  shutdownTimeout ran out (release; the caller hands
//                          it back with fail()): whatever the handler does
//                          afterwards is ignored
//   finished  its outcome (complete, fail, snooze) is being recorded, or
//             waits in the Completer's batch. Heartbeats still extend its
//             lease, but a lost lease no longer changes anything here.
//             -> removed   the outcome is recorded, or given up on (remove)
//   released  given back at shutdown; the snooze or fail() that gives it back
//             is being recorded.
//             -> removed   that call returned (remove)
//
// A job that is removed is no longer this worker's: no heartbeat extends its
// lease. A slot is separate from the phase: a started job takes one, and gives
// it back (freeSlot) once its handler and its transaction are over, which for
// a handed-back job may be long after it was released.
//
// Room to claim: concurrency + prefetch places less the jobs running and
// buffered, none while the buffer is more than half full, and never more
// held jobs than twice those places (when recording outcomes falls behind,
// claiming waits for it). `prefetch` is the window of PrefetchWindow: fixed
// when set, else adapting to the claims (each claim's outcome is fed to it
// here) and to the rate at
// which jobs give their slots back. Bytes bound the buffer too: the jobs waiting in it
// hold at most prefetchBytes of payload (UTF-8 of the JSON text, as measured
// when claimed), or it holds a single job. A claim asks for the free slots
// plus as many waiting jobs as fit in the bytes left at the size of the
// largest recent payload (one, while none is known or the buffer is empty),
// and jobs a claim brought beyond the budget (payloads larger than any seen
// lately) are given back at once, newest first (releaseOverBudget). The claim
// loop is woken from one place, `roomGrew`, when a job gives its slot back,
// when a claimed job leaves the buffer, or when a removal lifts the bound on
// held jobs; a job that runs and is recorded wakes it once.
import type pg from "pg";
import type { Duration } from "../contract.ts";
import { LeaseLostError, TimeoutError } from "../errors.ts";
import type { ClaimedJob } from "../sql/index.ts";
import type { AttemptTrace } from "../tracing/types.ts";
import { PrefetchWindow, type PrefetchBounds } from "./prefetch-window.ts";
import type { NormalizedTask } from "./task-config.ts";

export type Phase = "claimed" | "started" | "finished" | "released";

export interface HeldJob {
  readonly job: ClaimedJob;
  /** undefined: this worker does not know the task. */
  readonly task: NormalizedTask | undefined;
  /** Written by HeldJobs only. */
  phase: Phase;
  /** ctx.signal's controller, made on first use (signalOf): most handlers never read the signal. */
  controller: AbortController | undefined;
  /** Why the attempt was aborted (lease lost, shutdownTimeout): set once, by abortAttempt. */
  abortedBy: Error | undefined;
  /**
   * A heartbeat found the job no longer held by this attempt (rescued,
   * cancelled, taken by a newer attempt): its result is discarded. Not the
   * SQL column `lease_lost`, which says the *previous* attempt lost its lease
   * (ClaimedJob.reclaimed, ctx.job.reclaimed).
   */
  fencedOut: boolean;
  /** performance.now() when the job was claimed (its locked_at, as near as this process knows it). */
  readonly claimedAt: number;
  /** performance.now() when the attempt started (or was claimed), and when its handler was over or it was released. */
  startedAt: number;
  endedAt: number | undefined;
  /** Set by ctx.snooze(). */
  snoozeDelay: Duration | undefined;
  /** Set by ctx.spawn() when children are unfinished: the job is parked (children.ts) once its handler is over. */
  awaitingChildren?: number | undefined;
  /** The job's transaction, for a transactional task. */
  tx: pg.PoolClient | undefined;
  /** The attempt's span, while tracing is on (run-job tells it how the attempt ended). */
  trace: AttemptTrace | undefined;
}

/** Handed back at shutdown: whatever its handler does from now on is ignored. */
export function isReleased(held: HeldJob): boolean {
  return held.phase === "released";
}

/** The attempt's ctx.signal: aborted already when the attempt was (abortAttempt) before anyone asked for it. */
export function signalOf(held: HeldJob): AbortSignal {
  if (held.controller === undefined) {
    held.controller = new AbortController();
    if (held.abortedBy !== undefined) held.controller.abort(held.abortedBy);
  }
  return held.controller.signal;
}

/**
 * The job's own time limit (enqueue's timeout) has passed, as near as this
 * process can tell (within a second of its claim's round trip): heartbeat()
 * stops extending a lease there, so a heartbeat that misses such a job says
 * the limit was reached, and the attempt is aborted and failed with a
 * TimeoutError rather than as a lost lease.
 */
function pastTimeLimit(held: HeldJob): TimeoutError | undefined {
  const limitMs = held.job.timeoutMs;
  if (limitMs === null || performance.now() - held.claimedAt < limitMs - 1000) return undefined;
  return new TimeoutError(held.job.id, held.job.task, held.job.attempt, limitMs);
}

/** Aborts the attempt's ctx.signal with `reason`; the first reason counts, as with AbortController. */
export function abortAttempt(held: HeldJob, reason: Error): void {
  if (held.abortedBy !== undefined) return;
  held.abortedBy = reason;
  held.controller?.abort(reason);
}

export class HeldJobs {
  private readonly byId = new Map<string, HeldJob>();
  /** Claimed jobs, oldest first. */
  private readonly buffer: HeldJob[] = [];
  /** Started jobs whose handler or transaction is not over yet. */
  private readonly slots = new Set<HeldJob>();
  private readonly window: PrefetchWindow;
  /** Payload bytes of the jobs in the buffer. */
  private bufferedBytes = 0;
  /** Payload sizes of the latest claimed jobs (at most RECENT_SIZES), for sizing the next claim. */
  private readonly recentSizes: number[] = [];

  constructor(
    private readonly tasks: ReadonlyMap<string, NormalizedTask>,
    private readonly limits: {
      readonly concurrency: number;
      /** A fixed number, or the adaptive window's bounds (settings.ts). */
      readonly prefetch: number | PrefetchBounds;
      readonly prefetchBytes: number;
    },
    /** There may be room for more: start buffered jobs, let the claim loop claim. */
    private readonly roomGrew: () => void,
    private readonly now: () => number = () => performance.now(),
  ) {
    const p = limits.prefetch;
    this.window = new PrefetchWindow(typeof p === "number" ? { min: p, max: p, waitBudgetMs: Infinity } : p);
  }

  /** How many claimed jobs may wait in the buffer now. */
  get prefetch(): number {
    return this.window.size(this.now());
  }

  /** Held jobs at most: when recording outcomes falls behind, claiming waits for it. */
  private heldLimit(prefetch: number): number {
    return 2 * (this.limits.concurrency + prefetch);
  }

  /** Jobs whose handlers are running now. */
  get running(): number {
    return this.slots.size;
  }

  /** How many jobs to claim now (the worker claims none while it is not running). */
  room(): number {
    const { concurrency } = this.limits;
    const prefetch = this.prefetch;
    if (this.buffer.length > Math.floor(prefetch / 2)) return 0;
    const freeSlots = concurrency + prefetch - this.slots.size - this.buffer.length;
    // Jobs that start as soon as they arrive, and how many more may wait.
    const startable = Math.max(0, concurrency - this.slots.size - this.buffer.length);
    return Math.max(0, Math.min(freeSlots, startable + this.waitingRoom(), this.heldLimit(prefetch) - this.byId.size));
  }

  /** The jobs waiting for a slot and their payload bytes. */
  get buffered(): { jobs: number; bytes: number } {
    return { jobs: this.buffer.length, bytes: this.bufferedBytes };
  }

  /** How many more claimed jobs may wait in the buffer, by bytes: a guess from recent payloads, checked by releaseOverBudget. */
  private waitingRoom(): number {
    const atLeast = this.buffer.length === 0 ? 1 : 0;
    const typical = this.recentSizes.length === 0 ? undefined : Math.max(1, ...this.recentSizes);
    if (typical === undefined) return atLeast;
    return Math.max(atLeast, Math.floor((this.limits.prefetchBytes - this.bufferedBytes) / typical));
  }

  /** Every held job, whatever its phase. */
  all(): IterableIterator<HeldJob> {
    return this.byId.values();
  }

  inPhase(phase: Phase): HeldJob[] {
    return [...this.byId.values()].filter((held) => held.phase === phase);
  }

  /** The record still holds this attempt of the job. */
  holds(held: HeldJob): boolean {
    return this.byId.get(held.job.id) === held;
  }

  /**
   * -> claimed, in the buffer. `asked`: the batch size of the claim that
   * brought them (even none), for the prefetch window; left out, the window
   * learns nothing.
   */
  claimed(jobs: readonly ClaimedJob[], asked?: number): void {
    if (asked !== undefined) this.window.claimed(asked, jobs.length, this.now());
    const claimedAt = performance.now();
    for (const job of jobs) {
      const held: HeldJob = {
        job,
        task: this.tasks.get(job.task),
        phase: "claimed",
        controller: undefined,
        abortedBy: undefined,
        fencedOut: false,
        claimedAt,
        startedAt: claimedAt,
        endedAt: undefined,
        snoozeDelay: undefined,
        trace: undefined,
        tx: undefined,
      };
      this.byId.set(job.id, held);
      this.buffer.push(held);
      this.bufferedBytes += job.payloadBytes;
      this.recentSizes.push(job.payloadBytes);
    }
    if (this.recentSizes.length > RECENT_SIZES) this.recentSizes.splice(0, this.recentSizes.length - RECENT_SIZES);
  }

  /**
   * claimed -> released for the newest buffered jobs while the buffer holds
   * more than one job and more than prefetchBytes: for the caller to give
   * back (snooze to now) at once. Call it once a claim's jobs have taken the
   * free slots.
   */
  releaseOverBudget(): HeldJob[] {
    const over: HeldJob[] = [];
    while (this.buffer.length > 1 && this.bufferedBytes > this.limits.prefetchBytes) {
      const held = this.buffer.pop()!;
      this.bufferedBytes -= held.job.payloadBytes;
      this.move(held, "released");
      over.push(held);
    }
    return over;
  }

  /** claimed -> started for the oldest buffered job, when a slot is free; it takes the slot. */
  startNext(): HeldJob | undefined {
    if (this.slots.size >= this.limits.concurrency) return undefined;
    const held = this.buffer.shift();
    if (held === undefined) return undefined;
    this.bufferedBytes -= held.job.payloadBytes;
    this.move(held, "started");
    held.startedAt = performance.now();
    this.slots.add(held);
    return held;
  }

  /** started -> finished: the handler is over. A released job stays released. */
  finish(held: HeldJob): void {
    if (held.phase === "started") this.move(held, "finished");
  }

  /** Its handler and transaction are over: the slot goes to the next job. Once per job; later calls do nothing. */
  freeSlot(held: HeldJob): void {
    if (!this.slots.delete(held)) return;
    held.endedAt ??= performance.now();
    this.window.finished(this.now());
    this.roomGrew();
  }

  /** -> released: every claimed job (they leave the buffer), for the caller to give back. */
  releaseClaimed(): HeldJob[] {
    const claimed = this.buffer.splice(0);
    this.bufferedBytes = 0;
    for (const held of claimed) this.move(held, "released");
    return claimed;
  }

  /** started -> released: handed back at shutdown. */
  release(held: HeldJob): void {
    this.move(held, "released");
    held.endedAt = performance.now();
  }

  /**
   * A heartbeat found the lease gone: marks the job fenced out and aborts its
   * signal; returns the phase it was lost in. Undefined when that changes
   * nothing (already fenced out, removed, or finished or released: their
   * calls report a lost lease themselves). A claimed job is removed at once
   * (no attempt ran): the caller reports it; a started one's runner does.
   */
  fenceOut(held: HeldJob): "claimed" | "started" | undefined {
    const phase = held.phase;
    if (held.fencedOut || !this.holds(held) || (phase !== "claimed" && phase !== "started")) return undefined;
    held.fencedOut = true;
    abortAttempt(held, pastTimeLimit(held) ?? new LeaseLostError(`lease lost: attempt ${held.job.attempt} no longer holds job ${held.job.id}`));
    if (phase === "claimed") this.remove(held);
    return phase;
  }

  /** No longer this worker's: its outcome is recorded (or given up on), or it was lost. Idempotent. */
  remove(held: HeldJob): void {
    if (!this.holds(held)) return;
    const atLimit = this.byId.size >= this.heldLimit(this.prefetch);
    this.byId.delete(held.job.id);
    const i = this.buffer.indexOf(held);
    if (i >= 0) {
      this.buffer.splice(i, 1);
      this.bufferedBytes -= held.job.payloadBytes;
    }
    if (i >= 0 || atLimit) this.roomGrew();
  }

  /** The one place a phase changes. */
  private move(held: HeldJob, to: Phase): void {
    if (!ALLOWED[held.phase].includes(to)) {
      throw new Error(`job ${held.job.id}: a held job cannot go from ${held.phase} to ${to}`);
    }
    held.phase = to;
  }
}

/** How many recent payload sizes size the next claim: a burst of large payloads is remembered for this many jobs. */
const RECENT_SIZES = 64;

const ALLOWED: Readonly<Record<Phase, readonly Phase[]>> = {
  claimed: ["started", "released"],
  started: ["finished", "released"],
  finished: [],
  released: [],
};
