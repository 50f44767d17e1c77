-- poimen store on PostgreSQL, schema version 2 (migration 2).
--
-- FROZEN once released (see schema_v1.sql). The same change as the SQLite
-- store's migration 6: timers, arming and unloading.
--
-- * runs.wake_at: when a run no host holds must be looked at again (a
--   judgment's timeout, the run's deadline, the end of an unload drain);
--   poimen_claim_runnable_v2 hands a waiting or blocked run whose wake_at
--   has come to a serving host. Every new tenure clears it (the trigger
--   runs_new_tenure): the host that looks sets the next one.
-- * poimen_commit_v2: poimen_commit, then the commit's judgment expiries
--   (which poimen_commit does not know) and the run's timer from its
--   run_update — one call, one transaction, as before.
-- * judgment_expiries: requests closed unanswered when their timeout
--   passed (append-only; a request is answered or expired, never both).
-- * armed: each workflow id's current version (NULL: disarmed).
-- * unloads: versions whose live runs must end by a deadline.

ALTER TABLE runs ADD COLUMN wake_at bigint;
CREATE INDEX runs_wake ON runs (wake_at) WHERE wake_at IS NOT NULL;

CREATE FUNCTION poimen_runs_new_tenure() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_epoch > OLD.lease_epoch THEN
        NEW.wake_at := NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_new_tenure BEFORE UPDATE OF lease_epoch ON runs
FOR EACH ROW EXECUTE FUNCTION poimen_runs_new_tenure();

CREATE TABLE judgment_expiries (
    judgment text COLLATE "C" PRIMARY KEY REFERENCES judgments(id),
    at       bigint NOT NULL
);
CREATE TRIGGER judgment_expiries_no_update BEFORE UPDATE OR DELETE ON judgment_expiries
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('judgment expiries are append-only');
CREATE TRIGGER judgment_expiries_no_truncate BEFORE TRUNCATE ON judgment_expiries
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('judgment expiries are append-only');

-- An answer to an expired request is refused, like a second answer.
CREATE FUNCTION poimen_answer_not_expired() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM judgment_expiries WHERE judgment = NEW.judgment) THEN
        PERFORM poimen_refuse_commit(json_build_object(
            'kind', 'judgment_conflict', 'id', NEW.judgment,
            'detail', 'the request expired unanswered (its timeout passed)'));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER judgment_answers_not_expired BEFORE INSERT ON judgment_answers
FOR EACH ROW EXECUTE FUNCTION poimen_answer_not_expired();

CREATE FUNCTION poimen_commit_v2(c json, blob_hashes text[], blob_bytes bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    run_id  text := c->>'run';
    e       json;
    owner   text;
    closed  boolean;
BEGIN
    -- poimen_commit reads every judgment write that is not an `open` as an
    -- answer: it gets the others, and this function the expiries.
    PERFORM poimen_commit(
        (c::jsonb || jsonb_build_object('judgments',
            (SELECT coalesce(jsonb_agg(j ORDER BY n), '[]'::jsonb)
             FROM jsonb_array_elements(c::jsonb->'judgments') WITH ORDINALITY AS t(j, n)
             WHERE j->>'op' <> 'expire')))::json,
        blob_hashes, blob_bytes);
    FOR e IN SELECT j FROM json_array_elements(c->'judgments') j WHERE j->>'op' = 'expire' LOOP
        SELECT q.run, (a.judgment IS NOT NULL OR x.judgment IS NOT NULL) INTO owner, closed
        FROM judgments q
        LEFT JOIN judgment_answers a ON a.judgment = q.id
        LEFT JOIN judgment_expiries x ON x.judgment = q.id
        WHERE q.id = e->>'id';
        IF NOT FOUND THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'not_found', 'what', 'judgment request ' || (e->>'id')));
        ELSIF owner <> run_id THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'judgment_conflict', 'id', e->>'id',
                'detail', format('it belongs to run %s, not to run %s', owner, run_id)));
        ELSIF closed THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'judgment_conflict', 'id', e->>'id',
                'detail', 'the request is already answered or expired'));
        END IF;
        INSERT INTO judgment_expiries (judgment, at) VALUES (e->>'id', (e->>'at')::bigint);
    END LOOP;
    IF json_typeof(c->'run_update') = 'object' THEN
        UPDATE runs SET wake_at = CASE
                WHEN status IN ('completed', 'failed', 'cancelled') THEN NULL
                ELSE (c->'run_update'->>'wake_at')::bigint END
        WHERE id = c->>'run';
    END IF;
END $$;

-- As poimen_claim_runnable, and then waiting and blocked runs whose timer
-- has come (they hold their slot already, or need none), oldest first.
CREATE FUNCTION poimen_claim_runnable_v2(who text, now_ms bigint, expires bigint, lim integer)
RETURNS SETOF runs
LANGUAGE plpgsql AS $$
DECLARE
    taken bigint := 0;
BEGIN
    RETURN QUERY SELECT * FROM poimen_claim_runnable(who, now_ms, expires, lim);
    GET DIAGNOSTICS taken = ROW_COUNT;
    IF taken < lim THEN
        RETURN QUERY
        UPDATE runs r SET owner = who, lease_epoch = r.lease_epoch + 1,
                          lease_expires_at = expires, claimed_at = now_ms
        FROM (SELECT id FROM runs
              WHERE wake_at <= now_ms AND status IN ('waiting_judgment', 'blocked')
                AND (owner IS NULL OR lease_expires_at <= now_ms)
              ORDER BY created_at, id
              LIMIT lim - taken
              FOR NO KEY UPDATE SKIP LOCKED) picked
        WHERE r.id = picked.id
        RETURNING r.*;
    END IF;
END $$;

CREATE TABLE armed (
    -- Each workflow id's armed version; NULL: disarmed. Rows change (arming
    -- moves); versions never do.
    workflow_id text COLLATE "C" PRIMARY KEY,
    version     text COLLATE "C" REFERENCES versions(version),
    at          bigint NOT NULL
);

CREATE TABLE unloads (
    version  text COLLATE "C" PRIMARY KEY REFERENCES versions(version),
    deadline bigint NOT NULL,
    at       bigint NOT NULL
);
