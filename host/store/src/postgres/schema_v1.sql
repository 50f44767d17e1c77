-- poimen store on PostgreSQL, schema version 1 (migration 1).
--
-- FROZEN once released: a database at version 1 exists on users' servers as
-- this file created it. Change the schema with a new migration, never by
-- editing this one.
--
-- The same records, rules and guards as the SQLite store at its schema 4
-- (docs/store.md), in PostgreSQL's terms:
--
-- * hashes are text `b3:` + 64 hex digits, ids are text; every name that is
--   compared or sorted is COLLATE "C" (bytewise, as SQLite and the in-memory
--   store order them, and so the prefix range of a version stays a range on
--   its unique index whatever the database's collation);
-- * times are bigint milliseconds since the Unix epoch, given by the caller;
-- * JSON is `json` (kept as written, byte for byte: `jsonb` would lose -0.0,
--   refuse \u0000 and reorder keys);
-- * append-only tables refuse UPDATE, DELETE and TRUNCATE with triggers, so
--   even a hand-written psql session cannot rewrite history by accident;
-- * NOTIFY poimen_work (sent when a transaction commits) tells serving
--   hosts, which LISTEN, that a run may have become claimable: a run
--   queued, a lease handed back, an admission slot freed, a run an
--   operator made runnable. A hint: hosts also poll.
-- * `poimen_commit` is the whole write path of a run's progress: one call,
--   one statement, one transaction, one round trip. It checks everything
--   first and raises SQLSTATE PM001 with a JSON detail naming the refusal,
--   so a refused commit writes nothing.

CREATE TABLE poimen_schema (
    -- One row per applied migration; the schema version is the highest.
    version integer PRIMARY KEY,
    name    text NOT NULL
);

-- Raises the refusal of a trigger: TG_ARGV[0] says what is refused.
CREATE FUNCTION poimen_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'poimen: %', TG_ARGV[0] USING ERRCODE = 'PM002';
END $$;

CREATE TRIGGER poimen_schema_no_update BEFORE UPDATE OR DELETE ON poimen_schema
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('applied migrations are never changed');
CREATE TRIGGER poimen_schema_no_truncate BEFORE TRUNCATE ON poimen_schema
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('applied migrations are never changed');

-- ---------------------------------------------------------------- versions

CREATE TABLE versions (
    -- The version DAG: immutable, content-addressed workflow definitions.
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- publish order
    version     text COLLATE "C" NOT NULL UNIQUE
                CHECK (length(version) = 67 AND version LIKE 'b3:%'),  -- blake3(canonical)
    workflow_id text COLLATE "C" NOT NULL,
    parent      text COLLATE "C" REFERENCES versions(version),  -- same workflow_id
    canonical   bytea NOT NULL,                                  -- canonical JSON bytes
    created_at  bigint NOT NULL
);
CREATE INDEX versions_by_workflow ON versions (workflow_id, seq);

CREATE FUNCTION poimen_versions_parent_same_workflow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.parent IS NOT NULL AND NEW.workflow_id IS DISTINCT FROM
        (SELECT workflow_id FROM versions WHERE version = NEW.parent) THEN
        RAISE EXCEPTION 'poimen: a version''s parent must be a stored version of the same workflow'
            USING ERRCODE = 'PM002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER versions_parent_same_workflow BEFORE INSERT ON versions
FOR EACH ROW EXECUTE FUNCTION poimen_versions_parent_same_workflow();
CREATE TRIGGER versions_no_update BEFORE UPDATE OR DELETE ON versions
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('versions are immutable and never deleted');
CREATE TRIGGER versions_no_truncate BEFORE TRUNCATE ON versions
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('versions are immutable and never deleted');

-- ------------------------------------------------------------------- blobs

CREATE TABLE blobs (
    -- Content-addressed bytes: prompts, outputs, run inputs.
    hash  text COLLATE "C" PRIMARY KEY CHECK (length(hash) = 67 AND hash LIKE 'b3:%'),
    size  bigint NOT NULL,
    bytes bytea NOT NULL
);
CREATE TRIGGER blobs_no_update BEFORE UPDATE OR DELETE ON blobs
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('blobs are immutable and never deleted');
CREATE TRIGGER blobs_no_truncate BEFORE TRUNCATE ON blobs
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('blobs are immutable and never deleted');

-- -------------------------------------------------------------------- runs

CREATE TABLE runs (
    -- One row per run. Identity columns never change; status, reason,
    -- output_hash, updated_at and the lease columns do.
    seq              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- creation order
    id               text COLLATE "C" NOT NULL UNIQUE CHECK (id LIKE 'WFR-%'),
    workflow_id      text COLLATE "C" NOT NULL,
    version          text COLLATE "C" NOT NULL REFERENCES versions(version),
    tenant           text COLLATE "C" NOT NULL,
    status           text NOT NULL CHECK (status IN ('queued', 'running', 'waiting_judgment',
                         'blocked', 'completed', 'failed', 'cancelled')),
    reason           text,
    input_hash       text COLLATE "C" NOT NULL REFERENCES blobs(hash),
    output_hash      text COLLATE "C" REFERENCES blobs(hash),
    idempotency_key  text COLLATE "C" UNIQUE,
    parent_run       text COLLATE "C" REFERENCES runs(id),
    parent_step      text,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    -- The lease: who holds the run (NULL: no one), the fencing epoch of the
    -- latest tenure (0: never claimed; +1 per claim; kept on release, never
    -- lowered), when another host may take it over, and when the tenure began.
    owner            text COLLATE "C",
    lease_epoch      bigint NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
    lease_expires_at bigint,
    claimed_at       bigint,
    -- Admission: the concurrency group the run is admitted under (NULL:
    -- its workflow sets no max_runs), the group's max_runs as the run's
    -- version says, and whether the run holds one of the group's slots
    -- (from the claim that admitted it until the commit that ends it).
    admission_group  text COLLATE "C",
    admission_max    integer CHECK (admission_max >= 0),
    admitted         boolean NOT NULL DEFAULT false,
    CHECK ((admission_group IS NULL) = (admission_max IS NULL)),
    CHECK (admission_group IS NOT NULL OR NOT admitted),
    CHECK ((parent_run IS NULL) = (parent_step IS NULL)),
    CHECK ((owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK (owner IS NULL OR lease_epoch > 0)
);
CREATE INDEX runs_by_status ON runs (status, seq);
CREATE INDEX runs_by_workflow ON runs (workflow_id, seq);
CREATE INDEX runs_by_tenant ON runs (tenant, seq);
CREATE INDEX runs_by_parent ON runs (parent_run, seq) WHERE parent_run IS NOT NULL;
CREATE INDEX runs_by_owner ON runs (owner, seq) WHERE owner IS NOT NULL;
-- claim_runnable: queued and running runs, oldest first.
CREATE INDEX runs_runnable ON runs (created_at, id) WHERE status IN ('queued', 'running');
-- Admission: a group's runs, for the count of its slots in use.
CREATE INDEX runs_admission ON runs (admission_group, created_at, id)
    WHERE admission_group IS NOT NULL;

CREATE FUNCTION poimen_runs_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.workflow_id IS DISTINCT FROM
        (SELECT workflow_id FROM versions WHERE version = NEW.version) THEN
        RAISE EXCEPTION 'poimen: a run''s workflow_id must be its version''s' USING ERRCODE = 'PM002';
    END IF;
    IF NEW.parent_run IS NOT NULL AND NEW.tenant IS DISTINCT FROM
        (SELECT tenant FROM runs WHERE id = NEW.parent_run) THEN
        RAISE EXCEPTION 'poimen: a child run''s tenant must be its parent run''s'
            USING ERRCODE = 'PM002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_insert BEFORE INSERT ON runs
FOR EACH ROW EXECUTE FUNCTION poimen_runs_insert();

CREATE FUNCTION poimen_runs_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.seq, NEW.id, NEW.workflow_id, NEW.version, NEW.tenant, NEW.input_hash,
        NEW.idempotency_key, NEW.parent_run, NEW.parent_step, NEW.created_at,
        NEW.admission_group, NEW.admission_max)
       IS DISTINCT FROM
       (OLD.seq, OLD.id, OLD.workflow_id, OLD.version, OLD.tenant, OLD.input_hash,
        OLD.idempotency_key, OLD.parent_run, OLD.parent_step, OLD.created_at,
        OLD.admission_group, OLD.admission_max) THEN
        RAISE EXCEPTION 'poimen: a run''s identity is immutable' USING ERRCODE = 'PM002';
    END IF;
    IF OLD.status IN ('completed', 'cancelled')
       AND (NEW.status IS DISTINCT FROM OLD.status
            OR NEW.output_hash IS DISTINCT FROM OLD.output_hash) THEN
        RAISE EXCEPTION 'poimen: a completed or cancelled run is final' USING ERRCODE = 'PM002';
    END IF;
    IF NEW.lease_epoch < OLD.lease_epoch THEN
        RAISE EXCEPTION 'poimen: a run''s lease epoch never goes back' USING ERRCODE = 'PM002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_update BEFORE UPDATE ON runs
FOR EACH ROW EXECUTE FUNCTION poimen_runs_update();
-- Admission is decided under a transaction-scoped advisory lock per group
-- (the key: the group's name hashed), so that two hosts never both see the
-- last free slot: every write that takes a slot — a held creation, a claim
-- — holds it while it counts and writes. Freeing a slot needs no lock.
CREATE FUNCTION poimen_admission_key(grp text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('poimen.admission:' || grp, 0) $$;

-- create_run: the run and its input blob, in one call. A run of an
-- admission group is refused when the group refuses when full and has
-- p_max runs not ended ('full', with their ids); a held creation gets its
-- lease only if the group has a free slot. A conflict on the id or the
-- idempotency key writes nothing ('conflict': the caller reads again).
CREATE FUNCTION poimen_create_run(
    p_id text, p_workflow text, p_version text, p_tenant text, p_input_hash text,
    p_key text, p_parent_run text, p_parent_step text, p_at bigint, p_owner text,
    p_expires bigint, p_size bigint, p_bytes bytea, p_group text, p_max integer,
    p_refuse boolean)
RETURNS TABLE (outcome text, held boolean, unended text[])
LANGUAGE plpgsql AS $$
DECLARE
    who text := p_owner;
    ids text[];
BEGIN
    IF p_group IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(poimen_admission_key(p_group));
        IF p_refuse THEN
            SELECT coalesce(array_agg(id ORDER BY created_at, id), '{}') INTO ids FROM runs
            WHERE admission_group = p_group
              AND status NOT IN ('completed', 'failed', 'cancelled');
            IF cardinality(ids) >= p_max THEN
                RETURN QUERY SELECT 'full'::text, false, ids;
                RETURN;
            END IF;
        END IF;
        IF who IS NOT NULL AND (SELECT count(*) FROM runs
                                WHERE admission_group = p_group AND admitted) >= p_max THEN
            who := NULL;
        END IF;
    END IF;
    BEGIN
        INSERT INTO blobs (hash, size, bytes) VALUES (p_input_hash, p_size, p_bytes)
        ON CONFLICT (hash) DO NOTHING;
        INSERT INTO runs (id, workflow_id, version, tenant, status, input_hash, idempotency_key,
                          parent_run, parent_step, created_at, updated_at, owner, lease_epoch,
                          lease_expires_at, claimed_at, admission_group, admission_max, admitted)
        VALUES (p_id, p_workflow, p_version, p_tenant, 'queued', p_input_hash, p_key,
                p_parent_run, p_parent_step, p_at, p_at, who,
                CASE WHEN who IS NULL THEN 0 ELSE 1 END,
                CASE WHEN who IS NULL THEN NULL ELSE p_expires END,
                CASE WHEN who IS NULL THEN NULL ELSE p_at END,
                p_group, p_max, p_group IS NOT NULL AND who IS NOT NULL);
    EXCEPTION WHEN unique_violation THEN
        RETURN QUERY SELECT 'conflict'::text, false, NULL::text[];
        RETURN;
    END;
    IF who IS NULL THEN
        -- A queued run: work for a serving host (LISTEN poimen_work).
        PERFORM pg_notify('poimen_work', '');
    END IF;
    RETURN QUERY SELECT 'created'::text, who IS NOT NULL, NULL::text[];
END $$;

-- claim_run: as rules::may_claim says, and — for a run that needs a slot of
-- its admission group — only if one is free. (NULL, true): refused;
-- (NULL, false): no such run.
CREATE FUNCTION poimen_claim_run(run_id text, who text, now_ms bigint, expires bigint)
RETURNS TABLE (claimed_epoch bigint, run_exists boolean)
LANGUAGE plpgsql AS $$
DECLARE
    grp text;
    adm boolean;
    mx integer;
BEGIN
    SELECT admission_group, admitted, admission_max INTO grp, adm, mx FROM runs WHERE id = run_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, false;
        RETURN;
    END IF;
    IF grp IS NOT NULL AND NOT adm THEN
        PERFORM pg_advisory_xact_lock(poimen_admission_key(grp));
        SELECT admitted INTO adm FROM runs WHERE id = run_id;
        IF NOT adm AND (SELECT count(*) FROM runs
                        WHERE admission_group = grp AND admitted) >= mx THEN
            RETURN QUERY SELECT NULL::bigint, true;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE runs r SET owner = who, lease_epoch = r.lease_epoch + 1,
                          lease_expires_at = expires, claimed_at = now_ms,
                          admitted = (r.admission_group IS NOT NULL)
        WHERE r.id = run_id
          AND r.status IN ('queued', 'running', 'waiting_judgment', 'blocked')
          AND (r.owner IS NULL OR r.owner = who OR r.lease_expires_at <= now_ms)
        RETURNING r.lease_epoch
    )
    SELECT (SELECT lease_epoch FROM claimed), true;
END $$;

-- claim_runnable: up to lim runs that need a driver (rules::is_runnable),
-- oldest first. First those that need no slot (no admission group, or one
-- they hold); then, group by group (oldest waiting run first), a group's
-- waiting runs oldest first while it has free slots. A group another
-- claimer is admitting at this moment is passed over (its lock is taken),
-- and a full group holds back no other. SKIP LOCKED passes over rows
-- another claim or a commit holds.
CREATE FUNCTION poimen_claim_runnable(who text, now_ms bigint, expires bigint, lim integer)
RETURNS SETOF runs
LANGUAGE plpgsql AS $$
DECLARE
    taken bigint := 0;
    g record;
    c record;
    used bigint;
BEGIN
    RETURN QUERY
    UPDATE runs r SET owner = who, lease_epoch = r.lease_epoch + 1,
                      lease_expires_at = expires, claimed_at = now_ms
    FROM (SELECT id FROM runs
          WHERE status IN ('queued', 'running')
            AND (owner IS NULL OR lease_expires_at <= now_ms)
            AND (admission_group IS NULL OR admitted)
          ORDER BY created_at, id
          LIMIT lim
          FOR NO KEY UPDATE SKIP LOCKED) picked
    WHERE r.id = picked.id
    RETURNING r.*;
    GET DIAGNOSTICS taken = ROW_COUNT;
    FOR g IN SELECT admission_group AS grp, min(created_at) AS first FROM runs
             WHERE status IN ('queued', 'running') AND admission_group IS NOT NULL
               AND NOT admitted AND (owner IS NULL OR lease_expires_at <= now_ms)
             GROUP BY admission_group ORDER BY first, admission_group LOOP
        EXIT WHEN taken >= lim;
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(poimen_admission_key(g.grp));
        SELECT count(*) INTO used FROM runs WHERE admission_group = g.grp AND admitted;
        FOR c IN SELECT id, admission_max FROM runs
                 WHERE admission_group = g.grp AND NOT admitted
                   AND status IN ('queued', 'running')
                   AND (owner IS NULL OR lease_expires_at <= now_ms)
                 ORDER BY created_at, id
                 FOR NO KEY UPDATE SKIP LOCKED LOOP
            EXIT WHEN taken >= lim OR used >= c.admission_max;
            RETURN QUERY
            UPDATE runs r SET owner = who, lease_epoch = r.lease_epoch + 1,
                              lease_expires_at = expires, claimed_at = now_ms, admitted = true
            WHERE r.id = c.id
            RETURNING r.*;
            used := used + 1;
            taken := taken + 1;
        END LOOP;
    END LOOP;
END $$;

CREATE TRIGGER runs_no_delete BEFORE DELETE ON runs
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('runs are never deleted');
CREATE TRIGGER runs_no_truncate BEFORE TRUNCATE ON runs
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('runs are never deleted');

-- ------------------------------------------------------------------ events

CREATE TABLE events (
    -- Episodes: each run's append-only event log, seq 0, 1, 2, ... without gaps.
    run  text COLLATE "C" NOT NULL REFERENCES runs(id),
    seq  bigint NOT NULL CHECK (seq >= 0),
    at   bigint NOT NULL,
    kind text NOT NULL,
    body json NOT NULL,
    PRIMARY KEY (run, seq)
);

CREATE FUNCTION poimen_events_contiguous() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A row trigger sees the rows its statement inserted before this one.
    IF NEW.seq IS DISTINCT FROM
        (SELECT coalesce(max(seq) + 1, 0) FROM events WHERE run = NEW.run) THEN
        RAISE EXCEPTION 'poimen: an event''s seq must continue its run''s episode'
            USING ERRCODE = 'PM002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER events_contiguous BEFORE INSERT ON events
FOR EACH ROW EXECUTE FUNCTION poimen_events_contiguous();
CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('events are immutable and never deleted');
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('events are immutable and never deleted');

-- ----------------------------------------------------------------- intents

CREATE TABLE intents (
    -- Write-ahead intent records: one row per phase of one tool call.
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- write order
    run             text COLLATE "C" NOT NULL REFERENCES runs(id),
    step            text NOT NULL,
    iteration       bigint NOT NULL CHECK (iteration >= 0),
    attempt         bigint NOT NULL CHECK (attempt >= 0),
    phase           text NOT NULL CHECK (phase IN ('pending', 'dispatched', 'committed',
                        'failed', 'abandoned')),
    tool            text NOT NULL,
    tool_version    text NOT NULL,
    digest          text NOT NULL,
    effect          text NOT NULL CHECK (effect IN ('pure', 'idempotent', 'non-idempotent')),
    args_hash       text NOT NULL,
    idempotency_key text NOT NULL,
    output_hash     text,
    error           text,
    record          json,                           -- the sandbox's hostcall record
    at              bigint NOT NULL
);
CREATE INDEX intents_by_attempt ON intents (run, step, iteration, attempt, id);
CREATE TRIGGER intents_no_update BEFORE UPDATE OR DELETE ON intents
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('intent records are immutable and never deleted');
CREATE TRIGGER intents_no_truncate BEFORE TRUNCATE ON intents
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('intent records are immutable and never deleted');

-- The intent protocol (rules::intent_may_follow, which a unit test holds
-- this to, pair by pair): pending → dispatched (again after a crash) →
-- committed | failed | abandoned; failed may follow pending; nothing
-- follows committed, failed or abandoned.
CREATE FUNCTION poimen_intent_may_follow(previous text, next text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN previous IS NULL THEN next = 'pending'
        WHEN previous IN ('pending', 'dispatched') AND next IN ('dispatched', 'failed') THEN true
        WHEN previous = 'dispatched' AND next IN ('committed', 'abandoned') THEN true
        ELSE false
    END IS TRUE
$$;

-- --------------------------------------------------------------- judgments

CREATE TABLE judgments (
    -- Judgment requests, immutable once opened.
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- open order
    id           text COLLATE "C" NOT NULL UNIQUE CHECK (id LIKE 'WFJ-%'),
    run          text COLLATE "C" NOT NULL REFERENCES runs(id),
    step         text NOT NULL,
    iteration    bigint NOT NULL CHECK (iteration >= 0),
    request      json NOT NULL,
    request_hash text NOT NULL,
    created_at   bigint NOT NULL
);
CREATE INDEX judgments_by_run ON judgments (run, seq);
CREATE TRIGGER judgments_no_update BEFORE UPDATE OR DELETE ON judgments
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('judgment requests are immutable and never deleted');
CREATE TRIGGER judgments_no_truncate BEFORE TRUNCATE ON judgments
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('judgment requests are immutable and never deleted');

CREATE TABLE judgment_answers (
    -- At most one answer per request (the primary key), immutable.
    judgment    text COLLATE "C" PRIMARY KEY REFERENCES judgments(id),
    result      json NOT NULL,
    answered_at bigint NOT NULL
);
CREATE TRIGGER judgment_answers_no_update BEFORE UPDATE OR DELETE ON judgment_answers
FOR EACH ROW EXECUTE FUNCTION poimen_refuse('judgment answers are immutable and never deleted');
CREATE TRIGGER judgment_answers_no_truncate BEFORE TRUNCATE ON judgment_answers
FOR EACH STATEMENT EXECUTE FUNCTION poimen_refuse('judgment answers are immutable and never deleted');

-- ------------------------------------------------------------------ commit

-- Refuses the commit under way: SQLSTATE PM001, the refusal as JSON in the
-- detail (`kind` and its fields), read back by the store as a StoreError.
-- Raising rolls the whole statement back: nothing of the commit is written.
CREATE FUNCTION poimen_refuse_commit(refusal json) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'poimen: commit refused (%)', refusal->>'kind'
        USING ERRCODE = 'PM001', DETAIL = refusal::text;
END $$;

-- One commit of one run (records::Commit as JSON; JSON-valued fields —
-- event bodies, hostcall records, judgment requests and results — are JSON
-- text inside JSON strings, so they are stored byte for byte), with its
-- blobs as two parallel arrays (hashes computed by the caller, bytes).
-- Validates in the order the other backends do — the run exists, the
-- fence, the episode's next seq, the intent protocol, the judgments, a final
-- run, the output blob — then writes everything.
CREATE FUNCTION poimen_commit(c json, blob_hashes text[], blob_bytes bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    run_id     text := c->>'run';
    fence      json := c->'fence';
    upd        json := c->'run_update';
    cur        record;
    next_seq   bigint;
    first_seq  numeric;
    i          json;
    j          json;
    call_key   text;
    prev       text;
    phases     jsonb := '{}';
    opened     text[] := '{}';
    answered   text[] := '{}';
    stored_run text;
    stored_answered boolean;
    out_hash   text;
BEGIN
    IF json_typeof(fence) = 'null' THEN
        fence := NULL;
    END IF;
    IF json_typeof(upd) = 'null' THEN
        upd := NULL;
    END IF;
    IF c->>'durability' = 'buffered' THEN
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

    first_seq := (c->'events'->0->>'seq')::numeric;
    IF first_seq IS NOT NULL THEN
        SELECT coalesce(max(seq) + 1, 0) INTO next_seq FROM events WHERE run = run_id;
        IF first_seq <> next_seq THEN
            PERFORM poimen_refuse_commit(json_build_object(
                'kind', 'sequence_conflict', 'expected', next_seq, 'got', first_seq));
        END IF;
    END IF;

    FOR i IN SELECT e FROM json_array_elements(c->'intents') e LOOP
        call_key := json_build_array(i->>'step', i->'iteration', i->'attempt')::text;
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

    FOR j IN SELECT e FROM json_array_elements(c->'judgments') e LOOP
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
    FROM json_array_elements(c->'events') WITH ORDINALITY AS t(e, n) ORDER BY n;

    INSERT INTO intents (run, step, iteration, attempt, phase, tool, tool_version, digest, effect,
                         args_hash, idempotency_key, output_hash, error, record, at)
    SELECT run_id, e->>'step', (e->>'iteration')::bigint, (e->>'attempt')::bigint, e->>'phase',
           e->>'tool', e->>'tool_version', e->>'digest', e->>'effect', e->>'args_hash',
           e->>'idempotency_key', e->>'output_hash', e->>'error', (e->>'record')::json,
           (e->>'at')::bigint
    FROM json_array_elements(c->'intents') WITH ORDINALITY AS t(e, n) ORDER BY n;

    -- A request opened in this commit precedes its answer (the checks above
    -- refuse an answer to a request not yet opened), so opens go first.
    INSERT INTO judgments (id, run, step, iteration, request, request_hash, created_at)
    SELECT e->>'id', run_id, e->>'step', (e->>'iteration')::bigint, (e->>'request')::json,
           e->>'request_hash', (e->>'at')::bigint
    FROM json_array_elements(c->'judgments') WITH ORDINALITY AS t(e, n)
    WHERE e->>'op' = 'open' ORDER BY n;
    INSERT INTO judgment_answers (judgment, result, answered_at)
    SELECT e->>'id', (e->>'result')::json, (e->>'at')::bigint
    FROM json_array_elements(c->'judgments') WITH ORDINALITY AS t(e, n)
    WHERE e->>'op' = 'answer' ORDER BY n;

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
END $$;
