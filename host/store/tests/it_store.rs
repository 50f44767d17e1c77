//! The store's tests: one conformance suite run against every backend
//! (`sqlite::*`, `memory::*` and `postgres::*`), then what only a file can
//! show — triggers under raw SQL, bytes on disk, damaged and foreign files,
//! schema versions and the v1 fixture, read-only and full disks, SIGKILL
//! mid-commit — and what only a server can: its triggers, schema versions,
//! refused connections and reconnects, several stores on one database.
//!
//! The PostgreSQL tests run on a throwaway server this test binary starts
//! (`poimen-test-pg`: `initdb` and `pg_ctl` of the installed server
//! binaries, a temporary directory, a free port), or on the one
//! `POIMEN_TEST_PG` names. Each test creates its own database and drops it
//! at the end. Without the server binaries they fail, naming the package
//! to install — they never skip.
//!
//! Tests assert error *values* (variants and their fields), never panics.
//! Nothing here knows the executor: runs, events and intents are made up.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use poimen_store::{
    Admission, AdmissionRequest, ArmedRecord, BlobHash, Commit, CreateRun, DEFAULT_TENANT,
    Durability, EventBody, Fence, GcReport, IntentPhase, IntentRecord, JudgmentId, JudgmentStatus,
    JudgmentWrite, Lease, LeaseRequest, MemoryStore, NewEvent, NewRun, NewVersion, OpenCheck,
    PublishOutcome, RunFilter, RunId, RunRecord, RunStatus, RunUpdate, SCHEMA_VERSION,
    SqliteOptions, SqliteStore, Store, StoreError, Ulid, VersionRecord,
};
use poimen_workflow::{EffectClass, StepId, VersionPrefix, WorkflowId, WorkflowVersion};
use serde_json::{Value, json};

// ------------------------------------------------------------------ helpers

const T0: i64 = 1_700_000_000_000;

fn run_id(n: u128) -> RunId {
    RunId::generate(Ulid::from_parts(T0 as u64, n))
}

fn judgment_id(n: u128) -> JudgmentId {
    JudgmentId::generate(Ulid::from_parts(T0 as u64, n))
}

fn wf(id: &str) -> WorkflowId {
    WorkflowId::from(id)
}

fn canonical(id: &str, tag: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","steps":[{{"id":"{tag}","tool":{{"name":"echo"}}}}]}}"#).into_bytes()
}

async fn publish(
    s: &dyn Store,
    id: &str,
    tag: &str,
    parent: Option<WorkflowVersion>,
) -> VersionRecord {
    let out = s
        .publish_version(NewVersion::of(wf(id), canonical(id, tag), parent, T0))
        .await
        .expect("publish");
    out.record().clone()
}

fn new_run(n: u128, version: WorkflowVersion, input: &Value) -> NewRun {
    NewRun {
        id: run_id(n),
        version,
        input: serde_json::to_vec(input).expect("json"),
        tenant: DEFAULT_TENANT.to_owned(),
        idempotency_key: None,
        parent: None,
        lease: None,
        admission: None,
        created_at: T0 + n as i64,
    }
}

async fn make_run(s: &dyn Store, n: u128) -> RunRecord {
    let v = publish(s, "demo.flow", "a", None).await;
    s.create_run(new_run(n, v.version, &json!({"n": n as u64})))
        .await
        .expect("create run")
        .into_record()
}

fn event(seq: u64, kind: &str) -> NewEvent {
    NewEvent {
        seq,
        at: T0 + seq as i64,
        kind: kind.to_owned(),
        body: json!({"seq": seq, "kind": kind}).into(),
    }
}

fn intent(run: &RunId, step: &str, attempt: u32, phase: IntentPhase) -> IntentRecord {
    IntentRecord {
        run: run.clone(),
        step: StepId::from(step),
        iteration: 0,
        attempt,
        phase,
        tool: "ledger".into(),
        tool_version: "0.1.0".into(),
        digest: "sha256:abc".into(),
        effect: EffectClass::Idempotent,
        args_hash: "b3:args".into(),
        idempotency_key: format!("ik-{step}"),
        output_hash: (phase == IntentPhase::Committed).then(|| "b3:out".to_owned()),
        error: (phase == IntentPhase::Failed).then(|| "unavailable".to_owned()),
        record: (phase == IntentPhase::Committed).then(|| json!({"fs": [], "http": []})),
        at: T0,
    }
}

fn commit_of(run: &RunId, events: Vec<NewEvent>) -> Commit {
    Commit {
        events,
        ..Commit::new(run.clone())
    }
}

/// A store under test, with whatever keeps it alive (dropped after the
/// store: fields drop in order).
struct Harness {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
    #[cfg(feature = "postgres")]
    _db: Option<pg::TestDb>,
}

impl Harness {
    async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(Self::sqlite_path(&dir))
            .await
            .expect("open");
        Harness {
            store: Arc::new(store),
            _dir: Some(dir),
            #[cfg(feature = "postgres")]
            _db: None,
        }
    }

    fn memory() -> Self {
        Harness {
            store: Arc::new(MemoryStore::new()),
            _dir: None,
            #[cfg(feature = "postgres")]
            _db: None,
        }
    }

    #[cfg(feature = "postgres")]
    async fn postgres() -> Self {
        let db = pg::TestDb::create().await;
        let store = poimen_store::PostgresStore::open(&db.url)
            .await
            .expect("open the PostgreSQL store");
        Harness {
            store: Arc::new(store),
            _dir: None,
            _db: Some(db),
        }
    }

    fn sqlite_path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("nested/dir/poimen.db")
    }

    fn s(&self) -> &dyn Store {
        &*self.store
    }

    /// This store, and another handle on the same data as a second host
    /// opens it (the memory store has only the one).
    async fn stores(&self) -> Vec<Arc<dyn Store>> {
        let mut all = vec![Arc::clone(&self.store)];
        if let Some(dir) = &self._dir {
            let other = SqliteStore::open(Self::sqlite_path(dir))
                .await
                .expect("open");
            all.push(Arc::new(other));
        }
        #[cfg(feature = "postgres")]
        if let Some(db) = &self._db {
            let other = poimen_store::PostgresStore::open(&db.url)
                .await
                .expect("open the PostgreSQL store");
            all.push(Arc::new(other));
        }
        all
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Harness::sqlite().await).await
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Harness::memory()).await
                }
            )*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Harness::postgres().await).await
                }
            )*
        }
    };
}

conformance!(
    publish_creates_then_returns_existing,
    publish_refuses_a_wrong_hash_and_a_changed_identity,
    parent_must_exist_and_share_the_workflow,
    prefixes_resolve_or_say_why_not,
    versions_of_lists_the_dag_in_publish_order,
    blobs_round_trip_idempotently,
    run_idempotency_keys,
    run_creation_checks_references,
    runs_are_listed_and_linked,
    runs_are_filtered_paged_and_counted,
    commit_appends_events_in_order,
    sequence_conflicts_are_detected,
    a_failed_commit_leaves_nothing,
    intents_are_append_only_and_follow_the_protocol,
    abandoned_follows_dispatched_only_and_is_final,
    runs_carry_their_tenant,
    a_child_of_another_tenant_is_refused,
    idempotency_keys_are_global_across_tenants,
    judgments_open_and_answer_once,
    run_updates_and_final_states,
    leases_and_recovery_queries,
    a_run_created_with_a_lease_is_held,
    a_takeover_after_expiry_starts_a_new_epoch,
    a_reclaim_by_the_same_owner_starts_a_new_epoch,
    a_fenced_commit_after_a_takeover_writes_nothing,
    the_commit_that_ends_a_run_ends_its_tenure,
    admission_holds_a_group_to_max_runs_oldest_first,
    a_full_group_refuses_or_queues_a_new_run,
    racing_claimers_never_admit_more_than_max_runs,
    a_write_that_makes_work_wakes_a_waiting_host,
    claim_runnable_takes_the_oldest_runs_that_need_a_driver,
    concurrent_claim_runnable_callers_never_share_a_run,
    concurrent_commits_from_many_tasks,
    json_bodies_round_trip_exactly,
    a_waiting_runs_timer_makes_it_claimable_once_due,
    a_judgment_request_expires_once_and_then_takes_no_answer,
    arming_moves_the_current_version_and_disarming_clears_it,
    unload_deadlines_are_kept_by_version,
    gc_deletes_finished_runs_and_what_only_they_refer_to,
    gc_keeps_a_finished_child_of_a_live_run_and_frees_idempotency_keys,
);

// ------------------------------------------------------------- conformance

/// Ends `run` as `status` at `at`, with `output` as its output blob and
/// `events` (from seq `seq`); `extra` may add to the commit.
async fn finish(
    s: &dyn Store,
    run: &RunId,
    status: RunStatus,
    at: i64,
    output: Option<&[u8]>,
    extra: impl FnOnce(&mut Commit),
) {
    let mut c = Commit::new(run.clone());
    if let Some(bytes) = output {
        c.blobs.push(bytes.to_vec());
    }
    c.run_update = Some(RunUpdate {
        status,
        reason: None,
        output_hash: output.map(BlobHash::of),
        updated_at: at,
        wake_at: None,
    });
    extra(&mut c);
    s.commit(c).await.expect("finish");
}

async fn gc_deletes_finished_runs_and_what_only_they_refer_to(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    let cutoff = T0 + 1_000;
    let shared = b"shared by an old and a recent run".to_vec();
    let shared_hash = BlobHash::of(&shared);
    let prompt = b"a prompt only the old run used".to_vec();
    let prompt_hash = BlobHash::of(&prompt);

    // Old and finished: an episode, a tool call's intents (its output a
    // blob), a judgment asked and answered, a prompt blob named in an
    // event, an output blob.
    let old = make_run(s, 1).await;
    let mut c = commit_of(
        &old.id,
        vec![
            event(0, "run_started"),
            NewEvent {
                body: json!({"prompt": prompt_hash.to_string(), "shared": shared_hash.to_string()})
                    .into(),
                ..event(1, "model_called")
            },
        ],
    );
    c.blobs = vec![prompt.clone(), shared.clone()];
    let mut committed = intent(&old.id, "fetch", 0, IntentPhase::Committed);
    committed.output_hash = Some(shared_hash.to_string());
    c.intents = vec![
        intent(&old.id, "fetch", 0, IntentPhase::Pending),
        intent(&old.id, "fetch", 0, IntentPhase::Dispatched),
        committed,
    ];
    c.judgments = vec![JudgmentWrite::Open {
        id: judgment_id(1),
        step: StepId::from("review"),
        iteration: 0,
        request: json!({"question": "ship it?"}),
        request_hash: "b3:req".into(),
        at: T0 + 2,
    }];
    s.commit(c).await.expect("old run's work");
    let mut c = commit_of(&old.id, vec![event(2, "judgment_answered")]);
    c.judgments = vec![JudgmentWrite::Answer {
        id: judgment_id(1),
        result: json!({"ok": true}),
        at: T0 + 3,
    }];
    s.commit(c).await.expect("answered");
    finish(
        s,
        &old.id,
        RunStatus::Completed,
        T0 + 10,
        Some(b"old output"),
        |c| {
            c.events = vec![event(3, "run_completed")];
        },
    )
    .await;
    // Old and failed, and old and cancelled: both finished.
    let failed = make_run(s, 2).await;
    finish(s, &failed.id, RunStatus::Failed, T0 + 20, None, |c| {
        c.events = vec![event(0, "run_failed")];
    })
    .await;
    let cancelled = make_run(s, 3).await;
    finish(
        s,
        &cancelled.id,
        RunStatus::Cancelled,
        T0 + 30,
        None,
        |_| {},
    )
    .await;
    // Finished after the cutoff: kept, and so is the blob it shares.
    let recent = make_run(s, 4).await;
    finish(
        s,
        &recent.id,
        RunStatus::Completed,
        cutoff + 1,
        Some(&shared),
        |c| {
            c.events = vec![event(0, "run_completed")];
        },
    )
    .await;
    // Old but not finished: queued, running, waiting: never touched.
    let queued = make_run(s, 5).await;
    let running = make_run(s, 6).await;
    finish(s, &running.id, RunStatus::Running, T0 + 5, None, |c| {
        c.events = vec![event(0, "run_started")];
    })
    .await;
    let waiting = make_run(s, 7).await;
    finish(
        s,
        &waiting.id,
        RunStatus::WaitingJudgment,
        T0 + 5,
        None,
        |_| {},
    )
    .await;

    let blob_count = |hs: &[&BlobHash]| {
        let hs: Vec<BlobHash> = hs.iter().map(|h| **h).collect();
        async move {
            let mut n = 0;
            for h in &hs {
                if s.blob(h).await.expect("blob").is_some() {
                    n += 1;
                }
            }
            n
        }
    };
    let old_inputs = [old.input_hash, failed.input_hash, cancelled.input_hash];
    let old_output = BlobHash::of(b"old output");
    let want = GcReport {
        dry_run: true,
        runs: 3,
        events: 4 + 1,
        intents: 3,
        judgments: 1,
        // Three inputs, the old output, the prompt; not the shared blob.
        blobs: 5,
        blob_bytes: [b"{\"n\":1}".len(), b"{\"n\":2}".len(), b"{\"n\":3}".len()]
            .iter()
            .sum::<usize>() as u64
            + b"old output".len() as u64
            + prompt.len() as u64,
    };
    // A dry run says what would go, and nothing goes.
    let dry = s.gc(cutoff, true).await.expect("dry run");
    assert_eq!(dry, want);
    assert_eq!(s.events(&old.id).await.expect("events").len(), 4);
    assert!(s.run(&old.id).await.expect("read").is_some());
    assert!(s.blob(&prompt_hash).await.expect("blob").is_some());

    let real = s.gc(cutoff, false).await.expect("gc");
    assert_eq!(
        real,
        GcReport {
            dry_run: false,
            ..want
        }
    );
    for gone in [&old, &failed, &cancelled] {
        assert_eq!(s.run(&gone.id).await.expect("read"), None, "{}", gone.id);
        assert_eq!(s.events(&gone.id).await.expect("events"), vec![]);
        assert_eq!(s.intents(&gone.id).await.expect("intents"), vec![]);
    }
    assert_eq!(s.judgment(&judgment_id(1)).await.expect("judgment"), None);
    assert_eq!(
        blob_count(&[&old_inputs[0], &old_inputs[1], &old_inputs[2]]).await,
        0
    );
    assert_eq!(blob_count(&[&old_output, &prompt_hash]).await, 0);
    // What something else still refers to stays: the shared blob, the
    // kept runs with their episodes and inputs, the version.
    assert_eq!(blob_count(&[&shared_hash]).await, 1);
    for kept in [&recent, &queued, &running, &waiting] {
        let rec = s.run(&kept.id).await.expect("read").expect("kept");
        assert!(s.blob(&rec.input_hash).await.expect("input").is_some());
    }
    assert_eq!(s.events(&running.id).await.expect("events").len(), 1);
    assert!(s.version(&v.version).await.expect("version").is_some());
    let listed = s.list_runs(RunFilter::default()).await.expect("list");
    assert_eq!(listed.len(), 4, "{listed:?}");

    // Nothing left to free; and the finished-later run goes once its time comes.
    assert_eq!(
        s.gc(cutoff, false).await.expect("again"),
        GcReport::default()
    );
    let later = s.gc(cutoff + 2, false).await.expect("later");
    assert_eq!(
        (later.runs, later.events, later.blobs),
        (1, 1, 2),
        "{later:?}"
    );
    assert!(s.blob(&shared_hash).await.expect("blob").is_none());
}

async fn gc_keeps_a_finished_child_of_a_live_run_and_frees_idempotency_keys(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    let cutoff = T0 + 1_000;
    let child_of = |n: u128, parent: &RunId| NewRun {
        parent: Some((parent.clone(), StepId::from("sub"))),
        ..new_run(n, v.version, &json!({"child": n as u64}))
    };
    // A live parent with a finished child: both stay (the parent's replay
    // may read its child).
    let live = make_run(s, 1).await;
    finish(s, &live.id, RunStatus::Running, T0 + 5, None, |_| {}).await;
    let child = s
        .create_run(child_of(2, &live.id))
        .await
        .expect("child")
        .into_record();
    finish(s, &child.id, RunStatus::Completed, T0 + 6, None, |_| {}).await;
    // A finished parent whose child still runs (orphaned by a crash): both stay.
    let done = make_run(s, 3).await;
    let orphan = s
        .create_run(child_of(4, &done.id))
        .await
        .expect("child")
        .into_record();
    finish(s, &done.id, RunStatus::Failed, T0 + 7, None, |_| {}).await;
    // A finished tree, under an idempotency key: all of it goes, two levels deep.
    let keyed = s
        .create_run(NewRun {
            idempotency_key: Some("order-7".into()),
            ..new_run(5, v.version, &json!({"order": 7}))
        })
        .await
        .expect("keyed")
        .into_record();
    let mid = s
        .create_run(child_of(6, &keyed.id))
        .await
        .expect("mid")
        .into_record();
    let leaf = s
        .create_run(child_of(7, &mid.id))
        .await
        .expect("leaf")
        .into_record();
    for (r, at) in [(&leaf, T0 + 8), (&mid, T0 + 9), (&keyed, T0 + 10)] {
        finish(s, &r.id, RunStatus::Completed, at, None, |_| {}).await;
    }

    let report = s.gc(cutoff, false).await.expect("gc");
    assert_eq!(report.runs, 3, "{report:?}");
    for r in [&keyed, &mid, &leaf] {
        assert_eq!(s.run(&r.id).await.expect("read"), None);
    }
    for r in [&live, &child, &done, &orphan] {
        assert!(s.run(&r.id).await.expect("read").is_some(), "{} kept", r.id);
    }
    // The key is free again: a start under it is a new run.
    let again = s
        .create_run(NewRun {
            idempotency_key: Some("order-7".into()),
            ..new_run(8, v.version, &json!({"order": 7}))
        })
        .await
        .expect("a new run under the freed key");
    assert!(again.is_created(), "{again:?}");
}

async fn a_waiting_runs_timer_makes_it_claimable_once_due(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let lease = claim(s, &run.id, "host-1", T0).await.expect("claimed");
    s.commit(fenced(&lease, vec![event(0, "run_started")]))
        .await
        .expect("started");
    // The driver halts the run waiting, with a timer.
    let mut c = set_status(&run.id, RunStatus::WaitingJudgment);
    c.fence = Some(lease.fence());
    c.events = vec![event(1, "run_waiting")];
    if let Some(u) = c.run_update.as_mut() {
        u.wake_at = Some(T0 + 1_000);
    }
    s.commit(c).await.expect("waiting");
    s.release_lease(&lease).await.expect("released");
    let rec = s.run(&run.id).await.expect("read").expect("run");
    assert_eq!(rec.wake_at, Some(T0 + 1_000));
    assert_eq!(s.next_wake().await.expect("next"), Some(T0 + 1_000));

    // Not yet due: a waiting run is an operator's, not a server's.
    let early = s
        .claim_runnable("server", T0 + 999, TTL, 10)
        .await
        .expect("claim");
    assert!(early.iter().all(|(r, _)| r.id != run.id), "{early:?}");
    // Due: claimed, and the claim clears the timer (the driver sets the next).
    let due = s
        .claim_runnable("server", T0 + 1_000, TTL, 10)
        .await
        .expect("claim");
    let (claimed, _) = due
        .iter()
        .find(|(r, _)| r.id == run.id)
        .expect("the woken run is claimed");
    assert_eq!(claimed.status, RunStatus::WaitingJudgment);
    assert_eq!(claimed.wake_at, None);
    let rec = s.run(&run.id).await.expect("read").expect("run");
    assert_eq!(rec.wake_at, None);
    assert_eq!(s.next_wake().await.expect("next"), None);
    // Held by a live lease, a due run is not claimed again.
    s.set_wake(&run.id, Some(T0 + 500)).await.expect("set");
    let again = s
        .claim_runnable("other", T0 + 1_001, TTL, 10)
        .await
        .expect("claim");
    assert!(again.iter().all(|(r, _)| r.id != run.id));
    // An ended run has no timer, and setting one does nothing.
    let mut end = set_status(&run.id, RunStatus::Failed);
    end.events = vec![event(2, "run_failed")];
    s.commit(end).await.expect("failed");
    s.set_wake(&run.id, Some(T0)).await.expect("no-op");
    assert_eq!(
        s.run(&run.id).await.expect("read").expect("run").wake_at,
        None
    );
    assert_eq!(s.next_wake().await.expect("next"), None);
    let err = s
        .set_wake(&run_id(99), Some(T0))
        .await
        .expect_err("unknown run");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

async fn a_judgment_request_expires_once_and_then_takes_no_answer(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let other = make_run(s, 2).await;
    let open = |n: u128| JudgmentWrite::Open {
        id: judgment_id(n),
        step: StepId::from("review"),
        iteration: 1,
        request: json!({"question": "ship it?"}),
        request_hash: format!("b3:req{n}"),
        at: T0,
    };
    let with = |run: &RunId, judgments: Vec<JudgmentWrite>| {
        let mut c = Commit::new(run.clone());
        c.judgments = judgments;
        c
    };
    s.commit(with(&run.id, vec![open(1), open(2)]))
        .await
        .expect("open");
    // Another run may not expire it; this one does, once.
    let err = s
        .commit(with(
            &other.id,
            vec![JudgmentWrite::Expire {
                id: judgment_id(1),
                at: T0 + 5,
            }],
        ))
        .await
        .expect_err("not its request");
    assert!(
        matches!(err, StoreError::JudgmentConflict { .. }),
        "{err:?}"
    );
    s.commit(with(
        &run.id,
        vec![JudgmentWrite::Expire {
            id: judgment_id(1),
            at: T0 + 5,
        }],
    ))
    .await
    .expect("expire");
    let j = s
        .judgment(&judgment_id(1))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(
        (j.status, j.result.clone(), j.expired_at),
        (JudgmentStatus::Expired, None, Some(T0 + 5))
    );
    let listed: Vec<_> = s
        .open_judgments()
        .await
        .expect("open")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(
        listed,
        vec![judgment_id(2)],
        "an expired request is not open"
    );
    for late in [
        JudgmentWrite::Answer {
            id: judgment_id(1),
            result: json!(true),
            at: T0 + 6,
        },
        JudgmentWrite::Expire {
            id: judgment_id(1),
            at: T0 + 6,
        },
    ] {
        let err = s
            .commit(with(&run.id, vec![late]))
            .await
            .expect_err("closed");
        assert!(
            matches!(&err, StoreError::JudgmentConflict { .. }),
            "{err:?}"
        );
    }
    // An answered request does not expire.
    s.commit(with(
        &run.id,
        vec![JudgmentWrite::Answer {
            id: judgment_id(2),
            result: json!(true),
            at: T0 + 7,
        }],
    ))
    .await
    .expect("answer");
    let err = s
        .commit(with(
            &run.id,
            vec![JudgmentWrite::Expire {
                id: judgment_id(2),
                at: T0 + 8,
            }],
        ))
        .await
        .expect_err("answered");
    assert!(
        matches!(err, StoreError::JudgmentConflict { .. }),
        "{err:?}"
    );
}

async fn arming_moves_the_current_version_and_disarming_clears_it(h: &Harness) {
    let s = h.s();
    let w = wf("demo.flow");
    let v1 = publish(s, "demo.flow", "a", None).await.version;
    let v2 = publish(s, "demo.flow", "b", Some(v1)).await.version;
    let other = publish(s, "other.flow", "a", None).await.version;
    assert_eq!(s.armed(&w).await.expect("read"), None);
    assert_eq!(s.arm(&w, Some(&v1), T0).await.expect("arm v1"), None);
    let before = s.arm(&w, Some(&v2), T0 + 1).await.expect("arm v2");
    assert_eq!(
        before,
        Some(ArmedRecord {
            workflow_id: w.clone(),
            version: Some(v1),
            at: T0
        })
    );
    let disarmed = s.arm(&w, None, T0 + 2).await.expect("disarm");
    assert_eq!(disarmed.and_then(|r| r.version), Some(v2));
    assert_eq!(
        s.armed(&w).await.expect("read"),
        Some(ArmedRecord {
            workflow_id: w.clone(),
            version: None,
            at: T0 + 2
        })
    );
    // A version of another workflow, or one not stored, is refused.
    let err = s
        .arm(&w, Some(&other), T0 + 3)
        .await
        .expect_err("another workflow's");
    assert!(
        matches!(&err, StoreError::ArmOtherWorkflow { workflow, .. } if *workflow == w),
        "{err:?}"
    );
    let missing = WorkflowVersion::of_canonical_bytes(b"never published");
    let err = s
        .arm(&w, Some(&missing), T0 + 3)
        .await
        .expect_err("missing");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert_eq!(
        s.armed(&w).await.expect("read").map(|r| r.at),
        Some(T0 + 2),
        "a refused arm changes nothing"
    );
}

async fn unload_deadlines_are_kept_by_version(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await.version;
    assert_eq!(s.unload_deadline(&v).await.expect("read"), None);
    s.set_unload_deadline(&v, T0 + 60_000, T0)
        .await
        .expect("set");
    assert_eq!(
        s.unload_deadline(&v).await.expect("read"),
        Some(T0 + 60_000)
    );
    s.set_unload_deadline(&v, T0 + 5_000, T0 + 1)
        .await
        .expect("moved");
    assert_eq!(s.unload_deadline(&v).await.expect("read"), Some(T0 + 5_000));
    let missing = WorkflowVersion::of_canonical_bytes(b"never published");
    let err = s
        .set_unload_deadline(&missing, T0, T0)
        .await
        .expect_err("missing");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

async fn publish_creates_then_returns_existing(h: &Harness) {
    let s = h.s();
    let v1 = NewVersion::of(wf("a.flow"), canonical("a.flow", "one"), None, T0);
    let created = s.publish_version(v1.clone()).await.expect("publish");
    assert!(created.is_created());
    let rec = created.record().clone();
    assert_eq!(
        rec.version,
        WorkflowVersion::of_canonical_bytes(&v1.canonical)
    );
    assert_eq!(
        s.version(&rec.version).await.expect("read"),
        Some(rec.clone())
    );

    // Same bytes again, later: a no-op returning the stored record.
    let again = NewVersion {
        created_at: T0 + 99,
        ..v1.clone()
    };
    assert_eq!(
        s.publish_version(again).await.expect("republish"),
        PublishOutcome::Existing {
            record: rec.clone(),
            ignored_parent: None
        }
    );

    // Same bytes with a parent: the outcome says the parent was ignored.
    let other = publish(s, "a.flow", "two", None).await;
    let with_parent = NewVersion {
        parent: Some(other.version),
        ..v1
    };
    assert_eq!(
        s.publish_version(with_parent).await.expect("republish"),
        PublishOutcome::Existing {
            record: rec.clone(),
            ignored_parent: Some(other.version)
        }
    );
    assert_eq!(s.version(&rec.version).await.expect("read"), Some(rec));
    assert_eq!(s.versions_of(&wf("a.flow")).await.expect("list").len(), 2);
}

async fn publish_refuses_a_wrong_hash_and_a_changed_identity(h: &Harness) {
    let s = h.s();
    let bytes = canonical("a.flow", "one");
    let claimed = WorkflowVersion::of_canonical_bytes(b"something else");
    let err = s
        .publish_version(NewVersion {
            version: claimed,
            parent: None,
            workflow_id: wf("a.flow"),
            canonical: bytes.clone(),
            created_at: T0,
        })
        .await
        .expect_err("mismatch");
    let actual = WorkflowVersion::of_canonical_bytes(&bytes);
    assert!(
        matches!(&err, StoreError::VersionHashMismatch { claimed: c, actual: a } if *c == claimed && *a == actual),
        "{err:?}"
    );
    assert!(s.version(&claimed).await.expect("read").is_none());

    // The same bytes offered under another workflow id: a conflict, not a new record.
    publish(s, "a.flow", "one", None).await;
    let err = s
        .publish_version(NewVersion::of(wf("b.flow"), bytes, None, T0))
        .await
        .expect_err("conflict");
    assert!(
        matches!(&err, StoreError::VersionConflict { version, .. } if *version == actual),
        "{err:?}"
    );
    assert!(err.is_corruption());
}

async fn parent_must_exist_and_share_the_workflow(h: &Harness) {
    let s = h.s();
    let ghost = WorkflowVersion::of_canonical_bytes(b"never published");
    let err = s
        .publish_version(NewVersion::of(
            wf("a.flow"),
            canonical("a.flow", "x"),
            Some(ghost),
            T0,
        ))
        .await
        .expect_err("unknown parent");
    assert!(
        matches!(&err, StoreError::UnknownParent { parent } if *parent == ghost),
        "{err:?}"
    );
    assert!(err.to_string().contains(&ghost.to_string()), "{err}");

    let b = publish(s, "b.flow", "x", None).await;
    let err = s
        .publish_version(NewVersion::of(
            wf("a.flow"),
            canonical("a.flow", "x"),
            Some(b.version),
            T0,
        ))
        .await
        .expect_err("other workflow");
    assert!(
        matches!(&err, StoreError::ParentOfOtherWorkflow { parent, parent_workflow, workflow }
            if *parent == b.version && parent_workflow.as_str() == "b.flow" && workflow.as_str() == "a.flow"),
        "{err:?}"
    );
    assert!(s.versions_of(&wf("a.flow")).await.expect("list").is_empty());
}

/// Two tags whose versions share their first six hex digits.
fn colliding_tags() -> (String, String) {
    let mut seen = std::collections::HashMap::new();
    for n in 0u32.. {
        let tag = format!("t{n}");
        let v = WorkflowVersion::of_canonical_bytes(&canonical("p.flow", &tag));
        let short = v.hex()[..6].to_owned();
        if let Some(prev) = seen.insert(short, tag.clone()) {
            return (prev, tag);
        }
    }
    unreachable!("the loop returns")
}

async fn prefixes_resolve_or_say_why_not(h: &Harness) {
    let s = h.s();
    let (t1, t2) = colliding_tags();
    let a = publish(s, "p.flow", &t1, None).await;
    let b = publish(s, "p.flow", &t2, None).await;
    let short = VersionPrefix::parse(&a.version.hex()[..6]).expect("prefix");
    let err = s
        .resolve_version_prefix(&short)
        .await
        .expect_err("ambiguous");
    let mut both = vec![a.version, b.version];
    both.sort();
    assert!(
        matches!(&err, StoreError::AmbiguousPrefix { candidates, .. } if *candidates == both),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&a.version.to_string()) && msg.contains(&b.version.to_string()),
        "{msg}"
    );

    // Enough digits to tell them apart resolve; so does the full version.
    let common = a
        .version
        .hex()
        .chars()
        .zip(b.version.hex().chars())
        .take_while(|(x, y)| x == y)
        .count();
    let longer =
        VersionPrefix::parse(&format!("b3:{}", &a.version.hex()[..common + 1])).expect("prefix");
    assert_eq!(
        s.resolve_version_prefix(&longer).await.expect("unique"),
        a.version
    );
    let full = VersionPrefix::parse(&b.version.to_string()).expect("full");
    assert_eq!(
        s.resolve_version_prefix(&full).await.expect("full"),
        b.version
    );

    // A prefix of nothing stored.
    let hex = a.version.hex();
    let flipped = if hex.starts_with('0') { "1" } else { "0" };
    let none = VersionPrefix::parse(&format!("{flipped}{}", &hex[1..8])).expect("prefix");
    let err = s.resolve_version_prefix(&none).await.expect_err("none");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

async fn versions_of_lists_the_dag_in_publish_order(h: &Harness) {
    let s = h.s();
    assert!(s.workflows().await.expect("workflows").is_empty());
    assert!(
        s.latest_version(&wf("a.flow"))
            .await
            .expect("latest")
            .is_none()
    );
    let v1 = publish(s, "a.flow", "1", None).await;
    let v2 = publish(s, "a.flow", "2", Some(v1.version)).await;
    let other = publish(s, "b.flow", "1", None).await;
    let v3 = publish(s, "a.flow", "3", Some(v1.version)).await; // a fork
    let list = s.versions_of(&wf("a.flow")).await.expect("list");
    let pairs: Vec<_> = list.iter().map(|r| (r.version, r.parent)).collect();
    assert_eq!(
        pairs,
        vec![
            (v1.version, None),
            (v2.version, Some(v1.version)),
            (v3.version, Some(v1.version))
        ]
    );
    assert_eq!(
        s.latest_version(&wf("a.flow")).await.expect("latest"),
        Some(v3.clone())
    );
    // Re-publishing an old version does not make it the latest.
    publish(s, "a.flow", "1", None).await;
    assert_eq!(
        s.latest_version(&wf("a.flow")).await.expect("latest"),
        Some(v3.clone())
    );
    let summary = s.workflows().await.expect("workflows");
    let got: Vec<_> = summary
        .iter()
        .map(|w| (w.workflow_id.as_str().to_owned(), w.versions, w.latest))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a.flow".to_owned(), 3, v3.version),
            ("b.flow".to_owned(), 1, other.version)
        ]
    );
}

async fn blobs_round_trip_idempotently(h: &Harness) {
    let s = h.s();
    let bytes = b"\x00\x01 some bytes \xff".to_vec();
    let hash = s.put_blob(bytes.clone()).await.expect("put");
    assert_eq!(hash, BlobHash::of(&bytes));
    assert!(hash.to_string().starts_with("b3:"));
    assert_eq!(s.put_blob(bytes.clone()).await.expect("again"), hash);
    assert_eq!(s.blob(&hash).await.expect("get"), Some(bytes));
    assert_eq!(s.blob(&BlobHash::of(b"absent")).await.expect("get"), None);
    let empty = s.put_blob(Vec::new()).await.expect("empty");
    assert_eq!(s.blob(&empty).await.expect("get"), Some(Vec::new()));
}

async fn run_idempotency_keys(h: &Harness) {
    let s = h.s();
    let v = publish(s, "a.flow", "1", None).await;
    let v2 = publish(s, "a.flow", "2", Some(v.version)).await;
    let keyed = |n: u128, version: WorkflowVersion, input: Value| NewRun {
        idempotency_key: Some("order-42".into()),
        ..new_run(n, version, &input)
    };
    let first = s
        .create_run(keyed(1, v.version, json!({"order": 42})))
        .await
        .expect("create");
    assert!(first.is_created());
    let first = first.into_record();

    // Same key, same version and input, another id: the existing run.
    let again = s
        .create_run(keyed(2, v.version, json!({"order": 42})))
        .await
        .expect("again");
    assert_eq!(again, CreateRun::Existing(first.clone()));
    assert!(s.run(&run_id(2)).await.expect("read").is_none());

    // Same key, different input: refused, naming both input hashes.
    let other_input = serde_json::to_vec(&json!({"order": 43})).expect("json");
    let err = s
        .create_run(keyed(3, v.version, json!({"order": 43})))
        .await
        .expect_err("conflict");
    let new_hash = BlobHash::of(&other_input);
    match &err {
        StoreError::IdempotencyConflict(c) => {
            assert_eq!(c.key, "order-42");
            assert_eq!(c.existing_run, first.id);
            assert_eq!(c.existing_input_hash, first.input_hash);
            assert_eq!(c.new_input_hash, new_hash);
        }
        other => panic!("expected IdempotencyConflict, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&first.input_hash.to_string()) && msg.contains(&new_hash.to_string()),
        "{msg}"
    );
    assert!(s.run(&run_id(3)).await.expect("read").is_none());

    // Same key and input, another version: refused too.
    let err = s
        .create_run(keyed(4, v2.version, json!({"order": 42})))
        .await
        .expect_err("conflict");
    assert!(
        matches!(&err, StoreError::IdempotencyConflict(c)
            if c.existing_version == v.version && c.new_version == v2.version),
        "{err:?}"
    );
}

async fn run_creation_checks_references(h: &Harness) {
    let s = h.s();
    let ghost = WorkflowVersion::of_canonical_bytes(b"ghost");
    let err = s
        .create_run(new_run(1, ghost, &json!({})))
        .await
        .expect_err("no version");
    assert!(
        matches!(&err, StoreError::NotFound { what } if what.contains(&ghost.to_string())),
        "{err:?}"
    );

    let v = publish(s, "a.flow", "1", None).await;
    let orphan = NewRun {
        parent: Some((run_id(99), StepId::from("sub"))),
        ..new_run(1, v.version, &json!({}))
    };
    let err = s.create_run(orphan).await.expect_err("no parent");
    assert!(
        matches!(&err, StoreError::NotFound { what } if what.contains(run_id(99).as_str())),
        "{err:?}"
    );

    let created = s
        .create_run(new_run(1, v.version, &json!({"x": 1})))
        .await
        .expect("create")
        .into_record();
    assert_eq!(created.workflow_id.as_str(), "a.flow");
    assert_eq!(created.status, RunStatus::Queued);
    assert_eq!(created.created_at, created.updated_at);
    assert_eq!(
        s.run(&created.id).await.expect("read"),
        Some(created.clone())
    );
    // The input is kept as a blob.
    assert_eq!(
        s.blob(&created.input_hash).await.expect("blob"),
        Some(serde_json::to_vec(&json!({"x": 1})).expect("json"))
    );
    // A retried create (same id, same content) is answered with the run.
    assert_eq!(
        s.create_run(new_run(1, v.version, &json!({"x": 1})))
            .await
            .expect("retry"),
        CreateRun::Existing(created.clone())
    );
    // The same id for another run is refused.
    let err = s
        .create_run(new_run(1, v.version, &json!({"x": 2})))
        .await
        .expect_err("id reuse");
    assert!(
        matches!(&err, StoreError::RunIdConflict { id } if *id == created.id),
        "{err:?}"
    );
}

async fn runs_are_listed_and_linked(h: &Harness) {
    let s = h.s();
    let a = publish(s, "a.flow", "1", None).await;
    let b = publish(s, "b.flow", "1", None).await;
    let parent = s
        .create_run(new_run(1, a.version, &json!(1)))
        .await
        .expect("parent")
        .into_record();
    for n in 2..=4u128 {
        let child = NewRun {
            parent: Some((parent.id.clone(), StepId::from(format!("sub{n}").as_str()))),
            ..new_run(n, b.version, &json!(n as u64))
        };
        s.create_run(child).await.expect("child");
    }
    s.create_run(new_run(5, a.version, &json!(5)))
        .await
        .expect("other");

    let kids = s.children(&parent.id).await.expect("children");
    let ids: Vec<_> = kids.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids, vec![run_id(2), run_id(3), run_id(4)]);
    assert_eq!(
        kids[0].parent,
        Some((parent.id.clone(), StepId::from("sub2")))
    );

    let all = s.list_runs(RunFilter::default()).await.expect("all");
    let ids: Vec<_> = all.iter().map(|r| r.id.clone()).collect();
    assert_eq!(
        ids,
        (1..=5u128).rev().map(run_id).collect::<Vec<_>>(),
        "newest first"
    );
    let of_a = s
        .list_runs(RunFilter {
            workflow_id: Some(wf("a.flow")),
            ..RunFilter::default()
        })
        .await
        .expect("of a");
    assert_eq!(
        of_a.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        vec![run_id(5), run_id(1)]
    );
    let limited = s
        .list_runs(RunFilter {
            parent: Some(parent.id.clone()),
            limit: Some(2),
            ..RunFilter::default()
        })
        .await
        .expect("limited");
    assert_eq!(
        limited.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        vec![run_id(4), run_id(3)]
    );

    let mut done = Commit::new(run_id(5));
    done.run_update = Some(RunUpdate {
        status: RunStatus::Failed,
        reason: Some("boom".into()),
        output_hash: None,
        updated_at: T0 + 50,
        wake_at: None,
    });
    s.commit(done).await.expect("update");
    let failed = s
        .list_runs(RunFilter {
            status: Some(RunStatus::Failed),
            ..RunFilter::default()
        })
        .await
        .expect("failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].reason.as_deref(), Some("boom"));
}

async fn runs_are_filtered_paged_and_counted(h: &Harness) {
    let s = h.s();
    let a1 = publish(s, "a.flow", "1", None).await;
    let a2 = publish(s, "a.flow", "2", Some(a1.version)).await;
    // Runs 1..=6: odd ones on a1, even ones on a2; run 3 under a key.
    for n in 1..=6u128 {
        let version = if n % 2 == 1 { a1.version } else { a2.version };
        let new = NewRun {
            idempotency_key: (n == 3).then(|| "order-3".to_owned()),
            ..new_run(n, version, &json!(n as u64))
        };
        s.create_run(new).await.expect("run");
    }
    let mut failed = Commit::new(run_id(2));
    failed.run_update = Some(RunUpdate {
        status: RunStatus::Failed,
        reason: Some("boom".into()),
        output_hash: None,
        updated_at: T0 + 50,
        wake_at: None,
    });
    s.commit(failed).await.expect("fail run 2");
    let ids = |runs: Vec<RunRecord>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let list = |f: RunFilter| async move { ids(s.list_runs(f).await.expect("list")) };

    assert_eq!(
        list(RunFilter {
            version: Some(a2.version),
            ..RunFilter::default()
        })
        .await,
        vec![run_id(6), run_id(4), run_id(2)],
        "by version"
    );
    assert_eq!(
        list(RunFilter {
            idempotency_key: Some("order-3".into()),
            ..RunFilter::default()
        })
        .await,
        vec![run_id(3)],
        "by key"
    );
    assert_eq!(
        list(RunFilter {
            created_from: Some(T0 + 2),
            created_until: Some(T0 + 5),
            ..RunFilter::default()
        })
        .await,
        vec![run_id(4), run_id(3), run_id(2)],
        "by creation time: from inclusive, until exclusive"
    );
    // Paging newest first: each page starts after the last run of the one before.
    let first = list(RunFilter {
        limit: Some(4),
        ..RunFilter::default()
    })
    .await;
    assert_eq!(first, vec![run_id(6), run_id(5), run_id(4), run_id(3)]);
    let second = list(RunFilter {
        limit: Some(4),
        before: first.last().cloned(),
        ..RunFilter::default()
    })
    .await;
    assert_eq!(second, vec![run_id(2), run_id(1)], "the second page");
    assert_eq!(
        list(RunFilter {
            before: Some(run_id(99)),
            ..RunFilter::default()
        })
        .await,
        Vec::<RunId>::new(),
        "an unknown cursor matches nothing"
    );

    let counts = s
        .count_runs(RunFilter {
            status: Some(RunStatus::Completed),
            limit: Some(1),
            ..RunFilter::default()
        })
        .await
        .expect("count");
    assert_eq!(
        counts,
        vec![(RunStatus::Queued, 5), (RunStatus::Failed, 1)],
        "counts ignore status and limit, in status order"
    );
    let counts = s
        .count_runs(RunFilter {
            version: Some(a2.version),
            ..RunFilter::default()
        })
        .await
        .expect("count of a2");
    assert_eq!(counts, vec![(RunStatus::Queued, 2), (RunStatus::Failed, 1)]);
}

async fn commit_appends_events_in_order(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    assert!(s.events(&run.id).await.expect("events").is_empty());
    s.commit(commit_of(&run.id, vec![event(0, "run_started")]))
        .await
        .expect("first");
    let mut c = commit_of(
        &run.id,
        vec![event(1, "step_started"), event(2, "step_finished")],
    );
    c.durability = Durability::Buffered;
    s.commit(c).await.expect("buffered");
    s.commit(commit_of(&run.id, vec![]))
        .await
        .expect("empty commit");
    let all = s.events(&run.id).await.expect("events");
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(all[1].kind, "step_started");
    assert_eq!(all[1].body, json!({"seq": 1, "kind": "step_started"}));
    assert_eq!(all[2].run, run.id);
    let after = s.events_after(&run.id, 0).await.expect("after");
    assert_eq!(after, all[1..].to_vec());
    assert!(s.events_after(&run.id, 2).await.expect("after").is_empty());
    assert!(s.events(&run_id(77)).await.expect("unknown run").is_empty());
    let err = s
        .commit(commit_of(&run_id(77), vec![event(0, "x")]))
        .await
        .expect_err("unknown run");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

async fn sequence_conflicts_are_detected(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let err = s
        .commit(commit_of(&run.id, vec![event(1, "x")]))
        .await
        .expect_err("must start at 0");
    assert!(
        matches!(&err, StoreError::SequenceConflict { run: r, expected: 0, got: 1 } if *r == run.id),
        "{err:?}"
    );
    s.commit(commit_of(&run.id, vec![event(0, "a"), event(1, "b")]))
        .await
        .expect("ok");
    // A second writer that read the episode before the first wrote.
    let err = s
        .commit(commit_of(&run.id, vec![event(1, "stale")]))
        .await
        .expect_err("stale");
    assert!(
        matches!(
            err,
            StoreError::SequenceConflict {
                expected: 2,
                got: 1,
                ..
            }
        ),
        "{err:?}"
    );
    // A gap inside the batch.
    let err = s
        .commit(commit_of(&run.id, vec![event(2, "c"), event(4, "e")]))
        .await
        .expect_err("gap");
    assert!(
        matches!(
            err,
            StoreError::SequenceConflict {
                expected: 3,
                got: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(s.events(&run.id).await.expect("events").len(), 2);
}

async fn a_failed_commit_leaves_nothing(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    s.commit(commit_of(&run.id, vec![event(0, "run_started")]))
        .await
        .expect("first");
    let blob = b"an output nobody may see".to_vec();
    let full_batch = |tail: Vec<IntentRecord>| Commit {
        run: run.id.clone(),
        fence: None,
        blobs: vec![blob.clone()],
        events: vec![event(1, "tool_call"), event(2, "judgment_requested")],
        intents: [
            vec![intent(&run.id, "fetch", 1, IntentPhase::Pending)],
            tail,
        ]
        .concat(),
        judgments: vec![JudgmentWrite::Open {
            id: judgment_id(1),
            step: StepId::from("review"),
            iteration: 0,
            request: json!({"q": "ok?"}),
            request_hash: "b3:req".into(),
            at: T0,
        }],
        run_update: Some(RunUpdate {
            status: RunStatus::WaitingJudgment,
            reason: None,
            output_hash: Some(BlobHash::of(&blob)),
            updated_at: T0 + 10,
            wake_at: None,
        }),
        durability: Durability::Sync,
    };
    // The last element breaks the protocol: committed right after pending.
    let err = s
        .commit(full_batch(vec![intent(
            &run.id,
            "fetch",
            1,
            IntentPhase::Committed,
        )]))
        .await
        .expect_err("out of order");
    assert!(
        matches!(
            &err,
            StoreError::IntentOutOfOrder {
                phase: IntentPhase::Committed,
                previous: Some(IntentPhase::Pending),
                ..
            }
        ),
        "{err:?}"
    );
    assert_untouched(s, &run.id, &blob).await;

    // A sequence conflict refuses the whole batch too.
    let mut stale = full_batch(vec![]);
    stale.events = vec![event(0, "stale")];
    let err = s.commit(stale).await.expect_err("stale");
    assert!(
        matches!(err, StoreError::SequenceConflict { .. }),
        "{err:?}"
    );
    assert_untouched(s, &run.id, &blob).await;

    // The same batch, well-formed, goes in whole.
    s.commit(full_batch(vec![intent(
        &run.id,
        "fetch",
        1,
        IntentPhase::Dispatched,
    )]))
    .await
    .expect("whole");
    assert_eq!(s.events(&run.id).await.expect("events").len(), 3);
    assert_eq!(s.intents(&run.id).await.expect("intents").len(), 2);
    assert_eq!(
        s.blob(&BlobHash::of(&blob)).await.expect("blob"),
        Some(blob.clone())
    );
    let r = s.run(&run.id).await.expect("run").expect("exists");
    assert_eq!(r.status, RunStatus::WaitingJudgment);
    assert_eq!(r.output_hash, Some(BlobHash::of(&blob)));
}

/// What `a_failed_commit_leaves_nothing` expects after a refused batch.
async fn assert_untouched(s: &dyn Store, id: &RunId, blob: &[u8]) {
    assert_eq!(s.events(id).await.expect("events").len(), 1);
    assert!(s.intents(id).await.expect("intents").is_empty());
    assert!(
        s.judgment(&judgment_id(1))
            .await
            .expect("judgment")
            .is_none()
    );
    assert!(s.open_judgments().await.expect("open").is_empty());
    assert_eq!(s.blob(&BlobHash::of(blob)).await.expect("blob"), None);
    let r = s.run(id).await.expect("run").expect("exists");
    assert_eq!(
        (r.status, r.output_hash, r.updated_at),
        (RunStatus::Queued, None, T0 + 1)
    );
}

async fn intents_are_append_only_and_follow_the_protocol(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let id = &run.id;
    let write = |records: Vec<IntentRecord>| {
        let mut c = Commit::new(id.clone());
        c.intents = records;
        s.commit(c)
    };
    // Dispatched before pending is refused.
    let err = write(vec![intent(id, "a", 1, IntentPhase::Dispatched)])
        .await
        .expect_err("no pending");
    assert!(
        matches!(err, StoreError::IntentOutOfOrder { previous: None, .. }),
        "{err:?}"
    );

    // Pending buffered, dispatched and committed synced: the executor's pattern.
    let mut pending = Commit::new(id.clone());
    pending.intents = vec![intent(id, "a", 1, IntentPhase::Pending)];
    pending.durability = Durability::Buffered;
    s.commit(pending).await.expect("pending");
    write(vec![intent(id, "a", 1, IntentPhase::Dispatched)])
        .await
        .expect("dispatched");
    // A re-dispatch after a crash, under the same key.
    write(vec![intent(id, "a", 1, IntentPhase::Dispatched)])
        .await
        .expect("re-dispatch");
    write(vec![intent(id, "a", 1, IntentPhase::Committed)])
        .await
        .expect("committed");
    // Nothing follows a terminal phase.
    for phase in IntentPhase::ALL {
        let err = write(vec![intent(id, "a", 1, phase)])
            .await
            .expect_err("after committed");
        assert!(
            matches!(
                &err,
                StoreError::IntentOutOfOrder {
                    previous: Some(IntentPhase::Committed),
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // Failed may follow pending (the call was never made); a new attempt starts over.
    write(vec![
        intent(id, "b", 1, IntentPhase::Pending),
        intent(id, "b", 1, IntentPhase::Failed),
        intent(id, "b", 2, IntentPhase::Pending),
        intent(id, "b", 2, IntentPhase::Dispatched),
        intent(id, "b", 2, IntentPhase::Committed),
    ])
    .await
    .expect("attempts");
    let all = s.intents(id).await.expect("intents");
    let seen: Vec<_> = all
        .iter()
        .map(|i| (i.step.as_str(), i.attempt, i.phase))
        .collect();
    use IntentPhase::*;
    assert_eq!(
        seen,
        vec![
            ("a", 1, Pending),
            ("a", 1, Dispatched),
            ("a", 1, Dispatched),
            ("a", 1, Committed),
            ("b", 1, Pending),
            ("b", 1, Failed),
            ("b", 2, Pending),
            ("b", 2, Dispatched),
            ("b", 2, Committed),
        ]
    );
    assert_eq!(
        all[3],
        intent(id, "a", 1, Committed),
        "every field round-trips"
    );
    assert_eq!(all[5].error.as_deref(), Some("unavailable"));

    // An intent of another run inside this run's commit.
    let other = make_run(s, 2).await;
    let err = write(vec![intent(&other.id, "a", 1, Pending)])
        .await
        .expect_err("other run");
    assert!(matches!(err, StoreError::InvalidCommit { .. }), "{err:?}");
}

async fn abandoned_follows_dispatched_only_and_is_final(h: &Harness) {
    use IntentPhase::*;
    let s = h.s();
    let run = make_run(s, 1).await;
    let id = &run.id;
    let write = |records: Vec<IntentRecord>| {
        let mut c = Commit::new(id.clone());
        c.intents = records;
        s.commit(c)
    };
    let refused = |err: StoreError, step: &str, previous: Option<IntentPhase>| {
        assert!(
            matches!(
                &err,
                StoreError::IntentOutOfOrder { step: st, phase: Abandoned, previous: p, .. }
                    if st.as_str() == step && *p == previous
            ),
            "{step}: {err:?}"
        );
        assert!(err.to_string().contains("`abandoned`"), "{err}");
    };

    // Cancelled while dispatched: the call's outcome is unknown.
    write(vec![intent(id, "a", 1, Pending)])
        .await
        .expect("pending");
    write(vec![intent(id, "a", 1, Dispatched)])
        .await
        .expect("dispatched");
    write(vec![intent(id, "a", 1, Abandoned)])
        .await
        .expect("abandoned after dispatched");
    // Final: nothing follows it, not even another abandoned.
    for phase in IntentPhase::ALL {
        let err = write(vec![intent(id, "a", 1, phase)])
            .await
            .expect_err("after abandoned");
        assert!(
            matches!(
                &err,
                StoreError::IntentOutOfOrder {
                    previous: Some(Abandoned),
                    ..
                }
            ),
            "{phase}: {err:?}"
        );
    }
    // The same protocol inside one batch, after a re-dispatch.
    write(vec![
        intent(id, "b", 1, Pending),
        intent(id, "b", 1, Dispatched),
        intent(id, "b", 1, Dispatched),
        intent(id, "b", 1, Abandoned),
    ])
    .await
    .expect("one batch");

    // Never as the first phase, nor after pending (the call was never made:
    // that is `failed`), committed or failed.
    let err = write(vec![intent(id, "c", 1, Abandoned)])
        .await
        .expect_err("first");
    refused(err, "c", None);
    write(vec![intent(id, "c", 1, Pending)])
        .await
        .expect("pending");
    let err = write(vec![intent(id, "c", 1, Abandoned)])
        .await
        .expect_err("after pending");
    refused(err, "c", Some(Pending));
    write(vec![
        intent(id, "d", 1, Pending),
        intent(id, "d", 1, Dispatched),
        intent(id, "d", 1, Committed),
        intent(id, "e", 1, Pending),
        intent(id, "e", 1, Failed),
    ])
    .await
    .expect("committed and failed");
    let err = write(vec![intent(id, "d", 1, Abandoned)])
        .await
        .expect_err("after committed");
    refused(err, "d", Some(Committed));
    let err = write(vec![intent(id, "e", 1, Abandoned)])
        .await
        .expect_err("after failed");
    refused(err, "e", Some(Failed));

    // A refused phase refuses its whole commit: the event did not land either.
    let mut c = commit_of(id, vec![event(0, "run_cancelled")]);
    c.intents = vec![intent(id, "f", 1, Pending), intent(id, "f", 1, Abandoned)];
    let err = s.commit(c).await.expect_err("in a batch");
    refused(err, "f", Some(Pending));
    assert!(s.events(id).await.expect("events").is_empty());

    let seen: Vec<_> = s
        .intents(id)
        .await
        .expect("intents")
        .into_iter()
        .map(|i| (i.step.to_string(), i.phase))
        .collect();
    let want: Vec<(String, IntentPhase)> = [
        ("a", Pending),
        ("a", Dispatched),
        ("a", Abandoned),
        ("b", Pending),
        ("b", Dispatched),
        ("b", Dispatched),
        ("b", Abandoned),
        ("c", Pending),
        ("d", Pending),
        ("d", Dispatched),
        ("d", Committed),
        ("e", Pending),
        ("e", Failed),
    ]
    .into_iter()
    .map(|(st, p)| (st.to_owned(), p))
    .collect();
    assert_eq!(seen, want);
    assert!(Abandoned.is_terminal());
}

fn of_tenant(n: u128, version: WorkflowVersion, tenant: &str) -> NewRun {
    NewRun {
        tenant: tenant.to_owned(),
        ..new_run(n, version, &json!({"n": n as u64}))
    }
}

fn child_of(parent: u128, n: u128, version: WorkflowVersion, tenant: &str) -> NewRun {
    NewRun {
        parent: Some((run_id(parent), StepId::from("sub"))),
        ..of_tenant(n, version, tenant)
    }
}

fn ids(runs: &[RunRecord]) -> Vec<RunId> {
    runs.iter().map(|r| r.id.clone()).collect()
}

async fn runs_carry_their_tenant(h: &Harness) {
    let s = h.s();
    let a = publish(s, "a.flow", "1", None).await;
    let b = publish(s, "b.flow", "1", None).await;
    let plain = s
        .create_run(new_run(1, a.version, &json!(1)))
        .await
        .expect("default tenant")
        .into_record();
    assert_eq!(plain.tenant, DEFAULT_TENANT);
    assert_eq!(DEFAULT_TENANT, "default");
    let acme = s
        .create_run(of_tenant(2, a.version, "acme"))
        .await
        .expect("acme")
        .into_record();
    assert_eq!(acme.tenant, "acme");
    s.create_run(child_of(2, 3, b.version, "acme"))
        .await
        .expect("acme child");
    s.create_run(of_tenant(4, b.version, "globex"))
        .await
        .expect("globex");

    // Read back through every path that returns runs.
    assert_eq!(s.run(&acme.id).await.expect("read"), Some(acme.clone()));
    let kids = s.children(&acme.id).await.expect("children");
    assert_eq!(
        kids.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>(),
        ["acme"]
    );
    let tenants: Vec<_> = s
        .in_flight_runs()
        .await
        .expect("in flight")
        .into_iter()
        .map(|r| r.tenant)
        .collect();
    assert_eq!(tenants, ["default", "acme", "acme", "globex"]);

    // Filtering: one tenant, or every tenant.
    let list = |filter: RunFilter| async move { ids(&s.list_runs(filter).await.expect("list")) };
    let tenant = |t: &str| RunFilter {
        tenant: Some(t.to_owned()),
        ..RunFilter::default()
    };
    assert_eq!(list(tenant("acme")).await, [run_id(3), run_id(2)]);
    assert_eq!(list(tenant(DEFAULT_TENANT)).await, [run_id(1)]);
    assert_eq!(list(tenant("globex")).await, [run_id(4)]);
    assert!(list(tenant("initech")).await.is_empty());
    assert!(list(tenant("ACME")).await.is_empty(), "tenants are exact");
    assert_eq!(
        list(RunFilter::default()).await,
        (1..=4u128).rev().map(run_id).collect::<Vec<_>>()
    );
    // With the other fields.
    let acme_of_b = RunFilter {
        workflow_id: Some(wf("b.flow")),
        ..tenant("acme")
    };
    assert_eq!(list(acme_of_b).await, [run_id(3)]);
    let acme_a = RunFilter {
        workflow_id: Some(wf("a.flow")),
        limit: Some(1),
        ..tenant("acme")
    };
    assert_eq!(list(acme_a).await, [run_id(2)]);
    let globex_children = RunFilter {
        parent: Some(acme.id.clone()),
        ..tenant("globex")
    };
    assert!(list(globex_children).await.is_empty());

    // A retried create is the same run only under the same tenant.
    assert_eq!(
        s.create_run(of_tenant(2, a.version, "acme"))
            .await
            .expect("retry"),
        CreateRun::Existing(acme.clone())
    );
    let err = s
        .create_run(of_tenant(2, a.version, "globex"))
        .await
        .expect_err("same id, other tenant");
    assert!(
        matches!(&err, StoreError::RunIdConflict { id } if *id == acme.id),
        "{err:?}"
    );
    assert_eq!(s.run(&acme.id).await.expect("read"), Some(acme));
}

async fn a_child_of_another_tenant_is_refused(h: &Harness) {
    let s = h.s();
    let v = publish(s, "a.flow", "1", None).await;
    let parent = s
        .create_run(of_tenant(1, v.version, "acme"))
        .await
        .expect("parent")
        .into_record();
    let nothing_written = |n: u128| async move {
        assert!(s.run(&run_id(n)).await.expect("read").is_none());
        let input = serde_json::to_vec(&json!({"n": n as u64})).expect("json");
        assert_eq!(s.blob(&BlobHash::of(&input)).await.expect("blob"), None);
        assert!(s.children(&run_id(1)).await.expect("children").is_empty());
        assert_eq!(
            ids(&s.list_runs(RunFilter::default()).await.expect("list")),
            [run_id(1)]
        );
    };

    for (n, tenant) in [(2, "globex"), (3, DEFAULT_TENANT)] {
        let err = s
            .create_run(child_of(1, n, v.version, tenant))
            .await
            .expect_err("other tenant");
        match &err {
            StoreError::TenantMismatch {
                run,
                tenant: t,
                parent: p,
                parent_tenant,
            } => {
                assert_eq!(*run, run_id(n));
                assert_eq!(t, tenant);
                assert_eq!(*p, parent.id);
                assert_eq!(parent_tenant, "acme");
            }
            other => panic!("expected TenantMismatch, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains(run_id(n).as_str())
                && msg.contains(parent.id.as_str())
                && msg.contains(&format!("`{tenant}`"))
                && msg.contains("`acme`")
                && msg.contains("nothing was written"),
            "{msg}"
        );
        nothing_written(n).await;
    }

    // Under its parent's tenant the same child is created.
    let child = s
        .create_run(child_of(1, 2, v.version, "acme"))
        .await
        .expect("same tenant")
        .into_record();
    assert_eq!(child.tenant, "acme");
    assert_eq!(
        ids(&s.children(&parent.id).await.expect("children")),
        [child.id]
    );
}

async fn idempotency_keys_are_global_across_tenants(h: &Harness) {
    let s = h.s();
    let v = publish(s, "a.flow", "1", None).await;
    let keyed = |n: u128, tenant: &str| NewRun {
        idempotency_key: Some("order-42".into()),
        input: serde_json::to_vec(&json!({"order": 42})).expect("json"),
        ..of_tenant(n, v.version, tenant)
    };
    let first = s
        .create_run(keyed(1, "acme"))
        .await
        .expect("acme")
        .into_record();
    // The same request of the same tenant: the existing run.
    assert_eq!(
        s.create_run(keyed(2, "acme")).await.expect("again"),
        CreateRun::Existing(first.clone())
    );
    // The same key, version and input from another tenant: the key is taken.
    let err = s
        .create_run(keyed(3, "globex"))
        .await
        .expect_err("other tenant");
    match &err {
        StoreError::IdempotencyConflict(c) => {
            assert_eq!(c.key, "order-42");
            assert_eq!(c.existing_run, first.id);
            assert_eq!(
                (c.existing_tenant.as_str(), c.new_tenant.as_str()),
                ("acme", "globex")
            );
            assert_eq!(c.existing_input_hash, c.new_input_hash);
        }
        other => panic!("expected IdempotencyConflict, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("`acme`") && msg.contains("`globex`") && msg.contains("global"),
        "{msg}"
    );
    for n in 2..=3 {
        assert!(s.run(&run_id(n)).await.expect("read").is_none());
    }
    // A different input from the same tenant says nothing of tenants.
    let err = s
        .create_run(NewRun {
            input: b"{}".to_vec(),
            ..keyed(4, "acme")
        })
        .await
        .expect_err("other input");
    assert!(!err.to_string().contains("tenant"), "{err}");
}

async fn judgments_open_and_answer_once(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let other = make_run(s, 2).await;
    let open = |n: u128| JudgmentWrite::Open {
        id: judgment_id(n),
        step: StepId::from("review"),
        iteration: 0,
        request: json!({"question": "ship it?", "sources": [{"hash": "b3:src"}]}),
        request_hash: format!("b3:req{n}"),
        at: T0 + n as i64,
    };
    let with = |run: &RunId, judgments: Vec<JudgmentWrite>| {
        let mut c = Commit::new(run.clone());
        c.judgments = judgments;
        c
    };
    s.commit(with(&run.id, vec![open(1), open(2)]))
        .await
        .expect("open");
    let listed: Vec<_> = s
        .open_judgments()
        .await
        .expect("open")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(listed, vec![judgment_id(1), judgment_id(2)]);
    let j = s
        .judgment(&judgment_id(1))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(
        (j.status, j.result.clone(), j.answered_at),
        (JudgmentStatus::Open, None, None)
    );
    assert_eq!(j.run, run.id);
    assert_eq!(j.request_hash, "b3:req1");

    let err = s
        .commit(with(&run.id, vec![open(1)]))
        .await
        .expect_err("twice");
    assert!(
        matches!(&err, StoreError::JudgmentConflict { id, .. } if *id == judgment_id(1)),
        "{err:?}"
    );

    let answer = |n: u128| JudgmentWrite::Answer {
        id: judgment_id(n),
        result: json!({"verdict": "yes", "score": 0.75}),
        at: T0 + 100,
    };
    let err = s
        .commit(with(&other.id, vec![answer(1)]))
        .await
        .expect_err("other run");
    assert!(
        matches!(err, StoreError::JudgmentConflict { .. }),
        "{err:?}"
    );
    let err = s
        .commit(with(&run.id, vec![answer(9)]))
        .await
        .expect_err("unknown");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");

    s.commit(with(&run.id, vec![answer(1)]))
        .await
        .expect("answer");
    let j = s
        .judgment(&judgment_id(1))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(j.status, JudgmentStatus::Answered);
    assert_eq!(j.result, Some(json!({"verdict": "yes", "score": 0.75})));
    assert_eq!(j.answered_at, Some(T0 + 100));
    assert_eq!(
        j.request,
        json!({"question": "ship it?", "sources": [{"hash": "b3:src"}]})
    );
    let err = s
        .commit(with(&run.id, vec![answer(1)]))
        .await
        .expect_err("answered twice");
    assert!(
        matches!(err, StoreError::JudgmentConflict { .. }),
        "{err:?}"
    );
    let listed: Vec<_> = s
        .open_judgments()
        .await
        .expect("open")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(listed, vec![judgment_id(2)]);
    // Opened and answered in one commit.
    s.commit(with(&run.id, vec![open(3), answer(3)]))
        .await
        .expect("both");
    assert_eq!(
        s.judgment(&judgment_id(3))
            .await
            .expect("read")
            .map(|j| j.status),
        Some(JudgmentStatus::Answered)
    );
    // A run that ended has no open requests: nobody can answer them.
    let mut c = Commit::new(run.id.clone());
    c.run_update = Some(RunUpdate {
        status: RunStatus::Cancelled,
        reason: Some("no longer needed".into()),
        output_hash: None,
        updated_at: T0 + 200,
        wake_at: None,
    });
    s.commit(c).await.expect("cancel");
    assert!(s.open_judgments().await.expect("open").is_empty());
    assert_eq!(
        s.judgment(&judgment_id(2))
            .await
            .expect("read")
            .map(|j| j.status),
        Some(JudgmentStatus::Open),
        "the request itself is kept as it was"
    );
}

async fn run_updates_and_final_states(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let update = |status: RunStatus, output: Option<BlobHash>, blobs: Vec<Vec<u8>>| {
        let mut c = Commit::new(run.id.clone());
        c.blobs = blobs;
        c.run_update = Some(RunUpdate {
            status,
            reason: (status == RunStatus::Failed).then(|| "tool failed".to_owned()),
            output_hash: output,
            updated_at: T0 + 500,
            wake_at: None,
        });
        c
    };
    s.commit(update(RunStatus::Running, None, vec![]))
        .await
        .expect("running");
    s.commit(update(RunStatus::Failed, None, vec![]))
        .await
        .expect("failed");
    // Failed is terminal but not final: an operator may retry.
    s.commit(update(RunStatus::Running, None, vec![]))
        .await
        .expect("retry");
    let missing = BlobHash::of(b"not stored");
    let err = s
        .commit(update(RunStatus::Completed, Some(missing), vec![]))
        .await
        .expect_err("missing output");
    assert!(
        matches!(&err, StoreError::NotFound { what } if what.contains(&missing.to_string())),
        "{err:?}"
    );
    let out = b"{\"answer\":42}".to_vec();
    s.commit(update(
        RunStatus::Completed,
        Some(BlobHash::of(&out)),
        vec![out.clone()],
    ))
    .await
    .expect("completed");
    let r = s.run(&run.id).await.expect("read").expect("exists");
    assert_eq!(
        (r.status, r.output_hash, r.updated_at),
        (RunStatus::Completed, Some(BlobHash::of(&out)), T0 + 500)
    );
    for status in [RunStatus::Running, RunStatus::Failed, RunStatus::Cancelled] {
        let err = s
            .commit(update(status, Some(BlobHash::of(&out)), vec![]))
            .await
            .expect_err("final");
        assert!(
            matches!(
                err,
                StoreError::RunFinal {
                    status: RunStatus::Completed,
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // The output cannot be swapped either; events may still be appended.
    let err = s
        .commit(update(RunStatus::Completed, None, vec![]))
        .await
        .expect_err("final output");
    assert!(matches!(err, StoreError::RunFinal { .. }), "{err:?}");
    s.commit(commit_of(&run.id, vec![event(0, "audit_note")]))
        .await
        .expect("event");
}

const TTL: i64 = 30_000;

fn fenced(lease: &Lease, events: Vec<NewEvent>) -> Commit {
    Commit {
        fence: Some(lease.fence()),
        ..commit_of(&lease.run, events)
    }
}

fn set_status(run: &RunId, status: RunStatus) -> Commit {
    let mut c = Commit::new(run.clone());
    c.run_update = Some(RunUpdate {
        status,
        reason: None,
        output_hash: None,
        updated_at: T0 + 5,
        wake_at: None,
    });
    c
}

/// The lease a claim returned (`None`: refused).
async fn claim(s: &dyn Store, run: &RunId, owner: &str, now: i64) -> Option<Lease> {
    s.claim_run(run, owner, now, TTL).await.expect("claim")
}

async fn lease_of(s: &dyn Store, run: &RunId) -> Option<Lease> {
    s.run(run).await.expect("read").expect("exists").lease
}

async fn leases_and_recovery_queries(h: &Harness) {
    let s = h.s();
    let a = make_run(s, 1).await;
    let b = make_run(s, 2).await;
    let c = make_run(s, 3).await;
    assert_eq!(a.lease, None, "a run starts unheld");
    let la = claim(s, &a.id, "host-1", T0).await.expect("claimed");
    assert_eq!(
        la,
        Lease {
            run: a.id.clone(),
            owner: "host-1".into(),
            epoch: 1,
            expires_at: T0 + TTL,
        }
    );
    assert_eq!(
        la.fence(),
        Fence {
            owner: "host-1".into(),
            epoch: 1
        }
    );
    assert_eq!(lease_of(s, &a.id).await, Some(la.clone()));
    assert_eq!(claim(s, &a.id, "host-2", T0 + 1).await, None, "held");
    assert!(claim(s, &b.id, "host-2", T0).await.is_some());
    s.commit(set_status(&c.id, RunStatus::Cancelled))
        .await
        .expect("cancel");
    assert_eq!(claim(s, &c.id, "host-1", T0).await, None, "terminal");
    let err = s
        .claim_run(&run_id(99), "host-1", T0, TTL)
        .await
        .expect_err("unknown");
    assert!(
        matches!(&err, StoreError::NotFound { what } if what.contains(run_id(99).as_str())),
        "{err:?}"
    );

    let owned = s.runs_owned_by("host-1").await.expect("owned");
    assert_eq!(ids(&owned), std::slice::from_ref(&a.id));
    assert_eq!(owned[0].lease, Some(la.clone()));
    let in_flight = s.in_flight_runs().await.expect("in flight");
    assert_eq!(ids(&in_flight), [a.id.clone(), b.id.clone()]);

    // Renewing extends the expiry and keeps the epoch.
    let renewed = s.renew_lease(&la, T0 + 10_000, TTL).await.expect("renew");
    assert_eq!(
        renewed,
        Lease {
            expires_at: T0 + 10_000 + TTL,
            ..la.clone()
        }
    );
    assert_eq!(lease_of(s, &a.id).await, Some(renewed.clone()));
    // Still held at T0 + TTL + 1 thanks to the renewal.
    assert_eq!(claim(s, &a.id, "host-2", T0 + TTL + 1).await, None);

    // Releasing clears the holder; the run is claimable by anyone, at a
    // larger epoch than any before.
    s.release_lease(&renewed).await.expect("release");
    assert_eq!(lease_of(s, &a.id).await, None);
    assert!(s.runs_owned_by("host-1").await.expect("owned").is_empty());
    s.release_lease(&renewed)
        .await
        .expect("released twice: a no-op");
    let err = s
        .renew_lease(&renewed, T0 + 11_000, TTL)
        .await
        .expect_err("released");
    assert!(
        matches!(&err, StoreError::LeaseLost { run, fence, holder: None }
            if *run == a.id && *fence == renewed.fence()),
        "{err:?}"
    );
    let again = claim(s, &a.id, "host-2", T0 + 12_000).await.expect("free");
    assert_eq!((again.owner.as_str(), again.epoch), ("host-2", 2));
    // Releasing with a stale lease does nothing.
    s.release_lease(&renewed).await.expect("stale release");
    assert_eq!(lease_of(s, &a.id).await, Some(again.clone()));
    let err = s
        .release_lease(&Lease {
            run: run_id(99),
            ..again
        })
        .await
        .expect_err("unknown run");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

async fn a_run_created_with_a_lease_is_held(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    let held = NewRun {
        lease: Some(LeaseRequest {
            owner: "host-3".into(),
            ttl_ms: TTL,
        }),
        ..new_run(4, v.version, &json!(4))
    };
    let rec = s
        .create_run(held.clone())
        .await
        .expect("create")
        .into_record();
    let want = Lease {
        run: run_id(4),
        owner: "host-3".into(),
        epoch: 1,
        expires_at: T0 + 4 + TTL,
    };
    assert_eq!(rec.lease, Some(want.clone()));
    assert_eq!(lease_of(s, &rec.id).await, Some(want.clone()));
    assert_eq!(
        ids(&s.runs_owned_by("host-3").await.expect("owned")),
        [run_id(4)]
    );
    // A retry of the create is the same run, lease and all.
    assert_eq!(
        s.create_run(held).await.expect("retry"),
        CreateRun::Existing(rec)
    );
    // Its creator commits under the lease at once; no one else may claim it.
    s.commit(fenced(&want, vec![event(0, "run_started")]))
        .await
        .expect("fenced commit");
    assert_eq!(claim(s, &run_id(4), "host-1", T0 + 5).await, None);
    assert!(
        s.claim_runnable("host-1", T0 + 5, TTL, 10)
            .await
            .expect("runnable")
            .is_empty()
    );
}

async fn a_takeover_after_expiry_starts_a_new_epoch(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let first = claim(s, &run.id, "host-1", T0).await.expect("claimed");
    // Not before expiry, and exactly at it.
    assert_eq!(claim(s, &run.id, "host-2", T0 + TTL - 1).await, None);
    let second = claim(s, &run.id, "host-2", T0 + TTL)
        .await
        .expect("expired: taken over");
    assert_eq!(
        second,
        Lease {
            run: run.id.clone(),
            owner: "host-2".into(),
            epoch: first.epoch + 1,
            expires_at: T0 + 2 * TTL,
        }
    );
    assert_eq!(lease_of(s, &run.id).await, Some(second.clone()));
    assert!(s.runs_owned_by("host-1").await.expect("owned").is_empty());
    // The old holder cannot renew.
    let err = s
        .renew_lease(&first, T0 + TTL + 1, TTL)
        .await
        .expect_err("taken over");
    match &err {
        StoreError::LeaseLost {
            run: r,
            fence,
            holder,
        } => {
            assert_eq!(*r, run.id);
            assert_eq!(*fence, first.fence());
            assert_eq!(holder.as_ref(), Some(&second));
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(lease_of(s, &run.id).await, Some(second.clone()));
    // The new holder renews past its own expiry when no one took over.
    let later = s
        .renew_lease(&second, T0 + 5 * TTL, TTL)
        .await
        .expect("late renewal");
    assert_eq!(
        (later.epoch, later.expires_at),
        (second.epoch, T0 + 6 * TTL)
    );
}

async fn a_reclaim_by_the_same_owner_starts_a_new_epoch(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let first = claim(s, &run.id, "host-1", T0).await.expect("claimed");
    // A second process under the same host name, while the lease is live.
    let second = claim(s, &run.id, "host-1", T0 + 1)
        .await
        .expect("reclaimed");
    assert_eq!(second.epoch, first.epoch + 1);
    assert_eq!(second.expires_at, T0 + 1 + TTL);
    let third = claim(s, &run.id, "host-1", T0 + 2).await.expect("again");
    assert_eq!(third.epoch, 3);
    // The first process is fenced out.
    let err = s
        .commit(fenced(&first, vec![event(0, "stale")]))
        .await
        .expect_err("fenced out");
    assert!(
        matches!(&err, StoreError::LeaseLost { holder: Some(h), .. } if *h == third),
        "{err:?}"
    );
    let err = s.renew_lease(&second, T0 + 3, TTL).await.expect_err("old");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    // The epoch survives a release: the next tenure's is larger still.
    s.release_lease(&third).await.expect("release");
    let fourth = claim(s, &run.id, "host-2", T0 + 4).await.expect("free");
    assert_eq!(fourth.epoch, 4);
    let (lr, _) = s
        .claim_runnable("host-3", T0 + 4 + TTL, TTL, 5)
        .await
        .expect("runnable")
        .into_iter()
        .next()
        .expect("expired: runnable");
    assert_eq!(lr.lease.map(|l| l.epoch), Some(5));
}

async fn a_fenced_commit_after_a_takeover_writes_nothing(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let old = claim(s, &run.id, "host-1", T0).await.expect("claimed");
    let mut c = fenced(&old, vec![event(0, "run_started")]);
    c.intents = vec![intent(&run.id, "fetch", 1, IntentPhase::Pending)];
    s.commit(c).await.expect("the holder commits");
    // Past expiry, before a takeover: the holder's commits still go in.
    let mut c = fenced(&old, vec![event(1, "step_started")]);
    c.intents = vec![intent(&run.id, "fetch", 1, IntentPhase::Dispatched)];
    s.commit(c).await.expect("expired but not taken over");

    let new = claim(s, &run.id, "host-2", T0 + TTL + 5)
        .await
        .expect("takeover");
    assert_eq!(new.epoch, old.epoch + 1);
    let blob = b"what the old holder computed".to_vec();
    let stale = Commit {
        run: run.id.clone(),
        fence: Some(old.fence()),
        blobs: vec![blob.clone()],
        events: vec![event(2, "tool_call")],
        intents: vec![intent(&run.id, "fetch", 1, IntentPhase::Committed)],
        judgments: vec![JudgmentWrite::Open {
            id: judgment_id(1),
            step: StepId::from("review"),
            iteration: 0,
            request: json!({"q": "ok?"}),
            request_hash: "b3:req".into(),
            at: T0,
        }],
        run_update: Some(RunUpdate {
            status: RunStatus::Completed,
            reason: None,
            output_hash: Some(BlobHash::of(&blob)),
            updated_at: T0 + 99,
            wake_at: None,
        }),
        durability: Durability::Sync,
    };
    let before = s.run(&run.id).await.expect("read").expect("exists");
    let err = s.commit(stale.clone()).await.expect_err("lease lost");
    match &err {
        StoreError::LeaseLost {
            run: r,
            fence,
            holder,
        } => {
            assert_eq!(*r, run.id);
            assert_eq!(*fence, old.fence());
            assert_eq!(holder.as_ref(), Some(&new));
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(run.id.as_str())
            && msg.contains("`host-1`")
            && msg.contains("`host-2`")
            && msg.contains("no longer holds")
            && msg.contains("stop driving"),
        "{msg}"
    );
    // Nothing of it was written.
    assert_eq!(s.events(&run.id).await.expect("events").len(), 2);
    assert_eq!(s.intents(&run.id).await.expect("intents").len(), 2);
    assert_eq!(s.blob(&BlobHash::of(&blob)).await.expect("blob"), None);
    assert!(
        s.judgment(&judgment_id(1))
            .await
            .expect("judgment")
            .is_none()
    );
    assert_eq!(s.run(&run.id).await.expect("read"), Some(before));

    // The same commit under the new lease goes in; so does an unfenced one
    // (an operator's write), whoever holds the run.
    s.commit(Commit {
        fence: Some(new.fence()),
        ..stale.clone()
    })
    .await
    .expect("the new holder commits");
    s.commit(commit_of(&run.id, vec![event(3, "operator_note")]))
        .await
        .expect("unfenced");
    assert_eq!(s.events(&run.id).await.expect("events").len(), 4);
    // A fence on a released run: refused, naming no holder.
    s.release_lease(&new).await.expect("release");
    let err = s
        .commit(fenced(&new, vec![event(4, "late")]))
        .await
        .expect_err("released");
    assert!(
        matches!(&err, StoreError::LeaseLost { holder: None, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no host holds it"), "{err}");
    // The fence is checked before the episode: a stale writer hears that it
    // lost the run, not that its sequence is off.
    let err = s
        .commit(fenced(&old, vec![event(0, "very stale")]))
        .await
        .expect_err("stale");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    let err = s
        .commit(Commit {
            fence: Some(old.fence()),
            ..commit_of(&run_id(42), vec![])
        })
        .await
        .expect_err("unknown run");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

/// A run that completes, fails or is cancelled needs no driver: the commit
/// that says so clears the lease in the same transaction (so a host that
/// dies before its release leaves nothing held); a run that stops to wait
/// or is blocked keeps it until its host releases it.
async fn the_commit_that_ends_a_run_ends_its_tenure(h: &Harness) {
    let s = h.s();
    for (n, end) in [
        (1, RunStatus::Completed),
        (2, RunStatus::Failed),
        (3, RunStatus::Cancelled),
    ] {
        let run = make_run(s, n).await;
        let lease = claim(s, &run.id, "host-1", T0).await.expect("claimed");
        s.commit(fenced(&lease, vec![event(0, "run_started")]))
            .await
            .expect("started");
        let mut c = set_status(&run.id, end);
        c.fence = Some(lease.fence());
        c.events = vec![event(1, "run_ended")];
        s.commit(c).await.expect("ended");
        let rec = s.run(&run.id).await.expect("read").expect("exists");
        assert_eq!(rec.status, end);
        assert_eq!(rec.lease, None, "{end}: the lease ends with the run");
        assert!(
            s.runs_owned_by("host-1")
                .await
                .expect("owned")
                .iter()
                .all(|r| r.id != run.id),
            "{end}"
        );
        // The host's late release is a no-op; its heartbeat hears it lost
        // the run to no one.
        s.release_lease(&lease).await.expect("late release");
        let err = s
            .renew_lease(&lease, T0 + 10, TTL)
            .await
            .expect_err("renew after the end");
        assert!(
            matches!(&err, StoreError::LeaseLost { holder: None, .. }),
            "{end}: {err:?}"
        );
        if end == RunStatus::Failed {
            // A failed run may be retried: the next claim is a new epoch.
            let mut c = set_status(&run.id, RunStatus::Queued);
            c.events = vec![event(2, "run_retried")];
            s.commit(c).await.expect("retry");
            let next = claim(s, &run.id, "host-2", T0 + 20)
                .await
                .expect("reclaimed");
            assert_eq!(next.epoch, lease.epoch + 1);
        }
    }
    // Waiting and blocked runs keep their lease until the host releases it.
    for (n, stop) in [(4, RunStatus::WaitingJudgment), (5, RunStatus::Blocked)] {
        let run = make_run(s, n).await;
        let lease = claim(s, &run.id, "host-1", T0).await.expect("claimed");
        let mut c = set_status(&run.id, stop);
        c.fence = Some(lease.fence());
        c.events = vec![event(0, "run_started")];
        s.commit(c).await.expect("stopped");
        assert_eq!(lease_of(s, &run.id).await, Some(lease.clone()), "{stop}");
        s.release_lease(&lease).await.expect("release");
        assert_eq!(lease_of(s, &run.id).await, None, "{stop}");
    }
    // An operator's unfenced cancel of a held run ends the tenure too: the
    // holder's next commit is refused and it stops driving.
    let run = make_run(s, 6).await;
    let lease = claim(s, &run.id, "host-1", T0).await.expect("claimed");
    let mut c = set_status(&run.id, RunStatus::Cancelled);
    c.events = vec![event(0, "run_cancelled")];
    s.commit(c).await.expect("operator cancel");
    assert_eq!(lease_of(s, &run.id).await, None);
    let err = s
        .commit(fenced(&lease, vec![event(1, "late")]))
        .await
        .expect_err("fenced out");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
}

fn in_group(n: u128, version: WorkflowVersion, group: &str, max_runs: u32) -> NewRun {
    NewRun {
        admission: Some(AdmissionRequest {
            group: group.to_owned(),
            max_runs,
            refuse_when_full: false,
        }),
        ..new_run(n, version, &json!(n as u64))
    }
}

fn claimed_ids(got: &[(RunRecord, Lease)]) -> Vec<RunId> {
    got.iter().map(|(r, _)| r.id.clone()).collect()
}

/// Ends a run under its lease.
async fn end_run(s: &dyn Store, lease: &Lease, seq: u64, status: RunStatus) {
    let mut c = set_status(&lease.run, status);
    c.fence = Some(lease.fence());
    c.events = vec![event(seq, "run_ended")];
    s.commit(c).await.expect("end the run");
}

/// `concurrency.max_runs` held by the store: of one group, at most
/// `max_runs` runs are admitted (claimed and not ended); the rest stay
/// queued and are admitted oldest first as slots free up; another group,
/// or a run of no group, is never held back by a full one.
async fn admission_holds_a_group_to_max_runs_oldest_first(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    for n in 1..=5 {
        s.create_run(in_group(n, v.version, "demo.flow", 2))
            .await
            .expect("create");
    }
    s.create_run(in_group(6, v.version, "demo.flow/key=b", 1))
        .await
        .expect("create");
    s.create_run(new_run(7, v.version, &json!(7)))
        .await
        .expect("create");
    let got = s
        .claim_runnable("host-1", T0, TTL, 10)
        .await
        .expect("claim");
    assert_eq!(
        claimed_ids(&got),
        [run_id(1), run_id(2), run_id(6), run_id(7)],
        "two of the full group, the other group's and the free run"
    );
    for (r, _) in &got {
        assert_eq!(r.admitted, r.admission.is_some(), "{}", r.id);
    }
    assert_eq!(
        got[0].0.admission,
        Some(Admission {
            group: "demo.flow".into(),
            max_runs: 2
        })
    );
    let rec = s.run(&run_id(1)).await.expect("read").expect("exists");
    assert!(rec.admitted);
    assert_eq!(rec.admission, got[0].0.admission);
    // Full: neither a batch claim nor a claim of one run admits a third.
    assert!(
        s.claim_runnable("host-2", T0, TTL, 10)
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(claim(s, &run_id(3), "host-2", T0).await, None);
    let waiting = s.run(&run_id(3)).await.expect("read").expect("exists");
    assert_eq!(
        (waiting.status, waiting.admitted, waiting.lease),
        (RunStatus::Queued, false, None)
    );
    // A slot frees when a run ends: the oldest waiting run takes it.
    end_run(s, &got[0].1, 0, RunStatus::Completed).await;
    let ended = s.run(&run_id(1)).await.expect("read").expect("exists");
    assert!(!ended.admitted, "an ended run holds no slot");
    let next = s
        .claim_runnable("host-2", T0 + 1, TTL, 10)
        .await
        .expect("claim");
    assert_eq!(claimed_ids(&next), [run_id(3)]);
    // A held creation into a full group waits queued, held by no one.
    let held = NewRun {
        lease: Some(LeaseRequest {
            owner: "host-3".into(),
            ttl_ms: TTL,
        }),
        ..in_group(8, v.version, "demo.flow", 2)
    };
    let rec = s.create_run(held).await.expect("create").into_record();
    assert_eq!((rec.lease.clone(), rec.admitted), (None, false));
    assert_eq!(s.run(&rec.id).await.expect("read"), Some(rec));
    // A run handed back before it ended keeps its slot: whoever claims it
    // next needs none, and no other run gets in meanwhile.
    s.release_lease(&next[0].1).await.expect("release");
    assert_eq!(claim(s, &run_id(4), "host-4", T0 + 2).await, None);
    let again = claim(s, &run_id(3), "host-4", T0 + 2)
        .await
        .expect("reclaim");
    assert_eq!(again.epoch, next[0].1.epoch + 1);
    // A lease that expires keeps the slot too: the takeover needs none.
    let later = T0 + 2 + TTL;
    let took = s
        .claim_runnable("host-5", later, TTL, 10)
        .await
        .expect("claim");
    assert_eq!(
        claimed_ids(&took),
        [run_id(2), run_id(3), run_id(6), run_id(7)],
        "takeovers only"
    );
    // A failed run gives its slot up; retried, it waits for one like any
    // other — behind the older waiting run 4.
    let three = took
        .iter()
        .find(|(r, _)| r.id == run_id(3))
        .expect("3")
        .1
        .clone();
    end_run(s, &three, 0, RunStatus::Failed).await;
    let mut retry = set_status(&run_id(3), RunStatus::Queued);
    retry.events = vec![event(1, "run_retried")];
    s.commit(retry).await.expect("retry");
    let got = s
        .claim_runnable("host-5", later, TTL, 10)
        .await
        .expect("claim");
    assert_eq!(claimed_ids(&got), [run_id(3)]);
    assert!(got[0].0.admitted);
    assert_eq!(claim(s, &run_id(4), "host-5", later).await, None);
}

/// A group that refuses when full (`on_overflow: drop`) refuses a new run
/// while `max_runs` of its runs have not ended — queued or admitted —
/// naming them, oldest first, and writes nothing; once one ends, the new
/// run goes in. A retry under an idempotency key is the existing run, not
/// a new one.
async fn a_full_group_refuses_or_queues_a_new_run(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    let refusing = |n: u128| NewRun {
        admission: Some(AdmissionRequest {
            group: "drop.flow".into(),
            max_runs: 2,
            refuse_when_full: true,
        }),
        idempotency_key: Some(format!("k{n}")),
        ..new_run(n, v.version, &json!(n as u64))
    };
    s.create_run(refusing(1)).await.expect("first");
    s.create_run(refusing(2)).await.expect("second");
    let err = s.create_run(refusing(3)).await.expect_err("full");
    match &err {
        StoreError::AdmissionFull {
            group,
            max_runs,
            active,
        } => {
            assert_eq!((group.as_str(), *max_runs), ("drop.flow", 2));
            assert_eq!(active, &[run_id(1), run_id(2)]);
        }
        other => panic!("expected AdmissionFull, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("drop.flow")
            && msg.contains(run_id(1).as_str())
            && msg.contains("nothing was written"),
        "{msg}"
    );
    assert_eq!(s.run(&run_id(3)).await.expect("read"), None);
    // The same request again under its key: the existing run, not refused.
    assert!(matches!(
        s.create_run(refusing(2)).await.expect("retry"),
        CreateRun::Existing(_)
    ));
    // A run that ends makes room.
    let lease = claim(s, &run_id(1), "host-1", T0).await.expect("claim");
    end_run(s, &lease, 0, RunStatus::Cancelled).await;
    let rec = s.create_run(refusing(3)).await.expect("room").into_record();
    assert_eq!(rec.status, RunStatus::Queued);
}

/// Many claimers at once on one group never admit more than its
/// `max_runs`, round after round.
async fn racing_claimers_never_admit_more_than_max_runs(h: &Harness) {
    let stores = h.stores().await;
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    for n in 0..24 {
        s.create_run(in_group(100 + n, v.version, "race", 3))
            .await
            .expect("create");
    }
    let mut ended = 0;
    for round in 0..4u64 {
        let mut tasks = Vec::new();
        for (k, st) in stores.iter().cycle().take(6).enumerate() {
            let st = Arc::clone(st);
            tasks.push(tokio::spawn(async move {
                let owner = format!("host-{k}");
                let mut got = st.claim_runnable(&owner, T0, TTL, 2).await.expect("claim");
                // And one by one: the oldest run of the group not held.
                for n in 100..124 {
                    if let Some(l) = st
                        .claim_run(&run_id(n), &owner, T0, TTL)
                        .await
                        .expect("claim")
                    {
                        let rec = st.run(&run_id(n)).await.expect("read").expect("exists");
                        got.push((rec, l));
                        break;
                    }
                }
                got
            }));
        }
        let mut leases: Vec<Lease> = Vec::new();
        for t in tasks {
            for (_, l) in t.await.expect("task") {
                leases.push(l);
            }
        }
        // Reclaims by another owner of a live lease are refused, so each
        // admitted run is in `leases` at most once per owner; count runs.
        let admitted: BTreeSet<RunId> = leases.iter().map(|l| l.run.clone()).collect();
        let stored = s
            .list_runs(RunFilter::default())
            .await
            .expect("runs")
            .into_iter()
            .filter(|r| r.admitted)
            .count();
        assert_eq!(
            stored, 3,
            "round {round}: the group's slots are all taken, no more"
        );
        assert!(admitted.len() <= 3, "round {round}: {admitted:?}");
        // End what is admitted, as its current holder.
        for r in s.list_runs(RunFilter::default()).await.expect("runs") {
            if r.admitted {
                let lease = r.lease.clone().expect("an admitted run here is held");
                let next = s.events(&r.id).await.expect("events").len() as u64;
                end_run(s, &lease, next, RunStatus::Completed).await;
                ended += 1;
            }
        }
    }
    assert_eq!(ended, 12);
}

/// Whether `waiter` (already listening) is woken by what `act` does: it
/// waits for work for ten minutes, and must hear of it well before. Wake-ups
/// from earlier writes are drained first, so only `act` can wake it.
async fn wakes<F: std::future::Future<Output = ()>>(waiter: &Arc<dyn Store>, act: F) -> bool {
    loop {
        let t = Instant::now();
        waiter.wait_for_work(Duration::from_millis(300)).await;
        if t.elapsed() >= Duration::from_millis(290) {
            break;
        }
    }
    let w = Arc::clone(waiter);
    let waiting = tokio::spawn(async move {
        w.wait_for_work(Duration::from_secs(600)).await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    act.await;
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .is_ok()
}

/// A host waiting for work is woken — on PostgreSQL from another
/// connection pool, as another host would be (LISTEN/NOTIFY); on SQLite
/// and in memory within the process — by a run queued, a lease handed
/// back and an admission slot freed.
async fn a_write_that_makes_work_wakes_a_waiting_host(h: &Harness) {
    let s = h.s();
    let waiter = match h.stores().await.pop() {
        #[cfg(feature = "postgres")]
        Some(other) if h._db.is_some() => other,
        _ => Arc::clone(&h.store),
    };
    // The first wait starts listening (and returns once it does, or soon).
    waiter.wait_for_work(Duration::from_secs(5)).await;
    let v = publish(s, "demo.flow", "a", None).await;
    assert!(
        wakes(&waiter, async {
            s.create_run(in_group(1, v.version, "wake", 1))
                .await
                .expect("create");
        })
        .await,
        "a queued run wakes the waiting host"
    );
    let lease = claim(s, &run_id(1), "host-1", T0).await.expect("claim");
    s.create_run(in_group(2, v.version, "wake", 1))
        .await
        .expect("create");
    assert!(
        wakes(&waiter, async {
            s.release_lease(&lease).await.expect("release");
        })
        .await,
        "a lease handed back wakes it"
    );
    let lease = claim(s, &run_id(1), "host-1", T0).await.expect("claim");
    assert!(
        wakes(&waiter, async {
            end_run(s, &lease, 0, RunStatus::Completed).await;
        })
        .await,
        "a slot freed wakes it"
    );
}

async fn claim_runnable_takes_the_oldest_runs_that_need_a_driver(h: &Harness) {
    let s = h.s();
    let v = publish(s, "demo.flow", "a", None).await;
    // Created out of order: created_at decides, then the id.
    for (n, at) in [
        (1, 50),
        (2, 10),
        (3, 30),
        (4, 30),
        (5, 20),
        (6, 40),
        (7, 60),
        (8, 5),
    ] {
        s.create_run(NewRun {
            created_at: T0 + at,
            ..new_run(n, v.version, &json!(n as u64))
        })
        .await
        .expect("create");
    }
    s.commit(set_status(&run_id(1), RunStatus::Running))
        .await
        .expect("running");
    s.commit(set_status(&run_id(2), RunStatus::WaitingJudgment))
        .await
        .expect("waiting");
    s.commit(set_status(&run_id(5), RunStatus::Blocked))
        .await
        .expect("blocked");
    s.commit(set_status(&run_id(8), RunStatus::Completed))
        .await
        .expect("completed");
    s.commit(set_status(&run_id(7), RunStatus::Failed))
        .await
        .expect("failed");
    let held = claim(s, &run_id(6), "host-9", T0).await.expect("held");
    let expired = claim(s, &run_id(4), "host-9", T0 - TTL)
        .await
        .expect("held");

    // Runnable, oldest first: 3 (30), 4 (30, expired lease), 1 (50, running).
    let now = T0 + 1;
    let got = s
        .claim_runnable("host-1", now, TTL, 2)
        .await
        .expect("claim");
    assert_eq!(
        got.iter().map(|(r, _)| r.id.clone()).collect::<Vec<_>>(),
        [run_id(3), run_id(4)]
    );
    for (r, l) in &got {
        assert_eq!(
            r.lease.as_ref(),
            Some(l),
            "the record carries its new lease"
        );
        assert_eq!((l.owner.as_str(), l.expires_at), ("host-1", now + TTL));
        assert_eq!(lease_of(s, &r.id).await.as_ref(), Some(l));
    }
    assert_eq!(got[0].1.epoch, 1);
    assert_eq!(got[1].1.epoch, expired.epoch + 1, "a takeover");
    let rest = s
        .claim_runnable("host-2", now, TTL, 10)
        .await
        .expect("claim");
    assert_eq!(
        rest.iter().map(|(r, _)| r.id.clone()).collect::<Vec<_>>(),
        [run_id(1)]
    );
    assert_eq!(rest[0].0.status, RunStatus::Running);
    // Nothing left: waiting, blocked, terminal and live-leased runs stay.
    assert!(
        s.claim_runnable("host-3", now, TTL, 10)
            .await
            .expect("claim")
            .is_empty()
    );
    assert!(
        s.claim_runnable("host-3", now, TTL, 0)
            .await
            .expect("limit 0")
            .is_empty()
    );
    assert_eq!(lease_of(s, &run_id(6)).await, Some(held));
    for n in [2, 5, 7, 8] {
        assert_eq!(lease_of(s, &run_id(n)).await, None, "run {n}");
    }
    // The holder's own live lease is not runnable either, but an expired one is.
    assert!(
        s.claim_runnable("host-9", now, TTL, 10)
            .await
            .expect("claim")
            .is_empty()
    );
    let later = s
        .claim_runnable("host-9", now + TTL, TTL, 10)
        .await
        .expect("claim");
    assert_eq!(
        later.iter().map(|(r, _)| r.id.clone()).collect::<Vec<_>>(),
        [run_id(3), run_id(4), run_id(6), run_id(1)]
    );
    // The operator's host takes a waiting run with claim_run.
    assert!(claim(s, &run_id(2), "operator", now).await.is_some());
}

async fn concurrent_claim_runnable_callers_never_share_a_run(h: &Harness) {
    const RUNS: u128 = 60;
    let s = Arc::clone(&h.store);
    let v = publish(&*s, "demo.flow", "a", None).await;
    for n in 0..RUNS {
        s.create_run(new_run(n, v.version, &json!(n as u64)))
            .await
            .expect("create");
    }
    let claimed = race_claim_runnable(vec![Arc::clone(&s), Arc::clone(&s), s], 4).await;
    assert_eq!(claimed.len() as u128, RUNS, "every run claimed once");
}

/// Each store in `stores` runs a task claiming `batch` runs at a time until
/// none is left. Asserts no run went to two tasks; returns every run claimed.
async fn race_claim_runnable(stores: Vec<Arc<dyn Store>>, batch: u32) -> BTreeSet<RunId> {
    let mut tasks = Vec::new();
    for (k, s) in stores.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let owner = format!("host-{k}");
            let mut mine = Vec::new();
            loop {
                let got = s
                    .claim_runnable(&owner, T0, TTL, batch)
                    .await
                    .expect("claim");
                if got.is_empty() {
                    return mine;
                }
                for (r, l) in got {
                    assert_eq!(l.owner, owner);
                    assert_eq!(r.lease.as_ref(), Some(&l));
                    mine.push(r.id);
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut all = BTreeSet::new();
    let mut per_task = Vec::new();
    for t in tasks {
        let mine = t.await.expect("task");
        per_task.push(mine.len());
        for id in mine {
            assert!(all.insert(id.clone()), "run {id} was claimed twice");
        }
    }
    eprintln!("claims per caller: {per_task:?}");
    all
}

async fn concurrent_commits_from_many_tasks(h: &Harness) {
    let s = Arc::clone(&h.store);
    const RUNS: u128 = 12;
    const COMMITS: u64 = 15;
    for n in 0..RUNS {
        make_run(&*s, n).await;
    }
    let mut tasks = Vec::new();
    for n in 0..RUNS {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            for k in 0..COMMITS {
                let mut c = commit_of(&run_id(n), vec![event(2 * k, "a"), event(2 * k + 1, "b")]);
                c.durability = if k.is_multiple_of(2) {
                    Durability::Buffered
                } else {
                    Durability::Sync
                };
                c.intents = vec![IntentRecord {
                    iteration: k as u32,
                    ..intent(&run_id(n), "s", 1, IntentPhase::Pending)
                }];
                s.commit(c).await.expect("commit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    for n in 0..RUNS {
        let seqs: Vec<u64> = s
            .events(&run_id(n))
            .await
            .expect("events")
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (0..2 * COMMITS).collect::<Vec<_>>());
        assert_eq!(
            s.intents(&run_id(n)).await.expect("intents").len(),
            COMMITS as usize
        );
    }

    // Eight writers race for the same next seq of one run: exactly one wins.
    let race = run_id(0);
    let next = 2 * COMMITS;
    let mut racers = Vec::new();
    for w in 0..8u64 {
        let s = Arc::clone(&s);
        let race = race.clone();
        racers.push(tokio::spawn(async move {
            let mut e = event(next, "racer");
            e.body = json!({"writer": w}).into();
            s.commit(commit_of(&race, vec![e])).await
        }));
    }
    let mut wins = 0;
    for r in racers {
        match r.await.expect("task") {
            Ok(()) => wins += 1,
            Err(StoreError::SequenceConflict { expected, got, .. }) => {
                assert_eq!((expected, got), (next + 1, next));
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(wins, 1);
    assert_eq!(
        s.events(&race).await.expect("events").len() as u64,
        next + 1
    );
}

async fn json_bodies_round_trip_exactly(h: &Harness) {
    let s = h.s();
    let run = make_run(s, 1).await;
    let body = json!({
        "floats": [0.1, 0.30000000000000004, 1e-300, 2.5e300, -0.0, 5e-324, 1.7976931348623157e308],
        "ints": [0, -1, i64::MIN, u64::MAX],
        "text": "naïve ☃ \u{0} \"quoted\" \n",
        "nested": {"z": [], "a": {"b": null}},
    });
    let mut c = commit_of(
        &run.id,
        vec![NewEvent {
            seq: 0,
            at: T0,
            kind: "state_write".into(),
            body: EventBody::from(&body),
        }],
    );
    c.intents = vec![IntentRecord {
        record: Some(body.clone()),
        ..intent(&run.id, "a", 1, IntentPhase::Pending)
    }];
    s.commit(c).await.expect("commit");
    assert_eq!(s.events(&run.id).await.expect("events")[0].body, body);
    assert_eq!(
        s.intents(&run.id).await.expect("intents")[0].record,
        Some(body)
    );
}

// -------------------------------------------------------- SQLite on disk

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).expect("raw open")
}

async fn sqlite_at(path: &Path) -> SqliteStore {
    SqliteStore::open(path).await.expect("open")
}

fn file_digest(path: &Path) -> blake3::Hash {
    blake3::hash(&std::fs::read(path).expect("read file"))
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_refuse_rewriting_history_through_raw_sql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    let s = sqlite_at(&path).await;
    let run = make_run(&s, 1).await;
    let mut c = commit_of(&run.id, vec![event(0, "a")]);
    c.intents = vec![intent(&run.id, "a", 1, IntentPhase::Pending)];
    c.blobs = vec![b"blob".to_vec()];
    s.commit(c).await.expect("commit");
    drop(s);

    let db = raw(&path);
    for sql in [
        "UPDATE versions SET created_at = 0",
        "UPDATE versions SET canonical = x'00'",
        "DELETE FROM versions",
        "UPDATE blobs SET bytes = x'00'",
        "DELETE FROM blobs",
        "UPDATE events SET kind = 'forged'",
        "DELETE FROM events",
        "UPDATE intents SET phase = 'committed'",
        "DELETE FROM intents",
        "UPDATE runs SET input_hash = 'b3:0000000000000000000000000000000000000000000000000000000000000000'",
        "UPDATE runs SET version = 'b3:0000000000000000000000000000000000000000000000000000000000000000'",
        "UPDATE runs SET tenant = 'other'",
        "DELETE FROM runs",
        // A child run in another tenant than its parent's.
        "INSERT INTO runs (id, workflow_id, version, status, input_hash, parent_run, parent_step,
                           created_at, updated_at, tenant)
         SELECT 'WFR-child', workflow_id, version, 'queued', input_hash, id, 'sub', 0, 0, 'other'
         FROM runs",
        // A gap in an episode.
        "INSERT INTO events (run, seq, at, kind, body) SELECT id, 5, 0, 'gap', '{}' FROM runs",
    ] {
        let err = db.execute(sql, []).expect_err(sql);
        assert!(err.to_string().contains("poimen:"), "{sql}: {err}");
    }
    // Status may change (through the store's rules), which raw SQL can also do.
    db.execute("UPDATE runs SET status = 'running'", [])
        .expect("status is mutable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_record_is_unchanged_on_disk_after_publishing_v2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    let s = sqlite_at(&path).await;
    let v1 = publish(&s, "a.flow", "1", None).await;
    let read_row = || {
        raw(&path)
            .query_row(
                "SELECT seq, version, parent, workflow_id, canonical, created_at FROM versions WHERE version = ?1",
                [v1.version.to_string()],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Vec<u8>>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                },
            )
            .expect("row")
    };
    let before = read_row();
    assert_eq!(
        before.4,
        canonical("a.flow", "1"),
        "the canonical bytes as published"
    );
    let v2 = publish(&s, "a.flow", "2", Some(v1.version)).await;
    assert_eq!(v2.parent, Some(v1.version));
    // And publishing v1 again, with some parent, changes nothing either.
    s.publish_version(NewVersion::of(
        wf("a.flow"),
        canonical("a.flow", "1"),
        Some(v2.version),
        T0 + 7,
    ))
    .await
    .expect("republish");
    assert_eq!(read_row(), before);
    assert_eq!(s.version(&v1.version).await.expect("read"), Some(v1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_content_is_detected_on_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    let s = sqlite_at(&path).await;
    let marker = b"<<<poimen-blob-marker-0123456789abcdef-0123456789abcdef>>>".repeat(4);
    let h = s.put_blob(marker.clone()).await.expect("put");
    let v = publish(&s, "a.flow", "1", None).await;
    drop(s); // checkpoints the WAL into the file

    // Bit rot: flip one byte of the blob inside the file.
    let mut bytes = std::fs::read(&path).expect("read");
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker.as_slice())
        .expect("blob bytes in the file");
    bytes[at + 10] ^= 0x01;
    std::fs::write(&path, &bytes).expect("write");

    // Through SQL: someone drops the guard and rewrites a version's bytes.
    let db = raw(&path);
    db.execute_batch(
        "DROP TRIGGER versions_no_update;
         UPDATE versions SET canonical = CAST('{\"id\":\"forged\"}' AS BLOB);",
    )
    .expect("tamper");
    drop(db);

    // The page structure is intact, so the store opens; the content is caught on read.
    let s = sqlite_at(&path).await;
    let err = s.blob(&h).await.expect_err("corrupt blob");
    assert!(
        matches!(&err, StoreError::Corrupt { detail, .. } if detail.contains(&h.to_string())),
        "{err:?}"
    );
    assert!(err.is_corruption());
    let err = s.version(&v.version).await.expect_err("corrupt version");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let err = s
        .versions_of(&wf("a.flow"))
        .await
        .expect_err("corrupt version in a list");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    // Publishing the true bytes again reports the conflict instead of "existing".
    let err = s
        .publish_version(NewVersion::of(
            wf("a.flow"),
            canonical("a.flow", "1"),
            None,
            T0,
        ))
        .await
        .expect_err("conflict");
    assert!(matches!(err, StoreError::VersionConflict { .. }), "{err:?}");
}

/// A store with enough in it to span many pages.
async fn populated_store(path: &Path) {
    let s = sqlite_at(path).await;
    let run = make_run(&s, 1).await;
    for k in 0..40u64 {
        let mut c = commit_of(&run.id, vec![event(k, "filler")]);
        c.blobs = vec![vec![k as u8; 3000]];
        s.commit(c).await.expect("commit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_and_foreign_files_are_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Truncated to half: Corrupt, and the file is left as it was.
    let truncated = dir.path().join("truncated.db");
    populated_store(&truncated).await;
    let len = std::fs::metadata(&truncated).expect("meta").len();
    assert!(len > 64 * 1024, "the store spans many pages ({len} bytes)");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .and_then(|f| f.set_len(len / 2))
        .expect("truncate");
    let before = file_digest(&truncated);
    let err = SqliteStore::open(&truncated).await.expect_err("truncated");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("damaged"), "{err}");
    assert_eq!(file_digest(&truncated), before, "nothing changed");

    // Truncated inside the header.
    let stub = dir.path().join("stub.db");
    populated_store(&stub).await;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&stub)
        .and_then(|f| f.set_len(60))
        .expect("truncate");
    let err = SqliteStore::open(&stub).await.expect_err("stub");
    assert!(err.is_corruption(), "{err:?}");

    // Empty file.
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("write");
    let err = SqliteStore::open(&empty).await.expect_err("empty");
    assert!(
        matches!(&err, StoreError::Corrupt { detail, .. } if detail.contains("empty")),
        "{err:?}"
    );

    // Garbage.
    let garbage = dir.path().join("garbage.db");
    let junk: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&garbage, &junk).expect("write");
    let err = SqliteStore::open(&garbage).await.expect_err("garbage");
    assert!(matches!(err, StoreError::NotADatabase { .. }), "{err:?}");
    assert_eq!(
        std::fs::read(&garbage).expect("read"),
        junk,
        "nothing changed"
    );

    // Another application's SQLite database.
    let foreign = dir.path().join("foreign.db");
    raw(&foreign)
        .execute_batch("CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('mine');")
        .expect("foreign");
    let err = SqliteStore::open(&foreign).await.expect_err("foreign");
    assert!(
        matches!(&err, StoreError::NotADatabase { detail, .. } if detail.contains("another application")),
        "{err:?}"
    );

    // A directory.
    let err = SqliteStore::open(dir.path()).await.expect_err("directory");
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
}

/// The header check a reading open makes instead of `quick_check`: a file
/// truncated at a page boundary or mid-page is refused, changing nothing;
/// damage inside a page opens, and SQLite reports it when a read reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_checked_open_refuses_a_truncated_store_and_reads_report_damage() {
    let header = SqliteOptions {
        check: OpenCheck::Header,
        ..SqliteOptions::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");

    // An intact store opens and reads.
    let good = dir.path().join("good.db");
    populated_store(&good).await;
    let s = SqliteStore::open_with(&good, header.clone())
        .await
        .expect("an intact store opens with the header check");
    assert_eq!(
        s.list_runs(RunFilter::default()).await.expect("list").len(),
        1
    );
    drop(s);
    let len = std::fs::metadata(&good).expect("meta").len();
    assert!(len > 64 * 1024, "the store spans many pages ({len} bytes)");

    // Truncated at a page boundary, and in the middle of a page.
    for (name, cut, says) in [
        (
            "pages.db",
            (len / 2) / 4096 * 4096,
            "pages its header counts",
        ),
        ("mid.db", len / 2 + 123, "whole number"),
    ] {
        let path = dir.path().join(name);
        std::fs::copy(&good, &path).expect("copy");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(cut))
            .expect("truncate");
        let before = file_digest(&path);
        let err = SqliteStore::open_with(&path, header.clone())
            .await
            .expect_err("truncated");
        assert!(
            matches!(&err, StoreError::Corrupt { detail, .. } if detail.contains(says)),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains("damaged"), "{err}");
        assert_eq!(file_digest(&path), before, "{name}: nothing changed");
    }

    // A page overwritten with garbage: the structure is not scanned at
    // open, and the read that reaches the page reports it as Corrupt.
    let torn = dir.path().join("torn.db");
    std::fs::copy(&good, &torn).expect("copy");
    let mut bytes = std::fs::read(&torn).expect("read");
    let page_size = 4096usize;
    let pages = bytes.len() / page_size;
    for page in 1..pages {
        for (i, b) in bytes[page * page_size..(page + 1) * page_size]
            .iter_mut()
            .enumerate()
        {
            *b = (i as u8).wrapping_mul(31).wrapping_add(7);
        }
    }
    std::fs::write(&torn, &bytes).expect("write");
    let full = SqliteStore::open(&torn).await.expect_err("the full check");
    assert!(full.is_corruption(), "{full:?}");
    match SqliteStore::open_with(&torn, header.clone()).await {
        // The schema lives on page 1 (kept): the open may pass, then
        // reading the runs reaches a torn page.
        Ok(s) => {
            let err = s
                .list_runs(RunFilter::default())
                .await
                .expect_err("a torn page is never data");
            assert!(err.is_corruption(), "{err:?}");
        }
        Err(err) => assert!(err.is_corruption(), "{err:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_naming_both_versions() {
    assert_eq!(SCHEMA_VERSION, 8, "this code writes schema 8");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    populated_store(&path).await;
    // The next schema (a v6 store written by a newer poimen), and one far ahead.
    for found in [SCHEMA_VERSION + 1, 99] {
        raw(&path)
            .execute_batch(&format!("PRAGMA user_version = {found};"))
            .expect("bump");
        let before = file_digest(&path);
        let err = SqliteStore::open(&path).await.expect_err("newer");
        assert!(
            matches!(
                err,
                StoreError::NewerSchema {
                    found: f,
                    supported: SCHEMA_VERSION,
                    ..
                } if f == found
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("schema version {found}"))
                && msg.contains(&format!("the {SCHEMA_VERSION} this poimen supports"))
                && msg.contains("newer poimen"),
            "{msg}"
        );
        assert_eq!(file_digest(&path), before, "nothing changed");
        assert!(!sibling(&path, "-wal").exists(), "nothing left beside it");
    }
}

/// The data in `tests/fixtures/store_v1.sql`, written through the current API.
async fn fixture_contents(s: &dyn Store) {
    let v1 = s
        .publish_version(NewVersion::of(
            wf("fixture.flow"),
            canonical("fixture.flow", "one"),
            None,
            T0,
        ))
        .await
        .expect("v1")
        .record()
        .clone();
    s.publish_version(NewVersion::of(
        wf("fixture.flow"),
        canonical("fixture.flow", "two"),
        Some(v1.version),
        T0 + 1,
    ))
    .await
    .expect("v2");
    let parent = NewRun {
        idempotency_key: Some("fixture-key".into()),
        // A lease of schema 1 had no expiry: migration 4 has it expire when
        // it was claimed, at creation.
        lease: Some(LeaseRequest {
            owner: "host-a".into(),
            ttl_ms: 0,
        }),
        ..new_run(1, v1.version, &json!({"input": 1}))
    };
    s.create_run(parent).await.expect("run 1");
    let child = NewRun {
        parent: Some((run_id(1), StepId::from("sub"))),
        ..new_run(2, v1.version, &json!({"input": 2}))
    };
    s.create_run(child).await.expect("run 2");
    let out = b"{\"output\":2}".to_vec();
    s.commit(Commit {
        run: run_id(2),
        fence: None,
        blobs: vec![out.clone()],
        events: vec![event(0, "run_started"), event(1, "run_completed")],
        intents: vec![
            intent(&run_id(2), "fetch", 1, IntentPhase::Pending),
            intent(&run_id(2), "fetch", 1, IntentPhase::Dispatched),
            intent(&run_id(2), "fetch", 1, IntentPhase::Committed),
        ],
        judgments: vec![],
        run_update: Some(RunUpdate {
            status: RunStatus::Completed,
            reason: None,
            output_hash: Some(BlobHash::of(&out)),
            updated_at: T0 + 20,
            wake_at: None,
        }),
        durability: Durability::Sync,
    })
    .await
    .expect("child commit");
    s.commit(Commit {
        events: vec![event(0, "run_started"), event(1, "judgment_requested")],
        judgments: vec![
            JudgmentWrite::Open {
                id: judgment_id(1),
                step: StepId::from("review"),
                iteration: 0,
                request: json!({"question": "ok?"}),
                request_hash: "b3:req1".into(),
                at: T0 + 30,
            },
            JudgmentWrite::Open {
                id: judgment_id(2),
                step: StepId::from("review"),
                iteration: 1,
                request: json!({"question": "really?"}),
                request_hash: "b3:req2".into(),
                at: T0 + 31,
            },
            JudgmentWrite::Answer {
                id: judgment_id(1),
                result: json!({"verdict": true}),
                at: T0 + 40,
            },
        ],
        run_update: Some(RunUpdate {
            status: RunStatus::WaitingJudgment,
            reason: None,
            output_hash: None,
            updated_at: T0 + 31,
            wake_at: None,
        }),
        ..Commit::new(run_id(1))
    })
    .await
    .expect("parent commit");
}

/// Everything a store shows through the API, for comparing two stores.
async fn observe(s: &dyn Store) -> Vec<String> {
    let mut seen = vec![format!("{:?}", s.workflows().await.expect("workflows"))];
    for w in s.workflows().await.expect("workflows") {
        seen.push(format!(
            "{:?}",
            s.versions_of(&w.workflow_id).await.expect("versions")
        ));
    }
    let runs = s.list_runs(RunFilter::default()).await.expect("runs");
    seen.push(format!("{runs:?}"));
    for r in &runs {
        seen.push(format!("{:?}", s.events(&r.id).await.expect("events")));
        seen.push(format!("{:?}", s.intents(&r.id).await.expect("intents")));
        seen.push(format!("{:?}", s.children(&r.id).await.expect("children")));
        seen.push(format!("{:?}", s.blob(&r.input_hash).await.expect("input")));
        if let Some(o) = r.output_hash {
            seen.push(format!("{:?}", s.blob(&o).await.expect("output")));
        }
    }
    seen.push(format!("{:?}", s.open_judgments().await.expect("open")));
    for n in 1..=2 {
        seen.push(format!(
            "{:?}",
            s.judgment(&judgment_id(n)).await.expect("judgment")
        ));
    }
    seen.push(format!(
        "{:?}",
        s.in_flight_runs().await.expect("in flight")
    ));
    seen.push(format!(
        "{:?}",
        s.runs_owned_by("host-a").await.expect("owned")
    ));
    seen
}

/// Every table of an SQLite store and the order to read its rows in.
const TABLES: [(&str, &str); 8] = [
    ("schema_migrations", "version"),
    ("versions", "seq"),
    ("blobs", "hash"),
    ("runs", "seq"),
    ("events", "run, seq"),
    ("intents", "id"),
    ("judgments", "seq"),
    ("judgment_answers", "judgment"),
];

type Rows = Vec<Vec<rusqlite::types::Value>>;

/// Every row of every table, read with raw SQL.
fn all_rows(db: &rusqlite::Connection) -> Vec<Rows> {
    TABLES
        .iter()
        .map(|(table, order)| {
            let mut stmt = db
                .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
                .expect("prepare");
            let n = stmt.column_count();
            stmt.query_map([], |r| (0..n).map(|k| r.get(k)).collect())
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows")
        })
        .collect()
}

/// Loads the frozen v1 fixture at `path`, then, for `version` 2, applies
/// migration 2 by hand as a v2 poimen did: the store a user of that version has.
fn old_store(path: &Path, version: u32) {
    assert!(
        matches!(version, 1 | 2),
        "a v{version} store cannot be made here"
    );
    let db = raw(path);
    db.execute_batch(include_str!("fixtures/store_v1.sql"))
        .expect("load the v1 fixture");
    if version >= 2 {
        db.execute_batch(&format!(
            "BEGIN;
             {}
             INSERT INTO schema_migrations (version, name)
                 VALUES (2, 'intents: drop the redundant index intents_by_run');
             PRAGMA user_version = 2;
             COMMIT;",
            include_str!("../src/sqlite/schema_v2.sql")
        ))
        .expect("migration 2 by hand");
    }
    let found: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(found, i64::from(version));
}

/// Opens the old store at `path` (at schema `from`) with the current code and
/// checks the upgrade: every row intact, runs in the default tenant, the
/// rebuilt intents table guarded, the API reading exactly what the same data
/// written by this code reads, and new writes — an `abandoned` phase among
/// them — taken.
async fn upgrades_with_every_row_intact(path: &Path, from: u32) {
    let before = all_rows(&raw(path));
    let s = sqlite_at(path).await;
    let db = raw(path);
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(
        version,
        i64::from(SCHEMA_VERSION),
        "upgraded to the current schema"
    );

    let after = all_rows(&db);
    for (k, (table, _)) in TABLES.iter().enumerate() {
        match *table {
            // One row per migration: the old ones as they were, then the new.
            "schema_migrations" => {
                assert_eq!(after[k][..before[k].len()], before[k][..], "{table}");
                let applied: Vec<_> = after[k].iter().map(|r| r[0].clone()).collect();
                let want: Vec<_> = (1..=i64::from(SCHEMA_VERSION))
                    .map(rusqlite::types::Value::Integer)
                    .collect();
                assert_eq!(applied, want, "{table}");
            }
            // Every old column as it was; the tenant, new, is `default`;
            // the old lease of run 1 is epoch 1, expiring when it was
            // claimed, and run 2, never claimed, has epoch 0 and no expiry;
            // neither is in an admission group, nor has a timer.
            "runs" => {
                use rusqlite::types::Value::{Integer, Null, Text};
                assert_eq!(after[k].len(), before[k].len(), "{table}");
                let leases = [
                    [Integer(1), Integer(T0 + 1), Null, Null, Integer(0), Null],
                    [Integer(0), Null, Null, Null, Integer(0), Null],
                ];
                for ((new, old), lease) in after[k].iter().zip(&before[k]).zip(&leases) {
                    assert_eq!(new[..old.len()], old[..], "{table}");
                    assert_eq!(new[old.len()], Text(DEFAULT_TENANT.into()), "{table}");
                    assert_eq!(new[old.len() + 1..], lease[..], "{table}");
                }
            }
            // Row for row, intents with their ids (the write order).
            _ => assert_eq!(after[k], before[k], "{table} (from v{from})"),
        }
    }
    assert!(!before[5].is_empty(), "the fixture has intents");

    // It reads exactly like the same data written by this code.
    let fresh = MemoryStore::new();
    fixture_contents(&fresh).await;
    assert_eq!(observe(&s).await, observe(&fresh).await);
    let runs = s.list_runs(RunFilter::default()).await.expect("runs");
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r.tenant == DEFAULT_TENANT), "{runs:?}");
    let of_default = s
        .list_runs(RunFilter {
            tenant: Some(DEFAULT_TENANT.into()),
            ..RunFilter::default()
        })
        .await
        .expect("of default");
    assert_eq!(of_default, runs);

    // And it takes new writes: an answer, and a call abandoned while dispatched.
    let mut c = commit_of(&run_id(1), vec![event(2, "judgment_received")]);
    c.judgments = vec![JudgmentWrite::Answer {
        id: judgment_id(2),
        result: json!({"verdict": false}),
        at: T0 + 50,
    }];
    c.intents = vec![
        intent(&run_id(1), "call", 1, IntentPhase::Pending),
        intent(&run_id(1), "call", 1, IntentPhase::Dispatched),
        intent(&run_id(1), "call", 1, IntentPhase::Abandoned),
    ];
    s.commit(c).await.expect("write to upgraded store");
    assert!(s.open_judgments().await.expect("open").is_empty());
    let phases: Vec<_> = s
        .intents(&run_id(1))
        .await
        .expect("intents")
        .into_iter()
        .map(|i| i.phase)
        .collect();
    assert_eq!(
        phases,
        [
            IntentPhase::Pending,
            IntentPhase::Dispatched,
            IntentPhase::Abandoned
        ]
    );
    let mut stmt = db
        .prepare("SELECT id FROM intents ORDER BY id")
        .expect("prepare");
    let ids: Vec<i64> = stmt
        .query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .expect("ids");
    drop(stmt);
    assert_eq!(
        ids,
        [1, 2, 3, 4, 5, 6],
        "new records continue the write order"
    );
    let child = s
        .create_run(child_of(1, 3, fixture_version(&s).await, "other"))
        .await
        .expect_err("a child of an old run in another tenant");
    assert!(
        matches!(child, StoreError::TenantMismatch { .. }),
        "{child:?}"
    );
    drop(s);

    // The rebuilt intents table still refuses rewriting history.
    for sql in [
        "UPDATE intents SET phase = 'committed'",
        "UPDATE intents SET output_hash = 'b3:forged' WHERE id = 3",
        "DELETE FROM intents",
        "DELETE FROM intents WHERE id = 1",
        "UPDATE runs SET tenant = 'other'",
    ] {
        let err = db.execute(sql, []).expect_err(sql);
        assert!(err.to_string().contains("poimen:"), "{sql}: {err}");
    }
    let err = db
        .execute(
            "INSERT INTO intents (run, step, iteration, attempt, phase, tool, tool_version,
                digest, effect, args_hash, idempotency_key, at)
             VALUES ('WFR-01HF7YAT000000000000000001', 'x', 0, 1, 'forgotten', 't', '1', 'd',
                'pure', 'h', 'k', 0)",
            [],
        )
        .expect_err("not a phase");
    assert!(err.to_string().contains("CHECK"), "{err}");
    let ok: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(ok, "ok");
}

/// The version the fixture's runs run.
async fn fixture_version(s: &dyn Store) -> WorkflowVersion {
    s.latest_version(&wf("fixture.flow"))
        .await
        .expect("latest")
        .expect("published")
        .version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_store_opens_and_reads_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v1.db");
    old_store(&path, 1);
    upgrades_with_every_row_intact(&path, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v2_store_upgrades_with_every_row_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.db");
    old_store(&path, 2);
    let indexes: i64 = raw(&path)
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'intents_by_run'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(indexes, 0, "a v2 store has no intents_by_run");
    upgrades_with_every_row_intact(&path, 2).await;
}

// ------------------------------------------------- read-only and full disks

/// A tmpfs mounted for one test, unmounted when dropped. `None` where this
/// process may not mount (not root).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, opts: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(self.dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "remount {opts}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_is_refused_and_left_unchanged() {
    // Root ignores file modes, so as root the store sits on a tmpfs that is
    // remounted read-only; otherwise the file and directory lose write bits.
    let mount = if is_root() {
        match Tmpfs::mount("8m") {
            Some(m) => Some(m),
            None => {
                eprintln!("skipped: running as root without permission to mount a tmpfs");
                return;
            }
        }
    } else {
        None
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = mount.as_ref().map_or(tmp.path(), Tmpfs::path).join("ro");
    let path = dir.join("poimen.db");
    populated_store(&path).await;
    match &mount {
        Some(m) => m.remount("ro"),
        None => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).expect("chmod");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        }
    }
    let before = file_digest(&path);
    let err = SqliteStore::open(&path).await.expect_err("read-only");
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    assert!(err.is_unavailable());
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(file_digest(&path), before, "nothing changed");
    assert!(!sibling(&path, "-wal").exists() && !sibling(&path, "-shm").exists());

    // A new store in a read-only directory: refused, nothing created.
    let fresh = dir.join("sub").join("new.db");
    let err = SqliteStore::open(&fresh).await.expect_err("read-only dir");
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    assert!(!fresh.exists());

    if mount.is_none() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod back");
    }
}

/// Fills the store with blob commits until the store reports Full; checks
/// the failed commit left nothing and the store still answers reads.
/// Returns how many commits went in.
async fn fill_until_full(s: &SqliteStore, run: &RunId) -> u64 {
    for k in 0..100_000u64 {
        let blob: Vec<u8> = (0..16 * 1024u32)
            .map(|i| (i as u64 ^ k).wrapping_mul(31) as u8)
            .collect();
        let mut c = commit_of(run, vec![event(k, "filler")]);
        c.blobs = vec![blob.clone()];
        match s.commit(c).await {
            Ok(()) => continue,
            Err(err) => {
                assert!(matches!(err, StoreError::Full { .. }), "{err:?}");
                assert!(err.is_unavailable());
                let events = s.events(run).await.expect("reads still work");
                assert_eq!(events.len() as u64, k, "the failed commit left nothing");
                assert_eq!(s.blob(&BlobHash::of(&blob)).await.expect("read"), None);
                return k;
            }
        }
    }
    panic!("the store never filled up")
}

async fn assert_consistent(path: &Path, run: &RunId, committed: u64) {
    let s = sqlite_at(path).await; // quick_check runs at open
    let seqs: Vec<u64> = s
        .events(run)
        .await
        .expect("events")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (0..committed).collect::<Vec<_>>());
    let ok: String = raw(path)
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(ok, "ok");
    // And it takes writes again.
    s.commit(commit_of(run, vec![event(committed, "after")]))
        .await
        .expect("write after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_the_write_and_stays_consistent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    let run = {
        let s = sqlite_at(&path).await;
        make_run(&s, 1).await.id
    };
    let limited = SqliteOptions {
        max_page_count: Some(200),
        ..SqliteOptions::default()
    };
    let s = SqliteStore::open_with(&path, limited).await.expect("open");
    let committed = fill_until_full(&s, &run).await;
    assert!(committed > 0);
    drop(s);
    assert_consistent(&path, &run, committed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_filesystem_refuses_the_write_and_stays_consistent() {
    let Some(fs) = Tmpfs::mount("2m") else {
        eprintln!(
            "skipped: cannot mount a tmpfs here (not root); the page-limit test covers SQLITE_FULL"
        );
        return;
    };
    let path = fs.path().join("poimen.db");
    let s = sqlite_at(&path).await;
    let run = make_run(&s, 1).await.id;
    let committed = fill_until_full(&s, &run).await;
    assert!(committed > 0);
    eprintln!("the 2 MiB tmpfs took {committed} commits");
    drop(s);

    // Reopening on the still-full disk either works or says Full: never corrupt.
    match SqliteStore::open(&path).await {
        Ok(s) => {
            let n = s.events(&run).await.expect("events").len() as u64;
            assert_eq!(n, committed);
            eprintln!("reopened on the full file system: {n} commits readable");
        }
        Err(err) => {
            assert!(matches!(err, StoreError::Full { .. }), "{err:?}");
            eprintln!("reopening on the full file system: {err}");
        }
    }
    // With room again, everything committed is there and the store is whole.
    fs.remount("size=8m");
    assert_consistent(&path, &run, committed).await;
}

// ------------------------------------------------------------- crash safety

const CRASH_ENV: &str = "POIMEN_STORE_CRASH_CHILD";

/// Not a test of its own: the body of the child process that
/// `sigkill_mid_commit_loses_nothing_returned` starts (this same test
/// binary, run with `CRASH_ENV` set) and kills. Without the variable it
/// returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child_entry() {
    let Ok(path) = std::env::var(CRASH_ENV) else {
        return;
    };
    let s = sqlite_at(Path::new(&path)).await;
    let run = run_id(1);
    if s.run(&run).await.expect("read").is_none() {
        let v = publish(&s, "crash.flow", "1", None).await;
        s.create_run(new_run(1, v.version, &json!({})))
            .await
            .expect("run");
    }
    let mut next = s.events(&run).await.expect("events").len() as u64;
    let mut out = std::io::stdout().lock();
    loop {
        let mut c = commit_of(&run, vec![event(next, "tick")]);
        c.durability = if next.is_multiple_of(3) {
            Durability::Sync
        } else {
            Durability::Buffered
        };
        c.blobs = vec![next.to_le_bytes().repeat(512)];
        c.intents = vec![IntentRecord {
            iteration: next as u32,
            ..intent(&run, "tick", 1, IntentPhase::Pending)
        }];
        s.commit(c).await.expect("commit");
        // Reported only after `commit` returned.
        writeln!(out, "committed {next}").expect("stdout");
        out.flush().expect("flush");
        next += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_commit_loses_nothing_returned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    let exe = std::env::current_exe().expect("test binary");
    let mut reported: BTreeSet<u64> = BTreeSet::new();
    for round in 0..4u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let want = 40 + 25 * round;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut this_round = 0;
        while this_round < want && Instant::now() < deadline {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(n) = line.strip_prefix("committed ") {
                reported.insert(n.parse().expect("seq"));
                this_round += 1;
            }
        }
        child.kill().expect("SIGKILL"); // SIGKILL on Unix: no destructor, no checkpoint
        child.wait().expect("reap");
        // Read what the pipe still held: commits returned before the kill.
        for line in lines.map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("committed ") {
                reported.insert(n.parse().expect("seq"));
            }
        }
        assert!(this_round > 0, "round {round}: the child committed nothing");

        let s = sqlite_at(&path).await; // quick_check at open
        let events = s.events(&run_id(1)).await.expect("events");
        let stored: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(
            stored,
            (0..stored.len() as u64).collect::<Vec<_>>(),
            "no gaps"
        );
        let missing: Vec<_> = reported
            .iter()
            .filter(|n| **n >= stored.len() as u64)
            .collect();
        assert!(
            missing.is_empty(),
            "round {round}: returned commits lost: {missing:?}"
        );
        for e in &events {
            let blob = e.seq.to_le_bytes().repeat(512);
            assert_eq!(
                s.blob(&BlobHash::of(&blob)).await.expect("blob"),
                Some(blob)
            );
        }
        assert_eq!(
            s.intents(&run_id(1)).await.expect("intents").len(),
            events.len()
        );
        eprintln!(
            "round {round}: {} commits reported returned in all, {} stored",
            reported.len(),
            stored.len()
        );
        drop(s);
        let ok: String = raw(&path)
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(ok, "ok");
    }
}

/// Two stores on one file — two connections, as two processes would have —
/// race `claim_runnable`: SQLite's write lock orders them, and no run goes
/// to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sqlite_stores_on_one_file_never_claim_the_same_run() {
    const RUNS: u128 = 80;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("poimen.db");
    let a: Arc<dyn Store> = Arc::new(sqlite_at(&path).await);
    let b: Arc<dyn Store> = Arc::new(sqlite_at(&path).await);
    let v = publish(&*a, "demo.flow", "a", None).await;
    for n in 0..RUNS {
        a.create_run(new_run(n, v.version, &json!(n as u64)))
            .await
            .expect("create");
    }
    let claimed = race_claim_runnable(vec![Arc::clone(&a), Arc::clone(&b), a, b], 3).await;
    assert_eq!(claimed.len() as u128, RUNS, "every run claimed once");
}

// ------------------------------------------------------------------- misc

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_creates_parent_directories_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a/b/c/poimen.db");
    let v = {
        let s = sqlite_at(&path).await;
        assert_eq!(s.path(), path.as_path());
        publish(&s, "a.flow", "1", None).await
    };
    let s = sqlite_at(&path).await;
    assert_eq!(s.version(&v.version).await.expect("read"), Some(v));
    let app: i64 = raw(&path)
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .expect("application_id");
    assert_eq!(app, i64::from(poimen_store::APPLICATION_ID));
    let mode: String = raw(&path)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal");
}

#[test]
fn errors_say_what_where_and_what_to_do() {
    let p = PathBuf::from("/data/poimen.db");
    let msgs = [
        StoreError::ReadOnly {
            path: p.clone(),
            cause: "EROFS".into(),
        }
        .to_string(),
        StoreError::Full { path: p.clone() }.to_string(),
        StoreError::NewerSchema {
            path: p.clone(),
            found: 3,
            supported: 1,
        }
        .to_string(),
        StoreError::Corrupt {
            path: p.clone(),
            detail: "quick_check failed".into(),
        }
        .to_string(),
    ];
    for m in &msgs {
        assert!(m.contains("/data/poimen.db"), "{m}");
    }
    assert!(msgs[0].contains("writable"), "{}", msgs[0]);
    assert!(msgs[1].contains("free space"), "{}", msgs[1]);
    assert!(
        msgs[2].contains('3') && msgs[2].contains('1') && msgs[2].contains("newer poimen"),
        "{}",
        msgs[2]
    );
    assert!(msgs[3].contains("backup"), "{}", msgs[3]);

    let m = StoreError::TenantMismatch {
        run: run_id(2),
        tenant: "globex".into(),
        parent: run_id(1),
        parent_tenant: "acme".into(),
    }
    .to_string();
    assert!(
        m.contains(run_id(2).as_str())
            && m.contains(run_id(1).as_str())
            && m.contains("`globex`")
            && m.contains("Create the child with tenant `acme`"),
        "{m}"
    );

    let holder = Lease {
        run: run_id(1),
        owner: "host-b".into(),
        epoch: 8,
        expires_at: T0,
    };
    let m = StoreError::LeaseLost {
        run: run_id(1),
        fence: Fence {
            owner: "host-a".into(),
            epoch: 7,
        },
        holder: Some(holder),
    }
    .to_string();
    assert!(
        m.contains(run_id(1).as_str())
            && m.contains("host `host-a` at lease epoch 7 no longer holds")
            && m.contains("host `host-b` holds it now, at lease epoch 8")
            && m.contains("Nothing of this write was written")
            && m.contains("must stop driving the run"),
        "{m}"
    );

    let server = "postgres://poimen:***@db.internal:5432/poimen".to_owned();
    let m = StoreError::Unavailable {
        url_redacted: server.clone(),
        source_message: "error connecting to server: Connection refused (os error 111)".into(),
    };
    assert!(m.is_unavailable());
    let m = m.to_string();
    assert!(
        m.contains(&server) && m.contains("Connection refused") && m.contains("retry"),
        "{m}"
    );
    let m = StoreError::AccessDenied {
        url_redacted: server.clone(),
        source_message: "role \"nobody\" does not exist".into(),
    }
    .to_string();
    assert!(
        m.contains(&server) && m.contains("role") && m.contains("user and password"),
        "{m}"
    );
    // A location on a server gets server advice, not file advice.
    let m = StoreError::Corrupt {
        path: PathBuf::from(&server),
        detail: "run status `x` is not well-formed".into(),
    }
    .to_string();
    assert!(m.contains("psql") && !m.contains("sqlite3"), "{m}");
    let m = StoreError::NewerSchema {
        path: PathBuf::from(&server),
        found: 2,
        supported: 1,
    }
    .to_string();
    assert!(m.contains(&server) && m.contains("newer poimen"), "{m}");
}

/// Blocking store work runs where the runtime allows: `block_in_place` on a
/// multi-threaded runtime (every other test here), the blocking pool on a
/// current-thread runtime (where `block_in_place` would panic) — both must
/// write and read the same.
#[tokio::test(flavor = "current_thread")]
async fn sqlite_store_works_on_a_current_thread_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = sqlite_at(&dir.path().join("poimen.db")).await;
    let run = make_run(&s, 1).await;
    let mut c = commit_of(&run.id, vec![event(0, "a"), event(1, "b")]);
    c.intents = vec![intent(&run.id, "a", 1, IntentPhase::Pending)];
    s.commit(c).await.expect("commit");
    let kinds: Vec<String> = s
        .events(&run.id)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["a", "b"]);
    assert_eq!(s.intents(&run.id).await.expect("intents").len(), 1);
}

// -------------------------------------------------------------- PostgreSQL

/// Fresh databases on the test server, one per test.
#[cfg(feature = "postgres")]
mod pg {
    use std::sync::atomic::{AtomicU32, Ordering};

    use poimen_store::redact_url;
    use tokio_postgres::NoTls;

    /// The server the tests use: `POIMEN_TEST_PG`, or a throwaway server
    /// of this test binary's own (`poimen-test-pg`).
    pub fn base_url() -> String {
        poimen_test_pg::url()
    }

    /// `url` naming database `name` instead of its own.
    pub fn with_dbname(url: &str, name: &str) -> String {
        poimen_test_pg::with_dbname(url, name)
    }

    /// `url` with its user (and password) replaced by `user`.
    pub fn with_user(url: &str, user: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        format!("{scheme}://{user}@{host}")
    }

    /// A raw connection, for SQL the store would never run.
    pub async fn connect(url: &str) -> tokio_postgres::Client {
        match tokio_postgres::connect(url, NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                client
            }
            Err(e) => panic!(
                "PostgreSQL is not reachable at {} ({e}): the tests start a throwaway server \
                 of their own unless POIMEN_TEST_PG names one, which must accept user \
                 postgres without a password",
                redact_url(url)
            ),
        }
    }

    /// A database of its own, dropped (with any connection left to it) when
    /// this is dropped.
    pub struct TestDb {
        pub name: String,
        pub url: String,
        base: String,
    }

    static NEXT: AtomicU32 = AtomicU32::new(0);

    impl TestDb {
        pub async fn create() -> TestDb {
            let base = base_url();
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let name = format!(
                "poimen_t_{}_{}_{nanos}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            connect(&base)
                .await
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .expect("create the test database");
            TestDb {
                url: with_dbname(&base, &name),
                name,
                base,
            }
        }

        pub async fn raw(&self) -> tokio_postgres::Client {
            connect(&self.url).await
        }
    }

    impl Drop for TestDb {
        fn drop(&mut self) {
            let (base, name) = (self.base.clone(), self.name.clone());
            // Drop may run inside a runtime: the cleanup gets its own, on a
            // thread of its own.
            let done = std::thread::spawn(move || -> Result<(), String> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let (client, conn) = tokio_postgres::connect(&base, NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await
                        .map_err(|e| e.to_string())
                })
            })
            .join();
            if let Ok(Err(e)) | Err(e) = done.map_err(|_| "panicked".to_owned()) {
                eprintln!("could not drop test database {}: {e}", self.name);
            }
        }
    }
}

#[cfg(feature = "postgres")]
async fn pg_store(db: &pg::TestDb) -> poimen_store::PostgresStore {
    poimen_store::PostgresStore::open(&db.url)
        .await
        .expect("open the PostgreSQL store")
}

/// Every applied migration, every table of the database with its row count,
/// and every function: what "nothing was written" compares.
#[cfg(feature = "postgres")]
async fn pg_snapshot(raw: &tokio_postgres::Client) -> Vec<String> {
    let mut seen = Vec::new();
    for row in raw
        .query(
            "SELECT version, name FROM poimen_schema ORDER BY version",
            &[],
        )
        .await
        .expect("poimen_schema")
    {
        seen.push(format!(
            "{}:{}",
            row.get::<_, i32>(0),
            row.get::<_, String>(1)
        ));
    }
    let tables: Vec<String> = raw
        .query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename",
            &[],
        )
        .await
        .expect("tables")
        .iter()
        .map(|r| r.get(0))
        .collect();
    for t in tables {
        let n: i64 = raw
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .await
            .expect("count")
            .get(0);
        seen.push(format!("{t}={n}"));
    }
    let functions: i64 = raw
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
            &[],
        )
        .await
        .expect("functions")
        .get(0);
    seen.push(format!("functions={functions}"));
    seen
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_triggers_refuse_rewriting_history_through_raw_sql() {
    let db = pg::TestDb::create().await;
    let s = pg_store(&db).await;
    let run = make_run(&s, 1).await;
    let mut c = commit_of(&run.id, vec![event(0, "a")]);
    c.intents = vec![intent(&run.id, "a", 1, IntentPhase::Pending)];
    c.blobs = vec![b"blob".to_vec()];
    c.judgments = vec![JudgmentWrite::Open {
        id: judgment_id(1),
        step: StepId::from("review"),
        iteration: 0,
        request: json!({"q": 1}),
        request_hash: "b3:req".into(),
        at: T0,
    }];
    s.commit(c).await.expect("commit");
    let mut c = Commit::new(run.id.clone());
    c.judgments = vec![JudgmentWrite::Answer {
        id: judgment_id(1),
        result: json!(true),
        at: T0,
    }];
    s.commit(c).await.expect("answer");
    let lease = s
        .claim_run(&run.id, "host-1", T0, TTL)
        .await
        .expect("claim")
        .expect("claimed");
    drop(s);

    let raw = db.raw().await;
    let zero = "'b3:0000000000000000000000000000000000000000000000000000000000000000'";
    for sql in [
        "UPDATE versions SET created_at = 0".to_owned(),
        "UPDATE versions SET canonical = '\\x00'".to_owned(),
        "DELETE FROM versions".to_owned(),
        "TRUNCATE versions CASCADE".to_owned(),
        "UPDATE blobs SET bytes = '\\x00'".to_owned(),
        "DELETE FROM blobs".to_owned(),
        "TRUNCATE blobs CASCADE".to_owned(),
        "UPDATE events SET kind = 'forged'".to_owned(),
        "DELETE FROM events".to_owned(),
        "TRUNCATE events".to_owned(),
        "UPDATE intents SET phase = 'committed'".to_owned(),
        "DELETE FROM intents".to_owned(),
        "TRUNCATE intents".to_owned(),
        "UPDATE judgments SET request = '{}'".to_owned(),
        "DELETE FROM judgments".to_owned(),
        "UPDATE judgment_answers SET result = 'false'".to_owned(),
        "DELETE FROM judgment_answers".to_owned(),
        format!("UPDATE runs SET input_hash = {zero}"),
        format!("UPDATE runs SET version = {zero}"),
        "UPDATE runs SET tenant = 'other'".to_owned(),
        "UPDATE runs SET created_at = 0".to_owned(),
        "DELETE FROM runs".to_owned(),
        "UPDATE poimen_schema SET version = 99".to_owned(),
        "DELETE FROM poimen_schema".to_owned(),
        // The lease epoch never goes back.
        format!("UPDATE runs SET lease_epoch = {}", lease.epoch - 1),
        // A child run in another tenant than its parent's.
        "INSERT INTO runs (id, workflow_id, version, tenant, status, input_hash, parent_run,
                           parent_step, created_at, updated_at)
         SELECT 'WFR-child', workflow_id, version, 'other', 'queued', input_hash, id, 'sub', 0, 0
         FROM runs"
            .to_owned(),
        // A gap in an episode.
        "INSERT INTO events (run, seq, at, kind, body) SELECT id, 5, 0, 'gap', '{}' FROM runs"
            .to_owned(),
    ] {
        let err = raw.batch_execute(&sql).await.expect_err(&sql);
        let db_err = err.as_db_error().map(|d| d.message().to_owned());
        assert!(
            db_err.as_deref().is_some_and(|m| m.starts_with("poimen:")),
            "{sql}: {err:?}"
        );
    }
    // A completed run is final.
    raw.batch_execute("UPDATE runs SET status = 'completed'")
        .await
        .expect("status is mutable");
    let err = raw
        .batch_execute("UPDATE runs SET status = 'running'")
        .await
        .expect_err("final");
    assert!(format!("{err:?}").contains("final"), "{err:?}");
    // The tables hold what the store wrote, nothing else.
    let snap = pg_snapshot(&raw).await;
    for want in [
        "blobs=2",
        "events=1",
        "intents=1",
        "judgments=1",
        "judgment_answers=1",
        "runs=1",
        "versions=1",
    ] {
        assert!(snap.iter().any(|s| s == want), "{want}: {snap:?}");
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_blobs_are_stored_once_by_hash() {
    let db = pg::TestDb::create().await;
    let s = pg_store(&db).await;
    let bytes = b"the same bytes, again and again".to_vec();
    for _ in 0..3 {
        s.put_blob(bytes.clone()).await.expect("put");
    }
    let run = make_run(&s, 1).await;
    for k in 0..3 {
        let mut c = commit_of(&run.id, vec![event(k, "e")]);
        c.blobs = vec![bytes.clone(), bytes.clone()];
        s.commit(c).await.expect("commit");
    }
    // Concurrent writers of one blob.
    let s = Arc::new(s);
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (s, b) = (Arc::clone(&s), b"raced".to_vec());
            tokio::spawn(async move { s.put_blob(b).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("put");
    }
    let raw = db.raw().await;
    let count = |h: BlobHash| {
        let raw = &raw;
        async move {
            raw.query_one(
                "SELECT count(*) FROM blobs WHERE hash = $1",
                &[&h.to_string()],
            )
            .await
            .expect("count")
            .get::<_, i64>(0)
        }
    };
    assert_eq!(count(BlobHash::of(&bytes)).await, 1);
    assert_eq!(count(BlobHash::of(b"raced")).await, 1);
    let size: i64 = raw
        .query_one(
            "SELECT size FROM blobs WHERE hash = $1",
            &[&BlobHash::of(&bytes).to_string()],
        )
        .await
        .expect("size")
        .get(0);
    assert_eq!(size, bytes.len() as i64);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_newer_schema_is_refused_and_nothing_written() {
    use poimen_store::PG_SCHEMA_VERSION;
    let db = pg::TestDb::create().await;
    let s = pg_store(&db).await;
    make_run(&s, 1).await;
    drop(s);
    let raw = db.raw().await;
    for found in [PG_SCHEMA_VERSION + 1, 99] {
        raw.execute(
            "INSERT INTO poimen_schema (version, name) VALUES ($1, 'a newer poimen')",
            &[&(found as i32)],
        )
        .await
        .expect("a newer version");
        let before = pg_snapshot(&raw).await;
        let err = poimen_store::PostgresStore::open(&db.url)
            .await
            .expect_err("newer");
        assert!(
            matches!(
                err,
                StoreError::NewerSchema {
                    found: f,
                    supported: PG_SCHEMA_VERSION,
                    ..
                } if f == found
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("schema version {found}"))
                && msg.contains(&format!("the {PG_SCHEMA_VERSION} this poimen supports"))
                && msg.contains("newer poimen")
                && msg.contains(&db.name),
            "{msg}"
        );
        assert_eq!(pg_snapshot(&raw).await, before, "nothing written");
        // Through open_store too.
        let err = poimen_store::open_store(&db.url).await.expect_err("newer");
        assert!(matches!(err, StoreError::NewerSchema { .. }), "{err:?}");
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_unreachable_server_is_unavailable_and_names_it_without_the_password() {
    let url = "postgres://postgres:s3cret-pw@127.0.0.1:1/test";
    let options = poimen_store::PostgresOptions {
        connect_timeout: Duration::from_secs(3),
        ..poimen_store::PostgresOptions::default()
    };
    let started = Instant::now();
    let err = poimen_store::PostgresStore::open_with(url, options)
        .await
        .expect_err("port 1");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "it gave up in time"
    );
    match &err {
        StoreError::Unavailable {
            url_redacted,
            source_message,
        } => {
            assert_eq!(url_redacted, "postgres://postgres:***@127.0.0.1:1/test");
            assert!(!source_message.is_empty());
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.is_unavailable());
    let msg = err.to_string();
    assert!(
        msg.contains("127.0.0.1:1") && msg.contains("server runs") && !msg.contains("s3cret"),
        "{msg}"
    );
    assert!(!format!("{err:?}").contains("s3cret"));
    let err = poimen_store::open_store(url).await.expect_err("port 1");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_unknown_role_is_access_denied() {
    // Make sure the server is up, so the refusal is the role's.
    drop(pg::connect(&pg::base_url()).await);
    let url = pg::with_user(&pg::base_url(), "nobody_xyz:pw");
    let err = poimen_store::PostgresStore::open(&url)
        .await
        .expect_err("unknown role");
    match &err {
        StoreError::AccessDenied {
            url_redacted,
            source_message,
        } => {
            assert!(url_redacted.contains("nobody_xyz:***@"), "{url_redacted}");
            assert!(source_message.contains("nobody_xyz"), "{source_message}");
        }
        other => panic!("expected AccessDenied, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("refused access") && msg.contains("user"),
        "{msg}"
    );
    assert!(!err.is_unavailable());
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_unknown_database_or_a_bad_url_is_refused() {
    drop(pg::connect(&pg::base_url()).await);
    let url = pg::with_dbname(&pg::base_url(), "poimen_no_such_database_xyz");
    let err = poimen_store::PostgresStore::open(&url)
        .await
        .expect_err("no database");
    assert!(
        matches!(&err, StoreError::Open { cause, .. } if cause.contains("poimen_no_such_database_xyz")),
        "{err:?}"
    );
    assert!(err.to_string().contains("CREATE DATABASE"), "{err}");
    let err = poimen_store::PostgresStore::open("postgres://h:notaport/db")
        .await
        .expect_err("bad port");
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_another_applications_database_is_refused() {
    let db = pg::TestDb::create().await;
    let raw = db.raw().await;
    raw.batch_execute("CREATE TABLE runs (x text); INSERT INTO runs VALUES ('mine');")
        .await
        .expect("foreign");
    let before = pg_snapshot_without_schema(&raw).await;
    let err = poimen_store::PostgresStore::open(&db.url)
        .await
        .expect_err("foreign");
    assert!(
        matches!(&err, StoreError::NotADatabase { detail, .. } if detail.contains("runs")),
        "{err:?}"
    );
    assert_eq!(
        pg_snapshot_without_schema(&raw).await,
        before,
        "nothing written"
    );
}

#[cfg(feature = "postgres")]
async fn pg_snapshot_without_schema(raw: &tokio_postgres::Client) -> Vec<String> {
    raw.query(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace
         UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
         ORDER BY 1",
        &[],
    )
    .await
    .expect("catalog")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_hosts_opening_one_new_database_at_once_migrate_it_once() {
    let db = pg::TestDb::create().await;
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move { poimen_store::PostgresStore::open(&url).await })
        })
        .collect();
    for o in opens {
        o.await.expect("task").expect("open");
    }
    let raw = db.raw().await;
    let versions: Vec<i32> = raw
        .query("SELECT version FROM poimen_schema ORDER BY version", &[])
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want: Vec<i32> = (1..=poimen_store::PG_SCHEMA_VERSION as i32).collect();
    assert_eq!(versions, want, "every migration, once");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_the_pool_reconnects_after_the_server_drops_its_connections() {
    let db = pg::TestDb::create().await;
    let s = pg_store(&db).await;
    let run = make_run(&s, 1).await;
    s.commit(commit_of(&run.id, vec![event(0, "before")]))
        .await
        .expect("commit");
    let raw = pg::connect(&pg::base_url()).await;
    let kill = || async {
        raw.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db.name],
        )
        .await
        .expect("terminate")
        .len()
    };
    assert!(kill().await >= 1, "the store had a connection");
    // A call on a connection the server just closed may fail — as
    // Unavailable, naming the server — and the pool replaces it.
    let mut next = 1;
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut ok = false;
        for _ in 0..3 {
            match s
                .commit(commit_of(&run.id, vec![event(next, "after")]))
                .await
            {
                Ok(()) => {
                    next += 1;
                    ok = true;
                    break;
                }
                Err(StoreError::Unavailable { url_redacted, .. }) => {
                    assert!(url_redacted.contains(&db.name), "{url_redacted}");
                }
                Err(other) => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert!(ok, "round {round}: the store did not reconnect");
        kill().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seqs: Vec<u64> = loop {
        match s.events(&run.id).await {
            Ok(e) => break e.iter().map(|e| e.seq).collect(),
            Err(StoreError::Unavailable { .. }) => continue,
            Err(other) => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(seqs, (0..next).collect::<Vec<_>>());
}

/// Two stores on one database — two pools, as two hosts would have — race
/// `claim_runnable`: no run goes to both.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_two_hosts_on_one_database_never_claim_the_same_run() {
    const RUNS: u128 = 80;
    let db = pg::TestDb::create().await;
    let a: Arc<dyn Store> = Arc::new(pg_store(&db).await);
    let b: Arc<dyn Store> = Arc::new(pg_store(&db).await);
    let v = publish(&*a, "demo.flow", "a", None).await;
    for n in 0..RUNS {
        a.create_run(new_run(n, v.version, &json!(n as u64)))
            .await
            .expect("create");
    }
    let claimed = race_claim_runnable(vec![Arc::clone(&a), Arc::clone(&b), a, b], 3).await;
    assert_eq!(claimed.len() as u128, RUNS, "every run claimed once");
}

/// Two hosts racing to create the same keyed run, and to publish the same
/// version: one creates, the other gets the same run back.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_concurrent_creates_under_one_key_yield_one_run() {
    let db = pg::TestDb::create().await;
    let a: Arc<dyn Store> = Arc::new(pg_store(&db).await);
    let b: Arc<dyn Store> = Arc::new(pg_store(&db).await);
    for round in 0..5u128 {
        let bytes = canonical("race.flow", &format!("v{round}"));
        let pubs: Vec<_> = [&a, &b, &a, &b]
            .into_iter()
            .map(|s| {
                let (s, bytes) = (Arc::clone(s), bytes.clone());
                tokio::spawn(async move {
                    s.publish_version(NewVersion::of(wf("race.flow"), bytes, None, T0))
                        .await
                })
            })
            .collect();
        let mut created = 0;
        let mut version = None;
        for p in pubs {
            let out = p.await.expect("task").expect("publish");
            created += usize::from(out.is_created());
            version = Some(out.record().version);
        }
        assert_eq!(created, 1, "round {round}: one publish created the version");
        let version = version.expect("published");
        let creates: Vec<_> = (0..4u128)
            .map(|k| {
                let s = Arc::clone(if k % 2 == 0 { &a } else { &b });
                let new = NewRun {
                    idempotency_key: Some(format!("order-{round}")),
                    ..new_run(100 * round + k, version, &json!({"order": round as u64}))
                };
                tokio::spawn(async move { s.create_run(new).await })
            })
            .collect();
        let mut ids = BTreeSet::new();
        let mut fresh = 0;
        for c in creates {
            let out = c.await.expect("task").expect("create");
            fresh += usize::from(out.is_created());
            ids.insert(out.into_record().id);
        }
        assert_eq!((fresh, ids.len()), (1, 1), "round {round}");
    }
    let raw = db.raw().await;
    let runs: i64 = raw
        .query_one("SELECT count(*) FROM runs", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(runs, 5);
}

// ---------------------------------------------------------- open by URL

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_store_opens_each_backend_by_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A plain path and sqlite://PATH name the same SQLite file.
    let path = dir.path().join("by-url/poimen.db");
    let plain = path.to_str().expect("utf-8 path");
    let s = poimen_store::open_store(plain).await.expect("plain path");
    let v = publish(&*s, "a.flow", "1", None).await;
    drop(s);
    let s = poimen_store::open_store(&format!("sqlite://{plain}"))
        .await
        .expect("sqlite://");
    assert_eq!(s.version(&v.version).await.expect("read"), Some(v));
    assert!(format!("{s:?}").contains("SqliteStore"), "{s:?}");

    let err = poimen_store::open_store("mysql://root:pw@localhost/poimen")
        .await
        .expect_err("mysql");
    assert!(
        matches!(&err, StoreError::UnsupportedUrl { scheme, .. } if scheme == "mysql"),
        "{err:?}"
    );
    assert!(!err.to_string().contains(":pw@"), "{err}");

    #[cfg(feature = "postgres")]
    {
        let db = pg::TestDb::create().await;
        let s = poimen_store::open_store(&db.url)
            .await
            .expect("postgres://");
        assert!(format!("{s:?}").contains("PostgresStore"), "{s:?}");
        let v = publish(&*s, "a.flow", "1", None).await;
        drop(s);
        let alias = db.url.replacen("postgres://", "postgresql://", 1);
        let s = poimen_store::open_store(&alias)
            .await
            .expect("postgresql://");
        assert_eq!(s.version(&v.version).await.expect("read"), Some(v));
    }
}
