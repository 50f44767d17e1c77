//! The `/v1` routes: each reads its request, calls the one `poimen::Host`
//! verb that does the work, and answers JSON (or a problem). The request
//! and response shapes here are the API's, documented in the OpenAPI
//! document; the library's own types are passed through where they are
//! already the public shape (episodes, audits, judgment records).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use poimen::{
    Host, JudgmentId, JudgmentSubmission, Parent, Reconciliation, RunFilter, RunId, RunOptions,
    RunOutcome, RunRecord, RunStatus, StepId, Target, WorkflowId,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

use crate::ServerConfig;
use crate::extract::{Body, Json, JsonOrEmpty, QueryOf};
use crate::problem::{ApiError, Problem};

type Shared = Arc<Host>;
type ApiResult<T> = Result<T, ApiError>;

/// The largest component `POST /v1/plugins/inspect` reads.
const MAX_COMPONENT_BYTES: usize = 64 * 1024 * 1024;
/// The largest publish body: a definition as large as a workflow file may
/// be, with room for its escaping inside a JSON string.
const MAX_DEFINITION_BODY: usize = 2 * poimen::MAX_WORKFLOW_FILE_BYTES as usize;
/// The most runs one listing returns.
const MAX_LIST: u32 = 1000;

/// The `/v1` routes (and `/metrics`) over `host`, merged with `root` (the
/// console, or nothing), behind the API's token check.
pub(crate) fn router(
    host: Shared,
    config: ServerConfig,
    shadow: ShadowState,
    root: Router,
) -> Router {
    let starts = Starts {
        queue: config.queue_starts,
        slots: config.run_slots.clone(),
    };
    let v1 = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/openapi.json", get(openapi_doc))
        .route(
            "/runs",
            post(
                move |host: State<Shared>,
                      headers: HeaderMap,
                      query: QueryOf<StartQuery>,
                      req: Json<StartRun>| {
                    start_run(host, headers, query, req, starts.clone())
                },
            )
            .get(list_runs),
        )
        .route("/runs/{run}", get(get_run))
        .route("/runs/{run}/cancel", post(cancel_run))
        .route("/runs/{run}/retry", post(retry_run))
        .route("/runs/{run}/resume", post(resume_run))
        .route("/runs/{run}/reconcile", post(reconcile_run))
        .route("/runs/{run}/episode", get(episode))
        .route("/runs/{run}/events", get(events))
        .route("/runs/{run}/audit", get(audit))
        .route("/judgments", get(list_judgments))
        .route("/judgments/{judgment}", get(show_judgment))
        .route("/judgments/{judgment}/answer", post(submit_judgment))
        .route(
            "/workflows",
            get(list_workflows)
                .post(publish)
                .layer(DefaultBodyLimit::max(MAX_DEFINITION_BODY)),
        )
        .route("/workflows/{workflow}/versions", get(list_versions))
        .route("/workflows/{workflow}/arm", post(arm))
        .route("/workflows/{workflow}/disarm", post(disarm))
        .route("/versions/{version}", get(show_version))
        .route("/diff", get(diff))
        .route("/plugins", get(list_plugins))
        .route(
            "/plugins/inspect",
            post(inspect_plugin).layer(DefaultBodyLimit::max(MAX_COMPONENT_BYTES)),
        )
        .route("/plugins/{name}", get(show_plugin))
        .route("/metrics", get(metrics))
        .with_state(host.clone())
        .merge(shadow_routes(shadow.clone()));
    let token = Arc::new(config.token);
    root.nest("/v1", v1)
        // Where Prometheus looks by default; the same as `/v1/metrics`.
        .route("/metrics", get(metrics).with_state(host))
        .fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(
            token,
            crate::auth::require_token,
        ))
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::NoRoute(uri.path().to_owned())
}

// ------------------------------------------------------------------ shapes

/// A run's status.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // A schema only: the values are `RunStatus`'s.
pub enum Status {
    Queued,
    Running,
    WaitingJudgment,
    Blocked,
    Completed,
    Failed,
    Cancelled,
}

/// A run as stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunView {
    /// `WFR-` and a ULID.
    pub id: String,
    pub workflow_id: String,
    /// The version the run pinned (`b3:…`).
    pub version: String,
    pub tenant: String,
    #[schema(value_type = Status)]
    pub status: RunStatus,
    /// Why the run is blocked, failed or cancelled.
    pub reason: Option<String>,
    pub idempotency_key: Option<String>,
    /// The run that started this one as a sub-workflow.
    pub parent_run: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub updated_at: i64,
    /// The run's output, once it has one (only on `GET /v1/runs/{run}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

impl RunView {
    fn of(r: RunRecord, output: Option<Value>) -> RunView {
        RunView {
            id: r.id.to_string(),
            workflow_id: r.workflow_id.to_string(),
            version: r.version.to_string(),
            tenant: r.tenant,
            status: r.status,
            reason: r.reason,
            idempotency_key: r.idempotency_key,
            parent_run: r.parent.map(|(run, _)| run.to_string()),
            created_at: r.created_at,
            updated_at: r.updated_at,
            output,
        }
    }
}

/// What driving a run came to: it completed, failed, was cancelled, or
/// stopped to wait for a judge or an operator.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutcomeView {
    pub run: String,
    #[schema(value_type = Status)]
    pub status: RunStatus,
    pub output: Option<Value>,
    pub reason: Option<String>,
}

impl From<RunOutcome> for OutcomeView {
    fn from(o: RunOutcome) -> Self {
        OutcomeView {
            run: o.run.to_string(),
            status: o.status,
            output: o.output,
            reason: o.reason,
        }
    }
}

/// A run to start.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRun {
    /// A published workflow: its id (the armed version), `ID@VERSION`,
    /// `ID@latest`, or a version (`b3:…`, or an unambiguous prefix). Never
    /// a file path.
    pub workflow: String,
    /// The run's input; it must match the workflow's `inputs` schema.
    #[serde(default = "empty_object")]
    pub input: Value,
    /// The same workflow and input under this key return the existing run;
    /// another input under it is refused (409).
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The run's tenant (`default` when absent).
    #[serde(default)]
    pub tenant: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// Which runs to list; every given filter must match.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Only runs in this status (`queued`, `running`, `waiting_judgment`,
    /// `blocked`, `completed`, `failed`, `cancelled`).
    pub status: Option<String>,
    /// Only runs of this workflow id.
    pub workflow: Option<String>,
    /// Only runs of this tenant.
    pub tenant: Option<String>,
    /// How many runs at most, newest first (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// How long `POST /v1/runs` waits for the run to stop.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StartQuery {
    /// Seconds to wait for the run to stop (complete, fail, be cancelled,
    /// wait for a judgment or block), at most 300; the run is then driven
    /// by this host at once, not queued. `Prefer: wait=N` (RFC 7240) says
    /// the same; the smaller wins when both are given.
    pub wait: Option<u32>,
}

/// Longest wait `POST /v1/runs` takes, in seconds.
pub const MAX_START_WAIT_S: u32 = 300;

/// The wait a start asks for: `?wait=N`, or `Prefer: wait=N` (RFC 7240;
/// other preferences are ignored, as the RFC says), the smaller of the
/// two, at most [`MAX_START_WAIT_S`]. `Err`: a `wait` preference that is
/// not a number of seconds.
fn start_wait(query: &StartQuery, headers: &HeaderMap) -> ApiResult<Option<u32>> {
    let mut prefer = None;
    for value in headers.get_all("prefer") {
        let Ok(text) = value.to_str() else { continue };
        for pref in text.split(',') {
            let pref = pref.split(';').next().unwrap_or("").trim();
            let Some((name, v)) = pref.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("wait") {
                continue;
            }
            let v = v.trim().trim_matches('"');
            let secs: u32 = v.parse().map_err(|_| {
                ApiError::InvalidQuery(format!(
                    "`Prefer: wait={v}` is not a number of seconds: give `Prefer: wait=N` with N from 0 to {MAX_START_WAIT_S}"
                ))
            })?;
            prefer = Some(prefer.map_or(secs, |p: u32| p.min(secs)));
        }
    }
    if let Some(w) = query.wait
        && w > MAX_START_WAIT_S
    {
        return Err(ApiError::InvalidQuery(format!(
            "`wait={w}` is longer than the longest wait, {MAX_START_WAIT_S} seconds: give at most `wait={MAX_START_WAIT_S}` and follow the run with `GET /v1/runs/{{run}}/events`"
        )));
    }
    let wait = match (query.wait, prefer) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(wait.map(|w| w.min(MAX_START_WAIT_S)))
}

/// Where to run a failed run again from.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRun {
    /// A top-level step (default: the one that failed).
    #[serde(default)]
    pub from: Option<String>,
}

/// An operator's decision on a tool call whose outcome is unknown.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRun {
    /// The blocked step.
    pub step: String,
    pub decision: Decision,
    /// With `committed`: the effect's output.
    #[serde(default)]
    pub output: Option<Value>,
    /// With `failed`: why.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Whether the effect happened.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// It happened; `output` is what it returned.
    Committed,
    /// It did not (or is to be treated as failed); `reason` says why.
    Failed,
}

/// A judge's answer.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerJudgment {
    /// The `request_hash` of the request answered (from
    /// `GET /v1/judgments/{judgment}`).
    pub request_hash: String,
    /// The answer; it must match the request's result schema.
    pub result: Value,
    #[serde(default)]
    pub executor: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// Who judged and how; `judge` is required.
    pub provenance: Value,
}

/// A definition to publish.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishWorkflow {
    /// The workflow definition as YAML or JSON text.
    pub definition: String,
    /// How `definition` is written (default `yaml`; YAML reads JSON too).
    #[serde(default)]
    pub format: Option<DefinitionFormat>,
    /// The version it descends from: a version, `ID@latest`, or `root` for
    /// none (default: the workflow's latest).
    #[serde(default)]
    pub parent: Option<String>,
}

/// How a definition is written.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DefinitionFormat {
    Yaml,
    Json,
}

/// What publishing did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PublishedView {
    pub workflow: String,
    pub version: String,
    pub parent: Option<String>,
    /// False when identical content was already published (nothing written).
    pub created: bool,
}

/// A published workflow.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkflowView {
    pub workflow_id: String,
    pub versions: u64,
    /// The most recently published version.
    pub latest: String,
}

/// One version of a workflow.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionView {
    pub version: String,
    pub parent: Option<String>,
    pub workflow_id: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// The definition, canonical (only on `GET /v1/versions/{version}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub definition: Option<Value>,
}

/// Which version to arm.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArmWorkflow {
    /// A version of the workflow (full, a prefix, or `latest`).
    pub version: String,
}

/// Two versions to compare.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// The older version (a version, a prefix, `ID@latest`, or an id).
    pub from: String,
    /// The newer version.
    pub to: String,
}

/// From where to follow a run's events.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Send events after this sequence number (as `Last-Event-ID` does).
    pub after: Option<u64>,
}

/// Whether the server answers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
}

// ------------------------------------------------------------ OpenAPI doc

/// The OpenAPI document of the `/v1` API.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "poimen HTTP API",
        version = "1",
        description = "Runs, episodes, judgments, workflows and plugins of a poimen host. Errors are RFC 9457 problems (`application/problem+json`) whose `type` is stable per kind of error (`https://poimen.dev/problems/…`); see docs/http-api.md.",
        license(name = "Apache-2.0")
    ),
    paths(
        health, ready, openapi_doc, metrics,
        start_run, list_runs, get_run, cancel_run, retry_run, resume_run, reconcile_run,
        episode, events, audit,
        list_judgments, show_judgment, submit_judgment,
        list_workflows, publish, list_versions, arm, disarm, show_version, diff,
        list_plugins, inspect_plugin, show_plugin,
        start_shadow, list_shadows, show_shadow,
    ),
    components(schemas(Problem)),
    modifiers(&BearerAuth, &CommonProblems),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Start, follow and operate runs"),
        (name = "judgments", description = "Human judgments runs wait for"),
        (name = "workflows", description = "Published workflows, their versions and arming"),
        (name = "plugins", description = "Tools and verifiers of the host"),
        (name = "shadow", description = "Shadow evaluation: a candidate version replayed on a baseline's recorded runs"),
        (name = "meta", description = "Health, readiness and this document"),
    )
)]
pub struct ApiDoc;

/// One server-sent event of `GET /v1/runs/{run}/events`.
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)] // A schema only: the stream is written by axum's `Event`.
pub struct SseEvent {
    /// The event's sequence number.
    pub id: String,
    /// The event's kind (`run_started`, `step_finished`, …).
    pub event: String,
    /// The event as JSON text (`run`, `seq`, `at` and its fields).
    pub data: String,
}

/// The problems every operation of a kind can answer, documented once:
/// `401` on every route that takes the token; `400` (malformed JSON or
/// body), `413` and `415` on every JSON body; `400` (`bad-id`) on every
/// route with a run or judgment id in its path.
struct CommonProblems;

impl Modify for CommonProblems {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    crate::PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let open = path == "/v1/health" || path == "/v1/ready";
            for op in [
                item.get.as_mut(),
                item.post.as_mut(),
                item.put.as_mut(),
                item.delete.as_mut(),
            ]
            .into_iter()
            .flatten()
            {
                let mut add = |status: &str, description: &str| {
                    op.responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| problem(description).into());
                };
                if !open {
                    add("401", "No token, or the wrong one");
                }
                let json_body = op
                    .request_body
                    .as_ref()
                    .is_some_and(|b| b.content.keys().any(|c| c == "application/json"));
                if json_body {
                    add(
                        "400",
                        "Malformed JSON, or a body not of the documented shape",
                    );
                    add("413", "The request body is too large");
                    add("415", "The request body is not `application/json`");
                }
                let ids = op.parameters.iter().flatten().any(|p| {
                    p.parameter_in == ParameterIn::Path && (p.name == "run" || p.name == "judgment")
                });
                if ids {
                    add("400", "A malformed id (`bad-id`)");
                }
            }
        }
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

// ---------------------------------------------------------------- helpers

fn run_id(text: &str) -> ApiResult<RunId> {
    RunId::parse(text).map_err(|e| ApiError::Host(e.into()))
}

fn judgment_id(text: &str) -> ApiResult<JudgmentId> {
    JudgmentId::parse(text).map_err(|e| ApiError::Host(e.into()))
}

/// Whether a workflow target names a file: over HTTP it never may (a
/// client must not make the server read its disk).
fn looks_like_path(s: &str) -> bool {
    s.contains('/')
        || s.contains('\\')
        || s.starts_with('.')
        || s.starts_with('~')
        || [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| s.to_ascii_lowercase().ends_with(ext))
}

fn to_value<T: Serialize>(v: &T) -> ApiResult<Value> {
    serde_json::to_value(v).map_err(|e| ApiError::Encode(e.to_string()))
}

// ------------------------------------------------------------------- meta

/// The host's metrics in the Prometheus text format (OpenMetrics): runs
/// created and ended by status, step and guest-call latency, fuel and peak
/// memory per call, store commit latency, lease claims and takeovers, runs
/// shed by priority, the scheduler's workers, queue and pressure. Also
/// served at `/metrics`.
#[utoipa::path(get, path = "/v1/metrics", tag = "meta",
    responses((status = 200, description = "The metrics", body = String,
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
async fn metrics(State(host): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        host.metrics_text(),
    )
        .into_response()
}

/// Liveness: the server answers (no token needed).
#[utoipa::path(get, path = "/v1/health", tag = "meta", security(()),
    responses((status = 200, description = "The server answers", body = Health)))]
async fn health() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".to_owned(),
    })
}

/// Readiness: the store answers a read (no token needed).
#[utoipa::path(get, path = "/v1/ready", tag = "meta", security(()),
    responses(
        (status = 200, description = "The store answers", body = Health),
        (status = 503, description = "The store does not answer", body = Problem, content_type = "application/problem+json"),
    ))]
async fn ready(State(host): State<Shared>) -> ApiResult<axum::Json<Health>> {
    host.check_store().await.map_err(ApiError::NotReady)?;
    Ok(axum::Json(Health {
        status: "ok".to_owned(),
    }))
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document", body = Object),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn openapi_doc() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi_json(),
    )
        .into_response()
}

// ------------------------------------------------------------------- runs

/// Starts a run of a published workflow: driven by this host at once, or —
/// under `poimen serve` — queued for its serving loop, which claims it
/// within its bound on runs at once (`--max-runs`).
///
/// With a wait (`?wait=N` or `Prefer: wait=N`, seconds) the run is driven
/// by this host at once — under `poimen serve`, when one of its
/// `--max-runs` slots is free, else queued for its loop — and the request
/// is answered when it stops: `201`
/// with its outcome (status and output) if it stopped within the wait,
/// else `202` with its state once that is durable (follow it with
/// `GET /v1/runs/{run}/events`). One request and, for a run of effect-free
/// steps, one fsync: its end's, which makes its start durable too.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = StartRun, params(StartQuery,
        ("Prefer" = Option<String>, Header, description = "`wait=N` (RFC 7240): as `?wait=N`")),
    responses(
        (status = 201, description = "The run was created, started or queued (or, under a known idempotency key, the existing run); with a wait, it stopped within it and this is its outcome", body = RunView),
        (status = 202, description = "With a wait: the run did not stop within it and goes on; this is its state", body = RunView),
        (status = 400, description = "Malformed body, a file path as target, input violating the workflow's schema (`input-invalid`), or a bad wait", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The policy refuses the workflow", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown workflow or version", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Idempotency conflict, or the workflow disarmed or the version not armed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The stored workflow does not validate on this host", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The workflow's concurrency limit refuses the run (`overflow`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shed under pressure, or unavailable; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
async fn start_run(
    State(host): State<Shared>,
    headers: HeaderMap,
    QueryOf(query): QueryOf<StartQuery>,
    Json(req): Json<StartRun>,
    starts: Starts,
) -> ApiResult<Response> {
    let wait = start_wait(&query, &headers)?;
    if looks_like_path(&req.workflow) {
        return Err(ApiError::FileTarget(req.workflow));
    }
    let target = pinned(&host, req.workflow).await?;
    let opts = RunOptions {
        idempotency_key: req.idempotency_key,
        tenant: req.tenant,
        trace: trace_carrier(&headers),
    };
    let target = Target::Version(target);
    if let Some(secs) = wait {
        let within = std::time::Duration::from_secs(u64::from(secs));
        // Driven here at once with one of the host's slots for runs at
        // once in hand, held until the driver stops; with none free, the
        // run waits for the serving loop as an unwaited start does.
        let slot = match &starts.slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => return queued_then_waited(&host, &target, req.input, opts, secs).await,
            },
        };
        let handle = host.start_waiting(&target, req.input, opts).await?;
        if let Some(slot) = slot {
            let driven = handle.clone();
            tokio::spawn(async move {
                driven.driver_stopped().await;
                drop(slot);
            });
        }
        let stopped = handle
            .stopped_within(within)
            .await?
            .filter(|(rec, _)| !matches!(rec.status, RunStatus::Running | RunStatus::Queued));
        let (code, view) = match stopped {
            Some((record, output)) => (StatusCode::CREATED, RunView::of(record, output)),
            None => {
                let (record, state) = host.status(handle.id()).await?;
                if matches!(record.status, RunStatus::Running | RunStatus::Queued) {
                    (StatusCode::ACCEPTED, RunView::of(record, None))
                } else {
                    // It stopped between the wait's end and this read (a
                    // stop is durable when it is recorded): its outcome,
                    // never a `202` that says it stopped.
                    (StatusCode::CREATED, RunView::of(record, state.output))
                }
            }
        };
        return Ok(waited_answer(code, view, secs));
    }
    let run = if starts.queue {
        host.enqueue(&target, req.input, opts).await?
    } else {
        host.start(&target, req.input, opts).await?.id().clone()
    };
    let (record, _) = host.status(&run).await?;
    let location = format!("/v1/runs/{}", record.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        axum::Json(RunView::of(record, None)),
    )
        .into_response())
}

/// How `POST /v1/runs` starts runs on this host (see [`ServerConfig`](crate::ServerConfig)).
#[derive(Clone)]
struct Starts {
    /// Unwaited starts are queued for the serving loop.
    queue: bool,
    /// The host's slots for runs at once, shared with its serving loop.
    slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// A waited start with every slot taken: queued for the serving loop,
/// then waited for through the store.
async fn queued_then_waited(
    host: &Shared,
    target: &Target,
    input: serde_json::Value,
    opts: RunOptions,
    secs: u32,
) -> ApiResult<Response> {
    let run = host.enqueue(target, input, opts).await?;
    let within = std::time::Duration::from_secs(u64::from(secs));
    let stopped = match host.handle(&run).wait_for(within).await {
        Ok(_) => true,
        Err(poimen::Error::Timeout { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    let (record, state) = host.status(&run).await?;
    let stopped = stopped && !matches!(record.status, RunStatus::Running | RunStatus::Queued);
    Ok(if stopped {
        waited_answer(StatusCode::CREATED, RunView::of(record, state.output), secs)
    } else {
        waited_answer(StatusCode::ACCEPTED, RunView::of(record, None), secs)
    })
}

/// The answer to a waited start: `201` with the run's outcome, or `202`
/// with its state; where it is, and that the wait was taken.
fn waited_answer(code: StatusCode, view: RunView, secs: u32) -> Response {
    if code == StatusCode::CREATED {
        // The run stopped, durably; its caller has not heard yet.
        poimen::executor::crash_point("before_answer");
    }
    let location = format!("/v1/runs/{}", view.id);
    (
        code,
        [
            (header::LOCATION, location),
            (
                header::HeaderName::from_static("preference-applied"),
                format!("wait={secs}"),
            ),
        ],
        axum::Json(view),
    )
        .into_response()
}

/// The caller's W3C trace context (`traceparent`, with `tracestate`), kept
/// with a run it starts so that the host driving it continues the trace.
fn trace_carrier(headers: &HeaderMap) -> Option<poimen::TraceCarrier> {
    let field = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            // A W3C field is short; anything longer is not one.
            .filter(|v| v.len() <= 512)
            .map(|v| (name.to_owned(), v.to_owned()))
    };
    let parent = field("traceparent")?;
    Some(std::iter::once(parent).chain(field("tracestate")).collect())
}

/// `ID@VERSION` as the version it names, once it is known to be one of
/// `ID`'s; anything else (an id, `ID@latest`, a version) as given.
async fn pinned(host: &Host, target: String) -> ApiResult<String> {
    let Some((id, version)) = target.split_once('@').filter(|(_, v)| *v != "latest") else {
        return Ok(target);
    };
    let (record, _) = host.find_version(version).await?;
    if record.workflow_id.as_str() != id {
        return Err(ApiError::Host(poimen::Error::BadTarget {
            given: target.clone(),
            detail: format!(
                "version {} is a version of `{}`, not of `{id}`; `GET /v1/workflows/{id}/versions` lists its versions",
                record.version, record.workflow_id
            ),
        }));
    }
    Ok(record.version.to_string())
}

/// Lists runs, newest first.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(RunQuery),
    responses(
        (status = 200, description = "The runs", body = [RunView]),
        (status = 400, description = "A filter does not parse", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_runs(
    State(host): State<Shared>,
    QueryOf(q): QueryOf<RunQuery>,
) -> ApiResult<axum::Json<Vec<RunView>>> {
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
            ApiError::InvalidQuery(format!(
                "`status={s}` is not a run status; one of: {}",
                RunStatus::ALL.map(RunStatus::as_str).join(", ")
            ))
        })?),
    };
    let filter = RunFilter {
        status,
        workflow_id: q.workflow.map(WorkflowId::from),
        tenant: q.tenant,
        parent: None,
        limit: Some(q.limit.unwrap_or(50).min(MAX_LIST)),
        ..RunFilter::default()
    };
    let runs = host.list_runs(filter).await?;
    Ok(axum::Json(
        runs.into_iter().map(|r| RunView::of(r, None)).collect(),
    ))
}

/// A run: its record and output.
#[utoipa::path(get, path = "/v1/runs/{run}", tag = "runs",
    params(("run" = String, Path, description = "The run's id (`WFR-…`)")),
    responses(
        (status = 200, description = "The run", body = RunView),
        (status = 400, description = "Not a run id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_run(
    State(host): State<Shared>,
    Path(run): Path<String>,
) -> ApiResult<axum::Json<RunView>> {
    let (record, state) = host.status(&run_id(&run)?).await?;
    Ok(axum::Json(RunView::of(record, state.output)))
}

/// Cancels a run.
#[utoipa::path(post, path = "/v1/runs/{run}/cancel", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run, cancelled", body = RunView),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run already ended (`wrong-status`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel_run(
    State(host): State<Shared>,
    Path(run): Path<String>,
) -> ApiResult<axum::Json<RunView>> {
    let record = host.cancel(&run_id(&run)?).await?;
    Ok(axum::Json(RunView::of(record, None)))
}

/// Runs a failed run again from a step; answers when it next stops.
#[utoipa::path(post, path = "/v1/runs/{run}/retry", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    request_body(content = Option<RetryRun>, description = "Optional: from which step (default: the one that failed)"),
    responses(
        (status = 200, description = "What the run came to", body = OutcomeView),
        (status = 400, description = "Malformed body, or not a top-level step", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run is not failed (`wrong-status`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn retry_run(
    State(host): State<Shared>,
    Path(run): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<RetryRun>,
) -> ApiResult<axum::Json<OutcomeView>> {
    let run = run_id(&run)?;
    let from = req.from.map(StepId::from);
    let outcome = host.retry(&run, from.as_ref()).await?;
    Ok(axum::Json(outcome.into()))
}

/// Drives a stopped run again; answers when it next stops.
#[utoipa::path(post, path = "/v1/runs/{run}/resume", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "What the run came to", body = OutcomeView),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another host drives the run (`run-held`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn resume_run(
    State(host): State<Shared>,
    Path(run): Path<String>,
) -> ApiResult<axum::Json<OutcomeView>> {
    let outcome = host.resume(&run_id(&run)?).await?;
    Ok(axum::Json(outcome.into()))
}

/// Records an operator's decision on a blocked run's tool call.
#[utoipa::path(post, path = "/v1/runs/{run}/reconcile", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    request_body = ReconcileRun,
    responses(
        (status = 200, description = "What the run came to", body = OutcomeView),
        (status = 400, description = "Malformed body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The run is not blocked, or the step has no open call", body = Problem, content_type = "application/problem+json"),
    ))]
async fn reconcile_run(
    State(host): State<Shared>,
    Path(run): Path<String>,
    Json(req): Json<ReconcileRun>,
) -> ApiResult<axum::Json<OutcomeView>> {
    let run = run_id(&run)?;
    let decision = match req.decision {
        Decision::Committed => Reconciliation::Committed {
            output: req.output.ok_or_else(|| {
                ApiError::InvalidBody(
                    "`decision: committed` needs `output`, the effect's output".into(),
                )
            })?,
        },
        Decision::Failed => Reconciliation::Failed {
            reason: req.reason.ok_or_else(|| {
                ApiError::InvalidBody(
                    "`decision: failed` needs `reason`, why the effect failed".into(),
                )
            })?,
        },
    };
    let outcome = host
        .reconcile(&run, &StepId::from(req.step.as_str()), decision)
        .await?;
    Ok(axum::Json(outcome.into()))
}

/// A run's episode: every event, in order.
#[utoipa::path(get, path = "/v1/runs/{run}/episode", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The episode", body = Object),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
    ))]
async fn episode(
    State(host): State<Shared>,
    Path(run): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let run = run_id(&run)?;
    // An unknown run has an empty episode: say it is unknown instead.
    host.status(&run).await?;
    let episode = host.episode(&run).await?;
    Ok(axum::Json(to_value(&episode)?))
}

/// A run's events as server-sent events: from the start (or after
/// `Last-Event-ID` / `?after=`), then live as they are committed; the
/// stream ends after the event that ends the run. Each event's `id` is its
/// sequence number, its `event` its kind, its `data` the event as JSON.
#[utoipa::path(get, path = "/v1/runs/{run}/events", tag = "runs",
    params(
        ("run" = String, Path, description = "The run's id"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence number"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "A `text/event-stream` of the run's events", content_type = "text/event-stream", body = SseEvent),
        (status = 400, description = "`after` or `Last-Event-ID` is not a sequence number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
    ))]
async fn events(
    State(host): State<Shared>,
    Path(run): Path<String>,
    headers: HeaderMap,
    QueryOf(q): QueryOf<EventsQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let run = run_id(&run)?;
    let last = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::InvalidQuery(
                        "`Last-Event-ID` must be a sequence number (the `id` of an event received)"
                            .into(),
                    )
                })?,
        ),
    };
    let (record, _) = host.status(&run).await?;
    let from = q.after.or(last).map_or(0, |seq| seq.saturating_add(1));
    // A run that has ended sends nothing after its last event: a client
    // resuming past it gets an empty stream that ends, not one that waits.
    let ended = record.status.is_terminal()
        && host
            .episode(&run)
            .await?
            .events
            .last()
            .is_none_or(|e| e.seq < from);
    // Boxed as `'static`: the host's stream owns what it reads from
    // (its `'static` bound), whatever the borrows of its arguments.
    let live: std::pin::Pin<
        Box<dyn Stream<Item = Result<poimen::RunEvent, poimen::Error>> + Send>,
    > = if ended {
        Box::pin(futures::stream::empty())
    } else {
        Box::pin(host.run_events(&run, from))
    };
    let stream = live.map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(e) => {
                let data = serde_json::to_string(&e).unwrap_or_else(|_| "{}".to_owned());
                Event::default()
                    .id(e.seq.to_string())
                    .event(e.event.kind())
                    .data(data)
            }
            Err(err) => Event::default().event("error").data(err.to_string()),
        })
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// A run's audit: intents, tool calls and verdicts with hostcall records.
#[utoipa::path(get, path = "/v1/runs/{run}/audit", tag = "runs",
    params(("run" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The audit", body = Object),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such run", body = Problem, content_type = "application/problem+json"),
    ))]
async fn audit(
    State(host): State<Shared>,
    Path(run): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let audit = host.audit(&run_id(&run)?).await?;
    Ok(axum::Json(to_value(&audit)?))
}

// -------------------------------------------------------------- judgments

/// Open judgment requests.
#[utoipa::path(get, path = "/v1/judgments", tag = "judgments",
    responses(
        (status = 200, description = "The open requests", body = [Object]),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_judgments(State(host): State<Shared>) -> ApiResult<axum::Json<Value>> {
    Ok(axum::Json(to_value(&host.judgments().await?)?))
}

/// One judgment request, with its answer once given.
#[utoipa::path(get, path = "/v1/judgments/{judgment}", tag = "judgments",
    params(("judgment" = String, Path, description = "The judgment's id")),
    responses(
        (status = 200, description = "The request", body = Object),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such judgment", body = Problem, content_type = "application/problem+json"),
    ))]
async fn show_judgment(
    State(host): State<Shared>,
    Path(judgment): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let record = host.judgment(&judgment_id(&judgment)?).await?;
    Ok(axum::Json(to_value(&record)?))
}

/// Answers a judgment request; the run goes on, and this answers when it
/// next stops.
#[utoipa::path(post, path = "/v1/judgments/{judgment}/answer", tag = "judgments",
    params(("judgment" = String, Path, description = "The judgment's id")),
    request_body = AnswerJudgment,
    responses(
        (status = 200, description = "What the run came to", body = OutcomeView),
        (status = 400, description = "Malformed body, or an answer violating the result schema (`judgment-result-invalid`)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such judgment", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already answered, or the request hash is stale", body = Problem, content_type = "application/problem+json"),
    ))]
async fn submit_judgment(
    State(host): State<Shared>,
    Path(judgment): Path<String>,
    Json(req): Json<AnswerJudgment>,
) -> ApiResult<axum::Json<OutcomeView>> {
    let id = judgment_id(&judgment)?;
    let outcome = host
        .submit_judgment(
            &id,
            JudgmentSubmission {
                request_hash: req.request_hash,
                result: req.result,
                executor: req.executor,
                profile: req.profile,
                provenance: req.provenance,
            },
        )
        .await?;
    Ok(axum::Json(outcome.into()))
}

// -------------------------------------------------------------- workflows

/// Every published workflow.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows",
    responses(
        (status = 200, description = "The workflows", body = [WorkflowView]),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_workflows(State(host): State<Shared>) -> ApiResult<axum::Json<Vec<WorkflowView>>> {
    let list = host.workflows().await?;
    Ok(axum::Json(
        list.into_iter()
            .map(|w| WorkflowView {
                workflow_id: w.workflow_id.to_string(),
                versions: w.versions,
                latest: w.latest.to_string(),
            })
            .collect(),
    ))
}

/// Validates and publishes a definition.
#[utoipa::path(post, path = "/v1/workflows", tag = "workflows", request_body = PublishWorkflow,
    responses(
        (status = 201, description = "A new version was published", body = PublishedView),
        (status = 200, description = "The same content was already published; nothing written", body = PublishedView),
        (status = 400, description = "Malformed body, or a parent that does not exist", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The definition does not parse or validate, or breaks the policy", body = Problem, content_type = "application/problem+json"),
    ))]
async fn publish(
    State(host): State<Shared>,
    Json(req): Json<PublishWorkflow>,
) -> ApiResult<Response> {
    let format = match req.format.unwrap_or(DefinitionFormat::Yaml) {
        DefinitionFormat::Yaml => poimen::workflow::Format::Yaml,
        DefinitionFormat::Json => poimen::workflow::Format::Json,
    };
    let def = poimen::workflow::parse(req.definition.as_bytes(), format, "request body")
        .map_err(|e| ApiError::Host(e.into()))?;
    let parent = match req.parent.as_deref() {
        None => Parent::Latest,
        Some("root") => Parent::Root,
        Some(p) => Parent::Version(p),
    };
    let published = host.publish(&def, parent).await?;
    let status = if published.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let view = PublishedView {
        workflow: published.workflow.to_string(),
        version: published.version.to_string(),
        parent: published.parent.map(|p| p.to_string()),
        created: published.created,
    };
    Ok((status, axum::Json(view)).into_response())
}

/// Every version of a workflow, in publish order.
#[utoipa::path(get, path = "/v1/workflows/{workflow}/versions", tag = "workflows",
    params(("workflow" = String, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "The versions", body = [VersionView]),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such workflow", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_versions(
    State(host): State<Shared>,
    Path(workflow): Path<String>,
) -> ApiResult<axum::Json<Vec<VersionView>>> {
    let list = host.versions(&WorkflowId::from(workflow.as_str())).await?;
    Ok(axum::Json(
        list.into_iter()
            .map(|r| VersionView {
                version: r.version.to_string(),
                parent: r.parent.map(|p| p.to_string()),
                workflow_id: r.workflow_id.to_string(),
                created_at: r.created_at,
                definition: None,
            })
            .collect(),
    ))
}

/// A version and its canonical definition.
#[utoipa::path(get, path = "/v1/versions/{version}", tag = "workflows",
    params(("version" = String, Path, description = "A version, a prefix, `ID@latest`, or a workflow id (its armed version)")),
    responses(
        (status = 200, description = "The version", body = VersionView),
        (status = 400, description = "Not a version, or an ambiguous prefix", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
    ))]
async fn show_version(
    State(host): State<Shared>,
    Path(version): Path<String>,
) -> ApiResult<axum::Json<VersionView>> {
    let (record, def) = host.find_version(&version).await?;
    Ok(axum::Json(VersionView {
        version: record.version.to_string(),
        parent: record.parent.map(|p| p.to_string()),
        workflow_id: record.workflow_id.to_string(),
        created_at: record.created_at,
        definition: Some(to_value(&def)?),
    }))
}

/// What changed between two versions.
#[utoipa::path(get, path = "/v1/diff", tag = "workflows", params(DiffQuery),
    responses(
        (status = 200, description = "The changes (`change`: step_added, step_removed, step_changed, transition_added, transition_removed, field_changed)", body = [Object]),
        (status = 400, description = "A missing or malformed version", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
    ))]
async fn diff(
    State(host): State<Shared>,
    QueryOf(q): QueryOf<DiffQuery>,
) -> ApiResult<axum::Json<Value>> {
    let (_, old) = host.find_version(&q.from).await?;
    let (_, new) = host.find_version(&q.to).await?;
    Ok(axum::Json(to_value(&poimen::diff::diff(&old, &new))?))
}

/// Arms a version: new runs of the workflow start on it; live runs of
/// other versions are retired by their `unload` policies.
#[utoipa::path(post, path = "/v1/workflows/{workflow}/arm", tag = "workflows",
    params(("workflow" = String, Path, description = "The workflow's id")),
    request_body = ArmWorkflow,
    responses(
        (status = 200, description = "What arming did (`workflow`, `version`, `previous`, `retired`)", body = Object),
        (status = 400, description = "Malformed body, or a version of another workflow", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The policy refuses the workflow", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
    ))]
async fn arm(
    State(host): State<Shared>,
    Path(workflow): Path<String>,
    Json(req): Json<ArmWorkflow>,
) -> ApiResult<axum::Json<Value>> {
    let armed = host.arm(&format!("{workflow}@{}", req.version)).await?;
    Ok(axum::Json(to_value(&armed)?))
}

/// Disarms a workflow: no new run of it starts.
#[utoipa::path(post, path = "/v1/workflows/{workflow}/disarm", tag = "workflows",
    params(("workflow" = String, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "What disarming did", body = Object),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such workflow", body = Problem, content_type = "application/problem+json"),
    ))]
async fn disarm(
    State(host): State<Shared>,
    Path(workflow): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let armed = host.disarm(&WorkflowId::from(workflow.as_str())).await?;
    Ok(axum::Json(to_value(&armed)?))
}

// ---------------------------------------------------------------- plugins

/// One plugin as listed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PluginView {
    /// `tool` or `verifier` (absent for a refused file).
    pub kind: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
    /// The component's digest.
    pub digest: Option<String>,
    /// Where it came from.
    pub origin: String,
    /// `ready`, `withheld` (the policy grants not what it declares) or
    /// `refused` (it did not load).
    pub status: String,
    /// Why it is withheld or refused, and what to do.
    pub reason: Option<String>,
}

fn plugin_rows(host: &Host) -> ApiResult<Vec<PluginView>> {
    let text = |v: &dyn erased::Ser| -> ApiResult<Option<String>> {
        Ok(match v.value()? {
            Value::String(s) => Some(s),
            Value::Null => None,
            other => Some(other.to_string()),
        })
    };
    let mut rows = Vec::new();
    for e in host.tools().into_iter().chain(host.verifiers()) {
        rows.push(PluginView {
            kind: text(&e.kind)?,
            name: Some(e.info.name.to_string()),
            version: Some(e.info.version.to_string()),
            digest: text(&e.info.digest)?,
            origin: e.origin,
            status: "ready".to_owned(),
            reason: None,
        });
    }
    for w in host.withheld_plugins() {
        rows.push(PluginView {
            kind: text(&w.kind)?,
            name: Some(w.info.name.to_string()),
            version: Some(w.info.version.to_string()),
            digest: text(&w.info.digest)?,
            origin: w.origin,
            status: "withheld".to_owned(),
            reason: Some(w.reason.to_string()),
        });
    }
    for r in host.refused_plugins() {
        rows.push(PluginView {
            kind: None,
            name: None,
            version: None,
            digest: None,
            origin: r.origin,
            status: "refused".to_owned(),
            reason: Some(r.reason),
        });
    }
    Ok(rows)
}

/// Serializing through a trait object, for the few fields of foreign types.
mod erased {
    use super::{ApiError, ApiResult, Value};

    pub(super) trait Ser {
        fn value(&self) -> ApiResult<Value>;
    }

    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> ApiResult<Value> {
            serde_json::to_value(self).map_err(|e| ApiError::Encode(e.to_string()))
        }
    }
}

/// Installed tools and verifiers: ready, withheld and refused.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses(
        (status = 200, description = "The plugins", body = [PluginView]),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_plugins(State(host): State<Shared>) -> ApiResult<axum::Json<Vec<PluginView>>> {
    Ok(axum::Json(plugin_rows(&host)?))
}

/// A registered plugin in full: its description, imports, grants, limits.
#[utoipa::path(get, path = "/v1/plugins/{name}", tag = "plugins",
    params(("name" = String, Path, description = "The tool's or verifier's name")),
    responses(
        (status = 200, description = "Every registered component under the name", body = [Object]),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such plugin", body = Problem, content_type = "application/problem+json"),
    ))]
async fn show_plugin(
    State(host): State<Shared>,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let found: Vec<_> = host
        .tools()
        .into_iter()
        .chain(host.verifiers())
        .filter(|e| e.info.name == name)
        .collect();
    if found.is_empty() {
        return Err(ApiError::UnknownPlugin(name));
    }
    Ok(axum::Json(to_value(&found)?))
}

/// What a component (the request body, `application/wasm`) says and
/// imports, without registering it.
#[utoipa::path(post, path = "/v1/plugins/inspect", tag = "plugins",
    request_body(content = Vec<u8>, content_type = "application/wasm", description = "A WebAssembly component"),
    responses(
        (status = 200, description = "What the component says and imports", body = Object),
        (status = 400, description = "Not a component poimen can load", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn inspect_plugin(
    State(host): State<Shared>,
    Body(body): Body,
) -> ApiResult<axum::Json<Value>> {
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the request body must be a WebAssembly component (`Content-Type: application/wasm`)"
                .into(),
        ));
    }
    let inspection = host.inspect_plugin(body.to_vec()).await?;
    Ok(axum::Json(to_value(&inspection)?))
}

// ----------------------------------------------------------------- shadow

/// The most shadow reports one server keeps (the oldest is forgotten).
const MAX_SHADOW_REPORTS: usize = 32;
/// The most shadow evaluations one server runs at once.
const MAX_SHADOW_RUNNING: usize = 2;
/// The most recorded runs one evaluation replays.
const MAX_SHADOW_RUNS: u32 = 1000;
/// The most shadow runs of one evaluation at once.
const MAX_SHADOW_WORKERS: usize = 16;

/// The shadow routes' state: the host and the reports evaluated so far.
#[derive(Clone)]
pub(crate) struct ShadowState {
    host: Shared,
    reports: Arc<std::sync::Mutex<std::collections::VecDeque<ShadowView>>>,
    running: Arc<std::sync::atomic::AtomicUsize>,
}

impl ShadowState {
    pub(crate) fn new(host: Shared) -> ShadowState {
        ShadowState {
            host,
            reports: Arc::default(),
            running: Arc::default(),
        }
    }

    /// The kept evaluations, newest first: id, baseline, candidate, status.
    pub(crate) fn summaries(&self) -> Vec<(String, String, String, &'static str)> {
        self.reports()
            .iter()
            .rev()
            .map(|v| {
                let s = ShadowSummary::of(v);
                let status = match s.status {
                    ShadowStatus::Running => "running",
                    ShadowStatus::Finished => "finished",
                    ShadowStatus::Failed => "failed",
                };
                (s.id, s.baseline, s.candidate, status)
            })
            .collect()
    }

    /// The (baseline, candidate) pairs of the kept evaluations.
    pub(crate) fn compared(&self) -> Vec<(String, String)> {
        self.summaries()
            .into_iter()
            .map(|(_, b, c, _)| (b, c))
            .collect()
    }

    /// The HTML report of a kept evaluation (`poimen shadow --html`), or
    /// why it has none yet; `None` for one not kept.
    pub(crate) fn report_html(&self, id: &str) -> Option<Result<String, String>> {
        let reports = self.reports();
        let v = reports.iter().find(|v| v.id == id)?;
        Some(match (&v.report, &v.error) {
            (Some(report), _) => {
                serde_json::from_value::<poimen::shadow::ShadowReport>(report.clone())
                    .map(|r| poimen::shadow::render_html(&r))
                    .map_err(|e| format!("the kept report does not read back ({e})"))
            }
            (None, Some(problem)) => Err(format!("it failed: {}", problem.detail)),
            (None, None) => Err(format!(
                "it is still running: {} of {} runs replayed",
                v.done, v.total
            )),
        })
    }
}

fn shadow_routes(state: ShadowState) -> Router {
    Router::new()
        .route("/shadow", post(start_shadow).get(list_shadows))
        .route("/shadow/{shadow}", get(show_shadow))
        .with_state(state)
}

impl ShadowState {
    /// Changes the kept evaluation `id`, if it is still kept.
    fn update(&self, id: &str, change: impl FnOnce(&mut ShadowView)) {
        if let Some(v) = self.reports().iter_mut().find(|v| v.id == id) {
            change(v);
        }
    }

    fn reports(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<ShadowView>> {
        // A panic while holding the lock leaves the list whole.
        self.reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Holds one of the [`MAX_SHADOW_RUNNING`] evaluation slots until dropped.
struct ShadowSlot(Arc<std::sync::atomic::AtomicUsize>);

impl ShadowSlot {
    fn take(running: &Arc<std::sync::atomic::AtomicUsize>) -> Option<ShadowSlot> {
        use std::sync::atomic::Ordering;
        running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_SHADOW_RUNNING).then_some(n + 1)
            })
            .ok()
            .map(|_| ShadowSlot(running.clone()))
    }
}

impl Drop for ShadowSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A shadow evaluation to run: the candidate version on the recorded runs
/// of the baseline that the selection names (at most one of `runs`,
/// `since`, `sample`; default the latest 100).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartShadow {
    /// The version to evaluate: a published version (`b3:…`, a prefix,
    /// `ID@latest`, or a workflow id for its armed version). Never a file.
    pub candidate: String,
    /// The version whose recorded runs are replayed (the same forms).
    pub baseline: String,
    /// The latest this many finished runs of the baseline (1 to 1000).
    #[serde(default)]
    pub runs: Option<u32>,
    /// Finished runs of the baseline created at or after this time
    /// (milliseconds since the Unix epoch).
    #[serde(default)]
    pub since: Option<i64>,
    /// A deterministic sample of the baseline's finished runs at this rate
    /// (0 to 1).
    #[serde(default)]
    pub sample: Option<f64>,
    /// Where model steps get their answers (default `replay`).
    #[serde(default)]
    pub models: Option<ShadowModels>,
    /// How tools that read the world, and repeatable calls the baseline made,
    /// answer (default `replay`).
    #[serde(default)]
    pub tools: Option<ShadowTools>,
    /// Shadow runs at once (1 to 16; default the host's cores).
    #[serde(default)]
    pub workers: Option<usize>,
}

/// Where model steps of shadow runs get their answers.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ShadowModels {
    /// Only the baseline's recorded answers.
    Replay,
    /// Always the configured provider.
    Live,
    /// The recorded answer when there is one, else the provider.
    ReplayOrLive,
}

/// How tools of shadow runs that read the world answer.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ShadowTools {
    /// The baseline's recorded output for an identical call.
    Replay,
    /// Every tool runs live.
    Live,
}

/// Where a shadow evaluation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShadowStatus {
    /// Its shadow runs are being run (`done` of `total`).
    Running,
    /// It ended with a report.
    Finished,
    /// It stopped with an error (`error`).
    Failed,
}

/// A shadow evaluation: running, or ended with its report or its error.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ShadowView {
    /// `SHD-` and 16 hex digits; kept in this server's memory only.
    pub id: String,
    /// When the evaluation was started (milliseconds since the Unix epoch).
    pub created_at: i64,
    pub status: ShadowStatus,
    /// Shadow runs finished so far.
    pub done: usize,
    /// Recorded runs selected for replay.
    pub total: usize,
    /// When it ended (milliseconds since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Once finished, the report, as `poimen shadow --json` prints it:
    /// `workflow`, `baseline`, `candidate`, `aggregate` (wins, ties,
    /// losses, mean delta and its 95% interval), `runs` (one comparison per
    /// recorded run, regressions first), `version_diff`, `volatile_fields`.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<Value>,
    /// Once failed, why, as the problem a request would have answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
    /// The versions as requested (shown until the report names them).
    #[serde(skip)]
    requested: (String, String),
}

/// A shadow evaluation as listed (without its report).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ShadowSummary {
    pub id: String,
    pub created_at: i64,
    pub status: ShadowStatus,
    /// The workflow's id (empty until the report names it).
    pub workflow: String,
    /// The baseline version (as requested, until the report names it).
    pub baseline: String,
    /// The candidate version (as requested, until the report names it).
    pub candidate: String,
}

impl ShadowSummary {
    fn of(v: &ShadowView) -> ShadowSummary {
        let text = |k: &str, or: &str| {
            v.report
                .as_ref()
                .and_then(|r| r[k].as_str())
                .unwrap_or(or)
                .to_owned()
        };
        let (candidate, baseline) = &v.requested;
        ShadowSummary {
            id: v.id.clone(),
            created_at: v.created_at,
            status: v.status,
            workflow: text("workflow", ""),
            baseline: text("baseline", baseline),
            candidate: text("candidate", candidate),
        }
    }
}

fn new_shadow_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_i64(now_ms());
    format!("SHD-{:016x}", h.finish())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Starts evaluating a candidate version on the recorded runs of a
/// baseline version in the sandbox (nothing is written to the live store).
/// Answers 202 once the runs are selected; `GET` the `Location` for its
/// progress, then its report. Both versions must be of one workflow and
/// sandbox-eligible, and at least one recorded run must match: what is
/// refused is refused here, before anything runs.
#[utoipa::path(post, path = "/v1/shadow", tag = "shadow", request_body = StartShadow,
    responses(
        (status = 202, description = "The evaluation started; its progress and, once finished, its report are at `Location`", body = ShadowView),
        (status = 400, description = "Malformed body, a file path as a version, more than one selection, a value out of range, or versions of two workflows (`shadow-mismatch`)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown version", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A version is not sandbox-eligible (`shadow-ineligible`), no recorded run matches the selection (`no-shadow-runs`), or a stored version does not validate on this host", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many evaluations at once (`shadow-busy`); see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "The store failed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
async fn start_shadow(
    State(state): State<ShadowState>,
    Json(req): Json<StartShadow>,
) -> ApiResult<Response> {
    use poimen::shadow::{ModelMode, Selection, ShadowOptions, ToolMode};
    for v in [&req.candidate, &req.baseline] {
        if looks_like_path(v) {
            return Err(ApiError::FileTarget(v.clone()));
        }
    }
    let selection = match (req.runs, req.since, req.sample) {
        (Some(n), None, None) if (1..=MAX_SHADOW_RUNS).contains(&n) => Selection::Latest(n),
        (Some(n), None, None) => {
            return Err(ApiError::InvalidBody(format!(
                "`runs` is {n}; give 1 to {MAX_SHADOW_RUNS}"
            )));
        }
        (None, Some(t), None) => Selection::Since(t),
        (None, None, Some(rate)) if (0.0..=1.0).contains(&rate) => Selection::Sample(rate),
        (None, None, Some(rate)) => {
            return Err(ApiError::InvalidBody(format!(
                "`sample` is {rate}; give a rate from 0 to 1"
            )));
        }
        (None, None, None) => Selection::Latest(100),
        _ => {
            return Err(ApiError::InvalidBody(
                "give at most one of `runs`, `since` and `sample`".to_owned(),
            ));
        }
    };
    let mut opts = ShadowOptions {
        selection,
        models: match req.models.unwrap_or(ShadowModels::Replay) {
            ShadowModels::Replay => ModelMode::Replay,
            ShadowModels::Live => ModelMode::Live,
            ShadowModels::ReplayOrLive => ModelMode::ReplayOrLive,
        },
        tools: match req.tools.unwrap_or(ShadowTools::Replay) {
            ShadowTools::Replay => ToolMode::Replay,
            ShadowTools::Live => ToolMode::Live,
        },
        ..ShadowOptions::default()
    };
    if let Some(w) = req.workers {
        if !(1..=MAX_SHADOW_WORKERS).contains(&w) {
            return Err(ApiError::InvalidBody(format!(
                "`workers` is {w}; give 1 to {MAX_SHADOW_WORKERS}"
            )));
        }
        opts.workers = w;
    }
    opts.workers = opts.workers.min(MAX_SHADOW_WORKERS);
    let slot = ShadowSlot::take(&state.running).ok_or(ApiError::ShadowBusy(MAX_SHADOW_RUNNING))?;
    let id = new_shadow_id();
    // The evaluation runs in a task of its own and is answered 202 once
    // its runs are selected (progress `(0, total)`); what is refused before
    // that (unknown or ineligible versions, no runs) is this request's error.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let view = ShadowView {
        id: id.clone(),
        created_at: now_ms(),
        status: ShadowStatus::Running,
        done: 0,
        total: 0,
        finished_at: None,
        report: None,
        error: None,
        requested: (req.candidate.clone(), req.baseline.clone()),
    };
    let progress = {
        let state = state.clone();
        let id = id.clone();
        move |done: usize, total: usize| {
            let tx = started_tx
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if tx.is_some() {
                let mut reports = state.reports();
                while reports.len() >= MAX_SHADOW_REPORTS {
                    // The oldest ended one goes first; running ones stay.
                    let ended = reports
                        .iter()
                        .position(|v| v.status != ShadowStatus::Running)
                        .unwrap_or(0);
                    reports.remove(ended);
                }
                reports.push_back(ShadowView {
                    total,
                    ..view.clone()
                });
            }
            state.update(&id, |v| {
                v.done = done;
                v.total = total;
            });
            if let Some(tx) = tx {
                let _ = tx.send(());
            }
        }
    };
    opts.progress = Some(Arc::new(progress));
    let mut task = tokio::spawn({
        let state = state.clone();
        let id = id.clone();
        let candidate = Target::Version(req.candidate);
        async move {
            let _slot = slot;
            let result = state
                .host
                .shadow(&candidate, &req.baseline, &opts)
                .await
                .map_err(ApiError::Host)
                .and_then(|report| to_value(&report));
            let ended = match &result {
                Ok(report) => Ok(report.clone()),
                Err(e) => Err(e.problem()),
            };
            state.update(&id, |v| {
                v.finished_at = Some(now_ms());
                match ended {
                    Ok(report) => {
                        v.status = ShadowStatus::Finished;
                        v.done = v.total;
                        v.report = Some(report);
                    }
                    Err(problem) => {
                        v.status = ShadowStatus::Failed;
                        v.error = Some(problem);
                    }
                }
            });
            result
        }
    });
    tokio::select! {
        biased;
        Ok(()) = started_rx => {}
        joined = &mut task => match joined {
            // Refused before any run was selected.
            Ok(Err(e)) => return Err(e),
            Ok(Ok(_)) => {}
            Err(e) => {
                return Err(ApiError::Internal(format!(
                    "the shadow evaluation stopped unexpectedly: {e}"
                )));
            }
        },
    }
    let view = state.reports().iter().find(|v| v.id == id).cloned();
    let view = view.ok_or_else(|| ApiError::UnknownShadow(id.clone()))?;
    let location = format!("/v1/shadow/{id}");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        axum::Json(view),
    )
        .into_response())
}

/// The shadow evaluations this server has kept, newest first (the latest
/// 32; they are not stored, and a restart forgets them).
#[utoipa::path(get, path = "/v1/shadow", tag = "shadow",
    responses(
        (status = 200, description = "The evaluations", body = [ShadowSummary]),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_shadows(State(state): State<ShadowState>) -> axum::Json<Vec<ShadowSummary>> {
    axum::Json(
        state
            .reports()
            .iter()
            .rev()
            .map(ShadowSummary::of)
            .collect(),
    )
}

/// A shadow evaluation: its progress while it runs, then its report (or
/// the error that stopped it, such as a recorded run that could not be
/// replayed).
#[utoipa::path(get, path = "/v1/shadow/{shadow}", tag = "shadow",
    params(("shadow" = String, Path, description = "The evaluation's id (`SHD-…`)")),
    responses(
        (status = 200, description = "The evaluation", body = ShadowView),
        (status = 401, description = "No token, or the wrong one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such evaluation, or one this server no longer keeps (`unknown-shadow`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn show_shadow(
    State(state): State<ShadowState>,
    Path(shadow): Path<String>,
) -> ApiResult<axum::Json<ShadowView>> {
    state
        .reports()
        .iter()
        .find(|v| v.id == shadow)
        .cloned()
        .map(axum::Json)
        .ok_or(ApiError::UnknownShadow(shadow))
}

#[cfg(test)]
mod tests {
    use super::looks_like_path;

    #[test]
    fn file_paths_are_told_from_versions() {
        for path in [
            "flow.yaml",
            "a/b",
            "./x",
            "~/x",
            "C:\\x",
            "x.JSON",
            ".hidden",
        ] {
            assert!(looks_like_path(path), "{path}");
        }
        for target in [
            "support.triage",
            "support.triage@latest",
            "b3:0a1b",
            "0a1b2c",
        ] {
            assert!(!looks_like_path(target), "{target}");
        }
    }
}
