// The worker's hot calls (claim, heartbeat, complete with a result, the
// batched complete_and_take_next, or complete_many while stopping) as named
// prepared statements: pg sends a named statement's Parse once per
// connection and only Bind/Execute after, so the
// server skips parsing and planning `SELECT * FROM idemq.claim(...)` on
// every call (bench/FINDINGS.md, "The claim's round trip", measures it).
//
// Only where a connection keeps its session: through a transaction pooler
// (PgBouncer's pool_mode = transaction before 1.21) the Bind would reach a
// server connection that never saw the Parse. A listen-mode worker decides
// at start (create-worker.ts, from the pooler probe it runs anyway); poll
// mode, which promises no session state, never prepares. Until then, and
// when it decided against, every call is sent unnamed, as `calls` sends it.
//
// What can still take a statement away, and what happens then:
// - a new connection (a server restart, a killed or timed-out connection,
//   pg.Pool replacing one): pg tracks what it parsed per connection and
//   parses again on the new one by itself;
// - a migration that replaces a function with CREATE OR REPLACE: the
//   statement resolves the function's body at each execution, nothing to do;
// - a server connection that lost it anyway (someone's DISCARD ALL or
//   DEALLOCATE, a pooler the probe took for a session pooler: 26000), one
//   that holds another client's statement of the same name (a session pooler
//   that does not reset its server connections: 42P05), or a statement whose
//   result type a migration changed (a column added to claimed_job: 0A000
//   "cached plan must not change result type"). Each is refused before the
//   function runs, so the call is sent again unnamed, and this worker stops
//   preparing for good (`gaveUp` says so, once): losing 0.1 ms a call beats
//   failing calls on connections pg believes hold the statement.
import { createHash } from "node:crypto";
import type pg from "pg";
import type { Queryable } from "../sql/index.ts";

export class PreparedCalls implements Queryable {
  private preparing = false;
  /** Statement text to its name: one hash per distinct text. */
  private readonly names = new Map<string, string>();

  constructor(
    private readonly calls: Queryable,
    /** Called once, with a line for the log, when a statement was found gone and preparing stopped. */
    private readonly gaveUp: (message: string) => void,
  ) {}

  /** Whether calls are sent as named prepared statements now. */
  get prepared(): boolean {
    return this.preparing;
  }

  /** Start's decision: true once the pool's connections were found to keep their session. */
  decide(prepare: boolean): void {
    this.preparing = prepare;
  }

  query(text: string | pg.QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
    const config: pg.QueryConfig = typeof text !== "string" ? text : values === undefined ? { text } : { text, values };
    if (!this.preparing) return this.calls.query(config as unknown as string);
    return this.calls.query({ ...config, name: this.nameOf(config.text) } as unknown as string).catch((error: unknown) => {
      if (!statementGone(error)) throw error;
      // Calls in flight meanwhile may fail alike: each is sent again, the first says so.
      if (this.preparing) {
        this.preparing = false;
        const { code, message } = error as { code: string; message: string };
        this.gaveUp(
          `a prepared statement of this worker's was gone from its connection (${code}: ${message}): claim, heartbeat, ` +
            `complete, complete_and_take_next and complete_many are sent unprepared from now on (docs/worker.md, "Prepared statements")`,
        );
      }
      return this.calls.query(config as unknown as string);
    });
  }

  /** `idemq_<function>_<hash of the text>`: each text its own name, so two texts never share one (pg refuses that). */
  private nameOf(text: string): string {
    let name = this.names.get(text);
    if (name === undefined) {
      const fn = /idemq\.(\w+)\(/.exec(text)?.[1] ?? "call";
      name = `idemq_${fn}_${createHash("sha256").update(text).digest("hex").slice(0, 16)}`;
      this.names.set(text, name);
    }
    return name;
  }
}

/** The server refused a named statement before running it: not there, already there, or planned for another result type. */
function statementGone(error: unknown): boolean {
  const { code, routine } = (error ?? {}) as { code?: unknown; routine?: unknown };
  return code === "26000" || code === "42P05" || (code === "0A000" && routine === "RevalidateCachedQuery");
}
