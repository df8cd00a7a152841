// The claim loop's wake-ups, in one of the modes of WAKE_UP_MODES (defaults.ts):
//   listen  NOTIFY through pg-listen and the wait marker, each on a connection
//           of its own held for good (listener.ts, wait-marker.ts), plus the
//           fallback poll: ListenWakeUps.
//   poll    no connection of its own and no session state: the claim loop's
//           own claims, on an adaptive poll (PollWakeUps). What a transaction
//           pooler can carry: every claim is one statement on whichever server
//           connection the pooler lends.
// Both wake the loop early for the retries and snoozes this worker scheduled
// itself (WakeTimers).
import type pg from "pg";
import { Listener } from "./listener.ts";
import { jitter } from "../timers.ts";
import { WaitMarker } from "./wait-marker.ts";
import type { WorkerState } from "../worker-state.ts";

export type WakeReason = "notify" | "connected" | "poll" | "timer";

export interface WakeUps {
  /** listen mode: the marker the claim loop sets when a claim comes back short; poll mode: none. */
  readonly marker: WaitMarker | undefined;
  start(): Promise<void>;
  stop(): Promise<void>;
  /** Wakes the claim loop at `at` (epoch ms), when that comes before the next poll anyway. */
  wakeAt(at: number): void;
  /** A claim came back with `count` jobs. */
  claimed(count: number): void;
  /** A slot came free (a job finished): work may follow (continuations, a producer's next job). */
  finished(): void;
}

/** Timers for the retries and snoozes this worker scheduled itself. */
class WakeTimers {
  private readonly timers = new Set<NodeJS.Timeout>();
  private stopped = false;

  constructor(
    private readonly pollMs: number,
    private readonly wake: (why: WakeReason) => void,
  ) {}

  at(at: number): void {
    if (this.stopped) return;
    const delay = at - Date.now();
    if (delay >= this.pollMs) return;
    // A little late rather than early: run_at is compared with the database's clock.
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      this.wake("timer");
    }, Math.max(0, delay) + 20);
    this.timers.add(timer);
  }

  stop(): void {
    this.stopped = true;
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
  }
}

export class ListenWakeUps implements WakeUps {
  readonly marker: WaitMarker;
  private readonly listener: Listener;
  private readonly timers: WakeTimers;

  constructor(state: WorkerState, connection: pg.ClientConfig, wake: (why: WakeReason) => void) {
    this.marker = new WaitMarker(state, connection, () => wake("connected"));
    this.listener = new Listener(state, connection, wake);
    this.timers = new WakeTimers(state.settings.pollMs, wake);
  }

  start(): Promise<void> {
    return this.listener.start();
  }

  async stop(): Promise<void> {
    this.timers.stop();
    await Promise.all([this.listener.stop(), this.marker.stop()]);
  }

  wakeAt(at: number): void {
    this.timers.at(at);
  }

  claimed(): void {}

  finished(): void {}
}

/**
 * The adaptive poll: a claim minPollMs after a claim that brought jobs or a
 * job that finished (work tends to come in runs), the gap doubling with each
 * empty claim up to pollMs (an idle worker claims every pollMs, jittered ±25%).
 * One timer, always for the next claim: a claim reschedules it.
 */
export class PollWakeUps implements WakeUps {
  readonly marker = undefined;
  private gapMs: number;
  private timer: NodeJS.Timeout | undefined;
  private dueAt = Number.POSITIVE_INFINITY;
  private stopped = false;
  private readonly timers: WakeTimers;

  constructor(
    private readonly state: WorkerState,
    private readonly wake: (why: WakeReason) => void,
  ) {
    this.gapMs = state.settings.minPollMs;
    this.timers = new WakeTimers(state.settings.pollMs, wake);
  }

  /** Nothing to connect: the claim loop claims as soon as it starts. */
  async start(): Promise<void> {}

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.timers.stop();
  }

  wakeAt(at: number): void {
    this.timers.at(at);
  }

  claimed(count: number): void {
    const { minPollMs, pollMs } = this.state.settings;
    this.gapMs = count > 0 ? minPollMs : Math.min(this.gapMs * 2, pollMs);
    this.pollIn(this.gapMs);
  }

  finished(): void {
    this.gapMs = this.state.settings.minPollMs;
    if (this.dueAt > Date.now() + this.gapMs) this.pollIn(this.gapMs);
  }

  private pollIn(ms: number): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    const delay = jitter(ms);
    this.dueAt = Date.now() + delay;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.dueAt = Number.POSITIVE_INFINITY;
      this.wake("poll");
    }, delay);
  }
}
