// Whether a connection would go through a transaction pooler (PgBouncer's
// pool_mode = transaction or statement), where a session's state does not
// outlive its transaction. Asked by a listen-mode worker at start of the
// pool's connections (a named prepared statement parsed on one server
// connection would be bound on another: prepared-calls.ts) and, when they go
// elsewhere (listenConnectionString), of the listen connections: there LISTEN would
// run on whichever server connection the pooler lent for that one
// statement, its notifications would go to that server connection and no
// longer reach this client (the worker would wait on its fallback poll), and
// the LISTEN and the wait marker's advisory lock would stay on that server
// connection after the worker stops.
//
// Checked once, at start, before the worker makes any session state, on a
// short-lived connection made as the pool's (or the listener's) would be:
//
// 1. The server announces its backend pid at connect (BackendKeyData); when
//    pg_backend_pid() says the same, this is a direct server: done. That is
//    the protocol, so the probe cannot fire against a direct server. A pooler
//    announces a key of its own (PgBouncer: random).
// 2. Otherwise a proxy speaks for the server; a session pooler (where LISTEN
//    works) keeps this client on one backend for good. Then: the probe's
//    backend, a pool connection's backend (another client of the same
//    pooler), the probe's backend again. Transaction pooling shows as the
//    pool connection being lent the probe's backend (PgBouncer lends the
//    server connection released last) or the probe moving to another backend;
//    with a session pooler neither can happen. Three rounds, in case other
//    clients of the pooler took that server connection meanwhile.
//
// Direct SQL, like pg-listen's own connection check (the same statement):
// introspection of the connection, not an idemq call.
import pg from "pg";
import type { Queryable } from "../../sql/index.ts";
import { APPLICATION_NAME } from "../defaults.ts";

const ROUNDS = 3;

/** What showed a transaction pooler on connections made with `connection`, or undefined (a direct server or a session pooler). */
export async function transactionPoolerEvidence(
  connection: pg.ClientConfig,
  pool: Queryable,
  timeoutMs: number,
): Promise<string | undefined> {
  const probe = new pg.Client({ fallback_application_name: APPLICATION_NAME.listener, ...connection, query_timeout: timeoutMs });
  probe.on("error", () => {}); // a failed query rejects; nothing else is waited for
  await probe.connect();
  try {
    // pg keeps BackendKeyData's pid (untyped in @types/pg).
    const announced = (probe as unknown as { processID: number | null }).processID;
    let before = await backendPid(probe);
    if (announced === before) return undefined;
    for (let round = 1; round <= ROUNDS; round++) {
      const other = await backendPid(pool);
      const after = await backendPid(probe);
      if (other === before) {
        return `another client of the pooler was lent this connection's server backend (pid ${before}) between two of its statements`;
      }
      if (after !== before) return `this connection's statements ran on server backend ${before}, then on ${after}`;
      before = after;
    }
    return undefined;
  } finally {
    await probe.end().catch(() => {});
  }
}

async function backendPid(db: Queryable): Promise<number> {
  const { rows } = await db.query("SELECT pg_backend_pid() AS pid");
  return (rows[0] as { pid: number }).pid;
}
