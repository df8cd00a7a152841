// Wake-ups for the claim loop in listen mode (wake-ups.ts): NOTIFY on
// idemq_jobs through pg-listen (its own connection, outside the pool) and a
// jittered fallback poll.
//
// pg-listen reconnects after the connection is lost (pg_terminate_backend, a
// server restart) and re-LISTENs; with retryTimeout 0 it never gives up.
// NOTIFYs sent while it was disconnected are lost, so every (re)connect wakes
// the claim loop once.
import type pg from "pg";
import pgListen from "pg-listen";
import { NOTIFY_CHANNEL } from "../../contract.ts";
import { APPLICATION_NAME } from "../defaults.ts";
import { JitteredTimer } from "../timers.ts";
import type { WorkerState } from "../worker-state.ts";

type Subscriber = ReturnType<typeof pgListen.default>;

// Node's ESM loader hands over module.exports; a bundler or tsx may hand over exports.default.
const pgListenModule = pgListen as unknown as typeof pgListen.default | { default: typeof pgListen.default };
export const createSubscriber: typeof pgListen.default =
  "default" in pgListenModule && typeof pgListenModule.default === "function"
    ? pgListenModule.default
    : (pgListenModule as typeof pgListen.default);

export class Listener {
  private subscriber: Subscriber | undefined;
  private readonly poll: JitteredTimer;

  constructor(
    private readonly state: WorkerState,
    private readonly connection: pg.ClientConfig,
    private readonly wake: (why: "notify" | "connected" | "poll" | "timer") => void,
  ) {
    this.poll = new JitteredTimer(state.settings.pollMs, async () => this.wake("poll"));
  }

  async start(): Promise<void> {
    const subscriber = createSubscriber(
      { fallback_application_name: APPLICATION_NAME.listener, ...this.connection },
      {
        retryTimeout: 0,
        // The payload is a bare queue name, not JSON.
        parse: (payload: string) => payload,
      },
    );
    const queues = this.state.settings.queues;
    subscriber.events.on("notification", ({ channel, payload }) => {
      if (channel !== NOTIFY_CHANNEL) return;
      if (queues === undefined || queues.includes(payload as string)) this.wake("notify");
    });
    subscriber.events.on("connected", () => this.wake("connected"));
    subscriber.events.on("reconnect", (attempt) => {
      if (attempt === 1) this.state.emit("log", { level: "warn", message: "LISTEN connection lost; reconnecting", workerId: this.state.settings.workerId });
    });
    subscriber.events.on("error", (error) => this.state.report("LISTEN connection", error));
    this.subscriber = subscriber;
    await subscriber.connect();
    await subscriber.listenTo(NOTIFY_CHANNEL);
    this.poll.start();
  }

  async stop(): Promise<void> {
    await this.poll.stop();
    const subscriber = this.subscriber;
    this.subscriber = undefined;
    if (subscriber !== undefined) {
      try {
        await subscriber.close();
      } catch (error) {
        this.state.report("closing the LISTEN connection", error);
      }
    }
  }
}
