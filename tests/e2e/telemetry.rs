//! Telemetry from the outside: `poimen serve --http … --otlp-endpoint`
//! exports one trace per request over OTLP (HTTP, protobuf) to a collector
//! this test runs, continuing the caller's W3C `traceparent` into the run —
//! queued by the request and claimed by the serving loop after it answered,
//! the run still nests under the request: `http_request` → `run` → `step` →
//! `attempt` → `guest_call`, with the fields an operator filters by. And
//! `/metrics` counts the run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};

use crate::support::{Env, Served};

const ECHO: &str = r#"id: otel.e2e
inputs: {type: object, properties: {text: {type: string}}, required: [text]}
steps:
  - id: echo
    tool: {name: "json@^0.1", args: {value: {said: "{{ inputs.text }}"}, select: ""}}
output: "{{ steps.echo.output }}"
"#;

/// The caller's trace: W3C trace id and its span.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP collector: every body POSTed to `/v1/traces`.
async fn collector() -> (String, Arc<Mutex<Vec<ExportTraceServiceRequest>>>) {
    let got: Arc<Mutex<Vec<ExportTraceServiceRequest>>> = Arc::default();
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                keep.lock().expect("collector").push(req);
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), got)
}

fn serve_traced(env: &Env, otlp: &str) -> (Served, String) {
    let log = env.path().join("otel.log");
    let file = std::fs::File::create(&log).expect("log file");
    let child = env
        .std_cmd()
        .args(["serve", "--host-id", "otel", "--poll", "20ms"])
        .args(["--http", "127.0.0.1:0", "--otlp-endpoint", otlp])
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn poimen serve");
    let served = Served {
        id: "otel".to_owned(),
        child,
        log,
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = served.log();
        if let Some(url) = text
            .lines()
            .find_map(|l| l.split("HTTP API on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
        {
            return (served, url.to_owned());
        }
        assert!(Instant::now() < deadline, "never listened:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attrs(span: &Span) -> BTreeMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_trace_continues_into_the_run_and_is_exported_over_otlp() {
    let env = Env::new();
    let (otlp, got) = collector().await;
    let (served, base) = serve_traced(&env, &otlp);
    let http = reqwest::Client::new();
    let published: Value = http
        .post(format!("{base}/workflows"))
        .json(&json!({"definition": ECHO}))
        .send()
        .await
        .expect("publish")
        .json()
        .await
        .expect("JSON");
    let version = published["version"].as_str().expect("version").to_owned();
    let started = http
        .post(format!("{base}/runs"))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&json!({"workflow": version, "input": {"text": "secret words"}}))
        .send()
        .await
        .expect("start");
    assert_eq!(started.status(), 201, "{}", served.log());
    let run: Value = started.json().await.expect("JSON");
    let id = run["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: Value = http
            .get(format!("{base}/runs/{id}"))
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("JSON");
        if now["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "{now}\n{}", served.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The metrics count it.
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"poimen_runs_ended_total{status="completed"} 1"#),
        "{metrics}"
    );

    // SIGTERM: the server stops and flushes what it batched.
    served.signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans: Vec<Span> = loop {
        let spans: Vec<Span> = got
            .lock()
            .expect("collector")
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect();
        if spans.iter().any(|s| s.name == "run") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "no run span exported: {spans:?}\n{}",
            served.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Every span of the run is in the caller's trace, under its span.
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let by_id: BTreeMap<String, &Span> = ours.iter().map(|s| (hex(&s.span_id), *s)).collect();
    let parent_name = |s: &Span| {
        by_id
            .get(&hex(&s.parent_span_id))
            .map(|p| p.name.clone())
            .unwrap_or_else(|| hex(&s.parent_span_id))
    };
    let named = |n: &str| ours.iter().filter(|s| s.name == n).collect::<Vec<_>>();
    let request = named("http_request");
    assert_eq!(request.len(), 1, "{ours:#?}");
    assert_eq!(hex(&request[0].parent_span_id), CALLER_SPAN);
    let run_spans = named("run");
    assert_eq!(run_spans.len(), 1, "{ours:#?}");
    assert_eq!(parent_name(run_spans[0]), "http_request");
    let a = attrs(run_spans[0]);
    assert_eq!(a.get("run"), Some(&id));
    assert_eq!(a.get("workflow").map(String::as_str), Some("otel.e2e"));
    assert_eq!(a.get("version"), Some(&version));
    for (name, parent) in [
        ("step", "run"),
        ("attempt", "step"),
        ("guest_call", "attempt"),
    ] {
        let found = named(name);
        assert_eq!(found.len(), 1, "{name}: {ours:#?}");
        assert_eq!(parent_name(found[0]), parent, "{name}");
    }
    let call = attrs(named("guest_call")[0]);
    assert_eq!(call.get("tool").map(String::as_str), Some("json"));
    assert!(call.get("digest").is_some_and(|d| d.starts_with("b3:")));
    assert!(call.get("args_hash").is_some_and(|h| h.starts_with("b3:")));
    assert!(
        !format!("{ours:?}").contains("secret words"),
        "arguments never leave as span data"
    );
    // A request without a traceparent starts a trace of its own.
    assert!(
        spans
            .iter()
            .any(|s| s.name == "http_request" && hex(&s.trace_id) != TRACE_ID),
        "the publish request has its own trace"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_callers_trace_continues_into_the_run() {
    let env = Env::new();
    let (otlp, got) = collector().await;
    let wf = env.write("echo.yaml", ECHO);
    let client = crate::mcp::mcp_client(&env, &["--otlp-endpoint", &otlp]).await;
    let mut params = rmcp::model::CallToolRequestParams::new("workflow_run").with_arguments(
        crate::mcp::args(json!({"target": wf, "input": {"text": "over mcp"}})),
    );
    params.meta = Some(rmcp::model::RequestMetaObject::from(crate::mcp::args(
        json!({"traceparent": format!("00-{TRACE_ID}-{CALLER_SPAN}-01")}),
    )));
    let r = client.call_tool(params).await.expect("call");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    // Closing the connection ends the process, which flushes its spans.
    client.cancel().await.expect("close");
    let deadline = Instant::now() + Duration::from_secs(30);
    let ours: Vec<Span> = loop {
        let ours: Vec<Span> = got
            .lock()
            .expect("collector")
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .filter(|s| hex(&s.trace_id) == TRACE_ID)
            .collect();
        if ours.iter().any(|s| s.name == "guest_call") {
            break ours;
        }
        assert!(Instant::now() < deadline, "no trace exported: {ours:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let call = ours
        .iter()
        .find(|s| s.name == "mcp_call")
        .expect("the MCP call's span");
    assert_eq!(hex(&call.parent_span_id), CALLER_SPAN);
    assert_eq!(
        attrs(call).get("tool").map(String::as_str),
        Some("workflow_run")
    );
    let run = ours.iter().find(|s| s.name == "run").expect("run span");
    assert_eq!(
        run.parent_span_id, call.span_id,
        "the run is under the call"
    );
}
