//! The host's one policy file as an operator meets it through the CLI:
//! what it says of workflows and runs holds (durability default, enabled
//! ids, custom definitions, bounds, judgment executors, state mutations),
//! and a bad value is refused naming its line.

use serde_json::{Value, json};

use crate::support::{Env, fixture};

const TEXT_REPORT: &str = "examples/text-report.yaml";

fn input() -> String {
    json!({"text": "Please refund $40 to ana@example.com"}).to_string()
}

/// `poimen --policy policy.toml ARGS…` with its JSON output.
fn with_policy(env: &Env, args: &[&str]) -> (i32, Value, String) {
    let out = env
        .cmd()
        .args(["--json", "--policy", "policy.toml"])
        .args(args)
        .output()
        .expect("run poimen");
    let code = out.status.code().unwrap_or(-1);
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (code, v, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_workflow_that_does_not_say_durable_takes_the_policys_durability() {
    let env = Env::new();
    env.write("policy.toml", "[durability]\nwork = \"ephemeral\"\n");
    let report = fixture(TEXT_REPORT);
    let (code, out, err) = with_policy(
        &env,
        &["run", report.to_str().expect("utf8"), "--input", &input()],
    );
    assert_eq!(code, 0, "{out} {err}");
    let ephemeral = out["run"].as_str().expect("run").to_owned();
    // Its run lived in that process's memory only: gone with it.
    let (code, _, err) = with_policy(&env, &["status", &ephemeral]);
    assert_eq!(code, 2, "an ephemeral run is not in the store: {err}");
    let (_, listed, _) = with_policy(&env, &["status"]);
    assert_eq!(listed, json!([]), "no run was stored");

    // `durable: true` is durable whatever the default.
    let text = std::fs::read_to_string(&report).expect("read");
    let durable = env.write(
        "durable.yaml",
        &text.replace("schema: 1\n", "schema: 1\ndurable: true\n"),
    );
    let (code, out, err) = with_policy(
        &env,
        &["run", durable.to_str().expect("utf8"), "--input", &input()],
    );
    assert_eq!(code, 0, "{out} {err}");
    let kept = out["run"].as_str().expect("run").to_owned();
    let (code, status, err) = with_policy(&env, &["status", &kept]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(status["run"]["status"], json!("completed"));

    // Without a policy, the same workflow is durable (the default default).
    let (code, out) = env.json(&["run", report.to_str().expect("utf8"), "--input", &input()]);
    assert_eq!(code, 0, "{out}");
    let (code, _) = env.json(&["status", out["run"].as_str().expect("run")]);
    assert_eq!(code, 0);
}

#[test]
fn a_workflow_that_breaks_the_policys_rules_is_refused_at_load_naming_each() {
    let env = Env::new();
    std::fs::create_dir(env.path().join("ledger")).expect("mkdir");
    env.write(
        "policy.toml",
        r#"
[plugins.ledger]
fs-write = { "/ledger" = "ledger" }

[workflows]
allow-state-mutations = false

[judgment]
executors = ["human"]
on-timeout = { answer = { ok = "yes" } }

[bounds]
max-attempts = 2
max-backoff-ms = 1000
"#,
    );
    let wf = env.write(
        "breaks.yaml",
        r#"
id: t.breaks
steps:
  - id: fetch
    tool: {name: "text@^0.1", args: {op: count, pattern: a, text: aaa}}
    retry: {max_attempts: 3, backoff: 800ms, factor: 2}
  - id: ask
    judgment:
      question: Fine?
      result_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
      executor: robot
  - id: charge
    tool: {name: "ledger@^0.1", args: {entry: {n: 1}}}
transitions:
  - {from: fetch, to: ask}
  - {from: ask, to: charge}
"#,
    );
    for verb in ["validate", "run"] {
        let mut args = vec![verb, wf.to_str().expect("utf8")];
        if verb == "run" {
            args.extend(["--input", "{}"]);
        }
        let (code, out, err) = with_policy(&env, &args);
        // `validate --json` reports in its document, `run` on stderr.
        let err = format!("{out}\n{err}");
        assert_eq!(code, 3, "{verb}: {err}");
        for words in [
            "step `fetch` allows 3 attempts; the policy's `[bounds] max-attempts` is 2",
            "step `fetch` may back off up to 1600 ms",
            "judgment step `ask` asks executor `robot`",
            "judgment step `ask` would take the policy's `[judgment] on-timeout` answer",
            "step `charge` can change the world (`ledger` is non-idempotent)",
        ] {
            assert!(err.contains(words), "{verb}: missing {words:?} in:\n{err}");
        }
    }
    // Nothing of it was published or run.
    let (_, versions, _) = with_policy(&env, &["versions"]);
    assert_eq!(versions, json!([]), "{versions}");
}

#[test]
fn only_enabled_workflows_start_and_custom_definitions_can_be_refused() {
    let env = Env::new();
    let report = fixture(TEXT_REPORT);
    let report = report.to_str().expect("utf8");
    let other = env.write(
        "other.yaml",
        "id: t.other\nsteps:\n  - id: a\n    tool: {name: \"text@^0.1\", args: {op: count, pattern: a, text: aa}}\n",
    );
    env.write(
        "policy.toml",
        "[workflows]\nenabled-ids = [\"examples.text_report\"]\n",
    );
    let (code, _, err) = with_policy(
        &env,
        &["run", other.to_str().expect("utf8"), "--input", "{}"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`t.other` is not among the policy's `[workflows] enabled-ids`"),
        "{err}"
    );
    let (code, _, err) = with_policy(&env, &["run", report, "--input", &input()]);
    assert_eq!(code, 0, "an enabled id runs: {err}");

    // No custom definitions: a file may be published by the operator, but
    // a run starts only from a published version.
    env.write(
        "policy.toml",
        "[workflows]\nallow-custom-definitions = false\n",
    );
    let (code, _, err) = with_policy(&env, &["run", report, "--input", &input()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("allow-custom-definitions = false"), "{err}");
    let (code, published, err) = with_policy(&env, &["publish", report]);
    assert_eq!(code, 0, "{err}");
    let version = published["version"].as_str().expect("version").to_owned();
    // Published is not armed: only the armed version starts.
    let (code, _, err) = with_policy(&env, &["run", &version, "--input", &input()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("may start only on its armed version"), "{err}");
    let (code, _, err) = with_policy(&env, &["arm", &format!("examples.text_report@{version}")]);
    assert_eq!(code, 0, "{err}");
    for target in [version.as_str(), "examples.text_report"] {
        let (code, out, err) = with_policy(&env, &["run", target, "--input", &input()]);
        assert_eq!(code, 0, "{target}: {out} {err}");
    }

    // Workflows off: nothing starts.
    env.write("policy.toml", "[workflows]\nenabled = false\n");
    let (code, _, err) = with_policy(&env, &["run", &version, "--input", &input()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("enabled = false"), "{err}");
}

#[test]
fn a_bad_policy_value_is_refused_naming_its_line() {
    let env = Env::new();
    env.write(
        "policy.toml",
        "[workflows]\nenabled = true\n\n[judgment]\ntimeout-ms = 0\n",
    );
    let (code, _, err) = with_policy(&env, &["validate", &fixture(TEXT_REPORT).to_string_lossy()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("line 5") && err.contains("timeout-ms"),
        "{err}"
    );
    env.write("policy.toml", "[workflow]\nenabled = true\n");
    let (code, _, err) = with_policy(&env, &["validate", &fixture(TEXT_REPORT).to_string_lossy()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("line 1") && err.contains("unknown field"),
        "{err}"
    );
}

#[test]
fn a_tool_step_timeout_the_sandbox_cannot_honour_is_refused_at_load() {
    let env = Env::new();
    env.write("policy.toml", "[plugins.text.limits]\ntimeout-ms = 2000\n");
    let wf = env.write(
        "slow.yaml",
        "id: t.slow\nsteps:\n  - id: count\n    timeout: 5s\n    tool: {name: \"text@^0.1\", args: {op: count, pattern: a, text: aa}}\n",
    );
    let wf = wf.to_str().expect("utf8");
    let (code, out, err) = with_policy(&env, &["validate", wf]);
    assert_eq!(code, 3, "{out} {err}");
    assert_eq!(
        out[0]["errors"],
        json!([{"code": "timeout_above_policy", "step": "count", "tool": "text@^0.1", "timeout_ms": 5000, "max_ms": 2000}]),
        "{out}"
    );
    let said = env
        .cmd()
        .args(["--policy", "policy.toml", "validate", wf])
        .output()
        .expect("run poimen");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&said.stdout),
        String::from_utf8_lossy(&said.stderr)
    );
    assert!(
        said.contains("step `count` has a timeout of 5000 ms")
            && said.contains("lets `text@^0.1` run at most 2000 ms a call"),
        "{said}"
    );
    // Within the maximum it loads and runs; another component's limit is
    // not this one's.
    env.write("policy.toml", "[plugins.text.limits]\ntimeout-ms = 5000\n");
    let (code, out, err) = with_policy(&env, &["run", wf, "--input", "{}"]);
    assert_eq!(code, 0, "{out} {err}");
}

#[test]
fn a_workflow_registered_as_a_tool_is_called_from_another_and_its_name_must_be_free() {
    let env = Env::new();
    let counter = env.write(
        "count.yaml",
        r#"
id: t.count
tool: {description: Counts the a's of a text.}
inputs: {type: object, properties: {text: {type: string}}, required: [text]}
steps:
  - id: count
    tool: {name: "text@^0.1", args: {op: count, pattern: a, text: "{{ inputs.text }}"}}
"#,
    );
    let (code, out) = env.json(&["publish", counter.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}");

    // A tool step of another workflow calls it by name: a child run.
    let caller = env.write(
        "caller.yaml",
        "id: t.caller\nsteps:\n  - id: ask\n    tool: {name: t.count, args: {text: banana}}\n",
    );
    let (code, out) = env.json(&["run", caller.to_str().expect("utf8"), "--input", "{}"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["output"], json!({"count": 3}), "{out}");
    let (_, st) = env.json(&["status", out["run"].as_str().expect("run")]);
    let child = st["state"]["steps"]["ask"]["child"]["run"]
        .as_str()
        .expect("the call is a child run")
        .to_owned();
    let (_, child) = env.json(&["status", &child]);
    assert_eq!(child["run"]["workflow_id"], json!("t.count"));
    assert_eq!(child["run"]["status"], json!("completed"));

    // Its arguments are checked against its inputs at load.
    let bad = env.write(
        "bad.yaml",
        "id: t.bad\nsteps:\n  - id: ask\n    tool: {name: t.count, args: {txt: banana}}\n",
    );
    let (code, out) = env.json(&["validate", bad.to_str().expect("utf8")]);
    assert_eq!(code, 3, "{out}");
    assert_eq!(
        out[0]["errors"][0]["code"],
        json!("args_violate_schema"),
        "{out}"
    );

    // A name a component or another workflow holds is refused at load.
    for (name, holder) in [
        ("text", "the component `text`"),
        ("t.count", "workflow `t.count`"),
    ] {
        let other = env.write(
            "other.yaml",
            &format!(
                "id: t.other\ntool: {{name: {name}}}\nsteps:\n  - id: a\n    tool: {{name: \"text@^0.1\", args: {{op: count, pattern: a, text: a}}}}\n"
            ),
        );
        let out = env
            .cmd()
            .args(["publish", other.to_str().expect("utf8")])
            .output()
            .expect("run poimen");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{name}: {err}");
        assert!(
            err.contains(&format!("declares the tool name `{name}`, which {holder}")),
            "{name}: {err}"
        );
    }
}
