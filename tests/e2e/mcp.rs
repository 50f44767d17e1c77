//! The MCP server end to end: a real MCP client (rmcp) drives a child
//! `poimen mcp` process over stdio — initialize, list tools, call tools,
//! and the error cases.

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::TokioChildProcess;
use serde_json::{Map, Value, json};

use crate::support::{Env, bin, fixture};

pub(crate) fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_round_trip_over_stdio() {
    let env = Env::new();
    // A workflow exposed as a tool, published before the server starts.
    let wf = env.write(
        "shout.yaml",
        r#"
id: t.shout
description: Replace every vowel of a text with `*`.
tool: {name: shout, description: "Star out the vowels of a text."}
inputs:
  type: object
  properties: {text: {type: string}}
  required: [text]
steps:
  - id: star
    tool:
      name: text@^0.1
      args: {op: replace, pattern: "[aeiou]", replacement: "*", text: "{{ inputs.text }}"}
"#,
    );
    env.cmd()
        .args(["publish", wf.to_str().expect("utf8")])
        .assert()
        .success();

    let mut cmd = tokio::process::Command::new(bin());
    cmd.arg("mcp")
        .current_dir(env.path())
        .env("POIMEN_HOME", env.path().join("home"))
        .env_remove("POIMEN_POLICY")
        .env_remove("POIMEN_CRASH_AT")
        .env("POIMEN_CACHE_DIR", crate::support::shared_cache());
    let client =
        ().serve(TokioChildProcess::new(cmd).expect("spawn poimen mcp"))
            .await
            .expect("initialize");
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("poimen")
    );

    // tools/list: the fixed tools and the workflow tool with its schemas.
    let tools = client.list_all_tools().await.expect("list tools");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for n in [
        "workflow_list",
        "workflow_actions",
        "workflow_plan",
        "workflow_run",
        "workflow_status",
        "workflow_resume",
        "workflow_cancel",
        "workflow_retry",
        "workflow_audit",
        "shout",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let shout = tools.iter().find(|t| t.name == "shout").expect("shout");
    assert_eq!(shout.input_schema.get("required"), Some(&json!(["text"])));
    assert!(shout.output_schema.is_some());

    // A workflow tool runs the workflow.
    let r = client
        .call_tool(
            CallToolRequestParams::new("shout").with_arguments(args(json!({"text": "poimen"}))),
        )
        .await
        .expect("call shout");
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let out = structured(&r);
    assert_eq!(out["status"], json!("completed"));
    assert_eq!(out["output"]["text"], json!("p**m*n"));
    let run = out["run"].as_str().expect("run").to_owned();

    // workflow_run on a file, then status and audit of that run.
    let r = client
        .call_tool(
            CallToolRequestParams::new("workflow_run").with_arguments(args(json!({
                "target": fixture("examples/text-report.yaml"),
                "input": {"text": "hello there"}
            }))),
        )
        .await
        .expect("call workflow_run");
    let out = structured(&r);
    assert_eq!(out["status"], json!("completed"), "{r:?}");
    assert_eq!(out["output"]["flagged"], json!(false));
    let r = client
        .call_tool(
            CallToolRequestParams::new("workflow_status").with_arguments(args(json!({"run": run}))),
        )
        .await
        .expect("status");
    assert_eq!(structured(&r)["run"]["status"], json!("completed"));
    let r = client
        .call_tool(
            CallToolRequestParams::new("workflow_audit").with_arguments(args(json!({"run": run}))),
        )
        .await
        .expect("audit");
    assert_eq!(structured(&r)["incomplete"], json!([]));

    // workflow_list, workflow_actions, workflow_plan.
    let r = client
        .call_tool(CallToolRequestParams::new("workflow_list"))
        .await
        .expect("list");
    assert!(
        structured(&r)["workflows"]
            .as_array()
            .expect("workflows")
            .iter()
            .any(|w| w["workflow_id"] == json!("t.shout"))
    );
    let r = client
        .call_tool(CallToolRequestParams::new("workflow_actions"))
        .await
        .expect("actions");
    let actions = structured(&r);
    assert!(
        actions["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .any(|t| t["name"] == json!("ledger") && t["effect"] == json!("non-idempotent"))
    );
    assert!(
        actions["verifiers"]
            .as_array()
            .expect("verifiers")
            .iter()
            .any(|t| t["name"] == json!("json-schema"))
    );
    let r = client
        .call_tool(
            CallToolRequestParams::new("workflow_plan")
                .with_arguments(args(json!({"target": "t.shout"}))),
        )
        .await
        .expect("plan of a non-target");
    assert_eq!(
        r.is_error,
        Some(true),
        "an unknown target is a tool-level error: {r:?}"
    );

    // Error cases: a bad run id is a tool-level error the agent can read;
    // an unknown tool and a missing argument are protocol errors.
    let r = client
        .call_tool(
            CallToolRequestParams::new("workflow_status")
                .with_arguments(args(json!({"run": "WFR-nope"}))),
        )
        .await
        .expect("status of a bad id");
    assert_eq!(r.is_error, Some(true));
    assert!(format!("{:?}", r.content).contains("WFR-nope"));
    assert!(
        client
            .call_tool(CallToolRequestParams::new("no_such_tool"))
            .await
            .is_err()
    );
    assert!(
        client
            .call_tool(CallToolRequestParams::new("workflow_status"))
            .await
            .is_err()
    );

    client.cancel().await.expect("close");
}

/// A `poimen mcp` client in `env`, with `global` arguments before `mcp`.
pub(crate) async fn mcp_client(
    env: &Env,
    global: &[&str],
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args(global)
        .arg("mcp")
        .current_dir(env.path())
        .env("POIMEN_HOME", env.path().join("home"))
        .env_remove("POIMEN_POLICY")
        .env_remove("POIMEN_CRASH_AT")
        .env("POIMEN_CACHE_DIR", crate::support::shared_cache());
    ().serve(TokioChildProcess::new(cmd).expect("spawn poimen mcp"))
        .await
        .expect("initialize")
}

pub(crate) async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    name: &'static str,
    a: Value,
) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(name).with_arguments(args(a)))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_judges_reconciles_and_calls_workflow_tools_under_a_key() {
    let env = Env::new();
    let gate = env.write(
        "gate.yaml",
        r#"
id: t.gate
steps:
  - id: ask
    judgment:
      question: Ship it?
      result_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
"#,
    );
    // A blocked run: a non-idempotent call whose outcome a crash left
    // unknown.
    let effect = crate::crash::setup(
        &env,
        &crate::crash::effect_workflow("ledger@^0.1", r#"{entry: {n: "{{ inputs.n }}"}}"#),
    );
    let blocked = crate::crash::run_and_kill(&env, &effect, "before_committed:2", r#"{"n": 1}"#);
    crate::crash::recover(&env);
    let shout = env.write(
        "shout.yaml",
        "id: t.shout\ntool: {name: shout}\ninputs: {type: object, properties: {text: {type: string}}, required: [text]}\nsteps:\n  - id: star\n    tool: {name: text@^0.1, args: {op: replace, pattern: \"[aeiou]\", replacement: \"*\", text: \"{{ inputs.text }}\"}}\n",
    );
    env.cmd()
        .args(["publish", shout.to_str().expect("utf8")])
        .assert()
        .success();
    let client = mcp_client(&env, &["--policy", "policy.toml"]).await;

    // Judgments: a run waits; list, show and submit over MCP; it completes.
    let r = call(
        &client,
        "workflow_run",
        json!({"target": gate, "input": {}}),
    )
    .await;
    let waiting = structured(&r);
    assert_eq!(waiting["status"], json!("waiting_judgment"), "{r:?}");
    let listed = structured(&call(&client, "judgment_list", json!({})).await);
    let open = listed["judgments"].as_array().expect("judgments");
    assert_eq!(open.len(), 1, "{listed}");
    let id = open[0]["id"].as_str().expect("id").to_owned();
    let shown = structured(&call(&client, "judgment_show", json!({"id": id})).await);
    let hash = shown["judgment"]["request_hash"]
        .as_str()
        .expect("request hash")
        .to_owned();
    // An answer outside the result schema is refused, readably.
    let r = call(
        &client,
        "judgment_submit",
        json!({"id": id, "request_hash": hash, "result": {"ok": "yes"}, "provenance": {"judge": "agent"}}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let r = call(
        &client,
        "judgment_submit",
        json!({"id": id, "request_hash": hash, "result": {"ok": true}, "provenance": {"judge": "agent"}}),
    )
    .await;
    assert_eq!(structured(&r)["status"], json!("completed"), "{r:?}");
    assert_eq!(structured(&r)["run"], waiting["run"]);

    // Reconcile the blocked run: the call did happen, with this output.
    let r = call(
        &client,
        "workflow_reconcile",
        json!({"run": blocked, "step": "effect", "committed": {"written": 1}}),
    )
    .await;
    assert_eq!(structured(&r)["status"], json!("completed"), "{r:?}");

    // A workflow tool under an idempotency key: the same call returns the
    // same run; another input under the key is refused.
    let keyed = |text: &str| {
        let mut p = CallToolRequestParams::new("shout").with_arguments(args(json!({"text": text})));
        p.meta = Some(rmcp::model::RequestMetaObject::from(args(
            json!({"idempotency_key": "order-17"}),
        )));
        p
    };
    let first = structured(&client.call_tool(keyed("poimen")).await.expect("call"));
    assert_eq!(first["status"], json!("completed"), "{first}");
    let again = structured(&client.call_tool(keyed("poimen")).await.expect("call"));
    assert_eq!(again["run"], first["run"], "the key returns the first run");
    let other = client.call_tool(keyed("other")).await.expect("call");
    assert_eq!(other.is_error, Some(true), "{other:?}");
    client.cancel().await.expect("close");

    // No custom definitions: workflow_run of a file path is refused; an
    // armed version, named by its id, starts.
    env.write(
        "strict.toml",
        "[workflows]\nallow-custom-definitions = false\n",
    );
    env.cmd()
        .args(["--policy", "strict.toml", "arm", "t.shout@latest"])
        .assert()
        .success();
    let client = mcp_client(&env, &["--policy", "strict.toml"]).await;
    let r = call(
        &client,
        "workflow_run",
        json!({"target": gate, "input": {}}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert!(
        format!("{:?}", r.content).contains("allow-custom-definitions = false"),
        "{r:?}"
    );
    let r = call(
        &client,
        "workflow_run",
        json!({"target": "t.shout", "input": {"text": "abc"}}),
    )
    .await;
    assert_eq!(structured(&r)["status"], json!("completed"), "{r:?}");
    client.cancel().await.expect("close");
}
