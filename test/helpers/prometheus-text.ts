// A strict parser of the Prometheus text exposition format (0.0.4), for
// asserting what /metrics serves: prom-client writes the format but does not
// read it. Anything the format does not allow throws, naming the line: a
// malformed name, label or value; a sample before its family's TYPE, a family
// interrupted or declared twice; a series given twice; a histogram without
// cumulative buckets ending in +Inf = _count, or without _sum.

export type MetricType = "counter" | "gauge" | "histogram" | "summary" | "untyped";

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Family {
  name: string;
  type: MetricType;
  help: string | undefined;
  samples: Sample[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const TYPES = new Set<MetricType>(["counter", "gauge", "histogram", "summary", "untyped"]);

export function parsePrometheusText(text: string): Map<string, Family> {
  const families = new Map<string, Family>();
  const series = new Set<string>();
  let current: Family | undefined;
  const lines = text.split("\n");
  if (lines.at(-1) !== "") throw new Error("the exposition must end with a newline");
  lines.pop();
  lines.forEach((line, i) => {
    const where = `line ${i + 1} ${JSON.stringify(line)}`;
    if (line.trim() === "") return;
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
      if (m === null) return; // a plain comment
      const [, kind, name, rest] = m as unknown as [string, "HELP" | "TYPE", string, string | undefined];
      if (!METRIC_NAME.test(name)) throw new Error(`${where}: bad metric name`);
      let family = families.get(name);
      if (family !== undefined && family !== current) throw new Error(`${where}: family ${name} declared again after others`);
      if (family === undefined) {
        family = { name, type: "untyped", help: undefined, samples: [] };
        families.set(name, family);
      }
      if (kind === "HELP") {
        if (family.help !== undefined) throw new Error(`${where}: second HELP`);
        family.help = unescape(rest ?? "", false, where);
      } else {
        if (family.samples.length > 0 || (family as { typed?: boolean }).typed) throw new Error(`${where}: TYPE after samples, or twice`);
        if (!TYPES.has(rest as MetricType)) throw new Error(`${where}: unknown type`);
        family.type = rest as MetricType;
        (family as { typed?: boolean }).typed = true;
      }
      current = family;
      return;
    }
    const sample = parseSample(line, where);
    const family = current;
    if (family === undefined || !belongs(sample.name, family)) throw new Error(`${where}: a sample outside its family's block`);
    const id = `${sample.name}${JSON.stringify(Object.entries(sample.labels).sort())}`;
    if (series.has(id)) throw new Error(`${where}: the same series twice`);
    series.add(id);
    family.samples.push(sample);
  });
  for (const family of families.values()) if (family.type === "histogram") checkHistogram(family);
  return families;
}

function belongs(sample: string, family: Family): boolean {
  if (family.type === "histogram") return [`${family.name}_bucket`, `${family.name}_sum`, `${family.name}_count`].includes(sample);
  if (family.type === "summary") return [family.name, `${family.name}_sum`, `${family.name}_count`].includes(sample);
  return sample === family.name;
}

function parseSample(line: string, where: string): Sample {
  const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)(?: (-?\d+))?$/.exec(line);
  if (m === null) throw new Error(`${where}: not a sample line`);
  const [, name, labelText, valueText] = m as unknown as [string, string, string | undefined, string];
  return { name, labels: labelText === undefined ? {} : parseLabels(labelText.slice(1, -1), where), value: parseValue(valueText, where) };
}

function parseLabels(text: string, where: string): Record<string, string> {
  const labels: Record<string, string> = {};
  let i = 0;
  while (i < text.length) {
    const eq = text.indexOf("=", i);
    if (eq < 0) throw new Error(`${where}: a label without =`);
    const name = text.slice(i, eq);
    if (!LABEL_NAME.test(name)) throw new Error(`${where}: bad label name ${JSON.stringify(name)}`);
    if (name in labels) throw new Error(`${where}: label ${name} twice`);
    if (text[eq + 1] !== '"') throw new Error(`${where}: label ${name}'s value is not quoted`);
    let j = eq + 2;
    let raw = "";
    for (;;) {
      if (j >= text.length) throw new Error(`${where}: unterminated label value`);
      const c = text[j]!;
      if (c === '"') break;
      if (c === "\\") {
        raw += text.slice(j, j + 2);
        j += 2;
      } else {
        raw += c;
        j += 1;
      }
    }
    labels[name] = unescape(raw, true, where);
    i = j + 1;
    if (i < text.length) {
      if (text[i] !== ",") throw new Error(`${where}: labels must be separated by commas`);
      i += 1;
    }
  }
  return labels;
}

/** The escapes the format allows: \\ and \n (HELP), and \" too in label values. */
function unescape(raw: string, quoted: boolean, where: string): string {
  return raw.replace(/\\(.?)/g, (_all, c: string) => {
    if (c === "\\") return "\\";
    if (c === "n") return "\n";
    if (c === '"' && quoted) return '"';
    throw new Error(`${where}: bad escape \\${c}`);
  });
}

function parseValue(text: string, where: string): number {
  if (text === "+Inf") return Number.POSITIVE_INFINITY;
  if (text === "-Inf") return Number.NEGATIVE_INFINITY;
  if (text === "NaN") return Number.NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`${where}: bad value ${text}`);
  return Number(text);
}

function checkHistogram(family: Family): void {
  const groups = new Map<string, { buckets: Array<[number, number]>; sum?: number; count?: number }>();
  for (const s of family.samples) {
    const { le, ...rest } = s.labels;
    const id = JSON.stringify(Object.entries(rest).sort());
    const group = groups.get(id) ?? { buckets: [] };
    groups.set(id, group);
    if (s.name.endsWith("_bucket")) {
      if (le === undefined) throw new Error(`${family.name}: a bucket without le`);
      group.buckets.push([parseValue(le, `${family.name} le`), s.value]);
    } else if (s.name.endsWith("_sum")) group.sum = s.value;
    else group.count = s.value;
  }
  for (const [id, g] of groups) {
    if (g.sum === undefined || g.count === undefined) throw new Error(`${family.name}${id}: no _sum or _count`);
    const sorted = [...g.buckets].sort((a, b) => a[0] - b[0]);
    if (sorted.at(-1)?.[0] !== Number.POSITIVE_INFINITY) throw new Error(`${family.name}${id}: no +Inf bucket`);
    for (let k = 1; k < sorted.length; k++) {
      if (sorted[k]![1] < sorted[k - 1]![1]) throw new Error(`${family.name}${id}: buckets are not cumulative`);
    }
    if (sorted.at(-1)![1] !== g.count) throw new Error(`${family.name}${id}: the +Inf bucket is not _count`);
  }
}

/** The value of the one sample `name` whose labels include `labels`; throws unless exactly one matches. */
export function sampleValue(families: Map<string, Family>, name: string, labels: Record<string, string> = {}): number {
  const matches = [...families.values()]
    .flatMap((f) => f.samples)
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  if (matches.length !== 1) throw new Error(`${name}${JSON.stringify(labels)}: ${matches.length} samples match, not 1`);
  return matches[0]!.value;
}
