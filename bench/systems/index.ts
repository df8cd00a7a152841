import { graphile } from "./graphile.ts";
import { idemq } from "./idemq.ts";
import { pgboss } from "./pgboss.ts";
import { raw } from "./raw.ts";
import type { System, SystemName } from "./types.ts";

export const SYSTEMS: Record<SystemName, System> = { idemq, graphile, pgboss, raw };
