// Real non-superuser logins for the privilege tests: login roles with a
// password (the embedded server authenticates with scram-sha-256), members of
// an installation's idemq roles or of none. Roles are cluster-wide, so names
// are unique per call and dropLoginRoles() removes them; the installations'
// roles go with the run's databases (test/global-setup.ts).
import { randomBytes } from "node:crypto";
import pg from "pg";
import { serverUrl } from "./db.ts";

export interface LoginRole {
  name: string;
  password: string;
  /** This role's URL for `database`. */
  urlFor(database: string): string;
  /** A connected client of this role on `database` (closed by dropLoginRoles). */
  connect(database: string): Promise<pg.Client>;
}

export interface LoginRoleOptions {
  /** Group roles to grant, e.g. [(await installationRoles(db.pool)).worker]. */
  memberOf?: string[];
  /** CREATEROLE (still not a superuser). */
  createRole?: boolean;
}

const created: { role: LoginRole; clients: pg.Client[] }[] = [];

async function asSuperuser<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: serverUrl() });
  client.on("error", () => {});
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

export async function createLoginRole(label: string, options: LoginRoleOptions = {}): Promise<LoginRole> {
  const name = `iqt_${label}_${process.pid}_${randomBytes(3).toString("hex")}`;
  const password = randomBytes(12).toString("hex");
  await asSuperuser(async (su) => {
    await su.query(
      `CREATE ROLE ${su.escapeIdentifier(name)} LOGIN NOSUPERUSER ${options.createRole ? "CREATEROLE" : "NOCREATEROLE"} PASSWORD ${su.escapeLiteral(password)}`,
    );
    for (const group of options.memberOf ?? []) await su.query(`GRANT ${su.escapeIdentifier(group)} TO ${su.escapeIdentifier(name)}`);
  });
  const clients: pg.Client[] = [];
  const role: LoginRole = {
    name,
    password,
    urlFor(database) {
      const url = new URL(serverUrl());
      url.username = name;
      url.password = password;
      url.pathname = `/${encodeURIComponent(database)}`;
      return url.toString();
    },
    async connect(database) {
      const client = new pg.Client({ connectionString: role.urlFor(database) });
      client.on("error", () => {});
      await client.connect();
      clients.push(client);
      return client;
    },
  };
  created.push({ role, clients });
  return role;
}

/** Creates a database owned by `owner` (from template0), named under the run's template prefix so teardown drops it if a test does not. */
export async function createOwnedDatabase(owner: LoginRole, template: string): Promise<string> {
  const name = `${template}_own_${randomBytes(4).toString("hex")}`;
  await asSuperuser((su) => su.query(`CREATE DATABASE ${su.escapeIdentifier(name)} OWNER ${su.escapeIdentifier(owner.name)} TEMPLATE template0`));
  ownedDatabases.push(name);
  return name;
}
const ownedDatabases: string[] = [];

/** Closes their clients, drops the databases createOwnedDatabase made, then the login roles. */
export async function dropLoginRoles(): Promise<void> {
  const roles = created.splice(0);
  await Promise.allSettled(roles.flatMap((r) => r.clients.map((c) => c.end())));
  await asSuperuser(async (su) => {
    for (const name of ownedDatabases.splice(0)) await su.query(`DROP DATABASE IF EXISTS ${su.escapeIdentifier(name)} WITH (FORCE)`);
    for (const { role } of roles) {
      // Privileges granted to it in the current database (none in idemq's design) would block DROP ROLE.
      await su.query(`DROP ROLE IF EXISTS ${su.escapeIdentifier(role.name)}`);
    }
  });
}
