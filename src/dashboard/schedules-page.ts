// GET /schedules: every recurring schedule (idemq.schedules()) with its next
// slot, the state of its latest job, and why tick() could not enqueue it.
import { schedules, type Queryable } from "../sql/index.ts";
import { html, type Html } from "./html.ts";
import { stateBadge, when } from "./layout.ts";

export async function schedulesPage(db: Queryable): Promise<{ title: string; body: Html }> {
  const all = await schedules(db);
  const now = Date.now();
  return {
    title: "Schedules",
    body:
      all.length === 0
        ? html`<p class="muted">No schedules. Declare one with client.schedule() or <code>idemq schedules add</code>.</p>`
        : html`<table id="schedules"><tr><th>name</th><th>cron</th><th>time zone</th><th>task</th><th>queue</th><th>next slot</th>
<th>latest job</th><th>overlap</th><th>misfire</th><th>skipped</th></tr>
${all.map(
  (s) => html`<tr><td>${s.name}</td><td><code>${s.cron}</code></td><td>${s.timezone}</td><td>${s.task}</td><td>${s.queue}</td>
<td>${when(s.nextAt)}${
    s.lastError !== null
      ? html` <span class="error">(due, but tick() could not enqueue its job ${when(s.lastErrorAt!)}: ${s.lastError})</span>`
      : s.nextAt.getTime() < now
        ? html` <span class="muted">(due: the next tick enqueues it)</span>`
        : ""
  }</td>
<td>${s.lastJobId === null ? html`<span class="muted">none yet</span>` : html`<a href="/jobs/${s.lastJobId}">${s.lastJobId}</a> ${s.lastJobState === null ? "purged" : stateBadge(s.lastJobState)}`}</td>
<td>${s.overlap}</td><td>${s.misfire} (grace ${s.misfireGrace})</td><td class="n">${s.skipped}</td></tr>`,
)}</table>`,
  };
}
