//! The `/v1` API over a real host (SQLite store in a temporary directory,
//! the bundled plugins, the real sandbox and executor), driven request by
//! request through the router: every route's success, and bad input of
//! each kind answered with its documented status and problem `type` and
//! nothing written. Also: the OpenAPI document cannot drift from the
//! checked-in `docs/openapi.json` (`POIMEN_BLESS=1` rewrites it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use poimen::{Host, RunFilter};
use poimen_server::{ServerConfig, router};
use serde_json::{Value, json};
use tower::ServiceExt;

// ---------------------------------------------------------------- harness

struct Api {
    app: axum::Router,
    host: Arc<Host>,
    token: Option<String>,
    _dir: tempfile::TempDir,
}

/// The compile cache every test's host shares, so each compiles the
/// bundled plugins once.
fn cache() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("poimen-http-cache");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

async fn api_with(config: ServerConfig, token: Option<&str>) -> Api {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::builder()
        .store_path(dir.path().join("poimen.db"))
        .cache_dir(cache())
        .build()
        .await
        .expect("host");
    let host = Arc::new(host);
    Api {
        app: router(host.clone(), config),
        host,
        token: token.map(str::to_owned),
        _dir: dir,
    }
}

async fn api() -> Api {
    api_with(ServerConfig::open(), None).await
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
    text: String,
}

impl Reply {
    /// Asserts a problem of this status and `type` slug.
    #[track_caller]
    fn problem(&self, status: u16, slug: &str) {
        assert_eq!(self.status.as_u16(), status, "{}", self.text);
        assert_eq!(
            self.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "{}",
            self.text
        );
        assert_eq!(
            self.body["type"],
            format!("https://poimen.dev/problems/{slug}"),
            "{}",
            self.text
        );
        assert_eq!(self.body["status"], status);
        assert!(self.body["title"].is_string());
        assert!(!self.body["detail"].as_str().unwrap_or("").is_empty());
    }

    #[track_caller]
    fn ok(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.text);
        &self.body
    }
}

impl Api {
    async fn send(&self, req: Request<Body>) -> Reply {
        let res = self.app.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            body,
            text,
        }
    }

    fn request(&self, method: Method, uri: &str) -> axum::http::request::Builder {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(t) = &self.token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        b
    }

    async fn get(&self, uri: &str) -> Reply {
        self.send(
            self.request(Method::GET, uri)
                .body(Body::empty())
                .expect("request"),
        )
        .await
    }

    async fn post(&self, uri: &str, body: Value) -> Reply {
        self.post_raw(uri, &body.to_string()).await
    }

    /// [`post`](Self::post) with a `Prefer` header (RFC 7240).
    async fn post_preferring(&self, uri: &str, prefer: &str, body: Value) -> Reply {
        self.send(
            self.request(Method::POST, uri)
                .header(header::CONTENT_TYPE, "application/json")
                .header("prefer", prefer)
                .body(Body::from(body.to_string()))
                .expect("request"),
        )
        .await
    }

    async fn post_raw(&self, uri: &str, body: &str) -> Reply {
        self.send(
            self.request(Method::POST, uri)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .expect("request"),
        )
        .await
    }

    /// Publishes a YAML definition; returns its version.
    async fn publish(&self, yaml: &str) -> String {
        let r = self
            .post("/v1/workflows", json!({"definition": yaml}))
            .await;
        assert!(r.status.is_success(), "{}", r.text);
        r.body["version"].as_str().expect("version").to_owned()
    }

    /// Polls a run until it is no longer queued or running.
    async fn settled(&self, run: &str) -> Value {
        for _ in 0..600 {
            let r = self.get(&format!("/v1/runs/{run}")).await;
            let body = r.ok(200).clone();
            if !matches!(body["status"].as_str(), Some("queued" | "running")) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("run {run} did not settle");
    }

    /// The shadow evaluation `id` once it has ended.
    async fn shadow_ended(&self, id: &str) -> Value {
        for _ in 0..1200 {
            let r = self.get(&format!("/v1/shadow/{id}")).await;
            let body = r.ok(200).clone();
            if body["status"] != "running" {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("shadow evaluation {id} did not end");
    }

    /// How many runs and workflows the store holds.
    async fn stored(&self) -> (usize, usize) {
        let runs = self
            .host
            .list_runs(RunFilter::default())
            .await
            .expect("runs")
            .len();
        let workflows = self.host.workflows().await.expect("workflows").len();
        (runs, workflows)
    }
}

const ECHO: &str = r#"id: http.echo
inputs:
  type: object
  properties:
    text: {type: string}
  required: [text]
steps:
  - id: echo
    tool: {name: "json@^0.1", args: {value: {said: "{{ inputs.text }}"}, select: ""}}
output: "{{ steps.echo.output }}"
"#;

const JUDGED: &str = r#"id: http.judged
steps:
  - id: approve
    judgment:
      question: "Go on?"
      result_schema: {type: object, properties: {go: {type: boolean}}, required: [go]}
  - id: act
    tool: {name: "json@^0.1", args: {value: {acted: true}, select: ""}}
transitions:
  - {from: approve, to: act}
output: "{{ steps.approve.output }}"
"#;

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_the_document_are_served() {
    let api = api().await;
    assert_eq!(api.get("/v1/health").await.ok(200)["status"], "ok");
    assert_eq!(api.get("/v1/ready").await.ok(200)["status"], "ok");
    let doc = api.get("/v1/openapi.json").await;
    assert_eq!(doc.ok(200)["openapi"], "3.1.0");
    api.get("/v1/nothing-here").await.problem(404, "no-route");
    api.get("/v2/runs").await.problem(404, "no-route");
}

#[test]
fn the_openapi_document_matches_the_checked_in_one() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let generated = poimen_server::openapi_json();
    if std::env::var_os("POIMEN_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write docs/openapi.json");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/openapi.json is not the document the code generates; regenerate it with `POIMEN_BLESS=1 cargo test -p poimen-server --test it_http the_openapi_document` and commit it"
    );
    // Every route the router serves is in the document.
    let doc: Value = serde_json::from_str(&generated).expect("JSON");
    for path in [
        "/v1/runs",
        "/v1/runs/{run}",
        "/v1/runs/{run}/events",
        "/v1/judgments/{judgment}/answer",
        "/v1/workflows",
        "/v1/diff",
        "/v1/plugins/inspect",
        "/v1/health",
        "/v1/ready",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_is_published_armed_run_and_inspected() {
    let api = api().await;
    // Publish, twice: the second writes nothing.
    let r = api.post("/v1/workflows", json!({"definition": ECHO})).await;
    let v1 = r.ok(201)["version"].as_str().expect("version").to_owned();
    assert_eq!(r.body["workflow"], "http.echo");
    let again = api
        .post(
            "/v1/workflows",
            json!({"definition": ECHO, "format": "yaml"}),
        )
        .await;
    assert_eq!(again.ok(200)["created"], false);
    // A second version, from JSON text.
    let mut def: Value =
        serde_json::to_value(api.host.find_version(&v1).await.expect("version").1).expect("def");
    def["description"] = json!("echoes");
    let v2 = api
        .post(
            "/v1/workflows",
            json!({"definition": def.to_string(), "format": "json"}),
        )
        .await
        .ok(201)["version"]
        .as_str()
        .expect("version")
        .to_owned();
    assert_eq!(api.get("/v1/workflows").await.ok(200)[0]["versions"], 2);
    let versions = api.get("/v1/workflows/http.echo/versions").await;
    assert_eq!(versions.ok(200)[1]["parent"], v1.as_str());
    let shown = api.get(&format!("/v1/versions/{v1}")).await;
    assert_eq!(shown.ok(200)["definition"]["id"], "http.echo");
    let diff = api.get(&format!("/v1/diff?from={v1}&to={v2}")).await;
    assert_eq!(
        diff.ok(200)[0],
        json!({"change": "field_changed", "field": "description (added)"})
    );

    // Arm v1 and start by id.
    let armed = api
        .post("/v1/workflows/http.echo/arm", json!({"version": v1}))
        .await;
    assert_eq!(armed.ok(200)["version"], v1.as_str());
    let started = api
        .post(
            "/v1/runs",
            json!({"workflow": "http.echo", "input": {"text": "hi"}, "tenant": "acme", "idempotency_key": "k-1"}),
        )
        .await;
    let run = started.ok(201)["id"].as_str().expect("id").to_owned();
    assert_eq!(
        started.headers[header::LOCATION]
            .to_str()
            .expect("location"),
        format!("/v1/runs/{run}")
    );
    let done = api.settled(&run).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"], json!({"said": "hi"}));
    assert_eq!(done["tenant"], "acme");
    // The same key and input: the same run; another input: a conflict.
    let same = api
        .post(
            "/v1/runs",
            json!({"workflow": "http.echo", "input": {"text": "hi"}, "tenant": "acme", "idempotency_key": "k-1"}),
        )
        .await;
    assert_eq!(same.ok(201)["id"], run.as_str());
    let before = api.stored().await;
    api.post(
        "/v1/runs",
        json!({"workflow": "http.echo", "input": {"text": "other"}, "idempotency_key": "k-1"}),
    )
    .await
    .problem(409, "idempotency-conflict");
    assert_eq!(api.stored().await, before);

    // Pinned by `ID@VERSION`; a version of another workflow is refused.
    let pinned = api
        .post(
            "/v1/runs",
            json!({"workflow": format!("http.echo@{v1}"), "input": {"text": "pinned"}}),
        )
        .await;
    let pinned_run = pinned.ok(201)["id"].as_str().expect("id").to_owned();
    assert_eq!(pinned.body["version"], v1.as_str());
    assert_eq!(api.settled(&pinned_run).await["status"], "completed");
    let before = api.stored().await;
    api.post(
        "/v1/runs",
        json!({"workflow": format!("other.flow@{v1}"), "input": {"text": "x"}}),
    )
    .await
    .problem(400, "bad-target");
    assert_eq!(api.stored().await, before);

    // Listing, with each filter.
    assert_eq!(
        api.get("/v1/runs").await.ok(200)[0]["id"],
        pinned_run.as_str()
    );
    let listed = api
        .get("/v1/runs?status=completed&workflow=http.echo&tenant=acme&limit=5")
        .await;
    assert_eq!(listed.ok(200).as_array().expect("array").len(), 1);
    assert_eq!(listed.body[0]["id"], run.as_str());
    let one = api.get("/v1/runs?workflow=http.echo&limit=1").await;
    assert_eq!(one.ok(200).as_array().expect("array").len(), 1);
    let none = api.get("/v1/runs?tenant=nobody").await;
    assert_eq!(none.ok(200), &json!([]));
    api.get("/v1/runs?status=sleeping")
        .await
        .problem(400, "invalid-query");
    api.get("/v1/runs?limit=many")
        .await
        .problem(400, "invalid-query");

    // Episode, audit, events.
    let episode = api.get(&format!("/v1/runs/{run}/episode")).await;
    let events = episode.ok(200)["events"].as_array().expect("events").len();
    assert!(events >= 3, "{}", episode.text);
    let audit = api.get(&format!("/v1/runs/{run}/audit")).await;
    assert_eq!(audit.ok(200)["tool_calls"][0]["step"], "echo");
    let sse = api.get(&format!("/v1/runs/{run}/events")).await;
    assert_eq!(sse.status, StatusCode::OK);
    assert!(
        sse.headers[header::CONTENT_TYPE]
            .to_str()
            .expect("type")
            .starts_with("text/event-stream")
    );
    assert!(sse.text.contains("event: run_started"), "{}", sse.text);
    assert!(sse.text.contains("event: run_completed"), "{}", sse.text);
    assert!(sse.text.contains("id: 0\n"), "{}", sse.text);
    // Resumed after a sequence number, by header and by query.
    let resumed = api
        .send(
            api.request(Method::GET, &format!("/v1/runs/{run}/events"))
                .header("last-event-id", "1")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert!(!resumed.text.contains("id: 1\n"), "{}", resumed.text);
    assert!(resumed.text.contains("id: 2\n"), "{}", resumed.text);
    let after = api.get(&format!("/v1/runs/{run}/events?after=1")).await;
    assert_eq!(after.text, resumed.text);
    // Past the last event of an ended run: an empty stream that ends.
    let past = tokio::time::timeout(
        Duration::from_secs(10),
        api.get(&format!("/v1/runs/{run}/events?after={}", u64::MAX)),
    )
    .await
    .expect("a stream past an ended run's last event ends");
    assert_eq!(past.ok(200), &Value::Null);
    assert_eq!(past.text, "");
    api.send(
        api.request(Method::GET, &format!("/v1/runs/{run}/events"))
            .header("last-event-id", "soon")
            .body(Body::empty())
            .expect("request"),
    )
    .await
    .problem(400, "invalid-query");

    // Operator verbs on a run in the wrong state.
    api.post(&format!("/v1/runs/{run}/cancel"), json!({}))
        .await
        .problem(409, "wrong-status");
    api.post(&format!("/v1/runs/{run}/retry"), json!({}))
        .await
        .problem(409, "wrong-status");
    // The body is optional.
    api.send(
        api.request(Method::POST, &format!("/v1/runs/{run}/retry"))
            .body(Body::empty())
            .expect("request"),
    )
    .await
    .problem(409, "wrong-status");
    api.post(
        &format!("/v1/runs/{run}/reconcile"),
        json!({"step": "echo", "decision": "failed", "reason": "no"}),
    )
    .await
    .problem(409, "wrong-status");
    let resumed = api.post(&format!("/v1/runs/{run}/resume"), json!({})).await;
    assert_eq!(resumed.ok(200)["status"], "completed");

    // Disarmed: nothing starts.
    let disarmed = api.post("/v1/workflows/http.echo/disarm", json!({})).await;
    assert_eq!(disarmed.ok(200)["version"], Value::Null);
    let before = api.stored().await;
    api.post(
        "/v1/runs",
        json!({"workflow": "http.echo", "input": {"text": "hi"}}),
    )
    .await
    .problem(409, "disarmed");
    assert_eq!(api.stored().await, before);

    // The metrics count the two runs made, at both paths.
    for path in ["/v1/metrics", "/metrics"] {
        let m = api.get(path).await;
        assert_eq!(m.status, StatusCode::OK, "{}", m.text);
        assert!(
            m.headers[header::CONTENT_TYPE]
                .to_str()
                .expect("type")
                .starts_with("application/openmetrics-text")
        );
        assert!(
            m.text
                .lines()
                .any(|l| l == r#"poimen_runs_ended_total{status="completed"} 2"#),
            "{}",
            m.text
        );
        assert!(
            m.text
                .contains("poimen_store_commit_duration_seconds_count")
        );
        assert!(m.text.trim_end().ends_with("# EOF"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_starts_a_run_and_answers_with_its_outcome() {
    // Issue 44: `?wait=N` or `Prefer: wait=N` answers with the run's
    // outcome when it stops within the wait.
    let api = api().await;
    let version = api.publish(ECHO).await;
    let done = api
        .post(
            "/v1/runs?wait=30",
            json!({"workflow": version, "input": {"text": "hi"}}),
        )
        .await;
    assert_eq!(done.ok(201)["status"], "completed", "{}", done.text);
    assert_eq!(done.body["output"], json!({"said": "hi"}));
    assert_eq!(done.headers["preference-applied"], "wait=30");
    let run = done.body["id"].as_str().expect("id");
    assert_eq!(
        done.headers[header::LOCATION].to_str().expect("location"),
        format!("/v1/runs/{run}")
    );
    // What it answered is what the store holds.
    assert_eq!(
        api.get(&format!("/v1/runs/{run}")).await.ok(200)["output"],
        json!({"said": "hi"})
    );

    // RFC 7240: other preferences are ignored; the smaller wait wins.
    let preferred = api
        .post_preferring(
            "/v1/runs?wait=20",
            "respond-async, wait=10",
            json!({"workflow": version, "input": {"text": "yo"}}),
        )
        .await;
    assert_eq!(
        preferred.ok(201)["output"],
        json!({"said": "yo"}),
        "{}",
        preferred.text
    );
    assert_eq!(preferred.headers["preference-applied"], "wait=10");

    // A run that stops to wait for a judge is an outcome too.
    let judged = api.publish(JUDGED).await;
    let waiting = api
        .post("/v1/runs?wait=30", json!({"workflow": judged}))
        .await;
    assert_eq!(
        waiting.ok(201)["status"],
        "waiting_judgment",
        "{}",
        waiting.text
    );

    // No wait at all: the run goes on, answered `202` with its state, or
    // it already stopped.
    let quick = api
        .post(
            "/v1/runs?wait=0",
            json!({"workflow": version, "input": {"text": "now"}}),
        )
        .await;
    let id = quick.body["id"].as_str().expect("id").to_owned();
    match quick.status.as_u16() {
        202 => assert!(
            matches!(quick.body["status"].as_str(), Some("running" | "queued")),
            "{}",
            quick.text
        ),
        201 => assert_eq!(quick.body["status"], "completed", "{}", quick.text),
        other => panic!("{other}: {}", quick.text),
    }
    assert_eq!(api.settled(&id).await["output"], json!({"said": "now"}));

    // A wait out of bounds, or not a number: refused, nothing written.
    let before = api.stored().await;
    api.post(
        "/v1/runs?wait=301",
        json!({"workflow": version, "input": {"text": "x"}}),
    )
    .await
    .problem(400, "invalid-query");
    let bad = api
        .post_preferring(
            "/v1/runs",
            "wait=soon",
            json!({"workflow": version, "input": {"text": "x"}}),
        )
        .await;
    bad.problem(400, "invalid-query");
    assert!(bad.text.contains("wait=soon"), "{}", bad.text);
    assert_eq!(api.stored().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_cancelled_while_it_waits_for_a_judge() {
    let api = api().await;
    let version = api.publish(JUDGED).await;
    let run = api
        .post("/v1/runs", json!({"workflow": version}))
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&run).await["status"], "waiting_judgment");
    let cancelled = api.post(&format!("/v1/runs/{run}/cancel"), json!({})).await;
    assert_eq!(cancelled.ok(200)["status"], "cancelled");
    // Its event stream ends with the cancellation.
    let sse = api.get(&format!("/v1/runs/{run}/events")).await;
    assert!(sse.text.contains("event: run_cancelled"), "{}", sse.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_answers_over_http_and_a_bad_answer_is_refused() {
    let api = api().await;
    let version = api.publish(JUDGED).await;
    let run = api
        .post("/v1/runs", json!({"workflow": version}))
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&run).await["status"], "waiting_judgment");
    let open = api.get("/v1/judgments").await;
    let j = open.ok(200)[0].clone();
    assert_eq!(j["run"], run.as_str());
    let id = j["id"].as_str().expect("id").to_owned();
    let shown = api.get(&format!("/v1/judgments/{id}")).await;
    assert_eq!(shown.ok(200)["status"], "open");
    let hash = j["request_hash"].clone();

    // An answer that violates the result schema: refused, nothing written.
    let events = api.host.episode(&run.parse_run()).await.expect("episode");
    api.post(
        &format!("/v1/judgments/{id}/answer"),
        json!({"request_hash": hash, "result": {"go": "yes"}, "provenance": {"judge": "test"}}),
    )
    .await
    .problem(400, "judgment-result-invalid");
    assert_eq!(
        api.host.episode(&run.parse_run()).await.expect("episode"),
        events
    );
    assert_eq!(
        api.get(&format!("/v1/judgments/{id}")).await.body["status"],
        "open"
    );
    // A stale request hash, and a body with a field the route does not take.
    api.post(
        &format!("/v1/judgments/{id}/answer"),
        json!({"request_hash": "b3:00", "result": {"go": true}, "provenance": {"judge": "test"}}),
    )
    .await
    .problem(409, "request-hash-mismatch");
    api.post(
        &format!("/v1/judgments/{id}/answer"),
        json!({"request_hash": hash, "result": {"go": true}, "provenance": {"judge": "test"}, "extra": 1}),
    )
    .await
    .problem(400, "invalid-body");

    // Followed live: the stream is open before the answer, and ends with
    // the run.
    let live = api
        .app
        .clone()
        .oneshot(
            api.request(Method::GET, &format!("/v1/runs/{run}/events?after=0"))
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(live.status(), StatusCode::OK);
    let follower = tokio::spawn(async move {
        let bytes = live.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let answered = api
        .post(
            &format!("/v1/judgments/{id}/answer"),
            json!({"request_hash": hash, "result": {"go": true}, "provenance": {"judge": "test"}}),
        )
        .await;
    assert_eq!(answered.ok(200)["status"], "completed");
    assert_eq!(answered.body["output"], json!({"go": true}));
    let followed = tokio::time::timeout(Duration::from_secs(60), follower)
        .await
        .expect("the stream ends with the run")
        .expect("follower");
    assert!(!followed.contains("id: 0\n"), "{followed}");
    assert!(followed.contains("event: judgment_received"), "{followed}");
    assert!(followed.ends_with_event("run_completed"), "{followed}");
    api.post(
        &format!("/v1/judgments/{id}/answer"),
        json!({"request_hash": hash, "result": {"go": true}, "provenance": {"judge": "test"}}),
    )
    .await
    .problem(409, "judgment-closed");
    api.get("/v1/judgments/WFJ-01JAAAAAAAAAAAAAAAAAAAAAAA")
        .await
        .problem(404, "unknown-judgment");
}

trait LastEvent {
    fn ends_with_event(&self, kind: &str) -> bool;
}

impl LastEvent for String {
    /// Whether the last server-sent event is of this kind.
    fn ends_with_event(&self, kind: &str) -> bool {
        self.split("\n\n")
            .filter(|e| e.contains("event: "))
            .last()
            .is_some_and(|e| e.contains(&format!("event: {kind}\n")))
    }
}

trait ParseRun {
    fn parse_run(&self) -> poimen::RunId;
}

impl ParseRun for String {
    fn parse_run(&self) -> poimen::RunId {
        poimen::RunId::parse(self).expect("run id")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_of_each_kind_is_a_problem_and_writes_nothing() {
    let api = api().await;
    let version = api.publish(ECHO).await;
    let before = api.stored().await;

    // Malformed JSON, an unknown field, a missing one, no JSON at all.
    api.post_raw("/v1/runs", "{\"workflow\": ")
        .await
        .problem(400, "malformed-json");
    api.post("/v1/runs", json!({"workflow": version, "inptu": {}}))
        .await
        .problem(400, "invalid-body");
    api.post("/v1/runs", json!({"input": {}}))
        .await
        .problem(400, "invalid-body");
    api.send(
        api.request(Method::POST, "/v1/runs")
            .body(Body::from("workflow=x"))
            .expect("request"),
    )
    .await
    .problem(415, "unsupported-media-type");
    let huge = json!({"workflow": version, "input": {"text": "x".repeat(3 << 20)}});
    api.post("/v1/runs", huge)
        .await
        .problem(413, "payload-too-large");
    // A file path as target, whether or not it exists.
    for target in ["flow.yaml", "/etc/passwd", "./fixtures/x"] {
        api.post("/v1/runs", json!({"workflow": target, "input": {}}))
            .await
            .problem(400, "file-target");
    }
    // Input violating the workflow's schema.
    let r = api
        .post(
            "/v1/runs",
            json!({"workflow": version, "input": {"text": 7}}),
        )
        .await;
    r.problem(400, "input-invalid");
    assert!(
        r.body["detail"]
            .as_str()
            .expect("detail")
            .contains("inputs")
    );
    // Unknown and malformed ids and versions.
    let unknown = "WFR-01JAAAAAAAAAAAAAAAAAAAAAAA";
    for path in ["", "/episode", "/events", "/audit"] {
        api.get(&format!("/v1/runs/{unknown}{path}"))
            .await
            .problem(404, "unknown-run");
    }
    api.post(
        &format!("/v1/runs/{unknown}/reconcile"),
        json!({"step": "echo", "decision": "failed", "reason": "no"}),
    )
    .await
    .problem(404, "unknown-run");
    for verb in ["cancel", "resume", "retry"] {
        api.post(&format!("/v1/runs/{unknown}/{verb}"), json!({}))
            .await
            .problem(404, "unknown-run");
    }
    api.get("/v1/runs/not-a-run").await.problem(400, "bad-id");
    api.post(
        "/v1/runs",
        json!({"workflow": "b3:0000000000000000000000000000000000000000000000000000000000000000"}),
    )
    .await
    .problem(404, "unknown-version");
    api.post("/v1/runs", json!({"workflow": "no.such.workflow"}))
        .await
        .problem(400, "bad-target");
    api.get("/v1/workflows/no.such/versions")
        .await
        .problem(404, "unknown-workflow");
    api.get("/v1/diff?from=b3:00")
        .await
        .problem(400, "invalid-query");
    // Definitions that do not parse or validate are never published.
    api.post("/v1/workflows", json!({"definition": "id: [unclosed"}))
        .await
        .problem(422, "unparsable-workflow");
    let invalid = api
        .post(
            "/v1/workflows",
            json!({"definition": "id: http.bad\nsteps:\n  - id: a\n    tool: {name: \"no-such-tool@^1\", args: {}}\n"}),
        )
        .await;
    invalid.problem(422, "invalid-workflow");
    assert!(
        !invalid.body["errors"]
            .as_array()
            .expect("errors")
            .is_empty()
    );
    // Plugins: unknown, and bytes that are no component.
    api.get("/v1/plugins/no-such-plugin")
        .await
        .problem(404, "unknown-plugin");
    api.send(
        api.request(Method::POST, "/v1/plugins/inspect")
            .header(header::CONTENT_TYPE, "application/wasm")
            .body(Body::from("not wasm"))
            .expect("request"),
    )
    .await
    .problem(400, "bad-plugin");

    assert_eq!(api.stored().await, before, "a refused request wrote");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_are_listed_and_shown() {
    let api = api().await;
    let list = api.get("/v1/plugins").await;
    let rows = list.ok(200).as_array().expect("rows").clone();
    let json_row = rows
        .iter()
        .find(|r| r["name"] == "json")
        .expect("the bundled json tool");
    assert_eq!(json_row["status"], "ready");
    assert_eq!(json_row["kind"], "tool");
    let shown = api.get("/v1/plugins/json").await;
    assert_eq!(shown.ok(200)[0]["info"]["name"], "json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_but_the_probes() {
    let config = ServerConfig::with_token("s3cret");
    let api = api_with(config.clone(), Some("s3cret")).await;
    let before = api.stored().await;
    let anonymous = Api {
        app: api.app.clone(),
        host: api.host.clone(),
        token: None,
        _dir: tempfile::tempdir().expect("tempdir"),
    };
    let wrong = Api {
        app: api.app.clone(),
        host: api.host.clone(),
        token: Some("guess".into()),
        _dir: tempfile::tempdir().expect("tempdir"),
    };
    for client in [&anonymous, &wrong] {
        let r = client.get("/v1/runs").await;
        r.problem(401, "unauthorized");
        assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
        client
            .get("/v1/openapi.json")
            .await
            .problem(401, "unauthorized");
        client
            .post("/v1/workflows", json!({"definition": ECHO}))
            .await
            .problem(401, "unauthorized");
        assert_eq!(client.get("/v1/health").await.ok(200)["status"], "ok");
        assert_eq!(client.get("/v1/ready").await.ok(200)["status"], "ok");
    }
    assert_eq!(api.stored().await, before);
    assert_eq!(api.get("/v1/runs").await.ok(200), &json!([]));
    assert!(!format!("{config:?}").contains("s3cret"));
}

const FAILS: &str = r#"id: http.fails
steps:
  - id: pick
    tool: {name: "json@^0.1", args: {value: {}, select: "/missing"}}
    retry: {max_attempts: 1}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_is_retried_and_a_component_inspected() {
    let api = api().await;
    let version = api.publish(FAILS).await;
    let run = api
        .post("/v1/runs", json!({"workflow": version}))
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&run).await["status"], "failed");
    let retried = api
        .post(&format!("/v1/runs/{run}/retry"), json!({"from": "pick"}))
        .await;
    assert_eq!(retried.ok(200)["status"], "failed");
    assert_eq!(retried.body["run"], run.as_str());
    api.post(&format!("/v1/runs/{run}/retry"), json!({"from": "nope"}))
        .await
        .problem(400, "bad-step");
    // A blocked run is what takes a reconciliation; a failed one is not.
    api.post(
        &format!("/v1/runs/{run}/reconcile"),
        json!({"step": "pick", "decision": "committed"}),
    )
    .await
    .problem(400, "invalid-body");

    let component = std::fs::read(plugin_artifacts::JSON).expect("the json component");
    let inspected = api
        .send(
            api.request(Method::POST, "/v1/plugins/inspect")
                .header(header::CONTENT_TYPE, "application/wasm")
                .body(Body::from(component))
                .expect("request"),
        )
        .await;
    assert!(
        inspected.ok(200).to_string().contains("json"),
        "{}",
        inspected.text
    );
}

#[test]
fn every_problem_type_is_documented() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/http-api.md"),
    )
    .expect("docs/http-api.md");
    for kind in poimen_server::KINDS {
        assert!(
            doc.contains(&format!("`{}`", kind.slug)),
            "docs/http-api.md does not document the problem type `{}` ({})",
            kind.slug,
            kind.status
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_the_concurrency_limit_is_429_with_retry_after() {
    let api = api().await;
    let limited = JUDGED.replace(
        "id: http.judged\n",
        "id: http.limited\nconcurrency: {max_runs: 1, on_overflow: drop}\n",
    );
    let version = api.publish(&limited).await;
    let first = api
        .post("/v1/runs", json!({"workflow": version}))
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&first).await["status"], "waiting_judgment");
    let before = api.stored().await;
    let r = api.post("/v1/runs", json!({"workflow": version})).await;
    r.problem(429, "overflow");
    assert_eq!(r.headers[header::RETRY_AFTER], "1");
    assert_eq!(api.stored().await, before);
}

/// `queue_starts`: a start is written `queued` for a serving loop (none
/// runs here, so it stays queued), and the caller's W3C trace context is
/// recorded with it for whichever host drives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_start_waits_for_a_serving_loop_and_keeps_the_callers_trace() {
    let api = api_with(ServerConfig::open().queue_starts(true), None).await;
    let version = api.publish(ECHO).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = api
        .send(
            api.request(Method::POST, "/v1/runs")
                .header(header::CONTENT_TYPE, "application/json")
                .header("traceparent", traceparent)
                .header("tracestate", "vendor=1")
                .body(Body::from(
                    json!({"workflow": version, "input": {"text": "later"}}).to_string(),
                ))
                .expect("request"),
        )
        .await;
    let run = r.ok(201)["id"].as_str().expect("id").to_owned();
    assert_eq!(r.body["status"], "queued", "{}", r.text);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        api.get(&format!("/v1/runs/{run}")).await.ok(200)["status"],
        "queued"
    );
    let episode = api.get(&format!("/v1/runs/{run}/episode")).await;
    let started = &episode.ok(200)["events"][0];
    assert_eq!(started["event"], "run_started", "{}", episode.text);
    assert_eq!(
        started["trace"],
        json!({"traceparent": traceparent, "tracestate": "vendor=1"})
    );
    // Without the header, nothing is recorded.
    let r = api
        .post(
            "/v1/runs",
            json!({"workflow": version, "input": {"text": "untraced"}}),
        )
        .await;
    let untraced = r.ok(201)["id"].as_str().expect("id").to_owned();
    let episode = api.get(&format!("/v1/runs/{untraced}/episode")).await;
    assert!(
        episode.ok(200)["events"][0].get("trace").is_none(),
        "{}",
        episode.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_evaluation_is_run_and_its_report_read_back() {
    // The app with the console: its shadow pages show what the API keeps.
    let api = console_with(None).await;
    let v1 = api.publish(ECHO).await;
    api.post("/v1/workflows/http.echo/arm", json!({"version": v1}))
        .await
        .ok(200);
    for text in ["a", "b", "c"] {
        let r = api
            .post(
                "/v1/runs",
                json!({"workflow": "http.echo", "input": {"text": text}}),
            )
            .await;
        let run = r.ok(201)["id"].as_str().expect("id").to_owned();
        assert_eq!(api.settled(&run).await["status"], "completed");
    }
    // A candidate that changes the output.
    let v2 = api.publish(&ECHO.replace("said: ", "heard: ")).await;
    let before = api.stored().await;
    let r = api
        .post(
            "/v1/shadow",
            json!({"candidate": v2, "baseline": v1, "runs": 2, "workers": 1}),
        )
        .await;
    // Accepted once its runs are selected; then followed at `Location`.
    let started = r.ok(202).clone();
    let id = started["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("SHD-"), "{id}");
    assert_eq!(
        r.headers[header::LOCATION].to_str().expect("location"),
        format!("/v1/shadow/{id}")
    );
    assert_eq!(started["total"], 2, "{started}");
    assert!(started["report"].is_null(), "{started}");
    let view = api.shadow_ended(&id).await;
    assert_eq!(view["status"], "finished", "{view}");
    assert_eq!(view["done"], 2, "{view}");
    assert!(view["finished_at"].as_i64() >= started["created_at"].as_i64());
    let report = &view["report"];
    assert_eq!(report["workflow"], "http.echo");
    assert_eq!(report["baseline"], v1.as_str());
    assert_eq!(report["candidate"], v2.as_str());
    assert_eq!(report["aggregate"]["runs"], 2);
    assert_eq!(report["aggregate"]["outputs_equal"], 0);
    assert_eq!(report["runs"].as_array().expect("runs").len(), 2);
    // Listed.
    let listed = api.get("/v1/shadow").await;
    assert_eq!(listed.ok(200)[0]["id"], id.as_str());
    assert_eq!(listed.body[0]["status"], "finished");
    assert_eq!(listed.body[0]["candidate"], v2.as_str());
    // The same version against itself, by id and `ID@latest`: all equal.
    let same = api
        .post(
            "/v1/shadow",
            json!({"candidate": "http.echo", "baseline": v1, "sample": 1.0}),
        )
        .await;
    let same = api
        .shadow_ended(same.ok(202)["id"].as_str().expect("id"))
        .await;
    assert_eq!(same["report"]["same_version"], true, "{same}");
    assert_eq!(same["report"]["aggregate"]["outputs_equal"], 3);
    // Nothing was written to the live store.
    assert_eq!(api.stored().await, before, "a shadow evaluation wrote");
    // The console lists the evaluation and shows its HTML report.
    let page = api.get("/shadow").await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(page.text.contains(&id), "{}", page.text);
    let shown = api.get(&format!("/shadow/{id}")).await;
    assert_eq!(shown.status, 200, "{}", shown.text);
    assert!(
        shown.text.contains("http.echo") && shown.text.contains(&v2[..12]),
        "{}",
        shown.text
    );
    assert_eq!(api.get("/shadow/SHD-0000000000000000").await.status, 404);
    // Linked from the candidate's version page, and listed there by it.
    let version = api.get(&format!("/versions/{v2}")).await;
    assert!(
        version.text.contains("id=\"shadow-candidate\""),
        "{}",
        version.text
    );
    let of_v2 = api.get(&format!("/shadow?candidate={v2}")).await;
    assert!(of_v2.text.contains(&id), "{}", of_v2.text);
    let of_v1 = api.get(&format!("/shadow?candidate={v1}")).await;
    assert!(!of_v1.text.contains(&id), "{}", of_v1.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shadow_requests_are_problems_and_write_nothing() {
    let api = api().await;
    let echo = api.publish(ECHO).await;
    let judged = api.publish(JUDGED).await;
    let before = api.stored().await;

    api.post_raw("/v1/shadow", "{\"candidate\": ")
        .await
        .problem(400, "malformed-json");
    api.post("/v1/shadow", json!({"candidate": echo}))
        .await
        .problem(400, "invalid-body");
    api.post(
        "/v1/shadow",
        json!({"candidate": echo, "baseline": echo, "models": "guess"}),
    )
    .await
    .problem(400, "invalid-body");
    for bad in [
        json!({"runs": 0}),
        json!({"runs": 5, "sample": 0.5}),
        json!({"sample": 1.5}),
        json!({"workers": 0}),
    ] {
        let mut body = json!({"candidate": echo, "baseline": echo});
        for (k, v) in bad.as_object().expect("object") {
            body[k] = v.clone();
        }
        api.post("/v1/shadow", body)
            .await
            .problem(400, "invalid-body");
    }
    api.post(
        "/v1/shadow",
        json!({"candidate": "candidate.yaml", "baseline": echo}),
    )
    .await
    .problem(400, "file-target");
    api.post(
        "/v1/shadow",
        json!({"candidate": echo, "baseline": "b3:0000000000000000000000000000000000000000000000000000000000000000"}),
    )
    .await
    .problem(404, "unknown-version");
    api.post("/v1/shadow", json!({"candidate": echo, "baseline": judged}))
        .await
        .problem(400, "shadow-mismatch");
    // The baseline has no finished runs.
    api.post("/v1/shadow", json!({"candidate": echo, "baseline": echo}))
        .await
        .problem(422, "no-shadow-runs");
    api.get("/v1/shadow/SHD-0000000000000000")
        .await
        .problem(404, "unknown-shadow");
    assert_eq!(api.get("/v1/shadow").await.ok(200), &json!([]));

    assert_eq!(api.stored().await, before, "a refused request wrote");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_with_a_non_idempotent_effect_is_not_shadow_evaluated() {
    // The ledger appends outside the scratch directory: granted here, so
    // the workflow publishes, but never eligible for shadow evaluation.
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger_dir = dir.path().join("ledger");
    std::fs::create_dir_all(&ledger_dir).expect("ledger dir");
    let policy = poimen::Policy::in_code()
        .grant_fs_write("ledger", "/ledger", &ledger_dir)
        .expect("grant");
    let host = Host::builder()
        .store_path(dir.path().join("poimen.db"))
        .cache_dir(cache())
        .policy(policy)
        .build()
        .await
        .expect("host");
    let host = Arc::new(host);
    let api = Api {
        app: router(host.clone(), ServerConfig::open()),
        host,
        token: None,
        _dir: dir,
    };
    let ledger = api
        .publish("id: http.ledger\nsteps:\n  - id: record\n    tool: {name: \"ledger@^0.1\", args: {entry: {text: x}}}\n")
        .await;
    let before = api.stored().await;
    let r = api
        .post(
            "/v1/shadow",
            json!({"candidate": ledger, "baseline": ledger}),
        )
        .await;
    r.problem(422, "shadow-ineligible");
    assert!(r.text.contains("ledger"), "{}", r.text);
    assert_eq!(api.stored().await, before, "a refused request wrote");
}

// ----------------------------------------------------------------- console

/// The app `poimen serve --http` serves: the API and the console.
async fn console_with(token: Option<&str>) -> Api {
    let mut api = api_with(
        match token {
            Some(t) => ServerConfig::with_token(t),
            None => ServerConfig::open(),
        },
        token,
    )
    .await;
    api.app = poimen_server::app(
        api.host.clone(),
        match token {
            Some(t) => ServerConfig::with_token(t),
            None => ServerConfig::open(),
        },
    );
    api
}

impl Api {
    /// Posts a form as a browser of the console's own page would.
    async fn form(&self, uri: &str, fields: &[(&str, &str)]) -> Reply {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect();
        self.send(
            self.request(Method::POST, uri)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::HOST, "console.test")
                .header(header::ORIGIN, "http://console.test")
                .body(Body::from(body.join("&")))
                .expect("request"),
        )
        .await
    }
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The value of the first `name="NAME" value="…"` input of a page.
fn input(html: &str, name: &str) -> String {
    let at = format!("name=\"{name}\" value=\"");
    let start = html.find(&at).map(|i| i + at.len()).unwrap_or_else(|| {
        panic!("no input {name} in:\n{html}");
    });
    html[start..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_owned()
}

const FANNED: &str = r#"id: console.fanned
description: "<script>alert('description')</script>"
steps:
  - id: fork
    parallel:
      branches: [left, right]
      join: all
  - id: left
    tool: {name: "json@^0.1", args: {value: {said: "<script>alert('left')</script>"}, select: ""}}
  - id: right
    tool: {name: "json@^0.1", args: {value: {said: "right"}, select: ""}}
  - id: after
    tool: {name: "json@^0.1", args: {value: 1, select: ""}}
transitions:
  - {from: fork, to: after}
output: "{{ steps.fork.output }}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_runs_draws_lanes_for_branches_and_escapes_what_runs_carry() {
    let api = console_with(None).await;
    let version = api.publish(FANNED).await;
    let run = api
        .post(
            "/v1/runs",
            json!({"workflow": version, "idempotency_key": "k-1"}),
        )
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&run).await["status"], "completed");

    let list = api.get("/runs").await;
    assert_eq!(list.status, 200, "{}", list.text);
    assert!(list.text.contains(&run), "{}", list.text);
    assert!(list.text.contains("completed 1"), "counts: {}", list.text);
    for (query, listed) in [
        ("/runs?workflow=console.fanned", true),
        ("/runs?workflow=other", false),
        ("/runs?status=failed", false),
        ("/runs?key=k-1", true),
        ("/runs?key=k-2", false),
        (&*format!("/runs?version={}", &version[..12]), true),
        ("/runs?from=2000-01-01&until=2999-01-01T00:00", true),
        ("/runs?until=2000-01-01", false),
    ] {
        let page = api.get(query).await;
        assert_eq!(page.status, 200, "{query}: {}", page.text);
        assert_eq!(page.text.contains(&run), listed, "{query}: {}", page.text);
    }
    let bad = api.get("/runs?status=sleeping").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text.contains("not a run status"), "{}", bad.text);

    let page = api.get(&format!("/runs/{run}")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    // A lane for the spine and one per branch, each step a bar.
    for lane in ["main", "fork ▸ left", "fork ▸ right"] {
        assert!(
            page.text.contains(&format!("data-lane=\"{lane}\"")),
            "lane {lane}: {}",
            page.text
        );
    }
    for step in ["fork", "left", "right", "after"] {
        assert!(
            page.text.contains(&format!("data-step=\"{step}\"")),
            "{step}"
        );
    }
    // Each tool call with its intents and what the sandbox recorded.
    assert!(
        page.text.contains("pending → dispatched → committed"),
        "{}",
        page.text
    );
    assert!(page.text.contains(" µs</td>"), "wall time: {}", page.text);
    // What the run carries is text, never markup.
    assert!(!page.text.contains("<script>alert"), "{}", page.text);
    assert!(page.text.contains("&lt;script&gt;alert("), "{}", page.text);
    let shown = api.get(&format!("/versions/{version}")).await;
    assert_eq!(shown.status, 200, "{}", shown.text);
    assert!(!shown.text.contains("<script>alert"), "{}", shown.text);
    assert!(shown.text.contains("&lt;script&gt;"), "{}", shown.text);
    assert!(
        shown.text.contains("json@"),
        "the plan names the tool: {}",
        shown.text
    );
    // Every page renders.
    for path in [
        "/workflows",
        "/workflows/console.fanned",
        "/plugins",
        "/judgments",
        "/shadow",
    ] {
        let p = api.get(path).await;
        assert_eq!(p.status, 200, "{path}: {}", p.text);
    }
    let diff = api.get(&format!("/diff?from={version}&to={version}")).await;
    assert_eq!(diff.status, 200, "{}", diff.text);
    assert!(diff.text.contains("mean the same"), "{}", diff.text);
    // Blobs on demand: as text, never as markup.
    let (record, _) = api.host.status(&run.parse_run()).await.expect("status");
    let blob = api.get(&format!("/blobs/{}", record.input_hash)).await;
    assert_eq!(blob.status, 200, "{}", blob.text);
    assert_eq!(
        blob.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(blob.text, "{}");
    assert_eq!(api.get("/blobs/b3:nothex").await.status, 400);
    let unknown = format!("/blobs/b3:{}", "0".repeat(64));
    assert_eq!(api.get(&unknown).await.status, 404);
    let css = api.get("/assets/console.css").await;
    assert_eq!(css.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_forms_need_their_csrf_token_and_a_judgment_is_answered_through_one() {
    let api = console_with(None).await;
    let version = api.publish(JUDGED).await;
    let run = api
        .post("/v1/runs", json!({"workflow": version}))
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&run).await["status"], "waiting_judgment");
    let id = api.get("/v1/judgments").await.ok(200)[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let page = api.get(&format!("/judgments/{id}")).await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert!(
        page.text.contains("name=\"field.go\""),
        "a field per property: {}",
        page.text
    );
    let csrf = input(&page.text, "csrf");
    let hash = input(&page.text, "request_hash");
    let uri = format!("/judgments/{id}");
    let events = api.host.episode(&run.parse_run()).await.expect("episode");

    // Without the token, with a wrong one, or from another site: refused.
    let none = api
        .form(
            &uri,
            &[
                ("request_hash", &hash),
                ("field.go", "true"),
                ("judge", "me"),
            ],
        )
        .await;
    assert_eq!(none.status, 403, "{}", none.text);
    let wrong = api
        .form(
            &uri,
            &[
                ("csrf", "00"),
                ("request_hash", &hash),
                ("field.go", "true"),
                ("judge", "me"),
            ],
        )
        .await;
    assert_eq!(wrong.status, 403, "{}", wrong.text);
    let cross = api
        .send(
            api.request(Method::POST, &uri)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::HOST, "console.test")
                .header(header::ORIGIN, "https://evil.example")
                .body(Body::from(format!("csrf={csrf}&field.go=true&judge=me")))
                .expect("request"),
        )
        .await;
    assert_eq!(cross.status, 403, "{}", cross.text);

    // An answer the schema refuses: the page says why, nothing written.
    let refused = api
        .form(
            &uri,
            &[
                ("csrf", &csrf),
                ("request_hash", &hash),
                ("result_json", r#"{"go": "yes"}"#),
                ("judge", "me"),
                ("confirmed", "yes"),
            ],
        )
        .await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert!(refused.text.contains("id=\"error\""), "{}", refused.text);
    assert!(
        refused.text.contains("go: &quot;yes&quot; is not of type"),
        "{}",
        refused.text
    );
    // A good answer not marked final: asked to, nothing written.
    let unconfirmed = api
        .form(
            &uri,
            &[
                ("csrf", &csrf),
                ("request_hash", &hash),
                ("field.go", "true"),
                ("judge", "me"),
            ],
        )
        .await;
    assert_eq!(unconfirmed.status, 422, "{}", unconfirmed.text);
    assert!(
        unconfirmed.text.contains("This answer is final"),
        "{}",
        unconfirmed.text
    );
    assert_eq!(
        api.host.episode(&run.parse_run()).await.expect("episode"),
        events,
        "a refused answer writes nothing"
    );

    // A good one: the run goes on to its end, and the page shows the event.
    let answered = api
        .form(
            &uri,
            &[
                ("csrf", &csrf),
                ("request_hash", &hash),
                ("field.go", "true"),
                ("judge", "me"),
                ("confirmed", "yes"),
            ],
        )
        .await;
    assert_eq!(answered.status, 303, "{}", answered.text);
    let to = answered
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .expect("redirect")
        .to_owned();
    assert!(to.starts_with(&format!("/runs/{run}?done=")), "{to}");
    assert_eq!(api.settled(&run).await["status"], "completed");
    let shown = api.get(to.split('#').next().unwrap_or_default()).await;
    assert!(shown.text.contains("Recorded: event #"), "{}", shown.text);

    // Cancel asks first; confirmed, it cancels.
    let run2 = api
        .post("/v1/runs", json!({"workflow": version}))
        .await
        .ok(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(api.settled(&run2).await["status"], "waiting_judgment");
    let cancel = format!("/runs/{run2}/cancel");
    let ask = api.form(&cancel, &[("csrf", &csrf)]).await;
    assert_eq!(ask.status, 200, "{}", ask.text);
    assert!(ask.text.contains("cannot be undone"), "{}", ask.text);
    assert_eq!(api.settled(&run2).await["status"], "waiting_judgment");
    let done = api
        .form(&cancel, &[("csrf", &csrf), ("confirmed", "yes")])
        .await;
    assert_eq!(done.status, 303, "{}", done.text);
    assert_eq!(api.settled(&run2).await["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_behind_a_token_asks_to_sign_in() {
    let mut api = console_with(Some("s3cret")).await;
    // As a browser: no bearer header.
    api.token = None;
    let page = api.get("/runs").await;
    assert_eq!(page.status, 303, "{}", page.text);
    assert_eq!(
        page.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok()),
        Some("/login?next=%2Fruns")
    );
    assert_eq!(api.get("/assets/console.css").await.status, 200);
    assert_eq!(
        api.get("/v1/runs").await.status,
        401,
        "the API still wants its bearer"
    );
    let wrong = api
        .form("/login", &[("token", "guess"), ("next", "/runs")])
        .await;
    assert_eq!(wrong.status, 401, "{}", wrong.text);
    let signed = api
        .form(
            "/login",
            &[("token", "s3cret"), ("next", "https://evil.example/")],
        )
        .await;
    assert_eq!(signed.status, 303, "{}", signed.text);
    assert_eq!(
        signed
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok()),
        Some("/runs"),
        "never to another site"
    );
    let cookie = signed
        .headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let with = api
        .send(
            Request::builder()
                .uri("/runs")
                .header(header::COOKIE, cookie.split(';').next().unwrap_or_default())
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(with.status, 200, "{}", with.text);
}
