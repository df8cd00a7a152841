// Measurements: machine CPU (/proc/stat), CPU of given processes (/proc/<pid>/stat),
// WAL (pg_current_wal_lsn, optionally attributed to one database with
// pg_walinspect), and the small statistics the report needs.

import { readFileSync } from "node:fs";
import type pg from "pg";

type Queryable = Pick<pg.ClientBase, "query">;

// ------------------------------------------------------------------ CPU

/** Kernel clock ticks per second for /proc (USER_HZ); 100 on every Linux we run on. */
const TICKS_PER_SECOND = 100;

/** Busy and total ticks of all cores since boot, from the first line of /proc/stat. */
export interface MachineCpu {
  busy: number;
  total: number;
}

/**
 * Machine CPU: user + nice + system + irq + softirq + steal over all cores
 * (guest time is already inside user). Idle and iowait are not busy.
 */
export function readMachineCpu(): MachineCpu {
  const line = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!;
  const f = line.trim().split(/\s+/).slice(1).map(Number);
  const [user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0] = f;
  const busy = user + nice + system + irq + softirq + steal;
  return { busy, total: busy + idle + iowait };
}

/** CPU seconds the machine spent busy between two readings. */
export function machineCpuSeconds(before: MachineCpu, after: MachineCpu): number {
  return (after.busy - before.busy) / TICKS_PER_SECOND;
}

/** utime + stime of a process in seconds, or null when it is gone or unreadable. */
export function readProcessCpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may contain spaces; fields after it are fixed.
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (Number(rest[11]) + Number(rest[12])) / TICKS_PER_SECOND;
  } catch {
    return null;
  }
}

/** The name of a process (/proc/<pid>/comm), or null. */
function processName(pid: number): string | null {
  try {
    return readFileSync(`/proc/${pid}/comm`, "utf8").trim();
  } catch {
    return null;
  }
}

/**
 * CPU of the PostgreSQL backends serving one database, read from /proc: only
 * possible when the server runs on this machine and this user may read its
 * processes. Returns seconds per pid (null when not measurable here).
 */
export async function readBackendCpu(db: Queryable): Promise<Map<number, number> | null> {
  const { rows } = await db.query(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
  );
  const out = new Map<number, number>();
  for (const { pid } of rows as { pid: number }[]) {
    if (processName(pid) !== "postgres") return null; // not a local server we can see
    const cpu = readProcessCpuSeconds(pid);
    if (cpu !== null) out.set(pid, cpu);
  }
  return out;
}

/** CPU the backends used between two readings; a backend new in `after` counts whole. */
export function backendCpuSeconds(before: Map<number, number>, after: Map<number, number>): number {
  let sum = 0;
  for (const [pid, cpu] of after) sum += cpu - (before.get(pid) ?? 0);
  return sum;
}

// ------------------------------------------------------------------ WAL

export interface WalWindow {
  from: string;
  /** A temporary physical replication slot keeping the window's WAL on disk; null when not allowed. */
  slot: string | null;
}

export interface WalMeasure {
  bytes: number;
  /** true: only this database's WAL (pg_walinspect); false: all the server wrote meanwhile. */
  attributed: boolean;
}

let slots = 0;

/**
 * Starts measuring WAL. A temporary replication slot (dropped with the
 * session, or by closeWalWindow) keeps the window's WAL from being recycled
 * by a checkpoint before pg_walinspect reads it: on a shared server other
 * sessions' DROP DATABASE and CREATE DATABASE trigger checkpoints any time.
 */
export async function openWalWindow(db: Queryable): Promise<WalWindow> {
  const name = `bench_wal_${process.pid}_${++slots}`;
  const slot = await db
    .query("SELECT pg_create_physical_replication_slot($1, true, true)", [name])
    .then(() => name)
    .catch(() => null);
  const { rows } = await db.query("SELECT pg_current_wal_lsn()::text AS lsn");
  return { from: (rows[0] as { lsn: string }).lsn, slot };
}

/**
 * WAL written since openWalWindow: for the connected database only when
 * pg_walinspect is installed there (records that touch one of its blocks, plus
 * every record, commits included, of a transaction that did), else the whole
 * server's (pg_wal_lsn_diff), which counts whatever else runs on the server.
 */
export async function closeWalWindow(db: Queryable, window: WalWindow): Promise<WalMeasure> {
  const { rows } = await db.query("SELECT pg_current_wal_lsn()::text AS lsn");
  const to = (rows[0] as { lsn: string }).lsn;
  try {
    // pg_walinspect reads only flushed WAL; the WAL writer flushes within wal_writer_delay.
    for (let i = 0; i < 250; i++) {
      const { rows: f } = await db.query("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn AS ok", [to]);
      if ((f[0] as { ok: boolean }).ok) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const attributed = await walBytesOfDatabase(db, window.from, to);
    if (attributed !== null) return { bytes: attributed, attributed: true };
    const { rows: d } = await db.query("SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8 AS bytes", [window.from, to]);
    return { bytes: (d[0] as { bytes: number }).bytes, attributed: false };
  } finally {
    if (window.slot) await db.query("SELECT pg_drop_replication_slot($1)", [window.slot]).catch(() => {});
  }
}

async function walBytesOfDatabase(db: Queryable, from: string, to: string): Promise<number | null> {
  try {
    const { rows } = await db.query(
      `WITH r AS (
         SELECT xid, record_length, block_ref FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
       ), pattern AS (
         SELECT '% rel %/' || oid || '/%' AS p FROM pg_database WHERE datname = current_database()
       ), ours AS (
         SELECT DISTINCT r.xid FROM r, pattern WHERE r.xid <> '0' AND r.block_ref LIKE pattern.p
       )
       SELECT coalesce(sum(r.record_length), 0)::float8 AS bytes
       FROM r, pattern
       WHERE r.block_ref LIKE pattern.p OR (r.xid <> '0' AND r.xid IN (SELECT xid FROM ours))`,
      [from, to],
    );
    return (rows[0] as { bytes: number }).bytes;
  } catch (err) {
    const message = (err as Error).message;
    // No pg_walinspect here is expected; anything else is worth a line.
    if (!/pg_get_wal_records_info\(.*\) does not exist/.test(message)) {
      process.stderr.write(`WAL attribution failed (${message}); counting all WAL\n`);
    }
    return null;
  }
}

// ---------------------------------------------------------------- stats

export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

/** Linear interpolation between closest ranks; NaN for no values. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (rank - lo);
}

export function minMax(values: readonly number[]): [number, number] {
  return [Math.min(...values), Math.max(...values)];
}

/**
 * Milliseconds on a clock every process of this machine reads alike, sub-microsecond: a stamp taken
 * in the bench process can be read against it in a worker process. process.hrtime is libuv's
 * uv_hrtime: CLOCK_MONOTONIC on Linux (mach_absolute_time on macOS, QueryPerformanceCounter on
 * Windows), one system-wide counter. Not `performance.timeOrigin + performance.now()`: timeOrigin
 * is each process's own reading of the wall clock at its start, and two processes' readings
 * disagreed by about a millisecond, which made every system's latency p50 negative.
 * bench/workloads/latency.ts checks the sharing against each worker process before it measures.
 */
export function sharedClockMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}
