// Bulk actions from the jobs page (retry, cancel, delete, run now) on the
// selected jobs or on everything a search matches. GET /bulk is the
// confirmation: count_jobs(filter, action) says how many jobs the action
// will touch (at least BULK_COUNT_UP_TO when there are more), and nothing
// changes. POST /bulk acts: batch after batch (runBulkBatches: each batch is
// one call of retry_jobs etc., its own short transaction holding at most
// BULK_BATCH rows), for at most BUDGET_MS per request; the page it answers
// shows the totals so far and, while jobs are left, a form that its script
// posts at once to go on from next_before_id. So 100,000 jobs never hold the
// table nor a request for long, and a closed tab stops between batches with
// the done ones done. The per-job rules (which states, a key held) are SQL's;
// a job that moved on since the search is skipped and counted.
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
/** Batches run by one request before the page posts the next. */
const BUDGET_MS = 2000;

const DONE: Record<BulkAction, string> = { retry: "retried", cancel: "cancelled", delete: "deleted", run_now: "enqueued to run now" };
const WHAT: Record<BulkAction, string> = {
  retry: "Retry: back to enqueued with fresh attempts (failed, cancelled and expired jobs)",
  cancel: "Cancel: will not run (active jobs; a running attempt loses its lease)",
  delete: "Delete: gone for good (finished jobs; their keys stay until prune_keys)",
  run_now: "Run now: scheduled jobs enqueued at once",
};

/** Continues the bulk form's batches as soon as the page is shown (the button does it without scripts). */
export const BULK_SCRIPT = `const next = document.getElementById("continue"); if (next) next.requestSubmit();`;

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

export async function runBulk(db: sql.Queryable, form: URLSearchParams, csrf: string): Promise<{ title: string; body: Html; script?: string }> {
  const action = bulkAction(form.get("action"));
  let filter: sql.SqlJobFilter;
  try {
    filter = JSON.parse(form.get("filter") ?? "") as sql.SqlJobFilter;
  } catch {
    throw new BadRequest("filter must be the JSON the confirmation page sent: go back to the jobs and search again");
  }
  const before = form.get("before") || undefined;
  if (before !== undefined && !/^\d{1,19}$/.test(before)) throw new BadRequest(`before must be a job id, not "${before}"`);
  const deadline = performance.now() + BUDGET_MS;
  const run = await runBulkBatches(db, action, filter, { maxJobs: BULK_BATCH, beforeId: before, stop: () => performance.now() > deadline });
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
  return {
    title: "Bulk action running…",
    script: BULK_SCRIPT,
    body: html`<p id="progress">So far: ${counts}. Going on…</p>
<form method="post" action="/bulk" id="continue"><input type="hidden" name="csrf" value="${csrf}">
<input type="hidden" name="action" value="${action}"><input type="hidden" name="filter" value="${JSON.stringify(filter)}">
<input type="hidden" name="before" value="${run.nextBeforeId}"><input type="hidden" name="touched" value="${touched}">
<input type="hidden" name="skipped" value="${skipped}"><input type="hidden" name="batches" value="${batches}">
${form.get("counted") === null ? "" : html`<input type="hidden" name="counted" value="${form.get("counted")}">`}
<button type="submit">continue</button> <span class="muted">(closing the page stops after the batch in flight; what is done stays done)</span></form>`,
  };
}
