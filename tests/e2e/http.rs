//! `poimen serve --http`: the HTTP API served by a real process on the
//! same host that drives runs. A definition published, and a run started
//! and followed to its end, over HTTP; runs started over HTTP held to the
//! host's `--max-runs`; a listener beyond loopback without a token is
//! refused before anything starts.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Env, Served};

const ECHO: &str = r#"id: http.e2e
inputs: {type: object, properties: {text: {type: string}}, required: [text]}
steps:
  - id: echo
    tool: {name: "json@^0.1", args: {value: {said: "{{ inputs.text }}"}, select: ""}}
output: "{{ steps.echo.output }}"
"#;

/// `poimen serve --http 127.0.0.1:0 --token-file token`; its base URL,
/// read from the line it logs once it listens.
pub(crate) fn serve_http(env: &Env, global: &[&str], serve: &[&str]) -> (Served, String) {
    serve_http_with(env, global, serve, &[])
}

/// [`serve_http`] with environment variables `vars` set for the server.
pub(crate) fn serve_http_with(
    env: &Env,
    global: &[&str],
    serve: &[&str],
    vars: &[(&str, &str)],
) -> (Served, String) {
    env.write("token", "e2e-token\n");
    let log = env.path().join("http.log");
    let file = std::fs::File::create(&log).expect("log file");
    let child = env
        .std_cmd()
        .args(global)
        .arg("serve")
        .args(serve)
        .args(["--host-id", "http", "--poll", "20ms"])
        .args(["--http", "127.0.0.1:0", "--token-file", "token"])
        .envs(vars.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn poimen serve");
    let served = Served {
        id: "http".to_owned(),
        child,
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = served.log();
        if let Some(url) = text
            .lines()
            .find_map(|l| l.split("HTTP API on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
        {
            return (served, url.to_owned());
        }
        assert!(
            Instant::now() < deadline,
            "poimen serve never listened:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Publishes a definition over HTTP; its version.
pub(crate) async fn publish(http: &reqwest::Client, base: &str, definition: &str) -> String {
    let published: Value = http
        .post(format!("{base}/workflows"))
        .bearer_auth("e2e-token")
        .json(&json!({"definition": definition}))
        .send()
        .await
        .expect("publish")
        .json()
        .await
        .expect("JSON");
    published["version"].as_str().expect("version").to_owned()
}

/// `GET {base}{path}` with the token, as JSON.
pub(crate) async fn get_json(http: &reqwest::Client, base: &str, path: &str) -> Value {
    http.get(format!("{base}{path}"))
        .bearer_auth("e2e-token")
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("JSON")
}

/// Run `id` once it has ended (completed, failed or cancelled).
pub(crate) async fn ended(http: &reqwest::Client, base: &str, id: &str, served: &Served) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = get_json(http, base, &format!("/runs/{id}")).await;
        if matches!(
            run["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return run;
        }
        assert!(Instant::now() < deadline, "{run}\n{}", served.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_run_started_over_http_completes() {
    let env = Env::new();
    let (served, base) = serve_http(&env, &[], &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let http = reqwest::Client::new();
        // Probes need no token; everything else does.
        let health = http
            .get(format!("{base}/health"))
            .send()
            .await
            .expect("health");
        assert_eq!(health.status(), 200);
        let anonymous = http.get(format!("{base}/runs")).send().await.expect("runs");
        assert_eq!(anonymous.status(), 401);
        assert_eq!(
            anonymous.headers()["content-type"],
            "application/problem+json"
        );

        let version = publish(&http, &base, ECHO).await;
        let started = http
            .post(format!("{base}/runs"))
            .bearer_auth("e2e-token")
            .json(&json!({"workflow": version, "input": {"text": "over http"}}))
            .send()
            .await
            .expect("start");
        assert_eq!(started.status(), 201, "{}", served.log());
        let run: Value = started.json().await.expect("JSON");
        let id = run["id"].as_str().expect("id");

        let done = ended(&http, &base, id, &served).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["output"], json!({"said": "over http"}));

        // The run's events, as server-sent events, end with its completion.
        let events = http
            .get(format!("{base}/runs/{id}/events"))
            .bearer_auth("e2e-token")
            .send()
            .await
            .expect("events")
            .text()
            .await
            .expect("text");
        assert!(events.contains("event: run_completed"), "{events}");
    });
    // The store the API wrote is the one the CLI reads.
    let (code, status) = env.json(&["status"]);
    assert_eq!(code, 0);
    assert_eq!(status[0]["status"], "completed", "{status}");
    drop(served);
}

const SPIN: &str =
    "id: http.spin\nsteps:\n  - id: spin\n    tool: {name: adv-spin}\n    timeout: 400ms\n";

/// `poimen serve --max-runs 1`: runs started over HTTP are queued for the
/// serving loop, which drives one at a time — they never run side by side,
/// as they would if the API drove each in a task of its own. A start that
/// waits for its run (`?wait=`) takes the same one slot to drive it at
/// once, or waits for the loop when the slot is taken: still one at a time.
#[test]
fn runs_started_over_http_wait_for_the_serving_loop_and_its_max_runs() {
    let env = Env::new();
    let (code, added) = env.json(&["plugin", "add", plugin_artifacts::ADV_SPIN]);
    assert_eq!(code, 0, "{added}");
    // Each run spins in the sandbox until its step's 400 ms timeout.
    env.write(
        "policy.toml",
        "[plugins.adv-spin]\nlimits = { fuel = 1000000000000000, timeout-ms = 60000 }\n",
    );
    let (served, base) = serve_http(&env, &["--policy", "policy.toml"], &["--max-runs", "1"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let http = reqwest::Client::new();
        let version = publish(&http, &base, SPIN).await;
        let starts = ["", "?wait=30", "?wait=30", ""].map(|wait| {
            http.post(format!("{base}/runs{wait}"))
                .bearer_auth("e2e-token")
                .json(&json!({"workflow": version, "input": {}}))
                .send()
        });
        let mut runs = Vec::new();
        for started in futures::future::join_all(starts).await {
            let started = started.expect("start");
            assert_eq!(started.status(), 201, "{}", served.log());
            let run: Value = started.json().await.expect("JSON");
            runs.push(run["id"].as_str().expect("id").to_owned());
        }
        // Each run's step, from its start to its end, in stored times.
        let mut spans = Vec::new();
        for id in &runs {
            ended(&http, &base, id, &served).await;
            let episode = get_json(&http, &base, &format!("/runs/{id}/episode")).await;
            let at = |kind: &str| {
                episode["events"]
                    .as_array()
                    .expect("events")
                    .iter()
                    .find(|e| e["event"] == kind)
                    .and_then(|e| e["at"].as_i64())
                    .unwrap_or_else(|| panic!("no {kind} in {episode}"))
            };
            spans.push((at("step_started"), at("step_finished")));
        }
        spans.sort();
        for pair in spans.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "two runs ran at once under --max-runs 1: {spans:?}\n{}",
                served.log()
            );
        }
    });
    drop(served);
}

#[test]
fn a_listener_beyond_loopback_needs_a_token() {
    let env = Env::new();
    let out = env
        .cmd()
        .args(["serve", "--http", "0.0.0.0:0"])
        .output()
        .expect("run poimen");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--token-file"), "{stderr}");
}
