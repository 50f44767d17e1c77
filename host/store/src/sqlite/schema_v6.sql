-- poimen store, schema version 6 (migration 6).
--
-- Timers, arming and unloading.
--
-- * runs.wake_at: when a run no host holds must be looked at again — a
--   judgment's timeout, the run's deadline, the end of an unload drain.
--   claim_runnable hands a waiting or blocked run whose wake_at has come to
--   a serving host (and clears it: the host that looks sets the next one).
--   NULL: no timer.
-- * armed: each workflow id's current (armed) version, and since when;
--   version NULL: the workflow is disarmed (no new run may start).
-- * unloads: versions retired by an unload drain with a timeout: their live
--   runs are cancelled at the deadline by whichever host drives them (or
--   claims them, woken at it).
-- * judgment_expiries: requests closed unanswered when their timeout
--   passed (append-only, like answers; a request is answered or expired,
--   never both).

ALTER TABLE runs ADD COLUMN wake_at INTEGER;
CREATE INDEX runs_wake ON runs(wake_at) WHERE wake_at IS NOT NULL;

CREATE TABLE armed (
    workflow_id TEXT PRIMARY KEY,
    version     TEXT REFERENCES versions(version),
    at          INTEGER NOT NULL
);
CREATE TRIGGER armed_version_of_workflow BEFORE INSERT ON armed
WHEN NEW.version IS NOT NULL
 AND (SELECT workflow_id FROM versions WHERE version = NEW.version) IS NOT NEW.workflow_id
BEGIN SELECT RAISE(ABORT, 'poimen: an armed version must be a version of its workflow'); END;
CREATE TRIGGER armed_version_of_workflow_update BEFORE UPDATE ON armed
WHEN NEW.version IS NOT NULL
 AND (SELECT workflow_id FROM versions WHERE version = NEW.version) IS NOT NEW.workflow_id
BEGIN SELECT RAISE(ABORT, 'poimen: an armed version must be a version of its workflow'); END;

CREATE TABLE unloads (
    version  TEXT PRIMARY KEY REFERENCES versions(version),
    deadline INTEGER NOT NULL,
    at       INTEGER NOT NULL
);

CREATE TABLE judgment_expiries (
    judgment TEXT PRIMARY KEY REFERENCES judgments(id),
    at       INTEGER NOT NULL
);
CREATE TRIGGER judgment_expiries_no_update BEFORE UPDATE ON judgment_expiries
BEGIN SELECT RAISE(ABORT, 'poimen: judgment expiries are append-only'); END;
CREATE TRIGGER judgment_expiries_no_delete BEFORE DELETE ON judgment_expiries
BEGIN SELECT RAISE(ABORT, 'poimen: judgment expiries are append-only'); END;
