//! The binary's telemetry: logs to stderr (filtered by `POIMEN_LOG`) and,
//! with `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`), the host's
//! spans — `run` → `step` → `attempt` → `guest_call`, and `http_request` /
//! `mcp_call` above them — exported over OTLP (HTTP, protobuf) to
//! `ENDPOINT/v1/traces`. A W3C `traceparent` sent by an HTTP or MCP caller
//! becomes the parent of the request's span, so the caller's trace goes on
//! into the run — also when the run is queued and driven later, or by
//! another host: the request's own context is what a start records with
//! the run, and [`continue_trace`] makes the run's span its child.
//! Everything here is the binary's: the library crates only make spans.

use std::io::IsTerminal;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// What must outlive the command: the span exporter, flushed on drop.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends what is still batched and stops the exporter. Call it outside
    /// the async runtime and before it is dropped: the exporter's requests
    /// run on it.
    pub fn shutdown(mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("warning: the OTLP exporter did not flush: {e}");
        }
    }
}

/// Installs the process's subscriber. Logs go to stderr at `log_default`
/// unless `POIMEN_LOG` says otherwise (`None`: only when it is set); with
/// `otlp`, spans are exported too.
/// Spans are exported from the SDK's own batch thread, which has no async
/// runtime; each export's request is spawned on the host's runtime, so
/// OTLP needs no HTTP client beyond the hyper one the host already has.
#[derive(Debug)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| format!("the OTLP export task stopped: {e}"))?
    }
}

/// How long one OTLP export may take before it is abandoned.
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub fn init(
    log_default: Option<&str>,
    otlp: Option<&str>,
    runtime: tokio::runtime::Handle,
) -> Result<Telemetry, String> {
    let env = std::env::var("POIMEN_LOG").ok();
    let logs = match (env.as_deref(), log_default) {
        (Some(_), _) => Some(
            tracing_subscriber::EnvFilter::try_from_env("POIMEN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        ),
        (None, Some(default)) => Some(tracing_subscriber::EnvFilter::new(default)),
        (None, None) => None,
    }
    .map(|filter| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .with_filter(filter)
    });
    let (provider, spans) = match otlp {
        None => (None, None),
        Some(base) => {
            let endpoint = format!("{}/v1/traces", base.trim_end_matches('/'));
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(OnRuntime {
                    client: opentelemetry_http::hyper::HyperClient::with_default_connector(
                        EXPORT_TIMEOUT,
                        None,
                    ),
                    runtime,
                })
                .with_timeout(EXPORT_TIMEOUT)
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| format!("--otlp-endpoint {base}: cannot export to {endpoint}: {e}"))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name("poimen")
                        .build(),
                )
                .build();
            let tracer = provider.tracer("poimen");
            // What an operator filters by is in the spans' own fields: no
            // source locations, thread names or busy/idle clocks per poll
            // (each costs the host time on every step). Nothing in the host
            // reads OpenTelemetry's current context (parents are set on the
            // spans themselves), so entering a span does not attach one:
            // that was a context clone and a thread-local push on every
            // poll of every instrumented future.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_context_activation(false)
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
            (Some(provider), Some(layer))
        }
    };
    if logs.is_some() || spans.is_some() {
        // A second install (a test harness) keeps the first.
        let _ = tracing_subscriber::registry()
            .with(logs)
            .with(spans)
            .try_init();
    }
    Ok(Telemetry { provider })
}

/// Reads a W3C trace context recorded with a run's start.
struct Carrier<'a>(&'a poimen::TraceCarrier);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Makes a run's span continue the trace its starter recorded
/// (`HostBuilder::trace_parent`). Without an OpenTelemetry layer there is
/// nothing to continue.
pub fn continue_trace(span: &tracing::Span, carrier: &poimen::TraceCarrier) {
    let _ = span.set_parent(TraceContextPropagator::new().extract(&Carrier(carrier)));
}

/// Reads a W3C trace context from HTTP headers.
struct Headers<'a>(&'a axum::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Writes a W3C trace context into HTTP headers.
struct HeadersMut<'a>(&'a mut axum::http::HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(key.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Reads a W3C trace context from an MCP request's `_meta`.
struct Meta<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl Extractor for Meta<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Middleware for the HTTP API: each request in an `http_request` span
/// whose parent is the caller's `traceparent`, if it sent one. The
/// request's `traceparent` is then this span's own, so what the request
/// starts — a run recorded now and driven later — continues under it.
pub async fn trace_context(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let propagator = TraceContextPropagator::new();
    let parent = propagator.extract(&Headers(req.headers()));
    let span = tracing::info_span!(
        "http_request",
        method = %req.method(),
        path = %req.uri().path(),
    );
    // Without an OpenTelemetry layer there is nothing to continue, and the
    // span has no context to pass on (the caller's header stays).
    let _ = span.set_parent(parent);
    let own = span.context();
    if own.span().span_context().is_valid() {
        propagator.inject_context(&own, &mut HeadersMut(req.headers_mut()));
    }
    next.run(req).instrument(span).await
}

/// The span of one MCP tool call, continuing the caller's trace when its
/// `_meta` carries `traceparent`.
pub fn mcp_span(
    tool: &str,
    meta: Option<&serde_json::Map<String, serde_json::Value>>,
) -> tracing::Span {
    let span = tracing::info_span!("mcp_call", tool = %tool);
    if let Some(meta) = meta {
        let _ = span.set_parent(TraceContextPropagator::new().extract(&Meta(meta)));
    }
    span
}
