// The strict text-format parser the metrics tests read /metrics with: it
// reads what the format allows and refuses what it does not, so a malformed
// exposition fails those tests instead of passing unread.
import { describe, expect, it } from "vitest";
import { parsePrometheusText, sampleValue } from "./prometheus-text.ts";

const good = `# HELP a_total Things, with a \\\\ and a \\n.
# TYPE a_total counter
a_total{task="x\\"y",queue="q"} 3
a_total{task="z",queue="q"} 1e3
# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} 2
h_sum 2.5
h_count 2
# TYPE g gauge
g NaN
`;

describe("parsePrometheusText", () => {
  it("reads families, escaped labels and help, and values", () => {
    const families = parsePrometheusText(good);
    expect(families.get("a_total")!.help).toBe("Things, with a \\ and a \n.");
    expect(sampleValue(families, "a_total", { task: 'x"y' })).toBe(3);
    expect(sampleValue(families, "a_total", { task: "z" })).toBe(1000);
    expect(sampleValue(families, "h_count")).toBe(2);
    expect(sampleValue(families, "g")).toBeNaN();
    expect(() => sampleValue(families, "a_total")).toThrow("2 samples match, not 1");
  });

  it.each([
    ["no final newline", good.trimEnd()],
    ["a bad value", "# TYPE g gauge\ng one\n"],
    ["an unquoted label", "# TYPE g gauge\ng{a=1} 1\n"],
    ["a bad escape", '# TYPE g gauge\ng{a="\\t"} 1\n'],
    ["a series twice", '# TYPE g gauge\ng{a="1"} 1\ng{a="1"} 2\n'],
    ["a sample outside its family", "# TYPE g gauge\nh 1\n"],
    ["a family declared again", "# TYPE g gauge\ng 1\n# TYPE h gauge\nh 1\n# HELP g again\n"],
    ["buckets not cumulative", '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n'],
    ["+Inf not the count", '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 2\n'],
    ["no +Inf bucket", '# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n'],
  ])("refuses %s", (_what, text) => {
    expect(() => parsePrometheusText(text)).toThrow();
  });
});
