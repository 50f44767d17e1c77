//! The kernel's own cost per step, without a sandbox or a disk: a chain of
//! tool steps answered by a scripted tool, on the in-memory store, under a
//! manual clock. What is left is the walk's bookkeeping — rendering, the
//! intent protocol, events, the fold — which is what issue "close to the
//! limit" bounds. (`cargo bench -p poimen-executor --bench walk`; the real
//! sandbox and SQLite are measured by `cargo bench -p poimen --bench step`.)

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use poimen_executor::model::ScriptedProvider;
use poimen_executor::testing::{ManualClock, MemoryLoader, ScriptedTools};
use poimen_executor::{Executor, ExecutorConfig, StartOptions};
use poimen_store::{MemoryStore, RunStatus};
use poimen_workflow::{StepDef, ToolRef, WorkflowDef};
use serde_json::json;

fn chain(n: usize) -> WorkflowDef {
    let tool: ToolRef = "echo@^1".parse().expect("tool ref");
    let mut def = WorkflowDef::new("bench.walk");
    for i in 0..n {
        let value = if i == 0 {
            json!({"n": 0})
        } else {
            json!(format!("{{{{ steps.s{}.output }}}}", i - 1))
        };
        def = def.with_step(StepDef::tool(format!("s{i}").as_str(), tool.clone(), value));
        if i > 0 {
            def = def.with_edge(format!("s{}", i - 1), format!("s{i}"));
        }
    }
    def
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let tools = Arc::new(ScriptedTools::new().echo("echo"));
    let loader = MemoryLoader::new();
    let exec = Executor::new(
        Arc::new(MemoryStore::new()),
        tools.clone(),
        Arc::new(ScriptedProvider::new(vec![])),
        ManualClock::auto(0),
        loader.clone(),
        ExecutorConfig::default(),
    );
    let mut group = c.benchmark_group("walk");
    group.measurement_time(Duration::from_secs(5));
    for n in [1usize, 10, 100] {
        let runnable = loader.add(&chain(n), &tools).expect("validates");
        group.bench_with_input(BenchmarkId::new("tool_chain", n), &n, |b, _| {
            b.to_async(&rt).iter(|| async {
                let out = exec
                    .run(runnable.clone(), json!({}), StartOptions::default())
                    .await
                    .expect("runs");
                assert_eq!(out.status, RunStatus::Completed);
            })
        });
    }
    group.finish();
}

criterion_group!(walk, benches);
criterion_main!(walk);
