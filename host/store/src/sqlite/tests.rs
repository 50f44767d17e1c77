//! Group commit, tested where the queue can be watched: commits that queue
//! behind a busy writer share one transaction; a refused commit is refused
//! alone; a batch that fails as a whole leaves each caller the answer of
//! its own commit, and the store holds exactly the commits answered `Ok`.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use poimen_workflow::WorkflowId;
use serde_json::json;

use super::{SqliteOptions, SqliteStore};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::records::{Commit, DEFAULT_TENANT, Durability, NewEvent, NewRun, NewVersion};
use crate::store::{Store, StoreResult};

const T0: i64 = 1_700_000_000_000;

async fn runs(store: &SqliteStore, n: u128) -> Vec<RunId> {
    let canonical = br#"{"id":"demo.group","steps":[{"id":"a","tool":{"name":"echo"}}]}"#;
    let v = store
        .publish_version(NewVersion::of(
            WorkflowId::from("demo.group"),
            canonical.to_vec(),
            None,
            T0,
        ))
        .await
        .expect("publish")
        .record()
        .version;
    let mut ids = Vec::new();
    for k in 0..n {
        let id = RunId::generate(ulid::Ulid::from_parts(T0 as u64, k + 1));
        store
            .create_run(NewRun {
                id: id.clone(),
                version: v,
                input: b"{}".to_vec(),
                tenant: DEFAULT_TENANT.to_owned(),
                idempotency_key: None,
                parent: None,
                lease: None,
                admission: None,
                created_at: T0,
            })
            .await
            .expect("create run");
        ids.push(id);
    }
    ids
}

/// A commit of `run`'s event `seq`, carrying `blob`.
fn commit(run: &RunId, seq: u64, blob: Vec<u8>, durability: Durability) -> Commit {
    let mut c = Commit::new(run.clone());
    c.events.push(NewEvent {
        seq,
        at: T0,
        kind: "test_event".into(),
        body: json!({"seq": seq}).into(),
    });
    if !blob.is_empty() {
        c.blobs.push(blob);
    }
    c.durability = durability;
    c
}

/// Holds the store's writer connection on another thread until told to
/// let go: commits started meanwhile queue behind the first one.
fn hold_writer(store: &SqliteStore) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let inner = Arc::clone(&store.inner);
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let _w = inner.writer.lock().expect("writer lock");
        held_tx.send(()).expect("held");
        let _ = release_rx.recv();
    });
    held_rx.recv().expect("the writer is held");
    (release_tx, t)
}

async fn queued(store: &SqliteStore, n: usize) {
    for _ in 0..2000 {
        if store.inner.queue().items.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{n} commits never queued");
}

/// Starts `commits` concurrently while the writer is held, waits until all
/// but the first (which leads, and waits for the writer) are queued, lets
/// the writer go, and returns each commit's answer in order.
async fn race(store: &Arc<SqliteStore>, commits: Vec<Commit>) -> Vec<StoreResult<()>> {
    let (release, holder) = hold_writer(store);
    let n = commits.len();
    let mut tasks = Vec::new();
    for (k, c) in commits.into_iter().enumerate() {
        let s = Arc::clone(store);
        tasks.push(tokio::spawn(async move { s.commit(c).await }));
        if k == 0 {
            // The leader has taken its own commit before the others queue.
            for _ in 0..2000 {
                if store.inner.queue().leading && store.inner.queue().items.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    queued(store, n - 1).await;
    release.send(()).expect("release");
    holder.join().expect("holder");
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_commits_share_one_transaction_and_a_refused_one_is_refused_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(
        SqliteStore::open(dir.path().join("s.db"))
            .await
            .expect("open"),
    );
    let ids = runs(&store, 10).await;
    let before = store.writer_stats();
    // Run 5's commit skips a sequence number: refused. Run 7's is buffered.
    let commits = ids
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let seq = if k == 5 { 3 } else { 0 };
            let d = if k == 7 {
                Durability::Buffered
            } else {
                Durability::Sync
            };
            commit(id, seq, Vec::new(), d)
        })
        .collect();
    let answers = race(&store, commits).await;
    for (k, a) in answers.iter().enumerate() {
        if k == 5 {
            assert!(
                matches!(a, Err(StoreError::SequenceConflict { .. })),
                "run 5: {a:?}"
            );
        } else {
            assert!(a.is_ok(), "run {k}: {a:?}");
        }
    }
    let after = store.writer_stats();
    assert_eq!(after.commits - before.commits, 10);
    // The leader's own commit alone, then the nine that queued behind it.
    assert_eq!(after.transactions - before.transactions, 2);
    for (k, id) in ids.iter().enumerate() {
        let events = store.events(id).await.expect("events");
        assert_eq!(events.len(), usize::from(k != 5), "run {k}");
    }
    // The batch's writes are what a later commit builds on.
    store
        .commit(commit(&ids[0], 1, Vec::new(), Durability::Sync))
        .await
        .expect("next commit of run 0");
    store
        .commit(commit(&ids[5], 0, Vec::new(), Durability::Sync))
        .await
        .expect("run 5 starts at 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_as_a_whole_answers_each_commit_for_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let ids = runs(&store, 8).await;
    let used: i64 = {
        let c = store.inner.writer.lock().expect("writer");
        c.conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .expect("page count")
    };
    drop(store);
    // Room for about three of the eight 200 KiB blobs: the batch of seven
    // cannot fit, some of them alone can.
    let store = Arc::new(
        SqliteStore::open_with(
            &path,
            SqliteOptions {
                max_page_count: Some(used.unsigned_abs() + 160),
                ..SqliteOptions::default()
            },
        )
        .await
        .expect("reopen"),
    );
    let commits = ids
        .iter()
        .enumerate()
        .map(|(k, id)| commit(id, 0, vec![k as u8 + 1; 200 * 1024], Durability::Sync))
        .collect();
    let answers = race(&store, commits).await;
    // The leader's commit alone; then the batch of seven, which failed as
    // a whole (SQLite undid the transaction on the full file) and was
    // written again one commit per transaction: seven transactions (the
    // undone one is not counted).
    assert_eq!(
        store.writer_stats(),
        super::WriterStats {
            commits: 8,
            transactions: 1 + 7,
        }
    );
    let mut stored = 0;
    for (k, (a, id)) in answers.iter().zip(&ids).enumerate() {
        let events = store.events(id).await.expect("events");
        match a {
            Ok(()) => {
                assert_eq!(events.len(), 1, "run {k} answered Ok");
                stored += 1;
            }
            Err(StoreError::Full { .. }) => assert!(events.is_empty(), "run {k} refused"),
            Err(e) => panic!("run {k}: {e:?}"),
        }
    }
    assert!(
        (1..8).contains(&stored),
        "{stored} of 8 stored: the cap should let some and not all in"
    );
    // The store is still usable: a small commit fits.
    let refused = answers
        .iter()
        .position(Result::is_err)
        .expect("one refused");
    store
        .commit(commit(&ids[refused], 0, Vec::new(), Durability::Sync))
        .await
        .expect("a small commit after the full ones");
}

/// The runtime shuts down while commits wait for the writer: the queue the
/// leader would hand over is never written, and the store does not stay
/// "led" by nobody — a commit from another runtime afterwards is written.
#[test]
fn a_queue_dropped_at_runtime_shutdown_leaves_the_store_writable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store = Arc::new(
        first
            .block_on(SqliteStore::open(dir.path().join("s.db")))
            .expect("open"),
    );
    let ids = first.block_on(runs(&store, 3));
    let (release, holder) = hold_writer(&store);
    for (k, id) in ids.iter().enumerate() {
        let (s, c) = (
            Arc::clone(&store),
            commit(id, 0, Vec::new(), Durability::Sync),
        );
        first.spawn(async move { s.commit(c).await });
        // The first leads and waits for the writer; the others queue.
        for _ in 0..2000 {
            let q = store.inner.queue();
            if q.leading && q.items.len() == k {
                break;
            }
            drop(q);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(store.inner.queue().items.len(), 2, "two commits queued");
    first.shutdown_background();
    release.send(()).expect("release");
    holder.join().expect("holder");
    // The leader writes its own commit, then cannot hand the queue over.
    for _ in 0..5000 {
        if !store.inner.queue().leading {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!store.inner.queue().leading, "nobody leads any more");
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    second.block_on(async {
        let next = store.commit(commit(&ids[1], 0, Vec::new(), Durability::Sync));
        tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the commit is written, not left waiting")
            .expect("commit");
        assert_eq!(store.events(&ids[0]).await.expect("events").len(), 1);
        assert_eq!(store.events(&ids[1]).await.expect("events").len(), 1);
        assert!(store.events(&ids[2]).await.expect("events").is_empty());
    });
}

/// The WAL's size in bytes.
fn wal_len(path: &std::path::Path) -> u64 {
    let mut p = path.as_os_str().to_owned();
    p.push("-wal");
    std::fs::metadata(std::path::PathBuf::from(p)).map_or(0, |m| m.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_by_the_background_thread_and_stays_bounded() {
    const PAGES: u32 = 16;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.db");
    let store = SqliteStore::open_with(
        &path,
        SqliteOptions {
            checkpoint_pages: PAGES,
            ..SqliteOptions::default()
        },
    )
    .await
    .expect("open");
    let ids = runs(&store, 1).await;
    // 300 commits of an event and a 6 KiB blob: ~1800 frames, over 100
    // times the threshold.
    for seq in 0..300u64 {
        let blob = seq.to_le_bytes().repeat(768);
        store
            .commit(commit(&ids[0], seq, blob, Durability::Sync))
            .await
            .expect("commit");
    }
    let stats = store.checkpoint_stats();
    assert!(
        stats.checkpoints > 0,
        "nothing checkpointed the WAL: {stats:?}"
    );
    assert_eq!(stats.failures, 0, "{stats:?}");
    // The WAL restarts after each whole checkpoint: the file (never
    // shortened) is a fraction of the ~1800 frames the commits wrote
    // (6 each, a frame being a 4 KiB page and a 24-byte header). How far
    // past the threshold it got depends on when the thread was scheduled.
    let frame = 4096 + 24;
    let bound = 32 + frame * 450;
    assert!(
        wal_len(&path) <= bound,
        "the WAL grew to {} bytes (bound {bound}): {stats:?}",
        wal_len(&path)
    );
    assert_eq!(stats.partial, 0, "{stats:?}");
    // Nothing was lost to a checkpoint: every event is there, after a
    // reopen too.
    assert_eq!(store.events(&ids[0]).await.expect("events").len(), 300);
    drop(store);
    let store = SqliteStore::open(&path).await.expect("reopen");
    assert_eq!(store.events(&ids[0]).await.expect("events").len(), 300);
    store.sync().await.expect("sync");
}
