//! The crash matrix: a real `poimen` process runs a workflow and is killed
//! with SIGKILL at each injection point; a new process recovers the run. For
//! each point and each effect class the side-effect ledger must show each
//! effect exactly once (or, for a non-idempotent call whose outcome is
//! unknown, the run must block until an operator reconciles it), nothing
//! committed may be lost, and the episode must refold.
//!
//! Injection points exist only in test builds (feature `crash-points`, which
//! this package's dev-dependencies turn on) and fire only when
//! `POIMEN_CRASH_AT` names one.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::Env;

const POLICY: &str = r#"
[plugins.ledger]
fs-write = { "/ledger" = "./ledger" }

[plugins.ledger-idempotent]
fs-write = { "/ledger" = "./ledger" }
"#;

/// A workflow whose second tool call is the effect under test.
fn effect_workflow(tool: &str, args: &str) -> String {
    format!(
        r#"
id: t.crash
steps:
  - id: before
    tool: {{name: "text@^0.1", args: {{op: count, pattern: a, text: aaa}}}}
  - id: effect
    tool: {{name: "{tool}", args: {args}}}
    retry: {{max_attempts: 2}}
  - id: after
    tool: {{name: "json@^0.1", args: {{value: "{{{{ steps.effect.output }}}}", select: ""}}}}
transitions:
  - {{from: before, to: effect}}
  - {{from: effect, to: after}}
"#
    )
}

fn setup(env: &Env, workflow: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    env.write("policy.toml", POLICY);
    env.write("wf.yaml", workflow)
}

/// Runs `poimen run` until it reports the crash point, then SIGKILLs it.
/// Returns the run id.
fn run_and_kill(env: &Env, wf: &Path, point: &str, input: &str) -> String {
    let mut child = env
        .std_cmd()
        .args([
            "--policy",
            "policy.toml",
            "run",
            wf.to_str().expect("utf8"),
            "--input",
            input,
        ])
        .env("POIMEN_CRASH_AT", point)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn poimen");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel::<String>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(format!("out:{line}"));
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx2.send(format!("err:{line}"));
        }
    });
    let mut run = None;
    let mut seen = Vec::new();
    let marker = format!(
        "crash point `{}` reached",
        point.split(':').next().unwrap_or(point)
    );
    loop {
        match rx.recv_timeout(Duration::from_secs(240)) {
            Ok(line) => {
                if let Some(id) = line.strip_prefix("out:").filter(|l| l.starts_with("WFR-")) {
                    run = Some(id.to_owned());
                }
                if line.contains(&marker) {
                    break;
                }
                seen.push(line);
            }
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "poimen never reached `{point}`; it printed:\n{}",
                    seen.join("\n")
                );
            }
        }
    }
    // SIGKILL, exactly at the point.
    child.kill().expect("kill");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the process was killed");
    run.unwrap_or_else(|| {
        panic!(
            "no run id was printed before `{point}`: {}",
            seen.join("\n")
        )
    })
}

fn recover(env: &Env) -> Value {
    let (code, out) = env.json(&["--policy", "policy.toml", "recover"]);
    assert_eq!(code, 0, "{out}");
    out
}

fn status(env: &Env, run: &str) -> Value {
    env.json(&["status", run]).1
}

fn ledger_lines(env: &Env, file: &str) -> usize {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(env.path().join("ledger").join(file)) {
        f.read_to_string(&mut text).expect("read ledger");
    }
    text.lines().filter(|l| !l.is_empty()).count()
}

/// The run's episode refolds, and every tool call has its intent triple.
fn check_consistent(env: &Env, run: &str) {
    let (_, episode) = env.json(&["episode", run]);
    let ep: poimen::executor::Episode = serde_json::from_value(episode).expect("episode");
    poimen::executor::refold(&ep).expect("the episode refolds after recovery");
    let (_, audit) = env.json(&["audit", run]);
    assert_eq!(audit["incomplete"], json!([]), "dangling intents: {audit}");
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    Pure,
    Idempotent,
    NonIdempotent,
}

fn tool_of(class: Class) -> &'static str {
    match class {
        Class::Pure => "text@^0.1",
        Class::Idempotent => "ledger-idempotent@^0.1",
        Class::NonIdempotent => "ledger@^0.1",
    }
}

/// The effect step's tool call is the second of the run: `point:2`.
const POINTS: &[&str] = &[
    "before_pending",
    "after_pending",
    "after_dispatched",
    "before_committed",
    "after_committed",
];

fn one_case(class: Class, point: &str) {
    let env = Env::new();
    let args = match class {
        Class::Pure => "{op: count, pattern: b, text: bbb}",
        _ => r#"{entry: {n: "{{ inputs.n }}"}}"#,
    };
    let wf = setup(&env, &effect_workflow(tool_of(class), args));
    let run = run_and_kill(&env, &wf, &format!("{point}:2"), r#"{"n": 1}"#);
    recover(&env);
    let st = status(&env, &run);
    let run_status = st["run"]["status"].as_str().expect("status").to_owned();
    let blocked_expected =
        class == Class::NonIdempotent && matches!(point, "after_dispatched" | "before_committed");
    if blocked_expected {
        // The outcome is unknown: never replayed automatically.
        assert_eq!(run_status, "blocked", "{class:?} at {point}: {st}");
        assert!(
            st["run"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("outcome_unknown"),
            "{st}"
        );
        // Recovering again changes nothing.
        recover(&env);
        assert_eq!(status(&env, &run)["run"]["status"], json!("blocked"));
        let lines = ledger_lines(&env, "ledger.jsonl");
        if point == "after_dispatched" {
            // The guest was never called: the operator says so, the retry runs it once.
            assert_eq!(lines, 0);
            let (code, out) = env.json(&[
                "--policy",
                "policy.toml",
                "reconcile",
                &run,
                "effect",
                "--failed",
                "the ledger has no entry",
            ]);
            assert_eq!(code, 0, "{out}");
            assert_eq!(out["status"], json!("completed"), "{out}");
        } else {
            // The guest ran: the operator records what it did.
            assert_eq!(lines, 1);
            let (code, out) = env.json(&[
                "--policy",
                "policy.toml",
                "reconcile",
                &run,
                "effect",
                "--committed",
                r#"{"appended": true, "lines": 1}"#,
            ]);
            assert_eq!(code, 0, "{out}");
            assert_eq!(out["status"], json!("completed"), "{out}");
        }
    } else {
        assert_eq!(run_status, "completed", "{class:?} at {point}: {st}");
    }
    let expected_lines = if class == Class::Pure { 0 } else { 1 };
    assert_eq!(
        ledger_lines(&env, "ledger.jsonl"),
        expected_lines,
        "{class:?} at {point}: each effect exactly once"
    );
    check_consistent(&env, &run);
    // Nothing committed before the crash was lost: `before` ran exactly once.
    let (_, audit) = env.json(&["audit", &run]);
    let before_calls = audit["tool_calls"]
        .as_array()
        .expect("calls")
        .iter()
        .filter(|c| c["step"] == json!("before"))
        .count();
    assert_eq!(before_calls, 1, "{audit}");
}

#[test]
fn crash_matrix_pure_tool() {
    for p in POINTS {
        one_case(Class::Pure, p);
    }
}

#[test]
fn crash_matrix_idempotent_tool() {
    for p in POINTS {
        one_case(Class::Idempotent, p);
    }
}

#[test]
fn crash_matrix_non_idempotent_tool() {
    for p in POINTS {
        one_case(Class::NonIdempotent, p);
    }
}

#[test]
fn crash_in_the_middle_of_a_fanout() {
    let env = Env::new();
    let wf = setup(
        &env,
        r#"
id: t.fan
steps:
  - id: fan
    parallel: {branches: [a, b, c]}
  - id: a
    tool: {name: "ledger-idempotent@^0.1", args: {file: a.jsonl, entry: a}}
  - id: b
    tool: {name: "ledger-idempotent@^0.1", args: {file: b.jsonl, entry: b}}
  - id: c
    tool: {name: "ledger-idempotent@^0.1", args: {file: c.jsonl, entry: c}}
"#,
    );
    let run = run_and_kill(&env, &wf, "after_committed:1", "{}");
    recover(&env);
    assert_eq!(status(&env, &run)["run"]["status"], json!("completed"));
    for f in ["a.jsonl", "b.jsonl", "c.jsonl"] {
        assert_eq!(ledger_lines(&env, f), 1, "{f}");
    }
    check_consistent(&env, &run);
}

#[test]
fn crash_inside_a_sub_workflow() {
    let env = Env::new();
    let child = env.write(
        "child.yaml",
        r#"
id: t.child
steps:
  - id: write
    tool: {name: "ledger-idempotent@^0.1", args: {entry: child}}
"#,
    );
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    env.write("policy.toml", POLICY);
    let (code, out) = env.json(&[
        "--policy",
        "policy.toml",
        "publish",
        child.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}");
    let wf = env.write(
        "parent.yaml",
        r#"
id: t.parent
steps:
  - id: call
    workflow: {id: t.child}
"#,
    );
    let run = run_and_kill(&env, &wf, "after_dispatched:1", "{}");
    recover(&env);
    let st = status(&env, &run);
    assert_eq!(st["run"]["status"], json!("completed"), "{st}");
    assert_eq!(ledger_lines(&env, "ledger.jsonl"), 1);
    check_consistent(&env, &run);
}

#[test]
fn crash_while_waiting_for_a_judgment() {
    let env = Env::new();
    let wf = setup(
        &env,
        r#"
id: t.judged
steps:
  - id: ask
    judgment:
      question: "go?"
      result_schema: {type: boolean}
  - id: write
    tool: {name: "ledger-idempotent@^0.1", args: {entry: "{{ steps.ask.output }}"}}
transitions:
  - {from: ask, to: write}
"#,
    );
    let run = run_and_kill(&env, &wf, "waiting_judgment:1", "{}");
    recover(&env);
    assert_eq!(
        status(&env, &run)["run"]["status"],
        json!("waiting_judgment")
    );
    let (_, list) = env.json(&["judgment", "list"]);
    let id = list[0]["id"].as_str().expect("id").to_owned();
    let answer = env.write(
        "answer.json",
        &json!({"request_hash": list[0]["request_hash"], "result": true, "provenance": {"judge": "ops"}}).to_string(),
    );
    let (code, out) = env.json(&[
        "--policy",
        "policy.toml",
        "judgment",
        "submit",
        &id,
        "--file",
        answer.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"], json!("completed"));
    assert_eq!(ledger_lines(&env, "ledger.jsonl"), 1);
    check_consistent(&env, &run);
}
