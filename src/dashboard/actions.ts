// The dashboard's writes: retry, cancel, reschedule one job, purge
// finished jobs, and flow control (pause, resume, set and clear a limit), each through its SQL function (src/sql/), never a direct
// write. A GET shows what will happen and a form; only its POST, carrying the
// CSRF token, acts. The database decides who may: the functions are
// the installation's admin role's, and a role without EXECUTE gets 403 with a message saying so.
import { isTerminalState, TERMINAL_STATES, type TerminalState } from "../contract.ts";
import { getJob } from "../job-reads.ts";
import * as sql from "../sql/index.ts";
import { BadRequest } from "./bad-request.ts";
import { html, query, type Html } from "./html.ts";
import { stateBadge } from "./layout.ts";
import type { JobAction } from "./job-page.ts";
import type { LimitAction } from "./limits-page.ts";

const VERBS: Record<JobAction, string> = {
  retry: "Retry: back to enqueued with fresh attempts (the error history is kept)",
  cancel: "Cancel: the job will not run (a running attempt loses its lease; awaiting children are cancelled)",
  reschedule: "Reschedule: run at another time (attempts and errors untouched)",
};

function csrfField(csrf: string): Html {
  return html`<input type="hidden" name="csrf" value="${csrf}">`;
}

export async function confirmJobAction(db: sql.Queryable, id: string, action: JobAction, csrf: string): Promise<{ title: string; body: Html } | null> {
  const job = await getJob(db, id);
  if (job === null) return null;
  const inAnHour = new Date(Date.now() + 3_600_000).toISOString().replace(/\.\d+Z$/, "Z");
  return {
    title: `${action[0]!.toUpperCase()}${action.slice(1)} job ${job.id}?`,
    body: html`<p>Job <a href="/jobs/${job.id}">${job.id}</a> (${job.task}, queue ${job.queue}) is ${stateBadge(job.state)}.</p>
<p>${VERBS[action]}.</p>
<form method="post" action="/jobs/${job.id}/${action}">${csrfField(csrf)}
${action === "reschedule" ? html`<label>run at (ISO 8601, UTC) <input name="run_at" value="${inAnHour}" size="24" required></label>` : ""}
<button type="submit" class="danger" id="confirm">${action}</button> <a href="/jobs/${job.id}">back</a></form>`,
  };
}

/** Runs the action; returns the notice the job page shows. */
export async function runJobAction(db: sql.Queryable, id: string, action: JobAction, form: URLSearchParams): Promise<string> {
  switch (action) {
    case "retry":
      return `retried: now ${await sql.retry(db, id)}`;
    case "cancel":
      return `cancelled: now ${await sql.cancel(db, id)}`;
    case "reschedule": {
      const text = form.get("run_at")?.trim() ?? "";
      const runAt = new Date(text);
      if (text === "" || Number.isNaN(runAt.getTime())) {
        throw new BadRequest(`run_at must be an instant such as 2026-12-02T09:00:00Z, not "${text}"`);
      }
      return `rescheduled to ${runAt.toISOString()}: now ${await sql.reschedule(db, id, runAt)}`;
    }
  }
}

/** `older_than` as the form has it: a whole number and a unit, so nothing but an interval reaches SQL. */
function olderThan(form: URLSearchParams): string {
  const amount = form.get("amount") ?? "";
  const unit = form.get("unit") ?? "";
  if (!/^\d{1,6}$/.test(amount)) throw new BadRequest(`amount must be a whole number, not "${amount}"`);
  if (!["minutes", "hours", "days"].includes(unit)) throw new BadRequest(`unit must be minutes, hours or days, not "${unit}"`);
  return `${amount} ${unit}`;
}

function purgeStates(form: URLSearchParams): TerminalState[] {
  const chosen = form.getAll("state");
  const wrong = chosen.find((s) => !isTerminalState(s as never));
  if (wrong !== undefined) throw new BadRequest(`purge deletes finished jobs only: state must be one of ${TERMINAL_STATES.join(", ")}, not "${wrong}"`);
  if (chosen.length === 0) throw new BadRequest("choose at least one state to purge");
  return chosen as TerminalState[];
}

export function purgeForm(): { title: string; body: Html } {
  return {
    title: "Purge finished jobs",
    body: html`<form class="act" method="get" action="/purge/confirm">
<p>Delete jobs that finished more than <input name="amount" value="7" size="4"> <select name="unit"><option>days</option><option>hours</option><option>minutes</option></select> ago, in states
${TERMINAL_STATES.map((s) => html`<label><input type="checkbox" name="state" value="${s}"${s === "succeeded" ? html` checked` : ""}> ${s}</label>`)}</p>
<p class="muted">Keys stay in the ledger until prune_keys, so a purged job's key still deduplicates. Workers also delete jobs past their retention on their own.</p>
<button type="submit">Review…</button></form>`,
  };
}

export function confirmPurge(form: URLSearchParams, csrf: string): { title: string; body: Html } {
  const older = olderThan(form);
  const states = purgeStates(form);
  return {
    title: "Purge finished jobs?",
    body: html`<p>Delete every ${states.map((s) => html`${stateBadge(s)} `)} job that finished more than <b>${older}</b> ago. This cannot be undone.</p>
<form method="post" action="/purge">${csrfField(csrf)}<input type="hidden" name="amount" value="${form.get("amount")}"><input type="hidden" name="unit" value="${form.get("unit")}">
${states.map((s) => html`<input type="hidden" name="state" value="${s}">`)}
<button type="submit" class="danger" id="confirm">purge</button> <a href="/purge${query({})}">back</a></form>`,
  };
}

export async function runPurge(db: sql.Queryable, form: URLSearchParams): Promise<string> {
  const deleted = await sql.purge(db, { olderThan: olderThan(form), states: purgeStates(form) });
  return `purged ${deleted.toLocaleString("en-US")} job(s)`;
}

/** The scope a flow-control form names: hidden queue= or task= (a row's buttons), or kind= and name= (the forms). */
function limitScope(form: URLSearchParams): sql.LimitScope {
  const kind = form.get("kind");
  const queue = kind === null ? form.get("queue") : kind === "queue" ? form.get("name") : null;
  const task = kind === null ? form.get("task") : kind === "task" ? form.get("name") : null;
  if (kind !== null && kind !== "queue" && kind !== "task") throw new BadRequest(`kind must be queue or task, not "${kind}"`);
  // Exactly one, and a valid name, is SQL's to judge (22023 with its hint).
  return { queue: queue ?? undefined, task: task ?? undefined };
}

/** A whole number field of a form, or undefined when empty; its range is SQL's to judge. */
function wholeNumber(form: URLSearchParams, name: string): number | undefined {
  const text = form.get(name)?.trim() ?? "";
  if (text === "") return undefined;
  if (!/^-?\d{1,9}$/.test(text)) throw new BadRequest(`${name} must be a whole number, not "${text}"`);
  return Number(text);
}

function scopeText(scope: sql.LimitScope): string {
  return scope.queue !== undefined ? `queue ${scope.queue}` : `task ${scope.task}`;
}

/** Runs a flow-control action (set_limit, clear_limit, pause, resume); returns the notice /limits shows. */
export async function runLimitAction(db: sql.Queryable, action: LimitAction, form: URLSearchParams): Promise<string> {
  const scope = limitScope(form);
  switch (action) {
    case "pause":
      return (await sql.pause(db, scope)) ? `paused ${scopeText(scope)}` : `${scopeText(scope)} was paused already`;
    case "resume":
      return (await sql.resume(db, scope)) ? `resumed ${scopeText(scope)}` : `${scopeText(scope)} was not paused`;
    case "clear":
      return (await sql.clearLimit(db, scope)) ? `cleared the limits of ${scopeText(scope)}` : `${scopeText(scope)} had no limit`;
    case "set": {
      const concurrency = wholeNumber(form, "concurrency");
      const rate = wholeNumber(form, "rate");
      const per = form.get("per")?.trim() || undefined;
      await sql.setLimit(db, { ...scope, concurrency, rate, per });
      const parts = [concurrency === undefined ? "" : `concurrency ${concurrency}`, rate === undefined ? "" : `rate ${rate} per ${per}`].filter((p) => p !== "");
      return `set ${scopeText(scope)}: ${parts.join(", ")}`;
    }
  }
}
