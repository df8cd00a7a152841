// GET /workers: every worker that has a presence row (workers(): live ones,
// recently stopped ones (a clean stop keeps the row, stopped, for
// stopped_worker_seconds), and crashed or cut-off ones until apply_retention
// deletes their row), with where it runs (host, pid), its queues, tasks and
// concurrency, the jobs it holds now with how long each has run, when it was
// last seen (and when it stopped), and the database outages it lived through.
// A worker is marked late when workers() says two refreshes were missed; for
// a worker that did not say how often it refreshes (a 0.1.0 worker), when its
// row is older than two refreshes at the default presenceInterval. A stopped
// worker is never late.
import { jobsInHand, type JobInHand } from "../job-reads.ts";
import { toMilliseconds } from "../duration.ts";
import * as sql from "../sql/index.ts";
import { WORKER_DEFAULTS } from "../worker/defaults.ts";
import { html, type Html } from "./html.ts";
import { duration, when } from "./layout.ts";

/** Two refreshes missed at the default presenceInterval: the rule workers() applies to a known interval. */
export const LATE_AFTER_MS = 2 * toMilliseconds(WORKER_DEFAULTS.presenceInterval);

function isLate(w: sql.WorkerRow, now: number): boolean {
  return w.stoppedAt === null && (w.late ?? now - w.lastSeenAt.getTime() > LATE_AFTER_MS);
}

export async function workersPage(db: sql.Queryable): Promise<{ title: string; body: Html }> {
  const workers = await sql.workers(db);
  const held = await jobsInHand(
    db,
    workers.map((w) => w.workerId),
  );
  const now = Date.now();
  const byWorker = new Map<string, JobInHand[]>();
  for (const job of held) byWorker.set(job.workerId, [...(byWorker.get(job.workerId) ?? []), job]);
  const late = workers.filter((w) => isLate(w, now)).length;
  const stopped = workers.filter((w) => w.stoppedAt !== null).length;
  return {
    title: "Workers",
    body: html`<p id="summary">${workers.length - stopped} worker${workers.length - stopped === 1 ? "" : "s"}, ${late} late (two refreshes of its row missed), ${held.length} job${held.length === 1 ? "" : "s"} in hand; ${stopped} stopped recently.
<span class="muted">A cleanly stopped worker's row stays, stopped, for stopped_worker_seconds (an hour by default); one that crashed or lost the database stays, late, until apply_retention deletes it (worker_retention_seconds).</span></p>
${
  workers.length === 0
    ? html`<p class="muted">No worker has registered (worker_seen).</p>`
    : html`<table id="workers"><tr><th>worker</th><th>status</th><th>host</th><th>pid</th><th>queues</th><th>tasks</th><th>jobs in hand / concurrency</th><th>started</th><th>last heartbeat</th><th>outages lived through</th></tr>
${workers.map((w) => row(w, byWorker.get(w.workerId) ?? [], now))}</table>`
}`,
  };
}

function row(w: sql.WorkerRow, jobs: readonly JobInHand[], now: number): Html {
  const late = isLate(w, now);
  const seenAgo = Math.max(0, now - w.lastSeenAt.getTime());
  const status = w.stoppedAt !== null ? "stopped" : late ? "late" : "live";
  return html`<tr class="${status}" data-worker="${w.workerId}"><td>${w.workerId}</td>
<td class="status">${
    w.stoppedAt !== null
      ? html`<span class="state s-cancelled">stopped</span> <span class="muted stopped-at">${when(w.stoppedAt)}</span>`
      : late
        ? html`<span class="state s-failed">late</span>`
        : html`<span class="state s-succeeded">live</span>`
  }</td>
<td class="host">${w.host ?? html`<span class="muted">-</span>`}</td><td class="pid n">${w.pid ?? ""}</td>
<td>${w.queues === null ? html`<span class="muted">every queue</span>` : w.queues.join(", ")}</td>
<td>${w.tasks === null ? html`<span class="muted">any task</span>` : w.tasks.join(", ")}</td>
<td class="in-hand"><span class="held">${jobs.length}</span> / <span class="concurrency">${w.concurrency ?? "?"}</span>${jobs.map(
    (j) => html`<br><a href="/jobs/${j.id}">${j.id}</a> ${j.task} <span class="muted running">running ${duration(Math.max(0, now - j.lockedAt.getTime()))}</span>`,
  )}</td>
<td>${when(w.startedAt)}</td>
<td class="seen">${when(w.lastSeenAt)} <span class="muted">(${duration(seenAgo)} ago${w.refreshEveryMs === null ? "" : `; every ${duration(w.refreshEveryMs)}`})</span></td>
<td class="outages">${w.outages === 0 ? html`<span class="muted">none</span>` : html`${w.outages}, ${duration(w.outageMs)} down in all; the latest ended ${when(w.lastOutageAt)}`}</td></tr>`;
}
