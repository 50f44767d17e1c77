//! The Model Context Protocol server (`poimen mcp`): workflows as tools for
//! AI agents, over stdio, with the official Rust SDK (`rmcp`).
//!
//! Fixed tools: `workflow_list`, `workflow_actions`, `workflow_plan`,
//! `workflow_run`, `workflow_status`, `workflow_resume`, `workflow_cancel`,
//! `workflow_retry`, `workflow_audit`, `workflow_reconcile`, and
//! `judgment_list`, `judgment_show`, `judgment_submit`. Besides those, every
//! workflow registered as a tool (`tool:`) is a tool of its own, with its
//! input and output schemas; calling it runs the registered (armed)
//! version, under the idempotency key in the request's
//! `_meta.idempotency_key` when there is one. What the host's policy says
//! holds here as everywhere: with `allow-custom-definitions = false`,
//! `workflow_run` starts only armed versions, never a file path.
//!
//! A tool that ran and did not work (a failed run, an unknown run id) is a
//! tool-level error the agent can read; only an unknown tool name or
//! arguments of the wrong shape are protocol errors.

use std::sync::Arc;
use tracing::Instrument;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};

use poimen::{Host, Target};

/// The fixed tools: name, description, input schema.
fn fixed_tools() -> Vec<(&'static str, &'static str, Value)> {
    let run = json!({"type": "object", "properties": {"run": {"type": "string", "description": "A run id (WFR-…)"}}, "required": ["run"]});
    let target = json!({"type": "string", "description": "A workflow file path or a published version (b3:…, abbreviations accepted)"});
    vec![
        (
            "workflow_list",
            "List published workflows with their latest versions.",
            json!({"type": "object", "properties": {}}),
        ),
        (
            "workflow_actions",
            "List the registered tools and verifiers with their capabilities, effect classes and shadow eligibility.",
            json!({"type": "object", "properties": {}}),
        ),
        (
            "workflow_plan",
            "Show the execution plan of a workflow: steps in order, fan-outs, resolved tools with digests, sandbox eligibility.",
            json!({"type": "object", "properties": {"target": target}, "required": ["target"]}),
        ),
        (
            "workflow_run",
            "Run a workflow on an input; returns the run id, its status and its output.",
            json!({"type": "object", "properties": {
                "target": target,
                "input": {"description": "The run's input (JSON)"},
                "idempotency_key": {"type": "string", "description": "Same key and input returns the existing run"}
            }, "required": ["target"]}),
        ),
        (
            "workflow_status",
            "A run's status and step states.",
            run.clone(),
        ),
        ("workflow_resume", "Drive a stopped run again.", run.clone()),
        ("workflow_cancel", "Cancel a run.", run.clone()),
        (
            "workflow_retry",
            "Run a failed run again from a step (by default the one that failed).",
            json!({"type": "object", "properties": {"run": {"type": "string"}, "from": {"type": "string"}}, "required": ["run"]}),
        ),
        (
            "workflow_audit",
            "A run's intent records, tool calls and verdicts with hostcall records.",
            run,
        ),
        (
            "workflow_reconcile",
            "Record what became of a tool call whose outcome is unknown (a blocked run): `committed` with the call's output, or `failed` with a reason; the run then goes on.",
            json!({"type": "object", "properties": {
                "run": {"type": "string", "description": "A run id (WFR-…)"},
                "step": {"type": "string", "description": "The step whose call is in doubt"},
                "committed": {"description": "The call happened: its output (JSON)"},
                "failed": {"type": "string", "description": "The call did not happen: why"}
            }, "required": ["run", "step"]}),
        ),
        (
            "judgment_list",
            "Open judgment requests: what each asks, its sources with hashes, the result schema and the request hash an answer must name.",
            json!({"type": "object", "properties": {}}),
        ),
        (
            "judgment_show",
            "One judgment request.",
            json!({"type": "object", "properties": {"id": {"type": "string", "description": "A judgment id (WFJ-…)"}}, "required": ["id"]}),
        ),
        (
            "judgment_submit",
            "Answer a judgment request; the answer is checked against the request's result schema before the run resumes.",
            json!({"type": "object", "properties": {
                "id": {"type": "string", "description": "A judgment id (WFJ-…)"},
                "request_hash": {"type": "string", "description": "The request hash from judgment_show: the answer is to exactly that request"},
                "result": {"description": "The answer (JSON), matching the request's result schema"},
                "provenance": {"type": "object", "description": "Who answered: {\"judge\": \"…\"}"},
                "executor": {"type": "string"},
                "profile": {"type": "string"}
            }, "required": ["id", "request_hash", "result", "provenance"]}),
        ),
    ]
}

fn object(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

/// The MCP server over a host.
#[derive(Debug, Clone)]
pub struct PoimenMcp {
    host: Host,
}

impl PoimenMcp {
    pub fn new(host: Host) -> Self {
        PoimenMcp { host }
    }

    async fn tools(&self) -> Result<Vec<Tool>, poimen::Error> {
        let mut tools: Vec<Tool> = fixed_tools()
            .into_iter()
            .map(|(name, description, schema)| Tool::new(name, description, object(schema)))
            .collect();
        for (version, def) in self.host.workflow_tools().await? {
            let Some(t) = &def.tool else { continue };
            let name = t.name.clone().unwrap_or_else(|| def.id.to_string());
            let description = t
                .description
                .clone()
                .or_else(|| def.description.clone())
                .unwrap_or_else(|| format!("Runs workflow `{}` ({})", def.id, version.short(12)));
            let description = format!(
                "{description} (A workflow run; set `_meta.idempotency_key` so a retried call returns the first run.)"
            );
            let input = def
                .inputs
                .clone()
                .unwrap_or_else(|| json!({"type": "object"}));
            let mut tool = Tool::new(name, description, object(input));
            // MCP output schemas describe objects; wrap the run's output.
            let output = json!({"type": "object", "properties": {
                "run": {"type": "string"},
                "status": {"type": "string"},
                "output": def.outputs.clone().unwrap_or(json!({})),
                "reason": {"type": ["string", "null"]}
            }, "required": ["run", "status"]});
            tool = tool.with_raw_output_schema(object(output));
            tools.push(tool);
        }
        Ok(tools)
    }

    async fn call(
        &self,
        name: &str,
        args: Map<String, Value>,
        idempotency_key: Option<String>,
    ) -> Result<CallToolResult, McpError> {
        let text = |key: &str| -> Result<String, McpError> {
            args.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    McpError::invalid_params(
                        format!("`{name}` needs a string argument `{key}`"),
                        None,
                    )
                })
        };
        let result: Result<Value, poimen::Error> = match name {
            "workflow_list" => self.host.workflows().await.map(|w| json!({"workflows": w})),
            "workflow_actions" => {
                let describe = |e: poimen::sandbox::Entry| {
                    json!({
                        "kind": e.kind, "name": e.info.name, "version": e.info.version.to_string(),
                        "digest": e.info.digest, "description": e.info.description, "effect": e.info.effect,
                        "capabilities": e.info.capabilities, "shadow_eligible": e.eligibility.is_ok(),
                        "input_schema": e.info.input_schema, "status": "ready",
                    })
                };
                let mut tools: Vec<Value> = self.host.tools().into_iter().map(describe).collect();
                let mut verifiers: Vec<Value> =
                    self.host.verifiers().into_iter().map(describe).collect();
                for w in self.host.withheld_plugins() {
                    let row = json!({
                        "kind": w.kind, "name": w.info.name, "version": w.info.version.to_string(),
                        "digest": w.info.digest, "description": w.info.description, "effect": w.info.effect,
                        "capabilities": w.info.capabilities, "shadow_eligible": false,
                        "input_schema": w.info.input_schema, "status": "withheld", "withheld": w.reason,
                    });
                    match w.kind {
                        poimen::sandbox::PluginKind::Tool => tools.push(row),
                        poimen::sandbox::PluginKind::Verifier => verifiers.push(row),
                    }
                }
                Ok(json!({"tools": tools, "verifiers": verifiers}))
            }
            "workflow_plan" => {
                let t = text("target")?;
                self.host
                    .plan(&Target::parse(&t))
                    .await
                    .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
            }
            "workflow_run" => {
                let t = text("target")?;
                let input = args.get("input").cloned().unwrap_or(json!({}));
                let key = args
                    .get("idempotency_key")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.host
                    .run(
                        &Target::parse(&t),
                        input,
                        poimen::RunOptions {
                            idempotency_key: key,
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|o| outcome(&o))
            }
            "workflow_status" => match run_id(&text("run")?) {
                Ok(run) => self.host.status(&run).await.map(
                    |(rec, state)| json!({"run": rec, "steps": state.steps, "output": state.output}),
                ),
                Err(e) => Err(e),
            },
            "workflow_resume" => match run_id(&text("run")?) {
                Ok(run) => self.host.resume(&run).await.map(|o| outcome(&o)),
                Err(e) => Err(e),
            },
            "workflow_cancel" => match run_id(&text("run")?) {
                Ok(run) => self.host.cancel(&run).await.map(|r| json!({"run": r})),
                Err(e) => Err(e),
            },
            "workflow_retry" => {
                let from = args
                    .get("from")
                    .and_then(Value::as_str)
                    .map(poimen::StepId::from);
                match run_id(&text("run")?) {
                    Ok(run) => self
                        .host
                        .retry(&run, from.as_ref())
                        .await
                        .map(|o| outcome(&o)),
                    Err(e) => Err(e),
                }
            }
            "workflow_audit" => match run_id(&text("run")?) {
                Ok(run) => self
                    .host
                    .audit(&run)
                    .await
                    .map(|a| serde_json::to_value(a).unwrap_or(Value::Null)),
                Err(e) => Err(e),
            },
            "workflow_reconcile" => {
                let decision = match (args.get("committed"), args.get("failed")) {
                    (Some(output), None) => poimen::Reconciliation::Committed {
                        output: output.clone(),
                    },
                    (None, Some(Value::String(reason))) => poimen::Reconciliation::Failed {
                        reason: reason.clone(),
                    },
                    _ => {
                        return Err(McpError::invalid_params(
                            "`workflow_reconcile` needs exactly one of `committed` (the call's output) or `failed` (a reason, a string)",
                            None,
                        ));
                    }
                };
                let step = poimen::StepId::from(text("step")?);
                match run_id(&text("run")?) {
                    Ok(run) => self
                        .host
                        .reconcile(&run, &step, decision)
                        .await
                        .map(|o| outcome(&o)),
                    Err(e) => Err(e),
                }
            }
            "judgment_list" => self
                .host
                .judgments()
                .await
                .map(|j| json!({"judgments": j})),
            "judgment_show" => match judgment_id(&text("id")?) {
                Ok(id) => self
                    .host
                    .judgment(&id)
                    .await
                    .map(|j| json!({"judgment": j})),
                Err(e) => Err(e),
            },
            "judgment_submit" => {
                let mut fields = args.clone();
                fields.remove("id");
                let submission: poimen::JudgmentSubmission =
                    serde_json::from_value(Value::Object(fields)).map_err(|e| {
                        McpError::invalid_params(
                            format!("`judgment_submit`: not a judgment submission ({e}); give `request_hash`, `result` and `provenance: {{\"judge\": …}}`"),
                            None,
                        )
                    })?;
                match judgment_id(&text("id")?) {
                    Ok(id) => self
                        .host
                        .submit_judgment(&id, submission)
                        .await
                        .map(|o| outcome(&o)),
                    Err(e) => Err(e),
                }
            }
            other => {
                let tools = self.host.workflow_tools().await.map_err(internal)?;
                let found = tools.into_iter().find(|(_, d)| {
                    d.tool
                        .as_ref()
                        .map(|t| t.name.clone().unwrap_or_else(|| d.id.to_string()))
                        .as_deref()
                        == Some(other)
                });
                let Some((version, _)) = found else {
                    return Err(McpError::invalid_params(
                        format!("no tool named `{other}`; `tools/list` shows what there is"),
                        None,
                    ));
                };
                // A call under an idempotency key (`_meta.idempotency_key`)
                // returns the run it started the first time.
                self.host
                    .run(
                        &Target::Version(version.to_string()),
                        Value::Object(args.clone()),
                        poimen::RunOptions {
                            idempotency_key: idempotency_key.clone(),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|o| outcome(&o))
            }
        };
        Ok(match result {
            Ok(v) => {
                let failed = matches!(
                    v.get("status").and_then(Value::as_str),
                    Some("failed" | "cancelled")
                );
                if failed {
                    CallToolResult::structured_error(v)
                } else {
                    CallToolResult::structured(v)
                }
            }
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        })
    }
}

/// A run id an agent gave: a malformed one is a tool-level error the agent
/// can read and correct, like an unknown one.
fn run_id(text: &str) -> Result<poimen::RunId, poimen::Error> {
    text.parse::<poimen::RunId>().map_err(poimen::Error::from)
}

/// A judgment id an agent gave, checked like a run id.
fn judgment_id(text: &str) -> Result<poimen::JudgmentId, poimen::Error> {
    text.parse::<poimen::JudgmentId>()
        .map_err(poimen::Error::from)
}

fn outcome(o: &poimen::RunOutcome) -> Value {
    json!({"run": o.run, "status": o.status, "output": o.output, "reason": o.reason})
}

fn internal(e: poimen::Error) -> McpError {
    McpError::internal_error(e.to_string(), None)
}

impl ServerHandler for PoimenMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("poimen", env!("CARGO_PKG_VERSION"));
        info.with_instructions(
            "poimen runs workflows defined as data. Use workflow_list and workflow_actions to see what exists, \
             workflow_plan before workflow_run, and workflow_status/workflow_audit to inspect runs.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(
            self.tools().await.map_err(internal)?,
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        // The request's `_meta` (the SDK hands it over in the context).
        let key = request
            .meta
            .as_ref()
            .and_then(|m| m.get("idempotency_key"))
            .or_else(|| context.meta.get("idempotency_key"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        // A W3C trace context in `_meta` (`traceparent`, `tracestate`)
        // continues the caller's trace into the call and its run.
        let mut trace = serde_json::Map::new();
        for field in ["traceparent", "tracestate"] {
            if let Some(v) = request
                .meta
                .as_ref()
                .and_then(|m| m.get(field))
                .or_else(|| context.meta.get(field))
            {
                trace.insert(field.to_owned(), v.clone());
            }
        }
        let span = crate::telemetry::mcp_span(&request.name, Some(&trace));
        self.call(&request.name, args, key)
            .instrument(span)
            .await
            .map(CallToolResponse::from)
    }
}

/// Serves MCP on stdin/stdout until the client disconnects.
pub async fn serve_stdio(host: Host) -> anyhow::Result<()> {
    let server = PoimenMcp::new(host)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("the MCP connection failed: {e}"))?;
    server
        .waiting()
        .await
        .map_err(|e| anyhow::anyhow!("the MCP connection failed: {e}"))?;
    Ok(())
}
