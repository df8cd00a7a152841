// The dashboard's one timestamp helper: relative text ("3 min ago", "in 2 h"),
// the exact ISO instant in its title and datetime attributes.
import { describe, expect, it } from "vitest";
import { relative, when } from "../../src/dashboard/layout.ts";

const NOW = new Date("2026-12-07T12:00:00.000Z");
const at = (ms: number) => new Date(NOW.getTime() + ms);

describe("relative times", () => {
  it.each([
    [0, "now"],
    [-999, "now"],
    [-1000, "1 s ago"],
    [-59_999, "59 s ago"],
    [-180_000, "3 min ago"],
    [-3_599_999, "59 min ago"],
    [-3_600_000, "1 h ago"],
    [-47 * 3_600_000, "47 h ago"],
    [-48 * 3_600_000, "2 d ago"],
    [-60 * 86_400_000, "60 d ago"],
    [-61 * 86_400_000, "2026-10-07"],
    [5_000, "in 5 s"],
    [600_000, "in 10 min"],
    [2 * 3_600_000 + 1, "in 2 h"],
  ])("%i ms from now reads %s", (ms, text) => {
    expect(relative(at(ms), NOW)).toBe(text);
  });

  it("when() prints the relative text with the exact instant in title and datetime", () => {
    const instant = new Date("2026-12-07T11:56:59.123Z");
    expect(when(instant, NOW).text).toBe('<time datetime="2026-12-07T11:56:59.123Z" title="2026-12-07T11:56:59.123Z">3 min ago</time>');
    expect(when(null, NOW).text).toBe('<span class="muted">-</span>');
  });
});
