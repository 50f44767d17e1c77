//! [`PostgresStore`]: one PostgreSQL database shared by many hosts.
//!
//! **Why tokio-postgres and deadpool-postgres.** tokio-postgres is a small,
//! fully asynchronous client of the wire protocol, with no ORM, macros or
//! compile-time database: the store's SQL is a handful of fixed statements
//! and one server-side function, so prepared statements and typed rows are
//! all it needs, and the client pipelines requests on one connection by
//! itself. deadpool-postgres adds the pool: a fixed-size set of connections,
//! a per-connection cache of prepared statements, and recycling that drops a
//! connection the server closed and opens a new one, so the store
//! reconnects after a server restart without help. sqlx would have brought
//! a much larger dependency tree (its own runtime glue, migrations and
//! macros) for features the store does not use.
//!
//! **Round trips.** A [`Store::commit`] is one round trip: one statement,
//! `SELECT poimen_commit($1, $2, $3)`, that calls a PL/pgSQL function
//! (schema_v1.sql) taking the commit as `json` and its blobs as arrays. The
//! function locks the run's row, checks everything the other backends check
//! — in the same order: the run, the fence, the episode's next seq, the
//! intent protocol, the judgments, a final run, the output blob — and
//! writes; a refusal raises SQLSTATE PM001 with the refusal as JSON, which
//! rolls the statement back (nothing written) and becomes the same
//! [`StoreError`] variant the other backends return. The statement is
//! prepared once per pooled connection (one extra round trip the first
//! time); taking a connection from the pool costs none. The lease
//! operations are one round trip each too (`claim_runnable` is one
//! `UPDATE … FROM (SELECT … FOR NO KEY UPDATE SKIP LOCKED)`); reads are one;
//! `create_run` and `publish_version` read first, then write in one
//! statement (four to five round trips: they are not on the hot path).
//!
//! **Durability.** A `Sync` commit returns once the server has committed
//! with the database's `synchronous_commit` (by default: its WAL flushed to
//! the server's disk). A `Buffered` commit sets `synchronous_commit = off`
//! for its own transaction: it returns before the WAL flush, survives the
//! host's crash and the connection's loss, and may be lost only if the
//! server itself crashes within its WAL writer delay; a later `Sync` commit
//! makes it durable, in order. Every other write is `Sync`.
//!
//! **Concurrency.** Commits and claims of one run serialize on the run's
//! row lock (`FOR NO KEY UPDATE`); the unique keys (`events (run, seq)`,
//! `runs.idempotency_key`, `runs.id`, `versions.version`, `blobs.hash`)
//! hold the rest across hosts, and a create or publish that loses a race
//! re-reads and answers as if it had come second.
//!
//! **Faults.** A connection that fails (refused, reset, timed out, the
//! server shutting down) is [`StoreError::Unavailable`] naming the server by
//! its URL with the password redacted; the pool discards broken connections
//! and opens new ones on the next call. A write whose connection broke while
//! it ran may or may not have committed: a retried commit then meets
//! [`StoreError::SequenceConflict`] if it had. Refused credentials are
//! [`StoreError::AccessDenied`], an unknown database [`StoreError::Open`],
//! any other server error [`StoreError::Postgres`] with its SQLSTATE.
//!
//! The SQL lives in `ops` and `schema_v1.sql`, migrations in `schema`, the
//! mapping of errors in `errors`.

mod errors;
mod listen;
mod ops;
mod schema;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use poimen_workflow::{VersionPrefix, WorkflowId, WorkflowVersion};
use tokio_postgres::NoTls;

use self::errors::{pg_error, pool_error};
use crate::error::StoreError;
use crate::ids::{BlobHash, JudgmentId, RunId};
use crate::records::{
    ArmedRecord, Commit, CreateRun, GcReport, IntentRecord, JudgmentRecord, Lease, NewRun,
    NewVersion, PublishOutcome, RunFilter, RunRecord, RunStatus, StoredEvent, VersionRecord,
    WorkflowSummary,
};
use crate::redact::redact_url;
use crate::rules;
use crate::store::{Store, StoreResult};

pub use self::schema::PG_SCHEMA_VERSION;

/// Tuning of a [`PostgresStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Most connections the pool opens to the server.
    pub max_connections: usize,
    /// How long opening one connection may take before
    /// [`StoreError::Unavailable`] (unless the URL sets `connect_timeout`).
    pub connect_timeout: Duration,
    /// How long a call waits for a free pooled connection before
    /// [`StoreError::Unavailable`].
    pub wait_timeout: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            max_connections: 16,
            connect_timeout: Duration::from_secs(10),
            wait_timeout: Duration::from_secs(30),
        }
    }
}

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    pool: Pool,
    ctx: ops::Ctx,
    /// What the LISTEN connection connects with.
    config: tokio_postgres::Config,
    wake: std::sync::Arc<crate::wake::Wakeup>,
    /// The LISTEN task, once a wait started it; aborted on drop.
    listener: std::sync::OnceLock<tokio::task::JoinHandle<()>>,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get() {
            task.abort();
        }
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.ctx.url)
            .field("max_connections", &self.pool.status().max_size)
            .finish()
    }
}

impl PostgresStore {
    /// Opens the store in the database `url` names
    /// (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?…]`, as libpq
    /// takes it; TLS is not supported yet, so `sslmode=require` fails to
    /// connect). See [`PostgresStore::open_with`].
    pub async fn open(url: &str) -> StoreResult<Self> {
        Self::open_with(url, PostgresOptions::default()).await
    }

    /// Opens the store with options: connects (refused, unreachable or timed
    /// out: [`StoreError::Unavailable`]; refused credentials:
    /// [`StoreError::AccessDenied`]; no such database: [`StoreError::Open`]),
    /// and builds or upgrades the schema in one transaction. Refuses,
    /// writing nothing, a database of a newer schema
    /// ([`StoreError::NewerSchema`]), one holding tables of the store's names
    /// without `poimen_schema` ([`StoreError::NotADatabase`]), and one whose
    /// encoding is not UTF-8 ([`StoreError::Open`]).
    pub async fn open_with(url: &str, options: PostgresOptions) -> StoreResult<Self> {
        let shown = redact_url(url);
        let mut config: tokio_postgres::Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| StoreError::Open {
                    path: PathBuf::from(&shown),
                    cause: format!("not a PostgreSQL connection URL: {e}"),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("poimen");
        }
        let connect_timeout = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(options.connect_timeout);
        let listen_config = config.clone();
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                // No query on checkout: a connection the server closed is
                // seen closed and replaced; one that breaks mid-call fails
                // that call with Unavailable and is dropped.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.wait_timeout))
            // Beyond the connect timeout: the startup and authentication exchange.
            .create_timeout(Some(connect_timeout + Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Open {
                path: PathBuf::from(&shown),
                cause: format!("cannot build the connection pool: {e}"),
            })?;
        let store = PostgresStore {
            pool,
            ctx: ops::Ctx::new(shown),
            config: listen_config,
            wake: std::sync::Arc::default(),
            listener: std::sync::OnceLock::new(),
        };
        let mut client = store.client().await?;
        schema::check_encoding(&client, &store.ctx.url).await?;
        schema::migrate(&mut client, &store.ctx.url, schema::MIGRATIONS).await?;
        Ok(store)
    }

    /// The store's URL, its password replaced by `***`.
    pub fn url_redacted(&self) -> &str {
        &self.ctx.url
    }

    /// A pooled connection.
    async fn client(&self) -> StoreResult<Object> {
        self.pool
            .get()
            .await
            .map_err(|e| pool_error(&self.ctx.url, e))
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn publish_version(&self, new: NewVersion) -> StoreResult<PublishOutcome> {
        rules::check_version_hash(&new)?;
        ops::publish_version(&self.client().await?, &self.ctx, new).await
    }

    async fn version(&self, version: &WorkflowVersion) -> StoreResult<Option<VersionRecord>> {
        ops::version(&self.client().await?, &self.ctx, version).await
    }

    async fn resolve_version_prefix(&self, prefix: &VersionPrefix) -> StoreResult<WorkflowVersion> {
        ops::resolve_prefix(&self.client().await?, &self.ctx, prefix).await
    }

    async fn versions_of(&self, workflow: &WorkflowId) -> StoreResult<Vec<VersionRecord>> {
        ops::versions_of(&self.client().await?, &self.ctx, workflow).await
    }

    async fn latest_version(&self, workflow: &WorkflowId) -> StoreResult<Option<VersionRecord>> {
        ops::latest_version(&self.client().await?, &self.ctx, workflow).await
    }

    async fn workflows(&self) -> StoreResult<Vec<WorkflowSummary>> {
        ops::workflows(&self.client().await?, &self.ctx).await
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> StoreResult<BlobHash> {
        ops::put_blob(&self.client().await?, &self.ctx, &bytes).await
    }

    async fn blob(&self, hash: &BlobHash) -> StoreResult<Option<Vec<u8>>> {
        ops::blob(&self.client().await?, &self.ctx, hash).await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRun> {
        let created = ops::create_run(&self.client().await?, &self.ctx, new).await?;
        if let CreateRun::Created(r) = &created
            && r.lease.is_none()
        {
            self.wake.ring();
        }
        Ok(created)
    }

    async fn run(&self, id: &RunId) -> StoreResult<Option<RunRecord>> {
        ops::run(&self.client().await?, &self.ctx, id).await
    }

    async fn list_runs(&self, filter: RunFilter) -> StoreResult<Vec<RunRecord>> {
        ops::list_runs(&self.client().await?, &self.ctx, &filter).await
    }

    async fn count_runs(&self, filter: RunFilter) -> StoreResult<Vec<(RunStatus, u64)>> {
        ops::count_runs(&self.client().await?, &self.ctx, &filter).await
    }

    async fn children(&self, parent: &RunId) -> StoreResult<Vec<RunRecord>> {
        ops::children(&self.client().await?, &self.ctx, parent).await
    }

    async fn commit(&self, commit: Commit) -> StoreResult<()> {
        rules::check_commit_shape(&commit)?;
        ops::commit(&self.client().await?, &self.ctx, &commit).await?;
        if rules::may_make_work(&commit) {
            self.wake.ring();
        }
        Ok(())
    }

    async fn events(&self, run: &RunId) -> StoreResult<Vec<StoredEvent>> {
        ops::events(&self.client().await?, &self.ctx, run, None).await
    }

    async fn events_after(&self, run: &RunId, seq: u64) -> StoreResult<Vec<StoredEvent>> {
        ops::events(&self.client().await?, &self.ctx, run, Some(seq)).await
    }

    async fn intents(&self, run: &RunId) -> StoreResult<Vec<IntentRecord>> {
        ops::intents(&self.client().await?, &self.ctx, run).await
    }

    async fn judgment(&self, id: &JudgmentId) -> StoreResult<Option<JudgmentRecord>> {
        ops::judgment(&self.client().await?, &self.ctx, id).await
    }

    async fn open_judgments(&self) -> StoreResult<Vec<JudgmentRecord>> {
        ops::open_judgments(&self.client().await?, &self.ctx).await
    }

    async fn claim_run(
        &self,
        run: &RunId,
        owner: &str,
        now: i64,
        ttl_ms: i64,
    ) -> StoreResult<Option<Lease>> {
        ops::claim_run(&self.client().await?, &self.ctx, run, owner, now, ttl_ms).await
    }

    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl_ms: i64,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, Lease)>> {
        ops::claim_runnable(&self.client().await?, &self.ctx, owner, now, ttl_ms, limit).await
    }

    async fn renew_lease(&self, lease: &Lease, now: i64, ttl_ms: i64) -> StoreResult<Lease> {
        ops::renew_lease(&self.client().await?, &self.ctx, lease, now, ttl_ms).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        ops::release_lease(&self.client().await?, &self.ctx, lease).await?;
        self.wake.ring();
        Ok(())
    }

    async fn sync(&self) -> StoreResult<()> {
        ops::sync(&self.client().await?, &self.ctx).await
    }

    async fn wait_for_work(&self, within: Duration) {
        self.listener.get_or_init(|| {
            tokio::spawn(listen::listen(
                self.config.clone(),
                self.wake.clone(),
                self.ctx.url.clone(),
            ))
        });
        self.wake.wait(within).await;
    }

    async fn runs_owned_by(&self, owner: &str) -> StoreResult<Vec<RunRecord>> {
        ops::runs_owned_by(&self.client().await?, &self.ctx, owner).await
    }

    async fn in_flight_runs(&self) -> StoreResult<Vec<RunRecord>> {
        ops::in_flight_runs(&self.client().await?, &self.ctx).await
    }

    async fn set_wake(&self, run: &RunId, at: Option<i64>) -> StoreResult<()> {
        ops::set_wake(&self.client().await?, &self.ctx, run, at).await
    }

    async fn next_wake(&self) -> StoreResult<Option<i64>> {
        ops::next_wake(&self.client().await?, &self.ctx).await
    }

    async fn arm(
        &self,
        workflow: &WorkflowId,
        version: Option<&WorkflowVersion>,
        at: i64,
    ) -> StoreResult<Option<ArmedRecord>> {
        ops::arm(&self.client().await?, &self.ctx, workflow, version, at).await
    }

    async fn armed(&self, workflow: &WorkflowId) -> StoreResult<Option<ArmedRecord>> {
        ops::armed(&self.client().await?, &self.ctx, workflow).await
    }

    async fn set_unload_deadline(
        &self,
        version: &WorkflowVersion,
        deadline: i64,
        at: i64,
    ) -> StoreResult<()> {
        ops::set_unload_deadline(&self.client().await?, &self.ctx, version, deadline, at).await
    }

    async fn unload_deadline(&self, version: &WorkflowVersion) -> StoreResult<Option<i64>> {
        ops::unload_deadline(&self.client().await?, &self.ctx, version).await
    }

    async fn gc(&self, finished_before: i64, dry_run: bool) -> StoreResult<GcReport> {
        ops::gc(&self.client().await?, &self.ctx, finished_before, dry_run).await
    }
}

/// `pg_error` for the store's own server.
fn at(ctx: &ops::Ctx) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
    move |e| pg_error(&ctx.url, &e)
}

#[cfg(test)]
mod tests;
