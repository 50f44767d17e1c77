//! The SQL behind each [`Store`](crate::Store) operation on PostgreSQL, as
//! async functions over one pooled connection, and the conversions between
//! rows and records.
//!
//! Values read back are parsed strictly (`codec`): a stored hash, id,
//! status or JSON text that does not parse is [`StoreError::Corrupt`]. JSON
//! columns are read as text (`::text`), so they come back byte for byte as
//! written. This module knows nothing of pools or of opening a database.

use std::path::{Path, PathBuf};

use deadpool_postgres::Object;
use poimen_workflow::{StepId, VersionPrefix, WorkflowId, WorkflowVersion};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::{Json, ToSql};

use super::at;
use super::errors::{REFUSED, pg_error};
use crate::codec::{bad_value, effect_name, json_value, parse, parse_effect, to_lease, to_u32};
use crate::error::StoreError;
use crate::ids::{BlobHash, HASH_PREFIX, JudgmentId, RunId};
use crate::records::{
    Admission, ArmedRecord, Commit, CreateRun, Durability, GcReport, IntentPhase, IntentRecord,
    JudgmentRecord, JudgmentStatus, JudgmentWrite, Lease, NewRun, NewVersion, PublishOutcome,
    RunFilter, RunRecord, RunStatus, StoredEvent, VersionRecord, WorkflowSummary, expiry,
};
use crate::rules;

type Result<T> = std::result::Result<T, StoreError>;

/// Which store a call is on, for errors: the redacted URL, and the same as
/// the `path` of the variants that name a location.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub url: String,
    pub path: PathBuf,
}

impl Ctx {
    pub(crate) fn new(url_redacted: String) -> Self {
        Ctx {
            path: PathBuf::from(&url_redacted),
            url: url_redacted,
        }
    }

    fn p(&self) -> &Path {
        &self.path
    }
}

async fn query(
    c: &Object,
    ctx: &Ctx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>> {
    let stmt = c.prepare_cached(sql).await.map_err(at(ctx))?;
    c.query(&stmt, params).await.map_err(at(ctx))
}

async fn query_opt(
    c: &Object,
    ctx: &Ctx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>> {
    let stmt = c.prepare_cached(sql).await.map_err(at(ctx))?;
    c.query_opt(&stmt, params).await.map_err(at(ctx))
}

async fn query_one(
    c: &Object,
    ctx: &Ctx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row> {
    let stmt = c.prepare_cached(sql).await.map_err(at(ctx))?;
    c.query_one(&stmt, params).await.map_err(at(ctx))
}

async fn execute(c: &Object, ctx: &Ctx, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
    let stmt = c.prepare_cached(sql).await.map_err(at(ctx))?;
    c.execute(&stmt, params).await.map_err(at(ctx))
}

/// Column `i` of `row`.
fn get<'a, T: tokio_postgres::types::FromSql<'a>>(ctx: &Ctx, row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i).map_err(|e| pg_error(&ctx.url, &e))
}

fn to_i64(ctx: &Ctx, what: &str, n: u64) -> Result<i64> {
    i64::try_from(n).map_err(|_| StoreError::Postgres {
        url_redacted: ctx.url.clone(),
        code: "client".into(),
        message: format!("{what} {n} is larger than the store can hold"),
    })
}

fn to_u64(ctx: &Ctx, what: &str, n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|_| bad_value(ctx.p(), what, n))
}

fn json_text(ctx: &Ctx, v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Postgres {
        url_redacted: ctx.url.clone(),
        code: "client".into(),
        message: format!("cannot encode JSON: {e}"),
    })
}

// ---------------------------------------------------------------- versions

const VERSION_COLS: &str = "version, parent, workflow_id, canonical, created_at";

/// A version row as stored, not yet re-hashed.
fn raw_version(ctx: &Ctx, row: &Row) -> Result<VersionRecord> {
    let p = ctx.p();
    Ok(VersionRecord {
        version: parse(p, "version", get::<&str>(ctx, row, 0)?)?,
        parent: get::<Option<&str>>(ctx, row, 1)?
            .map(|s| parse(p, "parent version", s))
            .transpose()?,
        workflow_id: WorkflowId(get(ctx, row, 2)?),
        canonical: get(ctx, row, 3)?,
        created_at: get(ctx, row, 4)?,
    })
}

fn to_version(ctx: &Ctx, row: &Row) -> Result<VersionRecord> {
    rules::verify_version(raw_version(ctx, row)?, ctx.p())
}

async fn stored_version(c: &Object, ctx: &Ctx, v: &str) -> Result<Option<VersionRecord>> {
    let sql = format!("SELECT {VERSION_COLS} FROM versions WHERE version = $1");
    query_opt(c, ctx, &sql, &[&v])
        .await?
        .map(|r| raw_version(ctx, &r))
        .transpose()
}

pub(crate) async fn publish_version(
    c: &Object,
    ctx: &Ctx,
    new: NewVersion,
) -> Result<PublishOutcome> {
    let version = new.version.to_string();
    // Compared as stored, without re-hashing: different bytes under the
    // version is reported as the conflict it is.
    if let Some(stored) = stored_version(c, ctx, &version).await? {
        return rules::republish(stored, &new);
    }
    let parent = new.parent.map(|v| v.to_string());
    let parent_workflow = match &parent {
        None => None,
        Some(pv) => query_opt(
            c,
            ctx,
            "SELECT workflow_id FROM versions WHERE version = $1",
            &[pv],
        )
        .await?
        .map(|r| get::<String>(ctx, &r, 0))
        .transpose()?
        .map(WorkflowId),
    };
    rules::check_parent(&new, parent_workflow)?;
    let inserted = execute(
        c,
        ctx,
        "INSERT INTO versions (version, parent, workflow_id, canonical, created_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (version) DO NOTHING",
        &[
            &version,
            &parent,
            &new.workflow_id.as_str(),
            &new.canonical,
            &new.created_at,
        ],
    )
    .await?;
    if inserted == 0 {
        // Another host published it between the read and the insert.
        let stored = stored_version(c, ctx, &version).await?.ok_or_else(|| {
            StoreError::not_found(format!(
                "version {version}, which a concurrent publish wrote"
            ))
        })?;
        return rules::republish(stored, &new);
    }
    Ok(PublishOutcome::Created(VersionRecord {
        version: new.version,
        parent: new.parent,
        workflow_id: new.workflow_id,
        canonical: new.canonical,
        created_at: new.created_at,
    }))
}

pub(crate) async fn version(
    c: &Object,
    ctx: &Ctx,
    v: &WorkflowVersion,
) -> Result<Option<VersionRecord>> {
    let sql = format!("SELECT {VERSION_COLS} FROM versions WHERE version = $1");
    query_opt(c, ctx, &sql, &[&v.to_string()])
        .await?
        .map(|r| to_version(ctx, &r))
        .transpose()
}

pub(crate) async fn resolve_prefix(
    c: &Object,
    ctx: &Ctx,
    prefix: &VersionPrefix,
) -> Result<WorkflowVersion> {
    // Hex digits sort below `g` in the "C" collation of the column, so
    // [prefix, prefix + "g") is exactly the versions that start with the
    // prefix, and the unique index serves it.
    let low = format!("{HASH_PREFIX}{}", prefix.hex());
    let high = format!("{low}g");
    let limit = rules::MAX_PREFIX_CANDIDATES as i64;
    let rows = query(
        c,
        ctx,
        "SELECT version FROM versions WHERE version >= $1 AND version < $2
         ORDER BY version LIMIT $3",
        &[&low, &high, &limit],
    )
    .await?;
    let found = rows
        .iter()
        .map(|r| parse::<WorkflowVersion>(ctx.p(), "version", get::<&str>(ctx, r, 0)?))
        .collect::<Result<Vec<_>>>()?;
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

pub(crate) async fn versions_of(
    c: &Object,
    ctx: &Ctx,
    w: &WorkflowId,
) -> Result<Vec<VersionRecord>> {
    let sql = format!("SELECT {VERSION_COLS} FROM versions WHERE workflow_id = $1 ORDER BY seq");
    query(c, ctx, &sql, &[&w.as_str()])
        .await?
        .iter()
        .map(|r| to_version(ctx, r))
        .collect()
}

pub(crate) async fn latest_version(
    c: &Object,
    ctx: &Ctx,
    w: &WorkflowId,
) -> Result<Option<VersionRecord>> {
    let sql = format!(
        "SELECT {VERSION_COLS} FROM versions WHERE workflow_id = $1 ORDER BY seq DESC LIMIT 1"
    );
    query_opt(c, ctx, &sql, &[&w.as_str()])
        .await?
        .map(|r| to_version(ctx, &r))
        .transpose()
}

pub(crate) async fn workflows(c: &Object, ctx: &Ctx) -> Result<Vec<WorkflowSummary>> {
    let rows = query(
        c,
        ctx,
        "SELECT workflow_id, count(*),
                (SELECT l.version FROM versions l WHERE l.workflow_id = v.workflow_id
                 ORDER BY l.seq DESC LIMIT 1)
         FROM versions v GROUP BY workflow_id ORDER BY workflow_id",
        &[],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(WorkflowSummary {
                workflow_id: WorkflowId(get(ctx, r, 0)?),
                versions: get::<i64>(ctx, r, 1)?.unsigned_abs(),
                latest: parse(ctx.p(), "version", get::<&str>(ctx, r, 2)?)?,
            })
        })
        .collect()
}

// ------------------------------------------------------------------- blobs

pub(crate) async fn put_blob(c: &Object, ctx: &Ctx, bytes: &[u8]) -> Result<BlobHash> {
    let h = BlobHash::of(bytes);
    execute(
        c,
        ctx,
        "INSERT INTO blobs (hash, size, bytes) VALUES ($1, $2, $3) ON CONFLICT (hash) DO NOTHING",
        &[&h.to_string(), &(bytes.len() as i64), &bytes],
    )
    .await?;
    Ok(h)
}

pub(crate) async fn blob(c: &Object, ctx: &Ctx, h: &BlobHash) -> Result<Option<Vec<u8>>> {
    query_opt(
        c,
        ctx,
        "SELECT bytes FROM blobs WHERE hash = $1",
        &[&h.to_string()],
    )
    .await?
    .map(|r| rules::verify_blob(h, get(ctx, &r, 0)?, ctx.p()))
    .transpose()
}

// -------------------------------------------------------------------- runs

/// The run columns, of `runs r`.
const RUN_COLS: &str = "r.id, r.workflow_id, r.version, r.tenant, r.status, r.reason, \
                        r.input_hash, r.output_hash, r.idempotency_key, r.parent_run, \
                        r.parent_step, r.created_at, r.updated_at, r.owner, r.lease_epoch, \
                        r.lease_expires_at, r.admission_group, r.admission_max, r.admitted, \
                        r.wake_at";

const IN_FLIGHT: &str = "r.status IN ('queued', 'running', 'waiting_judgment', 'blocked')";

fn to_run(ctx: &Ctx, row: &Row) -> Result<RunRecord> {
    let p = ctx.p();
    let id: RunId = parse(p, "run id", get::<&str>(ctx, row, 0)?)?;
    let status: &str = get(ctx, row, 4)?;
    let parent = match (
        get::<Option<&str>>(ctx, row, 9)?,
        get::<Option<String>>(ctx, row, 10)?,
    ) {
        (Some(run), Some(step)) => Some((parse(p, "parent run id", run)?, StepId(step))),
        _ => None,
    };
    let lease = to_lease(
        p,
        &id,
        get(ctx, row, 13)?,
        get(ctx, row, 14)?,
        get(ctx, row, 15)?,
    )?;
    let admission = match (
        get::<Option<String>>(ctx, row, 16)?,
        get::<Option<i32>>(ctx, row, 17)?,
    ) {
        (Some(group), Some(max)) => Some(Admission {
            group,
            max_runs: u32::try_from(max).map_err(|_| bad_value(p, "admission max", max))?,
        }),
        _ => None,
    };
    Ok(RunRecord {
        workflow_id: WorkflowId(get(ctx, row, 1)?),
        version: parse(p, "version", get::<&str>(ctx, row, 2)?)?,
        tenant: get(ctx, row, 3)?,
        status: RunStatus::parse(status).ok_or_else(|| bad_value(p, "run status", status))?,
        reason: get(ctx, row, 5)?,
        input_hash: parse(p, "input hash", get::<&str>(ctx, row, 6)?)?,
        output_hash: get::<Option<&str>>(ctx, row, 7)?
            .map(|h| parse(p, "output hash", h))
            .transpose()?,
        idempotency_key: get(ctx, row, 8)?,
        parent,
        created_at: get(ctx, row, 11)?,
        updated_at: get(ctx, row, 12)?,
        lease,
        admission,
        admitted: get(ctx, row, 18)?,
        wake_at: get(ctx, row, 19)?,
        id,
    })
}

async fn runs_where(
    c: &Object,
    ctx: &Ctx,
    clause: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<RunRecord>> {
    let sql = format!("SELECT {RUN_COLS} FROM runs r WHERE {clause}");
    query(c, ctx, &sql, params)
        .await?
        .iter()
        .map(|r| to_run(ctx, r))
        .collect()
}

async fn one_run(c: &Object, ctx: &Ctx, clause: &str, param: &str) -> Result<Option<RunRecord>> {
    Ok(runs_where(c, ctx, clause, &[&param])
        .await?
        .into_iter()
        .next())
}

/// How often a create that lost a race for its id or key looks again.
const CREATE_ATTEMPTS: usize = 3;

pub(crate) async fn create_run(c: &Object, ctx: &Ctx, new: NewRun) -> Result<CreateRun> {
    let input_hash = BlobHash::of(&new.input);
    let lease = new.lease.as_ref().map(|l| Lease {
        run: new.id.clone(),
        owner: l.owner.clone(),
        epoch: 1,
        expires_at: expiry(new.created_at, l.ttl_ms),
    });
    for _ in 0..CREATE_ATTEMPTS {
        if let Some(existing) = one_run(c, ctx, "r.id = $1", new.id.as_str()).await? {
            return rules::recreate(existing, &new, input_hash);
        }
        if let Some(key) = &new.idempotency_key
            && let Some(existing) = one_run(c, ctx, "r.idempotency_key = $1", key).await?
        {
            return rules::reuse_key(existing, &new, input_hash);
        }
        let workflow_id = query_opt(
            c,
            ctx,
            "SELECT workflow_id FROM versions WHERE version = $1",
            &[&new.version.to_string()],
        )
        .await?
        .map(|r| get::<String>(ctx, &r, 0))
        .transpose()?
        .map(WorkflowId)
        .ok_or_else(|| StoreError::not_found(format!("workflow version {}", new.version)))?;
        if let Some((parent, _)) = &new.parent {
            let parent_tenant: String = query_opt(
                c,
                ctx,
                "SELECT tenant FROM runs WHERE id = $1",
                &[&parent.as_str()],
            )
            .await?
            .map(|r| get(ctx, &r, 0))
            .transpose()?
            .ok_or_else(|| StoreError::not_found(format!("parent run {parent}")))?;
            rules::check_parent_tenant(&new, &parent_tenant)?;
        }
        // One call (poimen_create_run): the run and its input blob, under
        // its admission group's lock. A conflict on the id or the key —
        // another host created the run since the reads — writes nothing,
        // and the loop reads again to answer as the second writer does.
        let adm = new.admission.as_ref();
        let max: Option<i32> = adm.map(|a| i32::try_from(a.max_runs).unwrap_or(i32::MAX));
        let row = query_one(
            c,
            ctx,
            "SELECT outcome, held, unended FROM poimen_create_run(
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            &[
                &new.id.as_str(),
                &workflow_id.as_str(),
                &new.version.to_string(),
                &new.tenant,
                &input_hash.to_string(),
                &new.idempotency_key,
                &new.parent.as_ref().map(|(r, _)| r.as_str()),
                &new.parent.as_ref().map(|(_, s)| s.as_str()),
                &new.created_at,
                &lease.as_ref().map(|l| l.owner.as_str()),
                &lease.as_ref().map(|l| l.expires_at),
                &(new.input.len() as i64),
                &new.input,
                &adm.map(|a| a.group.as_str()),
                &max,
                &adm.is_some_and(|a| a.refuse_when_full),
            ],
        )
        .await?;
        let outcome: &str = get(ctx, &row, 0)?;
        match (outcome, adm) {
            ("full", Some(a)) => {
                let ids: Vec<String> = get(ctx, &row, 2)?;
                let active = ids
                    .iter()
                    .map(|id| parse(ctx.p(), "run id", id))
                    .collect::<Result<Vec<RunId>>>()?;
                return Err(rules::admission_full(a, active));
            }
            ("created", _) => {
                let held: bool = get(ctx, &row, 1)?;
                return Ok(CreateRun::Created(RunRecord {
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
                    lease: if held { lease } else { None },
                    admitted: adm.is_some() && held,
                    admission: adm.map(|a| a.admission()),
                    wake_at: None,
                }));
            }
            _ => {}
        }
    }
    // Lost the race CREATE_ATTEMPTS times over: retrying later will work.
    Err(StoreError::Busy {
        path: ctx.path.clone(),
    })
}

pub(crate) async fn run(c: &Object, ctx: &Ctx, id: &RunId) -> Result<Option<RunRecord>> {
    one_run(c, ctx, "r.id = $1", id.as_str()).await
}

/// The `WHERE` clause of `f` (but its `limit`), and its parameters: only
/// the set fields, so the planner picks the index of the one that selects.
fn run_filter(f: &RunFilter, with_status: bool) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut clause: Vec<String> = vec!["true".to_owned()];
    let mut args: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    let mut add = |sql: &str, arg: Box<dyn ToSql + Sync + Send>| {
        args.push(arg);
        clause.push(sql.replace('?', &format!("${}", args.len())));
    };
    if with_status && let Some(s) = f.status {
        add("r.status = ?", Box::new(s.as_str()));
    }
    if let Some(w) = &f.workflow_id {
        add("r.workflow_id = ?", Box::new(w.as_str().to_owned()));
    }
    if let Some(p) = &f.parent {
        add("r.parent_run = ?", Box::new(p.as_str().to_owned()));
    }
    if let Some(t) = &f.tenant {
        add("r.tenant = ?", Box::new(t.clone()));
    }
    if let Some(v) = &f.version {
        add("r.version = ?", Box::new(v.to_string()));
    }
    if let Some(k) = &f.idempotency_key {
        add("r.idempotency_key = ?", Box::new(k.clone()));
    }
    if let Some(t) = f.created_from {
        add("r.created_at >= ?", Box::new(t));
    }
    if let Some(t) = f.created_until {
        add("r.created_at < ?", Box::new(t));
    }
    if with_status && let Some(b) = &f.before {
        add(
            "r.seq < coalesce((SELECT b.seq FROM runs b WHERE b.id = ?), 0)",
            Box::new(b.as_str().to_owned()),
        );
    }
    (clause.join(" AND "), args)
}

pub(crate) async fn list_runs(c: &Object, ctx: &Ctx, f: &RunFilter) -> Result<Vec<RunRecord>> {
    let (clause, mut args) = run_filter(f, true);
    args.push(Box::new(f.limit.map(i64::from)));
    let sql = format!("{clause} ORDER BY r.seq DESC LIMIT ${}", args.len());
    let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| &**a as _).collect();
    runs_where(c, ctx, &sql, &params).await
}

pub(crate) async fn count_runs(
    c: &Object,
    ctx: &Ctx,
    f: &RunFilter,
) -> Result<Vec<(RunStatus, u64)>> {
    let (clause, args) = run_filter(f, false);
    let sql = format!("SELECT r.status, count(*) FROM runs r WHERE {clause} GROUP BY r.status");
    let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|a| &**a as _).collect();
    let mut counts = Vec::new();
    for row in query(c, ctx, &sql, &params).await? {
        let s: String = get(ctx, &row, 0)?;
        let n: i64 = get(ctx, &row, 1)?;
        let status = RunStatus::parse(&s).ok_or_else(|| bad_value(ctx.p(), "run status", &s))?;
        counts.push((status, u64::try_from(n).unwrap_or(0)));
    }
    counts.sort_by_key(|(s, _)| RunStatus::ALL.iter().position(|x| x == s));
    Ok(counts)
}

pub(crate) async fn children(c: &Object, ctx: &Ctx, parent: &RunId) -> Result<Vec<RunRecord>> {
    runs_where(
        c,
        ctx,
        "r.parent_run = $1 ORDER BY r.seq",
        &[&parent.as_str()],
    )
    .await
}

pub(crate) async fn in_flight_runs(c: &Object, ctx: &Ctx) -> Result<Vec<RunRecord>> {
    runs_where(c, ctx, &format!("{IN_FLIGHT} ORDER BY r.seq"), &[]).await
}

pub(crate) async fn set_wake(c: &Object, ctx: &Ctx, run: &RunId, at: Option<i64>) -> Result<()> {
    let row = query_one(
        c,
        ctx,
        "WITH set AS (
             UPDATE runs SET wake_at = $2
             WHERE id = $1 AND status NOT IN ('completed', 'failed', 'cancelled')
             RETURNING id)
         SELECT EXISTS (SELECT 1 FROM runs WHERE id = $1),
                -- Serving hosts look at their next timer again.
                pg_notify('poimen_work', '') IS NULL",
        &[&run.as_str(), &at],
    )
    .await?;
    if get::<bool>(ctx, &row, 0)? {
        Ok(())
    } else {
        Err(StoreError::not_found(format!("run {run}")))
    }
}

pub(crate) async fn next_wake(c: &Object, ctx: &Ctx) -> Result<Option<i64>> {
    let row = query_one(
        c,
        ctx,
        "SELECT min(wake_at) FROM runs
         WHERE wake_at IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')",
        &[],
    )
    .await?;
    get(ctx, &row, 0)
}

pub(crate) async fn arm(
    c: &Object,
    ctx: &Ctx,
    workflow: &WorkflowId,
    version: Option<&WorkflowVersion>,
    at: i64,
) -> Result<Option<ArmedRecord>> {
    if let Some(v) = version {
        match self::version(c, ctx, v).await? {
            None => return Err(StoreError::not_found(format!("version {v}"))),
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
    // The row before and after, in one statement.
    let row = query_one(
        c,
        ctx,
        "WITH before AS (SELECT version, at FROM armed WHERE workflow_id = $1),
              put AS (INSERT INTO armed (workflow_id, version, at) VALUES ($1, $2, $3)
                      ON CONFLICT (workflow_id) DO UPDATE SET version = excluded.version,
                                                               at = excluded.at
                      RETURNING 1)
         SELECT (SELECT count(*) FROM put) > 0,
                EXISTS (SELECT 1 FROM before),
                (SELECT version FROM before), (SELECT at FROM before)",
        &[&workflow.as_str(), &version.map(ToString::to_string), &at],
    )
    .await?;
    if !get::<bool>(ctx, &row, 1)? {
        return Ok(None);
    }
    Ok(Some(ArmedRecord {
        workflow_id: workflow.clone(),
        version: get::<Option<&str>>(ctx, &row, 2)?
            .map(|v| parse(ctx.p(), "armed version", v))
            .transpose()?,
        at: get(ctx, &row, 3)?,
    }))
}

pub(crate) async fn armed(
    c: &Object,
    ctx: &Ctx,
    workflow: &WorkflowId,
) -> Result<Option<ArmedRecord>> {
    query_opt(
        c,
        ctx,
        "SELECT version, at FROM armed WHERE workflow_id = $1",
        &[&workflow.as_str()],
    )
    .await?
    .map(|row| {
        Ok(ArmedRecord {
            workflow_id: workflow.clone(),
            version: get::<Option<&str>>(ctx, &row, 0)?
                .map(|v| parse(ctx.p(), "armed version", v))
                .transpose()?,
            at: get(ctx, &row, 1)?,
        })
    })
    .transpose()
}

pub(crate) async fn set_unload_deadline(
    c: &Object,
    ctx: &Ctx,
    version: &WorkflowVersion,
    deadline: i64,
    at: i64,
) -> Result<()> {
    if self::version(c, ctx, version).await?.is_none() {
        return Err(StoreError::not_found(format!("version {version}")));
    }
    execute(
        c,
        ctx,
        "INSERT INTO unloads (version, deadline, at) VALUES ($1, $2, $3)
         ON CONFLICT (version) DO UPDATE SET deadline = excluded.deadline, at = excluded.at",
        &[&version.to_string(), &deadline, &at],
    )
    .await?;
    Ok(())
}

pub(crate) async fn unload_deadline(
    c: &Object,
    ctx: &Ctx,
    version: &WorkflowVersion,
) -> Result<Option<i64>> {
    query_opt(
        c,
        ctx,
        "SELECT deadline FROM unloads WHERE version = $1",
        &[&version.to_string()],
    )
    .await?
    .map(|row| get(ctx, &row, 0))
    .transpose()
}

pub(crate) async fn runs_owned_by(c: &Object, ctx: &Ctx, owner: &str) -> Result<Vec<RunRecord>> {
    runs_where(
        c,
        ctx,
        &format!("r.owner = $1 AND {IN_FLIGHT} ORDER BY r.seq"),
        &[&owner],
    )
    .await
}

// ------------------------------------------------------------------ leases

fn lease_of(ctx: &Ctx, run: &RunId, owner: &str, epoch: i64, expires_at: i64) -> Result<Lease> {
    Ok(Lease {
        run: run.clone(),
        owner: owner.to_owned(),
        epoch: to_u64(ctx, "lease epoch", epoch)?,
        expires_at,
    })
}

pub(crate) async fn claim_run(
    c: &Object,
    ctx: &Ctx,
    run: &RunId,
    owner: &str,
    now: i64,
    ttl_ms: i64,
) -> Result<Option<Lease>> {
    // rules::may_claim and the run's admission, in one call
    // (poimen_claim_run): a claim that waited for another on the row
    // re-checks the condition against what that one wrote.
    let expires_at = expiry(now, ttl_ms);
    let row = query_one(
        c,
        ctx,
        "SELECT claimed_epoch, run_exists FROM poimen_claim_run($1, $2, $3, $4)",
        &[&run.as_str(), &owner, &now, &expires_at],
    )
    .await?;
    let epoch: Option<i64> = get(ctx, &row, 0)?;
    let exists: bool = get(ctx, &row, 1)?;
    match epoch {
        Some(epoch) => Ok(Some(lease_of(ctx, run, owner, epoch, expires_at)?)),
        None if exists => Ok(None),
        None => Err(StoreError::not_found(format!("run {run}"))),
    }
}

pub(crate) async fn claim_runnable(
    c: &Object,
    ctx: &Ctx,
    owner: &str,
    now: i64,
    ttl_ms: i64,
    limit: u32,
) -> Result<Vec<(RunRecord, Lease)>> {
    // rules::is_runnable and admission, in one call (poimen_claim_runnable):
    // SKIP LOCKED passes over rows another claim (or a commit) holds, and a
    // row another claim took since a statement's snapshot is re-checked, no
    // longer matches, and is left out.
    let expires_at = expiry(now, ttl_ms);
    let lim = i32::try_from(limit).unwrap_or(i32::MAX);
    let sql = format!("SELECT {RUN_COLS} FROM poimen_claim_runnable_v2($1, $2, $3, $4) r");
    let rows = query(c, ctx, &sql, &[&owner, &now, &expires_at, &lim]).await?;
    let mut claimed = rows
        .iter()
        .map(|row| {
            let r = to_run(ctx, row)?;
            let lease = r.lease.clone().ok_or_else(|| StoreError::Corrupt {
                path: ctx.path.clone(),
                detail: format!("run {} was claimed but reads back without a lease", r.id),
            })?;
            Ok((r, lease))
        })
        .collect::<Result<Vec<_>>>()?;
    claimed.sort_by(|(a, _), (b, _)| {
        (a.created_at, a.id.as_str()).cmp(&(b.created_at, b.id.as_str()))
    });
    Ok(claimed)
}

/// The run's lease as a statement's snapshot saw it (`None`: no holder),
/// from columns `first..first + 3` (owner, epoch, expiry).
fn holder(ctx: &Ctx, run: &RunId, row: &Row, first: usize) -> Result<Option<Lease>> {
    to_lease(
        ctx.p(),
        run,
        get(ctx, row, first)?,
        get(ctx, row, first + 1)?,
        get(ctx, row, first + 2)?,
    )
}

pub(crate) async fn renew_lease(
    c: &Object,
    ctx: &Ctx,
    lease: &Lease,
    now: i64,
    ttl_ms: i64,
) -> Result<Lease> {
    let expires_at = expiry(now, ttl_ms);
    let epoch = to_i64(ctx, "lease epoch", lease.epoch)?;
    let row = query_opt(
        c,
        ctx,
        "WITH renewed AS (
             UPDATE runs SET lease_expires_at = $4
             WHERE id = $1 AND owner = $2 AND lease_epoch = $3
             RETURNING 1
         )
         SELECT (SELECT count(*) FROM renewed), owner, lease_epoch, lease_expires_at
         FROM runs WHERE id = $1",
        &[&lease.run.as_str(), &lease.owner, &epoch, &expires_at],
    )
    .await?
    .ok_or_else(|| StoreError::not_found(format!("run {}", lease.run)))?;
    let renewed: i64 = get(ctx, &row, 0)?;
    if renewed == 1 {
        return Ok(Lease {
            expires_at,
            ..lease.clone()
        });
    }
    Err(StoreError::LeaseLost {
        run: lease.run.clone(),
        fence: lease.fence(),
        holder: holder(ctx, &lease.run, &row, 1)?,
    })
}

/// A transaction with an id and `synchronous_commit = on`: its commit
/// record waits for the WAL to be flushed through it, and so through every
/// earlier commit, the asynchronous (`Buffered`) ones included.
pub(crate) async fn sync(c: &Object, ctx: &Ctx) -> Result<()> {
    c.batch_execute("BEGIN; SET LOCAL synchronous_commit = on; SELECT txid_current(); COMMIT")
        .await
        .map_err(at(ctx))
}

pub(crate) async fn release_lease(c: &Object, ctx: &Ctx, lease: &Lease) -> Result<()> {
    let epoch = to_i64(ctx, "lease epoch", lease.epoch)?;
    let row = query_one(
        c,
        ctx,
        "WITH released AS (
             UPDATE runs SET owner = NULL, lease_expires_at = NULL
             WHERE id = $1 AND owner = $2 AND lease_epoch = $3
             RETURNING status
         )
         , hint AS (
             SELECT pg_notify('poimen_work', '') FROM released
             WHERE status IN ('queued', 'running')
         )
         SELECT EXISTS (SELECT 1 FROM runs WHERE id = $1), (SELECT count(*) FROM hint)",
        &[&lease.run.as_str(), &lease.owner, &epoch],
    )
    .await?;
    if get::<bool>(ctx, &row, 0)? {
        Ok(())
    } else {
        Err(StoreError::not_found(format!("run {}", lease.run)))
    }
}

// ------------------------------------------------------------------ commit

/// A commit as `poimen_commit` takes it. JSON-valued fields travel as JSON
/// text inside strings, so the server stores exactly these bytes.
#[derive(Debug, Serialize)]
struct CommitDoc<'a> {
    run: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<FenceDoc<'a>>,
    durability: &'static str,
    events: Vec<EventDoc<'a>>,
    intents: Vec<IntentDoc<'a>>,
    judgments: Vec<JudgmentDoc<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_update: Option<UpdateDoc<'a>>,
}

#[derive(Debug, Serialize)]
struct FenceDoc<'a> {
    owner: &'a str,
    epoch: u64,
}

#[derive(Debug, Serialize)]
struct EventDoc<'a> {
    seq: u64,
    at: i64,
    kind: &'a str,
    body: &'a str,
}

#[derive(Debug, Serialize)]
struct IntentDoc<'a> {
    step: &'a str,
    iteration: u32,
    attempt: u32,
    phase: &'static str,
    tool: &'a str,
    tool_version: &'a str,
    digest: &'a str,
    effect: &'static str,
    args_hash: &'a str,
    idempotency_key: &'a str,
    output_hash: Option<&'a str>,
    error: Option<&'a str>,
    record: Option<String>,
    at: i64,
}

#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum JudgmentDoc<'a> {
    Open {
        id: &'a str,
        step: &'a str,
        iteration: u32,
        request: String,
        request_hash: &'a str,
        at: i64,
    },
    Answer {
        id: &'a str,
        result: String,
        at: i64,
    },
    Expire {
        id: &'a str,
        at: i64,
    },
}

#[derive(Debug, Serialize)]
struct UpdateDoc<'a> {
    status: &'static str,
    reason: Option<&'a str>,
    output_hash: Option<String>,
    updated_at: i64,
    wake_at: Option<i64>,
}

fn commit_doc<'a>(ctx: &Ctx, c: &'a Commit) -> Result<CommitDoc<'a>> {
    Ok(CommitDoc {
        run: c.run.as_str(),
        fence: c.fence.as_ref().map(|f| FenceDoc {
            owner: &f.owner,
            epoch: f.epoch,
        }),
        durability: match c.durability {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
        },
        events: c
            .events
            .iter()
            .map(|e| {
                // A seq past i64::MAX never continues an episode: the server
                // compares it as a number and refuses it as a conflict.
                Ok(EventDoc {
                    seq: e.seq,
                    at: e.at,
                    kind: &e.kind,
                    body: e.body.as_str(),
                })
            })
            .collect::<Result<_>>()?,
        intents: c
            .intents
            .iter()
            .map(|i| {
                Ok(IntentDoc {
                    step: i.step.as_str(),
                    iteration: i.iteration,
                    attempt: i.attempt,
                    phase: i.phase.as_str(),
                    tool: &i.tool,
                    tool_version: &i.tool_version,
                    digest: &i.digest,
                    effect: effect_name(i.effect),
                    args_hash: &i.args_hash,
                    idempotency_key: &i.idempotency_key,
                    output_hash: i.output_hash.as_deref(),
                    error: i.error.as_deref(),
                    record: i.record.as_ref().map(|v| json_text(ctx, v)).transpose()?,
                    at: i.at,
                })
            })
            .collect::<Result<_>>()?,
        judgments: c
            .judgments
            .iter()
            .map(|j| {
                Ok(match j {
                    JudgmentWrite::Open {
                        id,
                        step,
                        iteration,
                        request,
                        request_hash,
                        at,
                    } => JudgmentDoc::Open {
                        id: id.as_str(),
                        step: step.as_str(),
                        iteration: *iteration,
                        request: json_text(ctx, request)?,
                        request_hash,
                        at: *at,
                    },
                    JudgmentWrite::Answer { id, result, at } => JudgmentDoc::Answer {
                        id: id.as_str(),
                        result: json_text(ctx, result)?,
                        at: *at,
                    },
                    JudgmentWrite::Expire { id, at } => JudgmentDoc::Expire {
                        id: id.as_str(),
                        at: *at,
                    },
                })
            })
            .collect::<Result<_>>()?,
        run_update: c.run_update.as_ref().map(|u| UpdateDoc {
            status: u.status.as_str(),
            reason: u.reason.as_deref(),
            output_hash: u.output_hash.map(|h| h.to_string()),
            updated_at: u.updated_at,
            wake_at: u.wake_at,
        }),
    })
}

/// A refusal `poimen_commit` raised (SQLSTATE PM001), from its JSON detail.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Refusal {
    NotFound {
        what: String,
    },
    LeaseLost {
        holder: Option<HolderDoc>,
    },
    SequenceConflict {
        expected: u64,
        got: u64,
    },
    IntentOutOfOrder {
        step: String,
        iteration: u32,
        attempt: u32,
        phase: String,
        previous: Option<String>,
    },
    JudgmentConflict {
        id: String,
        detail: String,
    },
    RunFinal {
        status: String,
    },
}

#[derive(Debug, Deserialize)]
struct HolderDoc {
    owner: String,
    epoch: u64,
    expires_at: i64,
}

/// The [`StoreError`] for a refusal of `commit`, or `None` if the detail is
/// not one `poimen_commit` writes.
fn refusal(commit: &Commit, detail: &str) -> Option<StoreError> {
    let run = commit.run.clone();
    let phase = |s: &str| IntentPhase::parse(s);
    Some(match serde_json::from_str::<Refusal>(detail).ok()? {
        Refusal::NotFound { what } => StoreError::NotFound { what },
        Refusal::LeaseLost { holder } => StoreError::LeaseLost {
            fence: commit.fence.clone()?,
            holder: holder.map(|h| Lease {
                run: run.clone(),
                owner: h.owner,
                epoch: h.epoch,
                expires_at: h.expires_at,
            }),
            run,
        },
        Refusal::SequenceConflict { expected, got } => {
            StoreError::SequenceConflict { run, expected, got }
        }
        Refusal::IntentOutOfOrder {
            step,
            iteration,
            attempt,
            phase: next,
            previous,
        } => StoreError::IntentOutOfOrder {
            run,
            step: StepId(step),
            iteration,
            attempt,
            phase: phase(&next)?,
            previous: match previous {
                None => None,
                Some(p) => Some(phase(&p)?),
            },
        },
        Refusal::JudgmentConflict { id, detail } => StoreError::JudgmentConflict {
            id: id.parse().ok()?,
            detail,
        },
        Refusal::RunFinal { status } => StoreError::RunFinal {
            run,
            status: RunStatus::parse(&status)?,
        },
    })
}

/// Validates and writes `commit` in one statement: one round trip.
pub(crate) async fn commit(c: &Object, ctx: &Ctx, commit: &Commit) -> Result<()> {
    let doc = commit_doc(ctx, commit)?;
    let hashes: Vec<String> = commit
        .blobs
        .iter()
        .map(|b| BlobHash::of(b).to_string())
        .collect();
    let stmt = c
        .prepare_cached("SELECT poimen_commit_v2($1, $2, $3)")
        .await
        .map_err(at(ctx))?;
    match c
        .execute(&stmt, &[&Json(&doc), &hashes, &commit.blobs])
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            if let Some(db) = e.as_db_error()
                && db.code().code() == REFUSED
                && let Some(err) = db.detail().and_then(|d| refusal(commit, d))
            {
                return Err(err);
            }
            Err(pg_error(&ctx.url, &e))
        }
    }
}

// ------------------------------------------------------------------- reads

pub(crate) async fn events(
    c: &Object,
    ctx: &Ctx,
    run: &RunId,
    after: Option<u64>,
) -> Result<Vec<StoredEvent>> {
    let after: i64 = match after {
        None => -1,
        Some(s) => i64::try_from(s).unwrap_or(i64::MAX),
    };
    let rows = query(
        c,
        ctx,
        "SELECT seq, at, kind, body::text FROM events WHERE run = $1 AND seq > $2 ORDER BY seq",
        &[&run.as_str(), &after],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StoredEvent {
                run: run.clone(),
                seq: to_u64(ctx, "event seq", get(ctx, r, 0)?)?,
                at: get(ctx, r, 1)?,
                kind: get(ctx, r, 2)?,
                body: json_value(ctx.p(), "an event body", get::<&str>(ctx, r, 3)?)?,
            })
        })
        .collect()
}

pub(crate) async fn intents(c: &Object, ctx: &Ctx, run: &RunId) -> Result<Vec<IntentRecord>> {
    let rows = query(
        c,
        ctx,
        "SELECT step, iteration, attempt, phase, tool, tool_version, digest, effect, args_hash,
                idempotency_key, output_hash, error, record::text, at
         FROM intents WHERE run = $1 ORDER BY id",
        &[&run.as_str()],
    )
    .await?;
    let p = ctx.p();
    rows.iter()
        .map(|r| {
            let phase: &str = get(ctx, r, 3)?;
            Ok(IntentRecord {
                run: run.clone(),
                step: StepId(get(ctx, r, 0)?),
                iteration: to_u32(p, "intent iteration", get(ctx, r, 1)?)?,
                attempt: to_u32(p, "intent attempt", get(ctx, r, 2)?)?,
                phase: IntentPhase::parse(phase)
                    .ok_or_else(|| bad_value(p, "intent phase", phase))?,
                tool: get(ctx, r, 4)?,
                tool_version: get(ctx, r, 5)?,
                digest: get(ctx, r, 6)?,
                effect: parse_effect(p, get(ctx, r, 7)?)?,
                args_hash: get(ctx, r, 8)?,
                idempotency_key: get(ctx, r, 9)?,
                output_hash: get(ctx, r, 10)?,
                error: get(ctx, r, 11)?,
                record: get::<Option<&str>>(ctx, r, 12)?
                    .map(|s| json_value(p, "a hostcall record", s))
                    .transpose()?,
                at: get(ctx, r, 13)?,
            })
        })
        .collect()
}

const JUDGMENT_SELECT: &str = "SELECT j.id, j.run, j.step, j.iteration, j.request::text,
        j.request_hash, j.created_at, a.result::text, a.answered_at, x.at
    FROM judgments j LEFT JOIN judgment_answers a ON a.judgment = j.id
    LEFT JOIN judgment_expiries x ON x.judgment = j.id";

fn to_judgment(ctx: &Ctx, r: &Row) -> Result<JudgmentRecord> {
    let p = ctx.p();
    let result: Option<&str> = get(ctx, r, 7)?;
    Ok(JudgmentRecord {
        id: parse(p, "judgment id", get::<&str>(ctx, r, 0)?)?,
        run: parse(p, "run id", get::<&str>(ctx, r, 1)?)?,
        step: StepId(get(ctx, r, 2)?),
        iteration: to_u32(p, "judgment iteration", get(ctx, r, 3)?)?,
        request: json_value(p, "a judgment request", get::<&str>(ctx, r, 4)?)?,
        request_hash: get(ctx, r, 5)?,
        created_at: get(ctx, r, 6)?,
        status: match (result, get::<Option<i64>>(ctx, r, 9)?) {
            (Some(_), _) => JudgmentStatus::Answered,
            (None, Some(_)) => JudgmentStatus::Expired,
            (None, None) => JudgmentStatus::Open,
        },
        result: result
            .map(|s| json_value(p, "a judgment result", s))
            .transpose()?,
        answered_at: get(ctx, r, 8)?,
        expired_at: get(ctx, r, 9)?,
    })
}

pub(crate) async fn judgment(
    c: &Object,
    ctx: &Ctx,
    id: &JudgmentId,
) -> Result<Option<JudgmentRecord>> {
    let sql = format!("{JUDGMENT_SELECT} WHERE j.id = $1");
    query_opt(c, ctx, &sql, &[&id.as_str()])
        .await?
        .map(|r| to_judgment(ctx, &r))
        .transpose()
}

pub(crate) async fn open_judgments(c: &Object, ctx: &Ctx) -> Result<Vec<JudgmentRecord>> {
    // A request of a run that ended (cancelled, failed) is no longer open:
    // nobody can answer it.
    let sql = format!(
        "{JUDGMENT_SELECT} JOIN runs r ON r.id = j.run
         WHERE a.judgment IS NULL AND x.judgment IS NULL
           AND r.status NOT IN ('completed', 'failed', 'cancelled')
         ORDER BY j.seq"
    );
    query(c, ctx, &sql, &[])
        .await?
        .iter()
        .map(|r| to_judgment(ctx, r))
        .collect()
}

// --------------------------------------------------------------- retention

pub(crate) async fn gc(c: &Object, ctx: &Ctx, before: i64, dry_run: bool) -> Result<GcReport> {
    let row = query_one(
        c,
        ctx,
        "SELECT runs, events, intents, judgments, blobs, blob_bytes FROM poimen_gc($1, $2)",
        &[&before, &dry_run],
    )
    .await?;
    let n = |i: usize, what: &str| -> Result<u64> { to_u64(ctx, what, get(ctx, &row, i)?) };
    Ok(GcReport {
        dry_run,
        runs: n(0, "gc runs")?,
        events: n(1, "gc events")?,
        intents: n(2, "gc intents")?,
        judgments: n(3, "gc judgments")?,
        blobs: n(4, "gc blobs")?,
        blob_bytes: n(5, "gc blob bytes")?,
    })
}
