//! Many hosts, one store: what a durable tool step costs on PostgreSQL
//! beside SQLite, and how throughput moves with the number of hosts.
//!
//! - `step`: per durable tool step, sequential, one host — the slope
//!   between a 1-step and a 10-step chain of the pure `json` tool, which
//!   cancels the run's start and end — on SQLite and on PostgreSQL, in the
//!   same run; each also with the tool's calls written ahead (`Pending` and
//!   `Dispatched` fsynced before the call) as they are for a tool that may
//!   have an effect, where `json` is effect-free and written with its
//!   outcome.
//! - `hosts`: 64 concurrent runs at a time of the 10-step chain (enqueued,
//!   then served), drained by 1, 2 and 3 serving hosts on one PostgreSQL
//!   database (and 1 host on SQLite), runs/s. The hosts are `Executor`s of
//!   their own (own host id, own connection pool, own sandbox) in one
//!   process: the store's contention is what is measured; the process's two
//!   cores are shared as they would be by processes on this machine.
//!
//! `cargo bench -p poimen --bench hosts`. Runs on the PostgreSQL server at
//! `POIMEN_TEST_PG`, or else on a throwaway one it starts (`poimen-test-pg`,
//! syncing its WAL as a production server does); it creates and drops a
//! database of its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use poimen::wiring::Wiring;
use poimen_executor::model::ScriptedProvider;
use poimen_executor::{ExecutorConfig, ServeOptions, StartOptions, SystemClock};
use poimen_store::{RunFilter, RunStatus, Store};
use poimen_workflow::{StepDef, ToolRef, WorkflowDef};
use serde_json::json;

fn chain(n: usize) -> WorkflowDef {
    let mut def = WorkflowDef::new(format!("bench.hosts{n}"));
    for i in 0..n {
        let value = if i == 0 {
            json!({"n": "{{ inputs.n }}"})
        } else {
            json!(format!("{{{{ steps.s{}.output }}}}", i - 1))
        };
        def = def.with_step(StepDef::tool(
            format!("s{i}"),
            ToolRef::parse("json@^0.1").expect("tool ref"),
            json!({"value": value, "select": ""}),
        ));
        if i > 0 {
            def = def.with_edge(format!("s{}", i - 1), format!("s{i}"));
        }
    }
    def
}

/// The sandbox's tools, with every call written ahead of itself: what a
/// step costs when its tool may have an effect (`effect_free` is never
/// `true`).
struct WriteAhead(poimen::tools::SandboxTools);

#[async_trait::async_trait]
impl poimen_executor::ToolHost for WriteAhead {
    async fn invoke(&self, call: poimen_executor::ToolCall) -> poimen_executor::ToolResult {
        self.0.invoke(call).await
    }
    async fn verify(&self, call: poimen_executor::VerifierCall) -> poimen_executor::VerifierResult {
        self.0.verify(call).await
    }
}

async fn wiring(store: Arc<dyn Store>, cache: &Path, id: &str) -> Wiring {
    wiring_with(store, cache, id, false).await
}

async fn wiring_with(store: Arc<dyn Store>, cache: &Path, id: &str, write_ahead: bool) -> Wiring {
    let mut b = poimen_sandbox::PluginHost::builder().cache_dir(cache.to_path_buf());
    for p in plugin_artifacts::BUNDLED {
        b = b.component_bytes(format!("bundled:{}", p.ident), p.bytes);
    }
    let sandbox = b.withhold_ungranted(true).build().await.expect("sandbox");
    let tools = poimen::tools::SandboxTools::new(sandbox.clone());
    let tools: Arc<dyn poimen_executor::ToolHost> = if write_ahead {
        Arc::new(WriteAhead(tools))
    } else {
        Arc::new(tools)
    };
    Wiring::with_tools(
        store,
        sandbox,
        tools,
        Arc::new(ScriptedProvider::new(vec![])),
        Arc::new(SystemClock),
        ExecutorConfig::host(id),
    )
}

async fn runnable(w: &Wiring, n: usize) -> Arc<poimen_executor::Runnable> {
    let v = poimen::check(&*w.store, &w.sandbox, &chain(n))
        .await
        .expect("validates");
    w.loader.runnable(v)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-step cost (µs) of a sequential durable tool step on `store`:
/// median over `rounds` of (t10 − t1) / 9, each t a mean of `reps` runs.
async fn per_step(w: &Wiring, rounds: usize, reps: usize) -> f64 {
    let one = runnable(w, 1).await;
    let ten = runnable(w, 10).await;
    let mut slopes = Vec::new();
    let mut n = 0u64;
    for _ in 0..rounds {
        let mut t = [0.0f64; 2];
        for (k, r) in [&one, &ten].into_iter().enumerate() {
            let start = Instant::now();
            for _ in 0..reps {
                n += 1;
                let out = w
                    .executor
                    .run(r.clone(), json!({"n": n}), StartOptions::default())
                    .await
                    .expect("run");
                assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
            }
            t[k] = start.elapsed().as_secs_f64() * 1e6 / reps as f64;
        }
        slopes.push((t[1] - t[0]) / 9.0);
    }
    median(slopes)
}

/// Runs/s of `hosts` serving hosts draining `total` enqueued 10-step runs,
/// at most `64 / hosts` driven by each (64 at a time in all).
async fn throughput(stores: Vec<Arc<dyn Store>>, cache: &Path, total: u64, tag: &str) -> f64 {
    let hosts = stores.len();
    let mut ws = Vec::new();
    for (i, s) in stores.into_iter().enumerate() {
        ws.push(wiring(s, cache, &format!("{tag}-{i}")).await);
    }
    let r = runnable(&ws[0], 10).await;
    for n in 0..total {
        ws[0]
            .executor
            .enqueue(r.clone(), json!({"n": n}), StartOptions::default())
            .await
            .expect("enqueue");
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in &ws {
        let exec = w.executor.clone();
        let mut rx = stop_rx.clone();
        let opts = ServeOptions {
            workers: 64 / hosts,
            poll: Duration::from_millis(5),
            grace: Duration::from_secs(30),
            slots: None,
        };
        tasks.push(tokio::spawn(async move {
            exec.serve(opts, async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await
            .expect("serve")
        }));
    }
    let store = ws[0].store.clone();
    loop {
        let done = store
            .list_runs(RunFilter {
                status: Some(RunStatus::Completed),
                limit: Some(u32::MAX),
                ..RunFilter::default()
            })
            .await
            .expect("list")
            .len() as u64;
        if done >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    total as f64 / secs
}

async fn pg_admin(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL is not reachable at {url} ({e}): `service postgresql start`")
        });
    tokio::spawn(async move {
        let _ = conn.await;
    });
    c
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then
    // only check that this compiles.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // Kept until the bench ends: dropping it stops the server.
        let own_server = std::env::var("POIMEN_TEST_PG")
            .is_err()
            .then(poimen_test_pg::Server::start_durable);
        let base = match &own_server {
            Some(s) => s.url(),
            None => poimen_test_pg::url(),
        };
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hosts-bench");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("bench dir");
        let cache = dir.join("cache");
        let admin = pg_admin(&base).await;
        let fresh = |tag: &str| {
            let name = format!("poimen_bench_{tag}_{}", std::process::id());
            let (scheme, rest) = base.split_once("://").expect("url");
            let authority = rest.split('/').next().unwrap_or(rest).to_owned();
            (name.clone(), format!("{scheme}://{authority}/{name}"))
        };
        let mut dbs = Vec::new();
        let open_pg = async |tag: &str| -> (String, String) {
            let (name, url) = fresh(tag);
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
                .expect("drop database");
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .expect("create database");
            (name, url)
        };

        // Per step, sequential, one host.
        let sqlite: Arc<dyn Store> = Arc::new(
            poimen_store::SqliteStore::open(dir.join("step.db"))
                .await
                .expect("sqlite"),
        );
        let (name, url) = open_pg("step").await;
        dbs.push(name);
        let pg: Arc<dyn Store> = poimen_store::open_store(&url).await.expect("pg");
        let ws = wiring(sqlite.clone(), &cache, "step").await;
        let wp = wiring(pg.clone(), &cache, "step").await;
        let ws_ahead = wiring_with(sqlite, &cache, "step", true).await;
        let wp_ahead = wiring_with(pg, &cache, "step", true).await;
        // Warm all (compile cache, prepared statements, pool).
        for w in [&ws, &wp, &ws_ahead, &wp_ahead] {
            per_step(w, 1, 2).await;
        }
        let mut s = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (k, w) in [&ws, &wp, &ws_ahead, &wp_ahead].into_iter().enumerate() {
                s[k].push(per_step(w, 5, 5).await);
            }
        }
        let shown = |v: &Vec<f64>| v.iter().map(|x| x.round()).collect::<Vec<_>>();
        println!(
            "step: durable tool step, sequential, one host, effect-free (written with its outcome): SQLite {:.0} µs, PostgreSQL {:.0} µs (medians of {:?} / {:?})",
            median(s[0].clone()),
            median(s[1].clone()),
            shown(&s[0]),
            shown(&s[1]),
        );
        println!(
            "step: the same, written ahead (as for a tool that may have an effect): SQLite {:.0} µs, PostgreSQL {:.0} µs (medians of {:?} / {:?}); effect-free / ahead: SQLite {:.2}, PostgreSQL {:.2}",
            median(s[2].clone()),
            median(s[3].clone()),
            shown(&s[2]),
            shown(&s[3]),
            median(s[0].clone()) / median(s[2].clone()),
            median(s[1].clone()) / median(s[3].clone()),
        );

        // Throughput with 1, 2, 3 hosts.
        let total = 640;
        let sq: Arc<dyn Store> = Arc::new(
            poimen_store::SqliteStore::open(dir.join("hosts.db"))
                .await
                .expect("sqlite"),
        );
        let r = throughput(vec![sq], &cache, total, "sq").await;
        println!("hosts: SQLite, 1 host, 64 concurrent: {r:.0} runs/s ({:.0} steps/s)", r * 10.0);
        for hosts in 1..=3 {
            let (name, url) = open_pg(&format!("h{hosts}")).await;
            dbs.push(name);
            let mut stores = Vec::new();
            for _ in 0..hosts {
                stores.push(poimen_store::open_store(&url).await.expect("pg"));
            }
            let r = throughput(stores, &cache, total, &format!("pg{hosts}")).await;
            println!(
                "hosts: PostgreSQL, {hosts} host(s), 64 concurrent: {r:.0} runs/s ({:.0} steps/s)",
                r * 10.0
            );
        }
        for name in dbs {
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    });
}
