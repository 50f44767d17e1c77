//! The public invocations: resolve the pinned component, run the guest
//! under the component's limits (tightened by the caller), check a tool's
//! result against its declared output schema, and return the outcome with
//! its hostcall record — whatever happened, there is a record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use poimen_workflow::ToolRef;
use serde_json::Value;

use super::PluginHost;
use super::call::{GuestVerdict, Invocation, ToolRequest, VerifierInvocation, VerifierRequest};
use super::guest::{GuestCall, Returned, tool_error};
use crate::error::InvokeError;
use crate::limits::CallLimits;
use crate::record::{Baseline, CallKind, Captured, HostcallRecord, Outcome, b3};
use crate::registry::{Loaded, PluginKind};
use crate::state;

pub(super) fn canonical(v: &Value) -> Result<String, InvokeError> {
    crate::canonical::to_string(v)
        .map_err(|e| InvokeError::Host(format!("cannot canonicalize JSON: {e}")))
}

/// What a successful outcome hashes as: its canonical JSON text.
trait CanonicalText {
    fn canonical_text(&self) -> String;
}

impl CanonicalText for Value {
    fn canonical_text(&self) -> String {
        crate::canonical::to_string(self).unwrap_or_default()
    }
}

impl CanonicalText for GuestVerdict {
    fn canonical_text(&self) -> String {
        serde_json::to_value(self)
            .map(|v| v.canonical_text())
            .unwrap_or_default()
    }
}

impl PluginHost {
    fn resolve(
        &self,
        kind: PluginKind,
        r: &ToolRef,
        digest: Option<&str>,
    ) -> Result<Arc<Loaded>, InvokeError> {
        self.with_registry(|reg| reg.resolve(kind, r, digest))
    }

    pub(super) fn record(
        kind: CallKind,
        requested: String,
        args: String,
        key: Option<String>,
        limits: CallLimits,
    ) -> HostcallRecord {
        HostcallRecord {
            kind,
            requested,
            tool: None,
            args_hash: b3(args.as_bytes()),
            args,
            idempotency_key: key,
            capabilities: Vec::new(),
            limits,
            host_calls: Vec::new(),
            refusals: Vec::new(),
            baseline: Baseline::default(),
            outcome: Outcome::Error {
                kind: String::new(),
                message: String::new(),
            },
            fuel_consumed: None,
            wall_time_us: 0,
            stderr: Captured::default(),
        }
    }

    fn effective_limits(entry: &Loaded, timeout: Option<Duration>) -> CallLimits {
        let mut limits = entry.limits;
        if let Some(t) = timeout {
            limits.timeout = limits.timeout.min(t);
        }
        limits
    }

    /// Invokes a tool. Never fails outright: the outcome is in the result,
    /// and there is a record either way.
    pub async fn invoke_tool(&self, call: ToolRequest) -> Invocation {
        let started = Instant::now();
        let args = canonical(&call.args);
        let mut record = Self::record(
            CallKind::Tool,
            call.tool.to_string(),
            args.as_ref().map_or_else(|_| String::new(), Clone::clone),
            Some(call.idempotency_key.clone()),
            self.inner.base_limits,
        );
        let outcome = async {
            args?;
            let entry = self.resolve(
                PluginKind::Tool,
                &call.tool,
                call.expected_digest.as_deref(),
            )?;
            record.tool = Some(entry.identity.clone());
            record.capabilities = entry.grants.clone();
            let limits = Self::effective_limits(&entry, call.timeout);
            record.limits = limits;
            let seed = state::seed(&call.idempotency_key, &record.args_hash);
            let run = self
                .run_guest(
                    &entry.pre,
                    &entry.grants,
                    limits,
                    &seed,
                    GuestCall::Invoke {
                        args: &record.args,
                        key: &call.idempotency_key,
                    },
                )
                .await;
            match self.fill(&mut record, run, &entry.info.name, started)? {
                Returned::Invoked(Ok(text)) => {
                    if text.len() as u64 > limits.output_bytes {
                        return Err(InvokeError::OutputTooLarge {
                            bytes: text.len() as u64,
                            limit_bytes: limits.output_bytes,
                        });
                    }
                    let output = serde_json::from_str::<Value>(&text).map_err(|e| {
                        InvokeError::InvalidOutput(format!("the result is not JSON: {e}"))
                    })?;
                    entry.output_schema.check(&output).map_err(|violations| {
                        InvokeError::OutputSchema {
                            tool: format!("{}@{}", entry.info.name, entry.info.version),
                            violations,
                        }
                    })?;
                    Ok(output)
                }
                Returned::Invoked(Err(e)) => Err(InvokeError::Tool(tool_error(e))),
                _ => Err(InvokeError::Host("unexpected return".into())),
            }
        }
        .await;
        Self::finish(&mut record, &outcome, started);
        Invocation { outcome, record }
    }

    /// Invokes a verifier. As [`invoke_tool`](Self::invoke_tool), the
    /// record is there whatever happens.
    pub async fn invoke_verifier(&self, call: VerifierRequest) -> VerifierInvocation {
        let started = Instant::now();
        let parts = (
            canonical(&call.input),
            canonical(&call.output),
            canonical(&call.config),
        );
        let args = canonical(
            &serde_json::json!({"config": call.config, "input": call.input, "output": call.output}),
        );
        let mut record = Self::record(
            CallKind::Verifier,
            call.verifier.to_string(),
            args.as_ref().map_or_else(|_| String::new(), Clone::clone),
            None,
            self.inner.base_limits,
        );
        let outcome = async {
            args?;
            let (input, output, config) = (parts.0?, parts.1?, parts.2?);
            let entry = self.resolve(
                PluginKind::Verifier,
                &call.verifier,
                call.expected_digest.as_deref(),
            )?;
            record.tool = Some(entry.identity.clone());
            record.capabilities = entry.grants.clone();
            let limits = Self::effective_limits(&entry, call.timeout);
            record.limits = limits;
            let seed = state::seed("", &record.args_hash);
            let run = self
                .run_guest(
                    &entry.pre,
                    &entry.grants,
                    limits,
                    &seed,
                    GuestCall::Verify {
                        input: &input,
                        output: &output,
                        config: &config,
                    },
                )
                .await;
            match self.fill(&mut record, run, &entry.info.name, started)? {
                Returned::Verified(Ok(v)) => {
                    if v.reason.len() as u64 > limits.output_bytes {
                        return Err(InvokeError::OutputTooLarge {
                            bytes: v.reason.len() as u64,
                            limit_bytes: limits.output_bytes,
                        });
                    }
                    if !(0.0..=1.0).contains(&v.score) {
                        return Err(InvokeError::InvalidOutput(format!(
                            "score {} is outside 0..=1",
                            v.score
                        )));
                    }
                    Ok(GuestVerdict {
                        pass: v.pass,
                        score: v.score,
                        reason: v.reason,
                    })
                }
                Returned::Verified(Err(e)) => Err(InvokeError::Tool(tool_error(e))),
                _ => Err(InvokeError::Host("unexpected return".into())),
            }
        }
        .await;
        Self::finish(&mut record, &outcome, started);
        VerifierInvocation { outcome, record }
    }

    fn finish<T: CanonicalText>(
        record: &mut HostcallRecord,
        outcome: &Result<T, InvokeError>,
        started: Instant,
    ) {
        record.outcome = match outcome {
            Ok(v) => {
                let text = v.canonical_text();
                Outcome::Ok {
                    output_hash: b3(text.as_bytes()),
                    output_bytes: text.len() as u64,
                }
            }
            Err(e) => Outcome::Error {
                kind: e.kind().to_owned(),
                message: e.to_string(),
            },
        };
        record.wall_time_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    }
}
