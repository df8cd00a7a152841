// One bench run per server at a time: runs reuse database names
// (bench_<system>_r<round>) and would drop each other's, and would measure
// each other's load. A session advisory lock, held by the admin connection
// until it closes.

import type pg from "pg";

/** An arbitrary constant: "idemq-bench". */
const LOCK_KEY = 7_193_451_802;

export async function lockBenchRuns(admin: pg.ClientBase): Promise<void> {
  const { rows } = await admin.query("SELECT pg_try_advisory_lock($1::bigint) AS ok", [LOCK_KEY]);
  if (!(rows[0] as { ok: boolean }).ok) {
    throw new Error("another bench run is using this server (advisory lock held); wait for it to finish");
  }
}
