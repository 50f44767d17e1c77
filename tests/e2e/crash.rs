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
pub(crate) fn effect_workflow(tool: &str, args: &str) -> String {
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

pub(crate) fn setup(env: &Env, workflow: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    env.write("policy.toml", POLICY);
    env.write("wf.yaml", workflow)
}

/// Runs `poimen run` until it reports the crash point, then SIGKILLs it.
/// Returns the run id.
pub(crate) fn run_and_kill(env: &Env, wf: &Path, point: &str, input: &str) -> String {
    run_and_kill_with(env, &[], wf, point, input)
}

/// [`run_and_kill`] with more global arguments (a model endpoint).
fn run_and_kill_with(env: &Env, global: &[&str], wf: &Path, point: &str, input: &str) -> String {
    let mut child = env
        .std_cmd()
        .args(["--policy", "policy.toml"])
        .args(global)
        .args(["run", wf.to_str().expect("utf8"), "--input", input])
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
                    // The crash point holds only the driving task: the run
                    // id may still be on its way (another thread prints it,
                    // another pipe carries it). Wait for it, then kill.
                    while run.is_none() {
                        match rx.recv_timeout(Duration::from_secs(30)) {
                            Ok(l) => {
                                if let Some(id) =
                                    l.strip_prefix("out:").filter(|l| l.starts_with("WFR-"))
                                {
                                    run = Some(id.to_owned());
                                }
                                seen.push(l);
                            }
                            Err(_) => break,
                        }
                    }
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

pub(crate) fn recover(env: &Env) -> Value {
    let (code, out) = env.json(&["--policy", "policy.toml", "recover"]);
    assert_eq!(code, 0, "{out}");
    out
}

/// The output `workflow` ends with on `{"n": 1}` when nothing crashes.
fn uncrashed_output(workflow: &str) -> Value {
    let clean = Env::new();
    let wf = setup(&clean, workflow);
    let (code, out) = clean.json(&[
        "--policy",
        "policy.toml",
        "run",
        wf.to_str().expect("utf8"),
        "--input",
        r#"{"n": 1}"#,
    ]);
    assert_eq!(code, 0, "{out}");
    let expected = status(&clean, out["run"].as_str().expect("run id"))["state"]["output"].clone();
    assert!(!expected.is_null(), "{out}");
    expected
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
fn crash_with_an_unwritten_effect_free_tail() {
    // Issue 44: effect-free records are held unwritten until the next
    // commit that must be durable: here `before`'s records, then the
    // non-idempotent `effect`'s `Pending`, then `after`'s records once the
    // effect is committed. A crash at each of the first three holds loses
    // that tail and nothing else: the run ends with the output
    // an uncrashed run gives, the effect made once, `before` recorded
    // once, the episode refolding.
    let expected = uncrashed_output(&effect_workflow(
        "ledger@^0.1",
        r#"{entry: {n: "{{ inputs.n }}"}}"#,
    ));
    for nth in 1..=3 {
        let env = Env::new();
        let wf = setup(
            &env,
            &effect_workflow("ledger@^0.1", r#"{entry: {n: "{{ inputs.n }}"}}"#),
        );
        let run = run_and_kill(
            &env,
            &wf,
            &format!("with_unwritten_tail:{nth}"),
            r#"{"n": 1}"#,
        );
        recover(&env);
        let st = status(&env, &run);
        assert_eq!(st["run"]["status"], json!("completed"), "tail {nth}: {st}");
        assert_eq!(st["state"]["output"], expected, "tail {nth}: {st}");
        assert_eq!(
            ledger_lines(&env, "ledger.jsonl"),
            1,
            "tail {nth}: the effect once"
        );
        check_consistent(&env, &run);
        let (_, audit) = env.json(&["audit", &run]);
        for step in ["before", "effect", "after"] {
            let calls = audit["tool_calls"]
                .as_array()
                .expect("calls")
                .iter()
                .filter(|c| c["step"] == json!(step))
                .count();
            assert_eq!(calls, 1, "tail {nth}: `{step}` recorded once: {audit}");
        }
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
fn crash_between_a_one_request_run_and_its_answer() {
    // Issue 44: `POST /v1/runs?wait=` answers after the run's final
    // commit. A host killed between that commit and its answer leaves a
    // run that ended and a caller with no answer; the caller's retry under
    // the same idempotency key, on the next host, is answered with that
    // run — its id, its output, the effect made once, the episode
    // refolding.
    let workflow = effect_workflow("ledger@^0.1", r#"{entry: {n: "{{ inputs.n }}"}}"#);
    let expected = uncrashed_output(&workflow);

    let env = Env::new();
    setup(&env, &workflow);
    let global = ["--policy", "policy.toml"];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let run = rt.block_on(async {
        let http = reqwest::Client::new();
        let body = |version: &str| {
            json!({"workflow": version, "input": {"n": 1}, "idempotency_key": "one-request"})
        };
        let (served, api) =
            crate::http::serve_http_with(&env, &global, &[], &[("POIMEN_CRASH_AT", "before_answer")]);
        let version = crate::http::publish(&http, &api, &workflow).await;
        let first = tokio::spawn(
            http.post(format!("{api}/runs?wait=60"))
                .bearer_auth("e2e-token")
                .json(&body(&version))
                .send(),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !served.log().contains("crash point `before_answer` reached") {
            assert!(
                std::time::Instant::now() < deadline,
                "the crash point was never reached:\n{}",
                served.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        served.signal("-KILL");
        drop(served);
        let unanswered = first.await.expect("the request task");
        assert!(unanswered.is_err(), "the killed host answered: {unanswered:?}");

        let (served, api) = crate::http::serve_http(&env, &global, &[]);
        let again = http
            .post(format!("{api}/runs?wait=60"))
            .bearer_auth("e2e-token")
            .json(&body(&version))
            .send()
            .await
            .expect("the retry");
        assert_eq!(again.status(), 201, "{}", served.log());
        let answer: Value = again.json().await.expect("JSON");
        assert_eq!(answer["status"], json!("completed"), "{answer}");
        assert_eq!(answer["output"], expected, "{answer}");
        answer["id"].as_str().expect("id").to_owned()
    });
    assert_eq!(ledger_lines(&env, "ledger.jsonl"), 1, "the effect once");
    assert_eq!(status(&env, &run)["state"]["output"], expected);
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

// ------------------------------------------ model calls and child runs

/// A local OpenAI-compatible endpoint that answers every chat completion
/// with `answer` and counts the requests it receives.
struct ModelServer {
    url: String,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ModelServer {
    fn start(answer: &'static str) -> ModelServer {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut length = 0usize;
                let mut line = String::new();
                let mut first = true;
                let mut is_completion = false;
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    if first {
                        is_completion = line.contains("/chat/completions");
                        first = false;
                    }
                    let l = line.trim_end();
                    if l.is_empty() {
                        break;
                    }
                    if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                if is_completion {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                let reply = json!({
                    "id": "c1",
                    "object": "chat.completion",
                    "model": "fake-model",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                })
                .to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            }
        });
        ModelServer { url, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

const MODEL_WORKFLOW: &str = r#"
id: t.asked
steps:
  - id: ask
    model: {prompt: "Summarize {{ inputs.text }}"}
  - id: after
    tool: {name: "json@^0.1", args: {value: "{{ steps.ask.output }}", select: ""}}
transitions:
  - {from: ask, to: after}
"#;

fn model_requests(env: &Env, run: &str) -> Vec<Value> {
    let (_, episode) = env.json(&["episode", run]);
    episode["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["event"] == json!("model_requested"))
        .cloned()
        .collect()
}

#[test]
fn crash_after_a_model_answer_is_committed_never_asks_again() {
    let server = ModelServer::start("a short summary");
    let env = Env::new();
    let wf = setup(&env, MODEL_WORKFLOW);
    let global = ["--model", server.url.as_str(), "--model-name", "fake-model"];
    let run = run_and_kill_with(
        &env,
        &global,
        &wf,
        "after_model_committed:1",
        r#"{"text": "a long text"}"#,
    );
    assert_eq!(server.requests(), 1);
    let mut args = global.to_vec();
    args.extend(["--policy", "policy.toml", "recover"]);
    let (code, out) = env.json(&args);
    assert_eq!(code, 0, "{out}");
    let st = status(&env, &run);
    assert_eq!(st["run"]["status"], json!("completed"), "{st}");
    // The committed answer was reused: the endpoint saw exactly one request.
    assert_eq!(server.requests(), 1);
    assert_eq!(st["state"]["output"], json!("a short summary"));
    assert_eq!(model_requests(&env, &run).len(), 1);
    check_consistent(&env, &run);
}

#[test]
fn crash_before_a_model_answer_is_committed_asks_again_as_a_reask() {
    let server = ModelServer::start("a short summary");
    let env = Env::new();
    let wf = setup(&env, MODEL_WORKFLOW);
    let global = ["--model", server.url.as_str(), "--model-name", "fake-model"];
    let run = run_and_kill_with(
        &env,
        &global,
        &wf,
        "before_model_committed:1",
        r#"{"text": "a long text"}"#,
    );
    assert_eq!(server.requests(), 1);
    let mut args = global.to_vec();
    args.extend(["--policy", "policy.toml", "recover"]);
    let (code, out) = env.json(&args);
    assert_eq!(code, 0, "{out}");
    assert_eq!(status(&env, &run)["run"]["status"], json!("completed"));
    // The answer was lost with the host: asked once more, and recorded so.
    // The re-ask's tokens are charged; the lost answer's usage died with
    // the host (nothing recorded it), which the re-ask's record says.
    assert_eq!(server.requests(), 2);
    let requests = model_requests(&env, &run);
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].get("reask"), None);
    assert_eq!(requests[1]["reask"], json!(true));
    assert_eq!(requests[0]["request_hash"], requests[1]["request_hash"]);
    let (_, episode) = env.json(&["episode", &run]);
    let answers: Vec<&Value> = episode["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["event"] == json!("model_called"))
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(
        answers[0]["usage"],
        json!({"tokens_in": 3, "tokens_out": 2}),
        "the server's usage of the re-ask"
    );
    let st = status(&env, &run);
    assert_eq!(st["state"]["spent"]["tokens"], json!(5), "{st}");
    check_consistent(&env, &run);
}

#[test]
fn crash_between_creating_a_child_run_and_linking_it_makes_exactly_one_child() {
    let env = Env::new();
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    env.write("policy.toml", POLICY);
    let child = env.write(
        "child.yaml",
        "id: t.child\nsteps:\n  - id: write\n    tool: {name: \"ledger-idempotent@^0.1\", args: {entry: child}}\n",
    );
    let (code, out) = env.json(&[
        "--policy",
        "policy.toml",
        "publish",
        child.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}");
    let wf = env.write(
        "parent.yaml",
        "id: t.parent\nsteps:\n  - id: call\n    workflow: {id: t.child}\n",
    );
    let run = run_and_kill(&env, &wf, "after_child_created:1", "{}");
    recover(&env);
    let st = status(&env, &run);
    assert_eq!(st["run"]["status"], json!("completed"), "{st}");
    // Exactly one child run exists, and it is the linked one.
    let (_, runs) = env.json(&["status", "--limit", "100"]);
    let children: Vec<&Value> = runs
        .as_array()
        .expect("runs")
        .iter()
        .filter(|r| r["workflow_id"] == json!("t.child"))
        .collect();
    assert_eq!(children.len(), 1, "{runs}");
    assert_eq!(
        st["state"]["steps"]["call"]["child"]["run"], children[0]["id"],
        "{st}"
    );
    assert_eq!(ledger_lines(&env, "ledger.jsonl"), 1);
    check_consistent(&env, &run);
}

#[test]
fn cancelling_a_blocked_run_claims_no_certainty_about_the_unknown_call() {
    let env = Env::new();
    let wf = setup(
        &env,
        &effect_workflow(
            tool_of(Class::NonIdempotent),
            r#"{entry: {n: "{{ inputs.n }}"}}"#,
        ),
    );
    let run = run_and_kill(&env, &wf, "before_committed:2", r#"{"n": 1}"#);
    recover(&env);
    assert_eq!(status(&env, &run)["run"]["status"], json!("blocked"));
    let (code, out) = env.json(&["--policy", "policy.toml", "cancel", &run]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"], json!("cancelled"));
    let (_, audit) = env.json(&["audit", &run]);
    let effect: Vec<&Value> = audit["intents"]
        .as_array()
        .expect("intents")
        .iter()
        .filter(|i| i["step"] == json!("effect"))
        .collect();
    let last = effect.last().expect("an intent");
    // The call was dispatched and its outcome never recorded: the record
    // says the outcome is unknown, not that it failed.
    assert_eq!(last["phase"], json!("abandoned"), "{audit}");
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|e| e.contains("outcome unknown")),
        "{last}"
    );
    assert_eq!(audit["incomplete"], json!([]), "{audit}");
    // And the guest did run once: the ledger has the line nobody accounted for.
    assert_eq!(ledger_lines(&env, "ledger.jsonl"), 1);
}

#[test]
fn crash_after_a_workflow_called_as_a_tool_started_its_child_makes_exactly_one_child() {
    let env = Env::new();
    std::fs::create_dir_all(env.path().join("ledger")).expect("ledger dir");
    env.write("policy.toml", POLICY);
    let tool = env.write(
        "refund.yaml",
        r#"
id: t.refund
tool: {name: billing.refund, description: Refunds an amount once.}
inputs: {type: object, properties: {n: {type: integer}}, required: [n]}
steps:
  - id: write
    tool: {name: "ledger-idempotent@^0.1", args: {entry: {refund: "{{ inputs.n }}"}}}
"#,
    );
    let (code, out) = env.json(&[
        "--policy",
        "policy.toml",
        "publish",
        tool.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}");
    let wf = env.write(
        "caller.yaml",
        "id: t.caller\nsteps:\n  - id: refund\n    tool: {name: billing.refund, args: {n: 7}}\n",
    );
    let run = run_and_kill(&env, &wf, "after_child_created:1", "{}");
    recover(&env);
    let st = status(&env, &run);
    assert_eq!(st["run"]["status"], json!("completed"), "{st}");
    let (_, runs) = env.json(&["status", "--limit", "100"]);
    let children: Vec<&Value> = runs
        .as_array()
        .expect("runs")
        .iter()
        .filter(|r| r["workflow_id"] == json!("t.refund"))
        .collect();
    assert_eq!(children.len(), 1, "exactly one child: {runs}");
    assert_eq!(
        st["state"]["steps"]["refund"]["child"]["run"], children[0]["id"],
        "{st}"
    );
    // The effect inside happened once.
    assert_eq!(ledger_lines(&env, "ledger.jsonl"), 1);
    check_consistent(&env, &run);
}
