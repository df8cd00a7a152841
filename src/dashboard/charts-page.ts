// GET /charts: the last hour or day, per minute, from history() (the rows
// roll_up() writes on the workers' maintenance timer, never a read of the
// jobs): attempts started, jobs succeeded and failed, attempts retried; the
// waiting jobs and the oldest one's age; run and wait time p50 and p95. For
// all queues and tasks, or one queue, one task, or both. Each chart is
// inline SVG drawn here (no script library, no build step); each series
// carries its values in data-values, which the small hover script reads
// (and the browser test too).
import { history, stats, type HistoryRow, type Queryable } from "../sql/index.ts";
import { html, query, raw, type Html } from "./html.ts";
import { duration, number } from "./layout.ts";

/** The ranges the page offers; the first is the default. history() keeps a day. */
export const RANGES = { hour: { minutes: 60, label: "last hour" }, day: { minutes: 1440, label: "last day" } } as const;
type Range = keyof typeof RANGES;

interface Series {
  name: string;
  color: string;
  /** One value per minute of the range; null where nothing was sampled (a gap). */
  values: (number | null)[];
}

const WIDTH = 720;
const HEIGHT = 150;
const LEFT = 56;
const BOTTOM = 20;

function label(value: number, unit: "count" | "ms" | "s"): string {
  if (unit === "ms") return duration(value);
  if (unit === "s") return duration(value * 1000);
  return number(value);
}

/** An axis end: the time, with the day too on a chart over a day. */
function axisTime(date: Date, withDay: boolean): string {
  return withDay ? date.toISOString().slice(5, 16).replace("T", " ") : date.toISOString().slice(11, 16);
}

/** One chart: a polyline per series over the minutes, split where a value is missing. */
function chart(id: string, title: string, start: Date, series: Series[], unit: "count" | "ms" | "s"): Html {
  const count = series[0]!.values.length;
  const max = Math.max(1, ...series.flatMap((s) => s.values.filter((v): v is number => v !== null)));
  const x = (i: number) => LEFT + (count <= 1 ? 0 : (i * (WIDTH - LEFT - 8)) / (count - 1));
  const y = (v: number) => HEIGHT - BOTTOM - (v * (HEIGHT - BOTTOM - 8)) / max;
  const end = new Date(start.getTime() + (count - 1) * 60_000);
  const lines = series.map((s) => {
    const segments: string[][] = [[]];
    s.values.forEach((v, i) => {
      if (v === null) segments.push([]);
      else segments[segments.length - 1]!.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
    });
    return html`<g data-series="${s.name}" data-values="${s.values.map((v) => (v === null ? "" : String(v))).join(",")}">${segments
      .filter((points) => points.length > 0)
      .map((points) =>
        points.length === 1
          ? html`<circle cx="${points[0]!.split(",")[0]}" cy="${points[0]!.split(",")[1]}" r="2" fill="${s.color}"/>`
          : html`<polyline fill="none" stroke="${s.color}" stroke-width="1.5" points="${points.join(" ")}"/>`,
      )}</g>`;
  });
  return html`<section class="chart" id="${id}"><h2>${title}</h2>
<p class="legend">${series.map((s) => html`<span><i style="background:${s.color}"></i>${s.name}</span> `)}<span class="readout muted"></span></p>
<svg viewBox="0 0 ${WIDTH} ${HEIGHT}" width="${WIDTH}" height="${HEIGHT}" role="img" aria-label="${title}"
 data-start="${start.toISOString()}" data-unit="${unit}" data-left="${LEFT}" data-width="${WIDTH - LEFT - 8}">
<line x1="${LEFT}" y1="${HEIGHT - BOTTOM}" x2="${WIDTH}" y2="${HEIGHT - BOTTOM}" stroke="#bbb"/>
<line x1="${LEFT}" y1="8" x2="${LEFT}" y2="${HEIGHT - BOTTOM}" stroke="#bbb"/>
<text x="${LEFT - 4}" y="14" text-anchor="end" font-size="11" fill="#687182">${label(max, unit)}</text>
<text x="${LEFT - 4}" y="${HEIGHT - BOTTOM}" text-anchor="end" font-size="11" fill="#687182">0</text>
<text x="${LEFT}" y="${HEIGHT - 4}" font-size="11" fill="#687182">${axisTime(start, count > 61)} UTC</text>
<text x="${WIDTH - 8}" y="${HEIGHT - 4}" text-anchor="end" font-size="11" fill="#687182">${axisTime(end, count > 61)} UTC</text>
<line class="cursor" x1="-10" x2="-10" y1="8" y2="${HEIGHT - BOTTOM}" stroke="#999" stroke-dasharray="3 3"/>
${lines}</svg></section>`;
}

/** The minutes of the range, oldest first, each with its row or none. */
function byMinute(rows: HistoryRow[], start: Date, count: number): (HistoryRow | undefined)[] {
  const at = new Map(rows.map((r) => [r.minute.getTime(), r]));
  return Array.from({ length: count }, (_, i) => at.get(start.getTime() + i * 60_000));
}

export async function chartsPage(db: Queryable, parameters: URLSearchParams): Promise<{ title: string; body: Html }> {
  const range: Range = parameters.get("range") === "day" ? "day" : "hour";
  const queue = parameters.get("queue") || null;
  const task = parameters.get("task") || null;
  const { minutes } = RANGES[range];
  const [rows, counts] = await Promise.all([history(db, { since: `${minutes} minutes`, queue, task }), stats(db)]);
  const queues = [...new Set(counts.flatMap((r) => (r.queue === null ? [] : [r.queue])))].sort();
  const tasks = [...new Set(counts.flatMap((r) => (r.queue === null || r.task === null ? [] : [r.task])))].sort();
  const now = Math.floor(Date.now() / 60_000) * 60_000;
  const start = new Date(now - minutes * 60_000);
  const at = byMinute(rows, start, minutes + 1);
  const counted = (pick: (r: HistoryRow) => number) => at.map((r) => (r === undefined ? 0 : pick(r)));
  const sampled = (pick: (r: HistoryRow) => number | null) => at.map((r) => (r === undefined ? null : pick(r)));
  const option = (value: string, selected: string | null) => html`<option value="${value}" ${value === selected ? raw("selected") : ""}>${value}</option>`;
  const links = (Object.keys(RANGES) as Range[]).map((r) =>
    r === range
      ? html`<b>${RANGES[r].label}</b> `
      : html`<a id="range-${r}" href="/charts${query({ range: r, queue, task })}">${RANGES[r].label}</a> `,
  );
  const total = (values: number[]) => values.reduce((a, b) => a + b, 0);
  const succeeded = counted((r) => r.succeeded);
  const failed = counted((r) => r.failed);
  return {
    title: "Charts",
    body: html`<form method="get" action="/charts" id="choose">
<input type="hidden" name="range" value="${range}">
<label>queue <select name="queue"><option value="">all</option>${[...new Set([...queues, ...(queue ? [queue] : [])])].map((q) => option(q, queue))}</select></label>
<label>task <select name="task"><option value="">all</option>${[...new Set([...tasks, ...(task ? [task] : [])])].map((t) => option(t, task))}</select></label>
<button>Show</button> ${links}</form>
<p class="muted">Per minute, from the history the workers roll up once a minute (roll_up()); the current minute fills in as they do.
In the range: ${number(total(succeeded))} succeeded, ${number(total(failed))} failed.</p>
${chart("throughput", "Throughput (per minute)", start, [
  { name: "started", color: "#3b6fd4", values: counted((r) => r.started) },
  { name: "succeeded", color: "#2e9d4f", values: succeeded },
  { name: "failed", color: "#c0392b", values: failed },
  { name: "retried", color: "#d68a1a", values: counted((r) => r.retried) },
], "count")}
${chart("waiting", "Waiting jobs (enqueued and scheduled)", start, [{ name: "waiting", color: "#6a4fc4", values: sampled((r) => r.waiting) }], "count")}
${chart("oldest", "Oldest runnable job's age", start, [{ name: "oldest waiting", color: "#b04a8a", values: sampled((r) => r.oldestWaitingSeconds) }], "s")}
${chart("run-time", "Run time", start, [
  { name: "p50", color: "#3b6fd4", values: sampled((r) => r.runP50Ms) },
  { name: "p95", color: "#c0392b", values: sampled((r) => r.runP95Ms) },
], "ms")}
${chart("wait-time", "Wait time (due to claimed)", start, [
  { name: "p50", color: "#3b6fd4", values: sampled((r) => r.waitP50Ms) },
  { name: "p95", color: "#c0392b", values: sampled((r) => r.waitP95Ms) },
], "ms")}
<p class="muted">Percentiles are bucket bounds (at most 2.5 times the true value). A failed attempt is counted once its job runs again within about two minutes.</p>`,
  };
}

/** Hover: the minute under the pointer and each series' value there, read from data-values. */
export const CHARTS_SCRIPT = `
for (const svg of document.querySelectorAll("section.chart svg")) {
  const readout = svg.parentElement.querySelector(".readout");
  const cursor = svg.querySelector(".cursor");
  const groups = [...svg.querySelectorAll("g[data-series]")].map((g) => [g.dataset.series, g.dataset.values.split(",")]);
  const count = groups[0][1].length;
  const left = Number(svg.dataset.left), width = Number(svg.dataset.width), start = Date.parse(svg.dataset.start);
  svg.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const x = (event.clientX - box.left) * (svg.viewBox.baseVal.width / box.width);
    const i = Math.max(0, Math.min(count - 1, Math.round(((x - left) / width) * (count - 1))));
    const at = left + (count <= 1 ? 0 : (i * width) / (count - 1));
    cursor.setAttribute("x1", at); cursor.setAttribute("x2", at);
    const minute = new Date(start + i * 60000).toISOString().slice(11, 16);
    readout.textContent = minute + " UTC: " + groups.map(([name, values]) => name + " " + (values[i] === "" ? "-" : values[i])).join(", ");
  });
}`;
