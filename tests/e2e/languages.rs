//! The example plugins written in Python and JavaScript, as a user adds and
//! runs them: `plugin add` each default build, a workflow that fans out to
//! both languages' tools with the other language's verifiers, and the
//! records of their calls; a Python exception shown in the CLI as a panic
//! would be. Fails (never skips) when the components cannot be built.

use serde_json::json;

use crate::support::{Env, fixture};

fn add_all(env: &Env) {
    // The first `plugin add` of each compiles it (tens of seconds for a
    // language runtime) into the shared cache; one test at a time, so the
    // others hit the cache.
    static FIRST: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = FIRST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let plugins = plugin_artifacts::lang::lang_plugins()
        .unwrap_or_else(|e| panic!("the Python and JavaScript example plugins: {e}"));
    for (name, path) in plugins.all() {
        let (code, added) = env.json(&["plugin", "add", path.to_str().expect("utf8")]);
        assert_eq!(code, 0, "{name}: {added}");
        assert_eq!(added["name"], json!(name));
    }
}

#[test]
fn python_and_javascript_plugins_run_in_a_workflow_with_a_fan_out() {
    let env = Env::new();
    add_all(&env);
    let (_, list) = env.json(&["plugin", "list"]);
    for name in [
        "word-count-py",
        "word-count-js",
        "max-words-py",
        "contains-js",
    ] {
        assert!(
            list.as_array()
                .expect("list")
                .iter()
                .any(|p| p["name"] == json!(name)),
            "{name} not listed: {list}"
        );
    }

    let wf = fixture("examples/word-counts.yaml");
    let wf = wf.to_str().expect("utf8");
    let (code, out) = env.json(&["run", wf, "--input", r#"{"text": "one two  three four"}"#]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["output"], json!({"python": 4, "javascript": 4}));
    let run = out["run"].as_str().expect("run id").to_owned();

    let (code, audit) = env.json(&["audit", &run]);
    assert_eq!(code, 0);
    assert_eq!(audit["incomplete"], json!([]));
    let calls = audit["tool_calls"].as_array().expect("tool calls");
    for (step, tool) in [("python", "word-count-py"), ("javascript", "word-count-js")] {
        let call = calls
            .iter()
            .find(|c| c["step"] == json!(step))
            .unwrap_or_else(|| panic!("no call of {step}: {audit}"));
        let record = &call["record"];
        assert_eq!(record["tool"]["name"], json!(tool), "{record}");
        assert!(
            record["tool"]["digest"]
                .as_str()
                .is_some_and(|d| d.starts_with("b3:")),
            "{record}"
        );
        // The guest's print()/console.log() is in the record.
        assert!(
            record["stderr"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("counting the words of 19 characters")),
            "{record}"
        );
        assert_eq!(record["refusals"], json!([]), "{record}");
    }
    // Each verifier judged its step, and passed it.
    let verdicts: Vec<(&str, &serde_json::Value)> = audit["verdicts"]
        .as_array()
        .expect("verified events")
        .iter()
        .flat_map(|e| {
            let step = e["step"].as_str().unwrap_or("");
            e["verdicts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |v| (step, v))
        })
        .collect();
    let mut judged: Vec<(&str, &str)> = verdicts
        .iter()
        .map(|(step, v)| (*step, v["record"]["tool"]["name"].as_str().unwrap_or("")))
        .collect();
    judged.sort();
    assert_eq!(
        judged,
        [("python", "contains-js"), ("quote", "max-words-py")]
    );
    for (step, v) in &verdicts {
        assert_eq!(v["outcome"]["pass"], json!(true), "{step}: {v}");
    }
    let quote = verdicts.iter().find(|(s, _)| *s == "quote").expect("quote");
    assert_eq!(quote.1["outcome"]["reason"], json!("4 words, at most 100"));
}

#[test]
fn a_python_exception_reads_as_one_in_the_cli() {
    let env = Env::new();
    add_all(&env);
    let out = env
        .cmd()
        .args([
            "plugin",
            "call",
            "word-count-py",
            r#"{"text": "a b", "fail": true}"#,
        ])
        .output()
        .expect("poimen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "guest raised an uncaught Python exception: ValueError: asked to fail on 'a b'"
        ),
        "{stderr}"
    );

    let wf = fixture("examples/word-counts.yaml");
    let (code, out) = env.json(&[
        "run",
        wf.to_str().expect("utf8"),
        "--input",
        r#"{"text": "a b", "fail": true}"#,
    ]);
    assert_ne!(code, 0, "{out}");
    let run = out["run"].as_str().expect("run id").to_owned();
    let (_, status) = env.json(&["status", &run]);
    let python = &status["state"]["steps"]["python"];
    assert_eq!(python["status"], json!("failed"), "{status}");
    assert!(
        python
            .to_string()
            .contains("ValueError: asked to fail on 'a b'"),
        "{python}"
    );
}
