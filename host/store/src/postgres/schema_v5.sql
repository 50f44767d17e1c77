-- poimen store on PostgreSQL, schema version 5 (migration 5).
--
-- FROZEN once released (see schema_v1.sql). No table changes: the commit
-- path reads its document once.
--
-- poimen_commit_v2 took the commit as `json` and read it field by field:
-- every `->` on a `json` value parses its text again, and a commit's
-- document (events, intents, their records) was parsed a dozen times, and
-- converted to `jsonb` and back once more to filter its judgment writes —
-- ~0.5 ms of server time per commit of a tool step, more than the WAL
-- flush. It now parses the document once, into `jsonb`, and reads that.
-- The rules and refusals are exactly poimen_commit's and
-- poimen_commit_v2's (schema_v1.sql, schema_v2.sql): the same checks in the
-- same order, the same writes. Every JSON value a commit stores travels as
-- a string in the document (`body`, `record`, `request`, `result`), whose
-- text `jsonb` keeps exactly, so what is stored is byte for byte what the
-- host wrote, as before.

CREATE OR REPLACE FUNCTION poimen_commit_v2(c json, blob_hashes text[], blob_bytes bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    d          jsonb := c::jsonb;
    run_id     text := d->>'run';
    fence      jsonb := d->'fence';
    upd        jsonb := d->'run_update';
    cur        record;
    next_seq   bigint;
    first_seq  numeric;
    i          jsonb;
    j          jsonb;
    call_key   text;
    prev       text;
    phases     jsonb := '{}';
    opened     text[] := '{}';
    answered   text[] := '{}';
    stored_run text;
    stored_answered boolean;
    out_hash   text;
    exp_owner  text;
    exp_closed boolean;
BEGIN
    IF jsonb_typeof(fence) IS DISTINCT FROM 'object' THEN
        fence := NULL;
    END IF;
    IF jsonb_typeof(upd) IS DISTINCT FROM 'object' THEN
        upd := NULL;
    END IF;
    IF d->>'durability' = 'buffered' THEN
        -- Returns before the WAL is flushed: survives the host's crash,
        -- not the server's.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    -- The run's row lock orders commits and claims of one run.
    SELECT status, output_hash, owner, lease_epoch, lease_expires_at INTO cur
    FROM runs WHERE id = run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM poimen_refuse_commit(json_build_object('kind', 'not_found', 'what', 'run ' || run_id));
    END IF;

    IF fence IS NOT NULL AND (cur.owner IS DISTINCT FROM fence->>'owner'
                              OR cur.lease_epoch::numeric <> (fence->>'epoch')::numeric) THEN
        PERFORM poimen_refuse_commit(json_build_object(
            'kind', 'lease_lost',
            'holder', CASE WHEN cur.owner IS NULL THEN NULL ELSE json_build_object(
                'owner', cur.owner, 'epoch', cur.lease_epoch, 'expires_at', cur.lease_expires_at) END));
    END IF;

    first_seq := (d->'events'->0->>'seq')::numeric;
    IF first_seq IS NOT NULL THEN
        SELECT coalesce(max(seq) + 1, 0) INTO next_seq FROM events WHERE run = run_id;
        IF first_seq <> next_seq THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'sequence_conflict', 'expected', next_seq, 'got', first_seq));
        END IF;
    END IF;

    FOR i IN SELECT e FROM jsonb_array_elements(d->'intents') e LOOP
        call_key := jsonb_build_array(i->>'step', i->'iteration', i->'attempt')::text;
        prev := phases->>call_key;
        IF prev IS NULL THEN
            SELECT phase INTO prev FROM intents
            WHERE run = run_id AND step = i->>'step' AND iteration = (i->>'iteration')::bigint
              AND attempt = (i->>'attempt')::bigint
            ORDER BY id DESC LIMIT 1;
        END IF;
        IF NOT poimen_intent_may_follow(prev, i->>'phase') THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'intent_out_of_order', 'step', i->>'step', 'iteration', i->'iteration',
                'attempt', i->'attempt', 'phase', i->>'phase', 'previous', prev));
        END IF;
        phases := phases || jsonb_build_object(call_key, i->>'phase');
    END LOOP;

    -- Opens and answers (an expiry is checked below, after them, as
    -- poimen_commit_v2 checked it after poimen_commit).
    FOR j IN SELECT e FROM jsonb_array_elements(d->'judgments') e WHERE e->>'op' <> 'expire' LOOP
        IF j->>'op' = 'open' THEN
            IF j->>'id' = ANY (opened) OR EXISTS (SELECT 1 FROM judgments WHERE id = j->>'id') THEN
                PERFORM poimen_refuse_commit(json_build_object(
                    'kind', 'judgment_conflict', 'id', j->>'id',
                    'detail', 'a request with this id already exists'));
            END IF;
            opened := opened || (j->>'id');
        ELSE
            SELECT q.run, a.judgment IS NOT NULL INTO stored_run, stored_answered
            FROM judgments q LEFT JOIN judgment_answers a ON a.judgment = q.id
            WHERE q.id = j->>'id';
            IF NOT FOUND THEN
                IF NOT (j->>'id' = ANY (opened)) THEN
                    PERFORM poimen_refuse_commit(json_build_object(
                        'kind', 'not_found', 'what', 'judgment request ' || (j->>'id')));
                END IF;
            ELSIF stored_run <> run_id THEN
                PERFORM poimen_refuse_commit(json_build_object(
                    'kind', 'judgment_conflict', 'id', j->>'id',
                    'detail', format('it belongs to run %s, not to run %s', stored_run, run_id)));
            ELSIF stored_answered THEN
                PERFORM poimen_refuse_commit(json_build_object(
                    'kind', 'judgment_conflict', 'id', j->>'id',
                    'detail', 'the request is already answered'));
            END IF;
            IF j->>'id' = ANY (answered) THEN
                PERFORM poimen_refuse_commit(json_build_object(
                    'kind', 'judgment_conflict', 'id', j->>'id',
                    'detail', 'the request is already answered'));
            END IF;
            answered := answered || (j->>'id');
        END IF;
    END LOOP;

    IF upd IS NOT NULL THEN
        IF cur.status IN ('completed', 'cancelled')
           AND (upd->>'status' IS DISTINCT FROM cur.status
                OR upd->>'output_hash' IS DISTINCT FROM cur.output_hash) THEN
            PERFORM poimen_refuse_commit(json_build_object('kind', 'run_final', 'status', cur.status));
        END IF;
        out_hash := upd->>'output_hash';
        IF out_hash IS NOT NULL AND NOT (out_hash = ANY (coalesce(blob_hashes, '{}')))
           AND NOT EXISTS (SELECT 1 FROM blobs WHERE hash = out_hash) THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'not_found', 'what', 'output blob ' || out_hash));
        END IF;
    END IF;

    -- Every check passed: write.
    INSERT INTO blobs (hash, size, bytes)
    SELECT h, length(b), b FROM unnest(blob_hashes, blob_bytes) AS t(h, b)
    ON CONFLICT (hash) DO NOTHING;

    INSERT INTO events (run, seq, at, kind, body)
    SELECT run_id, (e->>'seq')::bigint, (e->>'at')::bigint, e->>'kind', (e->>'body')::json
    FROM jsonb_array_elements(d->'events') WITH ORDINALITY AS t(e, n) ORDER BY n;

    INSERT INTO intents (run, step, iteration, attempt, phase, tool, tool_version, digest, effect,
                         args_hash, idempotency_key, output_hash, error, record, at)
    SELECT run_id, e->>'step', (e->>'iteration')::bigint, (e->>'attempt')::bigint, e->>'phase',
           e->>'tool', e->>'tool_version', e->>'digest', e->>'effect', e->>'args_hash',
           e->>'idempotency_key', e->>'output_hash', e->>'error', (e->>'record')::json,
           (e->>'at')::bigint
    FROM jsonb_array_elements(d->'intents') WITH ORDINALITY AS t(e, n) ORDER BY n;

    IF jsonb_array_length(d->'judgments') > 0 THEN
        -- A request opened in this commit precedes its answer (the checks
        -- above refuse an answer to a request not yet opened), so opens go
        -- first.
        INSERT INTO judgments (id, run, step, iteration, request, request_hash, created_at)
        SELECT e->>'id', run_id, e->>'step', (e->>'iteration')::bigint, (e->>'request')::json,
               e->>'request_hash', (e->>'at')::bigint
        FROM jsonb_array_elements(d->'judgments') WITH ORDINALITY AS t(e, n)
        WHERE e->>'op' = 'open' ORDER BY n;
        INSERT INTO judgment_answers (judgment, result, answered_at)
        SELECT e->>'id', (e->>'result')::json, (e->>'at')::bigint
        FROM jsonb_array_elements(d->'judgments') WITH ORDINALITY AS t(e, n)
        WHERE e->>'op' = 'answer' ORDER BY n;
    END IF;

    IF upd IS NOT NULL THEN
        -- Work for a serving host (LISTEN poimen_work): a slot of an
        -- admission group freed, or a run an operator's write made
        -- runnable with no host holding it. Sent when the commit commits.
        IF (upd->>'status' IN ('completed', 'failed', 'cancelled')
            AND EXISTS (SELECT 1 FROM runs WHERE id = run_id AND admission_group IS NOT NULL))
           OR (upd->>'status' IN ('queued', 'running') AND fence IS NULL) THEN
            PERFORM pg_notify('poimen_work', '');
        END IF;
        UPDATE runs SET status = upd->>'status', reason = upd->>'reason',
                        output_hash = upd->>'output_hash',
                        updated_at = (upd->>'updated_at')::bigint,
                        -- The commit that ends a run ends its tenure (the
                        -- epoch stays).
                        owner = CASE WHEN upd->>'status' IN ('completed', 'failed', 'cancelled')
                                     THEN NULL ELSE owner END,
                        lease_expires_at = CASE WHEN upd->>'status' IN ('completed', 'failed', 'cancelled')
                                                THEN NULL ELSE lease_expires_at END,
                        admitted = CASE WHEN upd->>'status' IN ('completed', 'failed', 'cancelled')
                                        THEN false ELSE admitted END
        WHERE id = run_id;
    END IF;

    -- Judgment expiries (poimen_commit_v2's own part).
    FOR j IN SELECT e FROM jsonb_array_elements(d->'judgments') e WHERE e->>'op' = 'expire' LOOP
        SELECT q.run, (a.judgment IS NOT NULL OR x.judgment IS NOT NULL) INTO exp_owner, exp_closed
        FROM judgments q
        LEFT JOIN judgment_answers a ON a.judgment = q.id
        LEFT JOIN judgment_expiries x ON x.judgment = q.id
        WHERE q.id = j->>'id';
        IF NOT FOUND THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'not_found', 'what', 'judgment request ' || (j->>'id')));
        ELSIF exp_owner <> run_id THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'judgment_conflict', 'id', j->>'id',
                'detail', format('it belongs to run %s, not to run %s', exp_owner, run_id)));
        ELSIF exp_closed THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'judgment_conflict', 'id', j->>'id',
                'detail', 'the request is already answered or expired'));
        END IF;
        INSERT INTO judgment_expiries (judgment, at) VALUES (j->>'id', (j->>'at')::bigint);
    END LOOP;
    IF upd IS NOT NULL THEN
        UPDATE runs SET wake_at = CASE
                WHEN status IN ('completed', 'failed', 'cancelled') THEN NULL
                ELSE (upd->>'wake_at')::bigint END
        WHERE id = run_id;
    END IF;
END $$;
