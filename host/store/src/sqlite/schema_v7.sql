-- poimen store, schema version 7 (migration 7).
--
-- Retention: `Store::gc` deletes finished runs — their episodes, intents,
-- judgment requests, answers and expiries — and the blobs nothing else
-- refers to. Nothing else ever deletes: the no-delete triggers now let a
-- row go only when gc has named it, inside gc's own transaction, in
-- gc_runs (a run of a finished tree) or gc_blobs (a blob no longer
-- referred to). Both tables are empty outside that transaction. Versions
-- are never deleted; updates stay refused as before.

CREATE TABLE gc_runs (
    run TEXT PRIMARY KEY
) STRICT, WITHOUT ROWID;
CREATE TABLE gc_blobs (
    hash TEXT PRIMARY KEY
) STRICT, WITHOUT ROWID;

DROP TRIGGER runs_no_delete;
CREATE TRIGGER runs_no_delete BEFORE DELETE ON runs
WHEN OLD.status NOT IN ('completed', 'failed', 'cancelled')
  OR NOT EXISTS (SELECT 1 FROM gc_runs WHERE run = OLD.id)
BEGIN SELECT RAISE(ABORT, 'poimen: runs are never deleted, except finished runs by gc'); END;

DROP TRIGGER events_no_delete;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (SELECT 1 FROM gc_runs WHERE run = OLD.run)
BEGIN SELECT RAISE(ABORT, 'poimen: events are deleted only by gc, with their finished run'); END;

DROP TRIGGER intents_no_delete;
CREATE TRIGGER intents_no_delete BEFORE DELETE ON intents
WHEN NOT EXISTS (SELECT 1 FROM gc_runs WHERE run = OLD.run)
BEGIN SELECT RAISE(ABORT, 'poimen: intent records are deleted only by gc, with their finished run'); END;

DROP TRIGGER judgments_no_delete;
CREATE TRIGGER judgments_no_delete BEFORE DELETE ON judgments
WHEN NOT EXISTS (SELECT 1 FROM gc_runs WHERE run = OLD.run)
BEGIN SELECT RAISE(ABORT, 'poimen: judgment requests are deleted only by gc, with their finished run'); END;

DROP TRIGGER judgment_answers_no_delete;
CREATE TRIGGER judgment_answers_no_delete BEFORE DELETE ON judgment_answers
WHEN NOT EXISTS (SELECT 1 FROM judgments j JOIN gc_runs g ON g.run = j.run
                 WHERE j.id = OLD.judgment)
BEGIN SELECT RAISE(ABORT, 'poimen: judgment answers are deleted only by gc, with their finished run'); END;

DROP TRIGGER judgment_expiries_no_delete;
CREATE TRIGGER judgment_expiries_no_delete BEFORE DELETE ON judgment_expiries
WHEN NOT EXISTS (SELECT 1 FROM judgments j JOIN gc_runs g ON g.run = j.run
                 WHERE j.id = OLD.judgment)
BEGIN SELECT RAISE(ABORT, 'poimen: judgment expiries are deleted only by gc, with their finished run'); END;

DROP TRIGGER blobs_no_delete;
CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs
WHEN NOT EXISTS (SELECT 1 FROM gc_blobs WHERE hash = OLD.hash)
BEGIN SELECT RAISE(ABORT, 'poimen: blobs are deleted only by gc, once nothing refers to them'); END;
