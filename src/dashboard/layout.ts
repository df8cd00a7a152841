// The page frame: navigation, one small inline style sheet, and the format
// helpers every page shares. No external asset: the dashboard works offline
// and its Content-Security-Policy allows nothing from elsewhere.
import { html, raw, type Html } from "./html.ts";

const STYLE = raw(`
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:8px 20px;display:flex;gap:20px;align-items:center}
header a{color:#cfd6e4;text-decoration:none}header a:hover{color:#fff}header b{color:#fff;margin-right:12px}
main{padding:16px 20px;max-width:1400px}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;background:#fff;margin-bottom:8px}
th,td{border:1px solid #dde1e8;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #dde1e8;padding:8px;overflow:auto;max-height:320px;margin:0;white-space:pre-wrap;word-break:break-word}
.state{padding:1px 6px;border-radius:3px;font-size:12px;background:#e4e7ec}
.s-succeeded{background:#d6f5dd}.s-failed{background:#fbd9d9}.s-processing{background:#dbe8ff}
.s-cancelled,.s-expired{background:#eee3c8}.s-awaiting,.s-scheduled{background:#ece0fa}
.muted{color:#687182}.note{background:#fff8e0;border:1px solid #ecd98a;padding:6px 10px;margin:8px 0}
.error{background:#fde8e8;border:1px solid #e99;padding:6px 10px;margin:8px 0}
form.inline{display:inline}label{margin-right:10px}input,select,button{font:inherit}
button{padding:3px 10px;cursor:pointer}button.danger{background:#c0392b;color:#fff;border:1px solid #922}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;background:#fff;padding:8px;border:1px solid #dde1e8}
dt{font-weight:600}dd{margin:0}
.read-only form[method=post],.read-only .act{display:none}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 8px}section.chart svg{background:#fff;border:1px solid #dde1e8}
`);

/** What a read-only page says (the installation's viewer role: every read, no action). */
export const READ_ONLY_LINE = "read-only (viewer): you can look, not act";

const NAV: [string, string][] = [
  ["/", "Overview"],
  ["/jobs", "Jobs"],
  ["/workers", "Workers"],
  ["/charts", "Charts"],
  ["/schedules", "Schedules"],
  ["/limits", "Flow control"],
  ["/purge", "Purge"],
  ["/metrics", "Metrics"],
];

/** A whole page; `script` is the page's inline script (allowed by the response's CSP nonce). */
export function page(title: string, body: Html, options: { nonce: string; script?: string; readOnly?: boolean } = { nonce: "" }): Html {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${title} · idemq</title><style>${STYLE}</style></head>
<body${options.readOnly === true ? html` class="read-only"` : ""}><header><b>idemq</b>${NAV.map(([href, label]) => html`<a href="${href}">${label}</a>`)}</header>
<main><h1>${title}</h1>${options.readOnly === true ? html`<p class="note" id="read-only">${READ_ONLY_LINE}</p>` : ""}${body}</main>
${options.script === undefined ? "" : html`<script nonce="${options.nonce}">${raw(options.script)}</script>`}
</body></html>`;
}

export function stateBadge(state: string): Html {
  return html`<span class="state s-${state}">${state}</span>`;
}

export function number(n: number): string {
  return n.toLocaleString("en-US");
}

/**
 * The one way a page prints an instant: relative to `now` ("3 min ago", "in
 * 2 h"), the exact UTC instant (ISO 8601, to the millisecond) in its title
 * (shown on hover) and datetime. `now` is the dashboard server's clock when
 * it renders the page (not the database's now(): the pages are rendered in
 * one pass, and a clock skew of a second or two between the two shows as
 * "now" either way); the page does not update itself until reloaded.
 */
export function when(date: Date | null | undefined, now: Date = new Date()): Html {
  if (date === null || date === undefined) return html`<span class="muted">-</span>`;
  const iso = date.toISOString();
  return html`<time datetime="${iso}" title="${iso}">${relative(date, now)}</time>`;
}

/** "now", "42 s ago", "3 min ago", "5 h ago", "2 d ago", "in 10 min"; past 60 days the UTC date. */
export function relative(date: Date, now: Date): string {
  const ms = date.getTime() - now.getTime();
  const abs = Math.abs(ms);
  if (abs < 1000) return "now";
  const [amount, unit] =
    abs < 60_000 ? [Math.floor(abs / 1000), "s"]
    : abs < 3_600_000 ? [Math.floor(abs / 60_000), "min"]
    : abs < 48 * 3_600_000 ? [Math.floor(abs / 3_600_000), "h"]
    : [Math.floor(abs / 86_400_000), "d"];
  if (unit === "d" && amount > 60) return date.toISOString().slice(0, 10);
  return ms < 0 ? `${amount} ${unit} ago` : `in ${amount} ${unit}`;
}

export function duration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
}

/** JSON for a <pre>, escaped by html``. */
export function json(value: unknown): string {
  return value === undefined ? "" : JSON.stringify(value, null, 2);
}
