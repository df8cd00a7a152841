/**
 * Splits an SQL list ("a text, b jsonb DEFAULT '{}'::jsonb, ...") at the
 * commas outside quotes, parentheses and brackets; parts are trimmed.
 */
export function splitSqlList(list: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let quoted = false;
  let current = "";
  for (const ch of list) {
    if (ch === "'") quoted = !quoted;
    else if (!quoted && (ch === "(" || ch === "[")) depth++;
    else if (!quoted && (ch === ")" || ch === "]")) depth--;
    if (ch === "," && depth === 0 && !quoted) {
      parts.push(current.trim());
      current = "";
    } else current += ch;
  }
  if (current.trim() !== "") parts.push(current.trim());
  return parts;
}
