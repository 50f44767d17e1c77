//! [`Error`]: everything the host can report, by kind — a leaf module, so
//! every part of the facade names the same error without importing the
//! host itself.

use std::path::PathBuf;
use std::sync::Arc;

use poimen_store::{RunId, RunStatus, StoreError};
use poimen_workflow::{ValidationError, WorkflowVersion};

use crate::loader::CheckError;

/// Everything that can go wrong, by kind. Each message says what went wrong,
/// where, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, over the {limit}-byte limit for a workflow file")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error(
        "{path}: the file name must end in .yaml, .yml or .json so poimen knows how to read it"
    )]
    UnknownFormat { path: PathBuf },
    #[error(transparent)]
    Parse(#[from] poimen_workflow::ParseError),
    #[error("workflow `{workflow}` is invalid: {} problem(s); {}", .errors.len(), first(.errors))]
    Invalid {
        workflow: String,
        errors: Vec<ValidationError>,
    },
    #[error("{what} `{given}` was not found; {hint}")]
    NotFound {
        what: &'static str,
        given: String,
        hint: String,
    },
    #[error("`{given}` is not a workflow file or a version: {detail}")]
    BadTarget { given: String, detail: String },
    #[error("the input is not valid JSON: {0}")]
    BadInput(String),
    #[error("workflow `{workflow}` breaks this host's policy: {} problem(s); {}", .violations.len(), first(.violations))]
    Policy {
        workflow: String,
        violations: Vec<crate::policy::PolicyViolation>,
    },
    #[error(
        "workflow `{workflow}` declares the tool name `{name}`, which {by} already has: give it another name under `tool: {{name: …}}`"
    )]
    ToolNameTaken {
        workflow: String,
        name: String,
        by: String,
    },
    #[error("workflow `{workflow}` may not start here: {why}")]
    NotAllowed { workflow: String, why: String },
    #[error(
        "workflow `{workflow}` is disarmed: no new run of it starts; arm a version with `poimen arm {workflow}@VERSION` (`poimen versions {workflow}` lists them)"
    )]
    Disarmed { workflow: String },
    #[error(
        "workflow `{workflow}` may start only on its armed version, and {version} is not it ({}); arm it with `poimen arm {workflow}@{version}`",
        match .armed { Some(a) => format!("{a} is armed"), None => "none is armed".to_owned() }
    )]
    NotArmed {
        workflow: String,
        version: WorkflowVersion,
        armed: Option<WorkflowVersion>,
    },
    #[error(
        "how old must a finished run be to go? give `--older-than DURATION` (e.g. `30d`), or set `[retention] keep-finished-ms` in the policy file"
    )]
    NoRetention,
    #[error("{0}")]
    BadId(#[from] poimen_store::IdParseError),
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Start(#[from] poimen_executor::StartError),
    #[error(transparent)]
    Run(#[from] poimen_executor::RunError),
    #[error(transparent)]
    Operator(#[from] poimen_executor::OperatorError),
    #[error(transparent)]
    Judgment(#[from] poimen_executor::JudgmentError),
    #[error("the plugin host could not start: {0}")]
    Sandbox(#[from] poimen_sandbox::BuildError),
    #[error("plugin: {0}")]
    Plugin(#[from] poimen_sandbox::LoadError),
    #[error("stored version {version} cannot be read back: {detail}")]
    Unreadable {
        version: WorkflowVersion,
        detail: String,
    },
    #[error(transparent)]
    Shadow(#[from] crate::shadow::ShadowError),
    #[error(
        "run {run} is still {status} after {}; wait longer (--timeout) or look at it with `poimen status {run}`",
        humantime_ms(.after)
    )]
    Timeout {
        run: RunId,
        status: RunStatus,
        after: std::time::Duration,
    },
    /// This host's task driving a started run stopped with an error.
    #[error("driving run {run} stopped: {cause}")]
    Driver {
        run: RunId,
        cause: Arc<poimen_executor::RunError>,
    },
    /// This host's task driving a started run ended without a result.
    #[error(
        "the task driving run {run} ended without a result (it panicked, or the runtime shut down); the run is as its episode says — `poimen resume {run}` drives it again"
    )]
    DriverDied { run: RunId },
}

fn humantime_ms(d: &std::time::Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn first<E: std::fmt::Display>(errors: &[E]) -> String {
    errors.first().map(|e| e.to_string()).unwrap_or_default()
}

impl From<CheckError> for Error {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Store(s) => Error::Store(s),
            CheckError::Unreadable {
                version, detail, ..
            } => Error::Unreadable { version, detail },
            CheckError::Invalid(errors) => Error::Invalid {
                workflow: String::new(),
                errors,
            },
        }
    }
}
