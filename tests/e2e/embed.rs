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
async fn embedding_example_mounts_the_v1_api_beside_its_own_routes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = example_path();
    assert!(
        path.exists(),
        "{} was not built (cargo test builds examples)",
        path.display()
    );
    let mut child = Child(
        Command::new(&path)
            .args(["--listen", "127.0.0.1:0", "--token", "s3cret", "--store"])
            .arg(dir.path().join("poimen.db"))
            .arg("--publish")
            .arg(fixture("examples/text-report.yaml"))
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
    let bearer = "Bearer s3cret";

    // The service's own route, beside the API (no token: its own).
    let own: Value = http
        .get(format!("{base}/service"))
        .send()
        .await
        .expect("GET /service")
        .json()
        .await
        .expect("json");
    assert_eq!(own["api"], "/v1", "{own}");
    assert_eq!(own["published"], json!(["examples.text_report"]));

    // The mounted API: the token is required, the armed workflow starts.
    let refused = http
        .get(format!("{base}/v1/runs"))
        .send()
        .await
        .expect("GET /v1/runs");
    assert_eq!(refused.status(), 401);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let started = http
        .post(format!("{base}/v1/runs"))
        .header("authorization", bearer)
        .json(
            &json!({"workflow": "examples.text_report", "input": {"text": "refund $5 to a@b.io"}}),
        )
        .send()
        .await
        .expect("POST /v1/runs");
    assert_eq!(started.status(), 201);
    let started: Value = started.json().await.expect("json");
    let run = started["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();
    let mut last = Value::Null;
    for _ in 0..600 {
        last = http
            .get(format!("{base}/v1/runs/{run}"))
            .header("authorization", bearer)
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
    let episode: Value = http
        .get(format!("{base}/v1/runs/{run}/episode"))
        .header("authorization", bearer)
        .send()
        .await
        .expect("GET episode")
        .json()
        .await
        .expect("json");
    assert!(!episode.to_string().is_empty());

    // The custom clock is the host's: reading it counted.
    let own: Value = http
        .get(format!("{base}/service"))
        .send()
        .await
        .expect("GET /service")
        .json()
        .await
        .expect("json");
    assert!(own["clock_reads"].as_u64().unwrap_or(0) > 0, "{own}");
    assert_eq!(own["runs"], 1);

    // Bad requests are the API's problems; a file path never runs.
    let bad = http
        .post(format!("{base}/v1/runs"))
        .header("authorization", bearer)
        .json(&json!({"workflow": "examples.text_report", "input": {"text": 5}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.expect("json");
    assert_eq!(body["type"], "https://poimen.dev/problems/input-invalid");
    let file = http
        .post(format!("{base}/v1/runs"))
        .header("authorization", bearer)
        .json(&json!({"workflow": fixture("examples/text-report.yaml"), "input": {"text": "x"}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(file.status(), 400);
    let missing = http
        .get(format!("{base}/v1/runs/WFR-01JD0000000000000000000000"))
        .header("authorization", bearer)
        .send()
        .await
        .expect("GET");
    assert_eq!(missing.status(), 404);
}
