//! Every verb of the CLI, and each kind of bad input, as a user meets them:
//! exit codes, one-line errors that say what to do, `--json` documents.

use predicates::prelude::*;
use serde_json::{Value, json};

use crate::support::{Env, fixture};

const TEXT_REPORT: &str = "examples/text-report.yaml";

fn input() -> String {
    json!({"text": "Please refund $40 to ana@example.com, cc bo@example.org"}).to_string()
}

#[test]
fn run_prints_the_run_id_first_and_the_output_last() {
    let env = Env::new();
    let out = env
        .cmd()
        .args([
            "run",
            fixture(TEXT_REPORT).to_str().expect("utf8"),
            "--input",
            &input(),
        ])
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf8");
    let first = stdout.lines().next().expect("a first line");
    assert!(first.starts_with("WFR-"), "{stdout}");
    let output: Value = serde_json::from_str(&stdout[first.len()..]).expect("the output is JSON");
    assert_eq!(output["words"], json!(11));
    assert_eq!(output["flagged"], json!(true));
    assert_eq!(output["emails"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        output["text"],
        json!("Please refund $40 to <email>, cc <email>")
    );
    // The store was created under POIMEN_HOME.
    assert!(env.path().join("home/poimen.db").exists());
}

/// The reading verbs open the store with the header check instead of a scan
/// of every page: a truncated store is still refused, naming the damage and
/// changing nothing, and so is a run on it (the full check).
#[test]
fn reading_verbs_refuse_a_truncated_store_and_change_nothing() {
    let env = Env::new();
    let (code, out) = env.json(&[
        "run",
        fixture(TEXT_REPORT).to_str().expect("utf8"),
        "--input",
        &input(),
    ]);
    assert_eq!(code, 0, "{out}");
    let run = out["run"].as_str().expect("run id").to_owned();
    let db = env.path().join("home/poimen.db");
    let len = std::fs::metadata(&db).expect("store").len();
    assert!(len >= 8 * 4096, "the store spans pages ({len} bytes)");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .and_then(|f| f.set_len(len / 2 / 4096 * 4096))
        .expect("truncate");
    let before = std::fs::read(&db).expect("read");
    for args in [
        vec!["status", run.as_str()],
        vec!["episode", run.as_str()],
        vec!["versions"],
        vec![
            "run",
            fixture(TEXT_REPORT).to_str().expect("utf8"),
            "--input",
            &input(),
        ],
    ] {
        let out = env.cmd().args(&args).output().expect("poimen");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{args:?}: {stderr}");
        assert!(
            stderr.contains("is damaged") && stderr.contains("poimen.db"),
            "{args:?}: {stderr}"
        );
        if args[0] != "run" {
            assert!(stderr.contains("truncated"), "{args:?}: {stderr}");
        }
        assert_eq!(
            std::fs::read(&db).expect("read"),
            before,
            "{args:?} changed nothing"
        );
    }
}

#[test]
fn run_json_status_episode_audit_resume() {
    let env = Env::new();
    let (code, out) = env.json(&[
        "run",
        fixture(TEXT_REPORT).to_str().expect("utf8"),
        "--input",
        &input(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"], json!("completed"));
    let run = out["run"].as_str().expect("run id").to_owned();

    let (code, status) = env.json(&["status", &run]);
    assert_eq!(code, 0);
    assert_eq!(status["run"]["status"], json!("completed"));
    assert_eq!(
        status["state"]["steps"]["words"]["status"],
        json!("completed")
    );

    let (_, list) = env.json(&["status"]);
    assert_eq!(list.as_array().map(Vec::len), Some(1));

    let (code, episode) = env.json(&["episode", &run]);
    assert_eq!(code, 0);
    let events = episode["events"].as_array().expect("events");
    assert_eq!(events[0]["event"], json!("run_started"));
    assert_eq!(
        events.last().expect("last")["event"],
        json!("run_completed")
    );
    // It refolds to the state `status` shows.
    let ep: poimen::executor::Episode = serde_json::from_value(episode.clone()).expect("episode");
    let state = poimen::executor::refold(&ep).expect("refold");
    assert_eq!(serde_json::to_value(&state).expect("json"), status["state"]);

    let (code, audit) = env.json(&["audit", &run]);
    assert_eq!(code, 0);
    assert_eq!(audit["tool_calls"].as_array().map(Vec::len), Some(4));
    assert_eq!(audit["intents"].as_array().map(Vec::len), Some(12));
    assert_eq!(audit["incomplete"], json!([]));

    // Resuming a finished run changes nothing.
    let (code, again) = env.json(&["resume", &run]);
    assert_eq!(code, 0);
    assert_eq!(again["status"], json!("completed"));
    let (_, episode2) = env.json(&["episode", &run]);
    assert_eq!(
        episode2["events"].as_array().map(Vec::len),
        Some(events.len())
    );

    env.cmd()
        .args(["audit", &run])
        .assert()
        .success()
        .stdout(predicate::str::contains("Pending/Dispatched"));
    env.cmd()
        .args(["episode", &run])
        .assert()
        .success()
        .stdout(predicate::str::contains("run completed"));
}

#[test]
fn run_refuses_bad_input_of_every_kind() {
    let env = Env::new();
    let wf = fixture(TEXT_REPORT);
    let wf = wf.to_str().expect("utf8");
    // Not JSON.
    env.cmd()
        .args(["run", wf, "--input", "{text: hi"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not valid JSON"));
    // JSON that the workflow's input schema refuses.
    env.cmd()
        .args(["run", wf, "--input", r#"{"text": 3}"#])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("`inputs` schema"));
    // A missing file.
    env.cmd()
        .args(["run", "nope.yaml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("nope.yaml"));
    // An input file that does not exist.
    env.cmd()
        .args(["run", wf, "--input", "@missing.json"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("missing.json"));
    // An invalid workflow: exit 3 with every problem.
    let bad = fixture("invalid/multi_error.yaml");
    env.cmd()
        .args(["run", bad.to_str().expect("utf8")])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("invalid"));
    // An unknown version.
    env.cmd()
        .args(["run", "b3:abcdef"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("b3:abcdef"));
    // Nothing was run.
    let (_, runs) = env.json(&["status"]);
    assert_eq!(runs, json!([]));
}

#[test]
fn unknown_runs_and_judgments_are_usage_errors() {
    let env = Env::new();
    for args in [
        vec!["status", "WFR-01JD0000000000000000000000"],
        vec!["episode", "WFR-01JD0000000000000000000000"],
        vec!["audit", "not-a-run"],
        vec!["resume", "WFR-01JD0000000000000000000000"],
        vec!["cancel", "WFR-01JD0000000000000000000000"],
        vec!["judgment", "show", "WFJ-01JD0000000000000000000000"],
    ] {
        env.cmd()
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::starts_with("error: "))
            .stderr(predicate::str::contains("panicked").not());
    }
}

#[test]
fn validate_version_publish_versions_show_diff_schema() {
    let env = Env::new();
    let a = fixture("canonical/must_match/reordered_top_level_keys.a.yaml");
    let b = fixture("canonical/must_match/reordered_top_level_keys.b.yaml");
    let (a, b) = (a.to_str().expect("utf8"), b.to_str().expect("utf8"));

    // version: two files that differ only in key order share one version.
    let (code, v) = env.json(&["version", a, b]);
    assert_eq!(code, 0);
    assert_eq!(v[0]["version"], v[1]["version"]);

    // validate: the valid file passes; an invalid one reports variants with ids.
    env.cmd()
        .args(["validate", fixture(TEXT_REPORT).to_str().expect("utf8")])
        .assert()
        .success();
    let (code, report) = env.json(&[
        "validate",
        fixture("invalid/duplicate_step_id.yaml")
            .to_str()
            .expect("utf8"),
    ]);
    assert_eq!(code, 3);
    assert_eq!(report[0]["valid"], json!(false));
    assert!(report[0]["errors"][0]["code"].is_string(), "{report}");

    // publish, then publish a changed copy with the first as parent.
    let wf = std::fs::read_to_string(fixture(TEXT_REPORT)).expect("read");
    let v1 = env.write("v1.yaml", &wf);
    let v2 = env.write("v2.yaml", &wf.replace("minLength: 1", "minLength: 2"));
    let (code, p1) = env.json(&["publish", v1.to_str().expect("utf8")]);
    assert_eq!(code, 0);
    assert_eq!(p1["created"], json!(true));
    let v1_version = p1["version"].as_str().expect("version").to_owned();
    let short = &v1_version[..12];
    let (code, p2) = env.json(&["publish", v2.to_str().expect("utf8"), "--parent", short]);
    assert_eq!(code, 0, "{p2}");
    assert_eq!(p2["parent"], json!(v1_version));
    // Publishing the same content again writes nothing.
    let (_, again) = env.json(&["publish", v1.to_str().expect("utf8")]);
    assert_eq!(again["created"], json!(false));

    // versions: the DAG with parents.
    let (_, versions) = env.json(&["versions", "examples.text_report"]);
    assert_eq!(versions.as_array().map(Vec::len), Some(2));
    assert_eq!(versions[1]["parent"], json!(v1_version));
    env.cmd()
        .args(["versions", "examples.text_reprot"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "did you mean examples.text_report",
        ));

    // show: the canonical bytes, which hash to the version.
    let shown = env.cmd().args(["show", short]).output().expect("show");
    assert!(shown.status.success());
    let canonical = String::from_utf8(shown.stdout).expect("utf8");
    let canonical = canonical.trim_end_matches('\n');
    assert_eq!(
        format!("b3:{}", blake3::hash(canonical.as_bytes()).to_hex()),
        v1_version
    );

    // diff: in words.
    let p2_version = p2["version"].as_str().expect("version").to_owned();
    env.cmd()
        .args(["diff", short, &p2_version])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "`inputs.properties.text.minLength` changed",
        ));
    env.cmd()
        .args(["diff", short, v1.to_str().expect("utf8")])
        .assert()
        .success()
        .stdout(predicate::str::contains("no changes"));

    // schema: a JSON Schema for editors.
    let (code, schema) = env.json(&["schema"]);
    assert_eq!(code, 0);
    assert!(
        schema.get("$schema").is_some() || schema.get("properties").is_some(),
        "{schema}"
    );

    // An ambiguous or malformed version is a usage error.
    env.cmd().args(["show", "b3:zz"]).assert().code(2);
}

#[test]
fn plan_shows_order_fanout_tools_and_eligibility() {
    let env = Env::new();
    let (code, plan) = env.json(&["plan", fixture(TEXT_REPORT).to_str().expect("utf8")]);
    assert_eq!(code, 0, "{plan}");
    let ids: Vec<&str> = plan["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        ["scan", "words", "emails", "money", "flag", "pass", "report"]
    );
    assert_eq!(plan["steps"][0]["runs"], json!(["words", "emails"]));
    assert!(
        plan["steps"][1]["tool"]["digest"]
            .as_str()
            .expect("digest")
            .starts_with("b3:")
    );
    assert_eq!(
        plan["eligibility"]["ineligible"],
        json!([]),
        "eligible for shadow evaluation: {}",
        plan["eligibility"]
    );
    env.cmd()
        .args(["plan", fixture(TEXT_REPORT).to_str().expect("utf8")])
        .assert()
        .success()
        .stdout(predicate::str::contains("shadow evaluation: eligible"));
}

#[test]
fn failed_runs_exit_1_and_retry_keeps_history() {
    let env = Env::new();
    let wf = env.write(
        "fails.yaml",
        r#"
id: t.fails
steps:
  - id: pick
    tool:
      name: json@^0.1
      args: {value: {a: 1}, select: /missing}
"#,
    );
    let (code, out) = env.json(&["run", wf.to_str().expect("utf8")]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out["status"], json!("failed"));
    assert!(
        out["reason"]
            .as_str()
            .expect("reason")
            .contains("nothing at `/missing`"),
        "{out}"
    );
    let run = out["run"].as_str().expect("run").to_owned();
    let (code, again) = env.json(&["retry", &run]);
    assert_eq!(code, 1);
    assert_eq!(again["run"], json!(run));
    let (_, episode) = env.json(&["episode", &run]);
    let kinds: Vec<&str> = episode["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert!(kinds.contains(&"run_retried"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "run_failed").count(), 2);
    // A retry from a step that does not exist says which ones do.
    env.cmd()
        .args(["retry", &run, "--from", "nope"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("pick"));
    // Reconcile needs a blocked run.
    env.cmd()
        .args(["reconcile", &run, "pick", "--failed", "no"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("only a blocked run"));
}

#[test]
fn judgments_pause_runs_until_a_valid_answer() {
    let env = Env::new();
    let wf = env.write(
        "approve.yaml",
        r#"
id: t.approve
inputs: {type: object, required: [amount]}
steps:
  - id: ask
    judgment:
      question: "Refund {{ inputs.amount }}?"
      sources: ["amount={{ inputs.amount }}"]
      result_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
      executor: human
"#,
    );
    let (code, out) = env.json(&[
        "run",
        wf.to_str().expect("utf8"),
        "--input",
        r#"{"amount": 40}"#,
    ]);
    assert_eq!(code, 4, "{out}");
    assert_eq!(out["status"], json!("waiting_judgment"));
    let run = out["run"].as_str().expect("run").to_owned();

    let (_, list) = env.json(&["judgment", "list"]);
    let id = list[0]["id"].as_str().expect("id").to_owned();
    let hash = list[0]["request_hash"].as_str().expect("hash").to_owned();
    let (_, shown) = env.json(&["judgment", "show", &id]);
    assert_eq!(shown["request"]["question"], json!("Refund 40?"));
    assert_eq!(shown["request"]["sources"][0]["text"], json!("amount=40"));

    // Wrong schema: refused, still waiting.
    let bad = env.write("bad.json", &json!({"request_hash": hash, "result": {"ok": "yes"}, "executor": "human", "provenance": {"judge": "ana"}}).to_string());
    env.cmd()
        .args([
            "judgment",
            "submit",
            &id,
            "--file",
            bad.to_str().expect("utf8"),
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("result schema"));
    // Wrong executor: refused.
    let other = env.write("other.json", &json!({"request_hash": hash, "result": {"ok": true}, "executor": "robot", "provenance": {"judge": "ana"}}).to_string());
    env.cmd()
        .args([
            "judgment",
            "submit",
            &id,
            "--file",
            other.to_str().expect("utf8"),
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("executor"));
    // No provenance: refused.
    let anon = env.write("anon.json", &json!({"request_hash": hash, "result": {"ok": true}, "executor": "human", "provenance": {}}).to_string());
    env.cmd()
        .args([
            "judgment",
            "submit",
            &id,
            "--file",
            anon.to_str().expect("utf8"),
        ])
        .assert()
        .code(2);
    let (_, status) = env.json(&["status", &run]);
    assert_eq!(status["run"]["status"], json!("waiting_judgment"));

    // The right answer resumes the run to completion.
    let good = env.write("good.json", &json!({"request_hash": hash, "result": {"ok": true}, "executor": "human", "provenance": {"judge": "ana"}}).to_string());
    let (code, done) = env.json(&[
        "judgment",
        "submit",
        &id,
        "--file",
        good.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["output"], json!({"ok": true}));
    // Answered once.
    env.cmd()
        .args([
            "judgment",
            "submit",
            &id,
            "--file",
            good.to_str().expect("utf8"),
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already answered"));
}

#[test]
fn cancel_stops_a_waiting_run() {
    let env = Env::new();
    let wf = env.write(
        "wait.yaml",
        r#"
id: t.wait
steps:
  - id: ask
    judgment:
      question: "ok?"
      result_schema: {type: boolean}
"#,
    );
    let (code, out) = env.json(&["run", wf.to_str().expect("utf8")]);
    assert_eq!(code, 4);
    let run = out["run"].as_str().expect("run").to_owned();
    let (code, rec) = env.json(&["cancel", &run]);
    assert_eq!(code, 0);
    assert_eq!(rec["status"], json!("cancelled"));
    env.cmd()
        .args(["cancel", &run])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already ended"));
}

#[test]
fn plugin_list_inspect_add_call() {
    let env = Env::new();
    let (code, list) = env.json(&["plugin", "list"]);
    assert_eq!(code, 0);
    let names: Vec<&str> = list
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for n in [
        "json",
        "text",
        "fs-read",
        "ledger",
        "ledger-idempotent",
        "http-get",
        "json-schema",
        "matches",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    // With no policy, plugins that declare capabilities are listed as
    // withheld, with the capability and how to grant it.
    let fs_read = list
        .as_array()
        .expect("list")
        .iter()
        .find(|p| p["name"] == json!("fs-read"))
        .expect("fs-read listed");
    assert_eq!(fs_read["status"], json!("withheld"));
    let why = fs_read["withheld"].as_str().expect("reason");
    assert!(
        why.contains("fs-read:") && why.contains("to grant it"),
        "{why}"
    );
    // A workflow that uses one is rejected at load, naming the grant.
    let wf = env.write(
        "uses-fs.yaml",
        "id: t.uses_fs\nsteps:\n  - id: read\n    tool:\n      name: fs-read\n      args: {path: notes.txt}\n",
    );
    env.cmd()
        .args(["validate", wf.to_str().expect("utf8")])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("withheld").and(predicate::str::contains("to grant it")));

    // inspect: the descriptor and the component's actual imports.
    let (code, inspected) = env.json(&["plugin", "inspect", plugin_artifacts::FS_READ]);
    assert_eq!(code, 0);
    assert_eq!(inspected["info"]["name"], json!("fs-read"));
    assert!(
        inspected["imports"]
            .as_array()
            .expect("imports")
            .iter()
            .any(|i| i["name"]
                .as_str()
                .unwrap_or("")
                .starts_with("wasi:filesystem"))
    );
    // A component importing sockets loads: they are linked, denied.
    env.cmd()
        .args(["plugin", "inspect", plugin_artifacts::ADV_SOCKETS])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("wasi:sockets/tcp-create-socket@"))
        .stdout(predicate::str::contains("sockets: linked, denied"));
    // Not a component at all.
    let junk = env.write("junk.wasm", "not wasm");
    env.cmd()
        .args(["plugin", "inspect", junk.to_str().expect("utf8")])
        .assert()
        .code(5);
    env.cmd()
        .args(["plugin", "inspect", "missing.wasm"])
        .assert()
        .code(2);

    // add: copied under its digest, then registered on the next start.
    let (code, added) = env.json(&["plugin", "add", plugin_artifacts::ADV_PANIC]);
    assert_eq!(code, 0, "{added}");
    assert!(std::path::Path::new(added["path"].as_str().expect("path")).exists());
    let (_, list) = env.json(&["plugin", "list"]);
    assert!(
        list.as_array()
            .expect("list")
            .iter()
            .any(|p| p["name"] == json!("adv-panic"))
    );

    // call: through the host, with its record.
    let (code, called) = env.json(&[
        "plugin",
        "call",
        "text",
        r#"{"op": "count", "pattern": "o", "text": "foo"}"#,
    ]);
    assert_eq!(code, 0, "{called}");
    assert_eq!(called["output"], json!({"count": 2}));
    assert_eq!(called["record"]["tool"]["name"], json!("text"));
    env.cmd()
        .args(["plugin", "call", "txet", "{}"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("did you mean text"));
}

/// The same component with a custom section appended: same name, version
/// and behaviour, another digest (a rebuild, as far as the host can tell).
fn rebuilt(env: &Env, path: &str, name: &str) -> String {
    let mut bytes = std::fs::read(path).expect("component");
    let payload = b"rebuilt";
    let section_name = b"poimen-test";
    let size = 1 + section_name.len() + payload.len();
    bytes.push(0); // custom section
    bytes.push(size as u8);
    bytes.push(section_name.len() as u8);
    bytes.extend_from_slice(section_name);
    bytes.extend_from_slice(payload);
    let out = env.path().join(name);
    std::fs::write(&out, bytes).expect("write");
    out.to_str().expect("utf8").to_owned()
}

#[test]
fn plugin_identity_is_bound_to_digests_and_first_party_names_are_reserved() {
    let env = Env::new();
    // A third party naming itself `fs-read`: refused by `plugin add`.
    let out = env
        .cmd()
        .args(["plugin", "add", plugin_artifacts::ADV_IMPOSTOR])
        .output()
        .expect("poimen");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("names itself `fs-read`"), "{err}");
    assert!(err.contains("bundled:fs_read"), "{err}");
    // Dropped into the plugin directory by hand, it never stops the host:
    // every command works, `plugin list` shows it refused, and `fs-read`
    // stays the bundled one.
    let plugins = env.path().join("home").join("plugins");
    std::fs::create_dir_all(&plugins).expect("mkdir");
    std::fs::copy(
        plugin_artifacts::ADV_IMPOSTOR,
        plugins.join("impostor.wasm"),
    )
    .expect("copy");
    let (code, list) = env.json(&["plugin", "list"]);
    assert_eq!(code, 0, "{list}");
    let rows = list.as_array().expect("rows");
    let refused: Vec<&Value> = rows.iter().filter(|r| r["status"] == "refused").collect();
    assert_eq!(refused.len(), 1, "{list}");
    assert!(
        refused[0]["refused"]
            .as_str()
            .unwrap_or("")
            .contains("a name reserved by the bundled component"),
        "{list}"
    );
    let fs: Vec<&Value> = rows.iter().filter(|r| r["name"] == "fs-read").collect();
    assert_eq!(fs.len(), 1, "{list}");
    assert_eq!(fs[0]["version"], "0.1.0");
    std::fs::remove_file(plugins.join("impostor.wasm")).expect("rm");

    // The same name and version with another digest: refused, unless
    // --replace; then the old file is gone and the new digest is served.
    let a = rebuilt(&env, plugin_artifacts::ADV_PANIC, "a.wasm");
    let b = rebuilt(&env, &a, "b.wasm");
    let (code, first) = env.json(&["plugin", "add", &a]);
    assert_eq!(code, 0, "{first}");
    let out = env
        .cmd()
        .args(["plugin", "add", &b])
        .output()
        .expect("poimen");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("already added with another component"),
        "{err}"
    );
    assert!(err.contains("--replace"), "{err}");
    let (code, second) = env.json(&["plugin", "add", &b, "--replace"]);
    assert_eq!(code, 0, "{second}");
    assert_ne!(first["digest"], second["digest"]);
    assert!(!std::path::Path::new(first["path"].as_str().expect("path")).exists());
    let (_, list) = env.json(&["plugin", "list"]);
    let panics: Vec<&Value> = list
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["name"] == "adv-panic")
        .collect();
    assert_eq!(panics.len(), 1, "{list}");
    assert_eq!(panics[0]["digest"], second["digest"]);
    // Adding the very same component again is no conflict.
    let (code, again) = env.json(&["plugin", "add", &b]);
    assert_eq!(code, 0, "{again}");

    // remove: the added one goes; a bundled one cannot be removed here.
    let (code, removed) = env.json(&["plugin", "remove", "adv-panic@0.1.0"]);
    assert_eq!(code, 0, "{removed}");
    let (_, list) = env.json(&["plugin", "list"]);
    assert!(
        list.as_array()
            .expect("rows")
            .iter()
            .all(|r| r["name"] != "adv-panic"),
        "{list}"
    );
    env.cmd()
        .args(["plugin", "remove", "adv-panic"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "no plugin `adv-panic` is installed",
        ));
    env.cmd()
        .args(["plugin", "remove", "text"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot be removed here"));
}

#[test]
fn completions_and_help() {
    let env = Env::new();
    env.cmd()
        .args(["completions", "bash"])
        .assert()
        .success()
        .stdout(predicate::str::contains("poimen"));
    env.cmd()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("Exit codes"))
        .stdout(predicate::str::contains("reconcile"));
    env.cmd()
        .args(["run", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("Example"));
    env.cmd().arg("frobnicate").assert().code(2);
}

#[test]
fn run_idempotency_keys_return_the_existing_run_and_refuse_other_inputs() {
    let env = Env::new();
    let wf = fixture("examples/text-report.yaml");
    let wf = wf.to_str().expect("utf8");
    let a = r#"{"text": "one two three"}"#;
    let (code, first) = env.json(&["run", wf, "--input", a, "--idempotency-key", "order-7"]);
    assert_eq!(code, 0, "{first}");
    let (code, again) = env.json(&["run", wf, "--input", a, "--idempotency-key", "order-7"]);
    assert_eq!(code, 0, "{again}");
    assert_eq!(
        again["run"], first["run"],
        "the same key and input is the same run"
    );
    let (_, runs) = env.json(&["status"]);
    let listed = runs
        .as_array()
        .or_else(|| runs["runs"].as_array())
        .map(Vec::len);
    assert_eq!(listed, Some(1), "one run: {runs}");
    // The same key with another input is refused, naming both input hashes.
    let out = env
        .cmd()
        .args([
            "run",
            wf,
            "--input",
            r#"{"text": "four"}"#,
            "--idempotency-key",
            "order-7",
        ])
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a refused request is a usage error"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("order-7") && !err.contains("store failed"),
        "{err}"
    );
    assert!(
        err.matches("b3:").count() >= 2,
        "names both input hashes: {err}"
    );
}

#[test]
fn a_run_keeps_the_sub_workflow_version_it_pinned_at_its_start() {
    let env = Env::new();
    let child = |word: &str| {
        format!(
            "id: t.pinned_child\nsteps:\n  - id: say\n    tool: {{name: \"json@^0.1\", args: {{value: {word}, select: \"\"}}}}\n"
        )
    };
    let v1 = env.write("child1.yaml", &child("one"));
    let (code, published) = env.json(&["publish", v1.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{published}");
    let v1_version = published["version"].as_str().expect("version").to_owned();
    let parent = env.write(
        "parent.yaml",
        "id: t.pinning\nsteps:\n  - id: ask\n    judgment:\n      question: \"go?\"\n      result_schema: {type: boolean}\n  - id: call\n    workflow: {id: t.pinned_child, version: latest}\ntransitions:\n  - {from: ask, to: call}\n",
    );
    let (code, out) = env.json(&["run", parent.to_str().expect("utf8")]);
    assert_eq!(code, 4, "waits for the judgment: {out}");
    let run = out["run"].as_str().expect("run").to_owned();
    // A newer child is published while the run waits.
    let v2 = env.write("child2.yaml", &child("two"));
    let (code, published) = env.json(&["publish", v2.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{published}");
    assert_ne!(published["version"].as_str(), Some(v1_version.as_str()));
    // It descends from v1: the version DAG stays connected.
    assert_eq!(published["parent"], json!(v1_version));
    // The judgment is answered by another process (nothing cached).
    let (_, list) = env.json(&["judgment", "list"]);
    let id = list[0]["id"].as_str().expect("id").to_owned();
    let answer = env.write(
        "answer.json",
        &json!({"request_hash": list[0]["request_hash"], "result": true, "provenance": {"judge": "ops"}}).to_string(),
    );
    let (code, out) = env.json(&[
        "judgment",
        "submit",
        &id,
        "--file",
        answer.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["output"], json!("one"), "the pinned child ran: {out}");
    // The child's start names the version pinned when the parent started.
    let (_, st) = env.json(&["status", &run]);
    let child_run = st["state"]["steps"]["call"]["child"]["run"]
        .as_str()
        .expect("child run")
        .to_owned();
    let (_, episode) = env.json(&["episode", &child_run]);
    assert_eq!(episode["events"][0]["event"], json!("run_started"));
    assert_eq!(episode["events"][0]["version"], json!(v1_version));
    // The parent's start recorded the pin.
    let (_, parent_episode) = env.json(&["episode", &run]);
    assert_eq!(
        parent_episode["events"][0]["subworkflows"]["call"]["version"],
        json!(v1_version)
    );
}

#[test]
fn publishing_descends_from_the_latest_version_unless_told_otherwise() {
    let env = Env::new();
    let wf = |n: u32| {
        format!(
            "id: t.lineage\nsteps:\n  - id: s\n    tool: {{name: \"json@^0.1\", args: {{value: {n}, select: \"\"}}}}\n"
        )
    };
    let publish = |name: &str, n: u32, extra: &[&str]| {
        let f = env.write(name, &wf(n));
        let mut args = vec!["publish", f.to_str().expect("utf8")];
        args.extend_from_slice(extra);
        let (code, out) = env.json(&args);
        assert_eq!(code, 0, "{out}");
        out
    };
    let a = publish("a.yaml", 1, &[]);
    assert_eq!(a["parent"], Value::Null);
    let b = publish("b.yaml", 2, &[]);
    assert_eq!(b["parent"], a["version"]);
    let c = publish("c.yaml", 3, &["--no-parent"]);
    assert_eq!(c["parent"], Value::Null);
    let d = publish(
        "d.yaml",
        4,
        &["--parent", a["version"].as_str().expect("v")],
    );
    assert_eq!(d["parent"], a["version"]);
    // `run FILE` of a new version publishes it under the latest too.
    let e = env.write("e.yaml", &wf(5));
    let (code, out) = env.json(&["run", e.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}");
    let (_, versions) = env.json(&["versions", "t.lineage"]);
    let last = versions
        .as_array()
        .expect("versions")
        .last()
        .cloned()
        .expect("a version");
    assert_eq!(last["parent"], d["version"], "{versions}");
}

#[test]
fn a_runs_tenant_is_stored_inherited_by_its_children_and_filters_listing() {
    let env = Env::new();
    let child = env.write(
        "child.yaml",
        "id: t.tchild\nsteps:\n  - id: s\n    tool: {name: \"json@^0.1\", args: {value: 1, select: \"\"}}\n",
    );
    let (code, out) = env.json(&["publish", child.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}");
    let parent = env.write(
        "parent.yaml",
        "id: t.tparent\nsteps:\n  - id: call\n    workflow: {id: t.tchild}\n",
    );
    let (code, out) = env.json(&["run", parent.to_str().expect("utf8"), "--tenant", "acme"]);
    assert_eq!(code, 0, "{out}");
    let run = out["run"].as_str().expect("run").to_owned();
    let (_, other) = env.json(&["run", child.to_str().expect("utf8")]);
    let (_, st) = env.json(&["status", &run]);
    assert_eq!(st["run"]["tenant"], json!("acme"));
    let listed = |tenant: &str| -> Vec<(String, String)> {
        let (_, runs) = env.json(&["status", "--tenant", tenant]);
        runs.as_array()
            .expect("runs")
            .iter()
            .map(|r| {
                (
                    r["workflow_id"].as_str().unwrap_or_default().to_owned(),
                    r["tenant"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let mut acme = listed("acme");
    acme.sort();
    assert_eq!(
        acme,
        vec![
            ("t.tchild".to_owned(), "acme".to_owned()),
            ("t.tparent".to_owned(), "acme".to_owned())
        ],
        "the child run is the parent's tenant's"
    );
    let default = listed("default");
    assert_eq!(default, vec![("t.tchild".to_owned(), "default".to_owned())]);
    assert!(listed("nobody").is_empty());
    assert_eq!(other["status"], json!("completed"));
}

#[test]
fn reading_verbs_never_build_the_plugin_host() {
    // A policy file that does not parse stops every verb that runs guests
    // (the plugin host reads it at start); the verbs that only read the
    // store never build the plugin host, so they work — and start in
    // milliseconds, with no component compiled or described.
    let env = Env::new();
    let bad = env.write("bad-policy.toml", "this is [not toml");
    let bad = bad.to_str().expect("utf8");
    env.cmd()
        .args(["--policy", bad, "plugin", "list"])
        .assert()
        .code(5);
    let (code, runs) = env.json(&["--policy", bad, "status"]);
    assert_eq!(code, 0, "{runs}");
    assert_eq!(runs, json!([]));
    let (code, open) = env.json(&["--policy", bad, "judgment", "list"]);
    assert_eq!(code, 0, "{open}");
    env.cmd()
        .args(["--policy", bad, "versions"])
        .assert()
        .success();
}

#[test]
fn a_component_a_run_pinned_and_the_host_lost_fails_only_the_step_that_reaches_it() {
    let env = Env::new();
    let (code, added) = env.json(&["plugin", "add", plugin_artifacts::ADV_SPIN]);
    assert_eq!(code, 0, "{added}");
    let digest = added["digest"].as_str().expect("digest").to_owned();
    // `spin` is reached only if the judge says so.
    let wf = env.write(
        "lost.yaml",
        "id: t.lost\ninputs: {type: object}\nsteps:\n  - id: ask\n    judgment:\n      question: \"spin?\"\n      result_schema: {type: boolean}\n  - id: route\n    conditional: {on: \"steps.ask.output\", then: spin, otherwise: done}\n  - id: spin\n    tool: {name: adv-spin}\n    timeout: 2s\n  - id: done\n    tool: {name: \"json@^0.1\", args: {value: finished, select: \"\"}}\ntransitions:\n  - {from: ask, to: route}\n",
    );
    let start = |n: u32| {
        let (code, out) = env.json(&[
            "run",
            wf.to_str().expect("utf8"),
            "--input",
            &json!({ "n": n }).to_string(),
        ]);
        assert_eq!(code, 4, "waits for the judgment: {out}");
        out["run"].as_str().expect("run").to_owned()
    };
    let (spinning, finishing) = (start(1), start(2));
    let (code, removed) = env.json(&["plugin", "remove", "adv-spin"]);
    assert_eq!(code, 0, "{removed}");
    // A new run of the workflow is refused before it starts, naming it.
    let out = env
        .cmd()
        .args(["run", wf.to_str().expect("utf8"), "--input", "{}"])
        .output()
        .expect("poimen");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("adv-spin"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The runs that pinned it still load; each is answered.
    let (_, list) = env.json(&["judgment", "list"]);
    let answer = |run: &str, result: bool| {
        let j = list
            .as_array()
            .expect("open requests")
            .iter()
            .find(|j| j["run"] == json!(run))
            .unwrap_or_else(|| panic!("no request of {run}: {list}"));
        let file = env.write(
            &format!("answer-{run}.json"),
            &json!({"request_hash": j["request_hash"], "result": result, "provenance": {"judge": "ops"}}).to_string(),
        );
        env.json(&[
            "judgment",
            "submit",
            j["id"].as_str().expect("id"),
            "--file",
            file.to_str().expect("utf8"),
        ])
    };
    // The run that never reaches the lost component finishes.
    let (code, out) = answer(&finishing, false);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["status"], json!("completed"), "{out}");
    assert_eq!(out["output"], json!("finished"), "{out}");
    // The run that reaches it fails at that step, naming the component.
    let (code, out) = answer(&spinning, true);
    assert_eq!(code, 1, "{out}");
    let (_, st) = env.json(&["status", &spinning]);
    assert_eq!(st["run"]["status"], json!("failed"), "{st}");
    assert_eq!(
        st["state"]["steps"]["spin"]["status"],
        json!("failed"),
        "{st}"
    );
    let reason = st["run"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "`adv-spin` 0.1.0 ({digest}), which this run pinned"
        )),
        "{reason}"
    );
    assert!(reason.contains("poimen plugin add"), "{reason}");
    assert_eq!(
        st["state"]["tools"]["adv-spin"]["identity"]["digest"],
        json!(digest),
        "{st}"
    );
}

/// `poimen … | head -1`: a reader that closes stdout early ends the output,
/// not the command. No panic, no error line; a run still completes in the
/// store, and the exit code is the one the command would have had.
#[test]
fn a_closed_stdout_ends_the_output_not_the_command() {
    let env = Env::new();
    let closed = |args: &[&str]| {
        let mut child = env
            .std_cmd()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn poimen");
        // Close the read end before the child writes a byte.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "poimen {args:?}: {stderr}");
        (out.status.code(), stderr)
    };
    let quiet = |args: &[&str]| {
        let (code, stderr) = closed(args);
        assert!(!stderr.contains("error"), "poimen {args:?}: {stderr}");
        code
    };
    let file = fixture(TEXT_REPORT);
    let file = file.to_str().expect("utf8");
    let input = input();
    assert_eq!(quiet(&["run", file, "--input", &input]), Some(0));
    assert_eq!(quiet(&["--json", "status"]), Some(0));
    assert_eq!(quiet(&["status"]), Some(0));
    assert_eq!(quiet(&["schema"]), Some(0));
    assert_eq!(quiet(&["completions", "bash"]), Some(0));
    // A failing run keeps its exit code.
    assert_eq!(
        closed(&["run", file, "--input", r#"{"text": 7}"#]).0,
        env.cmd()
            .args(["run", file, "--input", r#"{"text": 7}"#])
            .output()
            .expect("run")
            .status
            .code()
    );
    // The run the closed pipe reported on completed, and is stored.
    let (code, runs) = env.json(&["status"]);
    assert_eq!(code, 0);
    let runs = runs.as_array().expect("a list of runs");
    assert!(runs.iter().any(|r| r["status"] == "completed"), "{runs:?}");
}
