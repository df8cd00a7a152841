-- idemq._grant_roles() RETURNS TABLE(role text, privilege text)
--
-- Gives the idemq group roles that exist what their names say and nothing
-- more, and PUBLIC nothing; returns each privilege it granted. The one
-- definition of who may call what (docs/design.md, "Roles").
--
-- Guarantees:
--   * PUBLIC has EXECUTE on no function of idemq, public or private.
--   * idemq_producer: enqueue, enqueue_many, job (a job's state and outcome,
--     no payload). idemq_worker: job, claim, complete,
--     complete_many, fail, heartbeat, snooze, guard, effect_claim,
--     effect_done, effect_release, rescue, wait_for_jobs, stop_waiting,
--     prune_keys, tick (the workers' maintenance timer runs the schedules),
--     apply_retention (and deletes finished jobs past their retention),
--     worker_seen and worker_stopped (its presence), stats (counts only, no
--     payload: a worker's --metrics-port serves them).
--     idemq_admin: every public function (set_retention among them),
--     SELECT on the tables of idemq (reading jobs), and UPDATE of idemq.settings.value
--     (the limits). All three: USAGE on schema idemq and the
--     constants active_states() and terminal_states().
--   * No other table privilege: the public functions are SECURITY DEFINER
--     (owned by the schema owner, search_path pinned), so a role needs only
--     EXECUTE; a worker reads payloads only through claim().
--   * A role that does not exist is skipped (`idemq roles sql` prints the
--     script a DBA runs to create the roles and call this again); running it
--     again grants the same and changes nothing.
-- Concurrency: GRANT updates the functions' catalog rows; migrations run it
--   under node-pg-migrate's lock, one per database.
-- Errors: 42501 when the caller neither owns the functions nor is a superuser.
-- Tests: test/sql/roles.test.ts, test/install/non-superuser.test.ts, test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_role text;
  v_constants text[] := ARRAY['active_states', 'terminal_states'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many', 'job'];
  v_worker text[] := ARRAY['job', 'claim', 'complete', 'complete_many', 'fail', 'heartbeat', 'snooze',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick', 'apply_retention',
                           'worker_seen', 'worker_stopped', 'stats'];
BEGIN
  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOREACH v_role IN ARRAY ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'] LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('GRANT USAGE ON SCHEMA idemq TO %I', v_role);
    role := v_role;
    privilege := 'USAGE ON SCHEMA idemq';
    RETURN NEXT;
    FOR v_fn, v_name IN
      SELECT p.oid::regprocedure, p.proname FROM pg_proc p
      WHERE p.pronamespace = 'idemq'::regnamespace AND left(p.proname, 1) <> '_'
      ORDER BY p.proname
    LOOP
      CONTINUE WHEN NOT (v_name = ANY (v_constants)
                         OR (v_role = 'idemq_producer' AND v_name = ANY (v_producer))
                         OR (v_role = 'idemq_worker' AND v_name = ANY (v_worker))
                         OR v_role = 'idemq_admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_role = 'idemq_admin' THEN
      EXECUTE 'GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO idemq_admin';
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      IF to_regclass('idemq.settings') IS NOT NULL THEN
        EXECUTE 'GRANT UPDATE (value) ON idemq.settings TO idemq_admin';
        privilege := 'UPDATE (value) ON idemq.settings';
        RETURN NEXT;
      END IF;
    END IF;
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Grant idemq_producer, idemq_worker and idemq_admin (those that exist) what their names say, PUBLIC nothing; returns what it granted.';
