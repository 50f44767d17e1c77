//! The SQL behind each [`Store`](crate::Store) operation, as blocking
//! functions over one connection (inside the caller's transaction for
//! writes), and the conversions between rows and records.
//!
//! Values read back are parsed strictly: a stored hash, id, status or JSON
//! text that does not parse is reported as [`StoreError::Corrupt`], never
//! papered over. This module knows nothing of threads, pools or durability.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use poimen_workflow::{StepId, VersionPrefix, WorkflowId, WorkflowVersion};
use rusqlite::{Connection, OptionalExtension, Row, ToSql, params};
use serde_json::Value;

use super::errors::sql_error;
use crate::codec::{bad_value, effect_name, json_value, parse, parse_effect, to_lease, to_u32};
use crate::error::StoreError;
use crate::ids::{BlobHash, HASH_PREFIX, JudgmentId, RunId};
use crate::records::{
    Admission, ArmedRecord, Commit, CreateRun, GcReport, IntentPhase, IntentRecord, JudgmentRecord,
    JudgmentStatus, JudgmentWrite, Lease, NewRun, NewVersion, PublishOutcome, RunFilter, RunRecord,
    RunStatus, StoredEvent, VersionRecord, WorkflowSummary, expiry,
};
use crate::rules;

type Result<T> = std::result::Result<T, StoreError>;

/// `.at(path)`: a rusqlite result as a store result.
pub(crate) trait At<T> {
    fn at(self, path: &Path) -> Result<T>;
}

impl<T> At<T> for rusqlite::Result<T> {
    fn at(self, path: &Path) -> Result<T> {
        self.map_err(|e| sql_error(path, e))
    }
}

fn to_i64(p: &Path, what: &str, n: u64) -> Result<i64> {
    i64::try_from(n).map_err(|_| StoreError::Sqlite {
        path: p.to_owned(),
        code: -1,
        message: format!("{what} {n} is larger than the store can hold"),
    })
}

fn json_text(p: &Path, v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Sqlite {
        path: p.to_owned(),
        code: -1,
        message: format!("cannot encode JSON: {e}"),
    })
}

fn collect<R, T>(
    c: &Connection,
    p: &Path,
    sql: &str,
    params: impl rusqlite::Params,
    row: impl FnMut(&Row<'_>) -> rusqlite::Result<R>,
    convert: impl Fn(R) -> Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = c.prepare_cached(sql).at(p)?;
    let raws: Vec<R> = stmt
        .query_map(params, row)
        .and_then(|rows| rows.collect())
        .at(p)?;
    raws.into_iter().map(convert).collect()
}

fn exists(c: &Connection, p: &Path, sql: &str, params: impl rusqlite::Params) -> Result<bool> {
    c.prepare_cached(sql)
        .and_then(|mut s| s.exists(params))
        .at(p)
}

// ---------------------------------------------------------------- versions

const VERSION_COLS: &str = "version, parent, workflow_id, canonical, created_at";

type RawVersion = (String, Option<String>, String, Vec<u8>, i64);

fn raw_version(r: &Row<'_>) -> rusqlite::Result<RawVersion> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn to_version(p: &Path, raw: RawVersion) -> Result<VersionRecord> {
    let (version, parent, workflow_id, canonical, created_at) = raw;
    let rec = VersionRecord {
        version: parse(p, "version", &version)?,
        parent: parent.map(|s| parse(p, "parent version", &s)).transpose()?,
        workflow_id: WorkflowId(workflow_id),
        canonical,
        created_at,
    };
    rules::verify_version(rec, p)
}

pub(crate) fn publish_version(c: &Connection, p: &Path, new: NewVersion) -> Result<PublishOutcome> {
    // The stored record is compared as it is, without re-hashing it first:
    // different bytes under the version is reported as the conflict it is.
    let sql = format!("SELECT {VERSION_COLS} FROM versions WHERE version = ?1");
    let stored = c
        .prepare_cached(&sql)
        .and_then(|mut s| {
            s.query_row([new.version.to_string()], raw_version)
                .optional()
        })
        .at(p)?;
    if let Some((version, parent, workflow_id, canonical, created_at)) = stored {
        let stored = VersionRecord {
            version: parse(p, "version", &version)?,
            parent: parent.map(|s| parse(p, "parent version", &s)).transpose()?,
            workflow_id: WorkflowId(workflow_id),
            canonical,
            created_at,
        };
        return rules::republish(stored, &new);
    }
    let parent_workflow = match new.parent {
        None => None,
        Some(parent) => c
            .prepare_cached("SELECT workflow_id FROM versions WHERE version = ?1")
            .and_then(|mut s| {
                s.query_row([parent.to_string()], |r| r.get::<_, String>(0))
                    .optional()
            })
            .at(p)?
            .map(WorkflowId),
    };
    rules::check_parent(&new, parent_workflow)?;
    c.prepare_cached(
        "INSERT INTO versions (version, parent, workflow_id, canonical, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut s| {
        s.execute(params![
            new.version.to_string(),
            new.parent.map(|v| v.to_string()),
            new.workflow_id.as_str(),
            new.canonical,
            new.created_at
        ])
    })
    .at(p)?;
    Ok(PublishOutcome::Created(VersionRecord {
        version: new.version,
        parent: new.parent,
        workflow_id: new.workflow_id,
        canonical: new.canonical,
        created_at: new.created_at,
    }))
}

pub(crate) fn version(
    c: &Connection,
    p: &Path,
    v: &WorkflowVersion,
) -> Result<Option<VersionRecord>> {
    let sql = format!("SELECT {VERSION_COLS} FROM versions WHERE version = ?1");
    let raw = c
        .prepare_cached(&sql)
        .and_then(|mut s| s.query_row([v.to_string()], raw_version).optional())
        .at(p)?;
    raw.map(|r| to_version(p, r)).transpose()
}

pub(crate) fn resolve_prefix(
    c: &Connection,
    p: &Path,
    prefix: &VersionPrefix,
) -> Result<WorkflowVersion> {
    // Hex digits sort below `g`, so [prefix, prefix + "g") is exactly the
    // versions that start with the prefix, and the unique index serves it.
    let low = format!("{HASH_PREFIX}{}", prefix.hex());
    let high = format!("{low}g");
    let found = collect(
        c,
        p,
        "SELECT version FROM versions WHERE version >= ?1 AND version < ?2
         ORDER BY version LIMIT ?3",
        params![low, high, rules::MAX_PREFIX_CANDIDATES as i64],
        |r| r.get::<_, String>(0),
        |s| parse::<WorkflowVersion>(p, "version", &s),
    )?;
    match found.len() {
        0 => Err(StoreError::not_found(format!(
            "a version starting with {prefix}"
        ))),
        1 => Ok(found[0]),
        _ => Err(StoreError::AmbiguousPrefix {
            prefix: prefix.clone(),
            candidates: found,
        }),
    }
}

pub(crate) fn versions_of(c: &Connection, p: &Path, w: &WorkflowId) -> Result<Vec<VersionRecord>> {
    let sql = format!("SELECT {VERSION_COLS} FROM versions WHERE workflow_id = ?1 ORDER BY seq");
    collect(c, p, &sql, [w.as_str()], raw_version, |r| to_version(p, r))
}

pub(crate) fn latest_version(
    c: &Connection,
    p: &Path,
    w: &WorkflowId,
) -> Result<Option<VersionRecord>> {
    let sql = format!(
        "SELECT {VERSION_COLS} FROM versions WHERE workflow_id = ?1 ORDER BY seq DESC LIMIT 1"
    );
    let raw = c
        .prepare_cached(&sql)
        .and_then(|mut s| s.query_row([w.as_str()], raw_version).optional())
        .at(p)?;
    raw.map(|r| to_version(p, r)).transpose()
}

pub(crate) fn workflows(c: &Connection, p: &Path) -> Result<Vec<WorkflowSummary>> {
    collect(
        c,
        p,
        "SELECT workflow_id, count(*),
                (SELECT l.version FROM versions l WHERE l.workflow_id = v.workflow_id
                 ORDER BY l.seq DESC LIMIT 1)
         FROM versions v GROUP BY workflow_id ORDER BY workflow_id",
        [],
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
            ))
        },
        |(w, n, latest)| {
            Ok(WorkflowSummary {
                workflow_id: WorkflowId(w),
                versions: n.unsigned_abs(),
                latest: parse(p, "version", &latest)?,
            })
        },
    )
}

// ------------------------------------------------------------------- blobs

pub(crate) fn put_blob(c: &Connection, p: &Path, bytes: &[u8]) -> Result<BlobHash> {
    let h = BlobHash::of(bytes);
    c.prepare_cached(
        "INSERT INTO blobs (hash, size, bytes) VALUES (?1, ?2, ?3) ON CONFLICT (hash) DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![h.to_string(), bytes.len() as i64, bytes]))
    .at(p)?;
    Ok(h)
}

fn blob_exists(c: &Connection, p: &Path, h: &BlobHash) -> Result<bool> {
    exists(c, p, "SELECT 1 FROM blobs WHERE hash = ?1", [h.to_string()])
}

pub(crate) fn blob(c: &Connection, p: &Path, h: &BlobHash) -> Result<Option<Vec<u8>>> {
    let bytes = c
        .prepare_cached("SELECT bytes FROM blobs WHERE hash = ?1")
        .and_then(|mut s| {
            s.query_row([h.to_string()], |r| r.get::<_, Vec<u8>>(0))
                .optional()
        })
        .at(p)?;
    bytes.map(|b| rules::verify_blob(h, b, p)).transpose()
}

// -------------------------------------------------------------------- runs

const RUN_COLS: &str = "id, workflow_id, version, status, reason, input_hash, output_hash, \
                        idempotency_key, parent_run, parent_step, created_at, updated_at, owner, \
                        tenant, lease_epoch, lease_expires_at, admission_group, admission_max, \
                        admitted, wake_at";

struct RawRun {
    id: String,
    workflow_id: String,
    version: String,
    status: String,
    reason: Option<String>,
    input_hash: String,
    output_hash: Option<String>,
    idempotency_key: Option<String>,
    parent_run: Option<String>,
    parent_step: Option<String>,
    created_at: i64,
    updated_at: i64,
    owner: Option<String>,
    tenant: String,
    lease_epoch: i64,
    lease_expires_at: Option<i64>,
    admission_group: Option<String>,
    admission_max: Option<i64>,
    admitted: bool,
    wake_at: Option<i64>,
}

fn raw_run(r: &Row<'_>) -> rusqlite::Result<RawRun> {
    Ok(RawRun {
        id: r.get(0)?,
        workflow_id: r.get(1)?,
        version: r.get(2)?,
        status: r.get(3)?,
        reason: r.get(4)?,
        input_hash: r.get(5)?,
        output_hash: r.get(6)?,
        idempotency_key: r.get(7)?,
        parent_run: r.get(8)?,
        parent_step: r.get(9)?,
        created_at: r.get(10)?,
        updated_at: r.get(11)?,
        owner: r.get(12)?,
        tenant: r.get(13)?,
        lease_epoch: r.get(14)?,
        lease_expires_at: r.get(15)?,
        admission_group: r.get(16)?,
        admission_max: r.get(17)?,
        admitted: r.get(18)?,
        wake_at: r.get(19)?,
    })
}

fn to_run(p: &Path, r: RawRun) -> Result<RunRecord> {
    let parent = match (r.parent_run, r.parent_step) {
        (Some(run), Some(step)) => Some((parse(p, "parent run id", &run)?, StepId(step))),
        _ => None,
    };
    let id: RunId = parse(p, "run id", &r.id)?;
    let lease = to_lease(p, &id, r.owner, r.lease_epoch, r.lease_expires_at)?;
    let admission = match (r.admission_group, r.admission_max) {
        (Some(group), Some(max)) => Some(Admission {
            group,
            max_runs: u32::try_from(max).map_err(|_| bad_value(p, "admission max", max))?,
        }),
        _ => None,
    };
    Ok(RunRecord {
        id,
        workflow_id: WorkflowId(r.workflow_id),
        version: parse(p, "version", &r.version)?,
        tenant: r.tenant,
        status: RunStatus::parse(&r.status).ok_or_else(|| bad_value(p, "run status", &r.status))?,
        reason: r.reason,
        input_hash: parse(p, "input hash", &r.input_hash)?,
        output_hash: r
            .output_hash
            .map(|h| parse(p, "output hash", &h))
            .transpose()?,
        idempotency_key: r.idempotency_key,
        parent,
        created_at: r.created_at,
        updated_at: r.updated_at,
        lease,
        admission,
        admitted: r.admitted,
        wake_at: r.wake_at,
    })
}

fn runs_where(
    c: &Connection,
    p: &Path,
    clause: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<RunRecord>> {
    let sql = format!("SELECT {RUN_COLS} FROM runs WHERE {clause}");
    collect(c, p, &sql, params, raw_run, |r| to_run(p, r))
}

fn one_run(c: &Connection, p: &Path, clause: &str, param: &str) -> Result<Option<RunRecord>> {
    Ok(runs_where(c, p, clause, [param])?.into_iter().next())
}

pub(crate) fn create_run(c: &Connection, p: &Path, new: NewRun) -> Result<CreateRun> {
    let input_hash = BlobHash::of(&new.input);
    if let Some(existing) = one_run(c, p, "id = ?1", new.id.as_str())? {
        return rules::recreate(existing, &new, input_hash);
    }
    if let Some(key) = &new.idempotency_key
        && let Some(existing) = one_run(c, p, "idempotency_key = ?1", key)?
    {
        return rules::reuse_key(existing, &new, input_hash);
    }
    let workflow_id = c
        .prepare_cached("SELECT workflow_id FROM versions WHERE version = ?1")
        .and_then(|mut s| {
            s.query_row([new.version.to_string()], |r| r.get::<_, String>(0))
                .optional()
        })
        .at(p)?
        .map(WorkflowId)
        .ok_or_else(|| StoreError::not_found(format!("workflow version {}", new.version)))?;
    if let Some((parent, _)) = &new.parent {
        let parent_tenant = c
            .prepare_cached("SELECT tenant FROM runs WHERE id = ?1")
            .and_then(|mut s| {
                s.query_row([parent.as_str()], |r| r.get::<_, String>(0))
                    .optional()
            })
            .at(p)?
            .ok_or_else(|| StoreError::not_found(format!("parent run {parent}")))?;
        rules::check_parent_tenant(&new, &parent_tenant)?;
    }
    // A group that refuses when full counts every run not yet ended; a held
    // creation takes a slot if one is free, else waits queued.
    let mut held = new.lease.as_ref();
    if let Some(a) = &new.admission {
        if a.refuse_when_full {
            let unended: Vec<String> = collect(
                c,
                p,
                "SELECT id FROM runs WHERE admission_group = ?1
                   AND status NOT IN ('completed', 'failed', 'cancelled')
                 ORDER BY created_at, id",
                [a.group.as_str()],
                |r| r.get::<_, String>(0),
                Ok,
            )?;
            if unended.len() >= a.max_runs as usize {
                let active = unended
                    .iter()
                    .map(|id| parse(p, "run id", id))
                    .collect::<Result<Vec<RunId>>>()?;
                return Err(rules::admission_full(a, active));
            }
        }
        if admitted_in(c, p, &a.group)? >= i64::from(a.max_runs) {
            held = None;
        }
    }
    put_blob(c, p, &new.input)?;
    let lease = held.map(|l| Lease {
        run: new.id.clone(),
        owner: l.owner.clone(),
        epoch: 1,
        expires_at: expiry(new.created_at, l.ttl_ms),
    });
    c.prepare_cached(
        "INSERT INTO runs (id, workflow_id, version, status, input_hash, idempotency_key,
                           parent_run, parent_step, created_at, updated_at, owner, claimed_at,
                           tenant, lease_epoch, lease_expires_at, admission_group,
                           admission_max, admitted)
         VALUES (?1, ?2, ?3, 'queued', ?4, ?5, ?6, ?7, ?8, ?8, ?9,
                 CASE WHEN ?9 IS NULL THEN NULL ELSE ?8 END, ?10,
                 CASE WHEN ?9 IS NULL THEN 0 ELSE 1 END, ?11, ?12, ?13,
                 ?12 IS NOT NULL AND ?9 IS NOT NULL)",
    )
    .and_then(|mut s| {
        s.execute(params![
            new.id.as_str(),
            workflow_id.as_str(),
            new.version.to_string(),
            input_hash.to_string(),
            new.idempotency_key,
            new.parent.as_ref().map(|(r, _)| r.as_str()),
            new.parent.as_ref().map(|(_, s)| s.as_str()),
            new.created_at,
            lease.as_ref().map(|l| l.owner.as_str()),
            new.tenant,
            lease.as_ref().map(|l| l.expires_at),
            new.admission.as_ref().map(|a| a.group.as_str()),
            new.admission.as_ref().map(|a| i64::from(a.max_runs)),
        ])
    })
    .at(p)?;
    Ok(CreateRun::Created(RunRecord {
        id: new.id,
        workflow_id,
        version: new.version,
        tenant: new.tenant,
        status: RunStatus::Queued,
        reason: None,
        input_hash,
        output_hash: None,
        idempotency_key: new.idempotency_key,
        parent: new.parent,
        created_at: new.created_at,
        updated_at: new.created_at,
        admitted: new.admission.is_some() && lease.is_some(),
        admission: new.admission.as_ref().map(|a| a.admission()),
        lease,
        wake_at: None,
    }))
}

pub(crate) fn run(c: &Connection, p: &Path, id: &RunId) -> Result<Option<RunRecord>> {
    one_run(c, p, "id = ?1", id.as_str())
}

/// The `WHERE` clause of `f` (but its `limit`), and its parameters: only
/// the set fields, so the planner picks the index of the one that selects.
fn run_filter(f: &RunFilter, with_status: bool) -> (String, Vec<Box<dyn ToSql>>) {
    let mut clause: Vec<&str> = vec!["1 = 1"];
    let mut args: Vec<Box<dyn ToSql>> = Vec::new();
    let mut add = |sql: &'static str, arg: Box<dyn ToSql>| {
        clause.push(sql);
        args.push(arg);
    };
    if with_status && let Some(s) = f.status {
        add("status = ?", Box::new(s.as_str()));
    }
    if let Some(w) = &f.workflow_id {
        add("workflow_id = ?", Box::new(w.as_str().to_owned()));
    }
    if let Some(p) = &f.parent {
        add("parent_run = ?", Box::new(p.as_str().to_owned()));
    }
    if let Some(t) = &f.tenant {
        add("tenant = ?", Box::new(t.clone()));
    }
    if let Some(v) = &f.version {
        add("version = ?", Box::new(v.to_string()));
    }
    if let Some(k) = &f.idempotency_key {
        add("idempotency_key = ?", Box::new(k.clone()));
    }
    if let Some(t) = f.created_from {
        add("created_at >= ?", Box::new(t));
    }
    if let Some(t) = f.created_until {
        add("created_at < ?", Box::new(t));
    }
    if with_status && let Some(b) = &f.before {
        add(
            "seq < coalesce((SELECT seq FROM runs WHERE id = ?), 0)",
            Box::new(b.as_str().to_owned()),
        );
    }
    (clause.join(" AND "), args)
}

pub(crate) fn list_runs(c: &Connection, p: &Path, f: &RunFilter) -> Result<Vec<RunRecord>> {
    let (clause, mut args) = run_filter(f, true);
    args.push(Box::new(f.limit.map_or(-1, i64::from)));
    runs_where(
        c,
        p,
        &format!("{clause} ORDER BY seq DESC LIMIT ?"),
        rusqlite::params_from_iter(args.iter()),
    )
}

pub(crate) fn count_runs(c: &Connection, p: &Path, f: &RunFilter) -> Result<Vec<(RunStatus, u64)>> {
    let (clause, args) = run_filter(f, false);
    let counts = collect(
        c,
        p,
        &format!("SELECT status, count(*) FROM runs WHERE {clause} GROUP BY status"),
        rusqlite::params_from_iter(args.iter()),
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        |(s, n)| {
            let status = RunStatus::parse(&s).ok_or_else(|| bad_value(p, "run status", &s))?;
            Ok((status, u64::try_from(n).unwrap_or(0)))
        },
    )?;
    let mut counts = counts;
    counts.sort_by_key(|(s, _)| RunStatus::ALL.iter().position(|x| x == s));
    Ok(counts)
}

pub(crate) fn children(c: &Connection, p: &Path, parent: &RunId) -> Result<Vec<RunRecord>> {
    runs_where(c, p, "parent_run = ?1 ORDER BY seq", [parent.as_str()])
}

const IN_FLIGHT: &str = "status IN ('queued', 'running', 'waiting_judgment', 'blocked')";

pub(crate) fn in_flight_runs(c: &Connection, p: &Path) -> Result<Vec<RunRecord>> {
    runs_where(c, p, &format!("{IN_FLIGHT} ORDER BY seq"), [])
}

pub(crate) fn runs_owned_by(c: &Connection, p: &Path, owner: &str) -> Result<Vec<RunRecord>> {
    runs_where(
        c,
        p,
        &format!("owner = ?1 AND {IN_FLIGHT} ORDER BY seq"),
        [owner],
    )
}

/// A run's status and lease, read inside the caller's transaction.
fn run_lease(c: &Connection, p: &Path, run: &RunId) -> Result<(RunStatus, Option<Lease>)> {
    let raw = c
        .prepare_cached(
            "SELECT status, owner, lease_epoch, lease_expires_at FROM runs WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([run.as_str()], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })
            .optional()
        })
        .at(p)?
        .ok_or_else(|| StoreError::not_found(format!("run {run}")))?;
    let (status, owner, epoch, expires_at) = raw;
    let status = RunStatus::parse(&status).ok_or_else(|| bad_value(p, "run status", &status))?;
    Ok((status, to_lease(p, run, owner, epoch, expires_at)?))
}

/// Starts a new tenure of `run` for `owner`: the next epoch, until `expires_at`.
fn start_tenure(
    c: &Connection,
    p: &Path,
    run: &RunId,
    owner: &str,
    now: i64,
    expires_at: i64,
) -> Result<Lease> {
    let epoch: i64 = c
        .prepare_cached(
            "UPDATE runs SET owner = ?2, lease_epoch = lease_epoch + 1, lease_expires_at = ?3,
                 claimed_at = ?4, admitted = (admission_group IS NOT NULL), wake_at = NULL
             WHERE id = ?1 RETURNING lease_epoch",
        )
        .and_then(|mut s| s.query_row(params![run.as_str(), owner, expires_at, now], |r| r.get(0)))
        .at(p)?;
    Ok(Lease {
        run: run.clone(),
        owner: owner.to_owned(),
        epoch: u64::try_from(epoch).map_err(|_| bad_value(p, "lease epoch", epoch))?,
        expires_at,
    })
}

pub(crate) fn claim_run(
    c: &Connection,
    p: &Path,
    run: &RunId,
    owner: &str,
    now: i64,
    ttl_ms: i64,
) -> Result<Option<Lease>> {
    let (status, current) = run_lease(c, p, run)?;
    if !rules::may_claim(status, current.as_ref(), owner, now) || !has_slot(c, p, run)? {
        return Ok(None);
    }
    start_tenure(c, p, run, owner, now, expiry(now, ttl_ms)).map(Some)
}

/// Whether `run` may be claimed as far as its admission group goes: it
/// holds a slot already, needs none, or one of its group's is free.
fn has_slot(c: &Connection, p: &Path, run: &RunId) -> Result<bool> {
    c.prepare_cached(
        "SELECT r.admission_group IS NULL OR r.admitted = 1
                OR (SELECT count(*) FROM runs a
                    WHERE a.admission_group = r.admission_group AND a.admitted = 1)
                   < r.admission_max
         FROM runs r WHERE r.id = ?1",
    )
    .and_then(|mut s| s.query_row([run.as_str()], |r| r.get(0)))
    .at(p)
}

/// How many runs of `group` hold a slot.
fn admitted_in(c: &Connection, p: &Path, group: &str) -> Result<i64> {
    c.prepare_cached("SELECT count(*) FROM runs WHERE admission_group = ?1 AND admitted = 1")
        .and_then(|mut s| s.query_row([group], |r| r.get(0)))
        .at(p)
}

pub(crate) fn claim_runnable(
    c: &Connection,
    p: &Path,
    owner: &str,
    now: i64,
    ttl_ms: i64,
    limit: u32,
) -> Result<Vec<(RunRecord, Lease)>> {
    // Runnable as `rules::is_runnable` says, oldest first, in two parts:
    // runs that need no slot (no admission group, or one they hold) — the
    // partial index runs_runnable holds queued and running runs in this
    // order, so that scan stops after `limit` (without statistics SQLite
    // would pick runs_by_status and sort, hence INDEXED BY) — and runs
    // waiting for a slot of their group, taken only as far as the group has
    // free slots, oldest first (k counts a group's waiting runs; the scan
    // reads waiting grouped runs only). A full group holds back no other.
    let sql = format!(
        "SELECT {RUN_COLS} FROM (
             SELECT * FROM (
                 SELECT {RUN_COLS} FROM runs INDEXED BY runs_runnable
                 WHERE status IN ('queued', 'running')
                   AND (owner IS NULL OR lease_expires_at <= ?1)
                   AND (admission_group IS NULL OR admitted = 1)
                 ORDER BY created_at, id LIMIT ?2)
             UNION ALL
             SELECT {RUN_COLS} FROM (
                 SELECT *, row_number() OVER (
                     PARTITION BY admission_group ORDER BY created_at, id) AS k
                 FROM runs INDEXED BY runs_admission
                 WHERE admission_group IS NOT NULL AND admitted = 0
                   AND status IN ('queued', 'running')
                   AND (owner IS NULL OR lease_expires_at <= ?1)
             ) w
             WHERE w.k <= w.admission_max - (SELECT count(*) FROM runs a
                                             WHERE a.admission_group = w.admission_group
                                               AND a.admitted = 1)
             UNION ALL
             SELECT {RUN_COLS} FROM (
                 SELECT {RUN_COLS} FROM runs INDEXED BY runs_wake
                 WHERE wake_at <= ?1 AND status IN ('waiting_judgment', 'blocked')
                   AND (owner IS NULL OR lease_expires_at <= ?1)
                 ORDER BY wake_at LIMIT ?2)
         )
         ORDER BY created_at, id LIMIT ?2"
    );
    let candidates = collect(c, p, &sql, params![now, i64::from(limit)], raw_run, |r| {
        to_run(p, r)
    })?;
    let expires_at = expiry(now, ttl_ms);
    candidates
        .into_iter()
        .filter(|r| rules::is_runnable(r.status, r.lease.as_ref(), r.wake_at, now))
        .map(|mut r| {
            let lease = start_tenure(c, p, &r.id, owner, now, expires_at)?;
            r.lease = Some(lease.clone());
            r.admitted = r.admission.is_some();
            r.wake_at = None;
            Ok((r, lease))
        })
        .collect()
}

pub(crate) fn renew_lease(
    c: &Connection,
    p: &Path,
    lease: &Lease,
    now: i64,
    ttl_ms: i64,
) -> Result<Lease> {
    let (_, current) = run_lease(c, p, &lease.run)?;
    rules::check_renewal(lease, current.as_ref())?;
    let renewed = Lease {
        expires_at: expiry(now, ttl_ms),
        ..lease.clone()
    };
    c.prepare_cached("UPDATE runs SET lease_expires_at = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![lease.run.as_str(), renewed.expires_at]))
        .at(p)?;
    Ok(renewed)
}

pub(crate) fn release_lease(c: &Connection, p: &Path, lease: &Lease) -> Result<()> {
    let (_, current) = run_lease(c, p, &lease.run)?;
    if rules::holds(current.as_ref(), &lease.fence()) {
        c.prepare_cached("UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE id = ?1")
            .and_then(|mut s| s.execute([lease.run.as_str()]))
            .at(p)?;
    }
    Ok(())
}

// ------------------------------------------------------------------ commit

type AttemptKey = (String, u32, u32);

fn last_phase(
    c: &Connection,
    p: &Path,
    run: &RunId,
    key: &AttemptKey,
) -> Result<Option<IntentPhase>> {
    let phase = c
        .prepare_cached(
            "SELECT phase FROM intents WHERE run = ?1 AND step = ?2 AND iteration = ?3
             AND attempt = ?4 ORDER BY id DESC LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row(params![run.as_str(), key.0, key.1, key.2], |r| {
                r.get::<_, String>(0)
            })
            .optional()
        })
        .at(p)?;
    phase
        .map(|s| IntentPhase::parse(&s).ok_or_else(|| bad_value(p, "intent phase", &s)))
        .transpose()
}

/// Validates and writes a commit inside the caller's transaction. Any error
/// leaves the transaction to be rolled back.
pub(crate) fn commit(c: &Connection, p: &Path, commit: &Commit) -> Result<()> {
    let run = &commit.run;
    let (status, output, owner, epoch, expires_at) = c
        .prepare_cached(
            "SELECT status, output_hash, owner, lease_epoch, lease_expires_at
             FROM runs WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([run.as_str()], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<i64>>(4)?,
                ))
            })
            .optional()
        })
        .at(p)?
        .ok_or_else(|| StoreError::not_found(format!("run {run}")))?;
    // The fence first, under the write lock: a host that lost the run hears
    // that, not whatever its stale view of the episode would conflict with.
    if commit.fence.is_some() {
        let current = to_lease(p, run, owner, epoch, expires_at)?;
        rules::check_fence(commit, current.as_ref())?;
    }
    let status = RunStatus::parse(&status).ok_or_else(|| bad_value(p, "run status", &status))?;
    let output: Option<BlobHash> = output.map(|h| parse(p, "output hash", &h)).transpose()?;

    let next: i64 = c
        .prepare_cached("SELECT coalesce(max(seq) + 1, 0) FROM events WHERE run = ?1")
        .and_then(|mut s| s.query_row([run.as_str()], |r| r.get(0)))
        .at(p)?;
    rules::check_first_seq(commit, next.unsigned_abs())?;

    let mut phases: HashMap<AttemptKey, IntentPhase> = HashMap::new();
    for i in &commit.intents {
        let key = (i.step.0.clone(), i.iteration, i.attempt);
        let prev = match phases.get(&key) {
            Some(ph) => Some(*ph),
            None => last_phase(c, p, run, &key)?,
        };
        if !rules::intent_may_follow(prev, i.phase) {
            return Err(rules::intent_out_of_order(i, prev));
        }
        phases.insert(key, i.phase);
    }

    let mut opened: HashSet<&JudgmentId> = HashSet::new();
    let mut answered: HashSet<&JudgmentId> = HashSet::new();
    for j in &commit.judgments {
        match j {
            JudgmentWrite::Open { id, .. } => {
                let stored = exists(c, p, "SELECT 1 FROM judgments WHERE id = ?1", [id.as_str()])?;
                if stored || !opened.insert(id) {
                    return Err(StoreError::JudgmentConflict {
                        id: id.clone(),
                        detail: "a request with this id already exists".into(),
                    });
                }
            }
            JudgmentWrite::Answer { id, .. } | JudgmentWrite::Expire { id, .. } => {
                let stored = c
                    .prepare_cached(
                        "SELECT j.run, a.judgment IS NOT NULL, x.judgment IS NOT NULL
                         FROM judgments j
                         LEFT JOIN judgment_answers a ON a.judgment = j.id
                         LEFT JOIN judgment_expiries x ON x.judgment = j.id WHERE j.id = ?1",
                    )
                    .and_then(|mut s| {
                        s.query_row([id.as_str()], |r| {
                            Ok((
                                r.get::<_, String>(0)?,
                                r.get::<_, bool>(1)?,
                                r.get::<_, bool>(2)?,
                            ))
                        })
                        .optional()
                    })
                    .at(p)?;
                match stored {
                    None if !opened.contains(id) => {
                        return Err(StoreError::not_found(format!("judgment request {id}")));
                    }
                    Some((owner, _, _)) if owner != run.as_str() => {
                        return Err(StoreError::JudgmentConflict {
                            id: id.clone(),
                            detail: format!("it belongs to run {owner}, not to run {run}"),
                        });
                    }
                    Some((_, true, _)) => return Err(answered_twice(id)),
                    Some((_, _, true)) => return Err(rules::expired(id)),
                    _ => {}
                }
                if !answered.insert(id) {
                    return Err(answered_twice(id));
                }
            }
        }
    }

    rules::check_run_update(commit, status, output)?;

    // Every check passed: write.
    for b in &commit.blobs {
        put_blob(c, p, b)?;
    }
    if let Some(h) = commit.run_update.as_ref().and_then(|u| u.output_hash)
        && !blob_exists(c, p, &h)?
    {
        return Err(StoreError::not_found(format!("output blob {h}")));
    }
    {
        let mut ins = c
            .prepare_cached(
                "INSERT INTO events (run, seq, at, kind, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .at(p)?;
        for e in &commit.events {
            ins.execute(params![
                run.as_str(),
                to_i64(p, "event seq", e.seq)?,
                e.at,
                e.kind,
                e.body.as_str()
            ])
            .at(p)?;
        }
    }
    {
        let mut ins = c
            .prepare_cached(
                "INSERT INTO intents (run, step, iteration, attempt, phase, tool, tool_version,
                    digest, effect, args_hash, idempotency_key, output_hash, error, record, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
            )
            .at(p)?;
        for i in &commit.intents {
            let record = i.record.as_ref().map(|v| json_text(p, v)).transpose()?;
            ins.execute(params![
                run.as_str(),
                i.step.as_str(),
                i.iteration,
                i.attempt,
                i.phase.as_str(),
                i.tool,
                i.tool_version,
                i.digest,
                effect_name(i.effect),
                i.args_hash,
                i.idempotency_key,
                i.output_hash,
                i.error,
                record,
                i.at
            ])
            .at(p)?;
        }
    }
    for j in &commit.judgments {
        match j {
            JudgmentWrite::Open {
                id,
                step,
                iteration,
                request,
                request_hash,
                at,
            } => {
                let request = json_text(p, request)?;
                c.prepare_cached(
                    "INSERT INTO judgments (id, run, step, iteration, request, request_hash, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        id.as_str(),
                        run.as_str(),
                        step.as_str(),
                        iteration,
                        request,
                        request_hash,
                        at
                    ])
                })
                .at(p)?
            }
            JudgmentWrite::Answer { id, result, at } => {
                let result = json_text(p, result)?;
                c.prepare_cached(
                    "INSERT INTO judgment_answers (judgment, result, answered_at) VALUES (?1, ?2, ?3)",
                )
                .and_then(|mut s| s.execute(params![id.as_str(), result, at]))
                .at(p)?
            }
            JudgmentWrite::Expire { id, at } => c
                .prepare_cached("INSERT INTO judgment_expiries (judgment, at) VALUES (?1, ?2)")
                .and_then(|mut s| s.execute(params![id.as_str(), at]))
                .at(p)?,
        };
    }
    if let Some(u) = &commit.run_update {
        c.prepare_cached(
            // The commit that ends a run ends its tenure (the epoch stays).
            "UPDATE runs SET status = ?2, reason = ?3, output_hash = ?4, updated_at = ?5,
                owner = CASE WHEN ?6 THEN NULL ELSE owner END,
                lease_expires_at = CASE WHEN ?6 THEN NULL ELSE lease_expires_at END,
                admitted = CASE WHEN ?6 THEN 0 ELSE admitted END,
                wake_at = CASE WHEN ?6 THEN NULL ELSE ?7 END
             WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.execute(params![
                run.as_str(),
                u.status.as_str(),
                u.reason,
                u.output_hash.map(|h| h.to_string()),
                u.updated_at,
                u.status.is_terminal(),
                u.wake_at
            ])
        })
        .at(p)?;
    }
    Ok(())
}

// ------------------------------------------------------------------ timers

pub(crate) fn set_wake(c: &Connection, p: &Path, run: &RunId, at: Option<i64>) -> Result<()> {
    let changed = c
        .prepare_cached(
            "UPDATE runs SET wake_at = ?2
             WHERE id = ?1 AND status NOT IN ('completed', 'failed', 'cancelled')",
        )
        .and_then(|mut s| s.execute(params![run.as_str(), at]))
        .at(p)?;
    if changed == 0 && self::run(c, p, run)?.is_none() {
        return Err(StoreError::NotFound {
            what: format!("run {run}"),
        });
    }
    Ok(())
}

pub(crate) fn next_wake(c: &Connection, p: &Path) -> Result<Option<i64>> {
    c.prepare_cached(
        "SELECT min(wake_at) FROM runs INDEXED BY runs_wake
         WHERE wake_at IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')",
    )
    .and_then(|mut s| s.query_row([], |r| r.get(0)))
    .at(p)
}

// ------------------------------------------------------ arming, unloading

pub(crate) fn arm(
    c: &Connection,
    p: &Path,
    workflow: &WorkflowId,
    version: Option<&WorkflowVersion>,
    at: i64,
) -> Result<Option<ArmedRecord>> {
    if let Some(v) = version {
        match self::version(c, p, v)? {
            None => {
                return Err(StoreError::NotFound {
                    what: format!("version {v}"),
                });
            }
            Some(rec) if rec.workflow_id != *workflow => {
                return Err(StoreError::ArmOtherWorkflow {
                    version: *v,
                    its_workflow: rec.workflow_id,
                    workflow: workflow.clone(),
                });
            }
            Some(_) => {}
        }
    }
    let before = armed(c, p, workflow)?;
    c.prepare_cached(
        "INSERT INTO armed (workflow_id, version, at) VALUES (?1, ?2, ?3)
         ON CONFLICT (workflow_id) DO UPDATE SET version = excluded.version, at = excluded.at",
    )
    .and_then(|mut s| {
        s.execute(params![
            workflow.as_str(),
            version.map(ToString::to_string),
            at
        ])
    })
    .at(p)?;
    Ok(before)
}

pub(crate) fn armed(
    c: &Connection,
    p: &Path,
    workflow: &WorkflowId,
) -> Result<Option<ArmedRecord>> {
    let row: Option<(Option<String>, i64)> = c
        .prepare_cached("SELECT version, at FROM armed WHERE workflow_id = ?1")
        .and_then(|mut s| {
            s.query_row([workflow.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .at(p)?;
    row.map(|(version, at)| {
        Ok(ArmedRecord {
            workflow_id: workflow.clone(),
            version: version.map(|v| parse(p, "armed version", &v)).transpose()?,
            at,
        })
    })
    .transpose()
}

pub(crate) fn set_unload_deadline(
    c: &Connection,
    p: &Path,
    version: &WorkflowVersion,
    deadline: i64,
    at: i64,
) -> Result<()> {
    if self::version(c, p, version)?.is_none() {
        return Err(StoreError::NotFound {
            what: format!("version {version}"),
        });
    }
    c.prepare_cached(
        "INSERT INTO unloads (version, deadline, at) VALUES (?1, ?2, ?3)
         ON CONFLICT (version) DO UPDATE SET deadline = excluded.deadline, at = excluded.at",
    )
    .and_then(|mut s| s.execute(params![version.to_string(), deadline, at]))
    .at(p)?;
    Ok(())
}

pub(crate) fn unload_deadline(
    c: &Connection,
    p: &Path,
    version: &WorkflowVersion,
) -> Result<Option<i64>> {
    c.prepare_cached("SELECT deadline FROM unloads WHERE version = ?1")
        .and_then(|mut s| s.query_row([version.to_string()], |r| r.get(0)).optional())
        .at(p)
}

fn answered_twice(id: &JudgmentId) -> StoreError {
    StoreError::JudgmentConflict {
        id: id.clone(),
        detail: "the request is already answered".into(),
    }
}

// ------------------------------------------------------------------- reads

pub(crate) fn events(
    c: &Connection,
    p: &Path,
    run: &RunId,
    after: Option<u64>,
) -> Result<Vec<StoredEvent>> {
    let after: i64 = match after {
        None => -1,
        Some(s) => i64::try_from(s).unwrap_or(i64::MAX),
    };
    collect(
        c,
        p,
        "SELECT seq, at, kind, body FROM events WHERE run = ?1 AND seq > ?2 ORDER BY seq",
        params![run.as_str(), after],
        |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        },
        |(seq, at, kind, body)| {
            Ok(StoredEvent {
                run: run.clone(),
                seq: u64::try_from(seq).map_err(|_| bad_value(p, "event seq", seq))?,
                at,
                body: json_value(p, "an event body", &body)?,
                kind,
            })
        },
    )
}

struct RawIntent {
    step: String,
    iteration: i64,
    attempt: i64,
    phase: String,
    tool: String,
    tool_version: String,
    digest: String,
    effect: String,
    args_hash: String,
    idempotency_key: String,
    output_hash: Option<String>,
    error: Option<String>,
    record: Option<String>,
    at: i64,
}

pub(crate) fn intents(c: &Connection, p: &Path, run: &RunId) -> Result<Vec<IntentRecord>> {
    collect(
        c,
        p,
        "SELECT step, iteration, attempt, phase, tool, tool_version, digest, effect, args_hash,
                idempotency_key, output_hash, error, record, at
         FROM intents WHERE run = ?1 ORDER BY id",
        [run.as_str()],
        |r| {
            Ok(RawIntent {
                step: r.get(0)?,
                iteration: r.get(1)?,
                attempt: r.get(2)?,
                phase: r.get(3)?,
                tool: r.get(4)?,
                tool_version: r.get(5)?,
                digest: r.get(6)?,
                effect: r.get(7)?,
                args_hash: r.get(8)?,
                idempotency_key: r.get(9)?,
                output_hash: r.get(10)?,
                error: r.get(11)?,
                record: r.get(12)?,
                at: r.get(13)?,
            })
        },
        |i| {
            Ok(IntentRecord {
                run: run.clone(),
                step: StepId(i.step),
                iteration: to_u32(p, "intent iteration", i.iteration)?,
                attempt: to_u32(p, "intent attempt", i.attempt)?,
                phase: IntentPhase::parse(&i.phase)
                    .ok_or_else(|| bad_value(p, "intent phase", &i.phase))?,
                tool: i.tool,
                tool_version: i.tool_version,
                digest: i.digest,
                effect: parse_effect(p, &i.effect)?,
                args_hash: i.args_hash,
                idempotency_key: i.idempotency_key,
                output_hash: i.output_hash,
                error: i.error,
                record: i
                    .record
                    .map(|s| json_value(p, "a hostcall record", &s))
                    .transpose()?,
                at: i.at,
            })
        },
    )
}

const JUDGMENT_SELECT: &str = "SELECT j.id, j.run, j.step, j.iteration, j.request, j.request_hash,
        j.created_at, a.result, a.answered_at, x.at
    FROM judgments j LEFT JOIN judgment_answers a ON a.judgment = j.id
    LEFT JOIN judgment_expiries x ON x.judgment = j.id";

type RawJudgment = (
    String,
    String,
    String,
    i64,
    String,
    String,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

fn raw_judgment(r: &Row<'_>) -> rusqlite::Result<RawJudgment> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
    ))
}

fn to_judgment(p: &Path, raw: RawJudgment) -> Result<JudgmentRecord> {
    let (
        id,
        run,
        step,
        iteration,
        request,
        request_hash,
        created_at,
        result,
        answered_at,
        expired_at,
    ) = raw;
    Ok(JudgmentRecord {
        id: parse(p, "judgment id", &id)?,
        run: parse(p, "run id", &run)?,
        step: StepId(step),
        iteration: to_u32(p, "judgment iteration", iteration)?,
        request: json_value(p, "a judgment request", &request)?,
        request_hash,
        status: match (&result, expired_at) {
            (Some(_), _) => JudgmentStatus::Answered,
            (None, Some(_)) => JudgmentStatus::Expired,
            (None, None) => JudgmentStatus::Open,
        },
        result: result
            .map(|s| json_value(p, "a judgment result", &s))
            .transpose()?,
        created_at,
        answered_at,
        expired_at,
    })
}

pub(crate) fn judgment(
    c: &Connection,
    p: &Path,
    id: &JudgmentId,
) -> Result<Option<JudgmentRecord>> {
    let sql = format!("{JUDGMENT_SELECT} WHERE j.id = ?1");
    Ok(collect(c, p, &sql, [id.as_str()], raw_judgment, |r| {
        to_judgment(p, r)
    })?
    .into_iter()
    .next())
}

pub(crate) fn open_judgments(c: &Connection, p: &Path) -> Result<Vec<JudgmentRecord>> {
    // A request of a run that ended (cancelled, failed) is no longer open:
    // nobody can answer it.
    let sql = format!(
        "{JUDGMENT_SELECT} JOIN runs r ON r.id = j.run
         WHERE a.judgment IS NULL AND x.judgment IS NULL
           AND r.status NOT IN ('completed', 'failed', 'cancelled')
         ORDER BY j.seq"
    );
    collect(c, p, &sql, [], raw_judgment, |r| to_judgment(p, r))
}

// --------------------------------------------------------------- retention

/// The runs gc may delete, into `gc_runs`: every run of each tree whose
/// root is a top-level run that ended before `before`, if every run of
/// the tree has ended.
const GC_PICK_RUNS: &str = "
    WITH RECURSIVE tree(root, id) AS (
        SELECT id, id FROM runs
        WHERE parent_run IS NULL AND updated_at < ?1
          AND status IN ('completed', 'failed', 'cancelled')
        UNION ALL
        SELECT tree.root, runs.id FROM runs JOIN tree ON runs.parent_run = tree.id
    )
    INSERT INTO gc_runs (run)
    SELECT id FROM tree
    WHERE root NOT IN (
        SELECT tree.root FROM tree JOIN runs ON runs.id = tree.id
        WHERE runs.status NOT IN ('completed', 'failed', 'cancelled'))";

fn count(c: &Connection, p: &Path, sql: &str) -> Result<u64> {
    let n: i64 = c
        .prepare_cached(sql)
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .at(p)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Every blob hash the rows selected by `sql` (one text column each) name.
fn hashes_named(c: &Connection, p: &Path, sql: &str, into: &mut HashSet<String>) -> Result<()> {
    let mut stmt = c.prepare_cached(sql).at(p)?;
    let mut rows = stmt.query([]).at(p)?;
    while let Some(row) = rows.next().at(p)? {
        let text: Option<String> = row.get(0).at(p)?;
        if let Some(text) = text {
            into.extend(crate::ids::hashes_in(&text).map(str::to_owned));
        }
    }
    Ok(())
}

/// Texts that may name blobs, of the runs in `gc_runs` (`IN`) or of every
/// other run (`NOT IN`).
fn blob_references(c: &Connection, p: &Path, which: &str) -> Result<HashSet<String>> {
    let mut found = HashSet::new();
    let runs = "(SELECT run FROM gc_runs)";
    for sql in [
        format!("SELECT input_hash FROM runs WHERE id {which} {runs}"),
        format!("SELECT output_hash FROM runs WHERE id {which} {runs}"),
        format!(
            "SELECT output_hash FROM intents WHERE run {which} {runs} AND output_hash IS NOT NULL"
        ),
        format!("SELECT record FROM intents WHERE run {which} {runs} AND instr(record, 'b3:') > 0"),
        format!("SELECT body FROM events WHERE run {which} {runs} AND instr(body, 'b3:') > 0"),
        format!("SELECT request FROM judgments WHERE run {which} {runs}"),
        format!(
            "SELECT result FROM judgment_answers WHERE judgment IN
             (SELECT id FROM judgments WHERE run {which} {runs})"
        ),
    ] {
        hashes_named(c, p, &sql, &mut found)?;
    }
    Ok(found)
}

pub(crate) fn gc(c: &Connection, p: &Path, before: i64, dry_run: bool) -> Result<GcReport> {
    c.execute("DELETE FROM gc_runs", []).at(p)?;
    c.execute("DELETE FROM gc_blobs", []).at(p)?;
    c.prepare_cached(GC_PICK_RUNS)
        .and_then(|mut s| s.execute([before]))
        .at(p)?;
    let doomed = "(SELECT run FROM gc_runs)";
    let mut report = GcReport {
        dry_run,
        runs: count(c, p, "SELECT count(*) FROM gc_runs")?,
        events: count(
            c,
            p,
            &format!("SELECT count(*) FROM events WHERE run IN {doomed}"),
        )?,
        intents: count(
            c,
            p,
            &format!("SELECT count(*) FROM intents WHERE run IN {doomed}"),
        )?,
        judgments: count(
            c,
            p,
            &format!("SELECT count(*) FROM judgments WHERE run IN {doomed}"),
        )?,
        ..GcReport::default()
    };
    if report.runs > 0 {
        let named = blob_references(c, p, "IN")?;
        let kept = blob_references(c, p, "NOT IN")?;
        let mut insert = c
            .prepare_cached(
                "INSERT OR IGNORE INTO gc_blobs (hash) SELECT hash FROM blobs WHERE hash = ?1",
            )
            .at(p)?;
        for hash in named.difference(&kept) {
            insert.execute([hash]).at(p)?;
        }
        report.blobs = count(c, p, "SELECT count(*) FROM gc_blobs")?;
        report.blob_bytes = count(
            c,
            p,
            "SELECT coalesce(sum(size), 0) FROM blobs WHERE hash IN (SELECT hash FROM gc_blobs)",
        )?;
    }
    if !dry_run && report.runs > 0 {
        for sql in [
            "DELETE FROM judgment_answers WHERE judgment IN
             (SELECT id FROM judgments WHERE run IN (SELECT run FROM gc_runs))",
            "DELETE FROM judgment_expiries WHERE judgment IN
             (SELECT id FROM judgments WHERE run IN (SELECT run FROM gc_runs))",
            "DELETE FROM judgments WHERE run IN (SELECT run FROM gc_runs)",
            "DELETE FROM intents WHERE run IN (SELECT run FROM gc_runs)",
            "DELETE FROM events WHERE run IN (SELECT run FROM gc_runs)",
        ] {
            c.execute(sql, []).at(p)?;
        }
        // Children before parents: a run's parent_run refers to its parent.
        loop {
            let deleted = c
                .execute(
                    "DELETE FROM runs WHERE id IN (SELECT run FROM gc_runs)
                     AND id NOT IN (SELECT parent_run FROM runs WHERE parent_run IS NOT NULL)",
                    [],
                )
                .at(p)?;
            if deleted == 0 {
                break;
            }
        }
        c.execute(
            "DELETE FROM blobs WHERE hash IN (SELECT hash FROM gc_blobs)",
            [],
        )
        .at(p)?;
    }
    c.execute("DELETE FROM gc_runs", []).at(p)?;
    c.execute("DELETE FROM gc_blobs", []).at(p)?;
    Ok(report)
}
