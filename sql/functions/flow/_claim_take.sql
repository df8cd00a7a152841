-- idemq._claim_take(job_ids bigint[], key_task text, key_queue text,
--   OUT ids bigint[], OUT queue_slots int[], OUT task_slots int[])
--
-- claim()'s flow control after it has locked its jobs, when idemq.limits has
-- a row: takes a concurrency slot and a start for each job its queue's and
-- its task's limits ask for, in claim order, and returns the jobs that got
-- them all, with the stripes whose slots they got; claim() updates only
-- those, and writes the stripes on them (jobs.queue_slot, jobs.task_slot),
-- where the jobs trigger finds them when the attempt ends. key_task,
-- key_queue: the one (task, queue) all job_ids have, when claim() knows it
-- (a claim of one key); NULL: read from the jobs.
--
-- Guarantees:
--   * ids: job_ids in their order (claim order), less
--     every job whose queue or task is paused and every job one of whose
--     scopes has no slot or start left for it when its turn comes (a job
--     held back by one scope takes nothing from the other). queue_slots,
--     task_slots: per job of ids, the stripe whose slot it took of its
--     queue's and of its task's concurrency limit (NULL: none).
--   * Cost: jobs of one key with one concurrency scope and no rate (the
--     common case): two reads of idemq.limits, the stripes locked
--     (_lock_slots: usually one for a batch), one UPDATE of them, and no
--     read of the jobs. With no rate and at most one concurrency scope per
--     job, one statement pairs slots and jobs per scope. Otherwise a
--     PL/pgSQL step per job. Either way each stripe used is written once,
--     whatever the number of jobs that take its slots.
--   * Slots: a stripe is used only as far as its room on its newest row
--     version, locked FOR UPDATE SKIP LOCKED (_lock_slots), and its held
--     grows by the jobs given its slots (and shrinks by the releases folded
--     there). A start is taken only if its row's started_at is more than
--     its per before now(), locked the same way, and gets now(), the
--     claim's start time (the jobs' locked_at).
--   * Both tests read the locked row's own columns only, which PostgreSQL
--     re-checks on the newest version of a row changed since the
--     statement's snapshot (EvalPlanQual): a stripe filled or a start used
--     and committed by another claim after this statement's snapshot is
--     judged as it is now, so no scope ever has more jobs processing than
--     its concurrency and no start row is used twice within its period
--     (docs/design.md, "Flow control").
--   * The jobs not returned stay locked until the claim's transaction ends
--     (other claimers skip them meanwhile), as do stripes and starts locked
--     and not used.
-- Concurrency: SKIP LOCKED throughout: never waits for another claim, a
--   release or set_limit.
-- Errors: none.
-- Tests: test/sql/flow-control.test.ts, test/sql/flow-control-concurrency.test.ts
CREATE OR REPLACE FUNCTION idemq._claim_take(job_ids bigint[], key_task text, key_queue text,
                                             OUT ids bigint[], OUT queue_slots int[], OUT task_slots int[])
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict error
DECLARE
  v_ids bigint[];
  v_held boolean[];
  v_slot_scope bigint[];   -- per job: [queue's, task's] concurrency limit ids (NULL: none)
  v_start_scope bigint[];  -- per job: [queue's, task's] rate limit ids
  v_slot_lids bigint[] := '{}';  -- the free slots locked, one entry per slot, grouped by limit
  v_slot_nos int[] := '{}';      -- ... and the stripe of each
  v_w_lids bigint[] := '{}';     -- the stripes locked, to write once each
  v_w_slots int[] := '{}';
  v_w_folded int[] := '{}';
  v_w_shrunk int[] := '{}';
  v_start_lids bigint[];
  v_start_nos int[];
  v_t_lids bigint[];              -- every entry locked (below), to give out in one loop
  v_t_nos int[];
  v_used_lids bigint[] := '{}';  -- per v_t_lids value: how many of its entries are given
  v_used_n int[] := '{}';
  v_a_lid bigint[] := '{}';      -- the slots given, one entry per (job, scope)
  v_a_slot int[] := '{}';
  v_r_lid bigint[] := '{}';
  v_r_n int[] := '{}';
  v_lid bigint;
  v_need int;
  v_p int;
  v_ok boolean;
  v_pick int[];
  v_scopes bigint[];
  v_simple boolean;
  v_one_scope bigint[];    -- per job: its one concurrency limit id (NULL: none, or held)
  v_one_queue boolean[];   -- per job: that limit is its queue's
  v_q int;
  v_t int;
  v_lq idemq.limits;
  v_lt idemq.limits;
  v_lock record;
BEGIN
  IF key_task IS NOT NULL THEN
    -- One key: its two scopes are every job's.
    SELECT l.* INTO v_lq FROM idemq.limits l WHERE l.kind = 'queue' AND l.name = key_queue;
    SELECT l.* INTO v_lt FROM idemq.limits l WHERE l.kind = 'task' AND l.name = key_task;
    IF coalesce(v_lq.paused, false) OR coalesce(v_lt.paused, false) THEN
      ids := '{}';
      RETURN;
    END IF;
    IF v_lq.rate IS NULL AND v_lt.rate IS NULL AND (v_lq.concurrency IS NULL OR v_lt.concurrency IS NULL) THEN
      IF v_lq.concurrency IS NULL AND v_lt.concurrency IS NULL THEN
        ids := job_ids;
        RETURN;
      END IF;
      v_lid := CASE WHEN v_lq.concurrency IS NOT NULL THEN v_lq.id ELSE v_lt.id END;
      SELECT k.slots, k.rooms, k.folded, k.shrunk INTO v_lock FROM idemq._lock_slots(v_lid, cardinality(job_ids)) k;
      -- The k-th job (claim order) gets the k-th free slot locked; jobs past
      -- the last are left.
      v_slot_nos := ARRAY(SELECT u.slot
                          FROM unnest(v_lock.slots, v_lock.rooms) WITH ORDINALITY AS u(slot, room, o)
                          CROSS JOIN generate_series(1, u.room)
                          ORDER BY u.o);
      ids := job_ids[1:cardinality(v_slot_nos)];
      IF cardinality(v_lock.slots) > 0 THEN
        UPDATE idemq.limit_slots AS s SET held = s.held - u.folded + u.room, size = s.size - u.shrunk
        FROM unnest(v_lock.slots, v_lock.rooms, v_lock.folded, v_lock.shrunk) AS u(slot, room, folded, shrunk)
        WHERE s.limit_id = v_lid AND s.slot = u.slot;
      END IF;
      IF v_lq.concurrency IS NOT NULL THEN
        queue_slots := v_slot_nos;
      ELSE
        task_slots := v_slot_nos;
      END IF;
      RETURN;
    END IF;
  END IF;

  SELECT array_agg(j.id ORDER BY o.n),
         array_agg(coalesce(lq.paused, false) OR coalesce(lt.paused, false) ORDER BY o.n),
         array_agg(CASE WHEN lq.concurrency IS NOT NULL THEN lq.id END ORDER BY o.n)
           || array_agg(CASE WHEN lt.concurrency IS NOT NULL THEN lt.id END ORDER BY o.n),
         array_agg(CASE WHEN lq.rate IS NOT NULL THEN lq.id END ORDER BY o.n)
           || array_agg(CASE WHEN lt.rate IS NOT NULL THEN lt.id END ORDER BY o.n),
         bool_and(lq.rate IS NULL AND lt.rate IS NULL
                  AND (lq.concurrency IS NULL OR lt.concurrency IS NULL)),
         array_agg(CASE WHEN NOT (coalesce(lq.paused, false) OR coalesce(lt.paused, false))
                        THEN CASE WHEN lq.concurrency IS NOT NULL THEN lq.id
                                  WHEN lt.concurrency IS NOT NULL THEN lt.id END END ORDER BY o.n),
         array_agg(lq.concurrency IS NOT NULL ORDER BY o.n)
  INTO v_ids, v_held, v_slot_scope, v_start_scope, v_simple, v_one_scope, v_one_queue
  FROM unnest(job_ids) WITH ORDINALITY AS o(id, n)
  JOIN idemq.jobs j ON j.id = o.id
  LEFT JOIN idemq.limits lq ON lq.kind = 'queue' AND lq.name = j.queue
  LEFT JOIN idemq.limits lt ON lt.kind = 'task' AND lt.name = j.task;
  IF v_ids IS NULL THEN
    ids := '{}';
    RETURN;
  END IF;

  -- Lock as many free slots per concurrency scope as its jobs here could
  -- use (in limit order, stripes in slot order), skipping stripes other
  -- transactions hold.
  FOR v_lid, v_need IN
    SELECT u.lid, count(*)::int
    FROM unnest(v_slot_scope, v_held || v_held) AS u(lid, held)
    WHERE u.lid IS NOT NULL AND NOT u.held
    GROUP BY u.lid
    ORDER BY u.lid
  LOOP
    SELECT k.slots, k.rooms, k.folded, k.shrunk INTO v_lock FROM idemq._lock_slots(v_lid, v_need) k;
    v_slot_nos := v_slot_nos || ARRAY(SELECT u.slot
                                      FROM unnest(v_lock.slots, v_lock.rooms) WITH ORDINALITY AS u(slot, room, o)
                                      CROSS JOIN generate_series(1, u.room)
                                      ORDER BY u.o);
    v_slot_lids := v_slot_lids || array_fill(v_lid, ARRAY[cardinality(v_slot_nos) - cardinality(v_slot_lids)]);
    v_w_lids := v_w_lids || array_fill(v_lid, ARRAY[cardinality(v_lock.slots)]);
    v_w_slots := v_w_slots || v_lock.slots;
    v_w_folded := v_w_folded || v_lock.folded;
    v_w_shrunk := v_w_shrunk || v_lock.shrunk;
  END LOOP;

  IF v_simple THEN
    -- The common case, set-based: no rate, at most one concurrency scope per
    -- job. The k-th job of a scope (claim order, paused jobs left out) gets
    -- the k-th free slot of it locked above; a job past the slots locked is
    -- left; a job of no scope goes. What the loop below does, with no
    -- per-job PL/pgSQL step (bench/FINDINGS.md, "Flow control: what a
    -- limited claim costs").
    WITH j AS (
      SELECT u.id, u.lid, u.is_queue, u.n,
             row_number() OVER (PARTITION BY u.lid ORDER BY u.n) AS k
      FROM unnest(v_ids, v_one_scope, v_one_queue, v_held) WITH ORDINALITY AS u(id, lid, is_queue, held, n)
      WHERE NOT u.held
    ),
    locked AS (
      SELECT u.lid, u.slot, row_number() OVER (PARTITION BY u.lid ORDER BY u.o) AS k
      FROM unnest(v_slot_lids, v_slot_nos) WITH ORDINALITY AS u(lid, slot, o)
    )
    SELECT coalesce(array_agg(j.id ORDER BY j.n), '{}'),
           array_agg(CASE WHEN j.is_queue THEN l.slot END ORDER BY j.n),
           array_agg(CASE WHEN NOT j.is_queue THEN l.slot END ORDER BY j.n),
           coalesce(array_agg(l.lid) FILTER (WHERE l.lid IS NOT NULL), '{}'),
           coalesce(array_agg(l.slot) FILTER (WHERE l.lid IS NOT NULL), '{}')
    INTO ids, queue_slots, task_slots, v_a_lid, v_a_slot
    FROM j
    LEFT JOIN locked l ON l.lid = j.lid AND l.k = j.k
    WHERE j.lid IS NULL OR l.lid IS NOT NULL;
  ELSE
    ids := '{}';
    queue_slots := '{}';
    task_slots := '{}';
    WITH need AS (
      SELECT u.lid, count(*) AS n
      FROM unnest(v_start_scope, v_held || v_held) AS u(lid, held)
      WHERE u.lid IS NOT NULL AND NOT u.held
      GROUP BY u.lid
    )
    SELECT array_agg(r.limit_id ORDER BY r.limit_id, r.n), array_agg(r.n ORDER BY r.limit_id, r.n)
    INTO v_start_lids, v_start_nos
    FROM need c
    CROSS JOIN LATERAL (
      SELECT r.limit_id, r.n FROM idemq.limit_starts r
      WHERE r.limit_id = c.lid AND r.started_at < now() - r.per
      ORDER BY r.started_at, r.n
      LIMIT c.n
      FOR UPDATE SKIP LOCKED
    ) r;
    v_start_lids := coalesce(v_start_lids, '{}');

    -- One list of the entries locked, slots then starts, each under its
    -- limit's id, a start's negated: one limit may have both, and limit ids
    -- are positive (an identity), so the sign tells them apart and one
    -- lookup and one count of entries used serve both kinds.
    v_t_lids := v_slot_lids || ARRAY(SELECT -u.lid FROM unnest(v_start_lids) AS u(lid));
    v_t_nos := v_slot_nos || coalesce(v_start_nos, '{}');

    -- In claim order: a job goes only if each of its scopes (queue's slot,
    -- task's slot, queue's start, task's start) has an entry left for it;
    -- the k-th job of a scope gets its k-th locked entry.
    FOR i IN 1 .. cardinality(v_ids) LOOP
      CONTINUE WHEN v_held[i];
      v_ok := true;
      v_q := NULL;
      v_t := NULL;
      v_pick := '{}';
      v_scopes := ARRAY[v_slot_scope[i], v_slot_scope[cardinality(v_ids) + i],
                        -v_start_scope[i], -v_start_scope[cardinality(v_ids) + i]];
      FOR w IN 1 .. 4 LOOP
        v_lid := v_scopes[w];
        CONTINUE WHEN v_lid IS NULL;
        v_p := array_position(v_t_lids, v_lid)
               + coalesce(v_used_n[array_position(v_used_lids, v_lid)], 0);
        IF v_p IS NULL OR v_p > cardinality(v_t_lids) OR v_t_lids[v_p] <> v_lid THEN
          v_ok := false;
          EXIT;
        END IF;
        v_pick := v_pick || v_p;
        IF w = 1 THEN
          v_q := v_t_nos[v_p];
        ELSIF w = 2 THEN
          v_t := v_t_nos[v_p];
        END IF;
      END LOOP;
      CONTINUE WHEN NOT v_ok;
      ids := ids || v_ids[i];
      queue_slots := queue_slots || v_q;
      task_slots := task_slots || v_t;
      FOREACH v_p IN ARRAY v_pick LOOP
        v_lid := v_t_lids[v_p];
        IF v_lid = ANY (v_used_lids) THEN
          v_used_n[array_position(v_used_lids, v_lid)] := v_used_n[array_position(v_used_lids, v_lid)] + 1;
        ELSE
          v_used_lids := v_used_lids || v_lid;
          v_used_n := v_used_n || 1;
        END IF;
        IF v_lid > 0 THEN
          v_a_lid := v_a_lid || v_lid;
          v_a_slot := v_a_slot || v_t_nos[v_p];
        ELSE
          v_r_lid := v_r_lid || -v_lid;
          v_r_n := v_r_n || v_t_nos[v_p];
        END IF;
      END LOOP;
    END LOOP;
    IF cardinality(v_r_lid) > 0 THEN
      UPDATE idemq.limit_starts AS r SET started_at = now()
      FROM unnest(v_r_lid, v_r_n) AS a(lid, n)
      WHERE r.limit_id = a.lid AND r.n = a.n;
    END IF;
  END IF;

  -- Each stripe locked, written once: the slots given there, the releases
  -- folded, the slots given up to a draining limit.
  IF cardinality(v_w_lids) > 0 THEN
    UPDATE idemq.limit_slots AS s
    SET held = s.held - w.folded + coalesce(u.n, 0), size = s.size - w.shrunk
    FROM unnest(v_w_lids, v_w_slots, v_w_folded, v_w_shrunk) AS w(lid, slot, folded, shrunk)
    LEFT JOIN (SELECT a.lid, a.slot, count(*)::int AS n
               FROM unnest(v_a_lid, v_a_slot) AS a(lid, slot)
               GROUP BY a.lid, a.slot) u ON u.lid = w.lid AND u.slot = w.slot
    WHERE s.limit_id = w.lid AND s.slot = w.slot;
  END IF;
END;
$$;

COMMENT ON FUNCTION idemq._claim_take(bigint[], text, text) IS
  'claim() under flow control: the slots and starts for its locked jobs, in claim order; returns the jobs that may start and their stripes.';
