//! Many hosts, one store: `poimen serve` processes sharing a PostgreSQL
//! database (and one SQLite file), runs enqueued with `poimen start` (and,
//! for volume, through the library), hosts killed with SIGKILL, frozen with
//! SIGSTOP past their lease, and cut off from the server. Every run must end
//! completed — or blocked `outcome_unknown` where a non-idempotent call was
//! dispatched by a host that died — each committed effect must be in the
//! ledger exactly once, every episode must refold, and no run may be lost.
//!
//! The PostgreSQL tests run on a throwaway server this test binary starts
//! (`poimen-test-pg`), or on the one `POIMEN_TEST_PG` names. Each test
//! creates a database of its own and drops it. Without the server binaries
//! they fail, naming the package to install.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use poimen::store::{RunFilter, RunRecord, RunStatus, Store};
use serde_json::{Value, json};

use crate::support::{Env, Served};

const POLICY: &str = r#"
[plugins.ledger]
fs-write = { "/ledger" = "./ledger" }

[plugins.ledger-idempotent]
fs-write = { "/ledger" = "./ledger" }

# The spinning guest runs until cancelled: neither fuel nor its call's
# time limit stops it first.
[plugins.adv-spin]
limits = { fuel = 1000000000000000, timeout-ms = 600000 }
"#;

/// A pure step, a fan-out with an idempotent effect in one branch, a
/// non-idempotent effect, then a chain of pure steps (so runs are in flight
/// long enough to be interrupted).
fn workflow(charge: bool) -> String {
    let mut wf = String::from(
        r#"
id: t.hosts
steps:
  - id: pure
    tool: {name: "text@^0.1", args: {op: count, pattern: a, text: "{{ inputs.text }}"}}
  - id: fan
    parallel: {branches: [left, right], join: all}
  - id: left
    tool: {name: "text@^0.1", args: {op: count, pattern: b, text: "{{ inputs.text }}"}}
  - id: right
    tool: {name: "ledger-idempotent@^0.1", args: {file: idem.jsonl, entry: {n: "{{ inputs.n }}"}}}
"#,
    );
    if charge {
        wf.push_str(
            r#"  - id: charge
    tool: {name: "ledger@^0.1", args: {file: charge.jsonl, entry: {n: "{{ inputs.n }}"}}}
"#,
        );
    }
    for i in 0..6 {
        wf.push_str(&format!(
            "  - id: t{i}\n    tool: {{name: \"text@^0.1\", args: {{op: count, pattern: c, text: \"{{{{ inputs.text }}}}\"}}}}\n"
        ));
    }
    wf.push_str("transitions:\n  - {from: pure, to: fan}\n");
    let mut prev = "fan".to_owned();
    if charge {
        wf.push_str("  - {from: fan, to: charge}\n");
        prev = "charge".to_owned();
    }
    for i in 0..6 {
        wf.push_str(&format!("  - {{from: {prev}, to: t{i}}}\n"));
        prev = format!("t{i}");
    }
    wf
}

// ------------------------------------------------------------- PostgreSQL

/// The server the tests use.
fn pg_base() -> String {
    poimen_test_pg::url()
}

fn with_dbname(url: &str, name: &str) -> String {
    poimen_test_pg::with_dbname(url, name)
}

async fn pg_connect(url: &str) -> tokio_postgres::Client {
    match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
        }
        Err(e) => panic!(
            "PostgreSQL is not reachable at {} ({e}): the tests start a throwaway server of \
             their own unless POIMEN_TEST_PG names one",
            poimen::store::redact_url(url)
        ),
    }
}

/// A database of this test's own, dropped at the end.
struct PgDb {
    name: String,
    url: String,
}

impl PgDb {
    async fn create(tag: &str) -> PgDb {
        let name = format!("poimen_e2e_{tag}_{}", std::process::id());
        let admin = pg_connect(&pg_base()).await;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .expect("drop a leftover database");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        PgDb {
            url: with_dbname(&pg_base(), &name),
            name,
        }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok((c, conn)) =
                    tokio_postgres::connect(&pg_base(), tokio_postgres::NoTls).await
                {
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    let _ = c
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

// ------------------------------------------------------------------ hosts

fn serve(env: &Env, store: &str, id: &str, ttl: &str) -> Served {
    serve_with(env, store, id, ttl, "5s")
}

fn serve_with(env: &Env, store: &str, id: &str, ttl: &str, grace: &str) -> Served {
    let log = env.path().join(format!("{id}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = env
        .std_cmd()
        .args(["--store", store, "--policy", "policy.toml", "serve"])
        .args(["--host-id", id, "--lease-ttl", ttl, "--poll", "20ms"])
        .args(["--workers", "4", "--grace", grace])
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn poimen serve");
    Served {
        id: id.to_owned(),
        child,
        log,
    }
}

fn setup(env: &Env, charge: bool) -> PathBuf {
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    env.write("policy.toml", POLICY);
    env.write("wf.yaml", &workflow(charge))
}

/// `poimen start WF --input INPUT` on `store`: the new run's id.
fn poimen_start(env: &Env, store: &str, wf: &Path, input: &Value) -> String {
    let out = env
        .cmd()
        .args(["--store", store, "--policy", "policy.toml", "start"])
        .arg(wf)
        .args(["--input", &input.to_string()])
        .output()
        .expect("poimen start");
    assert!(
        out.status.success(),
        "poimen start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(id.starts_with("WFR-"), "{id}");
    id
}

/// Enqueues `n` runs (inputs `n = 0..n`): the first two with `poimen
/// start`, the rest through the library (faster than a process each).
/// Returns run id → n.
async fn enqueue(env: &Env, store: &str, wf: &Path, n: u32) -> BTreeMap<String, u32> {
    let mut runs = BTreeMap::new();
    for i in 0..n.min(2) {
        let id = poimen_start(env, store, wf, &json!({"text": "abc", "n": i}));
        runs.insert(id, i);
    }
    let host = poimen::Host::builder()
        .store_url(store)
        .policy_file(env.path().join("policy.toml"))
        .cache_dir(crate::support::shared_cache())
        .build()
        .await
        .expect("library host");
    let target = poimen::Target::File(wf.to_path_buf());
    for i in n.min(2)..n {
        let id = host
            .enqueue(
                &target,
                json!({"text": "abc", "n": i}),
                poimen::RunOptions::default(),
            )
            .await
            .expect("enqueue");
        runs.insert(id.to_string(), i);
    }
    runs
}

async fn all_runs(store: &dyn Store) -> Vec<RunRecord> {
    store
        .list_runs(RunFilter {
            limit: Some(100_000),
            ..RunFilter::default()
        })
        .await
        .expect("list runs")
}

fn settled(r: &RunRecord) -> bool {
    !matches!(r.status, RunStatus::Queued | RunStatus::Running)
}

/// Waits until every run is settled (not queued, not running).
async fn wait_settled(store: &dyn Store, n: usize, within: Duration, hosts: &[&Served]) {
    let start = Instant::now();
    loop {
        let runs = all_runs(store).await;
        if runs.len() == n && runs.iter().all(settled) {
            return;
        }
        if start.elapsed() > within {
            let open: Vec<String> = runs
                .iter()
                .filter(|r| !settled(r))
                .map(|r| format!("{} {} {:?}", r.id, r.status, r.lease))
                .collect();
            let logs: Vec<String> = hosts
                .iter()
                .map(|h| format!("--- {}:\n{}", h.id, h.log()))
                .collect();
            panic!(
                "{} of {n} runs still open after {within:?}: {open:?}\n{}",
                open.len(),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until at least `count` runs are settled.
async fn wait_some_settled(store: &dyn Store, count: usize) {
    let start = Instant::now();
    loop {
        if all_runs(store).await.iter().filter(|r| settled(r)).count() >= count {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "fewer than {count} runs ended in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many lines of a ledger file carry each `n`.
fn ledger(env: &Env, file: &str) -> BTreeMap<u32, usize> {
    let text = std::fs::read_to_string(env.path().join("ledger").join(file)).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_str(line).expect("a ledger line is JSON");
        let n: u32 = v["entry"]["n"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| v["entry"]["n"].as_u64().map(|n| n as u32))
            .expect("entry.n");
        *counts.entry(n).or_default() += 1;
    }
    counts
}

/// Every run ended completed, or blocked `outcome_unknown`; each effect of
/// a completed run is in its ledger once (a blocked run's at most once);
/// every episode refolds to the stored status. Returns how many runs were
/// taken over (their episode records a resumption).
async fn check_outcomes(
    env: &Env,
    store: &dyn Store,
    runs: &BTreeMap<String, u32>,
    charge: bool,
    dead: &[&str],
) -> usize {
    let idem = ledger(env, "idem.jsonl");
    let charged = ledger(env, "charge.jsonl");
    let stored = all_runs(store).await;
    assert_eq!(stored.len(), runs.len(), "no run is lost, none is added");
    let mut resumed = 0;
    for rec in &stored {
        let n = runs[rec.id.as_str()];
        let events = store.events(&rec.id).await.expect("events");
        let episode = poimen::executor::Episode::from_stored(rec.id.as_str(), &events)
            .expect("the episode decodes");
        let state = poimen::executor::refold(&episode).expect("the episode refolds");
        assert_eq!(
            state.status,
            Some(rec.status),
            "run {}: refold vs record",
            rec.id
        );
        if events.iter().any(|e| e.kind == "run_resumed") {
            resumed += 1;
        }
        // Hosts release what they drove; only a host killed (or cut off)
        // between a run's last commit and its release leaves a lease behind.
        // A live host releases just after the run's last commit: give it a
        // moment.
        let mut rec = rec.clone();
        let since = Instant::now();
        while rec
            .lease
            .as_ref()
            .is_some_and(|l| !dead.contains(&l.owner.as_str()))
            && since.elapsed() < Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            rec = store.run(&rec.id).await.expect("run").expect("stored");
        }
        assert!(
            rec.lease
                .as_ref()
                .is_none_or(|l| dead.contains(&l.owner.as_str())),
            "run {} is still held: {:?}",
            rec.id,
            rec.lease
        );
        match rec.status {
            RunStatus::Completed => {
                assert_eq!(
                    idem.get(&n),
                    Some(&1),
                    "run {} (n={n}): idempotent effect",
                    rec.id
                );
                if charge {
                    assert_eq!(charged.get(&n), Some(&1), "run {} (n={n}): charge", rec.id);
                }
            }
            RunStatus::Blocked => {
                let reason = rec.reason.clone().unwrap_or_default();
                assert!(
                    reason.contains("outcome_unknown"),
                    "run {}: {reason}",
                    rec.id
                );
                assert!(
                    charged.get(&n).copied().unwrap_or(0) <= 1,
                    "n={n} charged twice"
                );
                assert!(idem.get(&n).copied().unwrap_or(0) <= 1, "n={n} idem twice");
            }
            other => panic!("run {} ended {other}: {:?}", rec.id, rec.reason),
        }
    }
    resumed
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_on_postgres_one_killed_every_run_ends_and_effects_happen_once() {
    let db = PgDb::create("kill").await;
    let env = Env::new();
    let wf = setup(&env, true);
    let runs = enqueue(&env, &db.url, &wf, 300).await;
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    let a = serve(&env, &db.url, "host-a", "1s");
    let b = serve(&env, &db.url, "host-b", "1s");
    let c = serve(&env, &db.url, "host-c", "1s");
    wait_some_settled(&*store, 100).await;
    // SIGKILL a host mid-way, while a step of a run it drives is in
    // flight: freeze it (SIGSTOP) so what it holds stays put while it is
    // read, thaw it and try again if no step of its runs is in flight.
    let mut tries = 0;
    let (held, started) = loop {
        a.signal("-STOP");
        // A commit already on the wire lands; nothing after it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let held: Vec<RunRecord> = all_runs(&*store)
            .await
            .into_iter()
            .filter(|r| !settled(r) && r.lease.as_ref().is_some_and(|l| l.owner == "host-a"))
            .collect();
        // The runs it holds with a step in flight: a takeover resumes
        // those mid-step (and says so in the episode).
        let mut started = BTreeSet::new();
        for r in &held {
            let events = store.events(&r.id).await.expect("events");
            let episode = poimen::executor::Episode::from_stored(r.id.as_str(), &events)
                .expect("the episode decodes");
            let state = poimen::executor::refold(&episode).expect("the episode refolds");
            if state.steps.values().any(|s| {
                matches!(
                    s.status,
                    poimen::executor::StepStatus::Running | poimen::executor::StepStatus::Waiting
                )
            }) {
                started.insert(r.id.clone());
            }
        }
        if !started.is_empty() {
            break (held, started);
        }
        tries += 1;
        assert!(tries < 100, "host-a never held a run with a step in flight");
        a.signal("-CONT");
        tokio::time::sleep(Duration::from_millis(30)).await;
    };
    let mut a = a;
    a.child.kill().expect("kill host-a");
    let _ = a.child.wait();
    let killed = Instant::now();
    // Its runs are taken over within lease expiry (1 s) + one heartbeat
    // (1/3 s) — with slack for polls and a loaded 2-core machine.
    loop {
        let mut still = 0;
        for r in &held {
            let rec = store.run(&r.id).await.expect("run").expect("stored");
            if !settled(&rec) && rec.lease.as_ref().is_some_and(|l| l.owner == "host-a") {
                still += 1;
            }
        }
        if still == 0 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(4),
            "{still} of host-a's runs not taken over {:?} after the kill",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let taken_over = killed.elapsed();
    // Lease expiry (1 s) + one heartbeat (1/3 s) + polls and the work left.
    wait_settled(&*store, runs.len(), Duration::from_secs(180), &[&b, &c]).await;
    let took = killed.elapsed();
    let resumed = check_outcomes(&env, &*store, &runs, true, &["host-a"]).await;
    let blocked = all_runs(&*store)
        .await
        .iter()
        .filter(|r| r.status == RunStatus::Blocked)
        .count();
    eprintln!(
        "host-a held {} runs ({} mid-step) when killed; taken over after {taken_over:?}; {resumed} runs resumed, {blocked} blocked; settled {took:?} after the kill",
        held.len(),
        started.len()
    );
    assert!(!held.is_empty(), "host-a held runs when it was killed");
    for r in &held {
        let rec = store.run(&r.id).await.expect("run").expect("stored");
        assert!(
            settled(&rec),
            "host-a's run {} was taken over and settled",
            r.id
        );
    }
    // Every run host-a had mid-step was taken over and resumed; what it had
    // claimed and not started, or held between steps, another host carried
    // on.
    for id in &started {
        let events = store.events(id).await.expect("events");
        assert!(
            events.iter().any(|e| e.kind == "run_resumed"),
            "host-a's run {id}, mid-step when it was killed, was resumed by another host"
        );
    }
    assert!(resumed >= started.len(), "{resumed} < {}", started.len());
    assert!(took < Duration::from_secs(180), "took {took:?}");
    drop((b, c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_host_past_its_lease_is_fenced_out_and_duplicates_nothing() {
    let db = PgDb::create("zombie").await;
    let env = Env::new();
    let wf = setup(&env, true);
    let runs = enqueue(&env, &db.url, &wf, 24).await;
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    let a = serve(&env, &db.url, "zombie", "1s");
    // Wait until the zombie-to-be holds runs in flight, then freeze it.
    let start = Instant::now();
    loop {
        let runs_now = all_runs(&*store).await;
        if runs_now.iter().any(|r| {
            r.status == RunStatus::Running && r.lease.as_ref().is_some_and(|l| l.owner == "zombie")
        }) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "host never claimed a run"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.signal("-STOP");
    let frozen: Vec<RunRecord> = all_runs(&*store)
        .await
        .into_iter()
        .filter(|r| r.lease.as_ref().is_some_and(|l| l.owner == "zombie") && !settled(r))
        .collect();
    assert!(!frozen.is_empty());
    // Past its lease, another host takes its runs over and finishes them all.
    let b = serve(&env, &db.url, "taker", "1s");
    wait_settled(&*store, runs.len(), Duration::from_secs(60), &[&b]).await;
    // The zombie wakes up: its next write is refused and it lets go.
    a.signal("-CONT");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let resumed = check_outcomes(&env, &*store, &runs, true, &[]).await;
    eprintln!(
        "zombie held {} runs when frozen; {resumed} resumed; its log:\n{}",
        frozen.len(),
        a.log()
    );
    // (Whether the taker records a resumption depends on whether a step was
    // in flight when the host froze; the fence below is what must hold.)
    for r in &frozen {
        let rec = store.run(&r.id).await.expect("run").expect("stored");
        assert!(settled(&rec), "{} settled", r.id);
    }
    // Nothing the zombie wrote after waking landed: every episode is still
    // the one the taker finished (check_outcomes refolded each), and the
    // zombie says it lost its leases.
    let log = a.log();
    assert!(log.contains("lost its lease"), "the zombie's log: {log}");
    a.signal("-TERM");
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_connections_are_terminated_reconnects_and_loses_nothing() {
    let db = PgDb::create("conn").await;
    let env = Env::new();
    let wf = setup(&env, false);
    let runs = enqueue(&env, &db.url, &wf, 40).await;
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    let a = serve(&env, &db.url, "host-a", "2s");
    wait_some_settled(&*store, 5).await;
    let admin = pg_connect(&pg_base()).await;
    for _ in 0..3 {
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid() AND application_name <> 'psql'",
                &[&db.name],
            )
            .await
            .expect("terminate backends");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // The test's own store lost its connections too: a fresh one.
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    wait_settled(&*store, runs.len(), Duration::from_secs(60), &[&a]).await;
    // A release cut off with its connection leaves the lease of a run
    // that ended (harmless: it expires, and an ended run is never claimed).
    check_outcomes(&env, &*store, &runs, false, &["host-a"]).await;
    for r in all_runs(&*store).await {
        assert_eq!(r.status, RunStatus::Completed, "{}: {:?}", r.id, r.reason);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_one_sqlite_file_never_drive_a_run_twice() {
    let env = Env::new();
    let wf = setup(&env, true);
    let file = env.path().join("shared.db");
    let url = file.to_str().expect("utf8").to_owned();
    let runs = enqueue(&env, &url, &wf, 30).await;
    let store: Arc<dyn Store> = poimen::store::open_store(&url).await.expect("store");
    let a = serve(&env, &url, "sq-a", "1s");
    let b = serve(&env, &url, "sq-b", "1s");
    wait_some_settled(&*store, 8).await;
    let mut a = a;
    a.child.kill().expect("kill sq-a");
    let _ = a.child.wait();
    wait_settled(&*store, runs.len(), Duration::from_secs(60), &[&b]).await;
    check_outcomes(&env, &*store, &runs, true, &["sq-a"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_host_which_hands_back_what_it_holds() {
    let db = PgDb::create("term").await;
    let env = Env::new();
    let wf = setup(&env, false);
    let runs = enqueue(&env, &db.url, &wf, 40).await;
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    // A long lease: were the runs not handed back, no other host could take
    // them for 60 s. No grace: what is in flight is stopped and handed back.
    let mut a = serve_with(&env, &db.url, "term-a", "60s", "0s");
    wait_some_settled(&*store, 5).await;
    a.signal("-TERM");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = a.child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "serve did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "serve exits 0 on SIGTERM: {}", a.log());
    assert!(a.log().contains("handed back"), "{}", a.log());
    let held: Vec<RunRecord> = all_runs(&*store)
        .await
        .into_iter()
        .filter(|r| !settled(r) && r.lease.is_some())
        .collect();
    assert!(held.is_empty(), "still held after SIGTERM: {held:?}");
    // Another host finishes the rest at once — well inside the 60 s lease.
    let b = serve_with(&env, &db.url, "term-b", "60s", "5s");
    wait_settled(&*store, runs.len(), Duration::from_secs(30), &[&b]).await;
    check_outcomes(&env, &*store, &runs, false, &[]).await;
    for r in all_runs(&*store).await {
        assert_eq!(r.status, RunStatus::Completed, "{}: {:?}", r.id, r.reason);
    }
}

/// A chain of pure steps, at most two runs at a time per account.
const ADMITTED: &str = r#"
id: t.admitted
key: "{{ inputs.account }}"
concurrency: {max_runs: 2, scope: key, on_overflow: queue}
steps:
  - id: s0
    tool: {name: "text@^0.1", args: {op: count, pattern: a, text: "{{ inputs.account }}"}}
  - id: s1
    tool: {name: "text@^0.1", args: {op: count, pattern: b, text: "{{ inputs.account }}"}}
  - id: s2
    tool: {name: "text@^0.1", args: {op: count, pattern: c, text: "{{ inputs.account }}"}}
  - id: s3
    tool: {name: "text@^0.1", args: {op: count, pattern: d, text: "{{ inputs.account }}"}}
  - id: s4
    tool: {name: "text@^0.1", args: {op: count, pattern: e, text: "{{ inputs.account }}"}}
  - id: s5
    tool: {name: "text@^0.1", args: {op: count, pattern: f, text: "{{ inputs.account }}"}}
transitions:
  - {from: s0, to: s1}
  - {from: s1, to: s2}
  - {from: s2, to: s3}
  - {from: s3, to: s4}
  - {from: s4, to: s5}
"#;

/// When a run was driven: from its first event after the start recorded at
/// enqueue to its last.
async fn driven_span(store: &dyn Store, run: &RunRecord) -> (i64, i64) {
    let events = store.events(&run.id).await.expect("events");
    let first = events
        .iter()
        .find(|e| e.kind != "run_started")
        .expect("the run was driven");
    let last = events.last().expect("events");
    assert_eq!(last.kind, "run_completed", "run {}", run.id);
    (first.at, last.at)
}

/// The most spans open at one instant (a span that ends at the instant
/// another begins is not open with it).
fn most_at_once(spans: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for &(start, end) in spans {
        edges.push((start, 1));
        edges.push((end, -1));
    }
    // Ends before starts at the same instant.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_across_three_hosts_is_exact_per_key_and_no_key_waits_behind_another() {
    let db = PgDb::create("admit").await;
    let env = Env::new();
    setup(&env, false);
    let wf = env.write("admitted.yaml", ADMITTED);
    // 60 starts on one key, then 60 on another: all queued before any host
    // serves, the first key's all older than the second's.
    let host = poimen::Host::builder()
        .store_url(&db.url)
        .cache_dir(crate::support::shared_cache())
        .build()
        .await
        .expect("library host");
    let target = poimen::Target::File(wf.clone());
    let mut keys: BTreeMap<String, &str> = BTreeMap::new();
    for account in ["acme", "bolt"] {
        for _ in 0..60 {
            let id = host
                .enqueue(
                    &target,
                    json!({"account": account}),
                    poimen::RunOptions::default(),
                )
                .await
                .expect("enqueue");
            keys.insert(id.to_string(), account);
        }
    }
    drop(host);
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    let hosts = [
        serve(&env, &db.url, "adm-a", "5s"),
        serve(&env, &db.url, "adm-b", "5s"),
        serve(&env, &db.url, "adm-c", "5s"),
    ];
    let refs: Vec<&Served> = hosts.iter().collect();
    wait_settled(&*store, keys.len(), Duration::from_secs(120), &refs).await;
    let mut spans: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for r in all_runs(&*store).await {
        assert_eq!(r.status, RunStatus::Completed, "{}: {:?}", r.id, r.reason);
        assert!(!r.admitted && r.lease.is_none(), "{r:?}");
        let span = driven_span(&*store, &r).await;
        spans.entry(keys[r.id.as_str()]).or_default().push(span);
    }
    for (key, s) in &spans {
        assert_eq!(s.len(), 60, "every start of {key} was served");
        let most = most_at_once(s);
        assert!(most <= 2, "{most} runs of key {key} were driven at once");
        assert_eq!(most, 2, "key {key} used both of its slots");
    }
    // The second key did not wait for the first key's queue to drain: its
    // first run was driven while most of the first key's were still to go.
    let mut acme_ends: Vec<i64> = spans["acme"].iter().map(|s| s.1).collect();
    acme_ends.sort();
    let bolt_first = spans["bolt"].iter().map(|s| s.0).min().expect("bolt runs");
    assert!(
        bolt_first < acme_ends[10],
        "key bolt waited behind key acme: its first run began at {bolt_first}, acme's 11th ended at {}",
        acme_ends[10]
    );
    for h in &hosts {
        assert!(!h.log().contains("panicked"), "{}", h.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_another_process_stops_the_host_driving_the_run() {
    let db = PgDb::create("cancel").await;
    let env = Env::new();
    setup(&env, false);
    let out = env
        .cmd()
        .args(["plugin", "add", plugin_artifacts::ADV_SPIN])
        .output()
        .expect("poimen plugin add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wf = env.write(
        "spinning.yaml",
        "id: t.spinning\nsteps:\n  - id: spin\n    tool: {name: adv-spin}\n    timeout: 10m\n",
    );
    let run = poimen_start(&env, &db.url, &wf, &json!({}));
    let store: Arc<dyn Store> = poimen::store::open_store(&db.url).await.expect("store");
    let id: poimen::store::RunId = run.parse().expect("run id");
    let host = serve(&env, &db.url, "spinner", "3s");
    // Wait until the host drives the run, then until it is in the guest
    // call: `adv-spin` is effect-free (pure, granted nothing), so nothing
    // of its step is written before the call — the run's lease says the
    // host holds it, and the step begins at once.
    let start = Instant::now();
    loop {
        let rec = store.run(&id).await.expect("run").expect("stored");
        if rec.status == RunStatus::Running && rec.lease.is_some() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{}", host.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Cancel from another process, which does not drive the run.
    let out = env
        .cmd()
        .args(["--store", &db.url, "cancel", &run])
        .output()
        .expect("poimen cancel");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = store.run(&id).await.expect("run").expect("stored");
    assert_eq!(rec.status, RunStatus::Cancelled);
    assert_eq!(rec.lease, None, "the cancel ended the host's tenure");
    // The host hears it at its next heartbeat (a third of the 3 s lease)
    // and stops the guest; nothing of it lands after the cancel.
    let start = Instant::now();
    while !host.log().contains("cancelled elsewhere") {
        if start.elapsed() > Duration::from_secs(30) {
            let rec = store.run(&id).await.expect("run");
            let kinds: Vec<String> = store
                .events(&id)
                .await
                .expect("events")
                .into_iter()
                .map(|e| e.kind)
                .collect();
            let intents = store.intents(&id).await.expect("intents");
            panic!(
                "the host did not stop driving the cancelled run: {}\nrun: {rec:?}\nevents: {kinds:?}\nintents: {intents:?}",
                host.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = store.events(&id).await.expect("events");
    assert_eq!(
        events.last().map(|e| e.kind.as_str()),
        Some("run_cancelled"),
        "{events:?}"
    );
    // The effect-free call wrote nothing ahead of itself, and the host's
    // records of it (its outcome, abandoned) are refused after the cancel.
    let intents = store.intents(&id).await.expect("intents");
    assert!(
        intents.is_empty(),
        "nothing of the call lands after the cancel: {intents:?}"
    );
    assert!(
        !events.iter().any(|e| e.kind == "tool_called"),
        "{events:?}"
    );
    // The host is still serving: a new run goes through.
    poimen_start(
        &env,
        &db.url,
        &env.path().join("wf.yaml"),
        &json!({"text": "abc", "n": 1}),
    );
    wait_settled(&*store, 2, Duration::from_secs(60), &[&host]).await;
}

// ------------------------------------------------- a server of the test's own

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_run_stops_runs_with_an_error_naming_it_and_they_finish_once_back() {
    // A server of this test's own, to stop and start under the host.
    let pg = poimen_test_pg::Server::start();
    let url = pg.url();
    let env = Env::new();
    let wf = setup(&env, false);
    let runs = enqueue(&env, &url, &wf, 40).await;
    let host = serve(&env, &url, "pg-stop", "3s");
    {
        let store = poimen::store::open_store(&url).await.expect("store");
        wait_some_settled(&*store, 5).await;
    }
    pg.stop();
    // The host stays up and says what it cannot reach; so does a verb.
    let named = format!("127.0.0.1:{}", pg.port());
    let start = Instant::now();
    while !host.log().contains(&named) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the host never named the server it lost: {}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = env
        .cmd()
        .args(["--store", &url, "status"])
        .output()
        .expect("poimen status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&named) && err.contains("cannot reach"),
        "{err}"
    );
    let mut host = host;
    assert!(
        host.child.try_wait().expect("wait").is_none(),
        "serve keeps running while its store is down: {}",
        host.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start_again();
    // Back: every run completes, each effect once, nothing lost.
    let store = poimen::store::open_store(&url).await.expect("store");
    wait_settled(&*store, runs.len(), Duration::from_secs(120), &[&host]).await;
    check_outcomes(&env, &*store, &runs, false, &[]).await;
    for r in all_runs(&*store).await {
        assert_eq!(r.status, RunStatus::Completed, "{}: {:?}", r.id, r.reason);
    }
}

#[test]
fn store_urls_that_cannot_be_used_get_specific_errors() {
    let env = Env::new();
    let cases: [(&str, &str); 3] = [
        ("postgres://postgres@127.0.0.1:1/test", "127.0.0.1:1"),
        ("postgres://nobody_xyz@127.0.0.1:5432/test", "nobody_xyz"),
        ("mysql://root@127.0.0.1/test", "postgres://"),
    ];
    for (url, names) in cases {
        let out = env
            .cmd()
            .args(["--store", url, "status"])
            .output()
            .expect("poimen");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{url}: {err}");
        assert!(err.contains(names), "{url}: {err}");
        assert!(!err.contains("panicked"), "{url}: {err}");
    }
    // POIMEN_STORE names the store when --store does not.
    let out = env
        .cmd()
        .env("POIMEN_STORE", "mysql://root@127.0.0.1/test")
        .args(["status"])
        .output()
        .expect("poimen");
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mysql://"));
}
