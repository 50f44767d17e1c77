//! A small service that embeds the poimen host: its own store, clock and
//! in-code policy through the open builder, and the versioned `/v1` HTTP
//! API (`poimen_server::router`) mounted inside its own axum app beside its
//! own routes — what a service embedding poimen as a library looks like.
//!
//! ```sh
//! cargo run --example embed -- --listen 127.0.0.1:8080 --store /tmp/poimen.db \
//!     --publish fixtures/examples/text-report.yaml
//! curl -s localhost:8080/service                       # the service's own route
//! curl -s localhost:8080/v1/runs -H 'content-type: application/json' \
//!      -d '{"workflow": "examples.text_report", "input": {"text": "hi"}}'
//! curl -s localhost:8080/v1/runs/WFR-…                 # the mounted API
//! ```
//!
//! `--publish FILE` (repeatable) publishes and arms a workflow file at start:
//! the HTTP API starts runs only of published workflows. `--data DIR` grants
//! the bundled `fs-read` tool read access to DIR at `/data` (the in-code
//! policy grants nothing else). `--token TOKEN` requires it as a bearer
//! token on `/v1` (an embedder may authenticate in its own layers instead).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use poimen::{Clock, Host, Parent, Policy, RunFilter, SystemClock};
use poimen_server::ServerConfig;
use serde_json::{Value, json};

/// The service's clock: the system clock, counting how often the host
/// reads it (a real service might add an offset, or read a time source of
/// its own).
#[derive(Clone, Default)]
struct ServiceClock {
    inner: SystemClock,
    reads: Arc<AtomicU64>,
}

impl Clock for ServiceClock {
    fn now_ms(&self) -> i64 {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.now_ms()
    }

    fn sleep(&self, duration: Duration) -> poimen::Sleep {
        self.inner.sleep(duration)
    }
}

/// What the service's own route sees.
#[derive(Clone)]
struct Service {
    host: Arc<Host>,
    clock: ServiceClock,
    published: Arc<Vec<String>>,
}

/// `GET /service`: the service's own route, beside the mounted `/v1`.
async fn service(State(s): State<Service>) -> Json<Value> {
    let runs = s
        .host
        .list_runs(RunFilter::default())
        .await
        .map(|r| r.len())
        .ok();
    Json(json!({
        "service": "poimen embed example",
        "api": "/v1",
        "published": *s.published,
        "runs": runs,
        "clock_reads": s.clock.reads.load(Ordering::Relaxed),
    }))
}

struct Args {
    listen: SocketAddr,
    store: Option<PathBuf>,
    publish: Vec<PathBuf>,
    data: Option<PathBuf>,
    token: Option<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        listen: "127.0.0.1:8080".parse()?,
        store: None,
        publish: Vec::new(),
        data: None,
        token: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("`{arg}` takes a value"))
        };
        match arg.as_str() {
            "--listen" => a.listen = value()?.parse()?,
            "--store" => a.store = Some(value()?.into()),
            "--publish" => a.publish.push(value()?.into()),
            "--data" => a.data = Some(value()?.into()),
            "--token" => a.token = Some(value()?),
            other => anyhow::bail!(
                "unknown argument `{other}`; use --listen ADDR, --store PATH, --publish FILE, --data DIR, --token TOKEN"
            ),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    // The policy in code: the same struct a policy file parses into.
    let mut policy = Policy::in_code();
    if let Some(dir) = &args.data {
        policy = policy.grant_fs_read("fs-read", "/data", dir)?;
    }
    let clock = ServiceClock::default();
    let builder = Host::builder().clock(clock.clone()).policy(policy);
    let builder = match &args.store {
        Some(path) => builder.store_path(path),
        None => builder.memory_store(),
    };
    let host = Arc::new(builder.build().await?);
    // Runs this service left in flight when it last stopped go on now.
    host.recover().await?;

    let mut published = Vec::new();
    for file in &args.publish {
        let loaded = host.load_file(file)?;
        let p = host.publish(&loaded.def, Parent::Latest).await?;
        host.arm(&format!("{}@{}", p.workflow, p.version)).await?;
        published.push(p.workflow.to_string());
    }

    let config = match args.token {
        Some(token) => ServerConfig::with_token(token),
        None => ServerConfig::open(),
    };
    let own = Router::new()
        .route("/service", get(service))
        .with_state(Service {
            host: host.clone(),
            clock,
            published: Arc::new(published),
        });
    // The poimen API keeps its `/v1` prefix (so its OpenAPI document stays
    // true), its problem+json errors and its token check; the service's
    // routes sit beside it.
    let app = own.merge(poimen_server::router(host, config));

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // Without it, Nagle holds a response's last bytes until the client's
    // delayed ACK (~40 ms on a kept-alive connection).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}
