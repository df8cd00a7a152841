-- idemq._grant_roles() RETURNS TABLE(role text, privilege text)
--
-- Gives this installation's four roles (idemq.installation: named once, at
-- install) what their kinds say and nothing more, and PUBLIC nothing;
-- returns each privilege it granted. The one definition of who may call what
-- (docs/design.md, "Roles and privileges").
--
-- Guarantees:
--   * The installation's roles: the first call (migration 0002, on a fresh
--     install or an upgrade from 0.1.0) records their names in
--     idemq.installation: the prefix given with `idemq migrate --roles-prefix`
--     (setting idemq.roles_prefix), else idemq_<database> (idemq_ and the
--     first 12 hex digits of the name's md5 for a name over 40 bytes), plus
--     _producer, _worker, _admin, _viewer. Later calls keep them; a different
--     idemq.roles_prefix then is refused (22023): names are chosen once.
--   * It creates those roles (NOLOGIN) when missing and the caller may
--     (superuser or CREATEROLE); otherwise `idemq roles sql` prints the
--     script a DBA runs to create them and call this again.
--   * PUBLIC has EXECUTE on no function of idemq, public or private.
--   * producer: enqueue, enqueue_many, job (a job's state and outcome, no
--     payload), emit (an event, in the transaction that enqueues),
--     job_result (a job's outcome, and the NOTIFY when it finishes:
--     Client.result), children (a job's children's outcomes),
--     enqueue_batch (jobs with a callback). worker: job, claim, complete,
--     complete_many, complete_and_take_next, fail, heartbeat, snooze, hold, guard, effect_claim,
--     effect_done, effect_release, rescue, wait_for_jobs, stop_waiting,
--     prune_keys, tick (the workers' maintenance timer runs the schedules),
--     apply_retention (and deletes finished jobs past their retention),
--     worker_seen and worker_stopped (its presence), stats (counts only, no
--     payload: a worker's --metrics-port serves them), limits (the flow
--     control it is held to, and its use: no payload), declare_limit (its
--     tasks' declared limits, applied lower-only: it can never raise one),
--     progress (its held attempts' progress, fenced as complete()),
--     step_record, sleep and await_event (its held jobs' steps, fenced as
--     complete()), steps (a job's step ledger, which a replay reads),
--     job_result, children, spawn and wait_for_children (fan-out and
--     fan-in of the jobs it holds, fenced as complete()).
--     admin: every public function (set_retention among them),
--     SELECT on the tables of idemq (reading jobs), and UPDATE of idemq.settings.value
--     (the limits). viewer (a read-only operator, the dashboard's
--     --viewer): the reads an operator looks at (job, find_jobs, count_jobs,
--     overview, stats, limits, held_keys, workers, unserved_jobs, schedules,
--     schedule_next, retry_horizon, children) and nothing that writes
--     (not job_result, whose notify marks a job); no SELECT on
--     idemq.jobs, so job() and find_jobs() show it no payload and
--     schedules() no schedule's payload; SELECT on idemq.job_dependencies,
--     on idemq.jobs' id, task and state (a job's parents and children), and
--     on idemq.keys but payload_md5 and retention (a job's key ledger entry).
--     All four: USAGE on schema idemq, the
--     constants active_states() and terminal_states(), and schema_version().
--   * Isolation: the cluster-wide roles of 0.1.0 (idemq_producer,
--     idemq_worker, idemq_admin) hold nothing in this database, so a login
--     made a member of another installation's roles can do nothing here.
--     Upgrading from 0.1.0 (idemq.installation.shared_members_pending), the
--     first call that can create the roles and grant memberships makes each
--     direct member of a cluster-wide role a member of this installation's
--     role of the same kind (the viewer had none in 0.1.0) (so running workers keep working: the upgrade
--     cannot tell which database a login was for; a NOTICE lists them), and
--     only then revokes the cluster-wide roles' privileges here. A fresh
--     install (setting idemq.installing = on, which `idemq migrate` sets while
--     it applies 0001) copies no membership.
--   * No other table privilege: the public functions are SECURITY DEFINER
--     (owned by the schema owner, search_path pinned), so a role needs only
--     EXECUTE; a worker reads payloads only through claim().
--   * Running it again grants the same and changes nothing.
-- Concurrency: GRANT updates the functions' catalog rows; migrations run it
--   under node-pg-migrate's lock, one per database. Two databases creating
--   their roles at once never collide (each has its own names); a role a
--   concurrent creator committed first is kept.
-- Errors: 42501 when the caller neither owns the functions nor is a
--   superuser; 22023 an idemq.roles_prefix that differs from the recorded
--   names, or makes a name over 63 bytes.
-- Tests: test/sql/roles.test.ts, test/install/isolation.test.ts, test/install/non-superuser.test.ts,
--   test/contract/contract.test.ts
CREATE OR REPLACE FUNCTION idemq._grant_roles()
RETURNS TABLE(role text, privilege text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_fn regprocedure;
  v_name text;
  v_kind text;
  v_role text;
  v_member text;
  v_prefix text := nullif(current_setting('idemq.roles_prefix', true), '');
  v_installation idemq.installation;
  v_may_create boolean := (SELECT r.rolsuper OR r.rolcreaterole FROM pg_roles r WHERE r.rolname = current_user);
  v_shared constant text[] := ARRAY['idemq_producer', 'idemq_worker', 'idemq_admin'];
  v_kinds constant text[] := ARRAY['producer', 'worker', 'admin', 'viewer'];
  v_constants text[] := ARRAY['active_states', 'terminal_states', 'schema_version'];
  v_producer text[] := ARRAY['enqueue', 'enqueue_many', 'job', 'emit', 'job_result', 'children', 'enqueue_batch'];
  v_worker text[] := ARRAY['job', 'claim', 'complete', 'complete_many', 'complete_and_take_next', 'fail', 'heartbeat', 'snooze', 'hold',
                           'guard', 'effect_claim', 'effect_done', 'effect_release', 'rescue',
                           'wait_for_jobs', 'stop_waiting', 'prune_keys', 'tick', 'apply_retention',
                           'worker_seen', 'worker_stopped', 'stats', 'limits', 'declare_limit', 'progress', 'roll_up',
                           'step_record', 'steps', 'sleep', 'await_event',
                           'job_result', 'children', 'spawn', 'wait_for_children'];
  v_viewer text[] := ARRAY['job', 'find_jobs', 'count_jobs', 'overview', 'stats', 'limits', 'held_keys',
                           'workers', 'unserved_jobs', 'schedules', 'schedule_next', 'retry_horizon', 'history',
                           'children'];
BEGIN
  -- The installation's names, recorded once.
  SELECT i.* INTO v_installation FROM idemq.installation i FOR UPDATE;
  IF NOT FOUND THEN
    v_prefix := coalesce(v_prefix, 'idemq_' || CASE WHEN octet_length(current_database()) <= 40 THEN current_database()
                                                    ELSE left(md5(current_database()), 12) END);
    IF octet_length(v_prefix || '_producer') > 63 THEN
      RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('roles prefix "%s" makes role names over 63 bytes', idemq._excerpt(v_prefix)),
        HINT = 'Choose a prefix of at most 54 bytes (idemq migrate --roles-prefix NAME).';
    END IF;
    INSERT INTO idemq.installation (producer_role, worker_role, admin_role, viewer_role, shared_members_pending)
    VALUES (v_prefix || '_producer', v_prefix || '_worker', v_prefix || '_admin', v_prefix || '_viewer',
            current_setting('idemq.installing', true) IS DISTINCT FROM 'on')
    RETURNING * INTO v_installation;
  ELSIF v_prefix IS NOT NULL AND v_prefix || '_worker' <> v_installation.worker_role THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('this installation''s roles are %s, %s, %s and %s; roles prefix "%s" cannot rename them',
                       v_installation.producer_role, v_installation.worker_role, v_installation.admin_role,
                       v_installation.viewer_role, idemq._excerpt(v_prefix)),
      HINT = 'The prefix is chosen once, at install: drop --roles-prefix (or the setting idemq.roles_prefix).';
  END IF;

  FOREACH v_role IN ARRAY ARRAY[v_installation.producer_role, v_installation.worker_role, v_installation.admin_role,
                                v_installation.viewer_role] LOOP
    CONTINUE WHEN NOT v_may_create OR EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    BEGIN
      EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL; -- a concurrent creator committed it first
    END;
  END LOOP;

  FOR v_fn IN
    SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
  END LOOP;
  FOR i IN 1 .. 4 LOOP
    v_kind := v_kinds[i];
    v_role := CASE v_kind WHEN 'producer' THEN v_installation.producer_role
                          WHEN 'worker' THEN v_installation.worker_role
                          WHEN 'viewer' THEN v_installation.viewer_role
                          ELSE v_installation.admin_role END;
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
                         OR (v_kind = 'producer' AND v_name = ANY (v_producer))
                         OR (v_kind = 'worker' AND v_name = ANY (v_worker))
                         OR (v_kind = 'viewer' AND v_name = ANY (v_viewer))
                         OR v_kind = 'admin');
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
      privilege := format('EXECUTE ON FUNCTION %s', v_fn);
      RETURN NEXT;
    END LOOP;
    IF v_kind = 'admin' THEN
      EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA idemq TO %I', v_role);
      privilege := 'SELECT ON ALL TABLES IN SCHEMA idemq';
      RETURN NEXT;
      -- The limits are the admin's to change (their ranges are CHECKed).
      EXECUTE format('GRANT UPDATE (value) ON idemq.settings TO %I', v_role);
      privilege := 'UPDATE (value) ON idemq.settings';
      RETURN NEXT;
    END IF;
    IF v_kind = 'viewer' THEN
      -- What the job page reads beside job(): no payload, no result.
      EXECUTE format('GRANT SELECT ON idemq.job_dependencies TO %I', v_role);
      EXECUTE format('GRANT SELECT (id, task, state) ON idemq.jobs TO %I', v_role);
      EXECUTE format('GRANT SELECT (key, job_id, task, finished_state, finished_at, created_at) ON idemq.keys TO %I', v_role);
      privilege := 'SELECT ON idemq.job_dependencies, idemq.jobs (id, task, state), idemq.keys (key, job_id, task, finished_state, finished_at, created_at)';
      RETURN NEXT;
    END IF;

    -- Upgrading from 0.1.0: the logins of the cluster-wide role keep their
    -- rights here through this installation's role, granted before the
    -- cluster-wide role's are revoked below.
    IF v_installation.shared_members_pending AND v_may_create AND v_shared[i] IS NOT NULL THEN
      FOR v_member IN
        SELECT m.rolname FROM pg_auth_members a
        JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
        WHERE g.rolname = v_shared[i] AND NOT m.rolname = ANY (v_shared) AND m.rolname <> v_role
        ORDER BY 1
      LOOP
        EXECUTE format('GRANT %I TO %I', v_role, v_member);
        RAISE NOTICE 'idemq: % (a member of the cluster-wide %) is now a member of % in database %; revoke it if it belongs to another database: REVOKE % FROM %',
          v_member, v_shared[i], v_role, current_database(), quote_ident(v_role), quote_ident(v_member);
        privilege := format('MEMBER %s (from %s)', v_member, v_shared[i]);
        RETURN NEXT;
      END LOOP;
    END IF;
  END LOOP;

  IF v_installation.shared_members_pending AND NOT v_may_create THEN
    RAISE NOTICE 'idemq: the roles of this installation (%, %, %, %) need a role with CREATEROLE: run the script of `idemq roles sql` as one; until then the cluster-wide idemq_producer, idemq_worker and idemq_admin keep their privileges here',
      v_installation.producer_role, v_installation.worker_role, v_installation.admin_role, v_installation.viewer_role;
    RETURN;
  END IF;
  UPDATE idemq.installation SET shared_members_pending = false WHERE shared_members_pending;

  -- The cluster-wide roles of 0.1.0 hold nothing here.
  FOREACH v_role IN ARRAY v_shared LOOP
    CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = v_role);
    EXECUTE format('REVOKE ALL ON SCHEMA idemq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idemq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA idemq FROM %I', v_role);
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA idemq FROM %I', v_role);
  END LOOP;
END;
$$;

COMMENT ON FUNCTION idemq._grant_roles() IS
  'Create (when it may) and grant this installation''s producer, worker, admin and viewer roles what their kinds say, PUBLIC and the cluster-wide roles of 0.1.0 nothing; returns what it granted.';
