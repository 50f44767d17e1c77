//! The embedding API as a service uses it: a host built on the service's
//! own store (a wrapper that counts commits), model provider (scripted),
//! clock (manual) and policy (built in code); runs started through
//! `RunHandle`s, followed through their events live and after a reconnect,
//! cancelled; plugins loaded, replaced and removed while runs are in
//! flight. Everything here is the real host: sandbox, plugins, executor.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use poimen::executor::testing::ManualClock;
use poimen::store::{
    Commit, CreateRun, IntentRecord, JudgmentRecord, Lease, MemoryStore, NewRun, NewVersion,
    PublishOutcome, StoreResult, StoredEvent, VersionRecord, WorkflowSummary,
};
use poimen::workflow::VersionPrefix;
use poimen::{
    EpisodeEvent, Error, EventFilter, Failure, Host, HostEvent, JudgmentId, JudgmentSubmission,
    ModelProvider, ModelRequest, ModelResponse, PluginSource, Policy, RunFilter, RunId, RunRecord,
    RunStatus, Store, StoreError, Target, Usage, WorkflowId, WorkflowVersion,
};
use serde_json::json;

// ---------------------------------------------------------------- harness

/// The service's store: poimen's memory store, wrapped to count commits
/// and, on demand, to fail reading runs back.
#[derive(Debug, Default)]
struct CountingStore {
    inner: MemoryStore,
    commits: AtomicU64,
    events: AtomicU64,
    /// Calls of `sync` (everything written made durable).
    syncs: AtomicU64,
    fail_run_reads: AtomicBool,
    /// Another host racing this one: before every commit it claims what
    /// runs it can (and keeps what it got here).
    intruder: std::sync::Mutex<Option<Vec<RunId>>>,
}

#[async_trait]
impl Store for CountingStore {
    async fn set_wake(&self, run: &RunId, at: Option<i64>) -> StoreResult<()> {
        self.inner.set_wake(run, at).await
    }
    async fn next_wake(&self) -> StoreResult<Option<i64>> {
        self.inner.next_wake().await
    }
    async fn arm(
        &self,
        w: &WorkflowId,
        v: Option<&WorkflowVersion>,
        at: i64,
    ) -> StoreResult<Option<poimen::store::ArmedRecord>> {
        self.inner.arm(w, v, at).await
    }
    async fn armed(&self, w: &WorkflowId) -> StoreResult<Option<poimen::store::ArmedRecord>> {
        self.inner.armed(w).await
    }
    async fn set_unload_deadline(&self, v: &WorkflowVersion, d: i64, at: i64) -> StoreResult<()> {
        self.inner.set_unload_deadline(v, d, at).await
    }
    async fn unload_deadline(&self, v: &WorkflowVersion) -> StoreResult<Option<i64>> {
        self.inner.unload_deadline(v).await
    }
    async fn gc(&self, before: i64, dry_run: bool) -> StoreResult<poimen_store::GcReport> {
        self.inner.gc(before, dry_run).await
    }
    async fn publish_version(&self, new: NewVersion) -> StoreResult<PublishOutcome> {
        self.inner.publish_version(new).await
    }
    async fn version(&self, v: &WorkflowVersion) -> StoreResult<Option<VersionRecord>> {
        self.inner.version(v).await
    }
    async fn resolve_version_prefix(&self, p: &VersionPrefix) -> StoreResult<WorkflowVersion> {
        self.inner.resolve_version_prefix(p).await
    }
    async fn versions_of(&self, w: &WorkflowId) -> StoreResult<Vec<VersionRecord>> {
        self.inner.versions_of(w).await
    }
    async fn latest_version(&self, w: &WorkflowId) -> StoreResult<Option<VersionRecord>> {
        self.inner.latest_version(w).await
    }
    async fn workflows(&self) -> StoreResult<Vec<WorkflowSummary>> {
        self.inner.workflows().await
    }
    async fn put_blob(&self, bytes: Vec<u8>) -> StoreResult<poimen::store::BlobHash> {
        self.inner.put_blob(bytes).await
    }
    async fn blob(&self, h: &poimen::store::BlobHash) -> StoreResult<Option<Vec<u8>>> {
        self.inner.blob(h).await
    }
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRun> {
        self.inner.create_run(new).await
    }
    async fn run(&self, id: &RunId) -> StoreResult<Option<RunRecord>> {
        if self.fail_run_reads.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                url_redacted: "service-store".into(),
                source_message: "the service took its store down".into(),
            });
        }
        self.inner.run(id).await
    }
    async fn list_runs(&self, f: RunFilter) -> StoreResult<Vec<RunRecord>> {
        self.inner.list_runs(f).await
    }
    async fn children(&self, p: &RunId) -> StoreResult<Vec<RunRecord>> {
        self.inner.children(p).await
    }
    async fn commit(&self, commit: Commit) -> StoreResult<()> {
        if self.intruder.lock().expect("intruder").is_some() {
            // A lease it takes expires at once: it never drives them.
            let got = self.inner.claim_runnable("intruder", 0, 1, 100).await?;
            if let Some(seen) = self.intruder.lock().expect("intruder").as_mut() {
                seen.extend(got.into_iter().map(|(r, _)| r.id));
            }
        }
        let events = commit.events.len() as u64;
        self.inner.commit(commit).await?;
        self.commits.fetch_add(1, Ordering::SeqCst);
        self.events.fetch_add(events, Ordering::SeqCst);
        Ok(())
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
        ttl: i64,
    ) -> StoreResult<Option<Lease>> {
        self.inner.claim_run(run, owner, now, ttl).await
    }
    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl: i64,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, Lease)>> {
        self.inner.claim_runnable(owner, now, ttl, limit).await
    }
    async fn renew_lease(&self, l: &Lease, now: i64, ttl: i64) -> StoreResult<Lease> {
        self.inner.renew_lease(l, now, ttl).await
    }
    async fn release_lease(&self, l: &Lease) -> StoreResult<()> {
        self.inner.release_lease(l).await
    }
    async fn sync(&self) -> StoreResult<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.inner.sync().await
    }
    async fn wait_for_work(&self, within: Duration) {
        self.inner.wait_for_work(within).await;
    }
    async fn runs_owned_by(&self, owner: &str) -> StoreResult<Vec<RunRecord>> {
        self.inner.runs_owned_by(owner).await
    }
    async fn in_flight_runs(&self) -> StoreResult<Vec<RunRecord>> {
        self.inner.in_flight_runs().await
    }
}

/// The service's model: answers by the prompt's first word, and counts
/// what it was asked.
#[derive(Debug, Default)]
struct ScriptedModel {
    asked: AtomicU64,
}

#[async_trait]
impl ModelProvider for ScriptedModel {
    fn provider(&self) -> &str {
        "service-script"
    }
    fn default_model(&self) -> &str {
        "script-1"
    }
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, Failure> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let first = request.prompt.split_whitespace().next().unwrap_or("");
        Ok(ModelResponse {
            text: json!({"label": format!("about-{}", first.to_lowercase())}).to_string(),
            model: "script-1".into(),
            usage: Usage {
                tokens_in: 3,
                tokens_out: 2,
            },
        })
    }
}

/// The service's clock's fixed time (2026-01-01T00:00:00Z).
const NOW_MS: i64 = 1_767_225_600_000;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn data(&self) -> PathBuf {
        let d = self.dir.path().join("data");
        std::fs::create_dir_all(&d).expect("data dir");
        d
    }
}

fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A workflow that waits for a judgment, then runs `then` (a tool step's
/// body) — or, when the judge says `skip`, only `json`.
fn judged(id: &str, then: &str) -> String {
    format!(
        r#"id: {id}
steps:
  - id: approve
    judgment:
      question: "Go on with {{{{ inputs.case }}}}?"
      result_schema: {{type: object, properties: {{go: {{type: boolean}}}}, required: [go]}}
  - id: decide
    conditional:
      on: "steps.approve.output.go"
      then: act
      otherwise: skip
  - id: act
    tool: {then}
  - id: skip
    tool: {{name: "json@^0.1", args: {{value: {{skipped: true}}, select: ""}}}}
transitions:
  - {{from: approve, to: decide}}
output: "{{{{ steps.decide.output }}}}"
"#
    )
}

async fn answer(host: &Host, run: &RunId, go: bool) -> poimen::RunOutcome {
    let j = host
        .judgments()
        .await
        .expect("judgments")
        .into_iter()
        .find(|j| &j.run == run)
        .expect("the run's judgment");
    host.submit_judgment(
        &j.id,
        JudgmentSubmission {
            request_hash: j.request_hash.clone(),
            result: json!({"go": go}),
            executor: None,
            profile: None,
            provenance: json!({"judge": "service"}),
        },
    )
    .await
    .expect("submit")
}

async fn until_stopped(handle: &poimen::RunHandle) -> poimen::RunOutcome {
    handle
        .wait_for(Duration::from_secs(60))
        .await
        .expect("the run stops")
}

// ------------------------------------------------------------------ tests

/// A run started for a caller that waits (`POST /v1/runs?wait=`) has a
/// start that is durable only with its next durable commit. One that
/// stops in time made its stop durable; one that has not is made durable
/// before `stopped_within` returns, so its id can be handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_waiting_is_durable_before_its_id_leaves_the_host() {
    let env = Env::new();
    let store = Arc::new(CountingStore::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let host = Host::builder()
        .shared_store(store.clone())
        .models(GatedModel(gate.clone()))
        .build()
        .await
        .expect("host");
    let asks = env.write(
        "asks.yaml",
        r#"id: service.asks
steps:
  - id: ask
    model: {prompt: "Label {{ inputs.n }}", format: json}
output: "{{ steps.ask.output }}"
"#,
    );
    let wf = env.write(
        "pass.yaml",
        r#"id: service.pass
steps:
  - id: pass
    tool: {name: "json@^0.1", args: {value: {n: "{{ inputs.n }}"}, select: ""}}
output: "{{ steps.pass.output }}"
"#,
    );
    let syncs = || store.syncs.load(Ordering::SeqCst);
    // The model answers only when the gate opens: the run has not stopped
    // when the wait is over.
    let early = host
        .start_waiting(&Target::File(asks), json!({"n": 1}), Default::default())
        .await
        .expect("start");
    assert_eq!(syncs(), 0, "nothing is made durable at the start itself");
    let stopped = early
        .stopped_within(Duration::from_millis(200))
        .await
        .expect("waited");
    assert!(stopped.is_none(), "{stopped:?}");
    assert_eq!(
        syncs(),
        1,
        "a run not stopped is made durable before its id is out"
    );
    gate.add_permits(1);
    let out = until_stopped(&early).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);

    let in_time = host
        .start_waiting(&Target::File(wf), json!({"n": 2}), Default::default())
        .await
        .expect("start");
    let (rec, output) = in_time
        .stopped_within(Duration::from_secs(60))
        .await
        .expect("waited")
        .expect("stopped in time");
    assert_eq!(rec.status, RunStatus::Completed);
    assert_eq!(output, Some(json!({"n": 2})));
    assert_eq!(syncs(), 1, "a run that stopped made its own stop durable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_supplies_its_store_models_clock_and_policy() {
    let env = Env::new();
    std::fs::write(env.data().join("note.txt"), "hello from the service").expect("note");
    let store = Arc::new(CountingStore::default());
    let models = Arc::new(ScriptedModel::default());
    let clock = ManualClock::new(NOW_MS);
    let policy = Policy::in_code()
        .grant_fs_read("fs-read", "/data", env.data())
        .expect("grant");
    let host = Host::builder()
        .shared_store(store.clone())
        .models(SharedModel(models.clone()))
        .shared_clock(clock.clone())
        .policy(policy)
        .limits(poimen::CallLimits::default())
        .build()
        .await
        .expect("host");
    let wf = env.write(
        "read.yaml",
        r#"id: service.read
steps:
  - id: read
    tool: {name: "fs-read@^0.1", args: {path: "/data/note.txt"}}
  - id: label
    model:
      prompt: "{{ steps.read.output.content }}"
      format: json
transitions:
  - {from: read, to: label}
output: {text: "{{ steps.read.output.content }}", label: "{{ steps.label.output.label }}"}
"#,
    );
    let handle = host
        .start(&Target::File(wf), json!({}), Default::default())
        .await
        .expect("start");
    let out = until_stopped(&handle).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    assert_eq!(
        out.output,
        Some(json!({"text": "hello from the service", "label": "about-hello"}))
    );
    // The service's model answered, its clock stamped every event, and
    // every commit went through its store.
    assert_eq!(models.asked.load(Ordering::SeqCst), 1);
    let episode = host.episode(handle.id()).await.expect("episode");
    assert!(episode.events.iter().all(|e| e.at == NOW_MS));
    assert_eq!(
        store.events.load(Ordering::SeqCst),
        episode.events.len() as u64
    );
    assert!(store.commits.load(Ordering::SeqCst) >= 3);
    let (rec, _) = host.status(handle.id()).await.expect("status");
    assert_eq!(rec.created_at, NOW_MS);

    // The in-code policy is the one in force: the file outside its mount is
    // not reachable.
    let outside = env.write(
        "escape.yaml",
        r#"id: service.escape
steps:
  - id: read
    tool: {name: "fs-read@^0.1", args: {path: "/etc/passwd"}}
"#,
    );
    let out = host
        .run(&Target::File(outside), json!({}), Default::default())
        .await
        .expect("run");
    assert_eq!(out.status, RunStatus::Failed);
}

/// A `ModelProvider` shared with the test (the builder takes one by value).
struct SharedModel(Arc<ScriptedModel>);

/// A model that answers once a permit of its gate is there.
struct GatedModel(Arc<tokio::sync::Semaphore>);

#[async_trait]
impl ModelProvider for GatedModel {
    fn provider(&self) -> &str {
        "service-gated"
    }
    fn default_model(&self) -> &str {
        "gated-1"
    }
    async fn complete(&self, _: ModelRequest) -> Result<ModelResponse, Failure> {
        let permit = self.0.acquire().await;
        drop(permit);
        Ok(ModelResponse {
            text: json!({"label": "gated"}).to_string(),
            model: "gated-1".into(),
            usage: Usage {
                tokens_in: 1,
                tokens_out: 1,
            },
        })
    }
}

#[async_trait]
impl ModelProvider for SharedModel {
    fn provider(&self) -> &str {
        self.0.provider()
    }
    fn default_model(&self) -> &str {
        self.0.default_model()
    }
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, Failure> {
        self.0.complete(request).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_followed_live_and_again_from_a_sequence_number() {
    let env = Env::new();
    let host = Host::builder().build().await.expect("host");
    let wf = env.write(
        "judged.yaml",
        &judged(
            "service.judged",
            r#"{name: "json@^0.1", args: {value: {acted: true}, select: ""}}"#,
        ),
    );
    let handle = host
        .start(
            &Target::File(wf),
            json!({"case": "A-1"}),
            Default::default(),
        )
        .await
        .expect("start");
    let mut live = Box::pin(handle.events(0));
    let mut seen = Vec::new();
    // Live, up to the wait.
    while let Some(e) = live.next().await {
        let e = e.expect("event");
        let waiting = matches!(e.event, EpisodeEvent::RunWaiting { .. });
        seen.push(e);
        if waiting {
            break;
        }
    }
    assert_eq!(
        until_stopped(&handle).await.status,
        RunStatus::WaitingJudgment
    );
    // The answer resumes the run; the same stream goes on to its end.
    let done = answer(&host, handle.id(), true).await;
    assert_eq!(done.status, RunStatus::Completed, "{:?}", done.reason);
    while let Some(e) = live.next().await {
        seen.push(e.expect("event"));
    }
    let episode = host.episode(handle.id()).await.expect("episode");
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..episode.events.len() as u64).collect::<Vec<_>>());
    assert!(seen.last().is_some_and(|e| e.ends_run()));
    for (a, b) in seen.iter().zip(&episode.events) {
        assert_eq!(a.event, b.event);
    }
    // A follower that reconnects after event k gets the rest, and no more.
    let k = 3;
    let again: Vec<u64> = handle
        .events(k)
        .map(|e| e.expect("event").seq)
        .collect()
        .await;
    assert_eq!(again, (k..episode.events.len() as u64).collect::<Vec<_>>());
    assert_eq!(done.output, Some(json!({"acted": true})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_ends_its_handle_and_its_stream() {
    let env = Env::new();
    let host = Host::builder().build().await.expect("host");
    let wf = env.write(
        "judged.yaml",
        &judged(
            "service.cancel",
            r#"{name: "json@^0.1", args: {value: 1, select: ""}}"#,
        ),
    );
    let handle = host
        .start(&Target::File(wf), json!({"case": "C"}), Default::default())
        .await
        .expect("start");
    assert_eq!(
        until_stopped(&handle).await.status,
        RunStatus::WaitingJudgment
    );
    let rec = handle.cancel().await.expect("cancel");
    assert_eq!(rec.status, RunStatus::Cancelled);
    assert_eq!(until_stopped(&handle).await.status, RunStatus::Cancelled);
    let events: Vec<_> = handle.events(0).collect().await;
    let last = events.last().expect("events").as_ref().expect("event");
    assert!(
        matches!(last.event, EpisodeEvent::RunCancelled { .. }),
        "{last:?}"
    );
    assert!(host.judgments().await.expect("judgments").is_empty());
    // Cancelling again is refused, naming why.
    assert!(matches!(
        handle.cancel().await,
        Err(Error::Operator(poimen::OperatorError::WrongStatus { .. }))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_stream_filters_and_a_slow_subscriber_is_told_it_lagged() {
    let env = Env::new();
    let a = env.write(
        "a.yaml",
        "id: service.a\nsteps:\n  - id: one\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"\"}}\n",
    );
    let b = env.write(
        "b.yaml",
        "id: service.b\nsteps:\n  - id: one\n    tool: {name: \"json@^0.1\", args: {value: 2, select: \"\"}}\n",
    );
    let runs = |host: Host| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let mut b_runs = Vec::new();
            for i in 0..3 {
                for (wf, b_run) in [(&a, false), (&b, true)] {
                    let out = host
                        .run(
                            &Target::File(wf.clone()),
                            json!({"i": i}),
                            Default::default(),
                        )
                        .await
                        .expect("run");
                    assert_eq!(out.status, RunStatus::Completed);
                    if b_run {
                        b_runs.push(out.run);
                    }
                }
            }
            b_runs
        }
    };

    // A dashboard that follows only workflow b's run endings.
    let host = Host::builder().build().await.expect("host");
    let mut endings = Box::pin(
        host.events(
            EventFilter::all()
                .workflow(WorkflowId::from("service.b"))
                .kind("run_completed"),
        ),
    );
    for run in runs(host.clone()).await {
        match endings.next().await {
            Some(HostEvent::Event(e)) => {
                assert_eq!(e.run, run);
                assert!(matches!(e.event, EpisodeEvent::RunCompleted { .. }));
            }
            other => panic!("expected b's run ending, got {other:?}"),
        }
    }

    // A subscriber that reads nothing while runs go on, on a host whose
    // channel holds 4 commits: the runs finish without waiting for it, and
    // it is told how much it missed, then gets what the channel still
    // holds.
    let host = Host::builder().event_buffer(4).build().await.expect("host");
    let mut slow = Box::pin(host.events(EventFilter::all()));
    runs(host.clone()).await;
    match slow.next().await {
        Some(HostEvent::Lagged { missed }) => assert!(missed > 0),
        other => panic!("expected a lag signal, got {other:?}"),
    }
    assert!(matches!(slow.next().await, Some(HostEvent::Event(_))));
}

/// A run queued with its starter's trace context (what `POST /v1/runs`
/// records under `poimen serve`) and claimed by the serving loop: its
/// `run_started` keeps the carrier, and the run's span is handed to the
/// embedder's `trace_parent` with it — the serving loop has no span of its
/// own for the run to nest under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_continues_the_trace_its_starter_recorded() {
    type Seen = Vec<(String, poimen::TraceCarrier)>;
    let env = Env::new();
    let seen: Arc<std::sync::Mutex<Seen>> = Arc::default();
    let host = Host::builder()
        .shared_store(Arc::new(CountingStore::default()))
        .trace_parent({
            let seen = seen.clone();
            move |span, carrier| {
                // Disabled when no subscriber is set yet (tests share the
                // process's; another sets it).
                let name = span.metadata().map_or("run", |m| m.name()).to_owned();
                seen.lock().expect("seen").push((name, carrier.clone()));
            }
        })
        .build()
        .await
        .expect("host");
    let wf = env.write(
        "traced.yaml",
        "id: service.traced\nsteps:\n  - id: one\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"\"}}\n",
    );
    let carrier: poimen::TraceCarrier = [(
        "traceparent".to_owned(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
    )]
    .into();
    let run = host
        .enqueue(
            &Target::File(wf),
            json!({}),
            poimen::RunOptions {
                trace: Some(carrier.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue");
    // A run started without one records none.
    let untraced = host
        .enqueue(
            &Target::Version("service.traced@latest".into()),
            json!({"other": true}),
            Default::default(),
        )
        .await
        .expect("enqueue");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn({
        let host = host.clone();
        async move {
            host.serve(
                poimen::ServeOptions {
                    workers: 2,
                    poll: Duration::from_millis(20),
                    grace: Duration::from_secs(5),
                    slots: None,
                },
                async move {
                    let _ = stopped.await;
                },
            )
            .await
        }
    });
    for r in [&run, &untraced] {
        let done = host
            .wait(r, Some(Duration::from_secs(60)))
            .await
            .expect("wait");
        assert_eq!(done.status, RunStatus::Completed, "{:?}", done.reason);
    }
    let _ = stop.send(());
    serving.await.expect("join").expect("serve");
    assert_eq!(
        *seen.lock().expect("seen"),
        vec![("run".to_owned(), carrier.clone())],
        "the traced run's span, and only it, continues the recorded trace"
    );
    let episode = host.episode(&run).await.expect("episode");
    match &episode.events[0].event {
        EpisodeEvent::RunStarted { trace, .. } => assert_eq!(trace.as_ref(), Some(&carrier)),
        other => panic!("first event {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_run_is_claimable_only_once_its_start_is_recorded() {
    // A serving host that claimed a queued run before its `run_started`
    // was stored would find no start to drive, and the enqueuer's own
    // write would then conflict: the enqueuer holds the run until its
    // start is stored. Here another host claims before every commit.
    let env = Env::new();
    let store = Arc::new(CountingStore::default());
    let host = Host::builder()
        .shared_store(store.clone())
        .shared_clock(ManualClock::new(NOW_MS))
        .build()
        .await
        .expect("host");
    let wf = env.write(
        "queued.yaml",
        "id: service.queued\nsteps:\n  - id: one\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"\"}}\n",
    );
    *store.intruder.lock().expect("intruder") = Some(Vec::new());
    let run = host
        .enqueue(&Target::File(wf), json!({}), Default::default())
        .await
        .expect("enqueue");
    let claimed = store.intruder.lock().expect("intruder").take();
    assert_eq!(
        claimed,
        Some(Vec::new()),
        "claimed before its start was stored"
    );
    let (rec, _) = host.status(&run).await.expect("status");
    assert_eq!(rec.status, RunStatus::Queued);
    assert!(rec.lease.is_none(), "handed back: {:?}", rec.lease);
    let events = host.episode(&run).await.expect("episode");
    assert!(
        matches!(
            events.events.first().map(|e| &e.event),
            Some(EpisodeEvent::RunStarted { .. })
        ),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_that_stops_a_started_run_reaches_its_handle() {
    let env = Env::new();
    let store = Arc::new(CountingStore::default());
    let host = Host::builder()
        .shared_store(store.clone())
        .build()
        .await
        .expect("host");
    let wf = env.write(
        "one.yaml",
        "id: service.one\nsteps:\n  - id: one\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"\"}}\n",
    );
    // Published and pinned first; then the store stops answering run
    // reads, which the driving task needs.
    host.publish(&host.load_file(&wf).expect("load").def, Default::default())
        .await
        .expect("publish");
    store.fail_run_reads.store(true, Ordering::SeqCst);
    let handle = host
        .start(
            &Target::Version("service.one@latest".into()),
            json!({}),
            Default::default(),
        )
        .await
        .expect("start");
    match handle.wait().await {
        Err(Error::Driver { run, cause }) => {
            assert_eq!(&run, handle.id());
            assert!(
                cause
                    .to_string()
                    .contains("the service took its store down"),
                "{cause}"
            );
        }
        other => panic!("expected the driver's error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_are_loaded_replaced_and_removed_while_runs_are_in_flight() {
    let env = Env::new();
    std::fs::write(env.data().join("case.txt"), "the real file").expect("case");
    let policy = Policy::in_code()
        .grant_fs_read("fs-read", "/data", env.data())
        .expect("grant");
    let host = Host::builder()
        .bundled_plugins(false)
        .plugin(PluginSource::bytes(
            "service:json",
            bytes(plugin_artifacts::JSON),
        ))
        .policy(policy)
        .build()
        .await
        .expect("host");
    let read = r#"{name: "fs-read@^0.1", args: {path: "/data/case.txt"}}"#;
    let wf = env.write("judged.yaml", &judged("service.files", read));
    let start = |case: &str| {
        let host = host.clone();
        let wf = wf.clone();
        let case = case.to_owned();
        async move {
            host.start(&Target::File(wf), json!({"case": case}), Default::default())
                .await
        }
    };

    // Not loaded yet: a run of the workflow is refused before it starts.
    assert!(matches!(start("early").await, Err(Error::Invalid { .. })));

    // Loaded at run time, checked as at start: the real fs-read.
    let real = host
        .load_plugin(Path::new(plugin_artifacts::FS_READ))
        .await
        .expect("load fs-read");
    assert_eq!(real.info.name, "fs-read");
    // A component the policy does not grant is refused as at start, and
    // bytes that are no component too; nothing is loaded by either.
    assert!(matches!(
        host.load_plugin(Path::new(plugin_artifacts::HTTP_GET))
            .await,
        Err(Error::Plugin(poimen::LoadError::CapabilityDenied { .. }))
    ));
    assert!(matches!(
        host.load_plugin(b"not a component".to_vec()).await,
        Err(Error::Plugin(_))
    ));
    assert!(!host.tools().iter().any(|t| t.info.name == "http-get"));

    let a = start("A").await.expect("start A");
    let d = start("D").await.expect("start D");
    let e = start("E").await.expect("start E");
    for h in [&a, &d, &e] {
        assert_eq!(until_stopped(h).await.status, RunStatus::WaitingJudgment);
    }

    // Replaced while A, D and E wait: a component that names itself
    // fs-read 0.1.9. New runs resolve to it; A keeps what it pinned.
    let replaced = host
        .replace_plugin(Path::new(plugin_artifacts::ADV_IMPOSTOR))
        .await
        .expect("replace");
    assert_eq!(replaced.retired.len(), 1);
    assert_eq!(replaced.retired[0].info.digest, real.info.digest);
    assert_ne!(replaced.loaded.info.digest, real.info.digest);
    let b = start("B").await.expect("start B");
    assert_eq!(until_stopped(&b).await.status, RunStatus::WaitingJudgment);

    let out_a = answer(&host, a.id(), true).await;
    assert_eq!(out_a.status, RunStatus::Completed, "{:?}", out_a.reason);
    assert_eq!(
        out_a.output.as_ref().map(|o| &o["content"]),
        Some(&json!("the real file"))
    );
    let out_b = answer(&host, b.id(), true).await;
    assert_eq!(out_b.status, RunStatus::Completed, "{:?}", out_b.reason);
    assert_eq!(out_b.output, Some(json!("impostor")));

    // Removed: a new run is refused naming it; D, which pinned the real
    // one and reaches it, fails naming it and its digest; E, which does
    // not reach it, completes.
    let removed = host.remove_plugin("fs-read", None).expect("remove");
    assert_eq!(removed.len(), 2, "the replacement and the retired one");
    match start("late").await {
        Err(e @ Error::Invalid { .. }) => assert!(e.to_string().contains("fs-read"), "{e}"),
        other => panic!("expected a refusal naming fs-read, got {other:?}"),
    }
    let out_d = answer(&host, d.id(), true).await;
    assert_eq!(out_d.status, RunStatus::Failed);
    let reason = out_d.reason.unwrap_or_default();
    assert!(
        reason.contains("fs-read") && reason.contains(&real.info.digest),
        "{reason}"
    );
    let out_e = answer(&host, e.id(), false).await;
    assert_eq!(out_e.status, RunStatus::Completed, "{:?}", out_e.reason);
    assert_eq!(out_e.output, Some(json!({"skipped": true})));

    // Nothing left to replace or remove under that name, and it says so.
    assert!(matches!(
        host.remove_plugin("fs-read", None),
        Err(Error::Plugin(poimen::LoadError::NotLoaded { .. }))
    ));
    assert!(matches!(
        host.replace_plugin(Path::new(plugin_artifacts::FS_READ))
            .await,
        Err(Error::Plugin(poimen::LoadError::NotLoaded { .. }))
    ));
}

// ------------------------------------------------------------ telemetry

/// One span as a subscriber saw it: its name, its parent's, its fields.
#[derive(Debug, Clone)]
struct SeenSpan {
    id: u64,
    name: &'static str,
    parent_id: Option<u64>,
    parent: Option<&'static str>,
    fields: std::collections::BTreeMap<String, String>,
}

/// A tracing layer that keeps every span it is told of, each under a
/// number of its own (the subscriber reuses the ids of closed spans).
#[derive(Clone, Default)]
struct Spans(Arc<std::sync::Mutex<SpanLog>>);

#[derive(Default)]
struct SpanLog {
    seen: Vec<SeenSpan>,
    /// Open spans: subscriber id → number.
    open: std::collections::HashMap<u64, u64>,
}

struct Fields<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = std::collections::BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx.span(id).and_then(|s| s.parent());
        let mut log = self.0.lock().expect("spans");
        let number = log.seen.len() as u64;
        let parent_id = parent
            .as_ref()
            .and_then(|p| log.open.get(&p.id().into_u64()).copied());
        log.open.insert(id.into_u64(), number);
        log.seen.push(SeenSpan {
            id: number,
            name: attrs.metadata().name(),
            parent_id,
            parent: parent.map(|p| p.metadata().name()),
            fields,
        });
    }

    fn on_close(&self, id: tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        self.0.lock().expect("spans").open.remove(&id.into_u64());
    }
}

/// `name{labels} value` of a Prometheus text exposition, or 0.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_traced_run_step_attempt_guest_call_and_counted_in_metrics() {
    use tracing_subscriber::layer::SubscriberExt;
    // The process's subscriber (a scoped one misses spans made on other
    // threads): it sees the other tests' spans too, so what is checked
    // below is the tree under this test's runs.
    let spans = Spans::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
        .expect("the only test that sets the global subscriber");

    let env = Env::new();
    let host = Host::builder()
        .shared_store(Arc::new(CountingStore::default()))
        .build()
        .await
        .expect("host");
    let wf = env.write(
        "traced.yaml",
        r#"id: service.traced
steps:
  - id: pick
    tool: {name: "json@^0.1", args: {value: {secret: "{{ inputs.secret }}"}, select: "/secret"}}
  - id: again
    tool: {name: "json@^0.1", args: {value: {n: 2}, select: "/n"}}
transitions:
  - {from: pick, to: again}
"#,
    );
    let mut runs = Vec::new();
    for n in 0..3 {
        let out = host
            .run(
                &Target::File(wf.clone()),
                json!({"secret": format!("s3cr3t-{n}")}),
                Default::default(),
            )
            .await
            .expect("run");
        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
        runs.push(out.run);
    }
    let bad = host
        .run(
            &Target::File(env.write(
                "failing.yaml",
                "id: service.failing\nsteps:\n  - id: boom\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"/no/such\"}}\n",
            )),
            json!({}),
            Default::default(),
        )
        .await
        .expect("run");
    assert_eq!(bad.status, RunStatus::Failed, "{:?}", bad.reason);

    // The span tree: run → step → attempt → guest_call, with the fields an
    // operator filters by; arguments only as their hash.
    let all = spans.0.lock().expect("spans").seen.clone();
    // This test's runs' spans and everything under them.
    let mut mine: std::collections::BTreeSet<u64> = all
        .iter()
        .filter(|s| {
            s.name == "run"
                && s.fields.get("run").is_some_and(|r| {
                    runs.iter().any(|x| x.to_string() == *r) || *r == bad.run.to_string()
                })
        })
        .map(|s| s.id)
        .collect();
    loop {
        let more: Vec<u64> = all
            .iter()
            .filter(|s| s.parent_id.is_some_and(|p| mine.contains(&p)) && !mine.contains(&s.id))
            .map(|s| s.id)
            .collect();
        if more.is_empty() {
            break;
        }
        mine.extend(more);
    }
    let seen: Vec<SeenSpan> = all.into_iter().filter(|s| mine.contains(&s.id)).collect();
    for run in &runs {
        let run_span: Vec<&SeenSpan> = seen
            .iter()
            .filter(|s| s.name == "run" && s.fields.get("run") == Some(&run.to_string()))
            .collect();
        assert_eq!(run_span.len(), 1, "one run span for {run}: {seen:#?}");
        let f = &run_span[0].fields;
        assert_eq!(
            f.get("workflow").map(String::as_str),
            Some("service.traced")
        );
        assert!(
            f.get("version").is_some_and(|v| v.starts_with("b3:")),
            "{f:?}"
        );
    }
    let of = |name: &str| seen.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let steps = of("step");
    assert_eq!(steps.len(), 3 * 2 + 1, "{steps:#?}");
    assert!(steps.iter().all(|s| s.parent == Some("run")), "{steps:#?}");
    assert!(
        steps
            .iter()
            .all(|s| s.fields.get("kind").map(String::as_str) == Some("tool"))
    );
    let attempts = of("attempt");
    assert_eq!(attempts.len(), steps.len(), "{attempts:#?}");
    assert!(attempts.iter().all(|s| s.parent == Some("step")));
    let calls = of("guest_call");
    assert_eq!(calls.len(), steps.len(), "{calls:#?}");
    for c in &calls {
        assert_eq!(c.parent, Some("attempt"));
        assert_eq!(c.fields.get("tool").map(String::as_str), Some("json"));
        assert!(c.fields.get("digest").is_some_and(|d| d.starts_with("b3:")));
        assert!(
            c.fields
                .get("args_hash")
                .is_some_and(|h| h.starts_with("b3:"))
        );
    }
    let dump = format!("{seen:?}");
    assert!(!dump.contains("s3cr3t"), "arguments never reach a span");

    // The metrics count what happened.
    let text = host.metrics_text();
    assert_eq!(sample(&text, "poimen_runs_created_total"), 4.0, "{text}");
    assert_eq!(
        sample(&text, r#"poimen_runs_ended_total{status="completed"}"#),
        3.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"poimen_runs_ended_total{status="failed"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"poimen_step_duration_seconds_count{kind="tool",status="completed"}"#
        ),
        6.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"poimen_step_duration_seconds_count{kind="tool",status="failed"}"#
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"poimen_guest_call_duration_seconds_count{tool="json"}"#
        ),
        7.0,
        "{text}"
    );
    assert!(
        sample(&text, r#"poimen_guest_call_fuel_count{tool="json"}"#) >= 7.0,
        "{text}"
    );
    // Memory per call: every json call grew at least one 64 KiB page, and
    // none came near the 1 GiB bucket.
    assert_eq!(
        sample(
            &text,
            r#"poimen_guest_call_memory_bytes_count{tool="json"}"#
        ),
        7.0,
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == r#"poimen_guest_call_memory_bytes_bucket{le="65536.0",tool="json"} 0"#),
        "{text}"
    );
    assert!(
        sample(&text, r#"poimen_guest_call_memory_bytes_sum{tool="json"}"#) > 7.0 * 65_536.0,
        "{text}"
    );
    assert!(
        sample(&text, "poimen_store_commit_duration_seconds_count") >= 8.0,
        "{text}"
    );
    assert_eq!(sample(&text, "poimen_scheduler_workers"), 8.0, "{text}");
    assert_eq!(
        sample(&text, r#"poimen_pressure{level="ok"}"#),
        1.0,
        "{text}"
    );
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );
}
