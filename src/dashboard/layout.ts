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
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 8px}section.chart svg{background:#fff;border:1px solid #dde1e8}
`);

const NAV: [string, string][] = [
  ["/", "Overview"],
  ["/jobs", "Jobs"],
  ["/charts", "Charts"],
  ["/schedules", "Schedules"],
  ["/limits", "Flow control"],
  ["/purge", "Purge"],
  ["/metrics", "Metrics"],
];

/** A whole page; `script` is the page's inline script (allowed by the response's CSP nonce). */
export function page(title: string, body: Html, options: { nonce: string; script?: string } = { nonce: "" }): Html {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${title} · idemq</title><style>${STYLE}</style></head>
<body><header><b>idemq</b>${NAV.map(([href, label]) => html`<a href="${href}">${label}</a>`)}</header>
<main><h1>${title}</h1>${body}</main>
${options.script === undefined ? "" : html`<script nonce="${options.nonce}">${raw(options.script)}</script>`}
</body></html>`;
}

export function stateBadge(state: string): Html {
  return html`<span class="state s-${state}">${state}</span>`;
}

export function number(n: number): string {
  return n.toLocaleString("en-US");
}

/** An instant as UTC text to the second, with a title holding the full value. */
export function when(date: Date | null | undefined): Html {
  if (date === null || date === undefined) return html`<span class="muted">-</span>`;
  return html`<time datetime="${date.toISOString()}">${date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z")}</time>`;
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
