//! Parse + canonicalize + hash of generated workflows of 10, 1 000, 10 000
//! and 100 000 steps, from YAML and from JSON; canonicalize + hash alone;
//! and, as this machine's baseline, `serde_json` parsing the same JSON into a
//! plain `Value`. Throughput is in steps, so the report's time per element
//! is the time per step.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use poimen_workflow::*;

#[path = "generate.rs"]
mod generate;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_canonicalize_hash");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    for n in [10usize, 1_000, 10_000, 100_000] {
        let def = generate::workflow(n);
        let json = serde_json::to_vec(&def).expect("json");
        let yaml = serde_norway::to_string(&def).expect("yaml").into_bytes();
        let v = version_of(&def);
        for (name, bytes, format) in [("json", &json, Format::Json), ("yaml", &yaml, Format::Yaml)]
        {
            let parsed = parse(bytes, format, name).expect("parses");
            assert_eq!(version_of(&parsed), v, "{name} round trip");
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(BenchmarkId::new(name, n), bytes, |b, bytes| {
                b.iter(|| version_of(&parse(bytes, format, name).expect("parses")))
            });
        }
        g.bench_with_input(
            BenchmarkId::new("canonicalize_hash_only", n),
            &def,
            |b, def| b.iter(|| version_of(def)),
        );
        // Baseline for this machine: parsing the same JSON into a plain
        // `serde_json::Value` (no IR, no checks, no canonical form).
        g.bench_with_input(
            BenchmarkId::new("baseline_serde_json_value", n),
            &json,
            |b, json| b.iter(|| serde_json::from_slice::<serde_json::Value>(json).expect("json")),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
