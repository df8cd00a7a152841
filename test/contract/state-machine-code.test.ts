// docs/state-machine.md checked against the code, not against the tests: each
// state-changing public function is called over a fresh job zoo (one job in
// each state, plus the lease-expired, last-attempt and parent variants), the
// state of every job is read before and after each call, and the transitions
// seen are compared with the document's table both ways. A move the code makes
// that the table lacks fails its scenario; a row of the table that no scenario
// saw fails the last test. The "Not transitions" of the document follow: with
// no row "processing -> ... by claim", a claim that took a processing job would
// fail here. (state-machine.test.ts proves each row once, by name.) After each
// call the kept job counts (idemq.job_counts) must still equal a count(*).
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { DUPLICATE_POLICIES } from "../../src/contract.ts";
import { useTestDatabase, inRollback, type PgError } from "../helpers/db.ts";
import { expectCountsExact } from "../helpers/job-counts.ts";
import { documentedTransitions, transitionName, type Transition } from "../helpers/state-machine-doc.ts";
import { ACTIVE_ZOO, buildZoo, TERMINAL_ZOO, ZOO_NAMES, type Zoo, type ZooJob, type ZooName } from "../helpers/zoo.ts";

const db = useTestDatabase({ poolSize: 2 });

type C = pg.ClientBase;
type Call = (c: C, zoo: Zoo) => Promise<unknown>;

/**
 * A step is a call of one public function (its moves are recorded under that
 * name), or a clock move (a direct UPDATE of timestamps only, not recorded).
 */
type Step = { by: string; call: Call } | { clock: Call };

interface Scenario {
  name: string;
  steps: Step[];
}

/** The state of every job, by id. */
async function allStates(c: C): Promise<Map<string, string>> {
  const { rows } = await c.query<{ id: string; state: string }>("SELECT id::text AS id, state::text AS state FROM idemq.jobs");
  return new Map(rows.map((r) => [r.id, r.state]));
}

/** Every job's move between two readings, "no change" (from = to) included. */
function moves(before: Map<string, string>, after: Map<string, string>, by: string): Transition[] {
  const seen: Transition[] = [];
  for (const [id, from] of before) seen.push({ from, to: after.get(id) ?? "(deleted)", by });
  for (const [id, to] of after) if (!before.has(id)) seen.push({ from: "(new)", to, by });
  return seen;
}

// The calls, by named parameters; a job's attempt and lease token are read
// from its row, so a step after a claim holds the attempt the claim gave.
const q = (text: string, values: (zoo: Zoo) => unknown[] = () => []): Call => (c, zoo) => c.query(text, values(zoo));
const onJob = (fn: string, args = ""): ((job: (zoo: Zoo) => ZooJob) => Call) => (job) =>
  q(`SELECT idemq.${fn}(job_id => j.id${args}) FROM idemq.jobs j WHERE j.id = $1`, (zoo) => [job(zoo).id]);
const withAttempt = (fn: string, args = "") => onJob(fn, `, attempt => j.attempt, lease_token => j.lease_token${args}`);
const pairs = (fn: string) => (job: (zoo: Zoo) => ZooJob): Call =>
  q(`SELECT idemq.${fn}(job_ids => ARRAY[j.id], attempts => ARRAY[j.attempt], lease_tokens => ARRAY[j.lease_token]) FROM idemq.jobs j WHERE j.id = $1`, (zoo) => [
    job(zoo).id,
  ]);

/** The functions that take one job, each applied to every zoo job in turn. */
const ON_ONE_JOB: Array<{ by: string; label: string; call: (job: (zoo: Zoo) => ZooJob) => Call }> = [
  { by: "complete", label: "complete", call: withAttempt("complete") },
  { by: "complete_many", label: "complete_many", call: pairs("complete_many") },
  {
    by: "complete_and_take_next",
    label: "complete_and_take_next",
    call: (job) =>
      q(
        `SELECT idemq.complete_and_take_next(job_ids => ARRAY[j.id], attempts => ARRAY[j.attempt], lease_tokens => ARRAY[j.lease_token],
           worker_id => 'sm-worker') FROM idemq.jobs j WHERE j.id = $1`,
        (zoo) => [job(zoo).id],
      ),
  },
  { by: "fail", label: "fail (retryable)", call: withAttempt("fail", `, error => '{"class": "SmError", "message": "x"}'`) },
  {
    by: "fail",
    label: "fail (not retryable)",
    call: withAttempt("fail", `, error => '{"class": "SmError", "message": "x"}', retryable => false`),
  },
  { by: "snooze", label: "snooze (a minute)", call: withAttempt("snooze", ", run_at => now() + interval '1 minute'") },
  { by: "snooze", label: "snooze (now)", call: withAttempt("snooze", ", run_at => now()") },
  { by: "hold", label: "hold (its queue, a minute)", call: withAttempt("hold", ", scope => 'queue', until => now() + interval '1 minute'") },
  { by: "heartbeat", label: "heartbeat", call: pairs("heartbeat") },
  { by: "cancel", label: "cancel", call: onJob("cancel") },
  { by: "retry", label: "retry", call: onJob("retry") },
  { by: "reschedule", label: "reschedule (now)", call: onJob("reschedule", ", run_at => now()") },
  { by: "reschedule", label: "reschedule (an hour)", call: onJob("reschedule", ", run_at => now() + interval '1 hour'") },
];

const job = (name: ZooName) => (zoo: Zoo) => zoo[name];
const ids = (zoo: Zoo, names: readonly ZooName[]) => names.map((n) => zoo[n].id);
const clock = (text: string, names: readonly ZooName[]): Step => ({ clock: q(text, (zoo) => [ids(zoo, names)]) });
const due = (...names: ZooName[]) => clock("UPDATE idemq.jobs SET run_at = now() WHERE id = ANY($1::bigint[])", names);
const later = (...names: ZooName[]) =>
  clock("UPDATE idemq.jobs SET run_at = now() + interval '1 hour' WHERE id = ANY($1::bigint[])", names);
const pastDeadline = (...names: ZooName[]) =>
  clock("UPDATE idemq.jobs SET expires_at = now() WHERE id = ANY($1::bigint[])", names);
const leaseRanOut = (...names: ZooName[]) =>
  clock("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1::bigint[])", names);
const finishedLongAgo = (...names: ZooName[]) =>
  clock("UPDATE idemq.jobs SET finished_at = now() - interval '2 days' WHERE id = ANY($1::bigint[])", names);

const enqueueCall = (args: string, values: (zoo: Zoo) => unknown[] = () => []): Step => ({
  by: "enqueue",
  call: q(`SELECT * FROM idemq.enqueue(task => 'sm_new'${args})`, values),
});
const enqueueManyCall = (element: string, values: (zoo: Zoo) => unknown[] = () => []): Step => ({
  by: "enqueue_many",
  call: q(`SELECT * FROM idemq.enqueue_many(jsonb_build_array(jsonb_build_object('task', 'sm_new'${element})))`, values),
});
const claimAll: Step = {
  by: "claim",
  call: q("SELECT * FROM idemq.claim(worker_id => 'sm-worker', queues => NULL, batch_size => 100)"),
};
const claimOf = (name: ZooName): Step => ({
  by: "claim",
  call: q("SELECT * FROM idemq.claim(worker_id => 'sm-worker', queues => ARRAY[$1::text])", (zoo) => [zoo[name].queue]),
});
const rescue: Step = { by: "rescue", call: q("SELECT idemq.rescue()") };
const purge: Step = { by: "purge", call: q("SELECT idemq.purge(older_than => '1 day')") };
const applyRetention: Step = { by: "apply_retention", call: q("SELECT idemq.apply_retention()") };
const retentionZero: Step = { by: "set_retention", call: q("SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds')") };
const finishedMonthAgo = (...names: ZooName[]) =>
  clock("UPDATE idemq.jobs SET finished_at = now() - interval '31 days' WHERE id = ANY($1::bigint[])", names);
const onParent = (by: string, call: (job: (zoo: Zoo) => ZooJob) => Call): Step => ({ by, call: call(job("parent")) });
const failParent = (retryable: boolean) =>
  onParent("fail", withAttempt("fail", `, error => '{"class": "SmError", "message": "x"}', retryable => ${retryable}`));

// Fan-out: the processing zoo job spawns a child in queue sm_child and parks
// (wait_for_children); the child then ends by `end`, which releases the parent.
const spawnChild: Step = {
  by: "spawn",
  call: q(
    `SELECT idemq.spawn(job_id => j.id, attempt => j.attempt, lease_token => j.lease_token,
       children => '[{"name": "c", "task": "sm_child", "queue": "sm_child", "expires_at": "2100-01-01T00:00:00Z"}]')
     FROM idemq.jobs j WHERE j.id = $1`,
    (zoo) => [zoo.processing.id],
  ),
};
const parkParent: Step = { by: "wait_for_children", call: withAttempt("wait_for_children")(job("processing")) };
const theChild = "(SELECT c.child_id FROM idemq.job_children c WHERE c.name = 'c')";
const claimChild: Step = { by: "claim", call: q("SELECT * FROM idemq.claim(worker_id => 'sm-worker', queues => ARRAY['sm_child'])") };
const onChild = (by: string, args: string): Step => ({
  by,
  call: q(`SELECT idemq.${by}(job_id => j.id${args}) FROM idemq.jobs j WHERE j.id = ${theChild}`),
});
const childAttempt = ", attempt => j.attempt, lease_token => j.lease_token";

const SCENARIOS: Scenario[] = [
  // A new job, in each state enqueue can start one in.
  { name: "enqueue (run_at unset)", steps: [enqueueCall("")] },
  { name: "enqueue (run_at now)", steps: [enqueueCall(", run_at => now()")] },
  { name: "enqueue (run_at an hour on)", steps: [enqueueCall(", run_at => now() + interval '1 hour'")] },
  { name: "enqueue_many (run_at unset)", steps: [enqueueManyCall("")] },
  { name: "enqueue_many (run_at an hour on)", steps: [enqueueManyCall(", 'run_at', now() + interval '1 hour'")] },
  ...ZOO_NAMES.flatMap((name): Scenario[] => [
    { name: `enqueue after ${name}`, steps: [enqueueCall(", after => ARRAY[$1::bigint]", (zoo) => [zoo[name].id])] },
    {
      name: `enqueue_many after ${name}`,
      steps: [enqueueManyCall(", 'after', jsonb_build_array($1::bigint)", (zoo) => [zoo[name].id])],
    },
    // The zoo job's own key, under each policy: deduplicated, refused or a new job.
    ...DUPLICATE_POLICIES.map(
      (policy): Scenario => ({
        name: `enqueue with ${name}'s key (${policy})`,
        steps: [
          {
            by: "enqueue",
            call: q(
              `SELECT * FROM idemq.enqueue(task => 'zoo_task', payload => jsonb_build_object('zoo', $1::text),
                 idempotency_key => $2, duplicate_policy => $3::idemq.duplicate_policy)`,
              (zoo) => [name, zoo[name].key, policy],
            ),
          },
        ],
      }),
    ),
    // Every one-job function on every zoo job (a refusal counts as "no change").
    ...ON_ONE_JOB.map((f): Scenario => ({ name: `${f.label} of ${name}`, steps: [{ by: f.by, call: f.call(job(name)) }] })),
  ]),

  { name: "claim", steps: [claimAll] },
  {
    // The key's next job handed to the worker that completes its first.
    name: "complete_and_take_next of a concurrency key's job with another waiting",
    steps: [
      enqueueCall(", queue => 'sm_keyed', concurrency_key => 'sm-next'"),
      enqueueCall(", queue => 'sm_keyed', concurrency_key => 'sm-next'"),
      { by: "claim", call: q("SELECT * FROM idemq.claim(worker_id => 'sm-worker', queues => ARRAY['sm_keyed'], token => true)") },
      {
        by: "complete_and_take_next",
        call: q(
          `SELECT idemq.complete_and_take_next(job_ids => array_agg(j.id), attempts => array_agg(j.attempt), lease_tokens => array_agg(j.lease_token),
             worker_id => 'sm-worker', queues => ARRAY['sm_keyed'])
           FROM idemq.jobs j WHERE j.queue = 'sm_keyed' AND j.state = 'processing'`,
        ),
      },
    ],
  },
  {
    // K = 2: both jobs of the key admitted; the hold of the key moves the other one too.
    name: "hold of a concurrency key with another job of the key enqueued",
    steps: [
      { by: "set_limit", call: q("SELECT idemq.set_limit(queue => 'sm_keyed', per_key => 2)") },
      enqueueCall(", queue => 'sm_keyed', concurrency_key => 'sm-key', priority => 1"),
      enqueueCall(", queue => 'sm_keyed', concurrency_key => 'sm-key'"),
      { by: "claim", call: q("SELECT * FROM idemq.claim(worker_id => 'sm-worker', queues => ARRAY['sm_keyed'])") },
      {
        by: "hold",
        call: q(
          `SELECT idemq.hold(job_id => j.id, attempt => j.attempt, scope => 'key', until => now() + interval '1 minute', lease_token => j.lease_token)
           FROM idemq.jobs j WHERE j.queue = 'sm_keyed' AND j.state = 'processing'`,
        ),
      },
    ],
  },
  { name: "claim once scheduled's run_at passed", steps: [due("scheduled"), claimAll] },

  { name: "rescue", steps: [rescue] },
  ...(["processing", "lastAttempt"] as const).map((name): Scenario => ({ name: `rescue once ${name}'s lease ran out`, steps: [leaseRanOut(name), rescue] })),
  ...ZOO_NAMES.filter((name) => ACTIVE_ZOO.includes(name)).map(
    (name): Scenario => ({ name: `rescue once ${name}'s expires_at passed`, steps: [pastDeadline(name), rescue] }),
  ),

  { name: "purge", steps: [purge] },
  { name: "apply_retention", steps: [applyRetention] },
  ...TERMINAL_ZOO.map((name): Scenario => ({ name: `apply_retention once ${name} finished 31 days ago`, steps: [finishedMonthAgo(name), applyRetention] })),
  // Retention 0 for succeeded jobs: every one-job function again, on every zoo job.
  ...ZOO_NAMES.flatMap((name) =>
    ON_ONE_JOB.map((f): Scenario => ({ name: `${f.label} of ${name}, retention 0`, steps: [retentionZero, { by: f.by, call: f.call(job(name)) }] })),
  ),
  ...TERMINAL_ZOO.map((name): Scenario => ({ name: `purge once ${name} finished two days ago`, steps: [finishedLongAgo(name), purge] })),

  // The parent of the awaiting job finishing, by each function that can finish it.
  { name: "parent claimed and completed", steps: [due("parent"), claimOf("parent"), onParent("complete", withAttempt("complete"))] },
  {
    name: "parent claimed and completed, the child's run_at an hour on",
    steps: [due("parent"), later("awaiting"), claimOf("parent"), onParent("complete", withAttempt("complete"))],
  },
  { name: "parent claimed and completed by complete_many", steps: [due("parent"), claimOf("parent"), onParent("complete_many", pairs("complete_many"))] },
  ...[[], [later("awaiting")]].map(
    (clock, i): Scenario => ({
      name: `parent claimed and completed by complete_and_take_next${i === 1 ? ", the child's run_at an hour on" : ""}`,
      steps: [due("parent"), ...clock, claimOf("parent"), onParent("complete_and_take_next", ON_ONE_JOB.find((f) => f.by === "complete_and_take_next")!.call)],
    }),
  ),
  {
    name: "parent claimed and completed by complete_many, the child's run_at an hour on",
    steps: [due("parent"), later("awaiting"), claimOf("parent"), onParent("complete_many", pairs("complete_many"))],
  },
  { name: "parent claimed and failed for good", steps: [due("parent"), claimOf("parent"), failParent(false)] },
  { name: "parent claimed and failed with a retry", steps: [due("parent"), claimOf("parent"), failParent(true)] },
  { name: "parent claimed and cancelled", steps: [due("parent"), claimOf("parent"), onParent("cancel", onJob("cancel"))] },
  {
    name: "parent claimed, its lease ran out, rescued",
    steps: [due("parent"), claimOf("parent"), leaseRanOut("parent"), rescue],
  },
  // A parked parent, released by its child's end, whatever the child's outcome.
  { name: "spawn, park, the child completed", steps: [spawnChild, parkParent, claimChild, onChild("complete", childAttempt)] },
  {
    name: "spawn, park, the child failed for good",
    steps: [spawnChild, parkParent, claimChild, onChild("fail", `${childAttempt}, error => '{"class": "SmError", "message": "x"}', retryable => false`)],
  },
  { name: "spawn, park, the child cancelled", steps: [spawnChild, parkParent, onChild("cancel", "")] },
  {
    name: "spawn, park, the child past its expires_at, rescued",
    steps: [spawnChild, parkParent, { clock: q(`UPDATE idemq.jobs SET expires_at = now() WHERE id = ${theChild}`) }, rescue],
  },
  {
    name: "enqueue_batch",
    steps: [{ by: "enqueue_batch", call: q(`SELECT * FROM idemq.enqueue_batch(jobs => '[{"task": "sm_new"}]', callback => '{"task": "sm_new"}')`) }],
  },
  {
    name: "parent claimed, its lease ran out past its expires_at, rescued",
    steps: [due("parent"), claimOf("parent"), leaseRanOut("parent"), pastDeadline("parent"), rescue],
  },
];

/** What the scenarios saw, for the last test: transition name → scenarios that saw it. */
const seen = new Map<string, string[]>();
let scenariosRun = 0;

const DOCUMENTED = new Set(documentedTransitions().map(transitionName));

describe("every move the functions make is a row of docs/state-machine.md", () => {
  it.each(SCENARIOS.map((s) => [s.name, s] as const))("%s", async (scenario, { steps }) => {
    const observed = await inRollback(db.pool, async (c) => {
      const zoo = await buildZoo(c);
      const observed: Transition[] = [];
      for (const [i, step] of steps.entries()) {
        if ("clock" in step) {
          await step.clock(c, zoo);
          continue;
        }
        const before = await allStates(c);
        let refused = false;
        try {
          await step.call(c, zoo);
        } catch (error) {
          // Only a refusal by idemq (IQ4xx: not held, wrong state, key taken):
          // it changes nothing, and the transaction is over, so it ends the scenario.
          if (!/^IQ4/.test((error as PgError).code ?? "")) throw error;
          expect(i, `only the last step may be refused (${(error as Error).message})`).toBe(steps.length - 1);
          refused = true;
        }
        observed.push(...moves(before, refused ? before : await allStates(c), step.by));
        // The kept counts (stats(), overview()) follow every move, whichever function made it.
        if (!refused) await expectCountsExact(c, `after ${step.by} (step ${i + 1})`);
      }
      return observed;
    });
    for (const t of observed) {
      const name = transitionName(t);
      seen.set(name, [...(seen.get(name) ?? []), scenario]);
    }
    scenariosRun++;
    const changes = observed.filter((t) => t.from !== t.to).map(transitionName);
    expect(
      [...new Set(changes)].filter((name) => !DOCUMENTED.has(name)),
      "transitions the code made that the table lacks",
    ).toEqual([]);
  });
});

describe("docs/state-machine.md against the code", () => {
  it("every row of its table is a move some function was seen to make", () => {
    expect(scenariosRun, "this test reads what every scenario above saw: run the whole file").toBe(SCENARIOS.length);
    expect([...DOCUMENTED].filter((name) => !seen.has(name)), "rows no scenario saw").toEqual([]);
  });

});
