//! Shadow evaluation throughput (`cargo bench -p poimen --bench shadow`).
//!
//! Records 1 000 live runs of the README's workflow
//! (`fixtures/examples/text-report.yaml`) on a SQLite store on the target
//! dir's disk, timing each live run; then shadow-evaluates the same version
//! (as a reformatted file) on all of them with 1 and with 2 workers, three
//! times each. Prints medians: live per-run cost, shadow runs per second and
//! per-run cost, and their ratio — the numbers BENCHMARKS.md records.
//! A bench binary, not criterion: one iteration is a thousand runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use poimen::shadow::{ModelMode, Selection, ShadowOptions};
use poimen::{Host, Target};
use serde_json::json;

const RUNS: usize = 1000;
const REPEATS: usize = 3;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours means skip.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"shadow".contains(a.as_str()))
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

async fn bench() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("shadow-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    // The fixtures are the workspace's, two levels above this crate
    // (`host/poimen`).
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let host = Host::builder()
        .store_path(dir.join("poimen.db"))
        .cache_dir(dir.join("cache"))
        .build()
        .await
        .expect("host");
    let live = Target::File(root.join("fixtures/examples/text-report.yaml"));
    let candidate = Target::File(root.join("fixtures/shadow/text-report.reformatted.json"));

    // Warm up (compile cache, first publish), then record.
    host.run(&live, json!({"text": "warm up"}), Default::default())
        .await
        .expect("warm-up run");
    let mut live_times = Vec::with_capacity(RUNS);
    let mut baseline = String::new();
    for i in 0..RUNS {
        let text = if i % 2 == 0 {
            format!("Please refund ${i} to user{i}@example.com, cc ops@example.org")
        } else {
            format!("Run {i}: nothing to see here, just {i} words or so")
        };
        let t = Instant::now();
        let out = host
            .run(&live, json!({ "text": text }), Default::default())
            .await
            .expect("live run");
        live_times.push(t.elapsed());
        if baseline.is_empty() {
            let (rec, _) = host.status(&out.run).await.expect("status");
            baseline = rec.version.to_string();
        }
    }
    let live_median = median(live_times);

    println!("shadow evaluation of {RUNS} recorded runs of fixtures/examples/text-report.yaml");
    println!("live run (durable SQLite, sequential): median {live_median:?} per run");
    for workers in [1usize, 2] {
        let mut totals = Vec::new();
        for _ in 0..REPEATS {
            let opts = ShadowOptions {
                selection: Selection::Latest(RUNS as u32),
                models: ModelMode::Replay,
                tools: Default::default(),
                workers,
                progress: None,
            };
            let t = Instant::now();
            let report = host
                .shadow(&candidate, &baseline, &opts)
                .await
                .expect("shadow");
            totals.push(t.elapsed());
            assert_eq!(report.aggregate.runs, RUNS);
            assert_eq!(report.aggregate.ties, RUNS);
        }
        let total = median(totals);
        let per_run = total / RUNS as u32;
        println!(
            "shadow, {workers} worker(s): median {total:?} for {RUNS} runs = {:.0} runs/s, {per_run:?} per run, {:.2}x a live run",
            RUNS as f64 / total.as_secs_f64(),
            per_run.as_secs_f64() / live_median.as_secs_f64()
        );
    }
}
