//! Model providers: an OpenAI-compatible chat-completions client over HTTP,
//! and a deterministic scripted provider for tests and offline runs. Both
//! implement [`crate::effects::ModelProvider`]; the interpreter knows only
//! the trait.

mod openai;
mod scripted;

pub use openai::{EffortMode, OpenAiCompatible, OpenAiConfig};
pub use scripted::{Rule, ScriptError, ScriptedProvider};
