// The transition table of docs/state-machine.md, parsed from the markdown: the
// one reading of it that both state-machine tests compare with (the named
// tests, and the transitions the functions are seen to make).
import { readFileSync } from "node:fs";
import { resolve } from "node:path";

export interface Transition {
  /** A state, or "(new)" for a job that did not exist yet. */
  from: string;
  /** A state, or "(deleted)" for a job purge, apply_retention or a retention-0 completion removed. */
  to: string;
  /** The public function whose call makes the move. */
  by: string;
}

/** "<from> -> <to> by <function>", the name of a transition (and of its test). */
export const transitionName = (t: Transition): string => `${t.from} -> ${t.to} by ${t.by}`;

/** The rows of the "## Transitions" table, in document order. */
export function documentedTransitions(): Transition[] {
  const doc = readFileSync(resolve(import.meta.dirname, "..", "..", "docs", "state-machine.md"), "utf8");
  const section = doc.split(/^## Transitions$/m)[1]!.split(/^## /m)[0]!;
  return section
    .split("\n")
    .filter((line) => line.startsWith("| ") && !line.startsWith("| from "))
    .map((line) => line.split("|").map((cell) => cell.trim()))
    .map(([, from, to, by]) => ({ from: from!, to: to!, by: by! }));
}
