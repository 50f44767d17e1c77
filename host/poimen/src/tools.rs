//! The sandbox as the executor's `ToolHost`.
//!
//! The only place where the executor's vocabulary (tool identity, failure
//! classes) meets the sandbox's (invocations, hostcall records, invoke
//! errors). Every call pins the component digest the run recorded, so a
//! component changed on disk is refused instead of silently run.

use async_trait::async_trait;
use poimen_executor::{
    Failure, FailureClass, ToolCall, ToolHost, ToolIdentity, ToolResult, Verdict, VerifierCall,
    VerifierResult,
};
use poimen_sandbox::{InvokeError, ToolError};
use poimen_workflow::ToolRef;

/// Tools and verifiers run by a [`poimen_sandbox::PluginHost`].
#[derive(Debug, Clone)]
pub struct SandboxTools {
    pub host: poimen_sandbox::PluginHost,
}

impl SandboxTools {
    pub fn new(host: poimen_sandbox::PluginHost) -> Self {
        SandboxTools { host }
    }
}

/// The failure class of an invocation error, for the retry policy.
pub fn classify(e: &InvokeError) -> FailureClass {
    match e {
        InvokeError::Tool(ToolError::InvalidInput(_)) => FailureClass::InvalidInput,
        InvokeError::Tool(ToolError::Unavailable(_))
        | InvokeError::NotFound(_)
        | InvokeError::DigestMismatch { .. }
        | InvokeError::Host(_) => FailureClass::Unavailable,
        InvokeError::Timeout { .. } => FailureClass::Timeout,
        // The component broke its own declared contract (its output
        // schema): a contract failure, carried as data (see `failure`).
        InvokeError::OutputSchema { .. } => FailureClass::Contract,
        _ => FailureClass::Failed,
    }
}

/// The failure of a call to the component `pinned` (the run's pin), naming
/// it if this host no longer has it.
fn failure_of(e: InvokeError, pinned: Option<&ToolIdentity>) -> Failure {
    if let InvokeError::OutputSchema { tool, violations } = e {
        return Failure::contract(poimen_executor::Contract::ToolOutput { tool, violations });
    }
    if let (InvokeError::NotFound(_), Some(p)) = (&e, pinned) {
        return Failure::new(
            FailureClass::Unavailable,
            format!(
                "`{}` {} ({}), which this run pinned at its start, is not loaded on this host ({e}); add it back with `poimen plugin add` and retry the run",
                p.name, p.version, p.digest
            ),
        );
    }
    let class = classify(&e);
    let message = match &e {
        InvokeError::DigestMismatch { .. } => {
            format!(
                "{e}; the component changed on disk since the run pinned it — restore it, or retry the run"
            )
        }
        _ => e.to_string(),
    };
    Failure::new(class, message)
}

/// The exact reference to a pinned component: its name at its version.
fn exact(identity: &ToolIdentity) -> ToolRef {
    let req = format!("={}", identity.version);
    ToolRef {
        name: identity.name.clone(),
        version: semver::VersionReq::parse(&req).unwrap_or(semver::VersionReq::STAR),
    }
}

#[async_trait]
impl ToolHost for SandboxTools {
    async fn invoke(&self, call: ToolCall) -> ToolResult {
        let pinned = call.tool.clone();
        let request =
            poimen_sandbox::ToolRequest::new(exact(&call.tool), call.args, call.idempotency_key)
                .pinned(call.tool.digest.clone())
                .timeout(call.timeout);
        let inv = self.host.invoke_tool(request).await;
        let capabilities = inv
            .record
            .capabilities
            .iter()
            .map(|g| g.capability.clone())
            .collect();
        ToolResult {
            outcome: inv.outcome.map_err(|e| failure_of(e, Some(&pinned))),
            record: inv.record.to_json(),
            capabilities,
        }
    }

    fn effect_free(&self, tool: &ToolIdentity) -> bool {
        self.host.effect_free(&exact(tool), &tool.digest)
    }

    async fn verify(&self, call: VerifierCall) -> VerifierResult {
        let mut request = poimen_sandbox::VerifierRequest::new(
            exact(&call.verifier),
            call.input,
            call.output,
            call.config,
        );
        request.expected_digest = Some(call.verifier.digest.clone());
        let pinned = call.verifier.clone();
        request.timeout = Some(call.timeout);
        let inv = self.host.invoke_verifier(request).await;
        VerifierResult {
            outcome: inv
                .outcome
                .map(|v| Verdict {
                    pass: v.pass,
                    score: v.score,
                    reason: v.reason,
                })
                .map_err(|e| failure_of(e, Some(&pinned))),
            record: inv.record.to_json(),
        }
    }
}
