//! Errors as RFC 9457 `application/problem+json`: every failure of the API
//! — a library error, a body that is not JSON, a missing token — becomes
//! one [`Problem`] with a stable `type` URI per kind of error.
//!
//! The `type` URIs and statuses are part of the API (documented in
//! `docs/http-api.md`): change one only with a new API version. The
//! `detail` is the library error's own message, which already says what
//! went wrong, where, and what to do.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use poimen::shadow::ShadowError;
use poimen::{JudgmentError, OperatorError, RunError, StartError, StoreError};
use serde::Serialize;
use utoipa::ToSchema;

/// Every problem `type` starts with this.
pub const PROBLEM_BASE: &str = "https://poimen.dev/problems/";

/// The media type of every error response.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of error, stable across releases
    /// (`https://poimen.dev/problems/unknown-run`).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of error.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong, where, and what to do.
    pub detail: String,
    /// Every problem, when there are several (validation errors).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The library refused or failed.
    #[error(transparent)]
    Host(#[from] poimen::Error),
    /// The body is not JSON (a syntax error, or it ended early).
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// The body is JSON, but not of the shape the route takes (an unknown
    /// field, a missing one, a wrong type).
    #[error("the request body does not have the expected shape: {0}")]
    InvalidBody(String),
    /// The body is not `application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The query string or a header does not parse.
    #[error("{0}")]
    InvalidQuery(String),
    /// A workflow target that names a file: over HTTP only published
    /// workflows run.
    #[error(
        "`{0}` looks like a file path; over HTTP a run starts only from a published workflow (`ID`, `ID@VERSION` or a version); publish the definition first with `POST /v1/workflows`"
    )]
    FileTarget(String),
    /// The body is over the route's limit.
    #[error("the request body is too large: {0}")]
    TooLarge(String),
    /// A path segment that names nothing of the kind it must be.
    #[error("{0}")]
    BadRequest(String),
    /// No token, or the wrong one.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// No such route.
    #[error("no route {0}; `GET /v1/openapi.json` lists the API")]
    NoRoute(String),
    /// A plugin name nothing registered has.
    #[error("plugin `{0}` is not registered; `GET /v1/plugins` lists them")]
    UnknownPlugin(String),
    /// A shadow evaluation id this server does not keep.
    #[error(
        "shadow evaluation `{0}` is not kept by this server (reports live in its memory: the latest 32, until it restarts); `GET /v1/shadow` lists them"
    )]
    UnknownShadow(String),
    /// As many shadow evaluations as the server runs at once are running.
    #[error(
        "{0} shadow evaluations are already running on this server; try again when one has finished"
    )]
    ShadowBusy(usize),
    /// The store did not answer the readiness check.
    #[error("not ready: {0}")]
    NotReady(poimen::Error),
    /// A response could not be encoded.
    #[error("the response could not be encoded: {0}")]
    Encode(String),
    /// Work the server started stopped unexpectedly (a bug: report it).
    #[error("{0}")]
    Internal(String),
}

/// What a kind of error is over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub status: StatusCode,
    /// The last segment of the `type` URI.
    pub slug: &'static str,
    pub title: &'static str,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u32>,
}

const fn kind(status: StatusCode, slug: &'static str, title: &'static str) -> Kind {
    Kind {
        status,
        slug,
        title,
        retry_after: None,
    }
}

const fn retry(mut k: Kind, secs: u32) -> Kind {
    k.retry_after = Some(secs);
    k
}

const BAD_REQUEST: StatusCode = StatusCode::BAD_REQUEST;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const CONFLICT: StatusCode = StatusCode::CONFLICT;
const UNPROCESSABLE: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;
const INTERNAL: StatusCode = StatusCode::INTERNAL_SERVER_ERROR;
const UNAVAILABLE: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

/// Every problem kind the API reports, for its documentation and tests.
pub const KINDS: &[Kind] = &[
    kind(BAD_REQUEST, "malformed-json", "Malformed JSON"),
    kind(BAD_REQUEST, "invalid-body", "Invalid request body"),
    kind(BAD_REQUEST, "invalid-query", "Invalid query or header"),
    kind(BAD_REQUEST, "file-target", "File paths are not targets"),
    kind(BAD_REQUEST, "bad-request", "Bad request"),
    kind(BAD_REQUEST, "bad-target", "Not a workflow or version"),
    kind(BAD_REQUEST, "bad-id", "Malformed id"),
    kind(BAD_REQUEST, "ambiguous-version", "Ambiguous version"),
    kind(
        BAD_REQUEST,
        "input-invalid",
        "Input violates the workflow's schema",
    ),
    kind(
        BAD_REQUEST,
        "judgment-result-invalid",
        "Judgment answer violates its schema",
    ),
    kind(
        BAD_REQUEST,
        "judgment-submission-invalid",
        "Judgment submission refused",
    ),
    kind(BAD_REQUEST, "bad-step", "Not a step of the run"),
    kind(BAD_REQUEST, "bad-plugin", "Plugin refused"),
    kind(
        BAD_REQUEST,
        "shadow-mismatch",
        "Versions of different workflows",
    ),
    kind(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
    kind(StatusCode::FORBIDDEN, "not-allowed", "Refused by policy"),
    kind(NOT_FOUND, "unknown-run", "Unknown run"),
    kind(NOT_FOUND, "unknown-version", "Unknown version"),
    kind(NOT_FOUND, "unknown-workflow", "Unknown workflow"),
    kind(NOT_FOUND, "unknown-judgment", "Unknown judgment"),
    kind(NOT_FOUND, "unknown-plugin", "Unknown plugin"),
    kind(NOT_FOUND, "unknown-shadow", "Unknown shadow evaluation"),
    kind(NOT_FOUND, "not-found", "Not found"),
    kind(NOT_FOUND, "no-route", "No such route"),
    kind(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload-too-large",
        "Request body too large",
    ),
    kind(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
        "Unsupported media type",
    ),
    kind(CONFLICT, "idempotency-conflict", "Idempotency key conflict"),
    kind(CONFLICT, "wrong-status", "Run in the wrong state"),
    kind(CONFLICT, "no-open-call", "No call to reconcile"),
    kind(CONFLICT, "run-held", "Run held by another host"),
    kind(CONFLICT, "judgment-closed", "Judgment already answered"),
    kind(
        CONFLICT,
        "request-hash-mismatch",
        "Judgment request changed",
    ),
    kind(CONFLICT, "disarmed", "Workflow disarmed"),
    kind(CONFLICT, "not-armed", "Version not armed"),
    kind(CONFLICT, "conflict", "Conflict"),
    kind(UNPROCESSABLE, "invalid-workflow", "Invalid workflow"),
    kind(
        UNPROCESSABLE,
        "unparsable-workflow",
        "Workflow does not parse",
    ),
    kind(
        UNPROCESSABLE,
        "policy-violation",
        "Workflow breaks the host's policy",
    ),
    kind(UNPROCESSABLE, "tool-name-taken", "Tool name taken"),
    kind(
        UNPROCESSABLE,
        "shadow-ineligible",
        "Not eligible for shadow evaluation",
    ),
    kind(
        UNPROCESSABLE,
        "no-shadow-runs",
        "No recorded runs to replay",
    ),
    retry(
        kind(
            StatusCode::TOO_MANY_REQUESTS,
            "overflow",
            "Too many active runs",
        ),
        1,
    ),
    retry(
        kind(
            StatusCode::TOO_MANY_REQUESTS,
            "shadow-busy",
            "Too many shadow evaluations",
        ),
        5,
    ),
    retry(kind(UNAVAILABLE, "shed", "Shed under pressure"), 1),
    retry(kind(UNAVAILABLE, "unavailable", "Unavailable"), 1),
    retry(kind(UNAVAILABLE, "not-ready", "Not ready"), 1),
    kind(StatusCode::GATEWAY_TIMEOUT, "timeout", "Timed out"),
    kind(INTERNAL, "store", "Store failure"),
    kind(INTERNAL, "internal", "Internal error"),
];

/// The kind named `slug` (every slug used below is in [`KINDS`]).
fn k(slug: &str) -> Kind {
    KINDS
        .iter()
        .copied()
        .find(|k| k.slug == slug)
        .unwrap_or(kind(INTERNAL, "internal", "Internal error"))
}

impl ApiError {
    /// The kind of error this is over HTTP.
    pub fn kind(&self) -> Kind {
        match self {
            ApiError::Host(e) => host_kind(e),
            ApiError::MalformedJson(_) => k("malformed-json"),
            ApiError::InvalidBody(_) => k("invalid-body"),
            ApiError::UnsupportedMediaType(_) => k("unsupported-media-type"),
            ApiError::InvalidQuery(_) => k("invalid-query"),
            ApiError::FileTarget(_) => k("file-target"),
            ApiError::BadRequest(_) => k("bad-request"),
            ApiError::TooLarge(_) => k("payload-too-large"),
            ApiError::Unauthorized(_) => k("unauthorized"),
            ApiError::NoRoute(_) => k("no-route"),
            ApiError::UnknownPlugin(_) => k("unknown-plugin"),
            ApiError::UnknownShadow(_) => k("unknown-shadow"),
            ApiError::ShadowBusy(_) => k("shadow-busy"),
            ApiError::NotReady(_) => k("not-ready"),
            ApiError::Encode(_) | ApiError::Internal(_) => k("internal"),
        }
    }

    /// The problem document of this error.
    pub fn problem(&self) -> Problem {
        let kind = self.kind();
        let errors = match self {
            ApiError::Host(poimen::Error::Invalid { errors, .. }) => {
                errors.iter().map(ToString::to_string).collect()
            }
            ApiError::Host(poimen::Error::Policy { violations, .. }) => {
                violations.iter().map(ToString::to_string).collect()
            }
            _ => Vec::new(),
        };
        Problem {
            kind: format!("{PROBLEM_BASE}{}", kind.slug),
            title: kind.title.to_owned(),
            status: kind.status.as_u16(),
            detail: self.to_string(),
            errors,
        }
    }
}

fn host_kind(e: &poimen::Error) -> Kind {
    use poimen::Error as E;
    match e {
        E::Parse(_) => k("unparsable-workflow"),
        E::Invalid { .. } => k("invalid-workflow"),
        E::Policy { .. } => k("policy-violation"),
        E::ToolNameTaken { .. } => k("tool-name-taken"),
        E::NotFound { what, .. } => match *what {
            "run" => k("unknown-run"),
            "version" => k("unknown-version"),
            "workflow" => k("unknown-workflow"),
            "judgment" => k("unknown-judgment"),
            _ => k("not-found"),
        },
        E::BadTarget { .. } => k("bad-target"),
        E::BadInput(_) | E::NoRetention => k("bad-request"),
        E::Read { .. } | E::TooLarge { .. } | E::UnknownFormat { .. } => k("bad-request"),
        E::NotAllowed { .. } => k("not-allowed"),
        E::Disarmed { .. } => k("disarmed"),
        E::NotArmed { .. } => k("not-armed"),
        E::BadId(_) => k("bad-id"),
        E::Store(s) => store_kind(s),
        E::Start(s) => start_kind(s),
        E::Run(r) => run_kind(r),
        E::Operator(o) => operator_kind(o),
        E::Judgment(j) => judgment_kind(j),
        E::Plugin(_) => k("bad-plugin"),
        E::Timeout { .. } => k("timeout"),
        E::Shadow(s) => shadow_kind(s),
        _ => k("internal"),
    }
}

fn store_kind(e: &StoreError) -> Kind {
    match e {
        StoreError::NotFound { what } if what.starts_with("run") => k("unknown-run"),
        StoreError::NotFound { what } if what.starts_with("judgment") => k("unknown-judgment"),
        StoreError::NotFound { what } if what.starts_with("version") => k("unknown-version"),
        StoreError::NotFound { .. } => k("not-found"),
        StoreError::AmbiguousPrefix { .. } => k("ambiguous-version"),
        StoreError::IdempotencyConflict(_) => k("idempotency-conflict"),
        StoreError::RunFinal { .. } => k("wrong-status"),
        StoreError::UnknownParent { .. }
        | StoreError::ParentOfOtherWorkflow { .. }
        | StoreError::ArmOtherWorkflow { .. } => k("bad-request"),
        StoreError::LeaseLost { .. } | StoreError::SequenceConflict { .. } => k("conflict"),
        e if e.is_unavailable() => k("unavailable"),
        _ => k("store"),
    }
}

fn shadow_kind(e: &ShadowError) -> Kind {
    match e {
        ShadowError::Ineligible(_) => k("shadow-ineligible"),
        ShadowError::DifferentWorkflows { .. } => k("shadow-mismatch"),
        ShadowError::NoRuns { .. } => k("no-shadow-runs"),
        ShadowError::BadRate(_) => k("bad-request"),
        ShadowError::Store(s) => store_kind(s),
        _ => k("internal"),
    }
}

fn start_kind(e: &StartError) -> Kind {
    match e {
        StartError::InvalidInput { .. } => k("input-invalid"),
        StartError::Key { .. } => k("input-invalid"),
        StartError::NoKeyTemplate { .. } => k("invalid-workflow"),
        StartError::IdempotencyConflict(_) => k("idempotency-conflict"),
        StartError::Overflow { .. } => k("overflow"),
        StartError::Shed { .. } => k("shed"),
        StartError::Unavailable { .. } => k("unavailable"),
        StartError::Store(s) => store_kind(s),
        StartError::Replace(o) => operator_kind(o),
        _ => k("internal"),
    }
}

fn run_kind(e: &RunError) -> Kind {
    match e {
        RunError::UnknownRun(_) => k("unknown-run"),
        RunError::Start(s) => start_kind(s),
        RunError::Unavailable { .. } => k("unavailable"),
        RunError::TooDeep { .. } => k("invalid-workflow"),
        RunError::Store(s) => store_kind(s),
        RunError::Held { .. } => k("run-held"),
        _ => k("internal"),
    }
}

fn operator_kind(e: &OperatorError) -> Kind {
    match e {
        OperatorError::WrongStatus { .. } | OperatorError::NothingToRetry { .. } => {
            k("wrong-status")
        }
        OperatorError::NotTopLevel { .. } => k("bad-step"),
        OperatorError::NoOpenCall { .. } => k("no-open-call"),
        OperatorError::Run(r) => run_kind(r),
        _ => k("internal"),
    }
}

fn judgment_kind(e: &JudgmentError) -> Kind {
    match e {
        JudgmentError::Unknown(_) => k("unknown-judgment"),
        JudgmentError::Closed { .. } => k("judgment-closed"),
        JudgmentError::RequestHashMismatch { .. } => k("request-hash-mismatch"),
        JudgmentError::ResultSchema { .. } => k("judgment-result-invalid"),
        JudgmentError::ExecutorMismatch { .. } | JudgmentError::Provenance { .. } => {
            k("judgment-submission-invalid")
        }
        JudgmentError::Run(r) => run_kind(r),
        _ => k("internal"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        let problem = self.problem();
        problem_response(kind, &problem)
    }
}

fn problem_response(kind: Kind, problem: &Problem) -> Response {
    let body = serde_json::to_vec(problem).unwrap_or_else(|_| b"{}".to_vec());
    let mut res = (kind.status, body).into_response();
    let headers = res.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(secs) = kind.retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if kind.status == StatusCode::UNAUTHORIZED {
        headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    res
}
