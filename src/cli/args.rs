//! The command line, parsed in one place (validated in `commands`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use poimen::{JudgmentId, RunId};

const AFTER_HELP: &str = "\
Exit codes:
  0  success (a run completed)
  1  a run failed or was cancelled
  2  usage: bad arguments or input, a missing file, an unknown run/version/judgment
  3  a workflow does not parse or validate
  4  a run is blocked (needs `poimen reconcile`) or waiting (needs `poimen judgment submit`)
  5  the environment failed (store, plugin host, disk)

Store: --store PATH|URL (or $POIMEN_STORE), else $POIMEN_HOME/poimen.db, else ./.poimen/poimen.db.
A URL postgres://USER@HOST:PORT/DB names a PostgreSQL database several hosts may share
(`poimen serve` on each); sqlite://PATH or a plain path names an SQLite file.";

/// poimen: a workflow kernel and WebAssembly plugin host.
#[derive(Debug, Parser)]
#[command(name = "poimen", version, about, after_help = AFTER_HELP, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every verb takes.
#[derive(Debug, Args)]
pub struct Global {
    /// The store: an SQLite file path (or sqlite://PATH), or a PostgreSQL
    /// URL (postgres://USER@HOST:PORT/DATABASE).
    #[arg(long, global = true, value_name = "PATH|URL", env = "POIMEN_STORE")]
    pub store: Option<String>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Also load the plugins (components) in this directory; repeatable.
    #[arg(long = "plugins", global = true, value_name = "DIR")]
    pub plugin_dirs: Vec<PathBuf>,
    /// The host's policy file (TOML): plugin grants and limits, which workflows may start, judgment defaults, bounds, durability, retention (docs/policy.md).
    #[arg(long, global = true, value_name = "FILE", env = "POIMEN_POLICY")]
    pub policy: Option<PathBuf>,
    /// Export the host's spans over OTLP (HTTP, protobuf) to URL/v1/traces, e.g. http://127.0.0.1:4318. A caller's W3C `traceparent` (HTTP header, MCP `_meta`) continues into its runs.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "OTEL_EXPORTER_OTLP_ENDPOINT"
    )]
    pub otlp_endpoint: Option<String>,
    /// Where compiled plugins are cached (default: `cache/` beside the store).
    #[arg(long, global = true, value_name = "DIR", env = "POIMEN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Do not register the bundled first-party plugins.
    #[arg(long, global = true)]
    pub no_bundled: bool,
    /// OpenAI-compatible endpoint for model steps, e.g. http://127.0.0.1:11434/v1.
    #[arg(long, global = true, value_name = "URL", env = "POIMEN_MODEL_URL")]
    pub model: Option<String>,
    /// Model name used when a step names none.
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        env = "POIMEN_MODEL_NAME",
        default_value = "llama3.2"
    )]
    pub model_name: String,
    /// Environment variable holding the endpoint's API key.
    #[arg(
        long,
        global = true,
        value_name = "VAR",
        default_value = "OPENAI_API_KEY"
    )]
    pub api_key_env: String,
    /// Send each step's reasoning effort to the endpoint.
    #[arg(long, global = true)]
    pub send_effort: bool,
    /// Answer model steps from a script of rules (JSON) instead of an endpoint.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "model")]
    pub model_script: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check workflow files; report every problem of every file.
    #[command(after_help = "Example: poimen validate flows/*.yaml --json")]
    Validate {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Also require eligibility for shadow evaluation.
        #[arg(long)]
        shadow: bool,
    },
    /// Print each file's workflow version (the hash of its meaning).
    #[command(after_help = "Example: poimen version flow.yaml flow.json")]
    Version {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Validate and publish a workflow version. A new version descends from
    /// the workflow's latest stored one unless --parent or --no-parent says
    /// otherwise.
    #[command(after_help = "Example: poimen publish flow.yaml --parent b3:1a2b3c")]
    Publish {
        file: PathBuf,
        /// The version this one derives from (default: the latest stored).
        #[arg(long, value_name = "VERSION", conflicts_with = "no_parent")]
        parent: Option<String>,
        /// Record no parent: this version starts a new history.
        #[arg(long)]
        no_parent: bool,
    },
    /// Arm a version: new runs of its workflow start on it; live runs of other versions are retired by their `unload` policy.
    #[command(after_help = "Example: poimen arm triage@b3:1a2b3c

VERSION is a full or abbreviated version, or `latest`. The version must load on this host and its workflow be enabled by the policy.")]
    Arm {
        /// `WORKFLOW_ID@VERSION`, or a version alone.
        #[arg(value_name = "ID@VERSION")]
        spec: String,
    },
    /// Disarm a workflow: no new run of it starts; its live runs are retired by their `unload` policy.
    #[command(after_help = "Example: poimen disarm triage")]
    Disarm { workflow: String },
    /// Delete finished runs older than an age: their episodes, intents, judgments, and the blobs nothing else refers to. Never versions, never unfinished runs.
    #[command(after_help = "Example: poimen gc --older-than 30d --dry-run

A run goes with its sub-workflow runs, once every one of them has ended (completed, failed or cancelled) and the top-level run ended longer ago than the age. Without --older-than, the policy's `[retention] keep-finished-ms` is the age. Freed idempotency keys may start new runs.")]
    Gc {
        /// How long ago a run must have finished to go (e.g. 30d, 12h).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// Say what would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Published workflows, or the version DAG of one.
    #[command(after_help = "Example: poimen versions triage")]
    Versions {
        /// Workflow id; all workflows when absent.
        workflow: Option<String>,
    },
    /// Print a version's canonical form.
    #[command(after_help = "Example: poimen show b3:1a2b3c")]
    Show {
        /// A version (or unique prefix), or `ID@latest`.
        #[arg(id = "target", value_name = "VERSION")]
        version: String,
    },
    /// Say in words what changed between two versions (or files).
    #[command(after_help = "Example: poimen diff b3:1a2b3c flow.yaml")]
    Diff { old: String, new: String },
    /// Print the JSON Schema of the workflow format (for editors).
    #[command(after_help = "Example: poimen schema > workflow.schema.json")]
    Schema,
    /// Run a candidate version on recorded runs of a baseline, in the sandbox, and compare.
    #[command(
        after_help = "Example: poimen shadow --candidate flow.yaml --baseline b3:1a2b3c --runs 50 --html report.html\n\nNothing is written to the live store; both versions must be sandbox-eligible (see `poimen plan`)."
    )]
    Shadow {
        /// The candidate: a workflow file (validated, not published) or a version.
        #[arg(long, value_name = "FILE|VERSION")]
        candidate: String,
        /// The baseline: a published version (or unique prefix, or ID@latest).
        #[arg(long, value_name = "VERSION")]
        baseline: String,
        /// The most recent N finished runs of the baseline (default 100).
        #[arg(long, value_name = "N", conflicts_with_all = ["since", "sample"])]
        runs: Option<u32>,
        /// Runs since a time: RFC 3339 (`2026-11-01T00:00:00Z`) or a duration ago (`24h`, `7d`).
        #[arg(long, value_name = "TIME", conflicts_with = "sample")]
        since: Option<String>,
        /// A deterministic sample of the baseline's runs, rate in 0..=1.
        #[arg(long, value_name = "RATE")]
        sample: Option<f64>,
        /// Model answers: replay (the baseline's answer to an identical
        /// request), live, or replay-or-live.
        #[arg(long, value_name = "MODE", default_value = "replay")]
        models: String,
        /// Tools that read the world (files, network): replay (the
        /// baseline's output for an identical call) or live.
        #[arg(long, value_name = "MODE", default_value = "replay")]
        tools: String,
        /// Shadow runs at once (default: the number of cores).
        #[arg(long, value_name = "N")]
        workers: Option<usize>,
        /// Also write a self-contained HTML report here.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Show the execution plan: steps in order, fan-outs, tools with digests, eligibility.
    #[command(after_help = "Example: poimen plan flow.yaml")]
    Plan { target: String },
    /// Run a workflow (a file, or a published version) on an input.
    #[command(after_help = "Example: poimen run flow.yaml --input '{\"text\": \"hello\"}'")]
    Run {
        target: String,
        /// Input JSON, or @FILE to read it from a file.
        #[arg(long, short, default_value = "{}")]
        input: String,
        /// Same key and input returns the existing run; another input is refused.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// The run's tenant (stored with it and its child runs).
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
    },
    /// Enqueue a run without driving it: a host serving the store (`poimen serve`) drives it.
    #[command(
        after_help = "Example: poimen start flow.yaml --input '{\"text\": \"hello\"}' && poimen status RUN --wait"
    )]
    Start {
        target: String,
        /// Input JSON, or @FILE to read it from a file.
        #[arg(long, short, default_value = "{}")]
        input: String,
        /// Same key and input returns the existing run; another input is refused.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// The run's tenant (stored with it and its child runs).
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
    },
    /// Serve the store: claim queued runs and runs whose host stopped, and drive them.
    #[command(
        after_help = "Example: poimen --store postgres://postgres@127.0.0.1:5432/poimen serve --workers 8

Stops on SIGTERM or Ctrl-C: claims nothing more, lets the runs it drives finish within --grace, then hands the rest back."
    )]
    Serve {
        /// Step executions (tool and model attempts) at once; ready steps beyond them wait, higher priority first.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        workers: u32,
        /// Runs driven at once (default: 4 per worker).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_runs: Option<u32>,
        /// Waiting steps from which the host is under `warn` pressure: new `low` runs are shed and nothing new is claimed (default: 4 per worker).
        #[arg(long, value_name = "N")]
        warn_queue: Option<usize>,
        /// Waiting steps from which the host is under `shed` pressure: new `normal` runs are shed too (default: 16 per worker).
        #[arg(long, value_name = "N")]
        shed_queue: Option<usize>,
        /// This host's id in run leases (default: serve-HOSTNAME-PID). Distinct per host.
        #[arg(long, value_name = "ID")]
        host_id: Option<String>,
        /// How long a lease lasts unrenewed: another host takes a run over this long after this one stops.
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
        lease_ttl: std::time::Duration,
        /// How often to look for runs to claim.
        #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = humantime::parse_duration)]
        poll: std::time::Duration,
        /// On shutdown, how long the runs being driven may take to finish.
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
        grace: std::time::Duration,
        /// Also serve the HTTP API (`/v1`, see docs/http-api.md) on this address, e.g. 127.0.0.1:8080 (port 0 picks a free one).
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
        /// A file holding the bearer token every HTTP request (but health and readiness) must carry; required when --http is not a loopback address.
        #[arg(long, value_name = "FILE", requires = "http")]
        token_file: Option<PathBuf>,
    },
    /// A run's status, or recent runs.
    #[command(after_help = "Example: poimen status WFR-01J... --wait --timeout 30s")]
    Status {
        run: Option<RunId>,
        /// Wait until the run completes, fails, blocks or waits for a judgment.
        #[arg(long, requires = "run")]
        wait: bool,
        /// With --wait: give up after this long (exit 5).
        #[arg(long, value_name = "DURATION", requires = "wait", value_parser = humantime::parse_duration)]
        timeout: Option<std::time::Duration>,
        /// How many recent runs to list.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// List only this tenant's runs.
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
    },
    /// A run's episode: every event, in order.
    #[command(after_help = "Example: poimen episode WFR-01J... --json")]
    Episode { run: RunId },
    /// A run's intents and hostcall records.
    #[command(after_help = "Example: poimen audit WFR-01J...")]
    Audit { run: RunId },
    /// Drive a stopped run again.
    #[command(after_help = "Example: poimen resume WFR-01J...")]
    Resume { run: RunId },
    /// Cancel a run.
    #[command(after_help = "Example: poimen cancel WFR-01J...")]
    Cancel { run: RunId },
    /// Run a failed run again from a step (by default the one that failed).
    #[command(after_help = "Example: poimen retry WFR-01J... --from fetch")]
    Retry {
        run: RunId,
        #[arg(long, value_name = "STEP")]
        from: Option<String>,
    },
    /// Decide the outcome of a tool call left unknown by a crash, and resume.
    #[command(
        after_help = "Example: poimen reconcile WFR-01J... charge --committed '{\"ok\": true}'"
    )]
    Reconcile {
        run: RunId,
        step: String,
        /// The call happened; its output (JSON, or @FILE).
        #[arg(
            long,
            value_name = "OUTPUT",
            conflicts_with = "failed",
            required_unless_present = "failed"
        )]
        committed: Option<String>,
        /// The call did not happen (or is to be treated as failed).
        #[arg(long, value_name = "REASON")]
        failed: Option<String>,
    },
    /// Judgment requests: list, show, submit.
    #[command(subcommand)]
    Judgment(JudgmentCmd),
    /// Plugins: list, inspect, add, call.
    #[command(subcommand)]
    Plugin(PluginCmd),
    /// Drive every run this store left in flight (after a crash).
    #[command(after_help = "Example: poimen recover")]
    Recover,
    /// Serve the Model Context Protocol over stdio.
    #[command(after_help = "Example: poimen mcp --store /srv/poimen.db")]
    Mcp,
    /// Print shell completions.
    #[command(after_help = "Example: poimen completions bash > /etc/bash_completion.d/poimen")]
    Completions { shell: Shell },
}

#[derive(Debug, Subcommand)]
pub enum JudgmentCmd {
    /// Open judgment requests.
    #[command(after_help = "Example: poimen judgment list")]
    List,
    /// One request: its sources with hashes, result schema, executor, request hash.
    #[command(after_help = "Example: poimen judgment show WFJ-01J...")]
    Show { id: JudgmentId },
    /// Submit a result; the engine validates it before the run resumes.
    #[command(after_help = "Example: poimen judgment submit WFJ-01J... --file answer.json")]
    Submit {
        id: JudgmentId,
        /// JSON: {\"request_hash\", \"result\", \"executor\"?, \"profile\"?, \"provenance\": {\"judge\": ...}}.
        #[arg(long, value_name = "RESULT")]
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum PluginCmd {
    /// Registered tools and verifiers.
    #[command(after_help = "Example: poimen plugin list")]
    List,
    /// A component's descriptor, actual imports, capabilities and eligibility.
    #[command(
        after_help = "Example: poimen plugin inspect target/wasm32-wasip2/release/my_tool.wasm"
    )]
    Inspect { file: PathBuf },
    /// Copy a component into the store's plugin directory under its digest.
    #[command(after_help = "Example: poimen plugin add my_tool.wasm")]
    Add {
        file: PathBuf,
        /// Replace an added component of the same name and version (another digest).
        #[arg(long)]
        replace: bool,
    },
    /// Remove an added component (every version, or NAME@VERSION).
    #[command(after_help = "Example: poimen plugin remove my-tool@0.1.0")]
    Remove { plugin: String },
    /// Invoke a tool through the host, with a hostcall record.
    #[command(
        after_help = "Example: poimen plugin call text '{\"op\": \"count\", \"pattern\": \"o\", \"text\": \"foo\"}'"
    )]
    Call {
        /// Tool name, optionally with a semver range (`text@^0.1`).
        tool: String,
        /// Arguments (JSON, or @FILE).
        #[arg(default_value = "{}")]
        args: String,
        /// Idempotency key handed to the tool.
        #[arg(long, default_value = "cli")]
        key: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
}
