// The CLI's --json casing rule (camelCase keys), checked over a whole value.

/**
 * Keys whose values are data, not the CLI's shape: a job's payload and result
 * (the user's), its error history (as SQL records it), and maps keyed by
 * names (the demo's jobsPerWorker, keyed by worker id).
 */
const STORED = new Set(["payload", "result", "errors", "jobsPerWorker"]);
const CAMEL = /^[a-z][a-zA-Z0-9]*$/;

/** Every key path in `value` that is not camelCase ("jobs[0].lease_expired"), stored data left out. */
export function badKeys(value: unknown, path = ""): string[] {
  if (Array.isArray(value)) return value.flatMap((item, i) => badKeys(item, `${path}[${i}]`));
  if (value === null || typeof value !== "object") return [];
  return Object.entries(value).flatMap(([key, inner]) => {
    const here = path === "" ? key : `${path}.${key}`;
    return [...(CAMEL.test(key) ? [] : [here]), ...(STORED.has(key) ? [] : badKeys(inner, here))];
  });
}
