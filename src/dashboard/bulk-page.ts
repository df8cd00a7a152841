// Bulk actions from the jobs page (retry, cancel, delete, run now) on the
// selected jobs or on everything a search matches. GET /bulk is the
// confirmation: count_jobs(filter, action) says how many jobs the action
// will touch (at least BULK_COUNT_UP_TO when there are more), and nothing
// changes. POST /bulk acts: batch after batch (runBulkBatches: each batch is
// one call of retry_jobs etc., its own short transaction holding at most
// BULK_BATCH rows), for at most BULK_REQUEST_MS per request; the page it
// answers shows the totals so far and, while jobs are left, a form that its
// script posts at once (fetch, the answer put in place) to go on from
// next_before_id. So 100,000 jobs never hold the table nor a request for
// long, and a closed tab stops between batches with the done ones done. The
// page's Stop button ends it: the request in flight finishes its batch and
// its totals are kept, then the form is posted with stop=1, which runs no
// batch and answers how many were touched (without scripts, Stop posts that
// at once). The per-job rules (which states, a key held) are SQL's; a job
// that moved on since the search is skipped and counted.
import { BULK_ACTIONS, type BulkAction } from "../contract.ts";
import { runBulkBatches } from "../bulk-actions.ts";
import * as sql from "../sql/index.ts";
import { BadRequest } from "./bad-request.ts";
import { html, type Html } from "./html.ts";
import { number } from "./layout.ts";
import { searchFilter } from "./search-filter.ts";

/** The confirmation counts no further (count_jobs' at_most): beyond it, it says "at least". */
export const BULK_COUNT_UP_TO = 100_000;
/** Jobs per batch: one transaction each. */
export const BULK_BATCH = 1000;
/** Batches run by one request before the page posts the next (startDashboard's bulkRequestMs). */
export const BULK_REQUEST_MS = 2000;

const DONE: Record<BulkAction, string> = { retry: "retried", cancel: "cancelled", delete: "deleted", run_now: "enqueued to run now" };
const WHAT: Record<BulkAction, string> = {
  retry: "Retry: back to enqueued with fresh attempts (failed, cancelled and expired jobs)",
  cancel: "Cancel: will not run (active jobs; a running attempt loses its lease)",
  delete: "Delete: gone for good (finished jobs; their keys stay until prune_keys)",
  run_now: "Run now: scheduled jobs enqueued at once",
};

/**
 * Continues the bulk form's batches as soon as the page is shown (the button
 * does it without scripts): each continuation is fetched and its page put in
 * place of this one's, until none is left or Stop is pressed; then the last
 * form (its totals the latest) is posted with stop=1.
 */
export const BULK_SCRIPT = `
let stopping = false;
const armStop = () => {
  const stop = document.getElementById("stop");
  if (stop) stop.addEventListener("click", (event) => {
    event.preventDefault();
    stopping = true;
    stop.disabled = true;
    stop.textContent = "stopping after the batch in flight…";
  });
};
(async () => {
  armStop();
  let form = document.getElementById("continue");
  while (form && !stopping) {
    // getAttribute: the form's input named "action" shadows form.action.
    const response = await fetch(form.getAttribute("action"), { method: "POST", body: new URLSearchParams(new FormData(form)) });
    const next = new DOMParser().parseFromString(await response.text(), "text/html");
    document.title = next.title;
    document.querySelector("main").replaceWith(document.adoptNode(next.querySelector("main")));
    armStop();
    form = document.getElementById("continue");
    if (stopping && form) {
      const button = document.getElementById("stop");
      button.disabled = false;
      form.requestSubmit(button);
    }
  }
})().catch((error) => {
  const progress = document.getElementById("progress");
  if (progress) progress.textContent += " Stopped: " + error.message + " (post continue to go on).";
});`;

function bulkAction(text: string | null): BulkAction {
  if (!BULK_ACTIONS.includes(text as BulkAction)) throw new BadRequest(`action must be one of ${BULK_ACTIONS.join(", ")}, not "${text ?? ""}"`);
  return text as BulkAction;
}

/** The jobs the action is for: the selected ones (ids), or the search's filter. */
function bulkFilter(parameters: URLSearchParams): { filter: sql.SqlJobFilter; selected: number | null } {
  const scope = parameters.get("scope");
  if (scope === "selected") {
    const ids = parameters.getAll("job");
    if (ids.length === 0) throw new BadRequest("no job is selected: tick the jobs to act on, or act on every job the search matches");
    return { filter: { ids }, selected: ids.length };
  }
  if (scope !== "all") throw new BadRequest(`scope must be selected or all, not "${scope ?? ""}"`);
  return { filter: searchFilter(parameters), selected: null };
}

/** `countUpTo`: BULK_COUNT_UP_TO but in a test of the "at least" wording. */
export async function confirmBulk(
  db: sql.Queryable,
  parameters: URLSearchParams,
  csrf: string,
  countUpTo = BULK_COUNT_UP_TO,
): Promise<{ title: string; body: Html }> {
  const action = bulkAction(parameters.get("action"));
  const { filter, selected } = bulkFilter(parameters);
  const counted = await sql.countJobs(db, filter, { action, atMost: countUpTo });
  const jobs = counted.exact ? number(counted.jobs) : `at least ${number(counted.jobs)}`;
  const of = selected === null ? "of those the search matches" : `of the ${number(selected)} selected`;
  return {
    title: `${action === "run_now" ? "Run now" : action[0]!.toUpperCase() + action.slice(1)}: ${jobs} job${counted.jobs === 1 ? "" : "s"}?`,
    body: html`<p>${WHAT[action]}.</p>
<p id="will-touch">This will ${action.replace("_", " ")} <b>${jobs}</b> job${counted.jobs === 1 ? "" : "s"} ${of}${counted.exact ? "" : " (counted no further)"}.
It acts in batches of ${number(BULK_BATCH)}, newest first; a job that moves on meanwhile is skipped and counted.</p>
<pre id="filter">${JSON.stringify(filter)}</pre>
${
  counted.jobs === 0
    ? html`<p class="note" id="nothing">No job to ${action.replace("_", " ")}: nothing will change.</p>`
    : html`<form method="post" action="/bulk" id="run"><input type="hidden" name="csrf" value="${csrf}">
<input type="hidden" name="action" value="${action}"><input type="hidden" name="filter" value="${JSON.stringify(filter)}">
${counted.exact ? html`<input type="hidden" name="counted" value="${counted.jobs}">` : ""}
<button type="submit" class="danger" id="confirm">${action.replace("_", " ")} ${jobs} jobs</button></form>`
}
<p><a href="/jobs">back to the jobs</a></p>`,
  };
}

function total(form: URLSearchParams, name: string): number {
  const text = form.get(name) ?? "0";
  if (!/^\d{1,12}$/.test(text)) throw new BadRequest(`${name} must be a whole number, not "${text}"`);
  return Number(text);
}

/** `budgetMs`: how long of batches this request runs (BULK_REQUEST_MS; at least one batch). */
export async function runBulk(
  db: sql.Queryable,
  form: URLSearchParams,
  csrf: string,
  budgetMs = BULK_REQUEST_MS,
): Promise<{ title: string; body: Html; script?: string }> {
  const action = bulkAction(form.get("action"));
  let filter: sql.SqlJobFilter;
  try {
    filter = JSON.parse(form.get("filter") ?? "") as sql.SqlJobFilter;
  } catch {
    throw new BadRequest("filter must be the JSON the confirmation page sent: go back to the jobs and search again");
  }
  const before = form.get("before") || undefined;
  if (before !== undefined && !/^\d{1,19}$/.test(before)) throw new BadRequest(`before must be a job id, not "${before}"`);
  const stop = form.get("stop");
  if (stop !== null && stop !== "1") throw new BadRequest(`stop must be 1, not "${stop}"`);
  const deadline = performance.now() + budgetMs;
  // Stopped: no batch; the totals the form carries are the answer.
  const run =
    stop === "1"
      ? { touched: 0, skipped: 0, batches: 0, interrupted: true, nextBeforeId: before ?? null }
      : await runBulkBatches(db, action, filter, { maxJobs: BULK_BATCH, beforeId: before, stop: () => performance.now() > deadline });
  const touched = total(form, "touched") + run.touched;
  const skipped = total(form, "skipped") + run.skipped;
  const batches = total(form, "batches") + run.batches;
  const counts = html`<span id="touched">${number(touched)}</span> ${DONE[action]}, <span id="skipped">${number(skipped)}</span> skipped
(moved on since the search, held by a worker, or a retry whose key another job holds), in ${number(batches)} batch${batches === 1 ? "" : "es"}`;
  if (!run.interrupted) {
    // Jobs the confirmation counted that no batch found: they moved on (another state, deleted) before their batch.
    const gone = form.get("counted") === null ? 0 : total(form, "counted") - touched - skipped;
    return {
      title: "Bulk action done",
      body: html`<p class="note" id="result">Done: ${counts}.</p>
${gone > 0 ? html`<p class="note" id="moved-on">${number(gone)} of the ${number(total(form, "counted"))} jobs the confirmation counted had moved on before their batch (no longer in a state to ${action.replace("_", " ")}, or gone) and were left as they were.</p>` : ""}
<p><a href="/jobs">back to the jobs</a></p>`,
    };
  }
  const state = html`<input type="hidden" name="csrf" value="${csrf}">
<input type="hidden" name="action" value="${action}"><input type="hidden" name="filter" value="${JSON.stringify(filter)}">
<input type="hidden" name="before" value="${run.nextBeforeId}"><input type="hidden" name="touched" value="${touched}">
<input type="hidden" name="skipped" value="${skipped}"><input type="hidden" name="batches" value="${batches}">
${form.get("counted") === null ? "" : html`<input type="hidden" name="counted" value="${form.get("counted")}">`}`;
  if (stop === "1") {
    return {
      title: "Bulk action stopped",
      body: html`<p class="note" id="stopped">Stopped: ${counts}. The jobs no batch reached were left as they were.</p>
<form method="post" action="/bulk" id="resume">${state}<button type="submit">go on from here</button></form>
<p><a href="/jobs">back to the jobs</a></p>`,
    };
  }
  return {
    title: "Bulk action running…",
    script: BULK_SCRIPT,
    body: html`<p id="progress">So far: ${counts}. Going on…</p>
<form method="post" action="/bulk" id="continue">${state}
<button type="submit">continue</button> <button type="submit" name="stop" value="1" id="stop">Stop</button>
<span class="muted">(Stop, or closing the page, stops after the batch in flight; what is done stays done)</span></form>`,
  };
}
