//! A small HTTP service that embeds the poimen host and starts runs on
//! request — what a service embedding poimen as a library looks like.
//!
//! ```sh
//! cargo run --example embed -- --listen 127.0.0.1:8080 --store /tmp/poimen.db
//! curl -s localhost:8080/runs -d '{"workflow": "fixtures/examples/text-report.yaml", "input": {"text": "hi"}}' \
//!      -H 'content-type: application/json'
//! curl -s localhost:8080/runs/WFR-…
//! ```
//!
//! `POST /runs` starts a run and answers at once with its id (`202`);
//! `GET /runs/{id}` reports its status and, once done, its output.

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use poimen::{Host, Target};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct StartRun {
    /// A workflow file or a published version.
    workflow: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    idempotency_key: Option<String>,
}

type Reply = (StatusCode, Json<Value>);

fn error(status: StatusCode, e: impl std::fmt::Display) -> Reply {
    (status, Json(json!({"error": e.to_string()})))
}

fn status_of(e: &poimen::Error) -> StatusCode {
    match e {
        poimen::Error::Parse(_) | poimen::Error::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        poimen::Error::NotFound { .. }
        | poimen::Error::Read { .. }
        | poimen::Error::Run(poimen::RunError::UnknownRun(_)) => StatusCode::NOT_FOUND,
        poimen::Error::Start(poimen::StartError::InvalidInput { .. })
        | poimen::Error::Run(poimen::RunError::Start(poimen::StartError::InvalidInput {
            ..
        }))
        | poimen::Error::BadTarget { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn start_run(State(host): State<Host>, Json(req): Json<StartRun>) -> Reply {
    let input = if req.input.is_null() {
        json!({})
    } else {
        req.input
    };
    match host
        .start(
            &Target::parse(&req.workflow),
            input,
            poimen::RunOptions {
                idempotency_key: req.idempotency_key,
                tenant: None,
            },
        )
        .await
    {
        Ok(run) => (StatusCode::ACCEPTED, Json(json!({"run": run}))),
        Err(e) => error(status_of(&e), e),
    }
}

async fn run_status(State(host): State<Host>, Path(id): Path<String>) -> Reply {
    match host.status(&id).await {
        Ok((rec, state)) => (
            StatusCode::OK,
            Json(
                json!({"run": rec.id, "status": rec.status, "reason": rec.reason, "output": state.output}),
            ),
        ),
        Err(e) => error(status_of(&e), e),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut listen: SocketAddr = "127.0.0.1:8080".parse()?;
    let mut store: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or_default().parse()?,
            "--store" => store = args.next(),
            other => {
                anyhow::bail!("unknown argument `{other}`; use --listen ADDR and --store PATH")
            }
        }
    }
    let builder = Host::builder();
    let builder = match store {
        Some(path) => builder.store_path(path),
        None => builder.memory_store(),
    };
    let host = builder.build().await?;
    // Runs this service left in flight when it last stopped go on now.
    host.recover().await?;
    let app = Router::new()
        .route("/runs", post(start_run))
        .route("/runs/{id}", get(run_status))
        .with_state(host);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
