-- poimen store, schema version 1 (migration 1).
--
-- FROZEN: a store at version 1 exists on users' disks as this file created
-- it. Change the schema with a new migration, never by editing this one
-- (the unit test `migration_one_is_frozen` compares it with the fixture).
--
-- Conventions: hashes are text `b3:` + 64 hex digits; times are integer
-- milliseconds since the Unix epoch, given by the caller; JSON is text.
-- Append-only tables refuse UPDATE and DELETE with triggers, so even a
-- third-party writer using `sqlite3` cannot rewrite history by accident.

CREATE TABLE schema_migrations (
    -- One row per applied migration; PRAGMA user_version is the highest.
    version INTEGER PRIMARY KEY,
    name    TEXT NOT NULL
) STRICT;

CREATE TABLE versions (
    -- The version DAG: immutable, content-addressed workflow definitions.
    seq         INTEGER PRIMARY KEY,              -- publish order
    version     TEXT NOT NULL UNIQUE
                CHECK (length(version) = 67 AND version GLOB 'b3:*'),  -- blake3(canonical)
    workflow_id TEXT NOT NULL,
    parent      TEXT REFERENCES versions(version), -- same workflow_id, published before
    canonical   BLOB NOT NULL,                     -- canonical JSON bytes
    created_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX versions_by_workflow ON versions(workflow_id, seq);
CREATE TRIGGER versions_parent_same_workflow BEFORE INSERT ON versions
WHEN NEW.parent IS NOT NULL
 AND NEW.workflow_id IS NOT (SELECT workflow_id FROM versions WHERE version = NEW.parent)
BEGIN SELECT RAISE(ABORT, 'poimen: a version''s parent must be a stored version of the same workflow'); END;
CREATE TRIGGER versions_no_update BEFORE UPDATE ON versions
BEGIN SELECT RAISE(ABORT, 'poimen: versions are immutable'); END;
CREATE TRIGGER versions_no_delete BEFORE DELETE ON versions
BEGIN SELECT RAISE(ABORT, 'poimen: versions are never deleted'); END;

CREATE TABLE blobs (
    -- Content-addressed bytes: prompts, outputs, run inputs.
    hash  TEXT PRIMARY KEY CHECK (length(hash) = 67 AND hash GLOB 'b3:*'),  -- blake3(bytes)
    size  INTEGER NOT NULL,
    bytes BLOB NOT NULL
) STRICT;
CREATE TRIGGER blobs_no_update BEFORE UPDATE ON blobs
BEGIN SELECT RAISE(ABORT, 'poimen: blobs are immutable'); END;
CREATE TRIGGER blobs_no_delete BEFORE DELETE ON blobs
BEGIN SELECT RAISE(ABORT, 'poimen: blobs are never deleted'); END;

CREATE TABLE runs (
    -- One row per run. Identity columns never change; status, reason,
    -- output_hash, updated_at, owner and claimed_at do.
    seq             INTEGER PRIMARY KEY,           -- creation order
    id              TEXT NOT NULL UNIQUE CHECK (id GLOB 'WFR-*'),
    workflow_id     TEXT NOT NULL,                 -- the version's workflow_id
    version         TEXT NOT NULL REFERENCES versions(version),
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'waiting_judgment',
                        'blocked', 'completed', 'failed', 'cancelled')),
    reason          TEXT,
    input_hash      TEXT NOT NULL REFERENCES blobs(hash),
    output_hash     TEXT REFERENCES blobs(hash),
    idempotency_key TEXT UNIQUE,
    parent_run      TEXT REFERENCES runs(id),
    parent_step     TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    owner           TEXT,                          -- host id holding the lease
    claimed_at      INTEGER,
    CHECK ((parent_run IS NULL) = (parent_step IS NULL))
) STRICT;
CREATE INDEX runs_by_status ON runs(status, seq);
CREATE INDEX runs_by_workflow ON runs(workflow_id, seq);
CREATE INDEX runs_by_parent ON runs(parent_run, seq) WHERE parent_run IS NOT NULL;
CREATE INDEX runs_by_owner ON runs(owner, seq) WHERE owner IS NOT NULL;
CREATE TRIGGER runs_workflow_of_version BEFORE INSERT ON runs
WHEN NEW.workflow_id IS NOT (SELECT workflow_id FROM versions WHERE version = NEW.version)
BEGIN SELECT RAISE(ABORT, 'poimen: a run''s workflow_id must be its version''s'); END;
CREATE TRIGGER runs_identity_immutable BEFORE UPDATE OF seq, id, workflow_id, version, input_hash,
    idempotency_key, parent_run, parent_step, created_at ON runs
BEGIN SELECT RAISE(ABORT, 'poimen: a run''s identity is immutable'); END;
CREATE TRIGGER runs_final BEFORE UPDATE OF status, output_hash ON runs
WHEN OLD.status IN ('completed', 'cancelled')
 AND (NEW.status IS NOT OLD.status OR NEW.output_hash IS NOT OLD.output_hash)
BEGIN SELECT RAISE(ABORT, 'poimen: a completed or cancelled run is final'); END;
CREATE TRIGGER runs_no_delete BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'poimen: runs are never deleted'); END;

CREATE TABLE events (
    -- Episodes: each run's append-only event log, seq 0, 1, 2, ... without gaps.
    run  TEXT NOT NULL REFERENCES runs(id),
    seq  INTEGER NOT NULL CHECK (seq >= 0),
    at   INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL CHECK (json_valid(body)),
    PRIMARY KEY (run, seq)
) STRICT, WITHOUT ROWID;
CREATE TRIGGER events_contiguous BEFORE INSERT ON events
WHEN NEW.seq IS NOT (SELECT coalesce(max(seq) + 1, 0) FROM events WHERE run = NEW.run)
BEGIN SELECT RAISE(ABORT, 'poimen: an event''s seq must continue its run''s episode'); END;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'poimen: events are immutable'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'poimen: events are never deleted'); END;

CREATE TABLE intents (
    -- Write-ahead intent records: one row per phase of one tool call.
    id              INTEGER PRIMARY KEY,           -- write order
    run             TEXT NOT NULL REFERENCES runs(id),
    step            TEXT NOT NULL,
    iteration       INTEGER NOT NULL CHECK (iteration >= 0),
    attempt         INTEGER NOT NULL CHECK (attempt >= 0),
    phase           TEXT NOT NULL CHECK (phase IN ('pending', 'dispatched', 'committed', 'failed')),
    tool            TEXT NOT NULL,
    tool_version    TEXT NOT NULL,
    digest          TEXT NOT NULL,
    effect          TEXT NOT NULL CHECK (effect IN ('pure', 'idempotent', 'non-idempotent')),
    args_hash       TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    output_hash     TEXT,
    error           TEXT,
    record          TEXT CHECK (record IS NULL OR json_valid(record)),  -- hostcall record
    at              INTEGER NOT NULL
) STRICT;
CREATE INDEX intents_by_run ON intents(run, id);
CREATE INDEX intents_by_attempt ON intents(run, step, iteration, attempt, id);
CREATE TRIGGER intents_no_update BEFORE UPDATE ON intents
BEGIN SELECT RAISE(ABORT, 'poimen: intent records are immutable'); END;
CREATE TRIGGER intents_no_delete BEFORE DELETE ON intents
BEGIN SELECT RAISE(ABORT, 'poimen: intent records are never deleted'); END;

CREATE TABLE judgments (
    -- Judgment requests, immutable once opened.
    seq          INTEGER PRIMARY KEY,              -- open order
    id           TEXT NOT NULL UNIQUE CHECK (id GLOB 'WFJ-*'),
    run          TEXT NOT NULL REFERENCES runs(id),
    step         TEXT NOT NULL,
    iteration    INTEGER NOT NULL CHECK (iteration >= 0),
    request      TEXT NOT NULL CHECK (json_valid(request)),
    request_hash TEXT NOT NULL,
    created_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX judgments_by_run ON judgments(run, seq);
CREATE TRIGGER judgments_no_update BEFORE UPDATE ON judgments
BEGIN SELECT RAISE(ABORT, 'poimen: judgment requests are immutable'); END;
CREATE TRIGGER judgments_no_delete BEFORE DELETE ON judgments
BEGIN SELECT RAISE(ABORT, 'poimen: judgment requests are never deleted'); END;

CREATE TABLE judgment_answers (
    -- At most one answer per request (the primary key), immutable.
    judgment    TEXT PRIMARY KEY REFERENCES judgments(id),
    result      TEXT NOT NULL CHECK (json_valid(result)),
    answered_at INTEGER NOT NULL
) STRICT;
CREATE TRIGGER judgment_answers_no_update BEFORE UPDATE ON judgment_answers
BEGIN SELECT RAISE(ABORT, 'poimen: judgment answers are immutable'); END;
CREATE TRIGGER judgment_answers_no_delete BEFORE DELETE ON judgment_answers
BEGIN SELECT RAISE(ABORT, 'poimen: judgment answers are never deleted'); END;
