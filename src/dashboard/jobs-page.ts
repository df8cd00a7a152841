// GET /jobs: search the jobs, newest first, by one job filter (state, task,
// queue, key, concurrency key, error text, payload containment, created and
// finished ranges, ids: search-filter.ts, the rules SQL's); paged by id
// (keyset, so a deep page costs what the first does). The page does not wait
// for a count: a search whose matches are rare and spread makes count_jobs
// read far (up to the whole table at 1,000,000 jobs) where the page of rows
// alone is fast (bench/FINDINGS.md, "The dashboard's search ... at
// 1,000,000 jobs"). A short last page is its own exact count; otherwise the
// page's script asks GET /jobs/count (jobsCount: exact up to COUNT_UP_TO,
// "more than" beyond it) and fills the number in, and without scripts a link
// (count=all) renders the page with the count. A bad filter is answered 400
// with the database's message and hint above the form, having read nothing.
// Each row has a checkbox for the bulk form below the table, which acts on
// the selection or on everything the filter matches (bulk-page.ts).
import { BULK_ACTIONS, JOB_STATES } from "../contract.ts";
import { toJob, type Job } from "../job-reads.ts";
import * as sql from "../sql/index.ts";
import { BadRequest } from "./bad-request.ts";
import { html, type Html } from "./html.ts";
import { number, stateBadge, when } from "./layout.ts";
import { filterParameters, searchFilter } from "./search-filter.ts";

export const PAGE_SIZE = 50;
export const COUNT_UP_TO = 10_000;

/** The text fields of the search form: the filter field's name and its label. */
const TEXT_FIELDS: [string, string, string][] = [
  ["task", "task", ""],
  ["queue", "queue", ""],
  ["key", "key", ""],
  ["concurrency_key", "concurrency key", ""],
  ["error", "text in error", ""],
  ["ids", "ids", "42, 43"],
  ["payload", "payload contains", '{"customer": 42}'],
  ["created_after", "created from", "2026-12-01T09:00:00Z"],
  ["created_before", "created before", ""],
  ["finished_after", "finished from", ""],
  ["finished_before", "finished before", ""],
];

/** A search that SQL (22xxx) or the page refused: its message and hint, for the page. */
export function badFilter(error: unknown): string | null {
  if (error instanceof BadRequest) return error.message;
  const e = error as { code?: unknown; message?: unknown; hint?: unknown };
  if (typeof e.code !== "string" || !e.code.startsWith("22")) return null;
  return `${String(e.message)}${typeof e.hint === "string" ? ` ${e.hint}` : ""}`;
}

/** Fills the page's count in from GET /jobs/count, so the rows are shown without waiting for it. */
export const JOBS_SCRIPT = `
const total = document.getElementById("total");
if (total && total.dataset.count) {
  total.textContent = "counting…";
  fetch(total.dataset.count, { headers: { accept: "application/json" } })
    .then((r) => r.json())
    .then((c) => { total.textContent = c.error === undefined ? c.total : "not counted: " + c.error; })
    .catch((e) => { total.textContent = "not counted: " + e.message; });
}`;

/** The count a page states: exact up to COUNT_UP_TO, "more than" beyond it. */
function totalText(counted: { jobs: number; exact: boolean }): string {
  return counted.exact ? number(counted.jobs) : `more than ${number(COUNT_UP_TO)}`;
}

/**
 * GET /jobs/count?<the search's parameters>: how many jobs the search
 * matches, for the jobs page's script, as JSON ({total} or {error}, 400 for
 * a bad filter). Reads up to COUNT_UP_TO + 1 matches (count_jobs).
 */
export async function jobsCount(db: sql.Queryable, parameters: URLSearchParams): Promise<{ status: number; body: { total: string } | { error: string } }> {
  try {
    return { status: 200, body: { total: totalText(await sql.countJobs(db, searchFilter(parameters), { atMost: COUNT_UP_TO })) } };
  } catch (error) {
    const refused = badFilter(error);
    if (refused === null) throw error;
    return { status: 400, body: { error: refused } };
  }
}

export async function jobsPage(db: sql.Queryable, parameters: URLSearchParams): Promise<{ title: string; body: Html; status: number }> {
  const before = parameters.get("before")?.trim() || undefined;
  const from = Math.max(1, Number.parseInt(parameters.get("from") ?? "1", 10) || 1);
  // count=all (the link the page shows without scripts): count before answering, as count_jobs allows.
  const countNow = parameters.get("count") === "all";
  let found: { jobs: Job[]; counted: { jobs: number; exact: boolean } | null } | { refused: string };
  try {
    if (before !== undefined && !/^\d{1,19}$/.test(before)) throw new BadRequest(`before must be a job id, not "${before}"`);
    const filter = searchFilter(parameters);
    // Both check the whole filter before they read (_check_job_filter), so a bad one reads nothing.
    const [rows, counted] = await Promise.all([
      sql.findJobs(db, filter, { beforeId: before, pageSize: PAGE_SIZE }),
      countNow ? sql.countJobs(db, filter, { atMost: COUNT_UP_TO }) : null,
    ]);
    found = { jobs: rows.map(toJob), counted };
  } catch (error) {
    const refused = badFilter(error);
    if (refused === null) throw error;
    found = { refused };
  }
  const kept = filterParameters(parameters);
  const link = (extra: [string, string][]) => `/jobs?${new URLSearchParams([...kept, ...extra]).toString()}`;
  const form = searchForm(parameters);
  if ("refused" in found) {
    return { title: "Jobs", status: 400, body: html`${form}<p class="error" id="error">${found.refused}</p>` };
  }
  const { jobs, counted } = found;
  const last = jobs.at(-1);
  // A short page is the last one: the jobs before it (from - 1, as its links say) and its own are all there are.
  const total: Html | string =
    counted !== null
      ? totalText(counted)
      : jobs.length < PAGE_SIZE
        ? number(from - 1 + jobs.length)
        : html`<span id="total" data-count="/jobs/count?${new URLSearchParams(kept).toString()}"><a id="count-link" href="${link([...(before === undefined ? [] : ([["before", before], ["from", String(from)]] as [string, string][])), ["count", "all"]])}">count them</a></span>`;
  const range = jobs.length === 0 ? "No jobs match." : html`Jobs ${number(from)}-${number(from + jobs.length - 1)} of ${total}.`;
  return {
    title: "Jobs",
    status: 200,
    body: html`${form}
<p id="count">${range}</p>
${jobs.length === 0 ? "" : jobsTable(jobs)}
<p>${before === undefined ? "" : html`<a href="${link([])}">« newest</a> `}
${last !== undefined && jobs.length === PAGE_SIZE ? html`<a id="next" href="${link([["before", last.id], ["from", String(from + jobs.length)]])}">next ${PAGE_SIZE} »</a>` : ""}</p>
${jobs.length === 0 ? "" : bulkForm(kept)}`,
  };
}

function searchForm(parameters: URLSearchParams): Html {
  const states = parameters.getAll("state");
  return html`<form method="get" action="/jobs" id="search">
<p>state ${JOB_STATES.map((s) => html`<label style="white-space:nowrap"><input type="checkbox" name="state" value="${s}"${states.includes(s) ? html` checked` : ""}> ${s}</label>`)}</p>
<p>${TEXT_FIELDS.map(
    ([name, label, placeholder]) =>
      html`<label style="white-space:nowrap">${label} <input name="${name}" value="${parameters.get(name) ?? ""}" size="${name === "payload" ? 24 : 14}" placeholder="${placeholder}"></label> `,
  )}</p>
<button type="submit" id="filter">Search</button> <a href="/jobs">clear</a>
<span class="muted">a payload match needs a task, key or ids beside it; times are ISO 8601</span></form>`;
}

function bulkForm(kept: [string, string][]): Html {
  return html`<form method="get" action="/bulk" id="bulk">
${kept.map(([name, value]) => html`<input type="hidden" name="${name}" value="${value}">`)}
<label>bulk action <select name="action">${BULK_ACTIONS.map((a) => html`<option value="${a}">${a.replace("_", " ")}</option>`)}</select></label>
<button type="submit" name="scope" value="selected" id="bulk-selected">on the selected jobs…</button>
<button type="submit" name="scope" value="all" id="bulk-all">on every job the search matches…</button>
<span class="muted">the next page says how many jobs it will touch and asks first</span></form>`;
}

function lastError(job: Job): string {
  const entry = job.errors.at(-1) as { class?: unknown; message?: unknown } | undefined;
  if (entry === undefined) return "";
  const text = `${String(entry.class ?? "Error")}: ${String(entry.message ?? "")}`;
  return text.length > 120 ? `${text.slice(0, 119)}…` : text;
}

function jobsTable(jobs: readonly Job[]): Html {
  return html`<table id="jobs"><tr><th></th><th>id</th><th>state</th><th>task</th><th>queue</th><th>attempt</th><th>key</th><th>created</th><th>finished</th><th>last error</th></tr>
${jobs.map(
  (j) => html`<tr><td><input type="checkbox" name="job" value="${j.id}" form="bulk" aria-label="select job ${j.id}"></td><td><a href="/jobs/${j.id}">${j.id}</a></td><td>${stateBadge(j.state)}</td><td>${j.task}</td><td>${j.queue}</td>
<td class="n">${j.countedAttempts}/${j.attemptLimit}</td><td>${j.idempotencyKey ?? ""}</td><td>${when(j.createdAt)}</td><td>${when(j.finishedAt)}</td><td>${lastError(j)}</td></tr>`,
)}</table>`;
}
