// Settings that exist only in the worker process (timers, buffer sizes).
// SQL defaults are not repeated here, with two deliberate exceptions: the
// lease, and apply_retention's batch size (retentionBatchSize). The worker schedules its heartbeats from the lease it asked for, so
// it always passes one to claim() and heartbeat() instead of relying on
// claim's own default. Key retention and an effect's stale_after are left out
// of the calls when not configured, so their defaults live only in SQL.

export const WORKER_DEFAULTS = {
  /** Jobs running at once. */
  concurrency: 10,
  /**
   * Payload bytes (UTF-8 of the JSON text) that claimed jobs waiting for a
   * slot may hold, beyond the one job the buffer may always hold: 32 MiB.
   */
  prefetchBytes: 32 * 1024 * 1024,
  /**
   * With `prefetch` left unset the buffer's window adapts (prefetch-window.ts)
   * from `concurrency` up to this many jobs: the counterpart of Graphile
   * Worker's tuned localQueue size 500, and the fixed prefetch the bench's
   * tuned idemq runs with.
   */
  prefetchMax: 490,
  /**
   * ... and never so far that the last buffered job would wait longer than
   * this share of the lease to start: window <= completion rate x lease x
   * prefetchLeaseShare (settings.ts computes the budget once). A buffered job
   * holds a lease that only heartbeats keep, while another worker may be idle;
   * a quarter of the lease (under one heartbeat interval, lease / 3) keeps that
   * wait shorter than two missed heartbeats by far.
   */
  prefetchLeaseShare: 0.25,
  /** How long a claimed job is this worker's between heartbeats. */
  lease: "30 seconds",
  /** A heartbeat every lease / heartbeatsPerLease, so two may fail before a lease runs out. */
  heartbeatsPerLease: 3,
  /** How the worker learns of new jobs: one of WAKE_UP_MODES. */
  wakeUp: "listen",
  /**
   * listen: the fallback poll when no NOTIFY arrives (jittered ±25%); it also
   * finds due retries and delayed jobs. poll: the longest gap between two
   * claims, reached while claims keep coming back empty.
   */
  pollInterval: "2 seconds",
  /**
   * poll mode: the gap between two claims right after a claim brought jobs or
   * a job finished; it doubles with each empty claim, up to pollInterval.
   */
  minPollInterval: "50ms",
  /** rescue() on a jittered timer (±25%). */
  rescueInterval: "15 seconds",
  /** tick() (schedules) on a jittered timer; keep it under the schedules' misfire_grace (default 1 minute). */
  tickInterval: "10 seconds",
  /** prune_keys() on a slower jittered timer. */
  pruneInterval: "1 hour",
  /**
   * worker_seen() on a jittered timer: the worker's row in idemq.workers says
   * it is there (idemq doctor's workers check counts a worker seen within
   * --worker-timeout, 2 minutes by default, so several refreshes may fail).
   */
  presenceInterval: "15 seconds",
  /** apply_retention() on a jittered timer: finished jobs past their retention are deleted. */
  retentionInterval: "1 minute",
  /**
   * Jobs one apply_retention() call deletes at most. The worker's own (it is
   * passed in every call, like the lease): a tick calls again while a batch
   * comes back full, so it must know the size it asked for. Small, so each
   * call is a short transaction.
   */
  retentionBatchSize: 500,
  /** A tick stops calling apply_retention() after this long; the next tick goes on. */
  retentionTickBudget: "2 seconds",
  /** How long stop() lets running jobs finish before handing them back. */
  shutdownTimeout: "25 seconds",
  /** Jobs completed by one complete_many call at most. */
  completionBatch: 1000,
  /** Wait before retrying a failed claim or completion (jittered). */
  errorBackoff: "1 second",
  /**
   * How long a transactional job's transaction may sit idle beyond its lease
   * before the server ends the session (idle_in_transaction_session_timeout):
   * a worker that froze or was cut off has stopped heartbeating by then, its
   * lease ran out and the attempt can no longer commit, so its session stops
   * holding the guard row and locks (instead of until TCP gives up, hours).
   * A live worker's heartbeats restart that idle timer (run-transactional.ts,
   * keepTransactionBusy), so the timeout never ends a live handler's session.
   */
  idleInTransactionMargin: "5 seconds",
  /** TCP keepalive probes start after this much silence on a worker connection (a frozen network is noticed). */
  keepAliveDelay: "10 seconds",
  /** A job whose ctx.effect answered busy runs again after about this long (jittered ±50%), its attempt not spent. */
  effectBusySnooze: "5 seconds",
  /**
   * The longest the worker waits for any idemq call (claim, complete, heartbeat,
   * ...; maintenance gets its interval when that is longer): then it gives up on
   * the call and its connection and goes on. A call answered later than a lease
   * is of no use anyway: the jobs it concerns are being rescued.
   */
  callTimeout: "30 seconds",
  /**
   * The longest the worker waits for wait_for_jobs or stop_waiting. They never
   * wait for a lock (no session can make them block), so this bounds only a
   * stalled connection; the marker connection is then replaced.
   */
  markerCallTimeout: "5 seconds",
} as const;

/**
 * How a worker learns of new jobs.
 *   listen  LISTEN idemq_jobs and the wait marker (idemq.wait_for_jobs), each on
 *           a connection of its own held for good (listenConnectionString, or
 *           the worker's own): jobs start milliseconds after their enqueue
 *           commits; a fallback poll every pollInterval. Needs connections
 *           that keep their session: a direct server, or a session-pooling
 *           PgBouncer.
 *   poll    no session state at all (no LISTEN, no advisory lock, no session
 *           SET, no prepared statement): claims on an adaptive poll, from
 *           minPollInterval after activity growing to pollInterval while
 *           claims come back empty. Works through a transaction pooler.
 */
export const WAKE_UP_MODES = ["listen", "poll"] as const;
export type WakeUpMode = (typeof WAKE_UP_MODES)[number];

/** The largest batch claim() accepts (its batch_size range is 1..1000). */
export const MAX_CLAIM_BATCH = 1000;

/** The largest batch apply_retention() and purge() accept (_check_delete_batch: 1..10000). */
export const MAX_DELETE_BATCH = 10000;

/** Shows up in pg_stat_activity unless the connection string names an application. */
export const APPLICATION_NAME = { pool: "idemq-worker", listener: "idemq-listener", marker: "idemq-wait-marker" } as const;
