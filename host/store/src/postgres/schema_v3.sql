-- poimen store on PostgreSQL, schema version 3 (migration 3).
--
-- FROZEN once released (see schema_v1.sql). The same change as the SQLite
-- store's migration 7: retention.
--
-- poimen_gc deletes finished runs — their episodes, intents, judgment
-- requests, answers and expiries — and the blobs nothing else refers to.
-- Nothing else ever deletes: the refusing triggers now refuse UPDATE as
-- before, and DELETE unless gc named the row, inside its own transaction,
-- in gc_runs (a run of a finished tree) or gc_blobs (a blob no longer
-- referred to). Both tables are empty outside that transaction. Versions
-- are never deleted; TRUNCATE stays refused everywhere.

CREATE TABLE gc_runs (run text COLLATE "C" PRIMARY KEY);
CREATE TABLE gc_blobs (hash text COLLATE "C" PRIMARY KEY);

-- TG_ARGV: the column naming the row's run ('run'), judgment ('judgment')
-- or blob ('hash'), or 'id' for runs themselves; then the refusal.
CREATE FUNCTION poimen_delete_by_gc() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    key text := to_jsonb(OLD)->>TG_ARGV[0];
    named boolean;
BEGIN
    named := CASE TG_ARGV[0]
        WHEN 'hash' THEN EXISTS (SELECT 1 FROM gc_blobs WHERE hash = key)
        WHEN 'judgment' THEN EXISTS (SELECT 1 FROM judgments j JOIN gc_runs g ON g.run = j.run
                                     WHERE j.id = key)
        WHEN 'id' THEN EXISTS (SELECT 1 FROM gc_runs WHERE run = key)
                   AND to_jsonb(OLD)->>'status' IN ('completed', 'failed', 'cancelled')
        ELSE EXISTS (SELECT 1 FROM gc_runs WHERE run = key)
    END;
    IF NOT named THEN
        RAISE EXCEPTION 'poimen: %', TG_ARGV[1] USING ERRCODE = 'PM002';
    END IF;
    RETURN OLD;
END $$;

DROP TRIGGER runs_no_delete ON runs;
CREATE TRIGGER runs_no_delete BEFORE DELETE ON runs
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('id', 'runs are never deleted, except finished runs by gc');

DROP TRIGGER blobs_no_update ON blobs;
CREATE TRIGGER blobs_no_update BEFORE UPDATE ON blobs
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('blobs are immutable');
CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('hash', 'blobs are deleted only by gc, once nothing refers to them');

DROP TRIGGER events_no_update ON events;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('events are immutable');
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('run', 'events are deleted only by gc, with their finished run');

DROP TRIGGER intents_no_update ON intents;
CREATE TRIGGER intents_no_update BEFORE UPDATE ON intents
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('intent records are immutable');
CREATE TRIGGER intents_no_delete BEFORE DELETE ON intents
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('run', 'intent records are deleted only by gc, with their finished run');

DROP TRIGGER judgments_no_update ON judgments;
CREATE TRIGGER judgments_no_update BEFORE UPDATE ON judgments
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('judgment requests are immutable');
CREATE TRIGGER judgments_no_delete BEFORE DELETE ON judgments
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('run', 'judgment requests are deleted only by gc, with their finished run');

DROP TRIGGER judgment_answers_no_update ON judgment_answers;
CREATE TRIGGER judgment_answers_no_update BEFORE UPDATE ON judgment_answers
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('judgment answers are immutable');
CREATE TRIGGER judgment_answers_no_delete BEFORE DELETE ON judgment_answers
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('judgment', 'judgment answers are deleted only by gc, with their finished run');

DROP TRIGGER judgment_expiries_no_update ON judgment_expiries;
CREATE TRIGGER judgment_expiries_no_update BEFORE UPDATE ON judgment_expiries
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('judgment expiries are append-only');
CREATE TRIGGER judgment_expiries_no_delete BEFORE DELETE ON judgment_expiries
FOR EACH ROW EXECUTE FUNCTION poimen_delete_by_gc('judgment', 'judgment expiries are deleted only by gc, with their finished run');

-- Every blob hash named by the runs in gc_runs (doomed) or by every other
-- run (not doomed): inputs, outputs, intents' outputs and records, event
-- bodies, judgment requests and answers. A string that merely looks like a
-- hash keeps the blob it names: the safe side.
CREATE FUNCTION poimen_gc_refs(doomed boolean) RETURNS TABLE (hash text) LANGUAGE sql STABLE AS $$
    SELECT input_hash FROM runs
    WHERE (id IN (SELECT run FROM gc_runs)) = doomed
    UNION SELECT output_hash FROM runs
    WHERE output_hash IS NOT NULL AND (id IN (SELECT run FROM gc_runs)) = doomed
    UNION SELECT output_hash FROM intents
    WHERE output_hash IS NOT NULL AND (run IN (SELECT run FROM gc_runs)) = doomed
    UNION SELECT m[1] FROM intents, regexp_matches(record::text, '(b3:[0-9a-f]{64})', 'g') m
    WHERE record IS NOT NULL AND (run IN (SELECT run FROM gc_runs)) = doomed
    UNION SELECT m[1] FROM events, regexp_matches(body::text, '(b3:[0-9a-f]{64})', 'g') m
    WHERE strpos(body::text, 'b3:') > 0 AND (run IN (SELECT run FROM gc_runs)) = doomed
    UNION SELECT m[1] FROM judgments, regexp_matches(request::text, '(b3:[0-9a-f]{64})', 'g') m
    WHERE (run IN (SELECT run FROM gc_runs)) = doomed
    UNION SELECT m[1] FROM judgment_answers a JOIN judgments j ON j.id = a.judgment,
        regexp_matches(a.result::text, '(b3:[0-9a-f]{64})', 'g') m
    WHERE (j.run IN (SELECT run FROM gc_runs)) = doomed
$$;

-- Store::gc in one call: picks every run of each tree whose root is a
-- top-level run that ended before `cutoff` (if every run of it ended),
-- counts what goes with them, and, unless `dry`, deletes it.
CREATE FUNCTION poimen_gc(cutoff bigint, dry boolean)
RETURNS TABLE (runs bigint, events bigint, intents bigint, judgments bigint,
               blobs bigint, blob_bytes bigint)
LANGUAGE plpgsql AS $$
DECLARE
    deleted bigint;
BEGIN
    -- Every commit and run creation inserts its blobs (ROW EXCLUSIVE on
    -- blobs) before it writes what refers to them, in one transaction:
    -- holding SHARE ROW EXCLUSIVE, gc waits for those under way and sees
    -- every reference they made; those after it wait for gc and insert
    -- their blobs anew.
    LOCK TABLE blobs IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM gc_runs;
    DELETE FROM gc_blobs;
    INSERT INTO gc_runs (run)
    WITH RECURSIVE tree(root, id) AS (
        SELECT r.id, r.id FROM runs r
        WHERE r.parent_run IS NULL AND r.updated_at < cutoff
          AND r.status IN ('completed', 'failed', 'cancelled')
        UNION ALL
        SELECT tree.root, c.id FROM runs c JOIN tree ON c.parent_run = tree.id
    )
    SELECT t.id FROM tree t
    WHERE t.root NOT IN (
        SELECT tr.root FROM tree tr JOIN runs r ON r.id = tr.id
        WHERE r.status NOT IN ('completed', 'failed', 'cancelled'));
    -- Hold the picked runs: an operator's retry of a failed one waits, and
    -- finds it gone.
    PERFORM 1 FROM runs r WHERE r.id IN (SELECT g.run FROM gc_runs g) FOR UPDATE;
    INSERT INTO gc_blobs (hash)
    SELECT d.hash FROM poimen_gc_refs(true) d
    WHERE d.hash IN (SELECT b.hash FROM blobs b)
    EXCEPT SELECT k.hash FROM poimen_gc_refs(false) k;

    runs := (SELECT count(*) FROM gc_runs);
    events := (SELECT count(*) FROM events e WHERE e.run IN (SELECT g.run FROM gc_runs g));
    intents := (SELECT count(*) FROM intents i WHERE i.run IN (SELECT g.run FROM gc_runs g));
    judgments := (SELECT count(*) FROM judgments j WHERE j.run IN (SELECT g.run FROM gc_runs g));
    blobs := (SELECT count(*) FROM gc_blobs);
    blob_bytes := (SELECT coalesce(sum(b.size), 0) FROM blobs b
                   WHERE b.hash IN (SELECT x.hash FROM gc_blobs x));

    IF NOT dry AND runs > 0 THEN
        DELETE FROM judgment_answers a WHERE a.judgment IN
            (SELECT j.id FROM judgments j WHERE j.run IN (SELECT g.run FROM gc_runs g));
        DELETE FROM judgment_expiries x WHERE x.judgment IN
            (SELECT j.id FROM judgments j WHERE j.run IN (SELECT g.run FROM gc_runs g));
        DELETE FROM judgments j WHERE j.run IN (SELECT g.run FROM gc_runs g);
        DELETE FROM intents i WHERE i.run IN (SELECT g.run FROM gc_runs g);
        DELETE FROM events e WHERE e.run IN (SELECT g.run FROM gc_runs g);
        -- Children before parents: a run's parent_run refers to its parent.
        LOOP
            DELETE FROM runs r WHERE r.id IN (SELECT g.run FROM gc_runs g)
              AND NOT EXISTS (SELECT 1 FROM runs c WHERE c.parent_run = r.id);
            GET DIAGNOSTICS deleted = ROW_COUNT;
            EXIT WHEN deleted = 0;
        END LOOP;
        DELETE FROM blobs b WHERE b.hash IN (SELECT x.hash FROM gc_blobs x);
    END IF;
    DELETE FROM gc_runs;
    DELETE FROM gc_blobs;
    RETURN NEXT;
END $$;
