// Whether this worker waits for jobs, told to the database (idemq.wait_for_jobs
// and stop_waiting): enqueues NOTIFY only while some worker waits, because
// PostgreSQL serialises the commits of transactions that notify. The marker is
// a session lock, so it lives on a connection of its own, held for good (not
// the LISTEN connection: pg-listen does not lend its client); when that
// connection is lost the marker goes with it, and the next claim that comes
// back short sets it again on a new one.
import pg from "pg";
import * as sql from "../sql-api.ts";
import { APPLICATION_NAME } from "./defaults.ts";
import type { WorkerState } from "./worker-state.ts";

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
   * transaction is still open (notifications flow already: try again soon).
   */
  async wait(): Promise<boolean> {
    if (this.stopped) return false;
    const client = await this.connect();
    this.confirmed = await sql.waitForJobs(client, this.state.settings.queues);
    return this.confirmed;
  }

  /** A claim came back full: there is a backlog, and nobody needs to notify this worker. */
  async stopWaiting(): Promise<void> {
    this.confirmed = false;
    if (this.client === undefined) return;
    await sql.stopWaiting(await this.client, this.state.settings.queues);
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
    const client = new pg.Client({ fallback_application_name: APPLICATION_NAME.marker, ...this.connection });
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
    connected = client.connect().then(
      () => client,
      (error: unknown) => {
        if (this.client === connected) this.client = undefined;
        client.removeAllListeners();
        client.on("error", () => {});
        throw error;
      },
    );
    this.client = connected;
    return connected;
  }
}
