// A figure is one number the demo promises: what it should be, what the run
// observed, and whether they agree. The demo exits non-zero when any does not.

export type FigureValue = number | string | boolean;

export interface Figure {
  /** Which part of the demo: guard, email, retries, policies. */
  scenario: string;
  /** What was counted, in words. */
  name: string;
  /** What it should be, as shown ("100", "200 ms backoff"). */
  expected: FigureValue;
  observed: FigureValue;
  ok: boolean;
}

/** Observed must equal expected. */
export function exactly(scenario: string, name: string, expected: FigureValue, observed: FigureValue): Figure {
  return { scenario, name, expected, observed, ok: observed === expected };
}

/** A figure whose check is not equality (a waited time, say); `ok` says whether it holds. */
export function checked(scenario: string, name: string, expected: string, observed: FigureValue, ok: boolean): Figure {
  return { scenario, name, expected, observed, ok };
}
