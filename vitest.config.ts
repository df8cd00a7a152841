import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";
import SlowFirstSequencer from "./test/sequencer.ts";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // test/fixtures holds tests that fail on purpose; they run only through their own configs.
    exclude: ["test/fixtures/**", "node_modules/**"],
    globalSetup: ["./test/global-setup.ts"],
    reporters: ["default", "./test/reporter.ts"],
    pool: "forks",
    fileParallelism: true,
    sequence: { sequencer: SlowFirstSequencer },
    // Tests wait on PostgreSQL and subprocesses far more than on the CPU; vitest's default (CPUs - 1) would run
    // one file at a time on 2 cores. With one fork per core, forks sat idle about a quarter of the run while
    // starting and importing their file; one fork more fills that. Measured on a 2-core machine shared with other
    // work (noisy): at load 4-5, 311 s with 2 forks in vitest's order, 265 s with 3 and the slow files first; at
    // load 8-11, 508 s with 3 forks, 473 s with 4, but 4 made each file about 30% slower (CPU-bound): more timing
    // risk for little.
    maxWorkers: Math.max(3, availableParallelism() + 1),
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 30_000,
  },
});
