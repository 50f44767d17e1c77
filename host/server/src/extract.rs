//! Extractors whose rejections are problems: a body that is not JSON, has
//! an unknown field or lacks one, and a query string that does not parse
//! all answer `application/problem+json` instead of axum's plain text.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::ApiError;

/// A JSON body (`Content-Type: application/json`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<S, T> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::JsonDataError(e) => ApiError::InvalidBody(source_text(&e)),
        JsonRejection::JsonSyntaxError(e) => ApiError::MalformedJson(source_text(&e)),
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
            "the request body must be JSON: send `Content-Type: application/json`".to_owned(),
        ),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::TooLarge(other.body_text())
        }
        other => ApiError::MalformedJson(other.body_text()),
    }
}

/// A raw body (a component's bytes).
#[derive(Debug, Clone, Default)]
pub struct Body(pub Bytes);

impl<S> FromRequest<S> for Body
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::TooLarge(r.body_text()))
            }
            Err(r) => Err(bytes_rejection(r)),
        }
    }
}

fn bytes_rejection(r: BytesRejection) -> ApiError {
    ApiError::BadRequest(format!(
        "the request body could not be read: {}",
        r.body_text()
    ))
}

/// The innermost cause's message (serde's, with line and column), not
/// axum's wrapper text.
fn source_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: &(dyn std::error::Error + 'static) = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A query string.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryOf<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryOf<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(QueryOf(v)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => Err(ApiError::InvalidQuery(
                format!("the query string does not parse: {}", source_text(&e)),
            )),
            Err(other) => Err(ApiError::InvalidQuery(other.body_text())),
        }
    }
}

/// A JSON body that may be left out: no body at all reads as `T::default()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonOrEmpty<T>(pub T);

impl<S, T> FromRequest<S> for JsonOrEmpty<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let empty = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .is_some_and(|v| v == "0")
            || (req
                .headers()
                .get(axum::http::header::CONTENT_TYPE)
                .is_none()
                && req
                    .headers()
                    .get(axum::http::header::TRANSFER_ENCODING)
                    .is_none()
                && req
                    .headers()
                    .get(axum::http::header::CONTENT_LENGTH)
                    .is_none());
        if empty {
            return Ok(JsonOrEmpty(T::default()));
        }
        Json::<T>::from_request(req, state)
            .await
            .map(|Json(v)| JsonOrEmpty(v))
    }
}
