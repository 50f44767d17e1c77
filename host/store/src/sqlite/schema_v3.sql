-- poimen store, schema version 3 (migration 3).
--
-- 1. Runs belong to a tenant. Every run stored before this migration belongs
--    to the default tenant, 'default'. The tenant is part of a run's
--    identity (runs_identity_immutable is recreated to cover it), and a child
--    run belongs to its parent's tenant (runs_child_same_tenant; the store
--    checks the same first and answers TenantMismatch). Idempotency keys stay
--    global to the store: runs.idempotency_key keeps its UNIQUE constraint.
--
-- 2. An intent phase 'abandoned': the run was cancelled while the call was
--    dispatched, and its outcome is unknown. The CHECK on intents.phase is
--    part of the table, so the table is rebuilt: created anew as intents_v3,
--    every row copied with its id (the write order), the old table dropped
--    and the new one renamed. Its index and its two immutability triggers
--    went with the old table and are created again; intents_by_run, dropped
--    by migration 2, stays dropped. Nothing references intents, so dropping
--    it with foreign keys on deletes nothing else (and fires no trigger).

ALTER TABLE runs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
CREATE INDEX runs_by_tenant ON runs(tenant, seq);
DROP TRIGGER runs_identity_immutable;
CREATE TRIGGER runs_identity_immutable BEFORE UPDATE OF seq, id, workflow_id, version, tenant,
    input_hash, idempotency_key, parent_run, parent_step, created_at ON runs
BEGIN SELECT RAISE(ABORT, 'poimen: a run''s identity is immutable'); END;
CREATE TRIGGER runs_child_same_tenant BEFORE INSERT ON runs
WHEN NEW.parent_run IS NOT NULL
 AND NEW.tenant IS NOT (SELECT tenant FROM runs WHERE id = NEW.parent_run)
BEGIN SELECT RAISE(ABORT, 'poimen: a child run''s tenant must be its parent run''s'); END;

CREATE TABLE intents_v3 (
    -- Write-ahead intent records: one row per phase of one tool call.
    id              INTEGER PRIMARY KEY,           -- write order
    run             TEXT NOT NULL REFERENCES runs(id),
    step            TEXT NOT NULL,
    iteration       INTEGER NOT NULL CHECK (iteration >= 0),
    attempt         INTEGER NOT NULL CHECK (attempt >= 0),
    phase           TEXT NOT NULL CHECK (phase IN ('pending', 'dispatched', 'committed', 'failed',
                        'abandoned')),
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
INSERT INTO intents_v3 (id, run, step, iteration, attempt, phase, tool, tool_version, digest,
                        effect, args_hash, idempotency_key, output_hash, error, record, at)
SELECT id, run, step, iteration, attempt, phase, tool, tool_version, digest,
       effect, args_hash, idempotency_key, output_hash, error, record, at
FROM intents ORDER BY id;
DROP TABLE intents;
ALTER TABLE intents_v3 RENAME TO intents;
CREATE INDEX intents_by_attempt ON intents(run, step, iteration, attempt, id);
CREATE TRIGGER intents_no_update BEFORE UPDATE ON intents
BEGIN SELECT RAISE(ABORT, 'poimen: intent records are immutable'); END;
CREATE TRIGGER intents_no_delete BEFORE DELETE ON intents
BEGIN SELECT RAISE(ABORT, 'poimen: intent records are never deleted'); END;
