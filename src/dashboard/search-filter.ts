// The jobs page's search as one job filter (docs/sql-api.md, "Job filters"):
// each query parameter is a filter field under SQL's own name, sent as it
// came, so what a field may hold, and which fields exist, is SQL's to judge
// (_check_job_filter: 22023 naming the field, with a hint). An unknown
// parameter is passed on too, to be refused by that one list. Only the shapes
// a form cannot type are made here: ids split on commas or spaces, the states
// as a list, the payload parsed as JSON.
import type { SqlJobFilter } from "../sql/index.ts";
import { BadRequest } from "./bad-request.ts";

/** Parameters of the page that are not filter fields: paging, counting, and the bulk form's own. */
export const PAGE_PARAMETERS = ["before", "from", "count", "action", "scope", "job", "csrf"] as const;

export function searchFilter(parameters: URLSearchParams): SqlJobFilter {
  const filter: Record<string, unknown> = {};
  for (const name of new Set(parameters.keys())) {
    if ((PAGE_PARAMETERS as readonly string[]).includes(name)) continue;
    if (name === "state") {
      const states = parameters.getAll(name).filter((s) => s !== "");
      if (states.length > 0) filter.state = states;
      continue;
    }
    const value = parameters.get(name)!.trim();
    if (value === "") continue;
    if (name === "ids") {
      filter.ids = value.split(/[\s,]+/).filter((id) => id !== "");
    } else if (name === "payload") {
      try {
        filter.payload = JSON.parse(value);
      } catch (error) {
        throw new BadRequest(`payload must be JSON, e.g. {"customer": 42}: ${(error as Error).message}`);
      }
    } else {
      filter[name] = value;
    }
  }
  return filter;
}

/** The filter's parameters again, for links and hidden fields (the same names, so searchFilter reads them back). */
export function filterParameters(parameters: URLSearchParams): [string, string][] {
  return [...parameters.entries()].filter(([name, value]) => !(PAGE_PARAMETERS as readonly string[]).includes(name) && value.trim() !== "");
}
