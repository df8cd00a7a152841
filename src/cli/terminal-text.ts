// Text anyone could have enqueued (a task, queue, key, worker id, error text,
// payload) reaches an operator's terminal through the CLI's human output. A
// control character in it could clear the screen, set the window title or
// rewrite earlier lines, and a bidirectional control could make a line read
// differently from what it holds. So human output shows them escaped, in one
// way, by this module; `--json` output never passes through it (JSON.stringify
// escapes C0 controls itself, and the JSON stays exact).

/** C0 and C1 controls, DEL, the line and paragraph separators, and the bidirectional marks, embeddings, overrides and isolates. */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const UNSAFE_BUT_NEWLINE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

const NAMED: Readonly<Record<string, string>> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };

function escape(ch: string): string {
  const named = NAMED[ch];
  if (named !== undefined) return named;
  const code = ch.charCodeAt(0);
  return code <= 0xff ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
}

/** One field (a task name, a key, an error message) as a terminal may show it: every control escaped, newlines included ("\x1b", "\n", "\u202e"). */
export function printable(text: string): string {
  return text.replace(UNSAFE, escape);
}

/** Lines of human output as a terminal may show them: like printable(), but the newlines that separate the lines stay. */
export function printableLines(text: string): string {
  return text.replace(UNSAFE_BUT_NEWLINE, escape);
}
