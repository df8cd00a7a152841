// HTML built by one tagged template that escapes every interpolated value:
// task names, queues, keys, payloads and errors are user text, and the only
// way to put markup into a page is another html`` fragment (or raw() of a
// constant). A page cannot forget to escape.

/** A fragment that is already HTML. */
export class Html {
  constructor(readonly text: string) {}
  toString(): string {
    return this.text;
  }
}

const ENTITIES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(value: string): string {
  return value.replace(/[&<>"']/g, (c) => ENTITIES[c]!);
}

/** A constant of the program's own markup (never user text). */
export function raw(text: string): Html {
  return new Html(text);
}

function fragment(value: unknown): string {
  if (value === null || value === undefined || value === false) return "";
  if (value instanceof Html) return value.text;
  if (Array.isArray(value)) return value.map(fragment).join("");
  return escapeHtml(String(value));
}

/** html`<td>${task}</td>`: values are escaped; Html fragments and arrays of them are kept. */
export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  let out = strings[0]!;
  for (let i = 0; i < values.length; i++) out += fragment(values[i]) + strings[i + 1]!;
  return new Html(out);
}

/** A query string from parameters, leaving out empty ones (already escaped for an attribute by html``). */
export function query(parameters: Record<string, string | number | undefined | null>): string {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(parameters)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text === "" ? "" : `?${text}`;
}
