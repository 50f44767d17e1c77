//! poimen-server: the versioned HTTP API over a [`poimen::Host`].
//!
//! [`router`] returns an axum [`Router`](axum::Router) with every route
//! under `/v1` — runs, episodes (JSON and server-sent events), audits,
//! judgments, reconciles, workflows and versions, arming, plugins, health
//! and readiness — so `poimen serve --http` serves it and an embedder nests
//! it in its own app. Errors are RFC 9457 problems ([`Problem`]) with a
//! stable `type` per kind; the OpenAPI 3.1 document ([`openapi`]) is
//! generated from the handlers and served at `/v1/openapi.json`.
//!
//! This crate is a thin edge: every route calls the [`poimen::Host`] verb
//! that does the work and translates its result. It knows HTTP, not
//! wasmtime or SQL (it never names a crate below the facade).

use std::sync::Arc;

mod auth;
mod console;
mod extract;
mod problem;
mod routes;

pub use problem::{ApiError, KINDS, Kind, PROBLEM_BASE, PROBLEM_JSON, Problem};
pub use routes::ApiDoc;

/// How the API is served.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ServerConfig {
    /// When set, every route but `/v1/health` and `/v1/ready` requires
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// When set, `POST /v1/runs` writes the run `queued` for the host's
    /// serving loop ([`poimen::Host::serve`]) to claim, under its bound on
    /// runs at once, rather than driving it at once in its own task.
    /// `poimen serve --http` sets it.
    pub queue_starts: bool,
    /// The host's bound on runs at once, shared with its serving loop
    /// ([`poimen::executor::ServeOptions::slots`]): `POST /v1/runs?wait=`
    /// drives its run at once only with a slot in hand (held until the
    /// run's driver stops), and otherwise queues it for the loop and waits
    /// for it there. `None`: a waited start is always driven at once.
    pub run_slots: Option<Arc<tokio::sync::Semaphore>>,
}

impl ServerConfig {
    /// No token: for a loopback listener, or an embedder that authenticates
    /// in its own layers.
    pub fn open() -> ServerConfig {
        ServerConfig::default()
    }

    /// Every route but health and readiness requires this bearer token.
    pub fn with_token(token: impl Into<String>) -> ServerConfig {
        ServerConfig {
            token: Some(token.into()),
            ..ServerConfig::default()
        }
    }

    /// Runs started over the API are queued for the serving loop
    /// ([`queue_starts`](Self::queue_starts)).
    pub fn queue_starts(mut self, on: bool) -> ServerConfig {
        self.queue_starts = on;
        self
    }

    /// Waited starts share these slots with the serving loop
    /// ([`run_slots`](Self::run_slots)).
    pub fn run_slots(mut self, slots: Arc<tokio::sync::Semaphore>) -> ServerConfig {
        self.run_slots = Some(slots);
        self
    }
}

impl std::fmt::Debug for ServerConfig {
    // The token never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("queue_starts", &self.queue_starts)
            .field(
                "run_slots",
                &self.run_slots.as_ref().map(|s| s.available_permits()),
            )
            .finish()
    }
}

/// The `/v1` API over `host`, ready to serve or to nest in another app.
pub fn router(host: Arc<poimen::Host>, config: ServerConfig) -> axum::Router {
    let shadow = routes::ShadowState::new(host.clone());
    routes::router(host, config, shadow, axum::Router::new())
}

/// The `/v1` API and, at `/`, the operators' web console (runs and their
/// timelines, judgments, reconciliation, versions, plugins, shadow
/// reports) over the same host: what `poimen serve --http` serves. The
/// console requires `config.token` too, when set, through a sign-in form
/// that keeps it in a same-site cookie.
pub fn app(host: Arc<poimen::Host>, config: ServerConfig) -> axum::Router {
    // The console shows the shadow evaluations the API's routes keep.
    let shadow = routes::ShadowState::new(host.clone());
    let console = console::router(host.clone(), config.token.clone(), shadow.clone());
    routes::router(host, config, shadow, console)
}

/// The OpenAPI 3.1 document of the API, as served at `/v1/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    <ApiDoc as utoipa::OpenApi>::openapi()
}

/// [`openapi`] as the pretty JSON checked in at `docs/openapi.json`.
pub fn openapi_json() -> String {
    let mut text = openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
