//! The Model Context Protocol server (`poimen mcp`): workflows as tools for
//! AI agents, over stdio, with the official Rust SDK (`rmcp`).
//!
//! Fixed tools: `workflow_list`, `workflow_actions`, `workflow_plan`,
//! `workflow_run`, `workflow_status`, `workflow_resume`, `workflow_cancel`,
//! `workflow_retry`, `workflow_audit`. Besides those, every published
//! workflow that declares `tool:` is a tool of its own, with its input and
//! output schemas; calling it runs the workflow's latest version.
//!
//! A tool that ran and did not work (a failed run, an unknown run id) is a
//! tool-level error the agent can read; only an unknown tool name or
//! arguments of the wrong shape are protocol errors.

use std::sync::Arc;

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

    async fn call(&self, name: &str, args: Map<String, Value>) -> Result<CallToolResult, McpError> {
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
                            tenant: None,
                        },
                    )
                    .await
                    .map(|o| outcome(&o))
            }
            "workflow_status" => self.host.status(&text("run")?).await.map(
                |(rec, state)| json!({"run": rec, "steps": state.steps, "output": state.output}),
            ),
            "workflow_resume" => self.host.resume(&text("run")?).await.map(|o| outcome(&o)),
            "workflow_cancel" => self
                .host
                .cancel(&text("run")?)
                .await
                .map(|r| json!({"run": r})),
            "workflow_retry" => {
                let from = args.get("from").and_then(Value::as_str);
                self.host
                    .retry(&text("run")?, from)
                    .await
                    .map(|o| outcome(&o))
            }
            "workflow_audit" => self
                .host
                .audit(&text("run")?)
                .await
                .map(|a| serde_json::to_value(a).unwrap_or(Value::Null)),
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
                self.host
                    .run(
                        &Target::Version(version.to_string()),
                        Value::Object(args.clone()),
                        poimen::RunOptions::default(),
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        self.call(&request.name, args)
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
