// Whether the worker reaches its database, as its own calls find out. The
// first connection failure of an outage is one worker:error and starts the
// outage; the calls that fail after it (a claim loop polling a server that is
// down, a heartbeat, each job's fail()) are counted, not reported — a restart
// would otherwise print a line per try. Other errors are always reported.
//
// An outage ends (one worker:reconnected) when a connection opened after it
// began is accepted. An answer to a call, even one made after the outage
// began, is not enough: it may come on a connection the server has not cut
// yet. A fast or immediate shutdown signals the backends one by one, so on a
// loaded machine the worker can read the first cut (the outage begins), send
// its next call on another pooled connection and have it answered before that
// backend is signalled; its cut a moment later then began a second outage for
// one restart (CI, server-restart.test.ts: 5 outages for 4 restarts). A server
// shutting down or starting up refuses new connections (57P03), so a
// connection opened after the first cut was seen is accepted only by a server
// that is up again. The pool does not say when its connections were opened,
// so the evidence is a probe: the first call made after the outage began that
// gets an answer (any idemq call: worker-state.ts's timedCalls, a
// transactional job's guard and complete, the wait marker's calls, not only a
// claim) opens one fresh connection; accepted, it ends the outage. Refused,
// the outage goes on and the next answered call probes again: after a
// restart the pool's own calls reach the server on new connections, and a
// single cut connection (pg_terminate_backend) leaves the others answering,
// so either way the outage ends one connection set-up after the first answer,
// with no timer. (The claim loop sleeps a second after a failed claim and
// waits for a NOTIFY after an empty one: ending an outage on any call, not
// only a claim, keeps a second restart within that time from being folded
// into the first, unreported.)
import pg from "pg";
import { isConnectionFailure } from "../errors.ts";

/** Opens a new connection to the worker's database and closes it: resolves once the server accepted it. */
export type OpenConnection = () => Promise<void>;

/**
 * Opens one connection as `pool` would (its settings, so its server and role,
 * and its application_name), outside it: a pooled connection may be an old
 * one. Connecting is the whole probe, no statement: ReadyForQuery comes from
 * a backend that started up, so from a server that accepts connections. At
 * most `timeoutMs` to connect.
 */
export async function openConnection(pool: pg.Pool, timeoutMs: number): Promise<void> {
  const { max: _max, min: _min, idleTimeoutMillis: _idle, ...config } = pool.options as pg.PoolConfig;
  const client = new pg.Client({ ...config, connectionTimeoutMillis: config.connectionTimeoutMillis || timeoutMs });
  client.on("error", () => {}); // a cut after the answer says nothing more
  try {
    await client.connect();
  } finally {
    // Not awaited: a stalled connection may never answer the goodbye.
    client.end().catch(() => {});
  }
}

export class Outage {
  /** When the outage's first connection failure was seen (performance.now()); undefined while the database answers. */
  private since: number | undefined;
  private failedCalls = 0;
  /** The probe in flight (at most one), settled when it has ended the outage or failed. */
  private probing: Promise<void> | undefined;
  /** The outages that ended since the worker started, and their time down: worker_seen() reports them (the dashboard's workers page). */
  private readonly lived = { outages: 0, downMs: 0 };

  constructor(
    private readonly ended: (downMs: number, failedCalls: number) => void,
    private readonly open: OpenConnection,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whether this failure is worth a worker:error: not a connection failure, or the first of an outage. */
  failed(error: unknown): boolean {
    if (!isConnectionFailure(error)) return true;
    this.failedCalls++;
    if (this.since !== undefined) return false;
    this.since = this.now();
    return true;
  }

  /**
   * A call made at `madeAt` (performance.now()) got its answer: if an outage
   * began at or before `madeAt`, a fresh connection is opened to see whether
   * the server is back (the returned promise settles when that probe has
   * ended the outage or failed). The answer to an earlier call says nothing of
   * the database now: each connection's answers and failures are read in the
   * order they happen to arrive, so a claim answered just before a shutdown
   * can be read just after the first failure the shutdown caused on another
   * connection.
   */
  reached(madeAt: number): Promise<void> {
    if (this.since === undefined || madeAt < this.since) return Promise.resolve();
    this.probing ??= this.probe(this.since).finally(() => (this.probing = undefined));
    return this.probing;
  }

  private async probe(since: number): Promise<void> {
    try {
      await this.open();
    } catch (error) {
      // Refused or cut: still down (the next answered call probes again). Any
      // other answer (too many connections, a password) came from a server
      // that accepts connections, which is what this asks.
      if (isConnectionFailure(error)) return;
    }
    const downMs = Math.round(this.now() - since);
    const failedCalls = this.failedCalls;
    this.since = undefined;
    this.failedCalls = 0;
    this.lived.outages++;
    this.lived.downMs += downMs;
    this.ended(downMs, failedCalls);
  }

  /** The outages lived through so far (ended ones: one in progress is counted when it ends). */
  livedThrough(): { outages: number; downMs: number } {
    return { ...this.lived };
  }
}
