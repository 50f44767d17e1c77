//! The public invocations: resolve the pinned component, run the guest
//! under the component's limits (tightened by the caller), check a tool's
//! result against its declared output schema, and return the outcome with
//! its hostcall record — whatever happened, there is a record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use poimen_workflow::ToolRef;
use serde_json::Value;

use super::PluginHost;
use super::call::{
    GuestVerdict, Invocation, Repeatable, ToolRequest, VerifierInvocation, VerifierRequest,
};
use super::guest::{GuestCall, Returned, tool_error};
use crate::error::InvokeError;
use crate::limits::{CallLimits, Resource};
use crate::record::{Baseline, CallKind, Captured, HostcallRecord, Outcome, b3};
use crate::registry::{Loaded, PluginKind};
use crate::state;

pub(super) fn canonical(v: &Value) -> Result<String, InvokeError> {
    crate::canonical::to_string(v)
        .map_err(|e| InvokeError::Host(format!("cannot canonicalize JSON: {e}")))
}

/// A tool's result, parsed — after counting its values without building
/// them, so a result of too many is refused before the host holds it.
fn parse_output(text: &str, max_values: u64) -> Result<Value, InvokeError> {
    let not_json =
        |e: serde_json::Error| InvokeError::InvalidOutput(format!("the result is not JSON: {e}"));
    let mut budget = Budget {
        left: max_values,
        over: false,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    match serde::de::DeserializeSeed::deserialize(Values(&mut budget), &mut de) {
        Ok(()) => {}
        Err(_) if budget.over => {
            return Err(InvokeError::ResourceExhausted {
                resource: Resource::OutputValues,
                limit: max_values,
            });
        }
        Err(e) => return Err(not_json(e)),
    }
    serde_json::from_str::<Value>(text).map_err(not_json)
}

/// How many more values a result may hold, and whether it held more.
struct Budget {
    left: u64,
    over: bool,
}

/// Counts JSON values down from the budget it holds, failing when it runs
/// out.
struct Values<'a>(&'a mut Budget);

impl Values<'_> {
    fn take<E: serde::de::Error>(&mut self) -> Result<(), E> {
        if self.0.left == 0 {
            self.0.over = true;
            return Err(E::custom("too many values"));
        }
        self.0.left -= 1;
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Values<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Values<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(mut self, _: bool) -> Result<(), E> {
        self.take()
    }
    fn visit_i64<E: serde::de::Error>(mut self, _: i64) -> Result<(), E> {
        self.take()
    }
    fn visit_u64<E: serde::de::Error>(mut self, _: u64) -> Result<(), E> {
        self.take()
    }
    fn visit_f64<E: serde::de::Error>(mut self, _: f64) -> Result<(), E> {
        self.take()
    }
    fn visit_str<E: serde::de::Error>(mut self, _: &str) -> Result<(), E> {
        self.take()
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.take()
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(Values(self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.take()?;
        while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            map.next_value_seed(Values(self.0))?;
        }
        Ok(())
    }
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

    /// Whether a call to the tool `tool` (the component of `digest`) can
    /// have no effect outside its result: the component declares itself
    /// pure and policy grants it nothing an effect could go through — no
    /// network (`http`) and no writable mount (`fs-write`); a read-only
    /// mount and the per-call scratch directory leave nothing behind. Such
    /// a call may be made again at will, so a caller needs no write-ahead
    /// record of it before making it. `false` when the tool does not
    /// resolve (the call will fail, and say why).
    pub fn effect_free(&self, tool: &ToolRef, digest: &str) -> bool {
        self.resolve(PluginKind::Tool, tool, Some(digest))
            .is_ok_and(|entry| {
                entry.info.effect == poimen_workflow::EffectClass::Pure
                    && entry.grants.iter().all(|g| {
                        !matches!(
                            g.capability,
                            poimen_workflow::Capability::Http
                                | poimen_workflow::Capability::FilesystemWrite { .. }
                        )
                    })
            })
    }

    /// What a call to the component `r` (of `digest`, when given) would run
    /// under, when its outcome is a function of its component, arguments,
    /// limits and random seed alone: the component resolves, policy grants
    /// it nothing (no mount, no network — the guest sees only the frozen
    /// clocks, the seeded random source and captured stdio), and a tool
    /// declares itself pure. A caller may then answer a call from an
    /// identical earlier one (same digest, same canonical arguments, same
    /// limits but for the timeout) instead of making it; for a tool, only
    /// when the earlier call drew nothing from its random source, whose seed
    /// is the call's idempotency key (a verifier's seed is its arguments).
    /// `None` when any of that does not hold.
    pub fn repeatable(
        &self,
        kind: PluginKind,
        r: &ToolRef,
        digest: Option<&str>,
    ) -> Option<Repeatable> {
        let entry = self.resolve(kind, r, digest).ok()?;
        let pure =
            kind == PluginKind::Verifier || entry.info.effect == poimen_workflow::EffectClass::Pure;
        (pure && entry.grants.is_empty()).then(|| Repeatable {
            digest: entry.identity.digest.clone(),
            limits: entry.limits,
        })
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
            omitted: Default::default(),
            baseline: Baseline::default(),
            outcome: Outcome::Error {
                kind: String::new(),
                message: String::new(),
            },
            fuel_consumed: None,
            memory_peak_bytes: None,
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
                    let output = parse_output(&text, limits.output_nodes)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_refused_for_its_number_of_values_before_it_is_built() {
        assert_eq!(
            parse_output(r#"{"a": [1, "x", null, true, {"b": 2.5}]}"#, 8),
            Ok(serde_json::json!({"a": [1, "x", null, true, {"b": 2.5}]}))
        );
        // Eight values: the object, the array, four items, the inner
        // object and its number.
        let many = r#"{"a": [1, "x", null, true, {"b": 2.5}]}"#;
        match parse_output(many, 7) {
            Err(InvokeError::ResourceExhausted { resource, limit }) => {
                assert_eq!((resource, limit), (Resource::OutputValues, 7));
            }
            other => panic!("expected the values limit, got {other:?}"),
        }
        let tiny = format!("[{}{{}}]", "{},".repeat(1_000_000));
        assert!(matches!(
            parse_output(&tiny, 1 << 18),
            Err(InvokeError::ResourceExhausted { .. })
        ));
        // Bad JSON that stays within the budget is bad JSON.
        assert!(matches!(
            parse_output("[1, 2", 3),
            Err(InvokeError::InvalidOutput(_))
        ));
        assert!(matches!(
            parse_output("{} x", 100),
            Err(InvokeError::InvalidOutput(_))
        ));
    }
}
