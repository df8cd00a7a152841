// Durable steps' cost in processing (issue 28, item 8), one worker process
// at concurrency 10, four variants of J = ctx.sizes.process / 10 jobs:
//
//   idemq:nosteps     J no-op jobs
//   idemq:steps10     J jobs whose handler makes STEPS_PER_JOB (10) transactional
//                     ctx.step calls, each fn doing nothing (STEPS_TASK)
//   idemq:external10  J jobs whose handler makes 10 external ctx.step calls
//                     ({ external: true }, claim-first as ctx.effect), each fn
//                     doing nothing: the outside call it stands for costs
//                     nothing here (EXTERNAL_STEPS_TASK)
//   idemq:chain10     the same 10 units of work as 10 no-op jobs each: J chains
//                     of 10 jobs, each enqueued with `after` its predecessor
//
// Per step: (steps10 - nosteps) per job / 10, and the same for external10,
// for worker and backend CPU, WAL and round trips (bench/targets.ts,
// MEASURED). Workflow against chain: units of work per second (a step, or a
// chained job), steps10 / chain10.
// No target: the issue gives none, so these rows are measured, not judged.
// bench/FINDINGS.md, "Durable steps: where a step's cost goes", reads them.
import * as sql from "../../dist/sql/index.js"; // the compiled package, as bench/systems/idemq.ts
import { EXTERNAL_STEPS_TASK, NOOP_TASK, STEPS_PER_JOB, STEPS_TASK } from "../systems/types.ts";
import { variant, type Context, type FreshDatabase, type Workload } from "./common.ts";
import { runProcessing } from "./process.ts";

// enqueue_many's default jobs_per_call is 50,000.
const CHUNK = 20_000;

/** Jobs of the nosteps, steps10 and external10 variants, chains of chain10: a tenth of process.c10's, so each variant does about as many units. */
export function stepJobs(ctx: Context): number {
  return Math.max(10, Math.floor(ctx.sizes.process / STEPS_PER_JOB));
}

async function enqueueLevel(db: FreshDatabase, task: string, count: number, first: number, parents?: string[]): Promise<string[]> {
  const ids: string[] = [];
  for (let start = 0; start < count; start += CHUNK) {
    const n = Math.min(CHUNK, count - start);
    const made = await sql.enqueueMany(
      db.client,
      Array.from({ length: n }, (_, k) => ({
        task,
        payload: { i: first + start + k },
        ...(parents ? { after: [parents[start + k]!] } : {}),
      })),
    );
    for (const r of made) {
      if (r.jobId === null || r.outcome !== "created") throw new Error(`enqueue of a ${task} job: ${r.outcome}`);
      ids.push(r.jobId);
    }
  }
  return ids;
}

/** J chains of STEPS_PER_JOB no-op jobs: level by level, each job after the one of its chain in the level before. */
async function enqueueChains(db: FreshDatabase, chains: number): Promise<void> {
  let parents: string[] | undefined;
  for (let level = 0; level < STEPS_PER_JOB; level++) parents = await enqueueLevel(db, NOOP_TASK, chains, level * chains, parents);
}

type Shape = "nosteps" | "steps10" | "external10" | "chain10";

/** Each variant's task: the worker's handler (bench/systems/idemq.ts), and what the settings line names. */
const TASKS: Record<Shape, string> = { nosteps: NOOP_TASK, steps10: STEPS_TASK, external10: EXTERNAL_STEPS_TASK, chain10: NOOP_TASK };

const NOTES: Record<Shape, string> = {
  nosteps: "idemq:nosteps: a no-op handler; units/s is jobs/s",
  steps10: `idemq:steps10: each job's handler makes ${STEPS_PER_JOB} transactional ctx.step calls (BEGIN, a no-op fn, step_record, COMMIT each; the ledger read once per attempt); a unit is a step`,
  external10:
    `idemq:external10: each job's handler makes ${STEPS_PER_JOB} external ctx.step calls (effect_claim, a no-op fn, effect_done, step_record each, ` +
    `every call its own transaction; the ledger read once per attempt); a unit is a step`,
  chain10: `idemq:chain10: chains of ${STEPS_PER_JOB} no-op jobs, each enqueued with \`after\` its predecessor (released by its completion); a unit is a job, and per-job columns are per unit`,
};

const SHAPES = Object.keys(TASKS) as Shape[];

export const stepsWorkload: Workload = {
  id: "process.steps",
  title:
    `durable steps, concurrency 10: no-op jobs, jobs of ${STEPS_PER_JOB} transactional no-op steps, jobs of ${STEPS_PER_JOB} external no-op steps, ` +
    `and chains of ${STEPS_PER_JOB} no-op jobs with \`after\``,
  concurrency: 10,
  variants: SHAPES.map((shape) => ({ ...variant("idemq", "batched", `idemq:${shape}`), task: TASKS[shape] })),
  subject: "idemq:steps10",
  primary: "units_per_s",
  higherIsBetter: true,
  async run(ctx, v, round) {
    const shape = v.label.slice("idemq:".length) as Shape;
    const task = TASKS[shape];
    const j = stepJobs(ctx);
    const measured = await runProcessing(ctx, v, round, {
      concurrency: 10,
      task,
      jobs: shape === "chain10" ? j * STEPS_PER_JOB : j,
      unitsPerJob: task === NOOP_TASK ? 1 : STEPS_PER_JOB,
      seed: (db) => (shape === "chain10" ? enqueueChains(db, j) : enqueueLevel(db, task, j, 0).then(() => {})),
    });
    return { ...measured, note: NOTES[shape] };
  },
};
