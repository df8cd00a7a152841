// The idemq roles (docs/design.md, "Roles and privileges"): each installation
// (a database with idemq) has its own four, named once at install and kept in
// idemq.installation; what each may call is defined once, in SQL
// (idemq._grant_roles). This module reads an installation's names, prints the
// script a DBA runs where the migrating role may not create roles, and grants
// a login role membership in one.
import pg from "pg";

export const ROLE_KINDS = ["producer", "worker", "admin", "viewer"] as const;
export type RoleKind = (typeof ROLE_KINDS)[number];
/** An installation's role name per kind. */
export type InstallationRoles = Record<RoleKind, string>;

/**
 * The public functions the producer, worker and viewer roles may call, besides the
 * constants active_states(), terminal_states() and schema_version() (the
 * admin: every one), as idemq._grant_roles() grants them; for help texts.
 * test/contract/contract.test.ts holds these lists equal to the catalog's
 * grants.
 */
export const ROLE_FUNCTIONS = {
  producer: ["enqueue", "enqueue_many", "job", "emit", "job_result", "children", "enqueue_batch"],
  worker: [
    "job",
    "claim",
    "complete",
    "complete_many",
    "complete_and_take_next",
    "fail",
    "heartbeat",
    "snooze",
    "hold",
    "guard",
    "effect_claim",
    "effect_done",
    "effect_release",
    "rescue",
    "wait_for_jobs",
    "stop_waiting",
    "prune_keys",
    "tick",
    "apply_retention",
    "worker_seen",
    "worker_stopped",
    "stats",
    "limits",
    "declare_limit",
    "progress",
    "roll_up",
    "step_record",
    "steps",
    "sleep",
    "await_event",
    "job_result",
    "children",
    "spawn",
    "wait_for_children",
  ],
  /** The read-only operator (the dashboard as a viewer): reads, no writes, no payload. */
  viewer: [
    "job",
    "find_jobs",
    "count_jobs",
    "overview",
    "stats",
    "limits",
    "held_keys",
    "workers",
    "unserved_jobs",
    "schedules",
    "schedule_next",
    "retry_horizon",
    "history",
    "children",
  ],
} as const satisfies Record<Exclude<RoleKind, "admin">, readonly string[]>;

/**
 * The script `idemq roles sql` prints: in the database it runs in, creates
 * that installation's four roles (NOLOGIN) where missing and gives them
 * their privileges (idemq._grant_roles). Run it as a role with CREATEROLE
 * that owns the database's idemq schema, or as a superuser, in each database
 * that has idemq; running it again changes nothing.
 */
export function rolesScript(): string {
  return `-- idemq roles: run in each database that has idemq (psql -v ON_ERROR_STOP=1 -f),
-- as a superuser, or as the owner of schema idemq with CREATEROLE. It creates
-- that database's own idemq roles (named in idemq.installation) and grants
-- them their privileges. Running it again changes nothing.
DO $$
BEGIN
  IF pg_catalog.to_regclass('idemq.installation') IS NULL THEN
    RAISE EXCEPTION 'idemq 0.2.0 or later is not installed in database %', pg_catalog.current_database()
      USING HINT = 'Run idemq migrate on this database first; it creates the roles itself when it may.';
  END IF;
  PERFORM idemq._grant_roles();
END $$;
SELECT producer_role, worker_role, admin_role, viewer_role FROM idemq.installation;
`;
}

/** Thrown with the fix in its message; the CLI prints it as one line. */
export class RoleGrantError extends Error {
  override name = "RoleGrantError";
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

/** The role names of the installation `db` is connected to. */
export async function installationRoles(db: pg.ClientBase | pg.Pool): Promise<InstallationRoles> {
  try {
    const { rows } = await db.query<{ producer_role: string; worker_role: string; admin_role: string; viewer_role: string }>(
      "SELECT producer_role, worker_role, admin_role, viewer_role FROM idemq.installation",
    );
    const row = rows[0];
    if (row === undefined) throw new RoleGrantError("idemq.installation has no row: run `idemq migrate` on this database", "P0002");
    return { producer: row.producer_role, worker: row.worker_role, admin: row.admin_role, viewer: row.viewer_role };
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === "42P01" || code === "3F000") {
      throw new RoleGrantError("this database has no idemq installation of 0.2.0 or later (no idemq.installation): run `idemq migrate` on it first", code);
    }
    if (code === "42501") {
      throw new RoleGrantError(
        `${(error as Error).message}: reading this installation's role names takes the owner of schema idemq (the role that ran \`idemq migrate\`) or a superuser`,
        code,
      );
    }
    throw error;
  }
}

/** GRANT this installation's role of `kind` TO member; returns the role and whether member already had it. */
export async function grantRole(db: pg.ClientBase, member: string, kind: RoleKind): Promise<{ role: string; alreadyMember: boolean }> {
  const role = (await installationRoles(db))[kind];
  const { rows } = await db.query<{ member_exists: boolean; role_exists: boolean; already: boolean | null }>(
    `SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1) AS member_exists,
            EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $2) AS role_exists,
            CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1)
                  AND EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $2)
                 THEN pg_catalog.pg_has_role($1, $2, 'MEMBER') END AS already`,
    [member, role],
  );
  const found = rows[0]!;
  if (!found.role_exists) {
    throw new RoleGrantError(
      `role ${role} does not exist: create this installation's roles first (\`idemq roles sql\` prints the script; run it as a role with CREATEROLE)`,
      "42704",
    );
  }
  if (!found.member_exists) {
    throw new RoleGrantError(`role "${member}" does not exist: create the login role first, e.g. CREATE ROLE ${pg.escapeIdentifier(member)} LOGIN PASSWORD '...'`, "42704");
  }
  try {
    await db.query(`GRANT ${pg.escapeIdentifier(role)} TO ${pg.escapeIdentifier(member)}`);
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === "42501") {
      throw new RoleGrantError(
        `${(error as Error).message}: granting ${role} takes a superuser, or CREATEROLE (PostgreSQL 16 and later: with ADMIN OPTION on ${role})`,
        code,
      );
    }
    throw error;
  }
  return { role, alreadyMember: found.already === true };
}

/** This installation's roles with their direct members (login roles or groups), for `idemq roles list`. */
export async function roleMembers(db: pg.ClientBase): Promise<Array<{ kind: RoleKind; role: string; exists: boolean; members: string[] }>> {
  const roles = await installationRoles(db);
  const { rows } = await db.query<{ role: string; exists: boolean; members: string[] }>(
    `SELECT n.name AS role, r.oid IS NOT NULL AS exists,
            coalesce((SELECT array_agg(m.rolname::text ORDER BY m.rolname) FROM pg_catalog.pg_auth_members a
                        JOIN pg_catalog.pg_roles m ON m.oid = a.member WHERE a.roleid = r.oid), '{}'::text[]) AS members
       FROM unnest($1::text[]) WITH ORDINALITY AS n(name, i)
       LEFT JOIN pg_catalog.pg_roles r ON r.rolname = n.name
      ORDER BY n.i`,
    [ROLE_KINDS.map((kind) => roles[kind])],
  );
  return rows.map((row, i) => ({ kind: ROLE_KINDS[i]!, ...row }));
}
