//! Bearer-token authentication: a middleware that refuses a request
//! without the configured token, comparing in constant time so the
//! response time says nothing of how much of a guess was right.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::problem::ApiError;

/// Routes that answer without a token: probes carry none.
const OPEN: &[&str] = &["/v1/health", "/v1/ready"];

pub(crate) async fn require_token(
    State(token): State<Arc<Option<String>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(expected) = token.as_deref() else {
        return next.run(req).await;
    };
    // Open probes; and the console's pages, which check the token
    // themselves (a cookie, or this header), and the unknown paths.
    let path = req.uri().path();
    if OPEN.contains(&path) || !(path.starts_with("/v1/") || path == "/v1" || path == "/metrics") {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        None => ApiError::Unauthorized(
            "this API requires a bearer token: send `Authorization: Bearer TOKEN` (the token `poimen serve --token-file` reads)",
        )
        .into_response(),
        Some(given) if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) => {
            next.run(req).await
        }
        Some(_) => ApiError::Unauthorized(
            "the bearer token is wrong; send the token `poimen serve --token-file` reads",
        )
        .into_response(),
    }
}
