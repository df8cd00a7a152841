// Turns the samples of a run into the report: per workload, each variant's
// median and min-max of every metric, the ratio subject/peer per round and its
// median; then the target rows. Printed as Markdown (committed as
// bench/RESULTS.md) or as JSON.

import { median, minMax } from "./measure.ts";
import { SYSTEMS } from "./systems/index.ts";
import { MEASURED, TARGETS, type Ref } from "./targets.ts";
import type { Workload } from "./workloads/common.ts";

export interface Sample {
  workload: string;
  variant: string;
  round: number;
  metrics: Record<string, number | null>;
  note?: string;
  error?: string;
}

const METRICS: Record<string, { label: string; digits: number }> = {
  jobs_per_s: { label: "jobs/s", digits: 0 },
  units_per_s: { label: "units/s", digits: 0 },
  p50_ms: { label: "p50 ms", digits: 2 },
  p95_ms: { label: "p95 ms", digits: 2 },
  max_ms: { label: "max ms", digits: 2 },
  enqueue_p50_ms: { label: "enqueue round trip p50 ms", digits: 2 },
  wake_p50_ms: { label: "wake p50 ms", digits: 2 },
  fetch_p50_ms: { label: "fetch p50 ms", digits: 2 },
  dispatch_p50_ms: { label: "dispatch p50 ms", digits: 3 },
  wal_bytes_per_job: { label: "WAL B/job", digits: 0 },
  cpu_us_per_job: { label: "machine CPU µs/job", digits: 0 },
  worker_cpu_us_per_job: { label: "worker process CPU µs/job", digits: 0 },
  backend_cpu_us_per_job: { label: "its PostgreSQL backends CPU µs/job", digits: 0 },
  rss_mb: { label: "peak RSS MB", digits: 1 },
  statements_per_job: { label: "worker round trips/job", digits: 3 },
  dead_tuples: { label: "dead tuples", digits: 0 },
  claim_empty_queue_ms: { label: "claim on an empty queue ms", digits: 2 },
  claim_other_task_ms: { label: "claim of an absent task ms", digits: 2 },
  jobs_fewest: { label: "jobs of the process with fewest", digits: 0 },
  jobs_most: { label: "jobs of the process with most", digits: 0 },
  share_ratio: { label: "most / fewest", digits: 2 },
};

export interface Summary {
  median: number;
  min: number;
  max: number;
  rounds: (number | null)[];
}

function summarize(values: (number | null)[]): Summary | null {
  const known = values.filter((v): v is number => v !== null && Number.isFinite(v));
  if (known.length === 0) return null;
  const [min, max] = minMax(known);
  return { median: median(known), min, max, rounds: values };
}

function notesOf(samples: Sample[], label: string): string[] {
  const notes = new Set(samples.filter((s) => s.note).map((s) => s.note!));
  const serverWide = samples.filter((s) => s.metrics.wal_attributed === 0).map((s) => s.round);
  if (serverWide.length > 0) {
    notes.add(`${label}: WAL counted server-wide (pg_walinspect unavailable or failed) in round(s) ${serverWide.join(", ")}`);
  }
  return [...notes];
}

function valuesOf(samples: Sample[], r: Ref, rounds: number): (number | null)[] {
  return Array.from({ length: rounds }, (_, i) => {
    const s = samples.find((x) => x.workload === r.workload && x.variant === r.variant && x.round === i + 1);
    return s?.metrics[r.metric] ?? null;
  });
}

function ratios(samples: Sample[], num: Ref, den: Ref, rounds: number): Summary | null {
  const a = valuesOf(samples, num, rounds);
  const b = valuesOf(samples, den, rounds);
  return summarize(a.map((x, i) => (x === null || !b[i] ? null : x / b[i]!)));
}

export function buildReport(workloads: Workload[], samples: Sample[], rounds: number, meta: Record<string, unknown>) {
  const workloadReports = workloads.map((w) => {
    const subject = w.subject ?? "idemq";
    const metricKeys = Object.keys(METRICS).filter((k) =>
      samples.some((s) => s.workload === w.id && s.metrics[k] !== undefined && s.metrics[k] !== null),
    );
    const variants = w.variants.map((v) => ({
      label: v.label,
      settings: w.concurrency === undefined ? null : SYSTEMS[v.system].settings(v.mode, w.concurrency, v.defaults, v.task),
      metrics: Object.fromEntries(
        metricKeys.map((k) => [k, summarize(valuesOf(samples, { workload: w.id, variant: v.label, metric: k }, rounds))]),
      ),
      notes: notesOf(samples.filter((s) => s.workload === w.id && s.variant === v.label), v.label),
    }));
    const peerRatios = w.variants
      .filter((v) => v.label !== subject)
      .map((v) => ({
        peer: v.label,
        metric: w.primary,
        ratio: ratios(samples, { workload: w.id, variant: subject, metric: w.primary }, { workload: w.id, variant: v.label, metric: w.primary }, rounds),
      }));
    return { id: w.id, title: w.title, subject, primary: w.primary, higherIsBetter: w.higherIsBetter, variants, ratios: peerRatios };
  });
  const ran = new Set(workloads.map((w) => w.id));
  const targets = TARGETS.filter((t) => ran.has(t.num.workload) && (!t.den || ran.has(t.den.workload))).map((t) => {
    // A row without a denominator bounds the value itself (e.g. a latency in ms).
    const r = t.den ? ratios(samples, t.num, t.den, rounds) : summarize(valuesOf(samples, t.num, rounds));
    const unit = t.den ? "x" : ` ${METRICS[t.num.metric]?.label.split(" ").pop() ?? ""}`;
    return { row: t.row, target: `${t.op} ${t.bound}${unit}`, ratio: r, met: r === null ? null : t.op === ">=" ? r.median >= t.bound : r.median <= t.bound };
  });
  const measured = MEASURED.filter((m) => [m.num, m.minus, m.den].every((r) => !r || ran.has(r.workload))).map((m) => {
    const num = valuesOf(samples, m.num, rounds);
    const minus = m.minus ? valuesOf(samples, m.minus, rounds) : null;
    const den = m.den ? valuesOf(samples, m.den, rounds) : null;
    const per = m.per ?? 1;
    const value = num.map((x, i) => {
      if (x === null || (minus && minus[i] === null) || (den && !den[i])) return null;
      const v = (x - (minus ? minus[i]! : 0)) / per;
      return den ? v / den[i]! : v;
    });
    return { row: m.row, unit: m.den ? "x" : m.unit ?? "", value: summarize(value) };
  });
  const errors = samples.filter((s) => s.error).map((s) => ({ workload: s.workload, variant: s.variant, round: s.round, error: s.error! }));
  return { meta, workloads: workloadReports, targets, measured, errors };
}

export type Report = ReturnType<typeof buildReport>;

function fmt(value: number | null | undefined, digits: number): string {
  if (value === null || value === undefined || !Number.isFinite(value)) return "—";
  return value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function cell(s: Summary | null | undefined, digits: number): string {
  if (!s) return "—";
  return s.min === s.max ? fmt(s.median, digits) : `${fmt(s.median, digits)} (${fmt(s.min, digits)}–${fmt(s.max, digits)})`;
}

const ratioCell = (s: Summary | null) =>
  s ? `**${fmt(s.median, 2)}** (${s.rounds.map((r) => fmt(r, 2)).join(", ")})` : "—";

export function toMarkdown(report: Report): string {
  const out: string[] = [];
  const m = report.meta;
  out.push(`# idemq benchmark results`, "");
  for (const [k, v] of Object.entries(m)) out.push(`- **${k}**: ${typeof v === "string" ? v : JSON.stringify(v)}`);
  out.push("", "Cells: median (min–max) over the rounds. Ratios: subject/peer in each round, **median** first.", "");

  if (report.targets.length > 0) {
    out.push("## Targets", "", "| row | target | ratio (or value): median (per round) | met |", "|---|---|---|---|");
    for (const t of report.targets) {
      out.push(`| ${t.row} | ${t.target} | ${ratioCell(t.ratio)} | ${t.met === null ? "—" : t.met ? "yes" : "**no**"} |`);
    }
    out.push("");
  }

  if (report.measured.length > 0) {
    out.push("## Measured rows (no target)", "", "| row | unit | value: median (per round) |", "|---|---|---|");
    for (const r of report.measured) out.push(`| ${r.row} | ${r.unit} | ${ratioCell(r.value)} |`);
    out.push("");
  }

  for (const w of report.workloads) {
    out.push(`## ${w.id}: ${w.title}`, "");
    const keys = Object.keys(w.variants[0]?.metrics ?? {});
    out.push(`| variant | ${keys.map((k) => METRICS[k]!.label).join(" | ")} |`, `|---|${keys.map(() => "---").join("|")}|`);
    for (const v of w.variants) {
      out.push(`| ${v.label} | ${keys.map((k) => cell(v.metrics[k], METRICS[k]!.digits)).join(" | ")} |`);
    }
    out.push("", `${w.subject} / peer, ${METRICS[w.primary]!.label} (${w.higherIsBetter ? "higher" : "lower"} is better for ${w.subject}):`, "");
    for (const r of w.ratios) out.push(`- vs ${r.peer}: ${ratioCell(r.ratio)}`);
    const settings = w.variants.filter((v) => v.settings);
    if (settings.length > 0) {
      out.push("", "Settings:", "");
      for (const v of settings) out.push(`- ${v.label}: ${v.settings}`);
    }
    const notes = w.variants.flatMap((v) => v.notes);
    for (const note of new Set(notes)) out.push("", `Note: ${note}`);
    out.push("");
  }

  if (report.errors.length > 0) {
    out.push("## Errors", "");
    for (const e of report.errors) out.push(`- ${e.workload} / ${e.variant} / round ${e.round}: ${e.error.split("\n")[0]}`);
    out.push("");
  }
  return out.join("\n");
}
