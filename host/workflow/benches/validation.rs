//! `validate` on generated workflows of 1 000, 10 000 and 100 000 steps,
//! and on a graph of 1 000 sub-workflows; as this machine's baseline, a deep
//! copy of the same definition. Throughput is in steps (in workflows for the
//! graph), so the report's time per element is the time per step.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use poimen_workflow::*;

#[path = "generate.rs"]
mod generate;

fn bench(c: &mut Criterion) {
    let (tools, verifiers) = generate::registries();
    let mut g = c.benchmark_group("validate");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    for n in [1_000usize, 10_000, 100_000] {
        let def = generate::workflow(n);
        let none = MemoryWorkflows::new();
        let reg = Registries {
            tools: &tools,
            verifiers: &verifiers,
            workflows: &none,
        };
        if let Err(e) = validate(&def, &reg) {
            panic!("generated workflow is invalid: {:#?}", &e[..e.len().min(5)]);
        }
        g.throughput(Throughput::Elements(n as u64));
        // The checks, on a shared definition (how parse -> validate -> publish uses it).
        let shared = Arc::new(def.clone());
        g.bench_with_input(BenchmarkId::new("steps", n), &shared, |b, def| {
            b.iter(|| validate_arc(Arc::clone(def), &reg))
        });
        // The same through `validate(&def)`, which also deep-copies the definition into the result.
        g.bench_with_input(BenchmarkId::new("steps_with_copy", n), &def, |b, def| {
            b.iter(|| validate(def, &reg))
        });
        // Baseline for this machine: deep-copying the same definition.
        g.bench_with_input(BenchmarkId::new("baseline_clone", n), &def, |b, def| {
            b.iter(|| def.clone())
        });
    }
    let (root, store) = generate::workflow_graph(1_000, 4);
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &store,
    };
    let v = validate(&root, &reg)
        .unwrap_or_else(|e| panic!("graph is invalid: {:#?}", &e[..e.len().min(5)]));
    assert_eq!(distinct_workflows(&v), 1_000);
    g.throughput(Throughput::Elements(1_000));
    let root = Arc::new(root);
    g.bench_function(BenchmarkId::new("subworkflows", 1_000), |b| {
        b.iter(|| validate_arc(Arc::clone(&root), &reg))
    });
    g.finish();
}

/// Distinct workflow versions in a validated graph (the root included).
fn distinct_workflows(v: &Validated) -> usize {
    fn walk(v: &Validated, seen: &mut BTreeSet<WorkflowVersion>) {
        if seen.insert(v.version()) {
            for c in v.sub_workflows().values() {
                walk(c, seen);
            }
        }
    }
    let mut seen = BTreeSet::new();
    walk(v, &mut seen);
    seen.len()
}

criterion_group!(benches, bench);
criterion_main!(benches);
