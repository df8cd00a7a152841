// createWorker checks its tasks and settings before touching the database:
// each mistake is a WorkerConfigError whose message names the task and option.
import { join } from "node:path";
import { tmpdir } from "node:os";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { createWorker, WorkerConfigError, type WorkerOptions } from "../../src/index.ts";

const url = "postgres://nobody@127.0.0.1:1/never-connected";

function refused(options: Partial<WorkerOptions> & Record<string, unknown>): WorkerConfigError {
  try {
    createWorker({ connectionString: url, handleSignals: false, ...options } as WorkerOptions);
  } catch (error) {
    expect(error).toBeInstanceOf(WorkerConfigError);
    return error as WorkerConfigError;
  }
  throw new Error("createWorker accepted the options");
}

const ping = async () => "pong";

describe("tasks", () => {
  it.each([
    ["no tasks object", undefined, "tasks must be an object mapping task names to handlers, got undefined"],
    ["an array", [ping], "tasks must be an object mapping task names to handlers, got an array"],
    ["an empty object", {}, "tasks is empty: define at least one task"],
    ["a string task", { ping: "ping" }, 'task "ping" is not a function or { run }: got the string "ping"'],
    ["an object without run", { ping: { maxAttempts: 2 } }, 'task "ping" is not a function or { run }: got an object without a run function'],
    ["an unknown option", { ping: { run: ping, retries: 3 } }, 'task "ping" has an unknown option "retries" (options: run, transactional'],
    ["transactional not a boolean", { ping: { run: ping, transactional: "yes" } }, 'task "ping": transactional must be true or false'],
    ["guardKey without transactional", { ping: { run: ping, guardKey: () => "k" } }, 'task "ping": guardKey needs transactional: true'],
    ["guardKey not a function", { ping: { run: ping, transactional: true, guardKey: "k" } }, 'task "ping": guardKey must be a function'],
    ["maxAttempts 0", { ping: { run: ping, maxAttempts: 0 } }, 'task "ping": maxAttempts must be an integer >= 1, got number 0'],
    ["a bad backoff", { ping: { run: ping, backoff: { kind: "exponential" } } }, 'task "ping": exponential backoff needs an initial delay'],
    ["exceptOn not a list of classes", { ping: { run: ping, exceptOn: ["TypeError"] } }, 'task "ping": exceptOn must be an array of error classes'],
    ["a lease over a day", { ping: { run: ping, lease: "2 days" } }, 'task "ping": lease must be more than 0 and at most 1 day'],
    ["a timeout of 0", { ping: { run: ping, timeout: "0s" } }, 'task "ping": timeout must be more than 0 and at most 24 days (e.g. "30s"), got "0s"'],
    ["a timeout over 24 days", { ping: { run: ping, timeout: "30 days" } }, 'task "ping": timeout must be more than 0'],
    ["a timeout that is no duration", { ping: { run: ping, timeout: "soon" } }, 'task "ping": timeout: '],
  ])("%s", (_name, tasks, message) => {
    expect(refused({ tasks: tasks as never }).message).toContain(message);
  });

  it("accepts functions and every option", () => {
    class Invalid extends Error {}
    const worker = createWorker({
      connectionString: url,
      handleSignals: false,
      tasks: {
        ping,
        credit: { transactional: true, guardKey: (p) => `credit:${p.id}`, run: async (_p, ctx) => ctx.tx.query("SELECT 1") },
        send: {
          maxAttempts: 3,
          backoff: { kind: "fixed", delays: ["2s", "5s"] },
          exceptOn: [Invalid],
          onlyOn: [TypeError],
          lease: "2 minutes",
          run: async (_p, ctx) => ctx.job.attempt,
        },
      },
    });
    expect(worker.workerId).toMatch(/^.+:\d+:[0-9a-f]{6}$/);
  });
});

describe("settings", () => {
  // Without a connection string createWorker falls back on DATABASE_URL, then
  // on an embedded server running in IDEMQ_DATA_DIR: "no database" needs neither.
  beforeEach(() => {
    vi.stubEnv("DATABASE_URL", "");
    vi.stubEnv("IDEMQ_DATA_DIR", join(tmpdir(), "idemq-task-config-no-such-dir", "pg"));
  });
  afterEach(() => {
    vi.unstubAllEnvs();
  });

  it.each([
    ["concurrency 0", { concurrency: 0 }, "concurrency must be an integer from 1 to 1000, got 0"],
    ["concurrency 1.5", { concurrency: 1.5 }, "concurrency must be an integer from 1 to 1000, got 1.5"],
    ["prefetch -1", { prefetch: -1 }, "prefetch must be an integer from 0 to 1000, got -1"],
    ["an empty queue list", { queues: [] }, "queues must be a non-empty list of queue names"],
    ["an empty queue name", { queues: ["a", " "] }, "queues must be a non-empty list of queue names"],
    ["a lease of 0", { lease: 0 }, "lease must be more than 0 and at most 1 day"],
    ["a lease in months", { lease: "1 month" }, "lease: invalid duration"],
    ["a bad poll interval", { pollInterval: "soon" }, 'pollInterval: invalid duration "soon"'],
    ["a heartbeat of 0", { heartbeatInterval: 0 }, "heartbeatInterval must be more than 0"],
    ["a bad key retention", { keyRetention: "forever" }, 'keyRetention: invalid duration "forever"'],
    ["no database", { connectionString: undefined }, "createWorker needs { connectionString } or { pool }"],
    ["an unknown wake-up mode", { wakeUp: "notify" as never }, 'wakeUp must be one of "listen", "poll", got "notify"'],
    ["a listen URL in poll mode", { wakeUp: "poll" as const, listenConnectionString: url }, 'listenConnectionString is for wakeUp "listen"'],
    ["an empty listen URL", { listenConnectionString: "" }, "listenConnectionString must be a connection string"],
    ["a minimum poll of 0", { minPollInterval: 0 }, "minPollInterval must be more than 0"],
    ["a minimum poll above the poll", { pollInterval: "1s", minPollInterval: "2s" }, "minPollInterval (2000 ms) must not be longer than pollInterval (1000 ms)"],
  ])("%s", (_name, settings, message) => {
    expect(refused({ tasks: { ping }, ...settings }).message).toContain(message);
  });
});
