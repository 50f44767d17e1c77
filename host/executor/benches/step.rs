//! What the interpreter adds per step, and what durability costs.
//!
//! - `tool_call/sandbox`: one call of the pure `json` tool straight through
//!   the sandbox — the floor every interpreted tool step pays.
//! - `run/ephemeral/{1,10}` and `run/durable/{1,10}`: a whole run of a chain
//!   of 1 or 10 pure tool steps, on the in-memory store (`durable: false`)
//!   and on SQLite. The per-step cost is the slope, (t10 − t1) / 9, which
//!   cancels the run's fixed start and finish.
//! - `fsync/4KiB`: a raw 4 KiB append + fsync on the same disk, in the same
//!   run — the unit a durable tool step is measured against (target: a
//!   durable step costs no more than 3 fsyncs more than an ephemeral one).
//!
//! `cargo bench -p executor`. Files live under Cargo's per-target temporary
//! directory, on the disk of the target dir (not a tmpfs, where fsync is free).

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use executor::model::ScriptedProvider;
use executor::{Executor, ExecutorConfig, StartOptions, SystemClock};
use poimen::armory::StoreArmory;
use poimen::tools::SandboxTools;
use sandbox::ToolCall;
use serde_json::json;
use store::{RunStatus, SqliteStore, Store};
use workflow::{StepDef, ToolRef, WorkflowDef};

fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("executor-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

fn json_tool() -> ToolRef {
    ToolRef::parse("json@^0.1").expect("tool ref")
}

/// A chain of `n` pure tool steps, each selecting from the previous output.
fn chain(n: usize, durable: bool) -> WorkflowDef {
    let mut def = WorkflowDef::new(format!("bench.chain{n}{}", if durable { "d" } else { "e" }))
        .with_durable(durable);
    for i in 0..n {
        let value = if i == 0 {
            json!({"n": "{{ inputs.n }}"})
        } else {
            json!(format!("{{{{ steps.s{}.output }}}}", i - 1))
        };
        def = def.with_step(StepDef::tool(
            format!("s{i}"),
            json_tool(),
            json!({"value": value, "select": ""}),
        ));
        if i > 0 {
            def = def.with_edge(format!("s{}", i - 1), format!("s{i}"));
        }
    }
    def
}

struct Bench {
    sandbox: sandbox::Host,
    armory: Arc<StoreArmory>,
    store: Arc<dyn Store>,
    exec: Executor,
}

async fn setup(dir: &std::path::Path) -> Bench {
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.join("poimen.db"))
            .await
            .expect("store"),
    );
    let mut b = sandbox::Host::builder().cache_dir(dir.join("cache"));
    for p in plugin_artifacts::BUNDLED {
        b = b.component_bytes(format!("bundled:{}", p.ident), p.bytes);
    }
    let sandbox = b.withhold_ungranted(true).build().await.expect("sandbox");
    let armory = Arc::new(StoreArmory::new(store.clone(), sandbox.clone()));
    let exec = Executor::new(
        store.clone(),
        Arc::new(SandboxTools::new(sandbox.clone())),
        Arc::new(ScriptedProvider::new(vec![])),
        Arc::new(SystemClock),
        armory.clone(),
        ExecutorConfig::default(),
    );
    Bench {
        sandbox,
        armory,
        store,
        exec,
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = bench_dir();
    let b = rt.block_on(setup(&dir));

    c.bench_function("tool_call/sandbox", |bench| {
        bench.to_async(&rt).iter(|| async {
            let inv = b
                .sandbox
                .invoke_tool(ToolCall::new(
                    json_tool(),
                    json!({"value": {"n": 1}, "select": ""}),
                    "bench",
                ))
                .await;
            black_box(inv.outcome.expect("json tool"))
        })
    });

    let mut group = c.benchmark_group("run");
    group.measurement_time(Duration::from_secs(8));
    for durable in [false, true] {
        for n in [1usize, 10] {
            let def = chain(n, durable);
            let armed = rt.block_on(async {
                let validated = poimen::check(&*b.store, &b.sandbox, &def)
                    .await
                    .expect("validates");
                b.armory.arm_validated(validated)
            });
            let label = if durable { "durable" } else { "ephemeral" };
            group.bench_with_input(BenchmarkId::new(label, n), &n, |bench, _| {
                bench.to_async(&rt).iter(|| async {
                    let out = b
                        .exec
                        .run(armed.clone(), json!({"n": 1}), StartOptions::default())
                        .await
                        .expect("run");
                    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
                    black_box(out)
                })
            });
        }
    }
    group.finish();

    let path = dir.join("fsync.bin");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("fsync file");
    let page = vec![7u8; 4096];
    c.bench_function("fsync/4KiB", |bench| {
        bench.iter(|| {
            f.write_all(&page).expect("write");
            f.sync_data().expect("fsync");
        })
    });
}

criterion_group! {
    name = step;
    config = Criterion::default().sample_size(30);
    targets = benches
}
criterion_main!(step);
