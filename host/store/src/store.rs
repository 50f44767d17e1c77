//! The [`Store`] trait: everything the executor and the CLI keep.
//!
//! The trait is the contract every backend meets (SQLite, PostgreSQL, and
//! the in-memory store for ephemeral runs): the conformance tests in
//! `tests/it_store.rs` run against each. It knows nothing of how rows are
//! laid out, and nothing of the executor's walk: the store records and checks
//! what it is given; it never reads the clock or a random source (callers
//! pass timestamps, in milliseconds since the Unix epoch, and ids).
//!
//! Point look-ups return `Ok(None)` for "not there"; operations that need a
//! thing to exist return [`StoreError::NotFound`] naming it.

use async_trait::async_trait;
use poimen_workflow::{VersionPrefix, WorkflowId, WorkflowVersion};

use crate::error::StoreError;
use crate::ids::{BlobHash, JudgmentId, RunId};
use crate::records::{
    ArmedRecord, Commit, CreateRun, GcReport, IntentRecord, JudgmentRecord, Lease, NewRun,
    NewVersion, PublishOutcome, RunFilter, RunRecord, RunStatus, StoredEvent, VersionRecord,
    WorkflowSummary,
};

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// Storage of versions, blobs, runs, episodes, intents, judgment requests and
/// leases. Object-safe: the executor holds an `Arc<dyn Store>`.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    // ------------------------------------------------------------ versions

    /// Publishes a version of the DAG. Checks that `blake3(canonical)` is the
    /// claimed version ([`StoreError::VersionHashMismatch`]). The same bytes
    /// again are a no-op returning the stored record
    /// ([`PublishOutcome::Existing`], which says when a different parent was
    /// asked for and ignored); different bytes under a stored version are
    /// refused as corruption ([`StoreError::VersionConflict`]). A parent must
    /// be stored ([`StoreError::UnknownParent`]) and be a version of the same
    /// workflow id ([`StoreError::ParentOfOtherWorkflow`]). Always durable
    /// when it returns.
    async fn publish_version(&self, new: NewVersion) -> StoreResult<PublishOutcome>;

    /// The record of `version`. Its bytes are re-hashed on read: a mismatch
    /// is [`StoreError::Corrupt`].
    async fn version(&self, version: &WorkflowVersion) -> StoreResult<Option<VersionRecord>>;

    /// The one stored version starting with `prefix`: [`StoreError::NotFound`]
    /// if none, [`StoreError::AmbiguousPrefix`] listing (up to 20) candidates
    /// if several.
    async fn resolve_version_prefix(&self, prefix: &VersionPrefix) -> StoreResult<WorkflowVersion>;

    /// Every version of `workflow`, each with its parent, in publish order.
    async fn versions_of(&self, workflow: &WorkflowId) -> StoreResult<Vec<VersionRecord>>;

    /// The most recently published version of `workflow`.
    async fn latest_version(&self, workflow: &WorkflowId) -> StoreResult<Option<VersionRecord>>;

    /// Every workflow id with a version, sorted by id.
    async fn workflows(&self) -> StoreResult<Vec<WorkflowSummary>>;

    // --------------------------------------------------------------- blobs

    /// Stores `bytes` under their Blake3 hash (idempotent). Durable when it returns.
    async fn put_blob(&self, bytes: Vec<u8>) -> StoreResult<BlobHash>;

    /// The bytes stored under `hash`, re-hashed on read: a mismatch is
    /// [`StoreError::Corrupt`], never silently returned.
    async fn blob(&self, hash: &BlobHash) -> StoreResult<Option<Vec<u8>>>;

    // ---------------------------------------------------------------- runs

    /// Creates a run, `queued`, with its input stored as a blob in the same
    /// transaction. The version must be stored (its workflow id becomes the
    /// run's), and so must a parent run, whose tenant a child must share
    /// ([`StoreError::TenantMismatch`]). Idempotency keys are global to the
    /// store, not scoped by tenant: under a key, the same (version, input,
    /// tenant) returns the existing run; a different one is refused with
    /// [`StoreError::IdempotencyConflict`] naming both input hashes.
    /// Retrying a create with the same id and content returns
    /// [`CreateRun::Existing`]; the same id with other content is
    /// [`StoreError::RunIdConflict`]. With [`NewRun::lease`] the run starts
    /// held: epoch 1, expiring at `created_at + ttl_ms`, and only its
    /// creator knows of it, so a store may make it durable with its next
    /// durable write rather than before this returns (SQLite does); without
    /// one, durable when it returns.
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRun>;

    async fn run(&self, id: &RunId) -> StoreResult<Option<RunRecord>>;

    /// Runs matching every set field of `filter`, newest first.
    async fn list_runs(&self, filter: RunFilter) -> StoreResult<Vec<RunRecord>>;

    /// How many runs match `filter` in each status (statuses with none
    /// left out), ignoring its `status`, `before` and `limit`: the counts
    /// beside a listing. The default lists every run; the stores count in
    /// their indexes.
    async fn count_runs(&self, filter: RunFilter) -> StoreResult<Vec<(RunStatus, u64)>> {
        let all = self
            .list_runs(RunFilter {
                status: None,
                before: None,
                limit: None,
                ..filter
            })
            .await?;
        let mut counts: Vec<(RunStatus, u64)> = Vec::new();
        for r in all {
            match counts.iter_mut().find(|(s, _)| *s == r.status) {
                Some((_, n)) => *n += 1,
                None => counts.push((r.status, 1)),
            }
        }
        counts.sort_by_key(|(s, _)| RunStatus::ALL.iter().position(|x| x == s));
        Ok(counts)
    }

    /// Runs started by `parent` as sub-workflows, oldest first.
    async fn children(&self, parent: &RunId) -> StoreResult<Vec<RunRecord>>;

    // ---------------------------------------------------------- write path

    /// Writes everything in `commit` in one transaction, or nothing. Fails
    /// with [`StoreError::SequenceConflict`] unless the events continue the
    /// run's episode exactly (the first event of a run is `seq` 0), with
    /// [`StoreError::IntentOutOfOrder`] if an intent phase breaks the
    /// protocol (pending → dispatched… → committed | failed | abandoned;
    /// failed may also follow pending), with [`StoreError::RunFinal`] when it would change a
    /// completed or cancelled run. A fenced commit (`commit.fence` set) is
    /// refused with [`StoreError::LeaseLost`] unless the run's lease is
    /// still that owner at that epoch — checked inside the transaction,
    /// before anything else of the run; an expired lease not yet taken over
    /// still holds. Durable per `commit.durability`.
    async fn commit(&self, commit: Commit) -> StoreResult<()>;

    /// The run's episode, in `seq` order (empty for an unknown run).
    async fn events(&self, run: &RunId) -> StoreResult<Vec<StoredEvent>>;

    /// Events with a `seq` greater than `seq`.
    async fn events_after(&self, run: &RunId, seq: u64) -> StoreResult<Vec<StoredEvent>>;

    /// The run's intent records, in the order they were written.
    async fn intents(&self, run: &RunId) -> StoreResult<Vec<IntentRecord>>;

    async fn judgment(&self, id: &JudgmentId) -> StoreResult<Option<JudgmentRecord>>;

    /// Unanswered judgment requests, oldest first.
    async fn open_judgments(&self) -> StoreResult<Vec<JudgmentRecord>>;

    // -------------------------------------------------------------- leases

    /// Claims the run for `owner` until `now + ttl_ms`, if it is not
    /// terminal and no host holds it, its lease expired (`expires_at <=
    /// now`), or `owner` already holds it. Every claim starts a new tenure:
    /// the epoch is one more than any the run had (so a second process
    /// under the same host name fences out the first). `None` if another
    /// host holds a live lease or the run is terminal;
    /// [`StoreError::NotFound`] if there is no such run. Durable when it
    /// returns.
    async fn claim_run(
        &self,
        run: &RunId,
        owner: &str,
        now: i64,
        ttl_ms: i64,
    ) -> StoreResult<Option<Lease>>;

    /// Atomically claims, for `owner` until `now + ttl_ms`, up to `limit`
    /// runs that need a driver, with no lease or an expired one: `queued`
    /// and `running` runs, and `waiting_judgment` and `blocked` runs whose
    /// timer has come (`wake_at <= now`; other waiting and blocked runs
    /// wait for an operator, whose host takes them with
    /// [`Store::claim_run`]). Oldest `created_at` first, then by id. Every
    /// claim clears the run's timer (its driver sets the next one) and is a
    /// new tenure, as in `claim_run`. Two callers — tasks, processes or
    /// hosts — never get the same run. Durable when it returns.
    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl_ms: i64,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, Lease)>>;

    /// Extends `lease` to `now + ttl_ms` if the run's lease is still its
    /// owner at its epoch (even past its expiry, if no one took the run
    /// over); the epoch never changes. [`StoreError::LeaseLost`] otherwise,
    /// [`StoreError::NotFound`] for an unknown run. Durable when it returns.
    async fn renew_lease(&self, lease: &Lease, now: i64, ttl_ms: i64) -> StoreResult<Lease>;

    /// Gives the run up: clears its holder if it still is `lease`'s owner at
    /// `lease`'s epoch, and does nothing otherwise (the run was taken over).
    /// The epoch stays, so the next tenure's is larger.
    /// [`StoreError::NotFound`] for an unknown run. A store may make it
    /// durable with its next durable write (SQLite does): a release lost
    /// with a machine's crash is a lease that expires.
    async fn release_lease(&self, lease: &Lease) -> StoreResult<()>;

    /// Makes every write this store has returned so far durable — the
    /// `Buffered` commits among them (a start only its waiting caller
    /// knows of, effect-free outcomes) included — before it returns. For a
    /// caller about to hand out what it wrote: an answer naming a run
    /// whose start is not yet durable. Writes are durable in the order
    /// they were made, so this is what any later durable write does too.
    async fn sync(&self) -> StoreResult<()>;

    /// Waits until work may have become claimable — a run queued, a lease
    /// handed back, a slot of an admission group freed, a run an operator
    /// made runnable — or `within` has passed, whichever is first. A hint,
    /// not a promise: the caller claims and finds out. PostgreSQL hears
    /// every host's writes (LISTEN/NOTIFY); SQLite and the memory store
    /// hear this process's (other processes on one SQLite file are found by
    /// the caller's poll, `within`).
    async fn wait_for_work(&self, within: std::time::Duration) {
        tokio::time::sleep(within).await;
    }

    /// Non-terminal runs whose lease `owner` holds (expired or not), oldest
    /// first.
    async fn runs_owned_by(&self, owner: &str) -> StoreResult<Vec<RunRecord>>;

    // -------------------------------------------------------------- timers

    /// Sets the run's timer ([`RunRecord::wake_at`]; `None` clears it),
    /// unless the run has ended (a no-op then). Unfenced: a timer is a
    /// reminder, whoever sets it. [`StoreError::NotFound`] for an unknown
    /// run. Durable when it returns.
    async fn set_wake(&self, run: &RunId, at: Option<i64>) -> StoreResult<()>;

    /// The earliest timer of any run not ended, if one is set: when a
    /// serving host must claim again at the latest.
    async fn next_wake(&self) -> StoreResult<Option<i64>>;

    // ---------------------------------------------------- arming, unloading

    /// Arms `version` as its workflow's current version (`version: None`
    /// disarms the workflow) at `at`, and returns what was armed before.
    /// The version must be stored and a version of `workflow`
    /// ([`StoreError::NotFound`], [`StoreError::ArmOtherWorkflow`]).
    /// Durable when it returns.
    async fn arm(
        &self,
        workflow: &WorkflowId,
        version: Option<&WorkflowVersion>,
        at: i64,
    ) -> StoreResult<Option<ArmedRecord>>;

    /// What is armed for `workflow` (`None`: never armed nor disarmed).
    async fn armed(&self, workflow: &WorkflowId) -> StoreResult<Option<ArmedRecord>>;

    /// Records that the live runs of `version` must end by `deadline` (an
    /// unload drain with a timeout); a later call moves it. Durable when it
    /// returns.
    async fn set_unload_deadline(
        &self,
        version: &WorkflowVersion,
        deadline: i64,
        at: i64,
    ) -> StoreResult<()>;

    /// The deadline by which live runs of `version` must end, if it was
    /// unloaded with one.
    async fn unload_deadline(&self, version: &WorkflowVersion) -> StoreResult<Option<i64>>;

    /// Every non-terminal run (queued, running, waiting for a judgment,
    /// blocked), oldest first: what a host looks at on start.
    async fn in_flight_runs(&self) -> StoreResult<Vec<RunRecord>>;

    // ----------------------------------------------------------- retention

    /// Deletes finished runs last changed before `finished_before` —
    /// each top-level run that completed, failed or was cancelled, with its
    /// sub-workflow runs, and only if every one of them has ended — with
    /// their episodes, intent records, judgment requests, answers and
    /// expiries; then every blob one of them referred to that nothing left
    /// in the store refers to (a run's input or output, an intent's output,
    /// a hash in an event). Never a version, an armed record, a run not
    /// ended, or a finished child of a run not ended. Their idempotency
    /// keys are free again afterwards. One transaction: all of it or
    /// nothing; a commit to a run being deleted waits for it or is refused.
    /// With `dry_run`, deletes nothing and reports what it would delete.
    /// Durable when it returns.
    async fn gc(&self, finished_before: i64, dry_run: bool) -> StoreResult<GcReport>;
}
