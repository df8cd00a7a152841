-- What concurrency keys cost (issue 26, item 3; bench/FINDINGS.md, "Flow
-- control: concurrency keys"). Against a scratch database with idemq
-- installed (`idemq migrate`), never a live one:
--   psql "$URL" -f bench/keys-cost.sql -c "SELECT * FROM pg_temp.enqueue_cost(5000)"
--   psql "$URL" -f bench/keys-cost.sql -c "SELECT * FROM pg_temp.process_cost(20000, 1000)"
-- enqueue_cost: µs per enqueue() in one transaction's loop (backend CPU, no
-- commit), without a key, with a new key each (admitted), and with one busy
-- key (waiting). process_cost: jobs/s of claim(100) + complete_many until
-- none is left, for `n` jobs without keys and the same jobs over `keys` keys
-- (K = 1); one transaction each, so neither pays commits.
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.enqueue_cost(n int) RETURNS TABLE(mode text, us_per_enqueue numeric)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; m text; i int; run text := md5(random()::text);
BEGIN
  FOREACH m IN ARRAY ARRAY['no key', 'new key each', 'one busy key'] LOOP
    t0 := clock_timestamp();
    FOR i IN 1..n LOOP
      IF m = 'no key' THEN
        PERFORM * FROM idemq.enqueue('bench_key_cost', queue => 'bench-keys-' || run);
      ELSIF m = 'new key each' THEN
        PERFORM * FROM idemq.enqueue('bench_key_cost', queue => 'bench-keys-' || run, concurrency_key => run || ':' || i);
      ELSE
        PERFORM * FROM idemq.enqueue('bench_key_cost', queue => 'bench-keys-' || run, concurrency_key => run || ':busy');
      END IF;
    END LOOP;
    mode := m;
    us_per_enqueue := round((extract(epoch FROM clock_timestamp() - t0) * 1e6 / n)::numeric, 1);
    RETURN NEXT;
  END LOOP;
END $$;

CREATE FUNCTION pg_temp.process_cost(n int, keys int) RETURNS TABLE(mode text, jobs_per_s numeric)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; ids bigint[]; atts int[]; toks uuid[]; q text; m text; run text := md5(random()::text);
BEGIN
  FOREACH m IN ARRAY ARRAY['no key', 'keyed'] LOOP
    q := 'bench-process-' || m || '-' || run;
    PERFORM count(*) FROM idemq.enqueue_many((
      SELECT jsonb_agg(jsonb_build_object('task', 'bench_key_cost', 'queue', q)
                       || CASE WHEN m = 'keyed' THEN jsonb_build_object('concurrency_key', run || ':' || (g % keys)) ELSE '{}' END)
      FROM generate_series(1, n) g));
    t0 := clock_timestamp();
    LOOP
      SELECT array_agg(c.job_id), array_agg(c.attempt), array_agg(c.lease_token) INTO ids, atts, toks
      FROM idemq.claim('bench', ARRAY[q], 100, token => true) c;
      EXIT WHEN ids IS NULL;
      PERFORM idemq.complete_many(ids, atts, toks);
    END LOOP;
    mode := m;
    jobs_per_s := round((n / extract(epoch FROM clock_timestamp() - t0))::numeric);
    RETURN NEXT;
  END LOOP;
END $$;
