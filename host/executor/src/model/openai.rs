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
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use poimen_workflow::ReasoningEffort;
use serde_json::{Value, json};
use tokio_rustls::rustls;

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

/// Connections to the endpoint: pooled and kept alive, `http://` or
/// `https://` (rustls on ring, the webpki roots).
type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The provider.
#[derive(Clone)]
pub struct OpenAiCompatible {
    config: OpenAiConfig,
    client: HttpClient,
}

impl std::fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("base_url", &self.config.base_url)
            .field("model", &self.config.model)
            .finish()
    }
}

impl OpenAiCompatible {
    pub fn new(config: OpenAiConfig) -> OpenAiCompatible {
        let tls = rustls_config();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        OpenAiCompatible { config, client }
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
        let unreachable = |e: &dyn std::fmt::Display| {
            Failure::new(
                FailureClass::Unavailable,
                format!("the model endpoint {url} could not be reached: {e}"),
            )
        };
        let body = serde_json::to_vec(&self.body(&request)).map_err(|e| {
            Failure::new(
                FailureClass::Failed,
                format!("the request to {url} could not be encoded: {e}"),
            )
        })?;
        let mut req = hyper::Request::post(&url)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(key) = &self.config.api_key {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| unreachable(&e))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| unreachable(&ErrorChain(&e)))?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map_err(|e| {
                Failure::new(
                    FailureClass::Unavailable,
                    format!("the model endpoint {url} broke off its answer: {e}"),
                )
            })?;
            Ok::<_, Failure>((status, bytes.to_bytes()))
        };
        let (status, bytes) = if request.timeout > Duration::ZERO {
            tokio::time::timeout(request.timeout, exchange)
                .await
                .map_err(|_| {
                    Failure::new(
                        FailureClass::Timeout,
                        format!(
                            "the model endpoint {url} did not answer within {} ms",
                            request.timeout.as_millis()
                        ),
                    )
                })??
        } else {
            exchange.await?
        };
        let text = String::from_utf8_lossy(&bytes);
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

/// rustls on ring, trusting the webpki roots (the endpoint is public or
/// plain `http://`).
fn rustls_config() -> rustls::ClientConfig {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_or_else(
        // The ring provider supports the default versions; never reached.
        |_| rustls::ClientConfig::builder().with_root_certificates(roots.clone()),
        |b| b.with_root_certificates(roots.clone()),
    )
    .with_no_client_auth()
}

/// An error with its causes, `: `-separated (hyper's client error says
/// "client error (Connect)" and keeps the cause beneath).
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
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
