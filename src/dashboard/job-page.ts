// GET /jobs/:id: the job's fields, its attempt timeline (each failed attempt
// from the error history: claimed at, by which worker, how long, outcome,
// error and stack; operator retries; the latest attempt from the row), its
// payload and result, its durable steps (steps, sleeps, event waits) and the
// children it spawned with their outcomes, its key and the key ledger's
// entry, its pending parents and children, and the actions its state allows.
import type { JobState } from "../contract.ts";
import { attemptsText, getJob, jobLinks, keyEntry, stepPhrase, unlessRefused, waitingSentence, type Job, type LinkedJob } from "../job-reads.ts";
import { children, steps, type ChildOutcome, type Queryable, type StepRow } from "../sql/index.ts";
import { BadRequest } from "./bad-request.ts";
import { html, type Html } from "./html.ts";
import { duration, json, stateBadge, when } from "./layout.ts";

/** Which actions a state allows (the SQL functions check it again: IQ412 otherwise). */
export const ACTIONS_BY_STATE: Record<JobState, readonly JobAction[]> = {
  scheduled: ["reschedule", "cancel"],
  enqueued: ["reschedule", "cancel"],
  awaiting: ["reschedule", "cancel"],
  processing: ["cancel"],
  succeeded: [],
  failed: ["retry"],
  expired: ["retry"],
  cancelled: ["retry"],
};
export const JOB_ACTIONS = ["retry", "cancel", "reschedule"] as const;
export type JobAction = (typeof JOB_ACTIONS)[number];

export function jobId(text: string): string {
  if (!/^\d{1,19}$/.test(text)) throw new BadRequest(`a job id is a positive integer, not "${text}"`);
  return text;
}

/** `readOnly`: the pool's role may not act (the viewer): no action buttons. */
export async function jobPage(db: Queryable, id: string, notice?: string, readOnly = false): Promise<{ title: string; body: Html } | null> {
  const job = await getJob(db, id);
  if (job === null) return null;
  // steps() is the worker's and admin's: a viewer's page says so (null) rather than fail.
  const [links, key, ledger, spawned] = await Promise.all([
    jobLinks(db, id),
    job.idempotencyKey === null ? Promise.resolve(null) : keyEntry(db, job.idempotencyKey),
    unlessRefused(steps(db, id)),
    unlessRefused(children(db, id)),
  ]);
  const waiting = waitingSentence(job);
  return {
    title: `Job ${job.id}`,
    body: html`${notice === undefined ? "" : html`<p class="note" id="notice">${notice}</p>`}
<p>${readOnly ? "" : ACTIONS_BY_STATE[job.state].map((a) => html`<a class="act" href="/jobs/${job.id}/${a}"><button type="button">${a}…</button></a> `)}</p>
<dl>
<dt>state</dt><dd id="state">${stateBadge(job.state)}</dd>
${waiting === null ? "" : html`<dt>waiting for</dt><dd id="waiting-for">${waiting}</dd>`}
<dt>task</dt><dd id="task">${job.task}</dd>
<dt>queue</dt><dd>${job.queue}</dd>
<dt>priority</dt><dd>${job.priority}</dd>
<dt>attempts</dt><dd id="attempts">${attemptsText(job)}</dd>
${job.progress === null ? "" : html`<dt>progress</dt><dd><progress max="100" value="${job.progress}"></progress> <span id="progress">${job.progress} %</span></dd>`}
<dt>run at</dt><dd>${when(job.runAt)}</dd>
<dt>created</dt><dd>${when(job.createdAt)}</dd>
<dt>finished</dt><dd>${when(job.finishedAt)}</dd>
<dt>expires</dt><dd>${when(job.expiresAt)}</dd>
${job.state === "processing" ? html`<dt>lease until</dt><dd>${when(job.leaseExpiresAt)}</dd>` : ""}
</dl>
<h2>Attempts</h2>${timeline(job)}
${stepsSection(ledger)}${childrenSection(spawned)}<h2>Payload</h2><pre id="payload">${json(job.payload)}</pre>
<h2>Result</h2>${job.result === null || job.result === undefined ? html`<p class="muted">none</p>` : html`<pre id="result">${json(job.result)}</pre>`}
<h2>Idempotency key</h2>${keySection(job, key)}
<h2>Parents and children</h2>${linksSection(links)}`,
  };
}

interface Entry {
  attempt?: number;
  class?: string;
  message?: string;
  stack?: string;
  worker?: string;
  started_at?: string;
  failed_at?: string;
  retried_at?: string;
  previous_state?: string;
  [field: string]: unknown;
}

function at(text: string | undefined): Date | null {
  if (text === undefined || text === null) return null;
  const d = new Date(text);
  return Number.isNaN(d.getTime()) ? null : d;
}

function took(start: Date | null, end: Date | null): string {
  return start === null || end === null ? "-" : duration(end.getTime() - start.getTime());
}

function timeline(job: Job): Html {
  const entries = job.errors as Entry[];
  const rows: Html[] = entries.map((e) => {
    if (e.class === "Retried") {
      return html`<tr class="retried"><td class="n">${e.attempt ?? ""}</td><td>${when(at(e.retried_at))}</td><td class="muted">operator</td><td>-</td>
<td>retried</td><td>${e.message ?? ""}</td></tr>`;
    }
    const start = at(e.started_at);
    const end = at(e.failed_at);
    return html`<tr><td class="n">${e.attempt ?? ""}</td><td>${when(start)}</td><td>${e.worker ?? ""}</td><td>${took(start, end)}</td>
<td>${stateBadge("failed")} ${e.class ?? "Error"}</td><td>${e.message ?? ""}${
      typeof e.stack === "string" ? html`<details><summary>stack</summary><pre>${e.stack}</pre></details>` : ""
    }</td></tr>`;
  });
  // The latest attempt when the history does not end with it: running, or succeeded.
  if (job.state === "processing") {
    rows.push(html`<tr><td class="n">${job.attempt}</td><td>${when(job.lockedAt)}</td><td>${job.lockedBy ?? ""}</td><td>${took(job.lockedAt, new Date())} so far</td>
<td>${stateBadge("processing")}</td><td>lease until ${when(job.leaseExpiresAt)}</td></tr>`);
  } else if (job.state === "succeeded") {
    rows.push(html`<tr><td class="n">${job.attempt}</td><td>${when(job.lockedAt)}</td><td>${job.lockedBy ?? ""}</td><td>${took(job.lockedAt, job.finishedAt)}</td>
<td>${stateBadge("succeeded")}</td><td></td></tr>`);
  } else if (job.state === "cancelled" || job.state === "expired") {
    rows.push(html`<tr><td></td><td>${when(job.finishedAt)}</td><td></td><td>-</td><td>${stateBadge(job.state)}</td><td></td></tr>`);
  }
  if (rows.length === 0) {
    // A claim that ended without finishing or failing: a snooze, or a durable sleep, wait or children's wait that parked the job.
    if (job.attempt > 0) {
      return html`<p class="muted" id="parked">Claimed ${job.attempt} time${job.attempt === 1 ? "" : "s"} (latest ${when(job.lockedAt)}), no attempt failed: snoozed or parked (a sleep, an event wait or its children; see its steps).</p>`;
    }
    return html`<p class="muted">Not claimed yet.</p>`;
  }
  // Rows are numbered by claim (jobs.attempt, the errors' attempt), which
  // runs ahead of the attempts counted against the limit (the header's
  // "attempts N of M") once a claim did not count: say so where they differ.
  const uncounted = job.attempt - job.countedAttempts;
  const byClaim =
    uncounted === 0
      ? ""
      : html`<p class="muted" id="claim-numbers">Numbered by claim: ${uncounted} of ${job.attempt} claim${job.attempt === 1 ? "" : "s"} did not count as ${uncounted === 1 ? "an attempt" : "attempts"} (snoozes, hand-backs, attempts before a retry).</p>`;
  return html`${byClaim}<table id="timeline"><tr><th>claim</th><th>claimed at</th><th>worker</th><th>duration</th><th>outcome</th><th>error</th></tr>${rows}</table>`;
}

function keySection(job: Job, key: Awaited<ReturnType<typeof keyEntry>>): Html {
  if (job.idempotencyKey === null) return html`<p class="muted">none: every enqueue of this job was a new job</p>`;
  return html`<dl><dt>key</dt><dd id="key">${job.idempotencyKey}</dd>
${
  key === null
    ? html`<dt>ledger</dt><dd class="muted">no entry: released by prune_keys, so a new enqueue with this key makes a new job</dd>`
    : html`<dt>held by</dt><dd><a href="/jobs/${key.jobId}">job ${key.jobId}</a>${key.jobId === job.id ? " (this job)" : ""}</dd>
<dt>ledger state</dt><dd>${key.finishedState === null ? "active: a duplicate enqueue returns this job" : html`${stateBadge(key.finishedState)} at ${when(key.finishedAt)}: each enqueue's duplicate policy decides whether a new job starts`}</dd>
<dt>since</dt><dd>${when(key.createdAt)}</dd>`
}</dl>
<p class="muted">The duplicate policy is chosen by each enqueue, not stored with the job (enqueue's duplicate_policy, docs/design.md).</p>`;
}

function linksSection(links: { parents: LinkedJob[]; children: LinkedJob[] }): Html {
  if (links.parents.length === 0 && links.children.length === 0) {
    return html`<p class="muted">none pending (a dependency is removed when its parent succeeds)</p>`;
  }
  const list = (jobs: LinkedJob[]) =>
    jobs.length === 0 ? html`<span class="muted">none</span>` : jobs.map((j) => html`<a href="/jobs/${j.id}">${j.id}</a> ${j.task} ${stateBadge(j.state)}<br>`);
  return html`<dl><dt>waits on</dt><dd id="parents">${list(links.parents)}</dd><dt>waited on by</dt><dd id="children">${list(links.children)}</dd></dl>`;
}

/** Up to `max` characters of a value's JSON, the whole of it under a <details> when cut. */
function excerpt(value: unknown, max = 120): Html | string {
  if (value === null || value === undefined) return "";
  const text = JSON.stringify(value);
  if (text.length <= max) return html`<code>${text}</code>`;
  return html`<details><summary><code>${text.slice(0, max - 1)}…</code></summary><pre>${json(value)}</pre></details>`;
}

/** stepPhrase() for the page: the event and its key as code, an instant as when() prints it. */
function stepStatus(step: StepRow): Html {
  return html`${stepPhrase(step).map((part) =>
    typeof part === "string" ? part
    : "at" in part ? when(part.at)
    : part.event === null ? ""
    : html`<code>${part.event}</code>${part.key === null ? "" : html` key <code>${part.key}</code>`}`,
  )}`;
}

/** The job's step ledger (idemq.steps), oldest first; nothing for a job without steps. */
function stepsSection(ledger: readonly StepRow[] | null): Html | string {
  if (ledger === null) {
    return html`<h2>Steps</h2><p class="muted" id="steps-hidden">Steps are not shown: reading a job's steps needs the worker or admin role.</p>`;
  }
  if (ledger.length === 0) return "";
  const rows = ledger.map(
    (step) => html`<tr class="step-${step.kind}"><td>${when(step.recordedAt)}</td><td>${step.kind}</td><td class="step-name">${step.name}</td>
<td>${stepStatus(step)}</td><td class="n">${step.attempt}</td><td>${excerpt(step.result)}</td></tr>`,
  );
  return html`<h2>Steps</h2><table id="steps"><tr><th>recorded</th><th>kind</th><th>name</th><th>status</th><th>claim</th><th>result</th></tr>${rows}</table>`;
}

/** The children the job spawned (or a batch's jobs, for its callback), with their outcomes; nothing for a job without. */
function childrenSection(spawned: readonly ChildOutcome[] | null): Html | string {
  if (spawned === null) return html`<h2>Children</h2><p class="muted">Children are not shown: this role may not read them.</p>`;
  if (spawned.length === 0) return "";
  const rows = spawned.map((child) => {
    const error = child.lastError as { class?: unknown; message?: unknown } | null;
    const outcome = error === null ? excerpt(child.result) : html`${String(error.class ?? "Error")}: ${String(error.message ?? "")}`;
    return html`<tr><td class="child-name">${child.name}</td><td><a href="/jobs/${child.jobId}">${child.jobId}</a></td><td>${stateBadge(child.state)}</td><td>${outcome}</td></tr>`;
  });
  return html`<h2>Children</h2><table id="spawned"><tr><th>name</th><th>job</th><th>state</th><th>result or error</th></tr>${rows}</table>`;
}
