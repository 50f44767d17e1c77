//! The embedding example (`examples/embed.rs`), built by `cargo test` with
//! the other examples, run as a real HTTP service and driven over HTTP.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::fixture;

fn example_path() -> std::path::PathBuf {
    // target/<profile>/deps/e2e-… → target/<profile>/examples/embed
    let exe = std::env::current_exe().expect("test exe");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    profile_dir
        .join("examples")
        .join(format!("embed{}", std::env::consts::EXE_SUFFIX))
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedding_example_serves_runs_over_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = example_path();
    assert!(
        path.exists(),
        "{} was not built (cargo test builds examples)",
        path.display()
    );
    let mut child = Child(
        Command::new(&path)
            .args(["--listen", "127.0.0.1:0", "--store"])
            .arg(dir.path().join("poimen.db"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the example"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next()
        .expect("a line")
        .expect("read");
    let base = line
        .strip_prefix("listening on ")
        .expect("the address")
        .to_owned();

    let http = reqwest::Client::new();
    let started: Value = http
        .post(format!("{base}/runs"))
        .json(&json!({"workflow": fixture("examples/text-report.yaml"), "input": {"text": "refund $5 to a@b.io"}}))
        .send()
        .await
        .expect("POST /runs")
        .json()
        .await
        .expect("json");
    let run = started["run"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();
    let mut last = Value::Null;
    for _ in 0..600 {
        last = http
            .get(format!("{base}/runs/{run}"))
            .send()
            .await
            .expect("GET")
            .json()
            .await
            .expect("json");
        if last["status"] != json!("running") && last["status"] != json!("queued") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last["status"], json!("completed"), "{last}");
    assert_eq!(last["output"]["flagged"], json!(true));

    // Bad requests get specific answers.
    let bad = http
        .post(format!("{base}/runs"))
        .json(&json!({"workflow": fixture("examples/text-report.yaml"), "input": {"text": 5}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(bad.status(), 400);
    let missing = http
        .get(format!("{base}/runs/WFR-01JD0000000000000000000000"))
        .send()
        .await
        .expect("GET");
    assert_eq!(missing.status(), 404);
}
