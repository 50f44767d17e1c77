//! Outgoing `wasi:http` requests: allowed to the invocation's allowlisted
//! hosts, refused for any other, and recorded either way.
//!
//! This is wasmtime-wasi-http's `send_request` hook, the one place every
//! outgoing request passes. An allowed request is sent by wasmtime-wasi-http's
//! default client; a refused one never opens a connection and fails the
//! invocation with `CapabilityDenied`. Knows nothing of policy files: the
//! allowlist comes from the invocation's grant.

use std::sync::Arc;

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::policy::HttpAllow;
use crate::record::{Journal, Refusal};

const HANDLER: &str = "wasi:http/outgoing-handler";

type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

/// The hook. An empty allowlist (no `http` grant) refuses everything.
pub(crate) struct HttpGate {
    pub allow: Arc<[HttpAllow]>,
    pub journal: Journal,
}

/// Why `uri` may not be requested under `allow`, if it may not.
fn refusal(allow: &[HttpAllow], uri: &http::Uri) -> Option<&'static str> {
    if allow.is_empty() {
        return Some("the invocation has no `http` grant");
    }
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        _ => return Some("only http and https are allowed"),
    };
    let Some(authority) = uri.authority() else {
        return Some("the request names no host");
    };
    let port = authority.port_u16().unwrap_or(default_port);
    if allow
        .iter()
        .any(|a| a.allows(authority.host(), port, default_port))
    {
        None
    } else {
        Some("the host is not on the allowlist")
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Sent {
        drop(fut);
        let attempted = format!("{} {}", request.method(), request.uri());
        if let Some(why) = refusal(&self.allow, request.uri()) {
            self.journal.call(
                HANDLER,
                "handle",
                attempted.clone(),
                format!("refused: {why}"),
            );
            self.journal.refuse(Refusal {
                capability: "http".to_owned(),
                attempted,
                why: why.to_owned(),
            });
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let index = self
            .journal
            .call(HANDLER, "handle", attempted, "pending".to_owned());
        let journal = self.journal.clone();
        Box::new(async move {
            match wasmtime_wasi_http::default_send_request(request, options).await {
                Ok((response, io)) => {
                    journal.set_result(index, format!("ok: {}", response.status().as_u16()));
                    Ok((
                        response.map(BodyExt::boxed_unsync),
                        Box::new(io) as Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                    ))
                }
                Err(e) => {
                    journal.set_result(index, format!("error: {e}"));
                    Err(e)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> Vec<HttpAllow> {
        entries
            .iter()
            .map(|e| HttpAllow::parse(e).expect("entry"))
            .collect()
    }

    fn uri(s: &str) -> http::Uri {
        s.parse().expect("uri")
    }

    #[test]
    fn only_allowlisted_hosts_and_ports_pass() {
        let a = allow(&["127.0.0.1:8080", "example.com"]);
        assert_eq!(refusal(&a, &uri("http://127.0.0.1:8080/x")), None);
        assert_eq!(refusal(&a, &uri("https://EXAMPLE.com/")), None);
        assert_eq!(refusal(&a, &uri("http://example.com/")), None);
        assert!(refusal(&a, &uri("http://example.com:8080/")).is_some());
        assert!(refusal(&a, &uri("http://127.0.0.1:8081/")).is_some());
        assert!(refusal(&a, &uri("http://localhost:8080/")).is_some());
        assert!(refusal(&a, &uri("ftp://example.com/")).is_some());
        assert!(refusal(&[], &uri("http://example.com/")).is_some());
    }
}
