// idemq doctor's `flow` check (issue 26): flow control that holds jobs back.
//   * a paused queue or task with runnable jobs (a warning: they wait until
//     `idemq resume`; an incident's pause left on is the usual cause);
//   * a concurrency limit with every slot held while runnable jobs of its
//     scope have waited longer than --max-wait (a warning: the limit, or the
//     handlers holding its slots, is what they wait for, not a missing worker).
// A saturated limit whose jobs have waited less is reported, not warned about:
// a busy limited queue is that while it works.
import type pg from "pg";
import { runQuery } from "../../sql/index.ts";
import { age } from "../format.ts";
import type { Finding } from "./doctor.ts";

interface ScopeRow {
  kind: "queue" | "task";
  name: string;
  paused: boolean;
  concurrency: number | null;
  held: number;
  runnable: number;
  waited_s: number | null;
}

export async function checkFlow(client: pg.Client, maxWait: string): Promise<Finding> {
  const present = await runQuery<{ ok: boolean }>(client, "SELECT to_regclass('idemq.limits') IS NOT NULL AS ok", []);
  if (!present[0]?.ok) return { check: "flow", status: "skipped", message: "needs idemq.limits, added in 0.2.0 (see schema)" };
  // Runnable as claim() takes them: enqueued or scheduled, due, not past expires_at.
  const rows = await runQuery<ScopeRow & { max_s: number }>(
    client,
    `SELECT l.kind, l.name, l.paused, l.concurrency, coalesce(l.running, 0) AS held,
            r.runnable::int AS runnable, r.waited_s, extract(epoch FROM $1::interval)::float8 AS max_s
       FROM (SELECT CASE WHEN x.queue IS NOT NULL THEN 'queue' ELSE 'task' END AS kind, coalesce(x.queue, x.task) AS name,
                    x.paused, x.concurrency, x.running
               FROM idemq.limits() x) l
      CROSS JOIN LATERAL (
        SELECT count(*) AS runnable, extract(epoch FROM now() - min(j.run_at))::float8 AS waited_s
          FROM idemq.jobs j
         WHERE j.state IN ('enqueued', 'scheduled') AND j.run_at <= now()
           AND (j.expires_at IS NULL OR j.expires_at > now())
           AND CASE WHEN l.kind = 'queue' THEN j.queue = l.name ELSE j.task = l.name END) r
      ORDER BY l.kind, l.name`,
    [maxWait],
  );
  const scope = (r: ScopeRow) => `${r.kind} ${r.name}`;
  const flag = (r: ScopeRow) => `--${r.kind} ${r.name}`;
  const waiting = (r: ScopeRow) => `${r.runnable} runnable job(s) wait, the oldest ${age((r.waited_s ?? 0) * 1000)}`;
  const paused = rows.filter((r) => r.paused && r.runnable > 0);
  const saturated = rows.filter((r) => r.concurrency !== null && r.held >= r.concurrency && r.runnable > 0);
  const long = saturated.filter((r) => (r.waited_s ?? 0) > r.max_s);
  const details = {
    maxWait,
    paused: paused.map((r) => ({ [r.kind]: r.name, runnable: r.runnable, waitedSeconds: r.waited_s })),
    saturated: saturated.map((r) => ({ [r.kind]: r.name, concurrency: r.concurrency, running: r.held, runnable: r.runnable, waitedSeconds: r.waited_s })),
  };
  const problems: string[] = [];
  const fixes: string[] = [];
  for (const r of paused) {
    problems.push(`${scope(r)} is paused while ${waiting(r)}`);
    fixes.push(`\`idemq resume ${flag(r)}\` once it may run again`);
  }
  for (const r of long) {
    problems.push(`${scope(r)}'s concurrency limit is saturated (${r.held}/${r.concurrency} slots held) while ${waiting(r)}`);
    fixes.push(
      `raise it if what it protects can take more (\`idemq limit set ${flag(r)} --concurrency <n>\`), or look for slow handlers holding its slots (\`idemq jobs --state processing\`)`,
    );
  }
  if (problems.length > 0) {
    return { check: "flow", status: "warning", message: problems.join("; "), fix: fixes.join("; "), ...details };
  }
  const message =
    rows.length === 0
      ? "no limits and no pauses"
      : `${rows.length} queue(s) or task(s) with limits or a pause; none paused with a backlog, none saturated with jobs waiting longer than ${maxWait}` +
        (saturated.length > 0 ? ` (saturated now: ${saturated.map(scope).join(", ")})` : "");
  return { check: "flow", status: "ok", message, ...details };
}
