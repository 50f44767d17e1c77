//! What telemetry costs a step: spans exported through OpenTelemetry and
//! the Prometheus metrics, on against off, on the same host code.
//!
//! Two hosts over in-memory stores (no fsync in the figure), each running
//! a chain of 1 and of 10 pure `json` tool steps; the per-step cost is the
//! slope, (t10 − t1) / 9. *Off*: no subscriber (every span disabled at its
//! callsite) and `HostBuilder::metrics(false)`. *On*: a subscriber with
//! `tracing-opentelemetry` over an SDK tracer provider whose batch
//! processor hands every span to an exporter that drops it (what an OTLP
//! exporter costs the host before the wire), and metrics kept; the layer
//! as `poimen --otlp-endpoint` configures it (src/telemetry.rs: spans at
//! INFO and above, no OpenTelemetry context attached on span entry) and,
//! for comparison, the same layer without its level filter (every TRACE
//! and DEBUG span of the dependencies exported too); and the spans in
//! `tracing`'s registry with no layer (the floor under any exporter). All
//! are timed back to back in each of 30 rounds, the ratio to *off* taken
//! per round. The process allocates with mimalloc, as the binary does.
//!
//! `cargo bench -p poimen --bench telemetry`: prints its lines.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use poimen::{Host, RunStatus, Target};
use serde_json::json;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;

// The allocator the `poimen` binary uses (src/main.rs).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drops every span it is given.
#[derive(Debug)]
struct Discard;

impl SpanExporter for Discard {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        std::hint::black_box(batch);
        Ok(())
    }
}

fn chain(n: usize) -> String {
    let mut wf = format!("id: bench.telemetry{n}\ndurable: true\nsteps:\n");
    for i in 0..n {
        let value = if i == 0 {
            "{n: \"{{ inputs.n }}\"}".to_owned()
        } else {
            format!("\"{{{{ steps.s{}.output }}}}\"", i - 1)
        };
        wf.push_str(&format!(
            "  - id: s{i}\n    tool: {{name: \"json@^0.1\", args: {{value: {value}, select: \"\"}}}}\n"
        ));
    }
    if n > 1 {
        wf.push_str("transitions:\n");
        for i in 1..n {
            wf.push_str(&format!("  - {{from: s{}, to: s{i}}}\n", i - 1));
        }
    }
    wf
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let one = dir.path().join("one.yaml");
    let ten = dir.path().join("ten.yaml");
    std::fs::write(&one, chain(1)).expect("write");
    std::fs::write(&ten, chain(10)).expect("write");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("telemetry-bench-cache");
    let host = |metrics: bool| {
        rt.block_on(
            Host::builder()
                .memory_store()
                .cache_dir(cache.clone())
                .metrics(metrics)
                .build(),
        )
        .expect("host")
    };
    let (off, on) = (host(false), host(true));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Discard)
        .build();
    // As `poimen --otlp-endpoint` configures it (src/telemetry.rs): spans
    // at INFO and above (the host's own), or every span of every level.
    let subscriber = |filtered: bool| -> Arc<dyn tracing::Subscriber + Send + Sync> {
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("bench"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false);
        if filtered {
            Arc::new(
                tracing_subscriber::registry()
                    .with(layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO)),
            )
        } else {
            Arc::new(tracing_subscriber::registry().with(layer))
        }
    };
    let (ours, unfiltered) = (subscriber(true), subscriber(false));
    // The floor under any exporter: the same spans recorded by
    // `tracing`'s registry (created, entered on every poll, closed) with
    // no layer doing anything with them.
    let registry_only: Arc<dyn tracing::Subscriber + Send + Sync> = Arc::new(
        tracing_subscriber::registry().with(
            tracing_subscriber::layer::Identity::new()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        ),
    );
    // One run of `wf` on `host`, in µs.
    let run = |host: &Host, wf: &std::path::Path| {
        let t = Instant::now();
        let out = rt
            .block_on(host.run(
                &Target::File(wf.to_owned()),
                json!({"n": 1}),
                Default::default(),
            ))
            .expect("run");
        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
        t.elapsed().as_secs_f64() * 1e6
    };
    // `traced`: None, or the subscriber to run under.
    let slope = |host: &Host, traced: Option<&Arc<dyn tracing::Subscriber + Send + Sync>>| {
        let time = |wf: &std::path::Path| {
            median(
                (0..7)
                    .map(|_| match traced {
                        Some(sub) => {
                            tracing::subscriber::with_default(sub.clone(), || run(host, wf))
                        }
                        None => run(host, wf),
                    })
                    .collect(),
            )
        };
        (time(&ten) - time(&one)) / 9.0
    };
    for _ in 0..3 {
        slope(&off, None);
        slope(&on, Some(&ours));
    }
    // Per round: off, metrics only, spans only, both, both without the
    // level filter, and spans in the registry alone.
    let mut v: [Vec<f64>; 6] = Default::default();
    let mut ratios: [Vec<f64>; 5] = Default::default();
    for _ in 0..30 {
        let base = slope(&off, None);
        let each = [
            slope(&on, None),
            slope(&off, Some(&ours)),
            slope(&on, Some(&ours)),
            slope(&on, Some(&unfiltered)),
            slope(&off, Some(&registry_only)),
        ];
        v[0].push(base);
        for (k, x) in each.into_iter().enumerate() {
            v[k + 1].push(x);
            ratios[k].push(x / base);
        }
    }
    let [v0, v1, v2, v3, v4, v5] = v;
    let [r1, r2, r3, r4, r5] = ratios;
    println!(
        "telemetry per tool step (median of 30 paired rounds): off {:.1} µs; metrics only {:.1} µs ({:.3}×); spans over OpenTelemetry only {:.1} µs ({:.3}×); both {:.1} µs ({:.3}×); both, without the level filter {:.1} µs ({:.3}×); spans in the registry alone {:.1} µs ({:.3}×)",
        median(v0),
        median(v1),
        median(r1),
        median(v2),
        median(r2),
        median(v3),
        median(r3),
        median(v4),
        median(r4),
        median(v5),
        median(r5)
    );
    let _ = provider.shutdown();
}
