//! What the export macros' expansions reach, and nothing else: the glue
//! between the author's traits and the generated bindings. Knows nothing of
//! any particular plugin.

pub use wit_bindgen;

// wit-bindgen's generated glue is the only unsafe code in this crate.
#[allow(unsafe_code)]
pub mod bindings;

use super::{Effect, Tool, ToolError, Verdict, Verifier};
use bindings::tool::poimen::plugin::types as wit;

fn effect(e: Effect) -> wit::EffectClass {
    match e {
        Effect::Pure => wit::EffectClass::Pure,
        Effect::Idempotent => wit::EffectClass::Idempotent,
        Effect::NonIdempotent => wit::EffectClass::NonIdempotent,
    }
}

fn error(e: ToolError) -> wit::ToolError {
    match e {
        ToolError::InvalidInput(m) => wit::ToolError::InvalidInput(m),
        ToolError::Failed(m) => wit::ToolError::Failed(m),
        ToolError::Unavailable(m) => wit::ToolError::Unavailable(m),
    }
}

fn version(declared: &str, crate_version: &str) -> String {
    if declared.is_empty() {
        crate_version
    } else {
        declared
    }
    .to_owned()
}

pub fn describe_tool<T: Tool>(crate_version: &str) -> wit::Descriptor {
    wit::Descriptor {
        name: T::NAME.to_owned(),
        version: version(T::VERSION, crate_version),
        description: T::DESCRIPTION.to_owned(),
        input_schema: T::INPUT_SCHEMA.to_owned(),
        output_schema: T::OUTPUT_SCHEMA.to_owned(),
        capabilities: T::CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        effect: effect(T::EFFECT),
    }
}

pub fn invoke_tool<T: Tool>(args: &str, key: &str) -> Result<String, wit::ToolError> {
    super::invoke_json::<T>(args, key).map_err(error)
}

pub fn describe_verifier<V: Verifier>(crate_version: &str) -> wit::Descriptor {
    wit::Descriptor {
        name: V::NAME.to_owned(),
        version: version(V::VERSION, crate_version),
        description: V::DESCRIPTION.to_owned(),
        input_schema: V::CONFIG_SCHEMA.to_owned(),
        output_schema: "{}".to_owned(),
        capabilities: V::CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        effect: effect(V::EFFECT),
    }
}

pub fn verify<V: Verifier>(
    input: &str,
    output: &str,
    config: &str,
) -> Result<wit::Verdict, wit::ToolError> {
    super::verify_json::<V>(input, output, config)
        .map(
            |Verdict {
                 pass,
                 score,
                 reason,
             }| wit::Verdict {
                pass,
                score,
                reason,
            },
        )
        .map_err(error)
}
