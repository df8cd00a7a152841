// Whether this worker waits for jobs, told to the database (idemq.wait_for_jobs
// and stop_waiting): enqueues NOTIFY only while some worker waits, because
// PostgreSQL serialises the commits of transactions that notify. The marker is
// a session lock, so it lives on a connection of its own, held for good (not
// the LISTEN connection: pg-listen does not lend its client); when that
// connection is lost the marker goes with it, and the next claim that comes
// back short sets it again on a new one.
//
// Its calls never wait for a lock (wait_for_jobs only tries its advisory keys,
// which any role that can connect may hold), and each is bounded besides
// (markerCallTimeout, on the client and as the session's statement_timeout):
// a call that fails or times out ends the connection, so the marker is in a
// known state again (none) and the next wait() starts afresh. The
// statement_timeout is SET once connected, not sent as a startup parameter,
// which PgBouncer refuses (a session pooler keeps the session; behind a
// transaction pooler the worker has no marker: pooler-probe.ts).
import pg from "pg";
import * as sql from "../../sql/index.ts";
import { APPLICATION_NAME } from "../defaults.ts";
import type { WorkerState } from "../worker-state.ts";

export class WaitMarker {
  private client: Promise<pg.Client> | undefined;
  /** wait_for_jobs returned true and nothing ended the marker since. */
  private confirmed = false;
  private stopped = false;

  constructor(
    private readonly state: WorkerState,
    private readonly connection: pg.ClientConfig,
    /** The marker was lost with its connection: claim again to set it anew. */
    private readonly lost: () => void,
  ) {}

  /** True while enqueues are known to notify this worker and a claim already saw what they skipped. */
  get waiting(): boolean {
    return this.confirmed;
  }

  /**
   * Declares the worker waiting. True once a claim made now sees every job
   * that became runnable without a NOTIFY; false while such an enqueue's
   * transaction is still open or another session holds one of the keys
   * (enqueues notify meanwhile: try again soon). Never blocks on a lock.
   */
  async wait(): Promise<boolean> {
    if (this.stopped) return false;
    const client = await this.connect();
    this.confirmed = await this.bounded(client, () => sql.waitForJobs(client, this.state.settings.queues));
    return this.confirmed;
  }

  /** A claim came back full: there is a backlog, and nobody needs to notify this worker. */
  async stopWaiting(): Promise<void> {
    this.confirmed = false;
    if (this.client === undefined) return;
    const client = await this.client;
    await this.bounded(client, () => sql.stopWaiting(client, this.state.settings.queues));
  }

  /** Runs one call; when it fails (or timed out) the connection is ended: what it holds is unknown. */
  private async bounded<T>(client: pg.Client, run: () => Promise<T>): Promise<T> {
    const madeAt = performance.now();
    try {
      const answer = await run();
      this.state.reached(madeAt);
      return answer;
    } catch (error) {
      if (this.client !== undefined && (await this.client.catch(() => undefined)) === client) {
        this.client = undefined;
        this.confirmed = false;
        client.removeAllListeners();
        client.on("error", () => {});
        // Not awaited: a stalled connection may never answer the goodbye.
        client.end().catch(() => {});
      }
      throw error;
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.confirmed = false;
    const client = this.client;
    this.client = undefined;
    if (client === undefined) return;
    try {
      await (await client).end();
    } catch (error) {
      this.state.report("closing the wait-marker connection", error);
    }
  }

  private connect(): Promise<pg.Client> {
    if (this.client !== undefined) return this.client;
    const timeout = this.state.settings.markerCallTimeoutMs;
    const client = new pg.Client({
      fallback_application_name: APPLICATION_NAME.marker,
      ...this.connection,
      query_timeout: timeout,
    });
    // One termination emits 'error' and then 'end', and the first may already
    // have a replacement connecting: only the current connection's first event
    // counts, or the replacement would be orphaned, holding the marker.
    let connected: Promise<pg.Client> | undefined;
    const forget = (error?: Error) => {
      if (connected === undefined || this.client !== connected || this.stopped) return;
      this.client = undefined;
      this.confirmed = false;
      if (error !== undefined) this.state.report("wait-marker connection", error);
      this.lost();
    };
    client.on("error", forget);
    client.on("end", () => forget());
    connected = client
      .connect()
      .then(() => client.query(`SET statement_timeout = ${Math.round(timeout)}`))
      .then(
        () => client,
        (error: unknown) => {
          if (this.client === connected) this.client = undefined;
          client.removeAllListeners();
          client.on("error", () => {});
          // Connected but not set up (the SET failed): not awaited, as in bounded().
          client.end().catch(() => {});
          throw error;
        },
      );
    this.client = connected;
    return connected;
  }
}
