//! A deterministic model: answers by rules matched against the prompt.
//!
//! For tests and offline runs. The same prompt always gets the same answer
//! and the same token counts (words, split on whitespace), so runs using it
//! are reproducible. A rule may also delay its answer (to make concurrency
//! observable) or fail (to exercise unavailability).

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::effects::{Failure, FailureClass, ModelProvider, ModelRequest, ModelResponse, Usage};

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The rule applies when the prompt contains this text (every prompt when empty).
    #[serde(default)]
    pub when: String,
    /// The answer.
    #[serde(default)]
    pub answer: String,
    /// Answer after this many milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Fail with this class instead of answering (`unavailable`, `failed`).
    #[serde(default)]
    pub fail: Option<FailureClass>,
}

impl Rule {
    /// Answers `answer` to prompts containing `when`.
    pub fn contains(when: impl Into<String>, answer: impl Into<String>) -> Rule {
        Rule {
            when: when.into(),
            answer: answer.into(),
            delay_ms: 0,
            fail: None,
        }
    }

    /// The same rule, answering after a delay.
    pub fn after(mut self, delay: Duration) -> Rule {
        self.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self
    }
}

/// Why a script file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error(
        "the model script is not valid JSON or YAML rules ({0}); write a list like [{{\"when\": \"classify\", \"answer\": \"spam\"}}]"
    )]
    Parse(String),
}

/// A model that answers by the first matching rule.
#[derive(Debug, Clone, Default)]
pub struct ScriptedProvider {
    rules: Vec<Rule>,
    model: String,
}

impl ScriptedProvider {
    pub fn new(rules: Vec<Rule>) -> ScriptedProvider {
        ScriptedProvider {
            rules,
            model: "scripted".to_owned(),
        }
    }

    /// Rules from a JSON document (a list of [`Rule`]).
    pub fn from_json(text: &str) -> Result<ScriptedProvider, ScriptError> {
        let rules: Vec<Rule> =
            serde_json::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))?;
        Ok(ScriptedProvider::new(rules))
    }
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

#[async_trait]
impl ModelProvider for ScriptedProvider {
    fn provider(&self) -> &str {
        "scripted"
    }

    fn default_model(&self) -> &str {
        &self.model
    }

    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, Failure> {
        let Some(rule) = self.rules.iter().find(|r| request.prompt.contains(&r.when)) else {
            return Err(Failure::new(
                FailureClass::Failed,
                format!(
                    "the scripted model has no rule for this prompt: {}",
                    request.prompt.chars().take(120).collect::<String>()
                ),
            ));
        };
        if rule.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(rule.delay_ms)).await;
        }
        if let Some(class) = rule.fail {
            return Err(Failure::new(
                class,
                format!("scripted failure for prompts containing `{}`", rule.when),
            ));
        }
        let tokens_in = words(&request.prompt) + request.system.as_deref().map_or(0, words);
        Ok(ModelResponse {
            text: rule.answer.clone(),
            model: request.model.unwrap_or_else(|| self.model.clone()),
            usage: Usage {
                tokens_in,
                tokens_out: words(&rule.answer),
            },
        })
    }
}
