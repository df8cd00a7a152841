// GET /jobs: the jobs list, newest first, filtered by state, queue, task,
// key and text in the error history; paged by id (keyset, so a deep page
// costs what the first does) with a count that is exact up to COUNT_UP_TO
// and says "more than" beyond it.
import { isJobState, JOB_STATES } from "../contract.ts";
import { countJobs, listJobs, type Job, type ListJobsFilter } from "../job-reads.ts";
import type { Queryable } from "../sql/index.ts";
import { BadRequest } from "./bad-request.ts";
import { html, query, type Html } from "./html.ts";
import { number, stateBadge, when } from "./layout.ts";

export const PAGE_SIZE = 50;
export const COUNT_UP_TO = 10_000;

const FIELDS = ["queue", "task", "key", "error"] as const;

export async function jobsPage(db: Queryable, parameters: URLSearchParams): Promise<{ title: string; body: Html }> {
  const state = parameters.get("state") ?? "";
  if (state !== "" && !isJobState(state)) {
    throw new BadRequest(`state must be one of ${JOB_STATES.join(", ")}, not "${state}"`);
  }
  const given = (name: string) => {
    const value = parameters.get(name)?.trim();
    return value === undefined || value === "" ? undefined : value;
  };
  const before = given("before");
  if (before !== undefined && !/^\d{1,19}$/.test(before)) throw new BadRequest(`before must be a job id, not "${before}"`);
  const from = Math.max(1, Number.parseInt(given("from") ?? "1", 10) || 1);
  const filter: ListJobsFilter = {
    state: state === "" ? undefined : state,
    queue: given("queue"),
    task: given("task"),
    key: given("key"),
    errorText: given("error"),
  };
  const [jobs, counted] = await Promise.all([
    listJobs(db, { ...filter, limit: PAGE_SIZE, beforeId: before }),
    countJobs(db, filter, COUNT_UP_TO),
  ]);
  const kept: Record<string, string | undefined> = { state, ...Object.fromEntries(FIELDS.map((f) => [f, given(f)])) };
  const total = counted.exact ? number(counted.count) : `more than ${number(COUNT_UP_TO)}`;
  const last = jobs.at(-1);
  const range = jobs.length === 0 ? "No jobs match." : `Jobs ${number(from)}-${number(from + jobs.length - 1)} of ${total}.`;
  return {
    title: "Jobs",
    body: html`
<form method="get" action="/jobs">
<label>state <select name="state"><option value="">any</option>${JOB_STATES.map(
      (s) => html`<option value="${s}"${s === state ? html` selected` : ""}>${s}</option>`,
    )}</select></label>
${FIELDS.map((f) => html`<label>${f === "error" ? "text in error" : f} <input name="${f}" value="${kept[f] ?? ""}" size="14"></label>`)}
<button type="submit">Filter</button> <a href="/jobs">clear</a></form>
<p id="count">${range}</p>
${jobs.length === 0 ? "" : jobsTable(jobs)}
<p>${before === undefined ? "" : html`<a href="/jobs${query(kept)}">« newest</a> `}
${last !== undefined && jobs.length === PAGE_SIZE ? html`<a id="next" href="/jobs${query({ ...kept, before: last.id, from: from + jobs.length })}">next ${PAGE_SIZE} »</a>` : ""}</p>`,
  };
}

function lastError(job: Job): string {
  const entry = job.errors.at(-1) as { class?: unknown; message?: unknown } | undefined;
  if (entry === undefined) return "";
  const text = `${String(entry.class ?? "Error")}: ${String(entry.message ?? "")}`;
  return text.length > 120 ? `${text.slice(0, 119)}…` : text;
}

function jobsTable(jobs: readonly Job[]): Html {
  return html`<table id="jobs"><tr><th>id</th><th>state</th><th>task</th><th>queue</th><th>attempt</th><th>key</th><th>created</th><th>finished</th><th>last error</th></tr>
${jobs.map(
  (j) => html`<tr><td><a href="/jobs/${j.id}">${j.id}</a></td><td>${stateBadge(j.state)}</td><td>${j.task}</td><td>${j.queue}</td>
<td class="n">${j.countedAttempts}/${j.attemptLimit}</td><td>${j.idempotencyKey ?? ""}</td><td>${when(j.createdAt)}</td><td>${when(j.finishedAt)}</td><td>${lastError(j)}</td></tr>`,
)}</table>`;
}
