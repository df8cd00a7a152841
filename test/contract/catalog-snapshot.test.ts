// The committed catalog snapshot (test/contract/catalog.snapshot.json) describes what
// the migrations build, so a schema change shows in review: this test fails
// until the snapshot is regenerated and committed with the change.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { committedCatalog, serialize, SNAPSHOT_PATH, UPDATE_COMMAND } from "../helpers/catalog-snapshot.ts";
import { useTestDatabase } from "../helpers/db.ts";

const db = useTestDatabase({ poolSize: 2 });

describe("catalog snapshot", () => {
  it("a migrated database matches test/contract/catalog.snapshot.json", async () => {
    const live = await committedCatalog(db.pool);
    const committed = JSON.parse(readFileSync(SNAPSHOT_PATH, "utf8"));
    const message = `schema idemq differs from test/contract/catalog.snapshot.json; if the change is intended, run: ${UPDATE_COMMAND} (then review and commit the diff)`;
    expect(JSON.parse(serialize(live)), message).toEqual(committed);
    expect(serialize(live), message).toBe(readFileSync(SNAPSHOT_PATH, "utf8"));
  });

  it("the snapshot covers the tables, enums and every function of schema idemq", async () => {
    const committed = JSON.parse(readFileSync(SNAPSHOT_PATH, "utf8"));
    const tables = committed.relations.filter((r: { kind: string }) => r.kind === "r").map((r: { name: string }) => r.name);
    expect(tables.sort()).toEqual(["child_waits", "counters", "effects", "enqueue_limits", "events", "installation", "job_children", "job_counts", "job_dependencies", "job_minutes", "job_minutes_mark", "job_steps", "jobs", "key_holds", "keys", "limit_releases", "limit_slots", "limit_starts", "limits", "processed", "retention", "schedules", "settings", "success_retention", "workers"]);
    const enums = committed.types.filter((t: { kind: string }) => t.kind === "e").map((t: { name: string }) => t.name);
    expect(enums.sort()).toEqual(["duplicate_policy", "job_state", "schedule_misfire", "schedule_overlap", "waiting_reason"]);
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM pg_proc WHERE pronamespace = 'idemq'::regnamespace");
    expect(committed.functions).toHaveLength(rows[0].n);
  });
});
