//! Write poimen tools and verifiers as WebAssembly components.
//!
//! A plugin implements one trait — [`Tool`] or [`Verifier`] — with serde
//! types for its input and output, and exports it with one macro —
//! [`export_tool!`] or [`export_verifier!`]. Build it with
//! `cargo build --target wasm32-wasip2 --release`; the `.wasm` file in
//! `target/wasm32-wasip2/release/` is the component poimen loads.
//!
//! This crate owns the author-facing half of the `poimen:plugin@0.1.0` WIT
//! contract (`wit/plugin.wit`). It knows nothing of the host: what a
//! capability grants, how limits are enforced and how calls are recorded are
//! the host's business. The wit-bindgen output stays in a private module.
//!
//! # Example: a complete tool
//!
//! ```
//! use poimen_guest::{Call, Tool, ToolError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! pub struct Input {
//!     text: String,
//! }
//!
//! #[derive(Serialize)]
//! pub struct Output {
//!     words: usize,
//! }
//!
//! pub struct WordCount;
//!
//! impl Tool for WordCount {
//!     const NAME: &'static str = "word-count";
//!     const DESCRIPTION: &'static str = "Counts the words in a text.";
//!     const INPUT_SCHEMA: &'static str =
//!         r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#;
//!     const OUTPUT_SCHEMA: &'static str =
//!         r#"{"type":"object","properties":{"words":{"type":"integer"}}}"#;
//!     type Input = Input;
//!     type Output = Output;
//!
//!     fn invoke(input: Input, _call: &Call) -> Result<Output, ToolError> {
//!         Ok(Output { words: input.text.split_whitespace().count() })
//!     }
//! }
//!
//! poimen_guest::export_tool!(WordCount);
//!
//! # fn main() {
//! // The same glue the component runs, callable natively in unit tests:
//! let out = poimen_guest::invoke_json::<WordCount>(r#"{"text":"a b c"}"#, "key-1");
//! assert_eq!(out, Ok(r#"{"words":3}"#.to_owned()));
//! let bad = poimen_guest::invoke_json::<WordCount>(r#"{"txt":1}"#, "key-1");
//! assert!(matches!(bad, Err(ToolError::InvalidInput(_))));
//! # }
//! ```
//!
//! The crate's `Cargo.toml` needs `crate-type = ["cdylib"]` under `[lib]`.
//!
//! # Example: a verifier
//!
//! ```
//! use poimen_guest::{ToolError, Verdict, Verifier};
//! use serde::Deserialize;
//! use serde_json::Value;
//!
//! #[derive(Deserialize)]
//! pub struct Config {
//!     max_len: usize,
//! }
//!
//! pub struct ShortEnough;
//!
//! impl Verifier for ShortEnough {
//!     const NAME: &'static str = "short-enough";
//!     type Config = Config;
//!
//!     fn verify(_input: Value, output: Value, config: Config) -> Result<Verdict, ToolError> {
//!         let len = output.to_string().len();
//!         Ok(if len <= config.max_len {
//!             Verdict::pass(format!("{len} bytes"))
//!         } else {
//!             Verdict::fail(format!("{len} bytes is over {}", config.max_len))
//!         })
//!     }
//! }
//!
//! poimen_guest::export_verifier!(ShortEnough);
//! # fn main() {}
//! ```
//!
//! # What a plugin may reach
//!
//! Nothing, unless it declares a capability in [`Tool::CAPABILITIES`] and
//! the host's policy grants it. Standard output and error are captured into
//! the host's record of the call; the environment and arguments are empty;
//! clocks and random numbers are deterministic per call. See
//! `docs/writing-a-plugin.md` for the capability list and the policy file.
#![deny(unsafe_code)]

extern crate self as poimen_guest;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// What calling a tool twice with the same idempotency key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// No effect outside the result: always safe to call again.
    Pure,
    /// An external effect that happens at most once per idempotency key.
    Idempotent,
    /// An external effect that happens again on every call.
    NonIdempotent,
}

/// A tool's own failure. The host keeps these apart from traps and from
/// exhausted limits, and hands them to the workflow as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments do not fit the input schema or make no sense.
    InvalidInput(String),
    /// The tool ran and failed.
    Failed(String),
    /// Something the tool depends on is not there right now; trying again
    /// later may succeed.
    Unavailable(String),
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::InvalidInput(m) => write!(f, "invalid input: {m}"),
            ToolError::Failed(m) => write!(f, "failed: {m}"),
            ToolError::Unavailable(m) => write!(f, "unavailable: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

/// What a tool knows about the call it is serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The same on every retry of one logical call. An idempotent tool uses
    /// it to apply its effect at most once.
    pub idempotency_key: String,
}

/// A tool: JSON arguments in, JSON result out.
///
/// Only [`NAME`](Tool::NAME), the two types and [`invoke`](Tool::invoke)
/// are required; the rest have defaults that describe a pure tool which
/// reaches nothing.
pub trait Tool {
    /// Registry name: lowercase letters, digits and `-`.
    const NAME: &'static str;
    /// Semantic version; empty means the plugin crate's own version.
    const VERSION: &'static str = "";
    /// One line for humans.
    const DESCRIPTION: &'static str = "";
    /// JSON Schema of the arguments, as JSON text.
    const INPUT_SCHEMA: &'static str = "{}";
    /// JSON Schema of the result, as JSON text.
    const OUTPUT_SCHEMA: &'static str = "{}";
    /// Capabilities in text form: `fs-read:/mount`, `fs-write:/mount`,
    /// `scratch`, `http`. The host refuses to load a component whose
    /// imports need more than it declares here.
    const CAPABILITIES: &'static [&'static str] = &[];
    /// What calling the tool twice does.
    const EFFECT: Effect = Effect::Pure;

    /// The arguments, deserialized from JSON. A mismatch is reported to the
    /// host as [`ToolError::InvalidInput`] before `invoke` runs.
    type Input: DeserializeOwned;
    /// The result, serialized to JSON.
    type Output: Serialize;

    /// Does the work.
    fn invoke(input: Self::Input, call: &Call) -> Result<Self::Output, ToolError>;
}

/// A verifier's judgement of one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub pass: bool,
    /// In 0..=1.
    pub score: f64,
    pub reason: String,
}

impl Verdict {
    /// A pass with score 1.
    pub fn pass(reason: impl Into<String>) -> Self {
        Verdict {
            pass: true,
            score: 1.0,
            reason: reason.into(),
        }
    }

    /// A failure with score 0.
    pub fn fail(reason: impl Into<String>) -> Self {
        Verdict {
            pass: false,
            score: 0.0,
            reason: reason.into(),
        }
    }
}

/// A verifier: judges a step attempt's input and output under its own
/// configuration.
pub trait Verifier {
    /// Registry name: lowercase letters, digits and `-`.
    const NAME: &'static str;
    /// Semantic version; empty means the plugin crate's own version.
    const VERSION: &'static str = "";
    /// One line for humans.
    const DESCRIPTION: &'static str = "";
    /// JSON Schema of the configuration, as JSON text.
    const CONFIG_SCHEMA: &'static str = "{}";
    /// As for [`Tool::CAPABILITIES`]; verifiers rarely need any.
    const CAPABILITIES: &'static [&'static str] = &[];
    /// As for [`Tool::EFFECT`].
    const EFFECT: Effect = Effect::Pure;

    /// The configuration, deserialized from JSON. A mismatch is reported as
    /// [`ToolError::InvalidInput`].
    type Config: DeserializeOwned;

    /// Judges `output`, produced from `input`.
    fn verify(
        input: serde_json::Value,
        output: serde_json::Value,
        config: Self::Config,
    ) -> Result<Verdict, ToolError>;
}

/// Runs a tool's glue as the component does: parses `args`, calls
/// [`Tool::invoke`], serializes the result. For native unit tests of a
/// plugin, and used by [`export_tool!`].
pub fn invoke_json<T: Tool>(args: &str, idempotency_key: &str) -> Result<String, ToolError> {
    let input: T::Input = serde_json::from_str(args)
        .map_err(|e| ToolError::InvalidInput(format!("arguments do not fit `{}`: {e}", T::NAME)))?;
    let call = Call {
        idempotency_key: idempotency_key.to_owned(),
    };
    let output = T::invoke(input, &call)?;
    serde_json::to_string(&output)
        .map_err(|e| ToolError::Failed(format!("result is not JSON-serializable: {e}")))
}

/// Runs a verifier's glue as the component does: parses the three JSON
/// texts and calls [`Verifier::verify`]. Checks that the score is in 0..=1.
pub fn verify_json<V: Verifier>(
    input: &str,
    output: &str,
    config: &str,
) -> Result<Verdict, ToolError> {
    let parse = |what: &str, text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| ToolError::InvalidInput(format!("{what} is not JSON: {e}")))
    };
    let input = parse("input", input)?;
    let output = parse("output", output)?;
    let config: V::Config = serde_json::from_str(config).map_err(|e| {
        ToolError::InvalidInput(format!("configuration does not fit `{}`: {e}", V::NAME))
    })?;
    let verdict = V::verify(input, output, config)?;
    if !(0.0..=1.0).contains(&verdict.score) {
        return Err(ToolError::Failed(format!(
            "score {} is outside 0..=1",
            verdict.score
        )));
    }
    Ok(verdict)
}

#[doc(hidden)]
pub mod __private;

/// Exports a [`Tool`] as this component's `tool` world. Use once per crate.
#[macro_export]
macro_rules! export_tool {
    ($tool:ty) => {
        const _: () = {
            #[doc(hidden)]
            pub struct __PoimenToolExport;

            impl $crate::__private::bindings::tool::Guest for __PoimenToolExport {
                fn describe() -> $crate::__private::bindings::tool::Descriptor {
                    $crate::__private::describe_tool::<$tool>(env!("CARGO_PKG_VERSION"))
                }

                fn invoke(
                    args: ::std::string::String,
                    idempotency_key: ::std::string::String,
                ) -> ::std::result::Result<
                    ::std::string::String,
                    $crate::__private::bindings::tool::ToolError,
                > {
                    $crate::__private::invoke_tool::<$tool>(&args, &idempotency_key)
                }
            }

            $crate::__private::bindings::tool::export_tool_world!(
                __PoimenToolExport with_types_in $crate::__private::bindings::tool
            );
        };
    };
}

/// Exports a [`Verifier`] as this component's `verifier` world. Use once per
/// crate.
#[macro_export]
macro_rules! export_verifier {
    ($verifier:ty) => {
        const _: () = {
            #[doc(hidden)]
            pub struct __PoimenVerifierExport;

            impl $crate::__private::bindings::verifier::Guest for __PoimenVerifierExport {
                fn describe() -> $crate::__private::bindings::verifier::Descriptor {
                    $crate::__private::describe_verifier::<$verifier>(env!("CARGO_PKG_VERSION"))
                }

                fn verify(
                    input: ::std::string::String,
                    output: ::std::string::String,
                    config: ::std::string::String,
                ) -> ::std::result::Result<
                    $crate::__private::bindings::verifier::Verdict,
                    $crate::__private::bindings::verifier::ToolError,
                > {
                    $crate::__private::verify::<$verifier>(&input, &output, &config)
                }
            }

            $crate::__private::bindings::verifier::export_verifier_world!(
                __PoimenVerifierExport with_types_in $crate::__private::bindings::verifier
            );
        };
    };
}
