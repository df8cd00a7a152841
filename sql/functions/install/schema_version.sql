-- idemq.schema_version() RETURNS text
--
-- The latest migration applied to this database (e.g. 0002_release_0_2_0),
-- so a worker or CLI can tell whether the schema is older or newer than its
-- own migrations and say which command fixes it.
--
-- Guarantees: the name recorded last in idemq_meta.migrations (by `idemq
--   migrate` or a `migrate sql` script), in the order they ran; NULL when
--   none is recorded. Its release is in the name (NNNN_release_X_Y_Z).
--   Every idemq role may call it (it reveals a migration's name, nothing
--   else); it exists from 0.2.0 on, so its absence means 0.1.0 or older.
-- Concurrency: a plain read; a migration committing meanwhile is seen by the
--   next call.
-- Errors: none.
-- Tests: test/install/schema-version.test.ts
CREATE OR REPLACE FUNCTION idemq.schema_version()
RETURNS text
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT m.name::text FROM idemq_meta.migrations m ORDER BY m.run_on DESC, m.id DESC LIMIT 1
$$;

COMMENT ON FUNCTION idemq.schema_version() IS
  'The latest migration applied to this database (its release is in the name), for version checks at start.';
