//! The `http-get` tool: one HTTP GET through `wasi:http`.
//!
//! Declares `http`; the host's policy lists the hosts it may reach and the
//! host refuses every other one (the refusal fails the call). This crate
//! knows nothing of that list. It speaks to `wasi:http/outgoing-handler`
//! directly, through the `wasip2` bindings.
//!
//! Arguments: `{"url": "http://host[:port]/path?query", "max_bytes": n}`
//! (`max_bytes` defaults to 1 MiB). Result: `{"status", "headers", "body"}`,
//! the body as UTF-8 (lossy).

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingRequest, Scheme};

/// The default cap on the response body.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;

/// The arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    url: String,
    #[serde(default)]
    max_bytes: Option<u64>,
}

/// The tool.
#[derive(Debug)]
pub struct HttpGet;

/// A URL split the way `wasi:http` wants it.
#[derive(Debug, PartialEq, Eq)]
struct Target<'a> {
    https: bool,
    authority: &'a str,
    path_with_query: &'a str,
}

fn parse_url(url: &str) -> Result<Target<'_>, ToolError> {
    let bad = |why: &str| ToolError::InvalidInput(format!("`{url}`: {why}"));
    let (https, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(bad("only http:// and https:// URLs"));
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("needs a host, and no user info"));
    }
    Ok(Target {
        https,
        authority,
        path_with_query: if path.is_empty() { "/" } else { path },
    })
}

fn http_error(url: &str, e: ErrorCode) -> ToolError {
    match e {
        ErrorCode::HttpRequestDenied => {
            ToolError::Failed(format!("{url}: request denied by the host"))
        }
        ErrorCode::ConnectionRefused | ErrorCode::ConnectionTimeout | ErrorCode::DnsTimeout => {
            ToolError::Unavailable(format!("{url}: {e:?}"))
        }
        e => ToolError::Failed(format!("{url}: {e:?}")),
    }
}

fn get(url: &str, max_bytes: u64) -> Result<Value, ToolError> {
    let target = parse_url(url)?;
    let unusable = |what: &str| ToolError::Failed(format!("{url}: the host rejected the {what}"));
    let request = OutgoingRequest::new(Fields::new());
    request
        .set_method(&Method::Get)
        .map_err(|()| unusable("method"))?;
    let scheme = if target.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| unusable("scheme"))?;
    request
        .set_authority(Some(target.authority))
        .map_err(|()| unusable("authority"))?;
    request
        .set_path_with_query(Some(target.path_with_query))
        .map_err(|()| unusable("path"))?;

    let pending = outgoing_handler::handle(request, None).map_err(|e| http_error(url, e))?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return Err(http_error(url, e)),
        Some(Err(())) | None => return Err(ToolError::Failed(format!("{url}: no response"))),
    };
    let status = response.status();
    let mut headers = serde_json::Map::new();
    for (name, value) in response.headers().entries() {
        headers.insert(
            name,
            Value::String(String::from_utf8_lossy(&value).into_owned()),
        );
    }
    let body = response.consume().map_err(|()| unusable("body"))?;
    let stream = body.stream().map_err(|()| unusable("body stream"))?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => {
                bytes.extend_from_slice(&chunk);
                if bytes.len() as u64 > max_bytes {
                    return Err(ToolError::Failed(format!(
                        "{url}: body is over {max_bytes} bytes"
                    )));
                }
            }
            Err(wasip2::io::streams::StreamError::Closed) => break,
            Err(e) => return Err(ToolError::Failed(format!("{url}: reading the body: {e:?}"))),
        }
    }
    Ok(json!({ "status": status, "headers": headers, "body": String::from_utf8_lossy(&bytes) }))
}

impl Tool for HttpGet {
    const NAME: &'static str = "http-get";
    const DESCRIPTION: &'static str = "HTTP GET a URL on an allowlisted host.";
    const INPUT_SCHEMA: &'static str = r#"{"type":"object","properties":{"url":{"type":"string"},"max_bytes":{"type":"integer","minimum":0}},"required":["url"]}"#;
    const OUTPUT_SCHEMA: &'static str = r#"{"type":"object","properties":{"status":{"type":"integer"},"headers":{"type":"object"},"body":{"type":"string"}},"required":["status","body"]}"#;
    const CAPABILITIES: &'static [&'static str] = &["http"];
    type Input = Input;
    type Output = Value;

    fn invoke(input: Input, _call: &Call) -> Result<Value, ToolError> {
        get(&input.url, input.max_bytes.unwrap_or(DEFAULT_MAX_BYTES))
    }
}

poimen_guest::export_tool!(HttpGet);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split() {
        assert_eq!(
            parse_url("http://127.0.0.1:8080/a?b=1"),
            Ok(Target {
                https: false,
                authority: "127.0.0.1:8080",
                path_with_query: "/a?b=1"
            })
        );
        assert_eq!(
            parse_url("https://example.com"),
            Ok(Target {
                https: true,
                authority: "example.com",
                path_with_query: "/"
            })
        );
        assert!(parse_url("ftp://x/").is_err());
        assert!(parse_url("http://u@x/").is_err());
    }
}
