//! Episode events as they are committed, for whoever follows runs: a
//! [`crate::RunHandle`], a dashboard ([`crate::Host::events`]), the HTTP
//! API's server-sent events.
//!
//! The host wraps its stores in [`Observed`]: every commit that lands is
//! announced on a bounded broadcast channel ([`Hub`]) after the store
//! returned. A subscriber that falls behind is told how much it missed
//! (the channel drops its oldest items for it) and never slows a run: a
//! commit only ever does a non-blocking send, and only when someone
//! listens. A run's stream ([`run_events`]) is gapless anyway — it reads
//! what it missed back from the store — and resumable from any sequence
//! number. Runs driven by another host sharing the store are followed by
//! reading the store when nothing was announced for a while.
//!
//! This module knows the store's write path and the episode's event
//! vocabulary (to decode what it announces); it knows nothing of how runs
//! are driven.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use poimen_executor::{EpisodeEvent, Executor};
use poimen_store::{
    Commit, CreateRun, IntentRecord, JudgmentId, JudgmentRecord, Lease, NewEvent, NewRun,
    NewVersion, PublishOutcome, RunFilter, RunId, RunRecord, Store, StoreResult, StoredEvent,
    VersionRecord, WorkflowSummary,
};
use poimen_workflow::{VersionPrefix, WorkflowId, WorkflowVersion};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::error::Error;
use crate::metrics::Metrics;

/// How many commits the channel holds for the slowest subscriber before it
/// is told it lagged, unless the embedder says
/// ([`crate::HostBuilder::event_buffer`]).
pub const EVENT_BUFFER: usize = 4096;

/// How long a run's stream waits for an announcement before it reads the
/// store (a run driven by another host announces nothing here).
const IDLE_POLL: Duration = Duration::from_millis(500);

/// One committed episode event of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEvent {
    pub run: RunId,
    /// Its place in the run's episode (0 is `run_started`).
    pub seq: u64,
    /// When it was recorded, in milliseconds since the Unix epoch (the
    /// host's clock).
    pub at: i64,
    #[serde(flatten)]
    pub event: EpisodeEvent,
}

impl RunEvent {
    /// Whether the run ended with this event (completed, failed or
    /// cancelled). A failed run may still be retried: its later events
    /// follow from the next sequence number.
    pub fn ends_run(&self) -> bool {
        matches!(
            self.event,
            EpisodeEvent::RunCompleted { .. }
                | EpisodeEvent::RunFailed { .. }
                | EpisodeEvent::RunCancelled { .. }
        )
    }

    fn decode(run: &RunId, e: &NewEvent) -> Result<RunEvent, Error> {
        serde_json::from_str::<EpisodeEvent>(e.body.as_str())
            .map(|event| RunEvent {
                run: run.clone(),
                seq: e.seq,
                at: e.at,
                event,
            })
            .map_err(|cause| undecodable(run, e.seq, &cause))
    }

    fn decode_stored(e: &StoredEvent) -> Result<RunEvent, Error> {
        serde_json::from_value::<EpisodeEvent>(e.body.clone())
            .map(|event| RunEvent {
                run: e.run.clone(),
                seq: e.seq,
                at: e.at,
                event,
            })
            .map_err(|cause| undecodable(&e.run, e.seq, &cause))
    }
}

fn undecodable(run: &RunId, seq: u64, cause: &serde_json::Error) -> Error {
    Error::Run(poimen_executor::RunError::Undecodable(
        poimen_executor::episode::EpisodeError::Undecodable {
            run: run.to_string(),
            seq,
            cause: cause.to_string(),
        },
    ))
}

/// What [`crate::Host::events`] yields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostEvent {
    /// An event of a run.
    Event(Box<RunEvent>),
    /// This subscriber fell behind and `missed` commits (each one or more
    /// events) were dropped for it; a run's own stream
    /// ([`crate::RunHandle::events`]) reads them back from the store.
    Lagged { missed: u64 },
}

/// Which events [`crate::Host::events`] yields; an empty set lets all
/// through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only these runs.
    pub runs: BTreeSet<RunId>,
    /// Only runs of these workflows.
    pub workflows: BTreeSet<WorkflowId>,
    /// Only these kinds (`step_finished`, `run_completed`, …).
    pub kinds: BTreeSet<String>,
}

impl EventFilter {
    /// Every event of every run.
    pub fn all() -> EventFilter {
        EventFilter::default()
    }

    /// Only the events of `run`.
    pub fn run(run: RunId) -> EventFilter {
        EventFilter {
            runs: BTreeSet::from([run]),
            ..EventFilter::default()
        }
    }

    /// Only runs of `workflow`.
    pub fn workflow(mut self, workflow: WorkflowId) -> EventFilter {
        self.workflows.insert(workflow);
        self
    }

    /// Only events of this kind (repeatable).
    pub fn kind(mut self, kind: impl Into<String>) -> EventFilter {
        self.kinds.insert(kind.into());
        self
    }
}

/// One commit that landed.
#[derive(Debug)]
pub(crate) struct Committed {
    pub run: RunId,
    pub events: Vec<NewEvent>,
}

/// Where commits are announced.
#[derive(Debug)]
pub(crate) struct Hub {
    tx: broadcast::Sender<Arc<Committed>>,
}

impl Hub {
    pub fn new(capacity: usize) -> Arc<Hub> {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Arc::new(Hub { tx })
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Committed>> {
        self.tx.subscribe()
    }

    fn listened(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    fn announce(&self, c: Committed) {
        // A full channel drops its oldest item for the slowest receiver
        // (who is told it lagged); the send itself never waits.
        let _ = self.tx.send(Arc::new(c));
    }
}

/// A store whose commits are announced on a [`Hub`].
#[derive(Debug)]
pub(crate) struct Observed {
    inner: Arc<dyn Store>,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
}

impl Observed {
    pub fn new(inner: Arc<dyn Store>, hub: Arc<Hub>, metrics: Arc<Metrics>) -> Observed {
        Observed {
            inner,
            hub,
            metrics,
        }
    }
}

#[async_trait]
impl Store for Observed {
    async fn set_wake(&self, run: &RunId, at: Option<i64>) -> StoreResult<()> {
        self.inner.set_wake(run, at).await
    }

    async fn next_wake(&self) -> StoreResult<Option<i64>> {
        self.inner.next_wake().await
    }

    async fn arm(
        &self,
        workflow: &WorkflowId,
        version: Option<&WorkflowVersion>,
        at: i64,
    ) -> StoreResult<Option<poimen_store::ArmedRecord>> {
        self.inner.arm(workflow, version, at).await
    }

    async fn armed(&self, workflow: &WorkflowId) -> StoreResult<Option<poimen_store::ArmedRecord>> {
        self.inner.armed(workflow).await
    }

    async fn set_unload_deadline(
        &self,
        version: &WorkflowVersion,
        deadline: i64,
        at: i64,
    ) -> StoreResult<()> {
        self.inner.set_unload_deadline(version, deadline, at).await
    }

    async fn unload_deadline(&self, version: &WorkflowVersion) -> StoreResult<Option<i64>> {
        self.inner.unload_deadline(version).await
    }

    async fn gc(&self, finished_before: i64, dry_run: bool) -> StoreResult<poimen_store::GcReport> {
        self.inner.gc(finished_before, dry_run).await
    }

    async fn publish_version(&self, new: NewVersion) -> StoreResult<PublishOutcome> {
        self.inner.publish_version(new).await
    }

    async fn version(&self, version: &WorkflowVersion) -> StoreResult<Option<VersionRecord>> {
        self.inner.version(version).await
    }

    async fn resolve_version_prefix(&self, prefix: &VersionPrefix) -> StoreResult<WorkflowVersion> {
        self.inner.resolve_version_prefix(prefix).await
    }

    async fn versions_of(&self, workflow: &WorkflowId) -> StoreResult<Vec<VersionRecord>> {
        self.inner.versions_of(workflow).await
    }

    async fn latest_version(&self, workflow: &WorkflowId) -> StoreResult<Option<VersionRecord>> {
        self.inner.latest_version(workflow).await
    }

    async fn workflows(&self) -> StoreResult<Vec<WorkflowSummary>> {
        self.inner.workflows().await
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> StoreResult<poimen_store::BlobHash> {
        self.inner.put_blob(bytes).await
    }

    async fn blob(&self, hash: &poimen_store::BlobHash) -> StoreResult<Option<Vec<u8>>> {
        self.inner.blob(hash).await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRun> {
        let created = self.inner.create_run(new).await?;
        if created.is_created() {
            self.metrics.run_created();
            if let Some(lease) = &created.record().lease {
                self.metrics.claimed(lease);
            }
        }
        Ok(created)
    }

    async fn run(&self, id: &RunId) -> StoreResult<Option<RunRecord>> {
        self.inner.run(id).await
    }

    async fn list_runs(&self, filter: RunFilter) -> StoreResult<Vec<RunRecord>> {
        self.inner.list_runs(filter).await
    }

    async fn count_runs(
        &self,
        filter: RunFilter,
    ) -> StoreResult<Vec<(poimen_store::RunStatus, u64)>> {
        self.inner.count_runs(filter).await
    }

    async fn children(&self, parent: &RunId) -> StoreResult<Vec<RunRecord>> {
        self.inner.children(parent).await
    }

    async fn commit(&self, commit: Commit) -> StoreResult<()> {
        // Copied only for a listener: an unobserved host pays nothing.
        let copy = (self.hub.listened() && !commit.events.is_empty())
            .then(|| (commit.run.clone(), commit.events.clone()));
        if !self.metrics.on() {
            let result = self.inner.commit(commit).await;
            if result.is_ok()
                && let Some((run, events)) = copy
            {
                self.hub.announce(Committed { run, events });
            }
            return result;
        }
        let seen = Metrics::summarize(&commit);
        let started = std::time::Instant::now();
        let result = self.inner.commit(commit).await;
        self.metrics
            .committed(seen, started.elapsed().as_secs_f64(), result.is_ok());
        if result.is_ok()
            && let Some((run, events)) = copy
        {
            self.hub.announce(Committed { run, events });
        }
        result
    }

    async fn events(&self, run: &RunId) -> StoreResult<Vec<StoredEvent>> {
        self.inner.events(run).await
    }

    async fn events_after(&self, run: &RunId, seq: u64) -> StoreResult<Vec<StoredEvent>> {
        self.inner.events_after(run, seq).await
    }

    async fn intents(&self, run: &RunId) -> StoreResult<Vec<IntentRecord>> {
        self.inner.intents(run).await
    }

    async fn judgment(&self, id: &JudgmentId) -> StoreResult<Option<JudgmentRecord>> {
        self.inner.judgment(id).await
    }

    async fn open_judgments(&self) -> StoreResult<Vec<JudgmentRecord>> {
        self.inner.open_judgments().await
    }

    async fn claim_run(
        &self,
        run: &RunId,
        owner: &str,
        now: i64,
        ttl_ms: i64,
    ) -> StoreResult<Option<Lease>> {
        let lease = self.inner.claim_run(run, owner, now, ttl_ms).await?;
        if let Some(l) = &lease {
            self.metrics.claimed(l);
        }
        Ok(lease)
    }

    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl_ms: i64,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, Lease)>> {
        let claimed = self.inner.claim_runnable(owner, now, ttl_ms, limit).await?;
        for (_, l) in &claimed {
            self.metrics.claimed(l);
        }
        Ok(claimed)
    }

    async fn renew_lease(&self, lease: &Lease, now: i64, ttl_ms: i64) -> StoreResult<Lease> {
        self.inner.renew_lease(lease, now, ttl_ms).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.inner.release_lease(lease).await
    }

    async fn wait_for_work(&self, within: Duration) {
        self.inner.wait_for_work(within).await;
    }

    async fn sync(&self) -> StoreResult<()> {
        self.inner.sync().await
    }

    async fn runs_owned_by(&self, owner: &str) -> StoreResult<Vec<RunRecord>> {
        self.inner.runs_owned_by(owner).await
    }

    async fn in_flight_runs(&self) -> StoreResult<Vec<RunRecord>> {
        self.inner.in_flight_runs().await
    }
}

/// The events of `run` from `from` on, in order and without gaps, as they
/// are committed; the stream ends after the event that ends the run
/// ([`RunEvent::ends_run`]), or at the first error.
pub(crate) fn run_events(
    executor: Executor,
    hub: &Hub,
    run: RunId,
    from: u64,
) -> impl Stream<Item = Result<RunEvent, Error>> + Send + 'static {
    struct Follow {
        executor: Executor,
        rx: broadcast::Receiver<Arc<Committed>>,
        run: RunId,
        next: u64,
        ready: VecDeque<RunEvent>,
        /// Whether the store must be read before waiting for announcements
        /// (at the start, after a gap or a lag, after an idle wait).
        reread: bool,
        done: bool,
    }
    // Subscribed before the store is read: nothing committed in between
    // is missed.
    let state = Follow {
        executor,
        rx: hub.subscribe(),
        run,
        next: from,
        ready: VecDeque::new(),
        reread: true,
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.ready.pop_front() {
                if e.seq < s.next {
                    continue;
                }
                s.next = e.seq + 1;
                if e.ends_run() {
                    s.done = true;
                    s.ready.clear();
                }
                return Some((Ok(e), s));
            }
            if s.done {
                return None;
            }
            if s.reread {
                s.reread = false;
                match read_from(&s.executor, &s.run, s.next).await {
                    Ok(events) => s.ready.extend(events),
                    Err(e) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                }
                continue;
            }
            match tokio::time::timeout(IDLE_POLL, s.rx.recv()).await {
                Ok(Ok(c)) if c.run == s.run => {
                    let mut decoded = Vec::with_capacity(c.events.len());
                    for e in c.events.iter().filter(|e| e.seq >= s.next) {
                        match RunEvent::decode(&s.run, e) {
                            Ok(d) => decoded.push(d),
                            Err(err) => {
                                s.done = true;
                                return Some((Err(err), s));
                            }
                        }
                    }
                    match decoded.first() {
                        // A gap (a commit this host did not see): read it back.
                        Some(first) if first.seq > s.next => s.reread = true,
                        _ => s.ready.extend(decoded),
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => s.reread = true,
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
                Err(_idle) => s.reread = true,
            }
        }
    })
}

/// The stored events of `run` with a sequence number of `from` or more.
async fn read_from(executor: &Executor, run: &RunId, from: u64) -> Result<Vec<RunEvent>, Error> {
    let stored = executor.events_from(run, from).await?;
    stored.iter().map(RunEvent::decode_stored).collect()
}

/// Every committed event that `filter` lets through, with a
/// [`HostEvent::Lagged`] where this subscriber fell behind.
pub(crate) fn host_events(
    store: Arc<dyn Store>,
    hub: &Hub,
    filter: EventFilter,
) -> impl Stream<Item = HostEvent> + Send + 'static {
    /// Runs' workflows, looked up once per run (the announcement carries
    /// only the run id); forgotten wholesale past this many.
    const WORKFLOW_CACHE: usize = 10_000;
    struct Listen {
        store: Arc<dyn Store>,
        rx: broadcast::Receiver<Arc<Committed>>,
        filter: EventFilter,
        workflows: HashMap<RunId, Option<WorkflowId>>,
        ready: VecDeque<HostEvent>,
    }
    let state = Listen {
        store,
        rx: hub.subscribe(),
        filter,
        workflows: HashMap::new(),
        ready: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.ready.pop_front() {
                return Some((e, s));
            }
            let c = match s.rx.recv().await {
                Ok(c) => c,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    return Some((HostEvent::Lagged { missed }, s));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            if !s.filter.runs.is_empty() && !s.filter.runs.contains(&c.run) {
                continue;
            }
            if !s.filter.workflows.is_empty() {
                if !s.workflows.contains_key(&c.run) {
                    if s.workflows.len() >= WORKFLOW_CACHE {
                        s.workflows.clear();
                    }
                    // A run whose record cannot be read is let through by
                    // nothing that names workflows.
                    let wf = s
                        .store
                        .run(&c.run)
                        .await
                        .ok()
                        .flatten()
                        .map(|r| r.workflow_id);
                    s.workflows.insert(c.run.clone(), wf);
                }
                let wf = s.workflows.get(&c.run).cloned().flatten();
                if !wf.is_some_and(|w| s.filter.workflows.contains(&w)) {
                    continue;
                }
            }
            for e in &c.events {
                if !s.filter.kinds.is_empty() && !s.filter.kinds.contains(&e.kind) {
                    continue;
                }
                // An event this version cannot decode is skipped here; a
                // run's own stream reports it.
                if let Ok(d) = RunEvent::decode(&c.run, e) {
                    s.ready.push_back(HostEvent::Event(Box::new(d)));
                }
            }
        }
    })
}
