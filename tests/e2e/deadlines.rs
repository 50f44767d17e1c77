//! Timers and deadlines from the outside: a run waiting for a judgment
//! keeps its timer in the store, and whichever host serves the store later
//! expires the request (the process that started it is gone); a deadline
//! stops a guest call spinning in the sandbox mid-step.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::Env;

fn status(env: &Env, run: &str) -> Value {
    let (code, out) = env.json(&["status", run]);
    assert_eq!(code, 0, "{out}");
    out
}

#[test]
fn a_waiting_run_expires_after_its_host_is_gone_on_the_host_that_serves_next() {
    let env = Env::new();
    let wf = env.write(
        "gate.yaml",
        r#"
id: t.expiring
steps:
  - id: ask
    timeout: 2s
    judgment:
      question: Ship it?
      result_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
      on_timeout: {answer: {ok: false}}
"#,
    );
    // The process that starts the run exits while it waits: its timer is
    // all that is left of it, in the store.
    let (code, out) = env.json(&["run", wf.to_str().expect("utf8"), "--input", "{}"]);
    assert_eq!(code, 4, "{out}");
    let run = out["run"].as_str().expect("run").to_owned();
    let st = status(&env, &run);
    assert_eq!(st["run"]["status"], json!("waiting_judgment"));
    assert!(st["run"]["wake_at"].as_i64().is_some(), "a timer: {st}");

    // A host started afterwards, which never saw the run, expires it when
    // the timer is due, with the step's fallback.
    let served = env.serve(&[], "later");
    let start = Instant::now();
    let st = loop {
        let st = status(&env, &run);
        // Past `waiting_judgment` the run is `running` for a moment (the
        // expiry is recorded, then the step and the run end): wait for an
        // end.
        let status = &st["run"]["status"];
        if (status != &json!("waiting_judgment") && status != &json!("running"))
            || start.elapsed() > Duration::from_secs(30)
        {
            break st;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        st["run"]["status"],
        json!("completed"),
        "{st}\n{}",
        served.log()
    );
    assert_eq!(st["state"]["output"], json!({"ok": false}), "{st}");
    let (_, episode) = env.json(&["episode", &run]);
    assert!(
        episode.to_string().contains("judgment_expired"),
        "the expiry is recorded: {episode}"
    );
    // The request is closed: no answer is taken any more.
    let (_, open) = env.json(&["judgment", "list"]);
    assert_eq!(open, json!([]), "{open}");
}

#[test]
fn a_deadline_stops_a_guest_call_spinning_in_the_sandbox() {
    let env = Env::new();
    let (code, added) = env.json(&["plugin", "add", plugin_artifacts::ADV_SPIN]);
    assert_eq!(code, 0, "{added}");
    // The guest would spin for minutes: fuel is no limit for it here, and
    // its call may run 60 s; the run's deadline is 1 s and stops it mid-call.
    env.write(
        "policy.toml",
        "[plugins.adv-spin]\nlimits = { fuel = 1000000000000000, timeout-ms = 60000 }\n",
    );
    let wf = env.write(
        "spin.yaml",
        "id: t.spin\nlimits: {deadline: 1s}\nsteps:\n  - id: spin\n    tool: {name: adv-spin}\n    timeout: 60s\n",
    );
    let start = Instant::now();
    let out = env
        .cmd()
        .args(["--json", "--policy", "policy.toml", "run"])
        .arg(&wf)
        .args(["--input", "{}"])
        .output()
        .expect("run poimen");
    let elapsed = start.elapsed();
    let out: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out["status"], json!("failed"), "{out}");
    let reason = out["reason"].as_str().expect("reason");
    assert!(
        reason.contains("deadline exceeded") && reason.contains("its limit is 1000 ms"),
        "{reason}"
    );
    // Stopped at the deadline, not at the call's own 60 s limit.
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    // The call was stopped, not left to end: its intent says so.
    let run = out["run"].as_str().expect("run");
    let (_, audit) = env.json(&["audit", run]);
    assert_eq!(audit["incomplete"], json!([]), "{audit}");
}
