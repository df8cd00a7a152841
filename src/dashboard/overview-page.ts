// GET /: counts per queue and task from overview() (exact for active jobs and
// for recent finishes; terminal totals exact up to a cap, estimated beyond
// it, and labelled so), throughput and failure rate over the window, and the
// effects-once figures: duplicates and rejections per task. A line on flow
// control (limits(): paused scopes, limits with every slot held) links to
// /limits. overview() reads kept counts, so the page costs the same however
// many jobs are retained.
import { ACTIVE_STATES, TERMINAL_STATES } from "../contract.ts";
import { recentRates } from "../rates.ts";
import { limits, overview, type LimitRow, type OverviewRow, type Queryable } from "../sql/index.ts";
import { html, query, type Html } from "./html.ts";
import { duration, number, stateBadge } from "./layout.ts";

/** Windows the page offers, in minutes; the first is the default. */
export const WINDOWS = [15, 5, 60] as const;
/**
 * Totals are exact up to this, estimated above it: the largest cap overview()
 * takes. An exact total costs it no more than a capped one (kept counts).
 */
export const EXACT_UP_TO = 10_000_000;

const EVENTS = ["deduplicated", "rejected", "conflict", "guard_duplicate"] as const;

interface Line {
  queue: string;
  task: string;
  values: Map<string, number>;
}

export async function overviewPage(db: Queryable, parameters: URLSearchParams): Promise<{ title: string; body: Html }> {
  const minutes = WINDOWS.find((m) => String(m) === parameters.get("minutes")) ?? WINDOWS[0];
  const [rows, flow] = await Promise.all([overview(db, { recent: `${minutes} minutes`, exactUpTo: EXACT_UP_TO }), limits(db)]);
  const lines = new Map<string, Line>();
  const totals: OverviewRow[] = [];
  const events = new Map<string, Map<string, number>>();
  for (const row of rows) {
    if (row.queue === null) {
      if (row.task === null) totals.push(row);
      else events.set(row.task, (events.get(row.task) ?? new Map()).set(row.metric, row.value));
      continue;
    }
    const id = JSON.stringify([row.queue, row.task]);
    const line = lines.get(id) ?? { queue: row.queue, task: row.task ?? "", values: new Map() };
    line.values.set(row.metric, row.value);
    lines.set(id, line);
  }
  const sorted = [...lines.values()].sort((a, b) => a.queue.localeCompare(b.queue) || a.task.localeCompare(b.task));
  return {
    title: "Overview",
    body: html`
<p>Window: ${WINDOWS.map((m) => (m === minutes ? html`<b>${m} min</b> ` : html`<a href="/${query({ minutes: m })}">${m} min</a> `))}
<label class="muted"><input type="checkbox" id="auto"> refresh every 5 s</label></p>
<h2>Totals</h2>${totalsTable(totals)}
<h2>Queues and tasks</h2>${flowLine(flow)}${queueTable(sorted, minutes)}
<h2>Effects once: duplicates and rejections per task</h2>${eventsTable(events)}`,
  };
}

function totalsTable(totals: readonly OverviewRow[]): Html {
  const shown = (state: string) => {
    const row = totals.find((t) => t.metric === state);
    if (row === undefined) return html`0`;
    if (row.exact) return html`${number(row.value)}`;
    return row.value <= EXACT_UP_TO + 1
      ? html`more than ${number(EXACT_UP_TO)}`
      : html`<span title="estimate from the planner's statistics">≈ ${number(row.value)} (estimate)</span>`;
  };
  return html`<table id="totals"><tr>${TERMINAL_STATES.map((s) => html`<th>${stateBadge(s)}</th>`)}</tr>
<tr>${TERMINAL_STATES.map((s) => html`<td class="n"><a href="/jobs${query({ state: s })}">${shown(s)}</a></td>`)}</tr></table>
<p class="muted">All finished jobs still retained: exact up to ${number(EXACT_UP_TO)}, estimated above.</p>`;
}

function queueTable(lines: readonly Line[], minutes: number): Html {
  if (lines.length === 0) return html`<p class="muted">No active jobs and nothing finished in the last ${minutes} minutes.</p>`;
  const v = (line: Line, metric: string) => line.values.get(metric) ?? 0;
  return html`<table id="queues"><tr><th>queue</th><th>task</th>${ACTIVE_STATES.map((s) => html`<th>${stateBadge(s)}</th>`)}
<th>lease expired</th><th>oldest runnable</th><th>succeeded (${minutes} min)</th><th>failed (${minutes} min)</th>
<th>throughput /min</th><th>failure rate</th></tr>
${lines.map((line) => {
  const rates = recentRates(v(line, "succeeded_recent"), v(line, "failed_recent"), minutes);
  const oldest = line.values.get("oldest_runnable_seconds");
  const link = (state?: string) => `/jobs${query({ queue: line.queue, task: line.task, state })}`;
  return html`<tr><td><a href="${link()}">${line.queue}</a></td><td>${line.task}</td>
${ACTIVE_STATES.map((s) => html`<td class="n"><a href="${link(s)}">${number(v(line, s))}</a></td>`)}
<td class="n">${number(v(line, "lease_expired"))}</td>
<td class="n">${oldest === undefined ? "-" : duration(oldest * 1000)}</td>
<td class="n">${number(v(line, "succeeded_recent"))}</td>
<td class="n"><a href="${link("failed")}">${number(v(line, "failed_recent"))}</a></td>
<td class="n">${rates.perMinute.toFixed(1)}</td>
<td class="n">${rates.failureRate === null ? "-" : `${(100 * rates.failureRate).toFixed(1)} %`}</td></tr>`;
})}</table>`;
}

/** One line on flow control above the queues: paused scopes and saturated limits, linking to /limits. */
function flowLine(rows: readonly LimitRow[]): Html | "" {
  if (rows.length === 0) return "";
  const name = (r: LimitRow) => (r.queue !== null ? `queue ${r.queue}` : `task ${r.task}`);
  const paused = rows.filter((r) => r.paused).map(name);
  const full = rows.filter((r) => r.concurrency !== null && (r.running ?? 0) >= r.concurrency).map(name);
  return html`<p class="${paused.length > 0 ? "note" : "muted"}" id="flow">Flow control: ${rows.length} queue(s) or task(s) with a limit or a pause${
    paused.length > 0 ? html`; <b>paused: ${paused.join(", ")}</b>` : ""
  }${full.length > 0 ? html`; every slot held: ${full.join(", ")}` : ""}. <a href="/limits">Details</a></p>`;
}

function eventsTable(events: Map<string, Map<string, number>>): Html {
  if (events.size === 0) return html`<p class="muted">No duplicates or rejections counted yet.</p>`;
  return html`<table><tr><th>task</th>${EVENTS.map((e) => html`<th>${e.replace("_", " ")}</th>`)}</tr>
${[...events.entries()]
  .sort(([a], [b]) => a.localeCompare(b))
  .map(([task, counts]) => html`<tr><td>${task}</td>${EVENTS.map((e) => html`<td class="n">${number(counts.get(e) ?? 0)}</td>`)}</tr>`)}</table>
<p class="muted">Counted since install: enqueues deduplicated by their key, bulk rejections and key conflicts, guard() duplicates. A rejection raised by a single enqueue rolls back with its statement and is counted by the client, not here.</p>`;
}

/** The page's progressive enhancement: the refresh checkbox, remembered across reloads. */
export const OVERVIEW_SCRIPT = `
const box = document.getElementById("auto");
box.checked = sessionStorage.getItem("idemq-auto") === "1";
let timer;
const arm = () => { clearTimeout(timer); if (box.checked) timer = setTimeout(() => location.reload(), 5000); };
box.addEventListener("change", () => { sessionStorage.setItem("idemq-auto", box.checked ? "1" : "0"); arm(); });
arm();`;
