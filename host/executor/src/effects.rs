//! The executor's only doors to the world: tools, verifiers, models and the
//! clock, each a trait.
//!
//! The interpreter never calls wasmtime, an HTTP client or the system clock
//! directly. Live runs, crash recovery, tests and shadow evaluation are
//! different implementations of these traits, not branches in the walk. This
//! module owns the traits and the plain data that crosses them; it knows
//! nothing of how any implementation works.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use poimen_workflow::{Capability, ReasoningEffort};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool or verifier as pinned by a run: name, exact version, component digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ToolIdentity {
    pub name: String,
    pub version: String,
    /// `b3:`-prefixed Blake3 digest of the component.
    pub digest: String,
}

/// Why a tool, verifier or model attempt did not produce a result. The
/// classes map onto the retry policy's `on` set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The callee rejected its input: retrying the same input cannot help.
    InvalidInput,
    /// The callee ran and reported failure, or trapped, or broke a limit.
    Failed,
    /// A dependency was not there (endpoint down, component missing or changed).
    Unavailable,
    /// The attempt ran out of time.
    Timeout,
    /// A verifier rejected the output.
    Verifier,
    /// The run was cancelled, or the branch lost its join.
    Cancelled,
    /// A value broke a contract the workflow or the tool declares (a state
    /// key's schema, a reducer's type, a tool's or model's output schema).
    Contract,
}

impl FailureClass {
    /// The retry-policy class this failure falls under, if any.
    pub fn retry_class(self) -> Option<poimen_workflow::RetryOn> {
        match self {
            FailureClass::Failed => Some(poimen_workflow::RetryOn::Failed),
            FailureClass::Unavailable => Some(poimen_workflow::RetryOn::Unavailable),
            FailureClass::Timeout => Some(poimen_workflow::RetryOn::Timeout),
            FailureClass::Verifier => Some(poimen_workflow::RetryOn::Verifier),
            // A producer that broke its contract may do better on another
            // attempt (a model); a deterministic one fails again.
            FailureClass::Contract => Some(poimen_workflow::RetryOn::Failed),
            FailureClass::InvalidInput | FailureClass::Cancelled => None,
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailureClass::InvalidInput => "invalid input",
            FailureClass::Failed => "failed",
            FailureClass::Unavailable => "unavailable",
            FailureClass::Timeout => "timeout",
            FailureClass::Verifier => "rejected by a verifier",
            FailureClass::Cancelled => "cancelled",
            FailureClass::Contract => "broke a declared contract",
        })
    }
}

/// A failure with its class and a message naming the cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub class: FailureClass,
    pub message: String,
    /// The broken contract, as data, when the class is `contract`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<Box<Contract>>,
}

impl Failure {
    pub fn new(class: FailureClass, message: impl Into<String>) -> Self {
        Failure {
            class,
            message: message.into(),
            contract: None,
        }
    }

    /// A broken contract.
    pub fn contract(c: Contract) -> Self {
        Failure {
            class: FailureClass::Contract,
            message: c.to_string(),
            contract: Some(Box::new(c)),
        }
    }
}

/// The JSON type of a value, as a reducer's refusal names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JsonType {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl JsonType {
    pub fn of(v: &Value) -> JsonType {
        match v {
            Value::Null => JsonType::Null,
            Value::Bool(_) => JsonType::Bool,
            Value::Number(_) => JsonType::Number,
            Value::String(_) => JsonType::String,
            Value::Array(_) => JsonType::Array,
            Value::Object(_) => JsonType::Object,
        }
    }
}

impl std::fmt::Display for JsonType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JsonType::Null => "null",
            JsonType::Bool => "a boolean",
            JsonType::Number => "a number",
            JsonType::String => "a string",
            JsonType::Array => "a list",
            JsonType::Object => "an object",
        })
    }
}

/// A contract a value broke: which, where, and which rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "contract", rename_all = "snake_case")]
pub enum Contract {
    /// A write to a declared state key breaks the key's schema.
    #[error("the value written to state key `{key}` breaks its schema: {}", crate::schema::Violations(.violations.clone()))]
    StateSchema {
        key: String,
        violations: Vec<poimen_workflow::SchemaViolation>,
    },
    /// A reducer cannot combine the write with the key's current value.
    #[error(
        "state key `{key}` ({reducer:?}) holds {value} and cannot take a write of {write}: `merge` combines objects, `append` and `union` extend lists"
    )]
    Reducer {
        key: String,
        reducer: poimen_workflow::Reducer,
        value: JsonType,
        write: JsonType,
    },
    /// A tool's output breaks its declared output schema.
    #[error("tool `{tool}` returned output that breaks its declared output schema: {}", crate::schema::Violations(.violations.clone()))]
    ToolOutput {
        tool: String,
        violations: Vec<poimen_workflow::SchemaViolation>,
    },
    /// A model step's answer breaks the step's schema.
    #[error("the model's answer breaks the step's schema: {}", crate::schema::Violations(.violations.clone()))]
    ModelOutput {
        violations: Vec<poimen_workflow::SchemaViolation>,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class, self.message)
    }
}

/// One tool invocation as the interpreter asks for it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// The exact tool the run pinned.
    pub tool: ToolIdentity,
    pub args: Value,
    /// Derived from (run, step, iteration): the same on every attempt and
    /// every re-dispatch after a crash.
    pub idempotency_key: String,
    pub timeout: Duration,
}

/// What came back from a tool invocation.
#[derive(Debug, Clone)]
pub struct ToolResult {
    pub outcome: Result<Value, Failure>,
    /// The hostcall record (identity, arguments, capabilities, host calls,
    /// outcome, fuel, time), as data.
    pub record: Value,
    /// Capabilities the call ran with.
    pub capabilities: Vec<Capability>,
}

/// One verifier invocation.
#[derive(Debug, Clone)]
pub struct VerifierCall {
    pub verifier: ToolIdentity,
    /// The attempt's input (its rendered arguments or prompt).
    pub input: Value,
    /// The attempt's output.
    pub output: Value,
    pub config: Value,
    pub timeout: Duration,
}

/// A verifier's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub pass: bool,
    /// In 0..=1.
    pub score: f64,
    pub reason: String,
}

/// What came back from a verifier invocation.
#[derive(Debug, Clone)]
pub struct VerifierResult {
    pub outcome: Result<Verdict, Failure>,
    pub record: Value,
}

/// Where tools and verifiers run (the sandbox, in a live host).
#[async_trait]
pub trait ToolHost: Send + Sync {
    /// Invokes a tool. Dropping the future must interrupt the call promptly.
    async fn invoke(&self, call: ToolCall) -> ToolResult;
    /// Invokes a verifier. Dropping the future must interrupt the call promptly.
    async fn verify(&self, call: VerifierCall) -> VerifierResult;
    /// Whether a call to `tool` can have no effect outside its result (a
    /// pure component granted no network and no writable mount), so that
    /// making it again is always safe. The intent wrapper then writes the
    /// call's `Pending` and `Dispatched` with its outcome instead of ahead
    /// of the call (see `run/intent.rs`). `false` — the write-ahead path —
    /// unless the host knows better.
    fn effect_free(&self, tool: &ToolIdentity) -> bool {
        let _ = tool;
        false
    }
}

/// Tokens used by one model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.tokens_in.saturating_add(self.tokens_out)
    }
}

/// One model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    pub system: Option<String>,
    pub prompt: String,
    /// Model override; the provider's default when absent.
    pub model: Option<String>,
    pub effort: ReasoningEffort,
    /// The output must parse as JSON.
    pub json: bool,
    /// A JSON Schema the output must satisfy (implies `json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Tools offered to the model (the step's `tools`), as pinned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolIdentity>,
    pub max_tokens: Option<u64>,
    #[serde(skip)]
    pub timeout: Duration,
}

impl ModelRequest {
    /// Everything of this request that reaches the provider — provider,
    /// model (the step's, else the provider's default), every parameter,
    /// the rendered messages by their blob hashes — as the JSON a run
    /// records before the call and hashes. Two requests with the same
    /// identity ask the same thing; shadow evaluation replays a recorded
    /// answer only for an identical one.
    pub fn identity(&self, provider: &str, default_model: &str) -> Value {
        let blob = |s: &str| format!("b3:{}", blake3::hash(s.as_bytes()).to_hex());
        serde_json::json!({
            "provider": provider,
            "model": self.model.as_deref().unwrap_or(default_model),
            "system": self.system.as_deref().map(blob),
            "prompt": blob(&self.prompt),
            "effort": self.effort,
            "json": self.json,
            "schema": self.schema,
            "tools": self.tools,
            "max_tokens": self.max_tokens,
        })
    }
}

/// A model's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    pub text: String,
    /// The model that answered, as the provider names it.
    pub model: String,
    pub usage: Usage,
}

/// Who answers model steps.
#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// Provider name recorded in receipts (`openai-compatible`, `scripted`).
    fn provider(&self) -> &str;
    /// Model used when a step names none.
    fn default_model(&self) -> &str;
    /// One completion. Failures name their cause; an unusable answer is
    /// `Failed`, an unreachable endpoint `Unavailable`.
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, Failure>;
}

/// Boxed future returned by [`Clock::sleep`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Time, as the executor may see it: timestamps go into events (and are
/// listed as volatile by the normalizer), never into anything hashed.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// Waits (retry backoff).
    fn sleep(&self, duration: Duration) -> Sleep;
    /// Waits until the clock reads `at_ms`: a timer (a deadline), which —
    /// unlike [`sleep`](Clock::sleep) on a clock tests drive — never moves
    /// the clock itself.
    fn sleep_until(&self, at_ms: i64) -> Sleep {
        let left = u64::try_from(at_ms.saturating_sub(self.now_ms())).unwrap_or(0);
        self.sleep(Duration::from_millis(left))
    }
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}
