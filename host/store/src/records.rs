//! The records the store keeps and the requests that write them.
//!
//! Plain data, shared by every backend: versions, runs, episode events,
//! intents, judgment requests, and the one atomic write, [`Commit`]. This
//! module knows nothing of SQL or of how the executor builds these values;
//! the rules the backends enforce on them live in `rules`.

use poimen_workflow::{EffectClass, StepId, WorkflowId, WorkflowVersion};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{BlobHash, JudgmentId, RunId};

// ---------------------------------------------------------------- versions

/// One immutable node of the version DAG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRecord {
    /// Blake3 of `canonical`.
    pub version: WorkflowVersion,
    /// The version this one was derived from, of the same workflow id.
    pub parent: Option<WorkflowVersion>,
    pub workflow_id: WorkflowId,
    /// The canonical JSON bytes of the workflow definition.
    pub canonical: Vec<u8>,
    /// Milliseconds since the Unix epoch, as given by the publisher.
    pub created_at: i64,
}

/// A version to publish. `version` is the hash the caller claims; the store
/// recomputes it from `canonical` and refuses a mismatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVersion {
    pub version: WorkflowVersion,
    pub parent: Option<WorkflowVersion>,
    pub workflow_id: WorkflowId,
    pub canonical: Vec<u8>,
    pub created_at: i64,
}

impl NewVersion {
    /// A version of `canonical`, hashed here, so the claim is right by construction.
    pub fn of(
        workflow_id: WorkflowId,
        canonical: Vec<u8>,
        parent: Option<WorkflowVersion>,
        created_at: i64,
    ) -> Self {
        NewVersion {
            version: WorkflowVersion::of_canonical_bytes(&canonical),
            parent,
            workflow_id,
            canonical,
            created_at,
        }
    }
}

/// What publishing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// A new record was written.
    Created(VersionRecord),
    /// The same bytes were already published: nothing was written and the
    /// stored record (parent and `created_at` included) is returned as it is.
    Existing {
        record: VersionRecord,
        /// The parent the caller asked for when it differs from the stored
        /// one: it was *not* recorded, because records never change.
        ignored_parent: Option<WorkflowVersion>,
    },
}

impl PublishOutcome {
    /// The stored record.
    pub fn record(&self) -> &VersionRecord {
        match self {
            PublishOutcome::Created(r) | PublishOutcome::Existing { record: r, .. } => r,
        }
    }

    /// Whether this call wrote the record.
    pub fn is_created(&self) -> bool {
        matches!(self, PublishOutcome::Created(_))
    }
}

/// A workflow id and its versions, for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowSummary {
    pub workflow_id: WorkflowId,
    pub versions: u64,
    /// The most recently published version.
    pub latest: WorkflowVersion,
}

// -------------------------------------------------------------------- runs

/// The tenant of a run that names none: what single-tenant hosts use, and
/// what every run stored before schema version 3 belongs to.
pub const DEFAULT_TENANT: &str = "default";

fn default_tenant() -> String {
    DEFAULT_TENANT.to_owned()
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    WaitingJudgment,
    Blocked,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [RunStatus; 7] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::WaitingJudgment,
        RunStatus::Blocked,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// The snake_case name, as stored and as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::WaitingJudgment => "waiting_judgment",
            RunStatus::Blocked => "blocked",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// The status named `s`.
    pub fn parse(s: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Completed, failed or cancelled: the run does no more work by itself.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// Completed or cancelled: the store refuses to change the status or
    /// output of such a run. (`failed` is terminal but not final: an operator
    /// may retry it.)
    pub fn is_final(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Cancelled)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: RunId,
    /// The workflow id of `version`, filled in by the store.
    pub workflow_id: WorkflowId,
    pub version: WorkflowVersion,
    /// The tenant the run belongs to ([`DEFAULT_TENANT`] unless the creator
    /// named one). Part of the run's identity: it never changes, and a child
    /// run has its parent's.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub status: RunStatus,
    /// Why the run is blocked, failed or cancelled (free text for people).
    pub reason: Option<String>,
    /// Blob of the run's input (canonical JSON bytes).
    pub input_hash: BlobHash,
    /// Blob of the run's output, once there is one.
    pub output_hash: Option<BlobHash>,
    pub idempotency_key: Option<String>,
    /// The run and step that started this run as a sub-workflow.
    pub parent: Option<(RunId, StepId)>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The host that holds the run's lease, until when, and its fencing
    /// epoch; `None` when no host holds it (never claimed, or released).
    pub lease: Option<Lease>,
    /// The concurrency group the run is admitted under, if its workflow
    /// limits concurrent runs.
    #[serde(default)]
    pub admission: Option<Admission>,
    /// Whether the run holds one of its group's slots: set by the claim (or
    /// the held creation) that admitted it, kept until the run ends. Always
    /// `false` for a run without an admission group.
    #[serde(default)]
    pub admitted: bool,
    /// When a run that no host holds must be looked at again (a judgment's
    /// timeout, the run's deadline, the end of an unload drain): a waiting
    /// or blocked run is claimable from then on, like a queued one.
    #[serde(default)]
    pub wake_at: Option<i64>,
}

/// A workflow id's armed version: the one a new run of the workflow
/// starts on. `version: None`: the workflow is disarmed, and no new run of
/// it may start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmedRecord {
    pub workflow_id: WorkflowId,
    pub version: Option<WorkflowVersion>,
    /// When it was armed (or disarmed).
    pub at: i64,
}

/// A workflow's `concurrency` as the store applies it: of the runs of one
/// `group` (a workflow, or a workflow and a rendered key), at most
/// `max_runs` are admitted — claimed from the queue and not yet completed,
/// failed or cancelled — at any instant, across every host of the store.
/// A run waiting for a slot stays `queued`; runs of a group are admitted in
/// the order they were created, and a full group never holds back another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    pub group: String,
    pub max_runs: u32,
}

/// The admission group a new run joins, and what to do when it is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionRequest {
    pub group: String,
    pub max_runs: u32,
    /// Refuse the new run (`StoreError::AdmissionFull`) when the group has
    /// `max_runs` runs not yet ended — admitted or queued — instead of
    /// queueing it (`on_overflow: drop`).
    pub refuse_when_full: bool,
}

impl AdmissionRequest {
    /// The group as the run's record carries it.
    pub fn admission(&self) -> Admission {
        Admission {
            group: self.group.clone(),
            max_runs: self.max_runs,
        }
    }
}

/// A run to create. It starts `queued`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    pub id: RunId,
    /// Must be a published version of this store.
    pub version: WorkflowVersion,
    /// The input's bytes (canonical JSON). The store keeps them as a blob in
    /// the same transaction as the run, so a run's input can always be read
    /// back; `input_hash` of the record is their Blake3.
    pub input: Vec<u8>,
    /// The tenant the run belongs to ([`DEFAULT_TENANT`] for single-tenant
    /// hosts). A child run must name its parent's tenant.
    pub tenant: String,
    /// Global to the store, not scoped by tenant.
    pub idempotency_key: Option<String>,
    pub parent: Option<(RunId, StepId)>,
    /// Claim the run for a host at creation: the run starts with a lease of
    /// epoch 1 that expires at `created_at + ttl_ms`. A run with an
    /// admission group gets it only if the group has a free slot (the run is
    /// then admitted); otherwise it is created queued and held by no one.
    pub lease: Option<LeaseRequest>,
    /// The concurrency group the run is admitted under.
    pub admission: Option<AdmissionRequest>,
    pub created_at: i64,
}

/// What creating a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateRun {
    Created(RunRecord),
    /// A run with this idempotency key and the same version and input (or
    /// this very id with the same content) already existed; nothing was written.
    Existing(RunRecord),
}

impl CreateRun {
    /// The stored run.
    pub fn record(&self) -> &RunRecord {
        match self {
            CreateRun::Created(r) | CreateRun::Existing(r) => r,
        }
    }

    /// The stored run, by value.
    pub fn into_record(self) -> RunRecord {
        match self {
            CreateRun::Created(r) | CreateRun::Existing(r) => r,
        }
    }

    /// Whether this call created the run.
    pub fn is_created(&self) -> bool {
        matches!(self, CreateRun::Created(_))
    }
}

/// Which runs [`list_runs`](crate::Store::list_runs) returns: every set
/// field must match. Results are newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub workflow_id: Option<WorkflowId>,
    /// Runs of this tenant only (`None`: of every tenant).
    pub tenant: Option<String>,
    pub parent: Option<RunId>,
    /// Runs pinned to this version.
    pub version: Option<WorkflowVersion>,
    /// The run created under this idempotency key.
    pub idempotency_key: Option<String>,
    /// Runs created at or after this time (ms since the Unix epoch).
    pub created_from: Option<i64>,
    /// Runs created before this time (ms since the Unix epoch).
    pub created_until: Option<i64>,
    /// A page's cursor: only runs created after this one was (listed
    /// before it, newest first). An unknown run matches nothing.
    pub before: Option<RunId>,
    pub limit: Option<u32>,
}

impl RunFilter {
    /// Whether `r` passes every field but `status`, `before` and `limit`
    /// (which need the store's order): the stores' shared test for what
    /// they filter in memory.
    pub fn admits(&self, r: &RunRecord) -> bool {
        self.workflow_id
            .as_ref()
            .is_none_or(|w| &r.workflow_id == w)
            && self.tenant.as_ref().is_none_or(|t| &r.tenant == t)
            && self
                .parent
                .as_ref()
                .is_none_or(|p| r.parent.as_ref().is_some_and(|(rp, _)| rp == p))
            && self.version.as_ref().is_none_or(|v| &r.version == v)
            && self
                .idempotency_key
                .as_ref()
                .is_none_or(|k| r.idempotency_key.as_ref() == Some(k))
            && self.created_from.is_none_or(|t| r.created_at >= t)
            && self.created_until.is_none_or(|t| r.created_at < t)
    }
}

// ------------------------------------------------------------------ leases

/// A host's tenure on a run: who, until when, and the fencing epoch.
///
/// Every claim starts a new tenure with an epoch larger than any the run had
/// before (the epoch survives a release), so a host that lost the run — to
/// a takeover after its lease expired, or to a second process under the same
/// host name — can be told apart from the one that holds it now: its
/// commits carry the old epoch in their [`Fence`] and are refused with
/// [`StoreError::LeaseLost`](crate::StoreError::LeaseLost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub run: RunId,
    /// The host holding the run.
    pub owner: String,
    /// The fencing epoch of this tenure: 1 for a run's first, then one more
    /// per claim.
    pub epoch: u64,
    /// Milliseconds since the Unix epoch after which another host may take
    /// the run over (`expires_at <= now`). Until a takeover, the holder's
    /// commits are accepted even past it.
    pub expires_at: i64,
}

impl Lease {
    /// What a commit written under this lease carries.
    pub fn fence(&self) -> Fence {
        Fence {
            owner: self.owner.clone(),
            epoch: self.epoch,
        }
    }
}

/// What a commit carries to prove its writer still holds the run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    pub owner: String,
    pub epoch: u64,
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host `{}` at lease epoch {}", self.owner, self.epoch)
    }
}

/// Ask for a lease when creating a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The host that will drive the run.
    pub owner: String,
    /// How long the lease lasts from the run's `created_at`, in milliseconds.
    pub ttl_ms: i64,
}

/// When a lease taken at `now` for `ttl_ms` expires (saturating: a huge ttl
/// is "never", not an overflow).
pub(crate) fn expiry(now: i64, ttl_ms: i64) -> i64 {
    now.saturating_add(ttl_ms)
}

// ------------------------------------------------------------------ events

/// One event of a run's episode, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub run: RunId,
    /// Position in the run's episode: 0, 1, 2, … without gaps.
    pub seq: u64,
    pub at: i64,
    pub kind: String,
    pub body: Value,
}

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub seq: u64,
    pub at: i64,
    pub kind: String,
    /// The event as JSON text, encoded once by whoever made it: the
    /// backends write these bytes as they are.
    pub body: EventBody,
}

/// The JSON text of one event body, as it is written.
///
/// Made only by encoding a value, so it always holds valid JSON: a
/// backend writes it without encoding it again, and whoever needs the
/// value parses it ([`EventBody::to_value`], or straight into its own
/// type with `serde_json::from_str(body.as_str())`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventBody(Box<str>);

impl EventBody {
    /// Encode `value` as an event body.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<EventBody, serde_json::Error> {
        serde_json::to_string(value).map(|s| EventBody(s.into_boxed_str()))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The body parsed back into a JSON value.
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl From<&Value> for EventBody {
    /// A JSON value always encodes: its map keys are strings and its
    /// numbers finite.
    fn from(value: &Value) -> EventBody {
        EventBody(value.to_string().into_boxed_str())
    }
}

impl From<Value> for EventBody {
    fn from(value: Value) -> EventBody {
        EventBody::from(&value)
    }
}

// ----------------------------------------------------------------- intents

/// A phase of the write-ahead intent protocol. Each phase is its own row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentPhase {
    /// The call is announced; nothing has happened outside yet.
    Pending,
    /// The guest is about to be called.
    Dispatched,
    /// The call returned and its result is recorded.
    Committed,
    /// The call failed (or was never made) and the error class is recorded.
    Failed,
    /// The run was cancelled while the call was dispatched: its outcome is
    /// unknown, and nobody will wait for it. May follow `dispatched` only.
    Abandoned,
}

impl IntentPhase {
    /// Every phase, in protocol order.
    pub const ALL: [IntentPhase; 5] = [
        IntentPhase::Pending,
        IntentPhase::Dispatched,
        IntentPhase::Committed,
        IntentPhase::Failed,
        IntentPhase::Abandoned,
    ];

    /// The snake_case name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            IntentPhase::Pending => "pending",
            IntentPhase::Dispatched => "dispatched",
            IntentPhase::Committed => "committed",
            IntentPhase::Failed => "failed",
            IntentPhase::Abandoned => "abandoned",
        }
    }

    /// The phase named `s`.
    pub fn parse(s: &str) -> Option<IntentPhase> {
        IntentPhase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Committed, failed or abandoned: no phase may follow.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            IntentPhase::Committed | IntentPhase::Failed | IntentPhase::Abandoned
        )
    }
}

impl std::fmt::Display for IntentPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One phase of one tool call. Append-only: a later phase is a new record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntentRecord {
    pub run: RunId,
    pub step: StepId,
    pub iteration: u32,
    pub attempt: u32,
    pub phase: IntentPhase,
    pub tool: String,
    pub tool_version: String,
    /// The component's digest.
    pub digest: String,
    pub effect: EffectClass,
    pub args_hash: String,
    pub idempotency_key: String,
    pub output_hash: Option<String>,
    pub error: Option<String>,
    /// The sandbox's hostcall record.
    pub record: Option<Value>,
    pub at: i64,
}

// --------------------------------------------------------------- judgments

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgmentStatus {
    Open,
    Answered,
    /// Its timeout passed without an answer; no answer is taken any more.
    Expired,
}

/// A judgment request and, once given, its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgmentRecord {
    pub id: JudgmentId,
    pub run: RunId,
    pub step: StepId,
    pub iteration: u32,
    /// The immutable request.
    pub request: Value,
    pub request_hash: String,
    pub status: JudgmentStatus,
    pub result: Option<Value>,
    pub created_at: i64,
    pub answered_at: Option<i64>,
    /// When it expired unanswered.
    #[serde(default)]
    pub expired_at: Option<i64>,
}

/// A judgment write inside a [`Commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum JudgmentWrite {
    /// Record a new request for the commit's run.
    Open {
        id: JudgmentId,
        step: StepId,
        iteration: u32,
        request: Value,
        request_hash: String,
        at: i64,
    },
    /// Record the answer to an open request of the commit's run. A request is
    /// answered once; the engine validates the answer before it writes it.
    Answer {
        id: JudgmentId,
        result: Value,
        at: i64,
    },
    /// Close an open request of the commit's run unanswered: its timeout
    /// passed. An expired request takes no answer.
    Expire { id: JudgmentId, at: i64 },
}

// ------------------------------------------------------------------ commit

/// How durable a [`Commit`] is when `commit` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Durability {
    /// On stable storage (fsynced): survives a power loss.
    #[default]
    Sync,
    /// Written and ordered but not fsynced: survives a process crash
    /// (SIGKILL), not a power loss. A later `Sync` commit makes it, and
    /// everything before it, durable.
    Buffered,
}

/// The new status of a run. The status, reason and output hash become these
/// values (a `None` clears the field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunUpdate {
    pub status: RunStatus,
    pub reason: Option<String>,
    /// Must name a stored blob or one in the same commit.
    pub output_hash: Option<BlobHash>,
    pub updated_at: i64,
    /// The run's timer from now on (see [`RunRecord::wake_at`]); `None`
    /// clears it. A run that ends has none.
    pub wake_at: Option<i64>,
}

/// The store's one write path for a run's progress: everything in it is
/// written in one transaction, or nothing is.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub run: RunId,
    /// The lease the writer holds: the commit is refused, with nothing
    /// written, unless the run's current lease is this owner at this epoch
    /// ([`StoreError::LeaseLost`](crate::StoreError::LeaseLost)). `None`: an
    /// unfenced write (an operator's), accepted whoever holds the run.
    pub fence: Option<Fence>,
    /// Blobs the rest of the commit refers to (prompts, outputs).
    pub blobs: Vec<Vec<u8>>,
    /// Appended to the episode; `seq`s continue exactly from the last stored one.
    pub events: Vec<NewEvent>,
    /// Appended in order; every record's `run` must be the commit's run.
    pub intents: Vec<IntentRecord>,
    pub judgments: Vec<JudgmentWrite>,
    pub run_update: Option<RunUpdate>,
    pub durability: Durability,
}

impl Commit {
    /// An empty, unfenced, `Sync` commit for `run`.
    pub fn new(run: RunId) -> Self {
        Commit {
            run,
            fence: None,
            blobs: Vec::new(),
            events: Vec::new(),
            intents: Vec::new(),
            judgments: Vec::new(),
            run_update: None,
            durability: Durability::Sync,
        }
    }
}

/// What [`Store::gc`](crate::Store::gc) deleted — or, in a dry run, would
/// delete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Whether nothing was deleted (the counts say what would have been).
    pub dry_run: bool,
    /// Finished runs deleted, sub-workflow runs included.
    pub runs: u64,
    /// Their episodes' events.
    pub events: u64,
    /// Their intent records (one per phase of a tool call).
    pub intents: u64,
    /// Their judgment requests (with their answers or expiries).
    pub judgments: u64,
    /// Blobs no remaining run, event or intent refers to.
    pub blobs: u64,
    /// The bytes of those blobs.
    pub blob_bytes: u64,
}
