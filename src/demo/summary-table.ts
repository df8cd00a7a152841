// Plain-text tables for the demo's output: the side-by-side comparison and
// the closing summary (expected vs observed, with a mark per figure).
import type { Figure, FigureValue } from "./figures.ts";

/** Columns padded to their widest cell; the header underlined. */
export function renderTable(headers: readonly string[], rows: readonly (readonly FigureValue[])[]): string[] {
  const cells = [headers, ...rows].map((row) => row.map((cell) => String(cell)));
  const widths = headers.map((_, i) => Math.max(...cells.map((row) => visibleLength(row[i] ?? ""))));
  const line = (row: readonly string[]): string =>
    row
      .map((cell, i) => (i === row.length - 1 ? cell : cell + " ".repeat(widths[i]! - visibleLength(cell))))
      .join("  ")
      .trimEnd();
  return [line(cells[0]!), widths.map((w) => "-".repeat(w)).join("  "), ...cells.slice(1).map(line)];
}

export function summaryTable(figures: readonly Figure[], color: boolean): string[] {
  const mark = (ok: boolean): string => {
    const text = ok ? "✓" : "✗ MISMATCH";
    if (!color) return text;
    return ok ? `\x1b[32m${text}\x1b[39m` : `\x1b[31m${text}\x1b[39m`;
  };
  return renderTable(
    ["part", "figure", "expected", "observed", ""],
    figures.map((f) => [f.scenario, f.name, f.expected, f.observed, mark(f.ok)]),
  );
}

function visibleLength(text: string): number {
  // eslint-disable-next-line no-control-regex
  return text.replace(/\x1b\[[0-9;]*m/g, "").length;
}
