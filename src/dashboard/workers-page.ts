// GET /workers: every worker that has a presence row (workers(): live ones,
// and crashed or cut-off ones until apply_retention deletes their row), with
// its queues and tasks, when it started and was last seen, and the jobs it
// holds now with how long each has run. A worker whose row is older than
// LATE_AFTER_MS is marked late: it refreshes every presenceInterval (15 s by
// default, jittered), so a row that old means it is gone, stuck, or cannot
// reach the database.
import { jobsInHand, type JobInHand } from "../job-reads.ts";
import * as sql from "../sql/index.ts";
import { WORKER_DEFAULTS } from "../worker/defaults.ts";
import { toMilliseconds } from "../duration.ts";
import { html, type Html } from "./html.ts";
import { duration, when } from "./layout.ts";

/** Two refreshes missed at the default presenceInterval (a refresh comes within 1.25 intervals: timers.ts jitter). */
export const LATE_AFTER_MS = 2 * toMilliseconds(WORKER_DEFAULTS.presenceInterval);

export async function workersPage(db: sql.Queryable): Promise<{ title: string; body: Html }> {
  const workers = await sql.workers(db);
  const held = await jobsInHand(
    db,
    workers.map((w) => w.workerId),
  );
  const now = Date.now();
  const byWorker = new Map<string, JobInHand[]>();
  for (const job of held) byWorker.set(job.workerId, [...(byWorker.get(job.workerId) ?? []), job]);
  const late = workers.filter((w) => now - w.lastSeenAt.getTime() > LATE_AFTER_MS).length;
  return {
    title: "Workers",
    body: html`<p id="summary">${workers.length} worker${workers.length === 1 ? "" : "s"} registered, ${late} late (not seen for over ${duration(LATE_AFTER_MS)}).
<span class="muted">A cleanly stopped worker removes its row; a crashed one stays, late, until apply_retention deletes it.</span></p>
${
  workers.length === 0
    ? html`<p class="muted">No worker has registered (worker_seen).</p>`
    : html`<table id="workers"><tr><th>worker</th><th>seen</th><th>queues</th><th>tasks</th><th>started</th><th>last seen</th><th>jobs in hand</th></tr>
${workers.map((w) => {
  const seenAgo = now - w.lastSeenAt.getTime();
  const isLate = seenAgo > LATE_AFTER_MS;
  const jobs = byWorker.get(w.workerId) ?? [];
  return html`<tr class="${isLate ? "late" : "live"}" data-worker="${w.workerId}"><td>${w.workerId}</td>
<td>${isLate ? html`<span class="state s-failed">late</span>` : html`<span class="state s-succeeded">live</span>`}</td>
<td>${w.queues === null ? html`<span class="muted">every queue</span>` : w.queues.join(", ")}</td>
<td>${w.tasks === null ? html`<span class="muted">any task</span>` : w.tasks.join(", ")}</td>
<td>${when(w.startedAt)}</td><td>${when(w.lastSeenAt)} <span class="muted">(${duration(Math.max(0, seenAgo))} ago)</span></td>
<td class="in-hand">${jobs.length === 0 ? html`<span class="muted">none</span>` : jobs.map((j) => html`<a href="/jobs/${j.id}">${j.id}</a> ${j.task} <span class="muted">running ${duration(Math.max(0, now - j.lockedAt.getTime()))}</span><br>`)}</td></tr>`;
})}</table>`
}`,
  };
}
