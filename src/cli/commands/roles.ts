// idemq roles sql                         print the script that creates an installation's roles
// idemq roles grant ROLE --worker ...     make a login role a member of an installation's roles
// idemq roles list                        an installation's roles and their members
//
// The roles and what each may call: docs/design.md, "Roles and privileges".
// Each database with idemq has its own four roles (named at install). The
// migration creates them itself when the migrating role has CREATEROLE;
// otherwise a DBA runs the script `roles sql` prints.
import type { Command } from "commander";
import pg from "pg";
import { grantRole, ROLE_FUNCTIONS, ROLE_KINDS, roleMembers, rolesScript } from "../../roles.ts";
import { openDatabase } from "../connect.ts";
import { addExamples, type CommonOptions, databaseCommand } from "../define.ts";
import { action, emit, UsageError } from "../output.ts";

interface GrantOptions extends CommonOptions {
  producer?: boolean;
  worker?: boolean;
  admin?: boolean;
  viewer?: boolean;
}

export function registerRolesCommands(program: Command): void {
  const roles = program
    .command("roles")
    .description("each database's own idemq roles: producer (enqueue, read a job's outcome), worker (run jobs), admin (everything); named idemq_<database>_producer etc. by default");
  addExamples(roles, ["idemq roles list", "idemq roles sql > idemq-roles.sql", "idemq roles grant app_web --producer"]);

  roles
    .command("sql")
    .description("print the SQL that creates a database's idemq roles and grants their privileges (for a DBA: psql -v ON_ERROR_STOP=1 -f)")
    .addHelpText(
      "after",
      `
Run it in each database that has idemq, as a superuser or as the owner of
schema idemq with CREATEROLE; running it again changes nothing. Each database
gets its own roles (their names are in idemq.installation). \`idemq migrate\`
creates them itself when the migrating role may.

Examples:
  idemq roles sql > idemq-roles.sql && psql -v ON_ERROR_STOP=1 "$ADMIN_URL" -f idemq-roles.sql
`,
    )
    .action(() => {
      process.stdout.write(rolesScript());
    });

  const grant = roles
    .command("grant")
    .description("make login role ROLE a member of this database's idemq roles (at least one of --producer, --worker, --admin, --viewer)")
    .argument("<role>", "an existing login role, e.g. the one your workers connect as")
    .option("--producer", `grant the producer role: ${ROLE_FUNCTIONS.producer.join(", ")}`)
    .option("--worker", `grant the worker role: ${ROLE_FUNCTIONS.worker.join(", ")}`)
    .option("--admin", "grant the admin role: every function, and reading jobs")
    .option("--viewer", `grant the viewer role (read-only, no payloads): ${ROLE_FUNCTIONS.viewer.join(", ")}`)
    .action(
      action(async (member: string, _options: GrantOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<GrantOptions>();
        const kinds = ROLE_KINDS.filter((kind) => options[kind]);
        if (kinds.length === 0) throw new UsageError("say which role to grant: --producer, --worker, --admin or --viewer (or several)");
        if (member.trim() === "") throw new UsageError("ROLE must not be empty: name the login role to grant");
        const db = await openDatabase({ databaseUrl: options.databaseUrl, json: options.json, requireSchema: false });
        const client = new pg.Client({ connectionString: db.url });
        client.on("error", () => {});
        try {
          await client.connect();
          const granted = [];
          for (const kind of kinds) granted.push(await grantRole(client, member, kind));
          emit(
            options,
            { role: member, granted: granted.map((g) => ({ role: g.role, alreadyMember: g.alreadyMember })) },
            granted.map((g) => (g.alreadyMember ? `${member} was already a member of ${g.role}.` : `Granted ${g.role} to ${member}.`)),
          );
        } finally {
          await client.end().catch(() => {});
          await db.close();
        }
      }),
    );
  const list = roles
    .command("list")
    .description("this database's idemq roles (producer, worker, admin, viewer) and their members")
    .action(
      action(async (_options: CommonOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<CommonOptions>();
        const db = await openDatabase({ databaseUrl: options.databaseUrl, json: options.json, requireSchema: false });
        const client = new pg.Client({ connectionString: db.url });
        client.on("error", () => {});
        try {
          await client.connect();
          const found = await roleMembers(client);
          emit(
            options,
            { roles: found },
            found.map((r) => `${r.kind.padEnd(8)} ${r.role}${r.exists ? "" : " (missing: run the script of `idemq roles sql`)"}: ${r.members.length > 0 ? r.members.join(", ") : "no members"}`),
          );
        } finally {
          await client.end().catch(() => {});
          await db.close();
        }
      }),
    );
  databaseCommand(list, ["idemq roles list", "idemq roles list --json --database-url postgres://.../orders"]);

  databaseCommand(grant, [
    "idemq roles grant app_worker --worker",
    "idemq roles grant app_web --producer --json",
    "idemq roles grant ops --admin",
    "idemq roles grant dashboard_ro --viewer",
    "",
    "Each database with idemq has its own roles: the grant gives ROLE rights in this database only.",
    "It takes a superuser, or CREATEROLE (PostgreSQL 16 and later: with ADMIN OPTION on the idemq role).",
  ]);
}
