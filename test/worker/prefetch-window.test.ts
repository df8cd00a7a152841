// The adaptive prefetch window (prefetch-window.ts) as a pure function of the
// claims and finished jobs it is told of, on a clock the test sets: it grows
// on full claims, shrinks on short ones, and is capped by
// the wait budget at the observed completion rate. Then its settings: unset
// prefetch adapts within the documented bounds; a set one stays fixed.
import { describe, expect, it } from "vitest";
import { WORKER_DEFAULTS } from "../../src/worker/defaults.ts";
import { PrefetchWindow, RATE_SAMPLES } from "../../src/worker/prefetch-window.ts";
import { normalizeSettings } from "../../src/worker/settings.ts";

/** A window whose completion rate is `perMs` jobs per ms up to `now`. */
function windowAt(bounds: { min: number; max: number; waitBudgetMs: number }, perMs: number, now: number): PrefetchWindow {
  const w = new PrefetchWindow(bounds);
  for (let i = 0; i < RATE_SAMPLES; i++) w.finished(now - (RATE_SAMPLES - i) / perMs);
  return w;
}

describe("PrefetchWindow", () => {
  const roomy = { min: 10, max: 490, waitBudgetMs: 7500 };

  it("starts at its lower bound and stays there while no completion rate is known", () => {
    const w = new PrefetchWindow(roomy);
    expect(w.size(0)).toBe(10);
    w.claimed(20, 20, 0);
    w.finished(1);
    expect(w.ratePerMs(2)).toBe(0);
    expect(w.size(2)).toBe(10);
  });

  it("doubles on a full claim, up to its upper bound", () => {
    const now = 1000;
    const w = windowAt(roomy, 10, now); // 10 jobs/ms: the cap (75,000) is far away
    const sizes = [w.size(now)];
    for (let i = 0; i < 8; i++) {
      w.claimed(5, 5, now);
      sizes.push(w.size(now));
    }
    expect(sizes).toEqual([10, 20, 40, 80, 160, 320, 490, 490, 490]);
  });

  it("halves on a short claim, down to its lower bound, and on an empty one", () => {
    const now = 1000;
    const w = windowAt(roomy, 10, now);
    for (let i = 0; i < 6; i++) w.claimed(5, 5, now);
    expect(w.size(now)).toBe(490);
    w.claimed(300, 299, now);
    expect(w.size(now)).toBe(245);
    w.claimed(100, 0, now);
    expect(w.size(now)).toBe(122);
    for (let i = 0; i < 10; i++) w.claimed(10, 0, now);
    expect(w.size(now)).toBe(10);
  });

  it("keeps the last buffered job's expected wait within the budget: window <= rate x waitBudgetMs, never below its lower bound", () => {
    const now = 100_000;
    // 0.01 jobs/ms (10 jobs/s) x 7,500 ms: 75 jobs.
    const w = windowAt(roomy, 0.01, now);
    for (let i = 0; i < 10; i++) w.claimed(5, 5, now);
    expect(w.ratePerMs(now)).toBeCloseTo(0.01, 6);
    expect(w.size(now)).toBe(75);
    expect(w.size(now) / w.ratePerMs(now)).toBeLessThanOrEqual(roomy.waitBudgetMs);
    // No job finishes for a while: the rate decays, and the window with it, down to its lower bound.
    expect(w.size(now + 6400)).toBe(37); // 64 jobs over 12,800 ms
    expect(w.size(now + 1_000_000)).toBe(10);
  });

  it("as a fixed prefetch (equal bounds, no budget) ignores claims and rates", () => {
    const w = new PrefetchWindow({ min: 7, max: 7, waitBudgetMs: Infinity });
    expect(w.adaptive).toBe(false);
    w.claimed(5, 5, 0);
    w.claimed(5, 0, 0);
    expect(w.size(0)).toBe(7);
    const none = new PrefetchWindow({ min: 0, max: 0, waitBudgetMs: Infinity });
    none.claimed(1, 1, 0);
    expect(none.size(0)).toBe(0);
  });
});

describe("prefetch settings", () => {
  const base = { connectionString: "postgres://settings-only.invalid/db", tasks: { noop: async () => {} } };

  it("unset: adapts from concurrency to prefetchMax, its wait budget a share of the worker's lease", () => {
    const s = normalizeSettings({ ...base, concurrency: 10, lease: "40 seconds" });
    expect(s.prefetch).toEqual({ min: 10, max: WORKER_DEFAULTS.prefetchMax, waitBudgetMs: 40_000 * WORKER_DEFAULTS.prefetchLeaseShare });
    expect(s.prefetch.waitBudgetMs).toBeLessThan(s.heartbeatMs);
  });

  it("unset with a concurrency above prefetchMax: fixed at concurrency", () => {
    const s = normalizeSettings({ ...base, concurrency: 600 });
    expect(s.prefetch.min).toBe(600);
    expect(s.prefetch.max).toBe(600);
  });

  it("set: exactly that, fixed", () => {
    expect(normalizeSettings({ ...base, concurrency: 10, prefetch: 3 }).prefetch).toEqual({ min: 3, max: 3, waitBudgetMs: Infinity });
    expect(normalizeSettings({ ...base, concurrency: 10, prefetch: 0 }).prefetch).toEqual({ min: 0, max: 0, waitBudgetMs: Infinity });
  });
});
