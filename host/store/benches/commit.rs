//! What a durable write costs: a `Sync` commit, a `Buffered` commit, the
//! three intent commits of one durable tool step, and — in the same run, on
//! the same disk — a raw 4 KiB append + fsync, the unit the others are
//! measured against. The in-memory store is the floor; the runtime hop is
//! what leaving tokio for its blocking pool and back costs by itself.
//!
//! `cargo bench -p poimen-store --bench commit`. Files live under Cargo's per-target temporary
//! directory (`CARGO_TARGET_TMPDIR`), i.e. on the disk of the target dir,
//! not on a tmpfs `/tmp`, where fsync would be free.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use poimen_store::{
    Commit, Durability, IntentPhase, IntentRecord, MemoryStore, NewEvent, NewRun, NewVersion,
    RunId, SqliteStore, Store, Ulid,
};
use poimen_workflow::{EffectClass, StepId, WorkflowId};
use serde_json::json;

fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

/// A store with one run, and a counter for the run's next event.
struct Target {
    store: Arc<dyn Store>,
    run: RunId,
    next: u64,
}

impl Target {
    async fn new(store: Arc<dyn Store>) -> Self {
        let v = store
            .publish_version(NewVersion::of(
                WorkflowId::from("bench.flow"),
                br#"{"id":"bench.flow"}"#.to_vec(),
                None,
                0,
            ))
            .await
            .expect("publish")
            .record()
            .clone();
        let run = RunId::generate(Ulid::from_parts(1, 1));
        store
            .create_run(NewRun {
                id: run.clone(),
                version: v.version,
                input: b"{}".to_vec(),
                tenant: poimen_store::DEFAULT_TENANT.to_owned(),
                idempotency_key: None,
                parent: None,
                lease: None,
                admission: None,
                created_at: 0,
            })
            .await
            .expect("run");
        Target {
            store,
            run,
            next: 0,
        }
    }

    /// One event and one intent record: what the executor writes per phase.
    fn commit(&mut self, phase: IntentPhase, iteration: u32, durability: Durability) -> Commit {
        let seq = self.next;
        self.next += 1;
        Commit {
            events: vec![NewEvent {
                seq,
                at: seq as i64,
                kind: "tool_call".into(),
                body: json!({"step": "fetch", "phase": phase.as_str(), "seq": seq}).into(),
            }],
            intents: vec![IntentRecord {
                run: self.run.clone(),
                step: StepId::from("fetch"),
                iteration,
                attempt: 1,
                phase,
                tool: "ledger".into(),
                tool_version: "0.1.0".into(),
                digest: "sha256:0123456789abcdef".into(),
                effect: EffectClass::Idempotent,
                args_hash: "b3:args".into(),
                idempotency_key: format!("ik-{iteration}"),
                output_hash: None,
                error: None,
                record: None,
                at: seq as i64,
            }],
            durability,
            ..Commit::new(self.run.clone())
        }
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = bench_dir();
    let sqlite: Arc<dyn Store> = Arc::new(
        rt.block_on(SqliteStore::open(dir.join("poimen.db")))
            .expect("open"),
    );
    let mut disk = rt.block_on(Target::new(sqlite));
    let mut mem = rt.block_on(Target::new(Arc::new(MemoryStore::new())));

    let mut g = c.benchmark_group("store");
    g.sample_size(40).measurement_time(Duration::from_secs(6));

    // The reference: append one 4 KiB page (a WAL frame's size) and fsync.
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("raw.bin"))
        .expect("raw file");
    let page = [0x5au8; 4096];
    g.bench_function("raw_append_4k_fsync", |b| {
        b.iter(|| {
            file.write_all(black_box(&page)).expect("write");
            file.sync_all().expect("fsync");
        })
    });

    // Each iteration is a fresh (iteration, attempt) with a lone Pending,
    // so the intent protocol is respected however many iterations run.
    let mut k = 0u32;
    g.bench_function("commit_sync", |b| {
        b.iter(|| {
            k += 1;
            let c = disk.commit(IntentPhase::Pending, k, Durability::Sync);
            rt.block_on(disk.store.commit(black_box(c)))
                .expect("commit")
        })
    });
    g.bench_function("commit_buffered", |b| {
        b.iter(|| {
            k += 1;
            let c = disk.commit(IntentPhase::Pending, k, Durability::Buffered);
            rt.block_on(disk.store.commit(black_box(c)))
                .expect("commit")
        })
    });
    // The executor's pattern for one durable tool step: Pending buffered
    // (losing it loses nothing), Dispatched and Committed synced.
    g.bench_function("tool_step_three_intents", |b| {
        b.iter(|| {
            k += 1;
            for (phase, d) in [
                (IntentPhase::Pending, Durability::Buffered),
                (IntentPhase::Dispatched, Durability::Sync),
                (IntentPhase::Committed, Durability::Sync),
            ] {
                let c = disk.commit(phase, k, d);
                rt.block_on(disk.store.commit(black_box(c)))
                    .expect("commit");
            }
        })
    });
    g.bench_function("commit_memory", |b| {
        b.iter(|| {
            k += 1;
            let c = mem.commit(IntentPhase::Pending, k, Durability::Sync);
            rt.block_on(mem.store.commit(black_box(c))).expect("commit")
        })
    });

    // What every store call pays to leave the async runtime and come back
    // (the bench drives it from outside the runtime, as a client thread would).
    g.bench_function("runtime_hop_spawn_blocking", |b| {
        b.iter(|| {
            rt.block_on(async { tokio::task::spawn_blocking(|| black_box(1)).await })
                .expect("join")
        })
    });

    g.finish();
}

criterion_group!(store_benches, benches);
criterion_main!(store_benches);
