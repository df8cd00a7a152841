// Runs the known-slow test files first, so that no long file starts near the
// end of a run and keeps one fork busy while the others sit idle. vitest's own
// sequencer orders by the durations it cached on an earlier run, but its cache
// lives in node_modules, which `npm ci` (and so every CI run) deletes: on a
// fresh clone it falls back to file size, which is a poor guess here (the
// longest file, readme.test.ts, is mostly waiting on subprocesses). The list
// below is committed instead; the rest keep vitest's order after it.
import { existsSync } from "node:fs";
import { relative, resolve } from "node:path";
import { BaseSequencer, type TestSpecification } from "vitest/node";

/**
 * The files that took 12 s or more in a whole-suite run on 2 cores, longest
 * first (re-measure with `--reporter=json` and update when the order drifts).
 */
export const SLOW_FILES: readonly string[] = [
  "test/contract/readme.test.ts",
  "test/cli/embedded-share.test.ts",
  "test/cli/errors.test.ts",
  "test/install/package.test.ts",
  "test/cli/demo.test.ts",
  "test/cli/embedded.test.ts",
  "test/cli/jobs.test.ts",
  "test/dashboard/search-bulk.test.ts",
  "test/worker/server-restart.test.ts",
  "test/cli/purge.test.ts",
  "test/contract/state-machine-code.test.ts",
  "test/cli/worker.test.ts",
  "test/install/non-superuser.test.ts",
  "test/sql/children.test.ts",
  "test/worker/no-freeze.test.ts",
  "test/worker/pgbouncer.test.ts",
  "test/worker/presence.test.ts",
  "test/worker/example.test.ts",
  "test/cli/enqueue.test.ts",
  "test/cli/json-keys.test.ts",
  "test/cli/dev.test.ts",
  "test/contract/typed-tasks.test.ts",
  "test/cli/doctor.test.ts",
  "test/cli/schedules.test.ts",
];

export default class SlowFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    // A renamed or deleted file would silently lose its place: say so instead.
    const root = this.ctx.config.root;
    const gone = SLOW_FILES.filter((file) => !existsSync(resolve(root, file)));
    if (gone.length > 0) throw new Error(`test/sequencer.ts lists files that do not exist: ${gone.join(", ")}`);
    const rank = (spec: TestSpecification): number => {
      const index = SLOW_FILES.indexOf(relative(root, spec.moduleId).split("\\").join("/"));
      return index === -1 ? SLOW_FILES.length : index;
    };
    // Array.prototype.sort is stable: files outside the list keep vitest's order.
    return (await super.sort(files)).sort((a, b) => rank(a) - rank(b));
  }
}
