//! An OpenAI-compatible chat-completions provider over HTTP.
//!
//! Works against any server speaking `POST {base_url}/chat/completions`:
//! OpenAI, Ollama, vLLM, llama.cpp's server. The API key is read by the
//! caller from an environment variable and handed in; this module reads no
//! environment itself. Failures are classified: an unreachable endpoint or a
//! 5xx is `Unavailable`, a 4xx or an answer that is not a chat completion is
//! `Failed` — never a success.

use std::time::Duration;

use async_trait::async_trait;
use poimen_workflow::ReasoningEffort;
use serde_json::{Value, json};

use crate::effects::{Failure, FailureClass, ModelProvider, ModelRequest, ModelResponse, Usage};

/// Whether to send the step's reasoning effort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EffortMode {
    /// Send `reasoning_effort` (OpenAI reasoning models, vLLM, recent Ollama).
    Send,
    /// Leave it out (servers that reject unknown parameters).
    #[default]
    Omit,
}

/// Where and how to reach the model.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// e.g. `http://127.0.0.1:11434/v1` (Ollama) or `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model used when a step names none.
    pub model: String,
    pub api_key: Option<String>,
    pub effort: EffortMode,
}

/// The provider.
#[derive(Debug, Clone)]
pub struct OpenAiCompatible {
    config: OpenAiConfig,
    client: reqwest::Client,
}

impl OpenAiCompatible {
    pub fn new(config: OpenAiConfig) -> OpenAiCompatible {
        OpenAiCompatible {
            config,
            client: reqwest::Client::new(),
        }
    }

    fn body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::new();
        if let Some(system) = &request.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": request.prompt}));
        let mut body = json!({
            "model": request.model.clone().unwrap_or_else(|| self.config.model.clone()),
            "messages": messages,
            "stream": false,
        });
        if let Some(max) = request.max_tokens {
            body["max_tokens"] = json!(max);
        }
        if request.json {
            body["response_format"] = json!({"type": "json_object"});
        }
        if self.config.effort == EffortMode::Send {
            body["reasoning_effort"] = json!(match request.effort {
                ReasoningEffort::Low => "low",
                ReasoningEffort::Medium => "medium",
                ReasoningEffort::High => "high",
            });
        }
        body
    }
}

#[async_trait]
impl ModelProvider for OpenAiCompatible {
    fn provider(&self) -> &str {
        "openai-compatible"
    }

    fn default_model(&self) -> &str {
        &self.config.model
    }

    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, Failure> {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let mut req = self.client.post(&url).json(&self.body(&request));
        if request.timeout > Duration::ZERO {
            req = req.timeout(request.timeout);
        }
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(|e| {
            let class = if e.is_timeout() {
                FailureClass::Timeout
            } else {
                FailureClass::Unavailable
            };
            Failure::new(
                class,
                format!("the model endpoint {url} could not be reached: {e}"),
            )
        })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| {
            Failure::new(
                FailureClass::Unavailable,
                format!("the model endpoint {url} broke off its answer: {e}"),
            )
        })?;
        if !status.is_success() {
            let class = if status.is_server_error() || status.as_u16() == 429 {
                FailureClass::Unavailable
            } else {
                FailureClass::Failed
            };
            return Err(Failure::new(
                class,
                format!(
                    "the model endpoint {url} answered {status}: {}",
                    text.chars().take(300).collect::<String>()
                ),
            ));
        }
        parse_completion(&text).map_err(|why| {
            Failure::new(
                FailureClass::Failed,
                format!(
                    "the model endpoint {url} did not answer with a chat completion ({why}): {}",
                    text.chars().take(200).collect::<String>()
                ),
            )
        })
    }
}

/// Reads a chat-completions response body.
pub(crate) fn parse_completion(body: &str) -> Result<ModelResponse, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let content = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .ok_or("no choices[0].message.content")?;
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Ok(ModelResponse {
        text: content.to_owned(),
        model,
        usage: Usage {
            tokens_in: n("/usage/prompt_tokens"),
            tokens_out: n("/usage/completion_tokens"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_completion_and_refuses_garbage() {
        let ok = parse_completion(
            r#"{"model":"m","choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        )
        .expect("parses");
        assert_eq!(ok.text, "hi");
        assert_eq!(
            ok.usage,
            Usage {
                tokens_in: 3,
                tokens_out: 1
            }
        );
        assert!(parse_completion("<html>bad gateway</html>").is_err());
        assert!(parse_completion(r#"{"choices":[]}"#).is_err());
    }
}
