//! Retention from the outside: `poimen gc` deletes finished runs (after a
//! dry run that deletes nothing), never a run still under way nor a
//! version, and takes its age from the command line or the policy.

use serde_json::{Value, json};

use crate::support::{Env, fixture};

fn finished_run(env: &Env, text: &str) -> String {
    let report = fixture("examples/text-report.yaml");
    let input = json!({ "text": text }).to_string();
    let (code, out) = env.json(&["run", report.to_str().expect("utf8"), "--input", &input]);
    assert_eq!(code, 0, "{out}");
    out["run"].as_str().expect("run").to_owned()
}

/// The exit code of `poimen status RUN`.
fn status_code(env: &Env, run: &str) -> Option<i32> {
    env.cmd()
        .args(["status", run])
        .output()
        .expect("status")
        .status
        .code()
}

fn count(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key}: {report}"))
}

#[test]
fn gc_deletes_finished_runs_after_a_dry_run_and_leaves_unfinished_ones() {
    let env = Env::new();
    let done = [
        finished_run(&env, "Please refund $40 to ana@example.com"),
        finished_run(&env, "Ship the order to 12 Main St"),
    ];
    // A run waiting for a judgment is not finished, however old.
    let wf = env.write(
        "approve.yaml",
        r#"
id: t.approve
steps:
  - id: ask
    judgment:
      question: Refund?
      result_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
      executor: human
"#,
    );
    let (code, out) = env.json(&["run", wf.to_str().expect("utf8"), "--input", "{}"]);
    assert_eq!(code, 4, "{out}");
    let waiting = out["run"].as_str().expect("run").to_owned();

    // Nothing is that old yet.
    let (code, none) = env.json(&["gc", "--older-than", "1h"]);
    assert_eq!(code, 0, "{none}");
    assert_eq!(count(&none, "runs"), 0, "{none}");

    // The dry run says what would go, and nothing goes.
    let (code, dry) = env.json(&["gc", "--older-than", "0s", "--dry-run"]);
    assert_eq!(code, 0, "{dry}");
    assert_eq!(dry["dry_run"], json!(true));
    assert_eq!(count(&dry, "runs"), 2, "{dry}");
    assert!(
        count(&dry, "events") > 0 && count(&dry, "intents") > 0,
        "{dry}"
    );
    assert!(
        count(&dry, "blobs") >= 2 && count(&dry, "blob_bytes") > 0,
        "{dry}"
    );
    for run in &done {
        let (code, st) = env.json(&["status", run]);
        assert_eq!(code, 0, "still there after a dry run: {st}");
    }

    // The real one frees exactly that, and says so in words too.
    let out = env
        .cmd()
        .args(["gc", "--older-than", "0s"])
        .output()
        .expect("gc");
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!(
            "freed {} runs: {} events",
            count(&dry, "runs"),
            count(&dry, "events")
        )),
        "{said}"
    );
    for run in &done {
        assert_eq!(status_code(&env, run), Some(2), "{run} is gone");
    }
    // The waiting run is untouched and still takes its answer; the
    // versions stay.
    let (code, st) = env.json(&["status", &waiting]);
    assert_eq!(code, 0, "{st}");
    assert_eq!(st["run"]["status"], json!("waiting_judgment"));
    let (_, list) = env.json(&["judgment", "list"]);
    let id = list[0]["id"].as_str().expect("id").to_owned();
    let hash = list[0]["request_hash"].as_str().expect("hash").to_owned();
    let answer = env.write(
        "answer.json",
        &json!({"request_hash": hash, "result": {"ok": true}, "executor": "human", "provenance": {"judge": "ana"}}).to_string(),
    );
    let (code, out) = env.json(&[
        "judgment",
        "submit",
        &id,
        "--file",
        answer.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}");
    let (_, versions) = env.json(&["versions"]);
    let text = versions.to_string();
    assert!(
        text.contains("examples.text_report") && text.contains("t.approve"),
        "{versions}"
    );

    // Once more: nothing left but the run just finished, which is younger.
    let (_, again) = env.json(&["gc", "--older-than", "1h"]);
    assert_eq!(count(&again, "runs"), 0, "{again}");
}

#[test]
fn gc_takes_its_age_from_the_policy_or_asks_for_one() {
    let env = Env::new();
    let run = finished_run(&env, "hello");
    // Neither the command line nor the policy says how old: refused, saying how.
    let out = env.cmd().arg("gc").output().expect("gc");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--older-than") && err.contains("keep-finished-ms"),
        "{err}"
    );
    let (code, _) = env.json(&["status", &run]);
    assert_eq!(code, 0, "nothing deleted");

    env.write("policy.toml", "[retention]\nkeep-finished-ms = 1\n");
    std::thread::sleep(std::time::Duration::from_millis(5));
    let out = env
        .cmd()
        .args(["--json", "--policy", "policy.toml", "gc"])
        .output()
        .expect("gc");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(count(&report, "runs"), 1, "{report}");
    assert_eq!(
        status_code(&env, &run),
        Some(2),
        "deleted by the policy's age"
    );
}
