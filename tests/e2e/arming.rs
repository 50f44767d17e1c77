//! Arming and retirement through the CLI: a workflow starts only on its
//! armed version once one is armed, a disarmed workflow starts nothing,
//! and each `unload` policy decides what becomes of the live runs of the
//! version that stops being armed.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::Env;

/// A workflow whose runs wait for a judgment: live until answered.
fn gate(unload: &str, description: &str) -> String {
    format!(
        r#"
id: t.gate
description: {description}
unload: {unload}
steps:
  - id: ask
    judgment:
      question: Ship it?
      result_schema: {{type: object, properties: {{ok: {{type: boolean}}}}, required: [ok]}}
"#
    )
}

fn stderr_of(env: &Env, args: &[&str]) -> (i32, String) {
    let out = env.cmd().args(args).output().expect("run poimen");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn publish(env: &Env, file: &str, text: &str) -> String {
    let path = env.write(file, text);
    let (code, out) = env.json(&["publish", path.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}");
    out["version"].as_str().expect("version").to_owned()
}

/// Starts a run of the armed version; it waits for its judgment.
fn waiting_run(env: &Env) -> String {
    let (code, out) = env.json(&["run", "t.gate", "--input", "{}"]);
    assert_eq!(code, 4, "{out}");
    assert_eq!(out["status"], json!("waiting_judgment"), "{out}");
    out["run"].as_str().expect("run").to_owned()
}

fn status(env: &Env, run: &str) -> Value {
    let (code, out) = env.json(&["status", run]);
    assert_eq!(code, 0, "{out}");
    out["run"].clone()
}

#[test]
fn only_the_armed_version_starts_and_a_disarmed_workflow_starts_nothing() {
    let env = Env::new();
    let v1 = publish(&env, "v1.yaml", &gate("{policy: cancel}", "first"));

    // Published, never armed: started by id, it says what to do.
    let (code, err) = stderr_of(&env, &["run", "t.gate", "--input", "{}"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("none is armed") && err.contains("poimen arm t.gate@"),
        "{err}"
    );

    let (code, armed) = env.json(&["arm", "t.gate@latest"]);
    assert_eq!(code, 0, "{armed}");
    assert_eq!(armed["version"], json!(v1));
    assert_eq!(armed["previous"], Value::Null);
    let live = waiting_run(&env);
    assert_eq!(status(&env, &live)["version"], json!(v1));
    let (_, versions) = env.json(&["versions", "t.gate"]);
    assert_eq!(versions[0]["armed"], json!(true), "{versions}");

    // A version of another workflow is not this one's.
    let other = publish(
        &env,
        "other.yaml",
        "id: t.other\nsteps:\n  - id: a\n    tool: {name: \"text@^0.1\", args: {op: count, pattern: a, text: aa}}\n",
    );
    let (code, err) = stderr_of(&env, &["arm", &format!("t.gate@{other}")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is a version of `t.other`, not of `t.gate`"),
        "{err}"
    );

    // Disarmed: its live run is retired (`cancel`), and nothing starts —
    // by id, by version, or from a file.
    let (code, disarmed) = env.json(&["disarm", "t.gate"]);
    assert_eq!(code, 0, "{disarmed}");
    assert_eq!(disarmed["version"], Value::Null);
    assert_eq!(
        disarmed["retired"],
        json!([{"run": live, "version": v1, "action": {"policy": "cancelled"}}])
    );
    let run = status(&env, &live);
    assert_eq!(run["status"], json!("cancelled"));
    let reason = run["reason"].as_str().expect("reason");
    assert!(
        reason.contains("unloaded") && reason.contains("`t.gate` was disarmed"),
        "{reason}"
    );
    for target in ["t.gate", v1.as_str(), "v1.yaml"] {
        let (code, err) = stderr_of(&env, &["run", target, "--input", "{}"]);
        assert_eq!(code, 2, "{target}: {err}");
        assert!(
            err.contains("`t.gate` is disarmed") && err.contains("poimen arm t.gate@VERSION"),
            "{target}: {err}"
        );
    }
    let (_, versions) = env.json(&["versions", "t.gate"]);
    assert_eq!(versions[0]["armed"], json!(false), "{versions}");

    // Armed again (by an abbreviation), it starts.
    let (code, armed) = env.json(&["arm", &format!("t.gate@{}", &v1[..12])]);
    assert_eq!(code, 0, "{armed}");
    assert_eq!(armed["previous"]["version"], Value::Null);
    waiting_run(&env);
}

#[test]
fn each_unload_policy_decides_what_becomes_of_the_live_runs_of_the_old_version() {
    for (unload, expect) in [
        ("{policy: cancel}", "cancelled"),
        ("{policy: detach}", "detached"),
        ("{policy: drain}", "draining"),
    ] {
        let env = Env::new();
        let v1 = publish(&env, "v1.yaml", &gate(unload, "first"));
        env.json(&["arm", &format!("t.gate@{v1}")]);
        let live = waiting_run(&env);
        let v2 = publish(&env, "v2.yaml", &gate(unload, "second"));
        let (code, armed) = env.json(&["arm", &format!("t.gate@{v2}")]);
        assert_eq!(code, 0, "{unload}: {armed}");
        assert_eq!(armed["previous"]["version"], json!(v1), "{unload}");
        assert_eq!(armed["retired"][0]["run"], json!(live), "{unload}: {armed}");
        assert_eq!(
            armed["retired"][0]["action"]["policy"],
            json!(expect),
            "{unload}: {armed}"
        );
        let run = status(&env, &live);
        match expect {
            "cancelled" => {
                assert_eq!(run["status"], json!("cancelled"), "{unload}");
                let reason = run["reason"].as_str().expect("reason");
                assert!(reason.contains(&format!("{v2} was armed")), "{reason}");
            }
            _ => {
                // Left alone, on the version it pinned.
                assert_eq!(run["status"], json!("waiting_judgment"), "{unload}");
                assert_eq!(run["version"], json!(v1), "{unload}");
            }
        }
        // New runs start on the armed version; the old one no longer starts.
        let fresh = waiting_run(&env);
        assert_eq!(status(&env, &fresh)["version"], json!(v2), "{unload}");
    }
}

#[test]
fn a_drain_with_a_timeout_cancels_what_is_still_live_when_it_passes_on_whichever_host_serves() {
    let env = Env::new();
    let v1 = publish(
        &env,
        "v1.yaml",
        &gate("{policy: drain, timeout: 1s}", "first"),
    );
    env.json(&["arm", &format!("t.gate@{v1}")]);
    let live = waiting_run(&env);
    let v2 = publish(
        &env,
        "v2.yaml",
        &gate("{policy: drain, timeout: 1s}", "second"),
    );
    let (code, armed) = env.json(&["arm", &format!("t.gate@{v2}")]);
    assert_eq!(code, 0, "{armed}");
    let action = &armed["retired"][0]["action"];
    assert_eq!(action["policy"], json!("draining"), "{armed}");
    assert!(action["deadline"].as_i64().is_some(), "{armed}");
    // The deadline is in the store: a host started afterwards, which never
    // saw the arming, cancels the run once it passes.
    assert_eq!(status(&env, &live)["status"], json!("waiting_judgment"));
    let served = env.serve(&[], "drainer");
    let start = Instant::now();
    let run = loop {
        let run = status(&env, &live);
        // (`running` for a moment, if the host resumes the run to stop it.)
        let waiting =
            run["status"] == json!("waiting_judgment") || run["status"] == json!("running");
        if !waiting || start.elapsed() > Duration::from_secs(30) {
            break run;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(run["status"], json!("cancelled"), "{run}\n{}", served.log());
    let reason = run["reason"].as_str().expect("reason");
    assert!(reason.contains("drain timeout passed"), "{reason}");
}
