// The one way the TypeScript runtime calls idemq's SQL. The folder's rule:
// one wrapper per SQL function, named after it in camelCase (enqueue_many:
// enqueueMany), with the types of its arguments and rows, in the module of
// its family, and nothing else. What a wrapper needs besides the call is
// named for it: a variant that sends the function with another statement in
// one round trip (completeAndCommit, beginWithGuard), skips the checks on
// claim()'s own values (completeClaimed) or returns more (enqueueTraced),
// and the check of its arguments without a database (checkSchedule).
// call.ts holds what every wrapper shares: SQL_FUNCTIONS, the statement a
// call sends, the mapping of SQL errors. A contract test holds SQL_FUNCTIONS
// equal to the catalog's public functions.

export { buildCall, runQuery, SQL_FUNCTIONS, type Queryable, type SqlFunction } from "./call.ts";
export type { Instant, JobIdInput } from "../encode.ts";
export * from "./enqueue.ts";
export * from "./attempts.ts";
export * from "./effects.ts";
export * from "./schedules.ts";
export * from "./admin.ts";
export * from "./presence.ts";
export * from "./reads.ts";
export * from "./search.ts";
export * from "./flow.ts";
export * from "./steps.ts";
export * from "./children.ts";
