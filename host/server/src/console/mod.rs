//! The operators' web console: server-rendered pages over the same
//! [`poimen::Host`] verbs as the CLI and the `/v1` API — runs (filtered,
//! paged, counted), a run's timeline, episode, tool calls and receipts,
//! judgments answered through a form built from the result schema,
//! reconciliation of tool calls whose outcome is unknown, cancel, retry and
//! resume, versions with their DAG, diffs and plans, plugins, and shadow
//! reports.
//!
//! Every asset is served from the binary; pages read without JavaScript,
//! and the one script only refreshes live parts in place. Every value from
//! a workflow, a plugin or a run reaches the page through minijinja's HTML
//! auto-escaping. Every state-changing request is a form `POST` carrying
//! this server's CSRF token (and refused when its `Origin` is another
//! site's); actions that cannot be undone ask for confirmation first. With
//! a token configured, pages need the `poimen_token` cookie the sign-in
//! form sets (or the bearer header the API takes).

mod form;
mod timeline;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use minijinja::{Environment, Value as Ctx};
use poimen::{
    EpisodeEvent, Host, JudgmentId, JudgmentStatus, JudgmentSubmission, Reconciliation, RunFilter,
    RunId, RunRecord, RunStatus, StepId, Target, WorkflowId,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use subtle::ConstantTimeEq;

use crate::problem::ApiError;
use crate::routes::ShadowState;

/// The name of the cookie that carries the token of a signed-in browser.
const TOKEN_COOKIE: &str = "poimen_token";
/// Runs on one page of the list, unless asked otherwise (at most
/// [`MAX_PAGE`]).
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;
/// The most of one JSON value a page shows inline; more is cut, with a link
/// to the whole through the API.
const MAX_SHOWN: usize = 64 * 1024;
/// The most of one event, of a call's arguments or of its hostcall record
/// a run page shows: a long run's page stays a few megabytes (the whole is
/// in `GET /v1/runs/RUN/episode` and `/audit`).
const MAX_SHOWN_EACH: usize = 2 * 1024;

/// What every console handler shares.
#[derive(Clone)]
pub(crate) struct Console {
    host: Arc<Host>,
    env: Arc<Environment<'static>>,
    /// This server's CSRF token: random per process, in every form, never
    /// in a cookie — a page of another site can neither read nor guess it.
    csrf: Arc<String>,
    token: Arc<Option<String>>,
    shadow: ShadowState,
}

/// A page's context: `key => value` (or `key` alone for a variable of that
/// name), each value serialized to JSON.
macro_rules! page {
    ($($key:ident $(=> $value:expr)?),* $(,)?) => {{
        let mut m = serde_json::Map::new();
        $( m.insert(
            stringify!($key).to_owned(),
            serde_json::to_value(page!(@v $key $(, $value)?)).unwrap_or(Value::Null),
        ); )*
        Value::Object(m)
    }};
    (@v $key:ident) => { &$key };
    (@v $key:ident, $value:expr) => { &$value };
}

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("runs.html", include_str!("templates/runs.html")),
    ("run.html", include_str!("templates/run.html")),
    ("confirm.html", include_str!("templates/confirm.html")),
    ("judgments.html", include_str!("templates/judgments.html")),
    ("judgment.html", include_str!("templates/judgment.html")),
    ("workflows.html", include_str!("templates/workflows.html")),
    ("workflow.html", include_str!("templates/workflow.html")),
    ("diff.html", include_str!("templates/diff.html")),
    ("version.html", include_str!("templates/version.html")),
    ("plugins.html", include_str!("templates/plugins.html")),
    ("shadow.html", include_str!("templates/shadow.html")),
    ("login.html", include_str!("templates/login.html")),
    ("message.html", include_str!("templates/message.html")),
];

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// The console's routes, at the root; `token`, when set, is required.
pub(crate) fn router(host: Arc<Host>, token: Option<String>, shadow: ShadowState) -> Router {
    let mut env = Environment::new();
    // Auto-escaping is by name: every template here ends in `.html`.
    for (name, text) in TEMPLATES {
        if let Err(e) = env.add_template(name, text) {
            // A template that does not parse is a bug of this crate, caught
            // by its tests; the page that uses it answers the error.
            tracing::error!("console template {name}: {e}");
        }
    }
    let console = Console {
        host,
        env: Arc::new(env),
        csrf: Arc::new(random_token()),
        token: Arc::new(token),
        shadow,
    };
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
        .route("/login", get(login_page).post(login))
        .route("/runs", get(runs_page))
        .route("/runs/{run}", get(run_page))
        .route("/runs/{run}/cancel", post(cancel))
        .route("/runs/{run}/retry", post(retry))
        .route("/runs/{run}/resume", post(resume))
        .route("/runs/{run}/reconcile", post(reconcile))
        .route("/judgments", get(judgments_page))
        .route("/judgments/{judgment}", get(judgment_page).post(answer))
        .route("/workflows", get(workflows_page))
        .route("/workflows/{workflow}", get(workflow_page))
        .route("/versions/{version}", get(version_page))
        .route("/diff", get(diff_page))
        .route("/blobs/{hash}", get(blob))
        .route("/plugins", get(plugins_page))
        .route("/shadow", get(shadow_page))
        .route("/shadow/{shadow}", get(shadow_report))
        .layer(axum::middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// 32 random bytes, hex: the CSRF token.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    if getrandom::fill(&mut bytes).is_err() {
        // No entropy source: a token nobody can guess cannot be made, so
        // make one nobody can match (every form post is refused).
        return String::new();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ------------------------------------------------------------------ guard

/// Paths that answer without a token: the sign-in form and the assets.
fn open_path(path: &str) -> bool {
    path == "/login" || path.starts_with("/assets/")
}

/// Requires the token (cookie or bearer) when one is configured, and turns
/// away cross-site form posts.
async fn guard(State(c): State<Console>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    if let Some(expected) = c.token.as_deref()
        && !open_path(&path)
        && !authenticated(req.headers(), expected)
    {
        if req.method() == axum::http::Method::GET {
            let next_path = req
                .uri()
                .path_and_query()
                .map_or("/runs".to_owned(), |p| p.as_str().to_owned());
            return Redirect::to(&format!("/login?next={}", urlencode(&next_path))).into_response();
        }
        return message(
            &c,
            StatusCode::UNAUTHORIZED,
            "Sign in first",
            "this console requires the token `poimen serve --token-file` reads: sign in at /login",
            Some("/login"),
        );
    }
    if req.method() == axum::http::Method::POST && cross_site(req.headers()) {
        return message(
            &c,
            StatusCode::FORBIDDEN,
            "Refused: a cross-site request",
            "this form was posted from another site; open the console itself and submit it there",
            Some("/runs"),
        );
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

fn authenticated(headers: &HeaderMap, expected: &str) -> bool {
    let eq = |given: &str| bool::from(given.as_bytes().ct_eq(expected.as_bytes()));
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer.is_some_and(eq) {
        return true;
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == TOKEN_COOKIE && eq(v))
}

/// Whether the browser says the request comes from another site: its
/// `Sec-Fetch-Site`, or an `Origin` whose host is not the `Host` asked.
fn cross_site(headers: &HeaderMap) -> bool {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return true;
    }
    match (get("origin"), get("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_none_or(|(_, rest)| rest.trim_end_matches('/') != host),
        _ => false,
    }
}

/// Whether a posted form carries this server's CSRF token.
fn csrf_ok(c: &Console, fields: &[(String, String)]) -> bool {
    !c.csrf.is_empty()
        && field(fields, "csrf").is_some_and(|t| bool::from(t.as_bytes().ct_eq(c.csrf.as_bytes())))
}

fn csrf_refused(c: &Console) -> Response {
    message(
        &c.clone(),
        StatusCode::FORBIDDEN,
        "Refused: the form's CSRF token is missing or wrong",
        "reload the page (the token changes when the server restarts) and submit the form again",
        None,
    )
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

// --------------------------------------------------------------- rendering

fn render(c: &Console, status: StatusCode, name: &str, ctx: Value) -> Response {
    let page = c
        .env
        .get_template(name)
        .and_then(|t| t.render(Ctx::from(minijinja::value::Serde(&ctx))));
    match page {
        Ok(html) => (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the console could not render {name}: {e}"),
        )
            .into_response(),
    }
}

fn message(
    c: &Console,
    status: StatusCode,
    title: &str,
    detail: &str,
    back: Option<&str>,
) -> Response {
    render(
        c,
        status,
        "message.html",
        page! { title, error => detail, back, nav => "" },
    )
}

/// A host error as a page, with the status the API would answer.
fn host_error(c: &Console, e: poimen::Error, back: Option<&str>) -> Response {
    let problem = ApiError::Host(e).problem();
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::BAD_REQUEST);
    let detail = if problem.errors.is_empty() {
        problem.detail
    } else {
        format!("{}\n{}", problem.detail, problem.errors.join("\n"))
    };
    message(c, status, &problem.title, &detail, back)
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        JS,
    )
}

/// Milliseconds since the Unix epoch as `2026-12-04 10:00:00.123`, UTC.
fn when(ms: i64) -> String {
    let t =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(t)
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_owned()
}

/// A time a filter names: milliseconds, or a UTC date and time
/// (`2026-12-04`, `2026-12-04T10:00`, `2026-12-04 10:00:00`).
fn parse_when(text: &str) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<i64>() {
        return Ok(ms);
    }
    let mut norm = t.replace(' ', "T");
    match norm.len() {
        10 => norm.push_str("T00:00:00"),
        16 => norm.push_str(":00"),
        _ => {}
    }
    humantime::parse_rfc3339_weak(&norm)
        .ok()
        .and_then(|st| st.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .ok_or_else(|| {
            format!("`{t}` is not a time: write a UTC date and time such as 2026-12-04T10:00, or milliseconds since 1970")
        })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// JSON for people, cut at [`MAX_SHOWN`].
fn pretty(v: &Value) -> String {
    pretty_within(v, MAX_SHOWN)
}

/// JSON for people, cut at `max` bytes.
fn pretty_within(v: &Value, max: usize) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("<{e}>"));
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("\n… (cut: the whole is in the API)");
    }
    s
}

fn size(v: &Value) -> String {
    let n = serde_json::to_vec(v).map_or(0, |b| b.len());
    if n < 1024 {
        format!("{n} bytes")
    } else {
        format!("{:.1} KiB", n as f64 / 1024.0)
    }
}

fn short(version: &str) -> String {
    version.chars().take(14).collect()
}

// -------------------------------------------------------------------- auth

#[derive(Deserialize)]
struct NextQuery {
    next: Option<String>,
}

async fn login_page(State(c): State<Console>, Query(q): Query<NextQuery>) -> Response {
    let next = safe_next(q.next.as_deref());
    render(&c, StatusCode::OK, "login.html", page! { next, nav => "" })
}

/// Only a path of this console: never another site.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') => n.to_owned(),
        _ => "/runs".to_owned(),
    }
}

async fn login(State(c): State<Console>, Form(fields): Form<Vec<(String, String)>>) -> Response {
    let next = safe_next(field(&fields, "next"));
    let Some(expected) = c.token.as_deref() else {
        return Redirect::to(&next).into_response();
    };
    let given = field(&fields, "token").unwrap_or_default().trim();
    if !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        return render(
            &c,
            StatusCode::UNAUTHORIZED,
            "login.html",
            page! { next, nav => "", error => "That is not the token: give the one `poimen serve --token-file` reads." },
        );
    }
    let cookie = format!("{TOKEN_COOKIE}={given}; Path=/; HttpOnly; SameSite=Strict");
    ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
}

// -------------------------------------------------------------------- runs

#[derive(Debug, Default, Deserialize, Serialize)]
struct RunsQuery {
    workflow: Option<String>,
    version: Option<String>,
    status: Option<String>,
    key: Option<String>,
    from: Option<String>,
    until: Option<String>,
    before: Option<String>,
    limit: Option<u32>,
}

impl RunsQuery {
    /// This query as a URL with `status` and `before` replaced.
    fn href(&self, status: Option<&str>, before: Option<&str>) -> String {
        let mut parts = Vec::new();
        let mut add = |k: &str, v: Option<&str>| {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                parts.push(format!("{k}={}", urlencode(v)));
            }
        };
        add("workflow", self.workflow.as_deref());
        add("version", self.version.as_deref());
        add("status", status);
        add("key", self.key.as_deref());
        add("from", self.from.as_deref());
        add("until", self.until.as_deref());
        add("before", before);
        if let Some(l) = self.limit {
            parts.push(format!("limit={l}"));
        }
        if parts.is_empty() {
            "/runs".to_owned()
        } else {
            format!("/runs?{}", parts.join("&"))
        }
    }
}

fn set(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The store filter a query asks for, or what is wrong with it.
async fn run_filter(host: &Host, q: &RunsQuery) -> Result<RunFilter, String> {
    let status = match set(&q.status) {
        None => None,
        Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
            format!(
                "`{s}` is not a run status; one of: {}",
                RunStatus::ALL.map(RunStatus::as_str).join(", ")
            )
        })?),
    };
    let version = match set(&q.version) {
        None => None,
        Some(v) => Some(
            host.resolve_version(v)
                .await
                .map_err(|e| format!("version `{v}`: {e}"))?,
        ),
    };
    let before = match set(&q.before) {
        None => None,
        Some(b) => Some(RunId::parse(b).map_err(|e| format!("`before={b}`: {e}"))?),
    };
    Ok(RunFilter {
        status,
        workflow_id: set(&q.workflow).map(WorkflowId::from),
        version,
        idempotency_key: set(&q.key).map(str::to_owned),
        created_from: set(&q.from).map(parse_when).transpose()?,
        created_until: set(&q.until).map(parse_when).transpose()?,
        before,
        limit: Some(q.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE)),
        ..RunFilter::default()
    })
}

#[derive(Serialize)]
struct RunRow {
    id: String,
    workflow: String,
    version: String,
    version_short: String,
    status: &'static str,
    reason: Option<String>,
    key: Option<String>,
    parent: Option<String>,
    created: String,
    updated: String,
}

impl RunRow {
    fn of(r: &RunRecord) -> RunRow {
        let version = r.version.to_string();
        RunRow {
            id: r.id.to_string(),
            workflow: r.workflow_id.to_string(),
            version_short: short(&version),
            version,
            status: r.status.as_str(),
            reason: r.reason.clone(),
            key: r.idempotency_key.clone(),
            parent: r.parent.as_ref().map(|(p, _)| p.to_string()),
            created: when(r.created_at),
            updated: when(r.updated_at),
        }
    }
}

async fn runs_page(State(c): State<Console>, Query(q): Query<RunsQuery>) -> Response {
    let statuses = RunStatus::ALL.map(RunStatus::as_str);
    let filter = match run_filter(&c.host, &q).await {
        Ok(f) => f,
        Err(error) => {
            return render(
                &c,
                StatusCode::BAD_REQUEST,
                "runs.html",
                page! { nav => "runs", q, statuses, error, runs => Vec::<RunRow>::new(), counts => Vec::<Value>::new(), total => 0 },
            );
        }
    };
    let limit = filter.limit.unwrap_or(PAGE) as usize;
    let (runs, counts) =
        match tokio::try_join!(c.host.list_runs(filter.clone()), c.host.count_runs(filter)) {
            Ok(both) => both,
            Err(e) => return host_error(&c, e, None),
        };
    let next = (runs.len() == limit)
        .then(|| {
            runs.last()
                .map(|r| q.href(set(&q.status), Some(r.id.as_str())))
        })
        .flatten();
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    let counts: Vec<Value> = counts
        .iter()
        .map(|(s, n)| {
            serde_json::json!({
                "status": s.as_str(), "count": n, "href": q.href(Some(s.as_str()), None),
            })
        })
        .collect();
    let rows: Vec<RunRow> = runs.iter().map(RunRow::of).collect();
    render(
        &c,
        StatusCode::OK,
        "runs.html",
        page! { nav => "runs", q, statuses, runs => rows, counts, total, next },
    )
}

#[derive(Deserialize)]
struct RunQuery {
    /// The event an action recorded: the page says so.
    done: Option<u64>,
    /// Which page of the episode (and of the tool calls) to show; the
    /// last by default, or the one holding `done`.
    page: Option<usize>,
}

/// Events (and tool calls) on one page of a run: a 1 000-step run's page
/// stays small enough for a browser, its whole in the API.
const EVENTS_PER_PAGE: usize = 500;
const CALLS_PER_PAGE: usize = 100;

/// The window of `len` items page `page` of `per` shows.
fn window(len: usize, per: usize, page: usize) -> std::ops::Range<usize> {
    let lo = (page * per).min(len);
    lo..(lo + per).min(len)
}

/// One tool call's row.
#[derive(Serialize)]
struct CallRow {
    step: String,
    iteration: u32,
    attempt: u32,
    tool: String,
    digest: String,
    effect: Value,
    outcome: String,
    reconciled: bool,
    capabilities: String,
    fuel: String,
    time: String,
    intents: String,
    args: String,
    record: String,
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(items) => items.iter().map(text_of).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

async fn run_page(
    State(c): State<Console>,
    Path(run): Path<String>,
    Query(q): Query<RunQuery>,
) -> Response {
    let id = match RunId::parse(&run) {
        Ok(id) => id,
        Err(e) => return host_error(&c, e.into(), Some("/runs")),
    };
    let ((record, state), episode, audit, open) = match tokio::try_join!(
        c.host.status(&id),
        c.host.episode(&id),
        c.host.audit(&id),
        c.host.judgments()
    ) {
        Ok(all) => all,
        Err(e) => return host_error(&c, e, Some("/runs")),
    };
    let events = &episode.events;
    let start = events.first().map_or(record.created_at, |e| e.at);
    let mut input = Value::Null;
    let mut top_steps: Vec<String> = Vec::new();
    let mut blocked: Option<Value> = None;
    let mut receipts: Vec<Value> = Vec::new();
    let mut rows: Vec<Value> = Vec::with_capacity(events.len());
    let mut notice: Option<String> = None;
    let pages = events.len().div_ceil(EVENTS_PER_PAGE).max(1);
    let page = q
        .page
        .or_else(|| {
            q.done
                .and_then(|d| events.iter().position(|e| e.seq == d))
                .map(|i| i / EVENTS_PER_PAGE)
        })
        .unwrap_or(pages - 1)
        .min(pages - 1);
    let shown = window(events.len(), EVENTS_PER_PAGE, page);
    for (i, e) in events.iter().enumerate() {
        let visible = shown.contains(&i);
        match &e.event {
            EpisodeEvent::RunStarted { input: i, .. } => input = i.clone(),
            EpisodeEvent::StepStarted {
                step, owner: None, ..
            } if !top_steps.iter().any(|s| s == step.as_str()) => {
                top_steps.push(step.to_string());
            }
            EpisodeEvent::RunBlocked {
                step,
                attempt,
                reason,
                ..
            } => {
                blocked = Some(serde_json::json!({
                    "step": step.as_str(), "attempt": attempt, "reason": reason,
                }));
            }
            EpisodeEvent::Reconciled { .. } | EpisodeEvent::RunResumed { .. } => blocked = None,
            EpisodeEvent::StepFinished {
                step,
                receipt: Some(r),
                ..
            } if visible => receipts.push(serde_json::json!({
                "step": step.as_str(),
                "receipt": pretty(&serde_json::to_value(r).unwrap_or(Value::Null)),
            })),
            _ => {}
        }
        if q.done == Some(e.seq) {
            notice = Some(format!("Recorded: event #{} {}", e.seq, e.event.kind()));
        }
        if !visible {
            continue;
        }
        let json = serde_json::to_value(&e.event).unwrap_or(Value::Null);
        let step = json.get("step").map(text_of).unwrap_or_default();
        let text = serde_json::to_string(&json).unwrap_or_default();
        let summary: String = text.chars().take(100).collect();
        // A model call's texts are blobs: linked, fetched when asked for.
        let blobs: Vec<Value> = match &e.event {
            EpisodeEvent::ModelCalled {
                prompt,
                system,
                output,
                ..
            } => [
                ("prompt", Some(prompt)),
                ("system", system.as_ref()),
                ("answer", Some(output)),
            ]
            .into_iter()
            .filter_map(|(name, hash)| hash.map(|h| serde_json::json!({"name": name, "hash": h})))
            .collect(),
            _ => Vec::new(),
        };
        rows.push(serde_json::json!({
            "blobs": blobs,
            "seq": e.seq, "at": e.at - start, "kind": e.event.kind(), "step": step,
            "summary": summary, "json": pretty_within(&json, MAX_SHOWN_EACH),
        }));
    }
    if record.status != RunStatus::Blocked {
        blocked = None;
    }
    // The tool calls of the same page: those whose events it shows (the
    // calls' own page when they outnumber what fits).
    let (first_seq, last_seq) = (
        events.get(shown.start).map_or(0, |e| e.seq),
        events.get(shown.end.saturating_sub(1)).map_or(0, |e| e.seq),
    );
    let mut on_page: Vec<_> = audit
        .tool_calls
        .iter()
        .filter(|c| c.seq >= first_seq && c.seq <= last_seq)
        .collect();
    on_page.truncate(CALLS_PER_PAGE);
    let calls: Vec<CallRow> = on_page
        .into_iter()
        .map(|call| {
            let record = serde_json::to_value(&call.record).unwrap_or(Value::Null);
            let pick = |k: &str| record.get(k).map(text_of).unwrap_or_default();
            let phases: Vec<&str> = audit
                .intents
                .iter()
                .filter(|i| {
                    i.step == call.step
                        && i.iteration == call.iteration
                        && i.attempt == call.attempt
                })
                .map(|i| i.phase.as_str())
                .collect();
            CallRow {
                step: call.step.to_string(),
                iteration: call.iteration,
                attempt: call.attempt,
                tool: format!("{}@{}", call.tool.name, call.tool.version),
                digest: short(&call.tool.digest),
                effect: serde_json::to_value(call.effect).unwrap_or(Value::Null),
                outcome: text_of(
                    &serde_json::to_value(&call.outcome)
                        .ok()
                        .and_then(|o| o.get("status").cloned().or(Some(o)))
                        .unwrap_or(Value::Null),
                ),
                reconciled: call.reconciled,
                capabilities: text_of(
                    &serde_json::to_value(&call.capabilities).unwrap_or(Value::Null),
                ),
                fuel: pick("fuel_consumed"),
                time: {
                    let t = pick("wall_time_us");
                    if t.is_empty() { t } else { format!("{t} µs") }
                },
                intents: phases.join(" → "),
                args: pretty_within(&call.args, MAX_SHOWN_EACH),
                record: pretty_within(&record, MAX_SHOWN_EACH),
            }
        })
        .collect();
    let judgments: Vec<String> = open
        .iter()
        .filter(|j| j.run == id)
        .map(|j| j.id.to_string())
        .collect();
    let terminal = record.status.is_terminal();
    let timeline = timeline::of(events, now_ms());
    let output = state.output.as_ref();
    let run = serde_json::json!({
        "id": record.id.as_str(),
        "status": record.status.as_str(),
        "reason": record.reason,
        "workflow": record.workflow_id.as_str(),
        "version": record.version.to_string(),
        "key": record.idempotency_key,
        "parent": record.parent.as_ref().map(|(p, _)| p.as_str()),
        "parent_step": record.parent.as_ref().map(|(_, s)| s.as_str()),
        "tenant": record.tenant,
        "created": when(record.created_at),
        "updated": when(record.updated_at),
        "lease": record.lease.as_ref().map(|l| format!("{} (epoch {}, until {})", l.owner, l.epoch, when(l.expires_at))),
    });
    render(
        &c,
        StatusCode::OK,
        "run.html",
        page! {
            nav => "runs",
            notice,
            run,
            live => !terminal,
            input => pretty(&input),
            input_size => size(&input),
            output => output.map(pretty),
            output_size => output.map(size),
            timeline,
            calls,
            receipts,
            events => rows,
            blocked,
            judgments,
            top_steps,
            csrf => c.csrf.as_str(),
            page,
            pages,
            events_total => events.len(),
            can_cancel => !terminal,
            can_retry => record.status == RunStatus::Failed,
            can_resume => matches!(record.status, RunStatus::Queued | RunStatus::Running),
        },
    )
}

/// The run a posted action names, once its form passed the CSRF check.
fn acting_on(c: &Console, run: &str, fields: &[(String, String)]) -> Result<RunId, Response> {
    if !csrf_ok(c, fields) {
        return Err(csrf_refused(c));
    }
    RunId::parse(run).map_err(|e| host_error(c, e.into(), Some("/runs")))
}

/// Does an action on run `id` and lands on the run's page at the first
/// event it recorded, or says why it was refused.
async fn act<T>(
    c: &Console,
    id: &RunId,
    action: impl std::future::Future<Output = Result<T, poimen::Error>>,
) -> Response {
    // `action` is lazy: nothing happens before it is awaited, below.
    let before = last_seq(c, id).await;
    match action.await {
        Ok(_) => done(c, id, before).await,
        Err(e) => host_error(c, e, Some(&format!("/runs/{id}"))),
    }
}

/// The sequence number of a run's last event, before an action.
async fn last_seq(c: &Console, id: &RunId) -> Option<u64> {
    c.host
        .episode(id)
        .await
        .ok()
        .and_then(|e| e.events.last().map(|e| e.seq))
}

/// The run's page, pointing at the first event the action recorded (the
/// first after `before`).
async fn done(c: &Console, id: &RunId, before: Option<u64>) -> Response {
    let first = c.host.episode(id).await.ok().and_then(|e| {
        e.events
            .iter()
            .find(|e| before.is_none_or(|b| e.seq > b))
            .map(|e| e.seq)
    });
    let href = match first {
        Some(seq) => format!("/runs/{id}?done={seq}#event-{seq}"),
        None => format!("/runs/{id}"),
    };
    Redirect::to(&href).into_response()
}

/// The confirmation page for an action that cannot be undone: the same
/// form again, with `confirmed=yes`.
fn confirm(
    c: &Console,
    action: &str,
    fields: &[(String, String)],
    title: &str,
    question: &str,
    back: &str,
) -> Response {
    let fields: Vec<(String, String)> = fields
        .iter()
        .filter(|(k, _)| k != "confirmed")
        .cloned()
        .collect();
    render(
        c,
        StatusCode::OK,
        "confirm.html",
        page! { nav => "runs", action, fields, title, question, back, button => title },
    )
}

fn confirmed(fields: &[(String, String)]) -> bool {
    field(fields, "confirmed") == Some("yes")
}

async fn cancel(
    State(c): State<Console>,
    Path(run): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let id = match acting_on(&c, &run, &fields) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let back = format!("/runs/{id}");
    if !confirmed(&fields) {
        return confirm(
            &c,
            &format!("/runs/{id}/cancel"),
            &fields,
            "Cancel run",
            &format!("Cancel run {id}? Its steps in flight are stopped and it ends `cancelled`."),
            &back,
        );
    }
    act(&c, &id, c.host.cancel(&id)).await
}

async fn retry(
    State(c): State<Console>,
    Path(run): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let id = match acting_on(&c, &run, &fields) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let from = field(&fields, "from")
        .filter(|s| !s.is_empty())
        .map(StepId::from);
    if !confirmed(&fields) {
        let which = from
            .as_ref()
            .map_or("the step that failed".to_owned(), |f| format!("step `{f}`"));
        return confirm(
            &c,
            &format!("/runs/{id}/retry"),
            &fields,
            "Retry",
            &format!("Run {id} again from {which}? Its tool calls from there are made again."),
            &format!("/runs/{id}"),
        );
    }
    act(&c, &id, c.host.retry(&id, from.as_ref())).await
}

async fn resume(
    State(c): State<Console>,
    Path(run): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let id = match acting_on(&c, &run, &fields) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    act(&c, &id, c.host.resume(&id)).await
}

async fn reconcile(
    State(c): State<Console>,
    Path(run): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let id = match acting_on(&c, &run, &fields) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let back = format!("/runs/{id}");
    let bad = |detail: String| {
        message(
            &c,
            StatusCode::BAD_REQUEST,
            "Cannot reconcile",
            &detail,
            Some(&back),
        )
    };
    let Some(step) = field(&fields, "step").filter(|s| !s.is_empty()) else {
        return bad("the form names no step: open the run's page and use its form".into());
    };
    let decision = match field(&fields, "decision") {
        Some("committed") => {
            let text = field(&fields, "output").unwrap_or_default();
            match serde_json::from_str::<Value>(text) {
                Ok(output) => Reconciliation::Committed { output },
                Err(e) => {
                    return bad(format!(
                        "the output is not JSON ({e}): write the effect's output as a JSON value, such as {{}}"
                    ));
                }
            }
        }
        Some("failed") => {
            let reason = field(&fields, "reason").unwrap_or_default().trim();
            if reason.is_empty() {
                return bad("say why the effect failed: a failed call needs a reason".into());
            }
            Reconciliation::Failed {
                reason: reason.to_owned(),
            }
        }
        _ => {
            return bad(
                "choose what happened: committed (with the effect's output) or failed (with why)"
                    .into(),
            );
        }
    };
    if !confirmed(&fields) {
        let what = match &decision {
            Reconciliation::Committed { .. } => "committed with the output given",
            Reconciliation::Failed { .. } => "failed for the reason given",
        };
        return confirm(
            &c,
            &format!("/runs/{id}/reconcile"),
            &fields,
            "Reconcile",
            &format!(
                "Record step `{step}` of run {id} as {what}? The run goes on from that answer."
            ),
            &back,
        );
    }
    act(
        &c,
        &id,
        c.host.reconcile(&id, &StepId::from(step), decision),
    )
    .await
}

// --------------------------------------------------------------- judgments

async fn judgments_page(State(c): State<Console>) -> Response {
    let open = match c.host.judgments().await {
        Ok(j) => j,
        Err(e) => return host_error(&c, e, None),
    };
    let rows: Vec<Value> = open
        .iter()
        .map(|j| {
            serde_json::json!({
                "id": j.id.as_str(), "run": j.run.as_str(), "step": j.step.as_str(),
                "created": when(j.created_at),
            })
        })
        .collect();
    render(
        &c,
        StatusCode::OK,
        "judgments.html",
        page! { nav => "judgments", judgments => rows },
    )
}

/// The judgment page, with the form when the request is open; `posted`
/// refills it after a refused answer.
fn judgment_view(
    c: &Console,
    status: StatusCode,
    j: &poimen::JudgmentRecord,
    fields: Vec<form::Field>,
    posted: &[(String, String)],
    error: Option<String>,
) -> Response {
    let text = |k: &str| -> String {
        field(posted, k).map_or_else(
            || match k {
                "executor" | "profile" => j.request.get(k).map(text_of).unwrap_or_default(),
                "judge" => "console".to_owned(),
                _ => String::new(),
            },
            str::to_owned,
        )
    };
    let view = serde_json::json!({
        "id": j.id.as_str(),
        "run": j.run.as_str(),
        "step": j.step.as_str(),
        "iteration": j.iteration,
        "status": serde_json::to_value(j.status).unwrap_or(Value::Null),
        "request": pretty(&j.request),
        "request_hash": j.request_hash,
        "result": j.result.as_ref().map(pretty),
    });
    render(
        c,
        status,
        "judgment.html",
        page! {
            nav => "judgments",
            j => view,
            open => j.status == JudgmentStatus::Open,
            fields,
            csrf => c.csrf.as_str(),
            result_json => text("result_json"),
            judge => text("judge"),
            executor => text("executor"),
            profile => text("profile"),
            error,
        },
    )
}

async fn judgment_page(State(c): State<Console>, Path(judgment): Path<String>) -> Response {
    let record = match JudgmentId::parse(&judgment) {
        Ok(id) => c.host.judgment(&id).await,
        Err(e) => Err(e.into()),
    };
    match record {
        Ok(j) => {
            let fields = form::fields(j.request.get("result_schema").unwrap_or(&Value::Null));
            judgment_view(&c, StatusCode::OK, &j, fields, &[], None)
        }
        Err(e) => host_error(&c, e, Some("/judgments")),
    }
}

async fn answer(
    State(c): State<Console>,
    Path(judgment): Path<String>,
    Form(posted): Form<Vec<(String, String)>>,
) -> Response {
    if !csrf_ok(&c, &posted) {
        return csrf_refused(&c);
    }
    let id = match JudgmentId::parse(&judgment) {
        Ok(id) => id,
        Err(e) => return host_error(&c, e.into(), Some("/judgments")),
    };
    let j = match c.host.judgment(&id).await {
        Ok(j) => j,
        Err(e) => return host_error(&c, e, Some("/judgments")),
    };
    let mut fields = form::fields(j.request.get("result_schema").unwrap_or(&Value::Null));
    let refused = |fields, error: String| {
        judgment_view(
            &c,
            StatusCode::UNPROCESSABLE_ENTITY,
            &j,
            fields,
            &posted,
            Some(error),
        )
    };
    // An answer cannot be taken back: the form asks for it to be final.
    if !confirmed(&posted) {
        // Refills the fields with what was posted (its errors wait).
        let _ = form::result(
            &mut fields,
            &posted,
            field(&posted, "result_json").unwrap_or_default(),
        );
        return refused(
            fields,
            "tick “This answer is final” to submit it: an answer cannot be taken back".to_owned(),
        );
    }
    let result = match form::result(
        &mut fields,
        &posted,
        field(&posted, "result_json").unwrap_or_default(),
    ) {
        Ok(r) => r,
        Err(e) => return refused(fields, e),
    };
    let opt = |k: &str| {
        field(&posted, k)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let submission = JudgmentSubmission {
        request_hash: field(&posted, "request_hash")
            .unwrap_or_default()
            .to_owned(),
        result,
        executor: opt("executor"),
        profile: opt("profile"),
        provenance: serde_json::json!({
            "judge": opt("judge").unwrap_or_default(),
            "via": "console",
        }),
    };
    let before = last_seq(&c, &j.run).await;
    match c.host.submit_judgment(&id, submission).await {
        Ok(_) => done(&c, &j.run, before).await,
        Err(e) => {
            let problem = ApiError::Host(e).problem();
            let mut text = problem.detail;
            for line in problem.errors {
                text.push('\n');
                text.push_str(&line);
            }
            refused(fields, text)
        }
    }
}

// ---------------------------------------------------------------- versions

async fn workflows_page(State(c): State<Console>) -> Response {
    let list = match c.host.workflows().await {
        Ok(l) => l,
        Err(e) => return host_error(&c, e, None),
    };
    let rows: Vec<Value> = list
        .iter()
        .map(|w| {
            let latest = w.latest.to_string();
            serde_json::json!({
                "id": w.workflow_id.as_str(), "versions": w.versions,
                "latest_short": short(&latest), "latest": latest,
            })
        })
        .collect();
    render(
        &c,
        StatusCode::OK,
        "workflows.html",
        page! { nav => "workflows", workflows => rows },
    )
}

async fn workflow_page(State(c): State<Console>, Path(workflow): Path<String>) -> Response {
    let versions = match c.host.versions(&WorkflowId::from(workflow.as_str())).await {
        Ok(v) => v,
        Err(e) => return host_error(&c, e, Some("/workflows")),
    };
    // Depth in the DAG: a version's parent is published before it.
    let mut depth: BTreeMap<String, usize> = BTreeMap::new();
    let shadowed: Vec<(String, String)> = c.shadow.compared().into_iter().collect();
    let rows: Vec<Value> = versions
        .iter()
        .map(|v| {
            let version = v.version.to_string();
            let parent = v.parent.map(|p| p.to_string());
            let d = parent
                .as_ref()
                .and_then(|p| depth.get(p))
                .map_or(0, |d| d + 1);
            depth.insert(version.clone(), d);
            let shadow = parent
                .as_ref()
                .is_some_and(|p| shadowed.iter().any(|(b, cand)| b == p && cand == &version));
            serde_json::json!({
                "version": version, "short": short(&version), "depth": d,
                "parent_short": parent.as_deref().map(short), "parent": parent,
                "created": when(v.created_at), "shadow": shadow,
            })
        })
        .collect();
    render(
        &c,
        StatusCode::OK,
        "workflow.html",
        page! { nav => "workflows", workflow, versions => rows },
    )
}

async fn version_page(State(c): State<Console>, Path(version): Path<String>) -> Response {
    let (record, def) = match c.host.find_version(&version).await {
        Ok(v) => v,
        Err(e) => return host_error(&c, e, Some("/workflows")),
    };
    let v = record.version.to_string();
    let (plan, plan_error) = match c.host.plan(&Target::parse(&v)).await {
        Ok(p) => {
            let mut depth: BTreeMap<String, usize> = BTreeMap::new();
            let steps: Vec<Value> = p
                .steps
                .iter()
                .map(|s| {
                    let d = s
                        .owner
                        .as_ref()
                        .and_then(|o| depth.get(o.as_str()))
                        .map_or(0, |d| d + 1);
                    depth.insert(s.id.to_string(), d);
                    let detail = if let Some(t) = &s.tool {
                        format!("{}@{} {}", t.name, t.version, short(&t.digest))
                    } else if let Some(sub) = &s.sub_workflow {
                        format!("sub-workflow {sub}")
                    } else if !s.runs.is_empty() {
                        format!(
                            "runs {}",
                            s.runs.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
                        )
                    } else {
                        String::new()
                    };
                    serde_json::json!({ "id": s.id.as_str(), "kind": s.kind, "depth": d, "detail": detail })
                })
                .collect();
            let loops: Vec<String> = p
                .loops
                .iter()
                .map(|(from, to, max)| format!("{from} → {to}, at most {max} times"))
                .collect();
            let ineligible: Vec<String> = p
                .eligibility
                .ineligible
                .iter()
                .map(|i| {
                    serde_json::to_value(i)
                        .map(|v| text_of(&v))
                        .unwrap_or_default()
                })
                .collect();
            (
                Some(serde_json::json!({
                    "steps": steps, "loops": loops,
                    "eligible": p.eligibility.is_eligible(), "ineligible": ineligible,
                    "long_lived": p.long_lived,
                })),
                None,
            )
        }
        Err(e) => (None, Some(e.to_string())),
    };
    let definition = pretty(&serde_json::to_value(&def).unwrap_or(Value::Null));
    render(
        &c,
        StatusCode::OK,
        "version.html",
        page! {
            nav => "workflows",
            version => v,
            workflow => record.workflow_id.as_str(),
            parent => record.parent.map(|p| p.to_string()),
            created => when(record.created_at),
            description => def.description,
            plan,
            plan_error,
            definition,
        },
    )
}

#[derive(Deserialize)]
struct DiffQuery {
    from: Option<String>,
    to: Option<String>,
}

async fn diff_page(State(c): State<Console>, Query(q): Query<DiffQuery>) -> Response {
    let (Some(from), Some(to)) = (set(&q.from), set(&q.to)) else {
        return message(
            &c,
            StatusCode::BAD_REQUEST,
            "Which versions?",
            "give `from` and `to`: two versions (or prefixes) of one workflow, as the workflow's page offers",
            Some("/workflows"),
        );
    };
    let (old, new) = match tokio::try_join!(c.host.find_version(from), c.host.find_version(to)) {
        Ok(both) => both,
        Err(e) => return host_error(&c, e, Some("/workflows")),
    };
    let changes: Vec<String> = poimen::diff::diff(&old.1, &new.1)
        .iter()
        .map(ToString::to_string)
        .collect();
    render(
        &c,
        StatusCode::OK,
        "diff.html",
        page! {
            nav => "workflows",
            from => old.0.version.to_string(),
            to => new.0.version.to_string(),
            changes,
        },
    )
}

/// A stored blob, fetched on demand: text as `text/plain` (never rendered
/// as markup: the guard's `nosniff` holds browsers to the type), anything
/// else as a download.
async fn blob(State(c): State<Console>, Path(hash): Path<String>) -> Response {
    match c.host.blob(&hash).await {
        Ok(Some(bytes)) => match String::from_utf8(bytes) {
            Ok(text) => {
                ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
            }
            Err(e) => (
                [
                    (header::CONTENT_TYPE, "application/octet-stream"),
                    (header::CONTENT_DISPOSITION, "attachment"),
                ],
                e.into_bytes(),
            )
                .into_response(),
        },
        Ok(None) => message(
            &c,
            StatusCode::NOT_FOUND,
            "No such blob",
            &format!(
                "the store holds no blob {hash} (a finished run's blobs go with it when `poimen gc` removes it)"
            ),
            Some("/runs"),
        ),
        Err(e) => host_error(&c, e, Some("/runs")),
    }
}

// ----------------------------------------------------------------- plugins

async fn plugins_page(State(c): State<Console>) -> Response {
    let h = &c.host;
    let mut rows: Vec<Value> = Vec::new();
    let imports_of = |imports: &Value| -> String {
        imports
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i.get("name").map_or_else(|| text_of(i), text_of))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    for e in h.tools().into_iter().chain(h.verifiers()) {
        let imports = serde_json::to_value(&e.imports).unwrap_or(Value::Null);
        rows.push(serde_json::json!({
            "name": e.info.name, "version": e.info.version.to_string(),
            "kind": serde_json::to_value(e.kind).map(|k| text_of(&k)).unwrap_or_default(),
            "status": "ready",
            "capabilities": text_of(&serde_json::to_value(&e.info.capabilities).unwrap_or(Value::Null)),
            "imports": imports_of(&imports),
            "digest": e.info.digest, "origin": e.origin,
        }));
    }
    for w in h.withheld_plugins() {
        rows.push(serde_json::json!({
            "name": w.info.name, "version": w.info.version.to_string(),
            "kind": serde_json::to_value(w.kind).map(|k| text_of(&k)).unwrap_or_default(),
            "status": "withheld", "reason": w.reason,
            "capabilities": text_of(&serde_json::to_value(&w.info.capabilities).unwrap_or(Value::Null)),
            "digest": w.info.digest, "origin": w.origin,
        }));
    }
    for r in h.refused_plugins() {
        rows.push(serde_json::json!({
            "name": "", "status": "refused", "reason": r.reason, "origin": r.origin,
        }));
    }
    render(
        &c,
        StatusCode::OK,
        "plugins.html",
        page! { nav => "plugins", plugins => rows },
    )
}

// ------------------------------------------------------------------ shadow

#[derive(Deserialize)]
struct ShadowQuery {
    baseline: Option<String>,
    candidate: Option<String>,
}

async fn shadow_page(State(c): State<Console>, Query(q): Query<ShadowQuery>) -> Response {
    let rows: Vec<Value> = c
        .shadow
        .summaries()
        .into_iter()
        .filter(|(_, b, cand, _)| {
            set(&q.baseline).is_none_or(|x| b.starts_with(x))
                && set(&q.candidate).is_none_or(|x| cand.starts_with(x))
        })
        .map(|(id, baseline, candidate, status)| {
            serde_json::json!({ "id": id, "baseline": baseline, "candidate": candidate, "status": status })
        })
        .collect();
    render(
        &c,
        StatusCode::OK,
        "shadow.html",
        page! { nav => "shadow", shadows => rows },
    )
}

async fn shadow_report(State(c): State<Console>, Path(id): Path<String>) -> Response {
    match c.shadow.report_html(&id) {
        Some(Ok(html)) => {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
        }
        Some(Err(status)) => message(
            &c,
            StatusCode::CONFLICT,
            &format!("Shadow evaluation {id} has no report"),
            &status,
            Some("/shadow"),
        ),
        None => message(
            &c,
            StatusCode::NOT_FOUND,
            &format!("No shadow evaluation {id}"),
            "this server keeps the reports of the evaluations started on it since it started; start one with POST /v1/shadow",
            Some("/shadow"),
        ),
    }
}

#[cfg(test)]
mod tests;
