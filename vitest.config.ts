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
    // Tests wait on PostgreSQL far more than on the CPU; vitest's default (CPUs - 1) would run one file at a time on 2 cores.
    maxWorkers: Math.max(2, availableParallelism()),
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 30_000,
  },
});
