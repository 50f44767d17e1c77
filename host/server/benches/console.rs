//! The console's server time on a large store (`cargo bench -p
//! poimen-server --bench console`).
//!
//! Builds a SQLite store of 100 000 runs (one real run of a one-step
//! workflow, then its version's runs created straight through the store,
//! every tenth failed), and one real run of a 1 000-step chain; then times
//! the console's pages through its router (no sockets), 21 times each, and
//! prints the medians BENCHMARKS.md records: the runs list (first page, a
//! deep page, filtered by status, by key, by version) and the 1 000-step
//! run's page. The store lives on /dev/shm when there is one (building it
//! then takes seconds, not minutes of fsyncs); reads are from the page
//! cache either way. A bench binary, not criterion: the setup is the cost.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use poimen::store::{Commit, NewRun, RunUpdate, SqliteStore};
use poimen::{Host, RunId, RunOptions, RunStatus, Store, Target};
use poimen_server::ServerConfig;
use serde_json::json;
use tower::ServiceExt;

const RUNS: usize = 100_000;
const STEPS: usize = 1_000;
const REPEATS: usize = 21;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"console".contains(a.as_str()))
    {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn time(app: &axum::Router, uri: &str) -> (Duration, usize) {
    let mut times = Vec::with_capacity(REPEATS);
    let mut size = 0;
    for _ in 0..REPEATS {
        let t = Instant::now();
        let res = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(res.status(), 200, "{uri}");
        size = res
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .len();
        times.push(t.elapsed());
    }
    (median(times), size)
}

async fn bench() {
    let shm = PathBuf::from("/dev/shm");
    let base = if shm.is_dir() {
        shm
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    };
    let dir = base.join(format!("poimen-console-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.join("poimen.db"))
            .await
            .expect("store"),
    );
    let host = Host::builder()
        .shared_store(store.clone())
        .cache_dir(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-bench-cache"))
        .build()
        .await
        .expect("host");
    let echo = dir.join("echo.yaml");
    std::fs::write(
        &echo,
        "id: bench.echo\nsteps:\n  - id: echo\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"\"}}\n",
    )
    .expect("echo");
    let first = host
        .run(&Target::File(echo), json!({}), RunOptions::default())
        .await
        .expect("echo run");
    let version = store
        .run(&first.run)
        .await
        .expect("read")
        .expect("the run")
        .version;

    let t = Instant::now();
    let mut mid = None;
    for n in 1..RUNS {
        let id = RunId::parse(&format!("WFR-{n:026}")).expect("id");
        store
            .create_run(NewRun {
                id: id.clone(),
                version,
                input: format!("{{\"n\":{n}}}").into_bytes(),
                tenant: "default".to_owned(),
                idempotency_key: Some(format!("k-{n}")),
                parent: None,
                lease: None,
                admission: None,
                created_at: 1_700_000_000_000 + n as i64,
            })
            .await
            .expect("create");
        if n % 10 == 0 {
            let mut c = Commit::new(id.clone());
            c.run_update = Some(RunUpdate {
                status: RunStatus::Failed,
                reason: Some("bench".into()),
                output_hash: None,
                updated_at: 1_700_000_000_000 + n as i64,
                wake_at: None,
            });
            store.commit(c).await.expect("fail");
        }
        if n == RUNS / 2 {
            mid = Some(id);
        }
    }
    eprintln!("created {RUNS} runs in {:.1} s", t.elapsed().as_secs_f64());

    let chain = dir.join("chain.yaml");
    let mut yaml = String::from("id: bench.chain\nlimits: {steps: 2000}\nsteps:\n");
    for i in 0..STEPS {
        yaml.push_str(&format!(
            "  - id: s{i:04}\n    tool: {{name: \"json@^0.1\", args: {{value: {{i: {i}}}, select: \"\"}}}}\n"
        ));
    }
    yaml.push_str("transitions:\n");
    for i in 1..STEPS {
        yaml.push_str(&format!("  - {{from: s{:04}, to: s{i:04}}}\n", i - 1));
    }
    std::fs::write(&chain, yaml).expect("chain");
    let t = Instant::now();
    let long = host
        .run(&Target::File(chain), json!({}), RunOptions::default())
        .await
        .expect("chain run");
    assert_eq!(long.status, RunStatus::Completed, "{:?}", long.reason);
    eprintln!(
        "ran the {STEPS}-step chain in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let app = poimen_server::app(Arc::new(host), ServerConfig::open());
    let mid = mid.expect("a middle run");
    let pages = [
        ("runs list, first page of 50", "/runs".to_owned()),
        (
            "runs list, a page 50 000 runs deep",
            format!("/runs?before={mid}"),
        ),
        ("runs list, status=failed", "/runs?status=failed".to_owned()),
        (
            "runs list, status=completed (2 of 100 000)",
            "/runs?status=completed".to_owned(),
        ),
        ("runs list, by key", "/runs?key=k-77777".to_owned()),
        (
            "runs list, by version prefix",
            format!("/runs?version={}", &version.to_string()[..12]),
        ),
        (
            "run page of the 1 000-step run",
            format!("/runs/{}", long.run),
        ),
    ];
    println!("console server time, {RUNS} runs in the store, median of {REPEATS}:");
    for (what, uri) in pages {
        let (t, size) = time(&app, &uri).await;
        println!(
            "  {what:<46} {:>8.2} ms  ({} KiB)",
            t.as_secs_f64() * 1000.0,
            size / 1024
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
