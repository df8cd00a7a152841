// One bench run per server at a time: two runs would measure each other's
// load (their databases are their own: each name carries the run's process
// id, bench/db.ts).
// Advisory locks are scoped to one database, so the lock is always taken in
// the server's maintenance database (`postgres`), by a connection of its own
// that holds it until the process exits. A second run waits for the first
// (saying so) rather than failing: parallel sessions serialize their runs.

import pg from "pg";

/** An arbitrary constant: "idemq-bench". */
const LOCK_KEY = 7_193_451_802;
/** How often a waiting run says it is still waiting. */
const WAIT_NOTICE_MS = 30_000;

/** Resolves holding the lock; call the returned function at the end of the run to release it (it closes the lock's connection, which would otherwise keep the process alive). */
export async function lockBenchRuns(server: string, log: (line: string) => void): Promise<() => Promise<void>> {
  const url = new URL(server);
  url.pathname = "/postgres";
  const client = new pg.Client({ connectionString: url.toString() });
  client.on("error", () => {});
  await client.connect();
  const { rows } = await client.query("SELECT pg_try_advisory_lock($1::bigint) AS ok", [LOCK_KEY]);
  const release = () => client.end();
  if ((rows[0] as { ok: boolean }).ok) return release;
  log("another bench run is using this server (advisory lock held): waiting for it to finish");
  const started = Date.now();
  const notice = setInterval(() => log(`still waiting for the other bench run (${Math.round((Date.now() - started) / 1000)} s)`), WAIT_NOTICE_MS);
  try {
    await client.query("SELECT pg_advisory_lock($1::bigint)", [LOCK_KEY]);
  } catch (error) {
    await client.end();
    throw error;
  } finally {
    clearInterval(notice);
  }
  log(`got the bench lock after ${Math.round((Date.now() - started) / 1000)} s`);
  return release;
}
