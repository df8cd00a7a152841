// GET /limits: flow control (issue 26). Every queue and task with a limit or
// a pause (limits()), its use now (slots held, starts in the period), and the
// runnable jobs of that scope (stats()), with why they wait: paused, held,
// every slot held, the rate used up, or none of these (then they wait for a
// worker). Both reads are the worker role's too, so the page works for a
// login that may not change anything; it then says so and shows no form.
// The forms POST (with the CSRF token) to /limits/<action>; actions.ts runs
// them through set_limit, clear_limit, pause and resume, and the database
// refuses them to a role without EXECUTE anyway.
import type { ScopeWaitingReason } from "../contract.ts";
import { limits, runQuery, stats, type LimitRow, type Queryable } from "../sql/index.ts";
import { html, type Html } from "./html.ts";
import { duration, number, when } from "./layout.ts";

export const LIMIT_ACTIONS = ["pause", "resume", "set", "clear"] as const;
export type LimitAction = (typeof LIMIT_ACTIONS)[number];

/** The runnable jobs of one scope: enqueued ones, and the age of the oldest job claim() would hand out. */
interface Waiting {
  enqueued: number;
  oldestSeconds: number | null;
}

/**
 * Whether this scope holds its runnable jobs back, and why: the rule of
 * idemq._scope_waits() (job()'s and stats()'s waiting_for), on the same
 * limits() row, the first that holds in SCOPE_WAITING_REASONS' order.
 * test/contract/waiting-reasons.test.ts holds the two equal.
 */
export function scopeWaitingFor(row: LimitRow): ScopeWaitingReason | null {
  if (row.paused) return "paused";
  if (row.heldUntil !== null) return "held";
  if (row.concurrency !== null && (row.running ?? 0) >= row.concurrency) return "concurrency";
  if (row.rate !== null && (row.started ?? 0) >= row.rate) return "rate";
  return null;
}

const VERDICTS: Record<ScopeWaitingReason, string> = {
  paused: "paused: they wait for resume",
  held: "held: they wait for the hold to end (an API's Retry-After)",
  concurrency: "waiting for a slot (every slot held)",
  rate: "waiting for the rate (used up in this period)",
};

/** Why a scope's runnable jobs wait, as an operator asks it. */
export function verdict(row: LimitRow, waiting: Waiting): string {
  if (waiting.oldestSeconds === null) return "nothing runnable waits";
  const reason = scopeWaitingFor(row);
  return reason === null ? "not held back by this limit: waiting for a worker" : VERDICTS[reason];
}

/** Whether the pool's role may call the admin functions (a catalog read; the database decides anyway). */
async function mayChange(db: Queryable): Promise<{ role: string; may: boolean }> {
  const rows = await runQuery<{ role: string; may: boolean }>(
    db,
    `SELECT current_user::text AS role,
            has_function_privilege('idemq.set_limit(text, text, integer, integer, interval, integer)', 'EXECUTE')
        AND has_function_privilege('idemq.clear_limit(text, text)', 'EXECUTE')
        AND has_function_privilege('idemq.pause(text, text)', 'EXECUTE')
        AND has_function_privilege('idemq.resume(text, text)', 'EXECUTE') AS may`,
    [],
  );
  return rows[0]!;
}

function scopeFields(row: { queue: string | null; task: string | null }): Html {
  return row.queue !== null
    ? html`<input type="hidden" name="queue" value="${row.queue}">`
    : html`<input type="hidden" name="task" value="${row.task}">`;
}

function rowForm(action: LimitAction, row: LimitRow, csrf: string, label: string, danger = false): Html {
  return html`<form class="inline" method="post" action="/limits/${action}"><input type="hidden" name="csrf" value="${csrf}">${scopeFields(row)}<button type="submit" data-action="${action}"${danger ? html` class="danger"` : ""}>${label}</button></form>`;
}

export async function limitsPage(db: Queryable, csrf: string, done?: string): Promise<{ title: string; body: Html }> {
  const [rows, counts, access] = await Promise.all([limits(db), stats(db), mayChange(db)]);
  const byQueue = new Map<string, Waiting>();
  const byTask = new Map<string, Waiting>();
  for (const c of counts) {
    if (c.queue === null || c.task === null) continue;
    for (const [map, name] of [[byQueue, c.queue], [byTask, c.task]] as const) {
      const w = map.get(name) ?? { enqueued: 0, oldestSeconds: null };
      if (c.metric === "enqueued") w.enqueued += c.value;
      if (c.metric === "oldest_runnable_seconds") w.oldestSeconds = Math.max(w.oldestSeconds ?? 0, c.value);
      map.set(name, w);
    }
  }
  const waitingOf = (r: LimitRow): Waiting =>
    (r.queue !== null ? byQueue.get(r.queue) : byTask.get(r.task!)) ?? { enqueued: 0, oldestSeconds: null };
  const notice = done === undefined ? "" : html`<p class="note" id="notice">${done}</p>`;
  const who = access.may
    ? html`<p class="muted" id="access">Signed in to the database as <b>${access.role}</b>, which may pause, resume, set and clear limits.</p>`
    : html`<p class="note" id="access">The dashboard's database role <b>${access.role}</b> may read flow control but not change it: pause, resume, set_limit and clear_limit are the installation's admin role's (<code>idemq roles grant ROLE --admin</code>), so no form is shown and the database would refuse them.</p>`;
  const table =
    rows.length === 0
      ? html`<p class="muted" id="no-limits">No queue or task has a limit or a pause: every claim takes what it asks for.</p>`
      : html`<table id="limits"><tr><th>scope</th><th>name</th><th>paused</th><th>concurrency</th><th>running / slots</th>
<th>rate</th><th>starts in period</th><th>runnable waiting</th><th>oldest runnable</th><th>why they wait</th><th>updated</th>${access.may ? html`<th>actions</th>` : ""}</tr>
${rows.map((r) => {
  const w = waitingOf(r);
  return html`<tr data-scope="${r.queue !== null ? "queue" : "task"}:${r.queue ?? r.task}"><td>${r.queue !== null ? "queue" : "task"}</td><td>${r.queue ?? r.task}</td>
<td>${r.paused ? html`<b class="error">paused</b>` : "no"}</td>
<td class="n">${r.concurrency ?? "-"}</td>
<td class="n">${r.concurrency === null ? "-" : `${r.running ?? 0} / ${r.concurrency}`}</td>
<td>${r.rate === null ? "-" : `${r.rate} per ${r.per}`}</td>
<td class="n">${r.rate === null ? "-" : `${r.started ?? 0} / ${r.rate}`}</td>
<td class="n">${number(w.enqueued)}</td>
<td class="n">${w.oldestSeconds === null ? "-" : duration(w.oldestSeconds * 1000)}</td>
<td class="why">${verdict(r, w)}</td><td>${when(r.updatedAt)}</td>
${
  access.may
    ? html`<td>${r.paused ? rowForm("resume", r, csrf, "resume") : rowForm("pause", r, csrf, "pause", true)} ${
        r.concurrency !== null || r.rate !== null || r.perKey !== null ? rowForm("clear", r, csrf, "clear limits") : ""
      }</td>`
    : ""
}</tr>`;
})}</table>
<p class="muted">A job obeys its queue's and its task's limits and pauses. Runnable: due and not expired, what a claim would take; "waiting for a worker" means this scope's limits are not what holds them.</p>`;
  const forms = access.may
    ? html`<h2>Set a limit</h2>
<form method="post" action="/limits/set" id="set-limit"><input type="hidden" name="csrf" value="${csrf}">
<label><select name="kind"><option>queue</option><option>task</option></select> <input name="name" size="20" required placeholder="name"></label>
<label>concurrency <input name="concurrency" size="6" inputmode="numeric"></label>
<label>rate <input name="rate" size="6" inputmode="numeric"></label> <label>per <input name="per" size="10" placeholder="1 minute"></label>
<button type="submit">set</button></form>
<p class="muted">Fields left empty keep their value. Raising a limit a worker declares is yours to do: a worker lowers a stored limit to what it declares, and never raises one (docs/worker.md).</p>
<h2>Pause a queue or task</h2>
<form method="post" action="/limits/pause" id="pause-scope"><input type="hidden" name="csrf" value="${csrf}">
<label><select name="kind"><option>queue</option><option>task</option></select> <input name="name" size="20" required placeholder="name"></label>
<button type="submit" class="danger">pause</button></form>
<p class="muted">Claims hand out none of its jobs until resume; running jobs finish; enqueue keeps working.</p>`
    : "";
  return { title: "Flow control", body: html`${notice}${who}${table}${forms}` };
}
