//! [`MemoryStore`]: the store of `durable: false` workflows, tests and
//! benchmarks — the same semantics as the SQLite store, kept in a process's
//! memory and gone with it.
//!
//! It enforces every rule of [`Store`] (through `rules`, shared with the
//! SQLite store) and is run through the same conformance tests. It knows
//! nothing of durability: [`Durability`](crate::Durability) is accepted and
//! ignored.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use poimen_workflow::{VersionPrefix, WorkflowId, WorkflowVersion};

use crate::error::StoreError;
use crate::ids::{BlobHash, JudgmentId, RunId};
use crate::records::{
    ArmedRecord, Commit, CreateRun, GcReport, IntentPhase, IntentRecord, JudgmentRecord,
    JudgmentStatus, JudgmentWrite, Lease, NewEvent, NewRun, NewVersion, PublishOutcome, RunFilter,
    RunRecord, RunStatus, StoredEvent, VersionRecord, WorkflowSummary, expiry,
};
use crate::rules;
use crate::store::{Store, StoreResult};

/// An in-memory [`Store`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    wake: crate::wake::Wakeup,
}

type AttemptKey = (String, u32, u32);

#[derive(Debug, Default)]
struct State {
    versions: Vec<VersionRecord>,
    version_index: HashMap<WorkflowVersion, usize>,
    blobs: HashMap<BlobHash, Vec<u8>>,
    runs: Vec<RunRecord>,
    /// The largest lease epoch each run had (same index as `runs`): it
    /// outlives a release, so every tenure's epoch is larger than the last.
    epochs: Vec<u64>,
    run_index: HashMap<RunId, usize>,
    run_keys: HashMap<String, usize>,
    /// Each run's events as committed (their bodies stay JSON text until
    /// they are read).
    events: HashMap<RunId, Vec<NewEvent>>,
    intents: HashMap<RunId, Vec<IntentRecord>>,
    /// Last phase per (run, step, iteration, attempt).
    intent_phase: HashMap<RunId, HashMap<AttemptKey, IntentPhase>>,
    judgments: Vec<JudgmentRecord>,
    judgment_index: HashMap<JudgmentId, usize>,
    armed: HashMap<WorkflowId, ArmedRecord>,
    /// Unload deadlines by version.
    unloads: HashMap<WorkflowVersion, i64>,
}

impl MemoryStore {
    /// The events of `run` after `seq` (all of them for `None`), their
    /// bodies parsed.
    fn read_events(&self, run: &RunId, seq: Option<u64>) -> StoreResult<Vec<StoredEvent>> {
        // Copied under the lock (their text), parsed outside it: a long
        // episode's parse never holds up other runs' commits.
        let log: Vec<NewEvent> = match self.lock().events.get(run) {
            None => return Ok(Vec::new()),
            Some(log) => log
                .iter()
                .filter(|e| seq.is_none_or(|seq| e.seq > seq))
                .cloned()
                .collect(),
        };
        log.into_iter()
            .map(|e| {
                let body = e.body.to_value().map_err(|cause| StoreError::Corrupt {
                    path: Path::new(":memory:").to_owned(),
                    detail: format!("event {} of run {run} does not parse: {cause}", e.seq),
                })?;
                Ok(StoredEvent {
                    run: run.clone(),
                    seq: e.seq,
                    at: e.at,
                    kind: e.kind,
                    body,
                })
            })
            .collect()
    }

    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock happens before any mutation of a
        // write (every write validates first, then applies infallibly), so
        // the state is consistent and may be used.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    fn run_mut(&mut self, id: &RunId) -> Option<&mut RunRecord> {
        let i = *self.run_index.get(id)?;
        self.runs.get_mut(i)
    }

    fn run(&self, id: &RunId) -> Option<&RunRecord> {
        self.runs.get(*self.run_index.get(id)?)
    }

    fn version(&self, v: &WorkflowVersion) -> Option<&VersionRecord> {
        self.versions.get(*self.version_index.get(v)?)
    }

    fn run_index(&self, id: &RunId) -> Result<usize, StoreError> {
        self.run_index
            .get(id)
            .copied()
            .ok_or_else(|| StoreError::not_found(format!("run {id}")))
    }

    /// Starts a new tenure of run `i` for `owner`: the next epoch.
    fn claim(&mut self, i: usize, owner: &str, now: i64, ttl_ms: i64) -> Lease {
        self.epochs[i] += 1;
        let r = &mut self.runs[i];
        let lease = Lease {
            run: r.id.clone(),
            owner: owner.to_owned(),
            epoch: self.epochs[i],
            expires_at: expiry(now, ttl_ms),
        };
        r.lease = Some(lease.clone());
        r.admitted = r.admission.is_some();
        r.wake_at = None;
        lease
    }

    /// The runs of `group` that hold a slot, oldest first.
    fn admitted_in(&self, group: &str) -> Vec<&RunRecord> {
        let mut runs: Vec<&RunRecord> = self
            .runs
            .iter()
            .filter(|r| r.admitted && r.admission.as_ref().is_some_and(|a| a.group == group))
            .collect();
        runs.sort_by(|a, b| (a.created_at, a.id.as_str()).cmp(&(b.created_at, b.id.as_str())));
        runs
    }

    /// Whether run `i` may be claimed now as far as its admission group
    /// goes: it holds a slot already, needs none, or one is free.
    fn slot_for(&self, i: usize) -> bool {
        let r = &self.runs[i];
        match &r.admission {
            Some(a) if !r.admitted => self.admitted_in(&a.group).len() < a.max_runs as usize,
            _ => true,
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn publish_version(&self, new: NewVersion) -> StoreResult<PublishOutcome> {
        rules::check_version_hash(&new)?;
        let mut s = self.lock();
        if let Some(stored) = s.version(&new.version) {
            return rules::republish(stored.clone(), &new);
        }
        let parent_workflow = new
            .parent
            .and_then(|p| s.version(&p).map(|r| r.workflow_id.clone()));
        rules::check_parent(&new, parent_workflow)?;
        let rec = VersionRecord {
            version: new.version,
            parent: new.parent,
            workflow_id: new.workflow_id,
            canonical: new.canonical,
            created_at: new.created_at,
        };
        let i = s.versions.len();
        s.version_index.insert(rec.version, i);
        s.versions.push(rec.clone());
        Ok(PublishOutcome::Created(rec))
    }

    async fn version(&self, version: &WorkflowVersion) -> StoreResult<Option<VersionRecord>> {
        Ok(self.lock().version(version).cloned())
    }

    async fn resolve_version_prefix(&self, prefix: &VersionPrefix) -> StoreResult<WorkflowVersion> {
        let s = self.lock();
        let mut found: Vec<WorkflowVersion> = s
            .versions
            .iter()
            .map(|r| r.version)
            .filter(|v| prefix.matches(v))
            .collect();
        found.sort();
        match found.len() {
            0 => Err(StoreError::not_found(format!(
                "a version starting with {prefix}"
            ))),
            1 => Ok(found[0]),
            _ => {
                found.truncate(rules::MAX_PREFIX_CANDIDATES);
                Err(StoreError::AmbiguousPrefix {
                    prefix: prefix.clone(),
                    candidates: found,
                })
            }
        }
    }

    async fn versions_of(&self, workflow: &WorkflowId) -> StoreResult<Vec<VersionRecord>> {
        Ok(self
            .lock()
            .versions
            .iter()
            .filter(|r| &r.workflow_id == workflow)
            .cloned()
            .collect())
    }

    async fn latest_version(&self, workflow: &WorkflowId) -> StoreResult<Option<VersionRecord>> {
        Ok(self
            .lock()
            .versions
            .iter()
            .rev()
            .find(|r| &r.workflow_id == workflow)
            .cloned())
    }

    async fn workflows(&self) -> StoreResult<Vec<WorkflowSummary>> {
        let s = self.lock();
        let mut by_id: BTreeMap<&WorkflowId, (u64, WorkflowVersion)> = BTreeMap::new();
        for r in &s.versions {
            let e = by_id.entry(&r.workflow_id).or_insert((0, r.version));
            e.0 += 1;
            e.1 = r.version;
        }
        Ok(by_id
            .into_iter()
            .map(|(id, (n, latest))| WorkflowSummary {
                workflow_id: id.clone(),
                versions: n,
                latest,
            })
            .collect())
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> StoreResult<BlobHash> {
        let h = BlobHash::of(&bytes);
        self.lock().blobs.entry(h).or_insert(bytes);
        Ok(h)
    }

    async fn blob(&self, hash: &BlobHash) -> StoreResult<Option<Vec<u8>>> {
        let bytes = self.lock().blobs.get(hash).cloned();
        bytes
            .map(|b| rules::verify_blob(hash, b, Path::new(":memory:")))
            .transpose()
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRun> {
        let input_hash = BlobHash::of(&new.input);
        let mut s = self.lock();
        if let Some(existing) = s.run(&new.id) {
            return rules::recreate(existing.clone(), &new, input_hash);
        }
        if let Some(key) = &new.idempotency_key
            && let Some(&i) = s.run_keys.get(key)
        {
            return rules::reuse_key(s.runs[i].clone(), &new, input_hash);
        }
        let workflow_id = s
            .version(&new.version)
            .map(|v| v.workflow_id.clone())
            .ok_or_else(|| StoreError::not_found(format!("workflow version {}", new.version)))?;
        if let Some((parent, _)) = &new.parent {
            let parent_tenant = s
                .run(parent)
                .map(|p| p.tenant.as_str())
                .ok_or_else(|| StoreError::not_found(format!("parent run {parent}")))?;
            rules::check_parent_tenant(&new, parent_tenant)?;
        }
        // A group that refuses when full counts every run not yet ended; a
        // held creation takes a slot if one is free, else waits queued.
        let mut lease = new.lease;
        if let Some(a) = &new.admission {
            let mut unended: Vec<&RunRecord> = s
                .runs
                .iter()
                .filter(|r| {
                    !r.status.is_terminal()
                        && r.admission.as_ref().is_some_and(|x| x.group == a.group)
                })
                .collect();
            if a.refuse_when_full && unended.len() >= a.max_runs as usize {
                unended.sort_by(|x, y| {
                    (x.created_at, x.id.as_str()).cmp(&(y.created_at, y.id.as_str()))
                });
                let active = unended.into_iter().map(|r| r.id.clone()).collect();
                return Err(rules::admission_full(a, active));
            }
            if s.admitted_in(&a.group).len() >= a.max_runs as usize {
                lease = None;
            }
        }
        let admitted = new.admission.is_some() && lease.is_some();
        let rec = RunRecord {
            id: new.id.clone(),
            workflow_id,
            version: new.version,
            tenant: new.tenant,
            status: RunStatus::Queued,
            reason: None,
            input_hash,
            output_hash: None,
            idempotency_key: new.idempotency_key.clone(),
            parent: new.parent,
            created_at: new.created_at,
            updated_at: new.created_at,
            lease: lease.map(|l| Lease {
                run: new.id.clone(),
                owner: l.owner,
                epoch: 1,
                expires_at: expiry(new.created_at, l.ttl_ms),
            }),
            wake_at: None,
            admission: new.admission.as_ref().map(|a| a.admission()),
            admitted,
        };
        s.blobs.entry(input_hash).or_insert(new.input);
        let i = s.runs.len();
        s.epochs.push(rec.lease.as_ref().map_or(0, |l| l.epoch));
        s.run_index.insert(rec.id.clone(), i);
        if let Some(key) = new.idempotency_key {
            s.run_keys.insert(key, i);
        }
        s.runs.push(rec.clone());
        drop(s);
        if rec.lease.is_none() {
            self.wake.ring();
        }
        Ok(CreateRun::Created(rec))
    }

    async fn run(&self, id: &RunId) -> StoreResult<Option<RunRecord>> {
        Ok(self.lock().run(id).cloned())
    }

    async fn list_runs(&self, filter: RunFilter) -> StoreResult<Vec<RunRecord>> {
        let s = self.lock();
        let limit = filter.limit.map_or(usize::MAX, |l| l as usize);
        // The cursor: runs created before it (an unknown one: none).
        let end = match &filter.before {
            None => s.runs.len(),
            Some(b) => s.runs.iter().position(|r| &r.id == b).unwrap_or(0),
        };
        Ok(s.runs[..end]
            .iter()
            .rev()
            .filter(|r| filter.status.is_none_or(|st| r.status == st))
            .filter(|r| filter.admits(r))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn children(&self, parent: &RunId) -> StoreResult<Vec<RunRecord>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .filter(|r| r.parent.as_ref().is_some_and(|(p, _)| p == parent))
            .cloned()
            .collect())
    }

    async fn commit(&self, c: Commit) -> StoreResult<()> {
        rules::check_commit_shape(&c)?;
        let work = rules::may_make_work(&c);
        let mut s = self.lock();

        // Validate everything against the stored state plus the batch,
        // then apply: a refused commit leaves nothing behind.
        let run = s
            .run(&c.run)
            .ok_or_else(|| StoreError::not_found(format!("run {}", c.run)))?;
        rules::check_fence(&c, run.lease.as_ref())?;
        let (status, output) = (run.status, run.output_hash);
        let next = s.events.get(&c.run).map_or(0, |e| e.len() as u64);
        rules::check_first_seq(&c, next)?;

        let empty = HashMap::new();
        let stored_phases = s.intent_phase.get(&c.run).unwrap_or(&empty);
        let mut batch_phases: HashMap<AttemptKey, IntentPhase> = HashMap::new();
        for i in &c.intents {
            let key = (i.step.0.clone(), i.iteration, i.attempt);
            let prev = batch_phases
                .get(&key)
                .or_else(|| stored_phases.get(&key))
                .copied();
            if !rules::intent_may_follow(prev, i.phase) {
                return Err(rules::intent_out_of_order(i, prev));
            }
            batch_phases.insert(key, i.phase);
        }

        let mut opened: HashSet<&JudgmentId> = HashSet::new();
        let mut answered: HashSet<&JudgmentId> = HashSet::new();
        for j in &c.judgments {
            match j {
                JudgmentWrite::Open { id, .. } => {
                    if s.judgment_index.contains_key(id) || !opened.insert(id) {
                        return Err(StoreError::JudgmentConflict {
                            id: id.clone(),
                            detail: "a request with this id already exists".into(),
                        });
                    }
                }
                JudgmentWrite::Answer { id, .. } | JudgmentWrite::Expire { id, .. } => {
                    let stored = s.judgment_index.get(id).map(|&k| &s.judgments[k]);
                    match stored {
                        None if !opened.contains(id) => {
                            return Err(StoreError::not_found(format!("judgment request {id}")));
                        }
                        Some(rec) if rec.run != c.run => {
                            return Err(StoreError::JudgmentConflict {
                                id: id.clone(),
                                detail: format!(
                                    "it belongs to run {}, not to run {}",
                                    rec.run, c.run
                                ),
                            });
                        }
                        Some(rec) if rec.status == JudgmentStatus::Answered => {
                            return Err(answered_twice(id));
                        }
                        Some(rec) if rec.status == JudgmentStatus::Expired => {
                            return Err(rules::expired(id));
                        }
                        _ => {}
                    }
                    if !answered.insert(id) {
                        return Err(answered_twice(id));
                    }
                }
            }
        }

        rules::check_run_update(&c, status, output)?;
        let batch_blobs: HashSet<BlobHash> = c.blobs.iter().map(|b| BlobHash::of(b)).collect();
        if let Some(h) = c.run_update.as_ref().and_then(|u| u.output_hash)
            && !s.blobs.contains_key(&h)
            && !batch_blobs.contains(&h)
        {
            return Err(StoreError::not_found(format!("output blob {h}")));
        }

        // Apply.
        let Commit {
            run: run_id,
            fence: _,
            blobs,
            events,
            intents,
            judgments,
            run_update,
            durability: _,
        } = c;
        for b in blobs {
            s.blobs.entry(BlobHash::of(&b)).or_insert(b);
        }
        s.events.entry(run_id.clone()).or_default().extend(events);
        s.intent_phase
            .entry(run_id.clone())
            .or_default()
            .extend(batch_phases);
        s.intents.entry(run_id.clone()).or_default().extend(intents);
        for j in judgments {
            match j {
                JudgmentWrite::Open {
                    id,
                    step,
                    iteration,
                    request,
                    request_hash,
                    at,
                } => {
                    let k = s.judgments.len();
                    s.judgment_index.insert(id.clone(), k);
                    s.judgments.push(JudgmentRecord {
                        id,
                        run: run_id.clone(),
                        step,
                        iteration,
                        request,
                        request_hash,
                        status: JudgmentStatus::Open,
                        result: None,
                        created_at: at,
                        answered_at: None,
                        expired_at: None,
                    });
                }
                JudgmentWrite::Answer { id, result, at } => {
                    if let Some(&k) = s.judgment_index.get(&id) {
                        let rec = &mut s.judgments[k];
                        rec.status = JudgmentStatus::Answered;
                        rec.result = Some(result);
                        rec.answered_at = Some(at);
                    }
                }
                JudgmentWrite::Expire { id, at } => {
                    if let Some(&k) = s.judgment_index.get(&id) {
                        let rec = &mut s.judgments[k];
                        rec.status = JudgmentStatus::Expired;
                        rec.expired_at = Some(at);
                    }
                }
            }
        }
        if let Some(u) = run_update
            && let Some(r) = s.run_mut(&run_id)
        {
            r.status = u.status;
            r.reason = u.reason;
            r.output_hash = u.output_hash;
            r.updated_at = u.updated_at;
            r.wake_at = if u.status.is_terminal() {
                None
            } else {
                u.wake_at
            };
            // The commit that ends a run ends its tenure: nothing is left
            // to drive, and a host that dies before its release leaves no
            // lease behind.
            if u.status.is_terminal() {
                r.lease = None;
                r.admitted = false;
            }
        }
        drop(s);
        if work {
            self.wake.ring();
        }
        Ok(())
    }

    async fn wait_for_work(&self, within: std::time::Duration) {
        self.wake.wait(within).await;
    }

    async fn events(&self, run: &RunId) -> StoreResult<Vec<StoredEvent>> {
        self.read_events(run, None)
    }

    async fn events_after(&self, run: &RunId, seq: u64) -> StoreResult<Vec<StoredEvent>> {
        self.read_events(run, Some(seq))
    }

    async fn intents(&self, run: &RunId) -> StoreResult<Vec<IntentRecord>> {
        Ok(self.lock().intents.get(run).cloned().unwrap_or_default())
    }

    async fn judgment(&self, id: &JudgmentId) -> StoreResult<Option<JudgmentRecord>> {
        let s = self.lock();
        Ok(s.judgment_index.get(id).map(|&k| s.judgments[k].clone()))
    }

    async fn open_judgments(&self) -> StoreResult<Vec<JudgmentRecord>> {
        // A request of a run that ended (cancelled, failed) is no longer
        // open: nobody can answer it.
        let inner = self.lock();
        Ok(inner
            .judgments
            .iter()
            .filter(|j| j.status == JudgmentStatus::Open)
            .filter(|j| {
                inner
                    .run_index
                    .get(&j.run)
                    .and_then(|&i| inner.runs.get(i))
                    .is_some_and(|r| !r.status.is_terminal())
            })
            .cloned()
            .collect())
    }

    async fn claim_run(
        &self,
        run: &RunId,
        owner: &str,
        now: i64,
        ttl_ms: i64,
    ) -> StoreResult<Option<Lease>> {
        let mut s = self.lock();
        let i = s.run_index(run)?;
        let r = &s.runs[i];
        if !rules::may_claim(r.status, r.lease.as_ref(), owner, now) || !s.slot_for(i) {
            return Ok(None);
        }
        Ok(Some(s.claim(i, owner, now, ttl_ms)))
    }

    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl_ms: i64,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, Lease)>> {
        let mut s = self.lock();
        let mut picked: Vec<usize> = (0..s.runs.len())
            .filter(|&i| {
                let r = &s.runs[i];
                rules::is_runnable(r.status, r.lease.as_ref(), r.wake_at, now)
            })
            .collect();
        picked.sort_by(|&a, &b| {
            let (ra, rb) = (&s.runs[a], &s.runs[b]);
            (ra.created_at, ra.id.as_str()).cmp(&(rb.created_at, rb.id.as_str()))
        });
        // Oldest first; a run whose group is full is passed over (it does
        // not hold back the runs behind it), and each claim takes its slot
        // before the next is weighed.
        let mut claimed = Vec::new();
        for i in picked {
            if claimed.len() >= limit as usize {
                break;
            }
            if s.slot_for(i) {
                let lease = s.claim(i, owner, now, ttl_ms);
                claimed.push((s.runs[i].clone(), lease));
            }
        }
        Ok(claimed)
    }

    async fn renew_lease(&self, lease: &Lease, now: i64, ttl_ms: i64) -> StoreResult<Lease> {
        let mut s = self.lock();
        let i = s.run_index(&lease.run)?;
        let r = &mut s.runs[i];
        rules::check_renewal(lease, r.lease.as_ref())?;
        let renewed = Lease {
            expires_at: expiry(now, ttl_ms),
            ..lease.clone()
        };
        r.lease = Some(renewed.clone());
        Ok(renewed)
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        let mut s = self.lock();
        let i = s.run_index(&lease.run)?;
        let r = &mut s.runs[i];
        if rules::holds(r.lease.as_ref(), &lease.fence()) {
            r.lease = None;
            drop(s);
            self.wake.ring();
        }
        Ok(())
    }

    /// Nothing is ever more durable than the process.
    async fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn runs_owned_by(&self, owner: &str) -> StoreResult<Vec<RunRecord>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .filter(|r| {
                !r.status.is_terminal() && r.lease.as_ref().is_some_and(|l| l.owner == owner)
            })
            .cloned()
            .collect())
    }

    async fn in_flight_runs(&self) -> StoreResult<Vec<RunRecord>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .filter(|r| !r.status.is_terminal())
            .cloned()
            .collect())
    }

    async fn set_wake(&self, run: &RunId, at: Option<i64>) -> StoreResult<()> {
        let mut s = self.lock();
        let i = s.run_index(run)?;
        let r = &mut s.runs[i];
        if !r.status.is_terminal() {
            r.wake_at = at;
        }
        drop(s);
        self.wake.ring();
        Ok(())
    }

    async fn next_wake(&self) -> StoreResult<Option<i64>> {
        Ok(self
            .lock()
            .runs
            .iter()
            .filter(|r| !r.status.is_terminal())
            .filter_map(|r| r.wake_at)
            .min())
    }

    async fn arm(
        &self,
        workflow: &WorkflowId,
        version: Option<&WorkflowVersion>,
        at: i64,
    ) -> StoreResult<Option<ArmedRecord>> {
        let mut s = self.lock();
        if let Some(v) = version {
            let Some(&i) = s.version_index.get(v) else {
                return Err(StoreError::not_found(format!("version {v}")));
            };
            let its = &s.versions[i].workflow_id;
            if its != workflow {
                return Err(StoreError::ArmOtherWorkflow {
                    version: *v,
                    its_workflow: its.clone(),
                    workflow: workflow.clone(),
                });
            }
        }
        Ok(s.armed.insert(
            workflow.clone(),
            ArmedRecord {
                workflow_id: workflow.clone(),
                version: version.copied(),
                at,
            },
        ))
    }

    async fn armed(&self, workflow: &WorkflowId) -> StoreResult<Option<ArmedRecord>> {
        Ok(self.lock().armed.get(workflow).cloned())
    }

    async fn set_unload_deadline(
        &self,
        version: &WorkflowVersion,
        deadline: i64,
        _at: i64,
    ) -> StoreResult<()> {
        let mut s = self.lock();
        if !s.version_index.contains_key(version) {
            return Err(StoreError::not_found(format!("version {version}")));
        }
        s.unloads.insert(*version, deadline);
        Ok(())
    }

    async fn unload_deadline(&self, version: &WorkflowVersion) -> StoreResult<Option<i64>> {
        Ok(self.lock().unloads.get(version).copied())
    }

    async fn gc(&self, finished_before: i64, dry_run: bool) -> StoreResult<GcReport> {
        let mut s = self.lock();
        let doomed = s.gc_pick(finished_before);
        let mut report = GcReport {
            dry_run,
            runs: doomed.len() as u64,
            ..GcReport::default()
        };
        if doomed.is_empty() {
            return Ok(report);
        }
        report.events = doomed
            .iter()
            .map(|r| s.events.get(r).map_or(0, Vec::len) as u64)
            .sum();
        report.intents = doomed
            .iter()
            .map(|r| s.intents.get(r).map_or(0, Vec::len) as u64)
            .sum();
        report.judgments = s
            .judgments
            .iter()
            .filter(|j| doomed.contains(&j.run))
            .count() as u64;
        let named = s.blob_references(|r| doomed.contains(r));
        let kept = s.blob_references(|r| !doomed.contains(r));
        let freed: Vec<BlobHash> = named
            .difference(&kept)
            .filter_map(|h| h.parse::<BlobHash>().ok())
            .filter(|h| s.blobs.contains_key(h))
            .collect();
        report.blobs = freed.len() as u64;
        report.blob_bytes = freed.iter().map(|h| s.blobs[h].len() as u64).sum();
        if dry_run {
            return Ok(report);
        }
        for h in &freed {
            s.blobs.remove(h);
        }
        for r in &doomed {
            s.events.remove(r);
            s.intents.remove(r);
            s.intent_phase.remove(r);
        }
        s.judgments.retain(|j| !doomed.contains(&j.run));
        s.judgment_index = s
            .judgments
            .iter()
            .enumerate()
            .map(|(k, j)| (j.id.clone(), k))
            .collect();
        let (runs, epochs): (Vec<RunRecord>, Vec<u64>) = std::mem::take(&mut s.runs)
            .into_iter()
            .zip(std::mem::take(&mut s.epochs))
            .filter(|(r, _)| !doomed.contains(&r.id))
            .unzip();
        s.runs = runs;
        s.epochs = epochs;
        s.run_index = s
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i))
            .collect();
        s.run_keys = s
            .runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((r.idempotency_key.clone()?, i)))
            .collect();
        Ok(report)
    }
}

impl State {
    /// The runs gc may delete: every run of each tree whose root is a
    /// top-level run that ended before `before`, if all of them ended.
    fn gc_pick(&self, before: i64) -> HashSet<RunId> {
        let mut children: HashMap<&RunId, Vec<&RunRecord>> = HashMap::new();
        for r in &self.runs {
            if let Some((parent, _)) = &r.parent {
                children.entry(parent).or_default().push(r);
            }
        }
        let mut doomed = HashSet::new();
        for root in &self.runs {
            if root.parent.is_some() || !root.status.is_terminal() || root.updated_at >= before {
                continue;
            }
            let mut tree = vec![root];
            let mut k = 0;
            while k < tree.len() {
                let r = tree[k];
                tree.extend(children.get(&r.id).into_iter().flatten().copied());
                k += 1;
            }
            if tree.iter().all(|r| r.status.is_terminal()) {
                doomed.extend(tree.into_iter().map(|r| r.id.clone()));
            }
        }
        doomed
    }

    /// Every blob hash the runs `which` picks refer to: inputs, outputs,
    /// intents' outputs and records, events, judgments.
    fn blob_references(&self, which: impl Fn(&RunId) -> bool) -> HashSet<String> {
        let mut found = HashSet::new();
        let mut text = |t: &str| {
            found.extend(crate::ids::hashes_in(t).map(str::to_owned));
        };
        for r in self.runs.iter().filter(|r| which(&r.id)) {
            text(&r.input_hash.to_string());
            if let Some(h) = &r.output_hash {
                text(&h.to_string());
            }
        }
        for (run, intents) in &self.intents {
            if which(run) {
                for i in intents {
                    if let Some(h) = &i.output_hash {
                        text(h);
                    }
                    if let Some(rec) = &i.record {
                        text(&rec.to_string());
                    }
                }
            }
        }
        for (run, events) in &self.events {
            if which(run) {
                for e in events {
                    text(e.body.as_str());
                }
            }
        }
        for j in self.judgments.iter().filter(|j| which(&j.run)) {
            text(&j.request.to_string());
            if let Some(result) = &j.result {
                text(&result.to_string());
            }
        }
        found
    }
}

fn answered_twice(id: &JudgmentId) -> StoreError {
    StoreError::JudgmentConflict {
        id: id.clone(),
        detail: "the request is already answered".into(),
    }
}
