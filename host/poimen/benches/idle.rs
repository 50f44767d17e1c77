//! Idle runs cost nothing (issue 16, target 4): `cargo bench -p poimen
//! --bench idle`.
//!
//! Phase one (this process) records 100 000 real runs of a workflow that
//! waits for a judgment, on a SQLite store under /dev/shm (so the setup
//! is not minutes of fsyncs). Phase two is a fresh process (this binary
//! again, `--serve DIR`): it opens a host over that store, starts its
//! serving loop as `poimen serve` does, lets it settle, and reports its
//! resident memory (VmRSS, and the peak VmHWM) — then answers one of the
//! waiting runs' judgments and times how long until that run has
//! finished (the answer validated and recorded, the run resumed, its last
//! step run, its end committed). Prints the figures BENCHMARKS.md records.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use poimen::{Host, JudgmentSubmission, RunOptions, RunStatus, ServeOptions, Target};
use serde_json::json;

const RUNS: usize = 100_000;
const WORKFLOW: &str = r#"id: bench.idle
steps:
  - id: approve
    judgment:
      question: "Go on?"
      result_schema: {type: object, properties: {go: {type: boolean}}, required: [go]}
  - id: act
    tool: {name: "json@^0.1", args: {value: {acted: true}, select: ""}}
transitions:
  - {from: approve, to: act}
output: "{{ steps.act.output }}"
"#;

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("idle-bench-cache")
}

async fn host(dir: &Path) -> Host {
    Host::builder()
        .store_path(dir.join("poimen.db"))
        .cache_dir(cache())
        .host_id("idle-bench")
        .build()
        .await
        .expect("host")
}

/// `(VmRSS, VmHWM)` of this process, in MiB.
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"idle".contains(a.as_str()))
        && args.first().map(String::as_str) != Some("--serve")
    {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match args.iter().position(|a| a == "--serve") {
        Some(i) => rt.block_on(serve(Path::new(&args[i + 1]))),
        None => rt.block_on(record()),
    }
}

async fn record() {
    let shm = PathBuf::from("/dev/shm");
    let base = if shm.is_dir() {
        shm
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    };
    let dir = base.join(format!("poimen-idle-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let file = dir.join("idle.yaml");
    std::fs::write(&file, WORKFLOW).expect("workflow");
    {
        let host = host(&dir).await;
        let first = host
            .run(&Target::File(file), json!({}), RunOptions::default())
            .await
            .expect("first run");
        assert_eq!(first.status, RunStatus::WaitingJudgment);
        let version = host
            .status(&first.run)
            .await
            .expect("status")
            .0
            .version
            .to_string();
        let target = Target::parse(&version);
        let t = Instant::now();
        for n in 1..RUNS {
            let out = host
                .run(&target, json!({}), RunOptions::default())
                .await
                .expect("run");
            assert_eq!(out.status, RunStatus::WaitingJudgment);
            if n % 20_000 == 0 {
                eprintln!("  {n} runs waiting ({:.0} s)", t.elapsed().as_secs_f64());
            }
        }
        eprintln!(
            "recorded {RUNS} runs waiting for a judgment in {:.0} s",
            t.elapsed().as_secs_f64()
        );
    }
    let status = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .arg("--serve")
        .arg(&dir)
        .status()
        .expect("phase two");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "phase two failed");
}

async fn serve(dir: &Path) {
    let before = memory();
    let host = host(dir).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = {
        let host = host.clone();
        tokio::spawn(async move {
            host.serve(
                ServeOptions {
                    workers: 8,
                    poll: Duration::from_millis(100),
                    grace: Duration::from_secs(5),
                    slots: None,
                },
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = memory();
    let open = host.judgments().await.expect("judgments");
    assert!(open.len() >= RUNS, "{} open requests", open.len());
    let listed = memory();
    drop(open);
    // Answer one (a late one: nothing about it is warm), timed to the end
    // of its run, five times over five runs.
    let mut times = Vec::new();
    let open = host.judgments().await.expect("judgments");
    for j in open.iter().rev().take(5) {
        let t = Instant::now();
        let out = host
            .submit_judgment(
                &j.id,
                JudgmentSubmission {
                    request_hash: j.request_hash.clone(),
                    result: json!({"go": true}),
                    executor: None,
                    profile: None,
                    provenance: json!({"judge": "bench"}),
                },
            )
            .await
            .expect("answer");
        times.push(t.elapsed());
        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    }
    drop(open);
    times.sort();
    let _ = stop.send(());
    let _ = serving.await;
    println!("idle runs: {RUNS} waiting for a judgment, one host serving (8 workers):");
    println!("  RSS before the host          {:>7.1} MiB", before.0);
    println!(
        "  RSS serving, settled (3 s)   {:>7.1} MiB  (peak so far {:.1} MiB)",
        idle.0, idle.1
    );
    println!(
        "  RSS after listing every open request {:>7.1} MiB",
        listed.0
    );
    println!(
        "  answer one → its run completed: median {:.1} ms (min {:.1}, max {:.1}, 5 answers)",
        times[2].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[4].as_secs_f64() * 1000.0
    );
}
