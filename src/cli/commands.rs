//! The verbs: each reads its arguments, calls `poimen::Host`, and prints text
//! or (`--json`) JSON. Progress goes to stderr and only on a terminal.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::CommandFactory;
use poimen::sandbox::imports::Linked;
use poimen::{Host, ModelChoice, OpenAiConfig, Reconciliation, RunOutcome, RunStatus, Target};
use serde_json::{Value, json};

use super::args::{Cli, Command, Global, JudgmentCmd, PluginCmd, Shell};
use super::{Invalid, Usage, exit};

/// Runs one command; returns the exit code.
pub async fn run(cli: Cli) -> Result<u8> {
    let g = &cli.global;
    match cli.command {
        Command::Schema => {
            outln!(
                "{}",
                serde_json::to_string_pretty(&poimen::workflow::json_schema())?
            );
            Ok(exit::OK)
        }
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
                Shell::Elvish => clap_complete::Shell::Elvish,
                Shell::Powershell => clap_complete::Shell::PowerShell,
            };
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "poimen", &mut script);
            super::emit_bytes(&script);
            Ok(exit::OK)
        }
        Command::Version { files } => version(g, &files),
        Command::Serve {
            workers,
            max_runs,
            warn_queue,
            shed_queue,
            host_id,
            lease_ttl,
            poll,
            grace,
            http,
            token_file,
        } => {
            let http = match http {
                Some(addr) => Some(http_listener(addr, token_file.as_deref())?),
                None => None,
            };
            let id = host_id.unwrap_or_else(default_serve_id);
            let workers = workers as usize;
            let defaults = poimen::executor::SchedulerConfig::workers(workers);
            let serving = Serving {
                id: id.clone(),
                lease_ttl,
                workers,
                warn_queue: warn_queue.unwrap_or(defaults.warn_queue),
                shed_queue: shed_queue.unwrap_or(defaults.shed_queue),
            };
            if serving.shed_queue < serving.warn_queue {
                return Err(Usage(format!(
                    "--shed-queue {} is below --warn-queue {}: shedding `normal` runs starts at or after shedding `low` ones",
                    serving.shed_queue, serving.warn_queue
                ))
                .into());
            }
            let host = build_host_as(g, Some(serving)).await?;
            let runs = max_runs.map_or(workers.saturating_mul(4), |n| n as usize);
            serve(g, &host, &id, runs, poll, grace, http).await
        }
        command => {
            let host = if reads_only(&command) {
                build_reading_host(g).await?
            } else {
                build_host(g).await?
            };
            dispatch(g, &host, command).await
        }
    }
}

/// Where the store is: an SQLite file, or a PostgreSQL URL.
enum StoreAt {
    File(PathBuf),
    Url(String),
}

fn store_at(g: &Global) -> Result<StoreAt> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let home = std::env::var_os("POIMEN_HOME");
    let explicit = match g.store.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => match poimen::store::StoreUrl::parse(text)? {
            poimen::store::StoreUrl::Sqlite(path) => Some(path),
            poimen::store::StoreUrl::Postgres(url) => return Ok(StoreAt::Url(url)),
        },
    };
    Ok(StoreAt::File(
        poimen::store::StoreLocation::resolve(explicit.as_deref(), home.as_deref(), &cwd).path,
    ))
}

/// The local directory beside the store (for its plugins and compile
/// cache): the store file's directory, or — for a database — the one an
/// SQLite store would use (`$POIMEN_HOME`, else `./.poimen`).
fn local_dir(g: &Global) -> Result<PathBuf> {
    let path = match store_at(g)? {
        StoreAt::File(path) => path,
        StoreAt::Url(_) => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            let home = std::env::var_os("POIMEN_HOME");
            poimen::store::StoreLocation::resolve(None, home.as_deref(), &cwd).path
        }
    };
    Ok(path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

fn plugin_store_dir(g: &Global) -> Result<PathBuf> {
    Ok(local_dir(g)?.join("plugins"))
}

/// `serve-HOSTNAME-PID`: distinct for every serving process.
fn default_serve_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".to_owned());
    format!("serve-{host}-{}", std::process::id())
}

async fn build_host(g: &Global) -> Result<Host> {
    build_host_as(g, None).await
}

/// Verbs that only read the store: they never run a guest, so their host
/// loads no plugin (no compile, no `describe`) and starts in milliseconds.
fn reads_only(command: &Command) -> bool {
    matches!(
        command,
        Command::Status { .. }
            | Command::Episode { .. }
            | Command::Audit { .. }
            | Command::Versions { .. }
            | Command::Show { .. }
            | Command::Judgment(JudgmentCmd::List | JudgmentCmd::Show { .. })
    )
}

/// A host over the store alone, for [`reads_only`] verbs.
async fn build_reading_host(g: &Global) -> Result<Host> {
    let b = match store_at(g)? {
        StoreAt::File(path) => Host::builder().store_path(path),
        StoreAt::Url(url) => Host::builder().store_url(url),
    };
    // They write nothing of their own, so the open checks the file against
    // its header (a truncated store is refused) instead of every page
    // (`quick_check`, whose cost grows with the store): a damaged page a
    // verb reads is still reported by SQLite, as `Corrupt`.
    Ok(b.bundled_plugins(false)
        .store_check(poimen::OpenCheck::Header)
        .build()
        .await?)
}

/// What a serving host is configured with.
struct Serving {
    id: String,
    lease_ttl: Duration,
    workers: usize,
    warn_queue: usize,
    shed_queue: usize,
}

/// The host, as the `local` CLI host or as a serving host.
async fn build_host_as(g: &Global, serving: Option<Serving>) -> Result<Host> {
    let mut b = match store_at(g)? {
        StoreAt::File(path) => Host::builder().store_path(path),
        StoreAt::Url(url) => Host::builder()
            .store_url(url)
            .cache_dir(local_dir(g)?.join("cache")),
    }
    .bundled_plugins(!g.no_bundled)
    // A run driven away from its starter's request (claimed from the
    // queue, taken over) continues the trace the starter recorded.
    .trace_parent(crate::telemetry::continue_trace);
    if let Some(s) = serving {
        b = b
            .host_id(s.id)
            .lease_ttl(s.lease_ttl)
            .workers(s.workers)
            .pressure(s.warn_queue, s.shed_queue);
    }
    let added = plugin_store_dir(g)?;
    if added.is_dir() {
        b = b.plugin_dir(added);
    }
    for d in &g.plugin_dirs {
        b = b.plugin_dir(d.clone());
    }
    if let Some(p) = &g.policy {
        b = b.policy_file(p.clone());
    }
    if let Some(c) = &g.cache_dir {
        b = b.cache_dir(c.clone());
    }
    let model = match (&g.model, &g.model_script) {
        (Some(url), _) => ModelChoice::OpenAi(OpenAiConfig {
            base_url: url.clone(),
            model: g.model_name.clone(),
            api_key: std::env::var(&g.api_key_env).ok(),
            effort: if g.send_effort {
                poimen::EffortMode::Send
            } else {
                poimen::EffortMode::Omit
            },
        }),
        (None, Some(script)) => {
            let text = std::fs::read_to_string(script).map_err(|e| {
                Usage(format!(
                    "cannot read the model script {}: {e}",
                    script.display()
                ))
            })?;
            let rules: Vec<poimen::Rule> = serde_json::from_str(&text).map_err(|e| {
                Usage(format!(
                    "{}: not a model script ({e}); write a JSON list like [{{\"when\": \"classify\", \"answer\": \"bug\"}}]",
                    script.display()
                ))
            })?;
            ModelChoice::Scripted(rules)
        }
        (None, None) => ModelChoice::None,
    };
    Ok(b.model(model).build().await?)
}

/// Reads `@FILE` or inline JSON.
fn json_arg(text: &str, what: &str) -> Result<Value> {
    let (body, origin) = match text.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| Usage(format!("cannot read {what} file {path}: {e}")))?,
            path.to_owned(),
        ),
        None => (text.to_owned(), "the command line".to_owned()),
    };
    serde_json::from_str(&body).map_err(|e| {
        Usage(format!("{what} from {origin} is not valid JSON ({e}); quote it, e.g. --input '{{\"text\": \"hello\"}}'")).into()
    })
}

fn print_json(v: &impl serde::Serialize) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn version(g: &Global, files: &[PathBuf]) -> Result<u8> {
    let mut code = exit::OK;
    let mut rows = Vec::new();
    for f in files {
        match poimen::load_file(f) {
            Ok(l) => {
                if !g.json {
                    outln!("{}  {}", l.version, f.display());
                }
                rows.push(json!({"file": f, "workflow": l.def.id, "version": l.version}));
            }
            Err(e) => {
                code = code.max(super::exit_code_of(&e));
                eprintln!("error: {e}");
                rows.push(json!({"file": f, "error": e.to_string()}));
            }
        }
    }
    if g.json {
        print_json(&rows)?;
    }
    Ok(code)
}

async fn dispatch(g: &Global, host: &Host, command: Command) -> Result<u8> {
    match command {
        Command::Validate { files, shadow } => validate(g, host, &files, shadow).await,
        Command::Publish {
            file,
            parent,
            no_parent,
        } => {
            let loaded = host.load_file(&file)?;
            let parent = match (&parent, no_parent) {
                (Some(p), _) => poimen::Parent::Version(p),
                (None, true) => poimen::Parent::Root,
                (None, false) => poimen::Parent::Latest,
            };
            let p = host.publish(&loaded.def, parent).await?;
            if g.json {
                print_json(&p)?;
            } else {
                let what = if p.created {
                    "published"
                } else {
                    "already published (nothing written)"
                };
                outln!("{}  {} {what}", p.version, p.workflow);
                if let Some(parent) = p.parent {
                    outln!("  parent {parent}");
                }
                if let Some(ignored) = p.ignored_parent {
                    outln!(
                        "  note: the stored record keeps its parent; --parent {ignored} was not recorded"
                    );
                }
            }
            Ok(exit::OK)
        }
        Command::Arm { spec } => {
            let armed = host.arm(&spec).await?;
            print_armed(g, &armed)?;
            Ok(exit::OK)
        }
        Command::Disarm { workflow } => {
            let armed = host.disarm(&poimen::WorkflowId::from(workflow)).await?;
            print_armed(g, &armed)?;
            Ok(exit::OK)
        }
        Command::Gc {
            older_than,
            dry_run,
        } => {
            let r = host.gc(older_than, dry_run).await?;
            if g.json {
                print_json(&r)?;
            } else {
                let verb = if r.dry_run { "would free" } else { "freed" };
                outln!(
                    "{verb} {} runs: {} events, {} intent records, {} judgments, {} blobs ({} bytes)",
                    r.runs,
                    r.events,
                    r.intents,
                    r.judgments,
                    r.blobs,
                    r.blob_bytes
                );
            }
            Ok(exit::OK)
        }
        Command::Versions { workflow } => {
            match workflow {
                Some(w) => {
                    let w = poimen::WorkflowId::from(w);
                    let list = host.versions(&w).await?;
                    let armed = host.armed(&w).await?.and_then(|a| a.version);
                    if g.json {
                        let rows: Vec<Value> = list
                            .iter()
                            .map(|r| json!({"version": r.version, "parent": r.parent, "created_at": r.created_at, "armed": armed == Some(r.version)}))
                            .collect();
                        print_json(&rows)?;
                    } else {
                        for r in &list {
                            let mark = if armed == Some(r.version) {
                                "  armed"
                            } else {
                                ""
                            };
                            match r.parent {
                                Some(p) => outln!("{}  <- {}{mark}", r.version, p.short(12)),
                                None => outln!("{}  (root){mark}", r.version),
                            }
                        }
                    }
                }
                None => {
                    let list = host.workflows().await?;
                    if g.json {
                        print_json(&list)?;
                    } else if list.is_empty() {
                        outln!("no published workflows; `poimen publish FILE` publishes one");
                    } else {
                        for w in &list {
                            outln!(
                                "{:<32} {} version(s), latest {}",
                                w.workflow_id,
                                w.versions,
                                w.latest.short(12)
                            );
                        }
                    }
                }
            }
            Ok(exit::OK)
        }
        Command::Show { version } => {
            let (record, _) = host.find_version(&version).await?;
            if g.json {
                let v: Value = serde_json::from_slice(&record.canonical)?;
                print_json(
                    &json!({"version": record.version, "parent": record.parent, "workflow": record.workflow_id, "created_at": record.created_at, "canonical": v}),
                )?;
            } else {
                super::emit_bytes(&record.canonical);
                outln!();
            }
            Ok(exit::OK)
        }
        Command::Diff { old, new } => {
            let a = load_def(host, &old).await?;
            let b = load_def(host, &new).await?;
            let changes = poimen::diff::diff(&a, &b);
            if g.json {
                print_json(&changes)?;
            } else if changes.is_empty() {
                outln!("no changes: both are {}", poimen::workflow::version_of(&a));
            } else {
                outln!(
                    "{} -> {}",
                    poimen::workflow::version_of(&a).short(12),
                    poimen::workflow::version_of(&b).short(12)
                );
                for c in &changes {
                    outln!("  - {c}");
                }
            }
            Ok(exit::OK)
        }
        Command::Shadow {
            candidate,
            baseline,
            runs,
            since,
            sample,
            models,
            tools,
            workers,
            html,
        } => {
            let modes = (
                models.parse().map_err(Usage)?,
                tools.parse().map_err(Usage)?,
            );
            shadow_verb(
                g, host, &candidate, &baseline, runs, since, sample, modes, workers, html,
            )
            .await
        }
        Command::Plan { target } => {
            let plan = host.plan(&Target::parse(&target)).await?;
            if g.json {
                print_json(&plan)?;
            } else {
                print_plan(&plan);
            }
            Ok(exit::OK)
        }
        Command::Run {
            target,
            input,
            idempotency_key,
            tenant,
        } => {
            let input = json_arg(&input, "--input")?;
            let opts = poimen::RunOptions {
                idempotency_key,
                tenant,
                trace: None,
            };
            run_verb(g, host, &target, input, opts).await
        }
        Command::Start {
            target,
            input,
            idempotency_key,
            tenant,
        } => {
            let input = json_arg(&input, "--input")?;
            let target = Target::parse(&target);
            if let Target::File(p) = &target
                && !p.exists()
            {
                return Err(Usage(format!("{} does not exist", p.display())).into());
            }
            let opts = poimen::RunOptions {
                idempotency_key,
                tenant,
                trace: None,
            };
            let run = host.enqueue(&target, input, opts).await?;
            if g.json {
                print_json(&json!({"run": run, "status": "queued"}))?;
            } else {
                outln!("{run}");
            }
            Ok(exit::OK)
        }
        Command::Status {
            run: Some(run),
            wait: true,
            timeout,
            ..
        } => {
            host.wait(&run, timeout).await?;
            status(g, host, Some(&run), 0, None).await?;
            let (rec, _) = host.status(&run).await?;
            Ok(code_of(rec.status))
        }
        Command::Status {
            run, limit, tenant, ..
        } => status(g, host, run.as_ref(), limit, tenant.as_deref()).await,
        Command::Serve { .. } => Ok(exit::OK),
        Command::Episode { run } => {
            let episode = host.episode(&run).await?;
            if g.json {
                print_json(&episode)?;
            } else {
                for r in &episode.events {
                    outln!("{:>4}  {}", r.seq, describe_event(&r.event));
                }
            }
            Ok(exit::OK)
        }
        Command::Audit { run } => {
            let audit = host.audit(&run).await?;
            if g.json {
                print_json(&audit)?;
            } else {
                outln!("run {} ({})", audit.run.id, audit.run.status);
                outln!("intents:");
                for i in &audit.intents {
                    outln!(
                        "  {} #{} attempt {}  {:<10} {}@{} {}  key {}",
                        i.step,
                        i.iteration,
                        i.attempt,
                        i.phase.as_str(),
                        i.tool,
                        i.tool_version,
                        short(&i.digest),
                        i.idempotency_key
                    );
                }
                outln!("tool calls:");
                for c in &audit.tool_calls {
                    let outcome = match &c.outcome {
                        poimen::CallOutcome::Ok { .. } => "ok",
                        poimen::CallOutcome::Err { .. } => "err",
                    };
                    let host_calls = match &c.record {
                        poimen::CallRecord::Hostcall(r) => r.host_calls.len().to_string(),
                        poimen::CallRecord::Other(_) => "none (reconciled)".to_owned(),
                    };
                    outln!(
                        "  {} attempt {}: {} {} → {outcome}  host calls: {host_calls}",
                        c.step,
                        c.attempt,
                        c.tool.name,
                        short(&c.args_hash),
                    );
                }
                if audit.incomplete.is_empty() {
                    outln!("every tool call has its Pending/Dispatched/final intent records");
                } else {
                    outln!("incomplete intent records:");
                    for i in &audit.incomplete {
                        outln!("  {i}");
                    }
                }
            }
            Ok(exit::OK)
        }
        Command::Resume { run } => {
            let out = host.resume(&run).await?;
            finish(g, &out)
        }
        Command::Cancel { run } => {
            let rec = host.cancel(&run).await?;
            if g.json {
                print_json(&rec)?;
            } else {
                outln!("{} {}", rec.id, rec.status);
            }
            Ok(exit::OK)
        }
        Command::Retry { run, from } => {
            let from = from.map(poimen::StepId::from);
            let out = host.retry(&run, from.as_ref()).await?;
            finish(g, &out)
        }
        Command::Reconcile {
            run,
            step,
            committed,
            failed,
        } => {
            let decision = match (committed, failed) {
                (Some(c), _) => Reconciliation::Committed {
                    output: json_arg(&c, "--committed")?,
                },
                (None, Some(reason)) => Reconciliation::Failed { reason },
                (None, None) => {
                    return Err(Usage("give --committed OUTPUT or --failed REASON".into()).into());
                }
            };
            let out = host
                .reconcile(&run, &poimen::StepId::from(step), decision)
                .await?;
            finish(g, &out)
        }
        Command::Judgment(j) => judgment(g, host, j).await,
        Command::Plugin(p) => plugin(g, host, p).await,
        Command::Recover => {
            let outs = host.recover().await?;
            if g.json {
                let rows: Vec<Value> = outs.iter().map(outcome_json).collect();
                print_json(&rows)?;
            } else if outs.is_empty() {
                outln!("no runs were left in flight");
            } else {
                for o in &outs {
                    outln!("{} {}", o.run, o.status);
                }
            }
            Ok(exit::OK)
        }
        Command::Mcp => {
            crate::mcp::serve_stdio(host.clone()).await?;
            Ok(exit::OK)
        }
        Command::Schema | Command::Completions { .. } | Command::Version { .. } => Ok(exit::OK),
    }
}

async fn load_def(host: &Host, text: &str) -> Result<poimen::workflow::WorkflowDef> {
    Ok(match Target::parse(text) {
        Target::File(p) => host.load_file(&p)?.def,
        Target::Version(v) => host.find_version(&v).await?.1,
    })
}

async fn validate(g: &Global, host: &Host, files: &[PathBuf], shadow: bool) -> Result<u8> {
    let mut code = exit::OK;
    let mut report = Vec::new();
    for f in files {
        let loaded = match host.load_file(f) {
            Ok(l) => l,
            Err(e) => {
                code = code.max(super::exit_code_of(&e));
                if !g.json {
                    eprintln!("{}: {e}", f.display());
                }
                report.push(json!({"file": f, "valid": false, "errors": [{"code": "parse", "message": e.to_string()}]}));
                continue;
            }
        };
        match host.validate(&loaded.def).await {
            Ok(v) => {
                let eligible = v.eligibility().is_eligible();
                if shadow && !eligible {
                    code = code.max(exit::INVALID);
                    if !g.json {
                        eprintln!("{}: not eligible for shadow evaluation:", f.display());
                        for s in &v.eligibility().ineligible {
                            eprintln!("  - {}", serde_json::to_string(s)?);
                        }
                    }
                } else if !g.json {
                    outln!(
                        "{}: ok ({}){}",
                        f.display(),
                        loaded.version.short(12),
                        if eligible { ", shadow-eligible" } else { "" }
                    );
                }
                report.push(json!({"file": f, "valid": !shadow || eligible, "version": loaded.version, "eligibility": v.eligibility()}));
            }
            Err(poimen::Error::Invalid { errors, .. }) => {
                code = code.max(exit::INVALID);
                if !g.json {
                    eprintln!("{}: {} problem(s)", f.display(), errors.len());
                    for e in &errors {
                        eprintln!("  - {e}");
                    }
                }
                report.push(json!({"file": f, "valid": false, "errors": errors}));
            }
            Err(poimen::Error::Policy { violations, .. }) => {
                code = code.max(exit::INVALID);
                if !g.json {
                    eprintln!(
                        "{}: {} problem(s) with this host's policy",
                        f.display(),
                        violations.len()
                    );
                    for v in &violations {
                        eprintln!("  - {v}");
                    }
                }
                let policy: Vec<String> = violations.iter().map(ToString::to_string).collect();
                report.push(json!({"file": f, "valid": false, "policy": policy}));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if g.json {
        print_json(&report)?;
    }
    Ok(code)
}

fn print_plan(plan: &poimen::Plan) {
    outln!("{} {}", plan.workflow, plan.version);
    for s in &plan.steps {
        let indent = if s.owner.is_some() { "    " } else { "  " };
        let mut line = format!("{indent}{} ({})", s.id, s.kind);
        if !s.runs.is_empty() {
            line.push_str(&format!(
                " runs {}",
                s.runs
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(t) = &s.tool {
            line.push_str(&format!(
                " tool {}@{} {} [{}] {}",
                t.name,
                t.version,
                short(&t.digest),
                t.effect,
                caps(&t.capabilities)
            ));
        }
        for v in &s.verifiers {
            line.push_str(&format!(" verify {}@{}", v.name, v.version));
        }
        if let Some(v) = &s.sub_workflow {
            line.push_str(&format!(" child {}", v.short(12)));
        }
        if s.max_attempts > 1 {
            line.push_str(&format!(" retry ×{}", s.max_attempts));
        }
        outln!("{line}");
    }
    for (from, to, n) in &plan.loops {
        outln!("  loop {from} -> {to} at most {n} time(s)");
    }
    if plan.eligibility.is_eligible() {
        outln!("shadow evaluation: eligible");
    } else {
        outln!("shadow evaluation: not eligible");
        for s in &plan.eligibility.ineligible {
            outln!("  - {}", serde_json::to_string(s).unwrap_or_default());
        }
    }
}

fn caps(c: &[poimen::workflow::Capability]) -> String {
    if c.is_empty() {
        String::new()
    } else {
        c.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn short(h: &str) -> String {
    h.chars().take(15).collect()
}

fn outcome_json(o: &RunOutcome) -> Value {
    json!({"run": o.run, "status": o.status, "output": o.output, "reason": o.reason})
}

fn code_of(status: RunStatus) -> u8 {
    match status {
        RunStatus::Completed => exit::OK,
        RunStatus::Failed | RunStatus::Cancelled => exit::RUN_FAILED,
        RunStatus::Blocked | RunStatus::WaitingJudgment => exit::STOPPED,
        RunStatus::Running | RunStatus::Queued => exit::ERROR,
    }
}

/// Prints a run's outcome; the output last.
fn finish(g: &Global, out: &RunOutcome) -> Result<u8> {
    if g.json {
        print_json(&outcome_json(out))?;
    } else {
        match out.status {
            RunStatus::Completed => eprintln!("{} completed", out.run),
            RunStatus::WaitingJudgment => eprintln!(
                "{} is waiting for a judgment: {}\n  see `poimen judgment list`",
                out.run,
                out.reason.clone().unwrap_or_default()
            ),
            RunStatus::Blocked => eprintln!(
                "{} is blocked: {}",
                out.run,
                out.reason.clone().unwrap_or_default()
            ),
            other => eprintln!(
                "{} {other}: {}",
                out.run,
                out.reason.clone().unwrap_or_default()
            ),
        }
        if let Some(o) = &out.output {
            outln!("{}", serde_json::to_string_pretty(o)?);
        }
    }
    Ok(code_of(out.status))
}

async fn run_verb(
    g: &Global,
    host: &Host,
    target: &str,
    input: Value,
    opts: poimen::RunOptions,
) -> Result<u8> {
    let target = Target::parse(target);
    if let Target::File(p) = &target
        && !p.exists()
    {
        return Err(Usage(format!("{} does not exist", p.display())).into());
    }
    let handle = host.start(&target, input, opts).await?;
    let live = !g.json && std::io::stderr().is_terminal();
    if !g.json {
        // Machines get one document at the end.
        outln!("{}", handle.id());
    }
    let out = if live {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.enable_steady_tick(Duration::from_millis(120));
        // Steps as they are committed, until the run stops (it may stop
        // waiting or blocked, which does not end its event stream).
        let mut events = std::pin::pin!(handle.events(0));
        let mut next = 0u64;
        let wait = handle.wait();
        let mut wait = std::pin::pin!(wait);
        let out = loop {
            tokio::select! {
                out = &mut wait => break out?,
                Some(Ok(e)) = futures::StreamExt::next(&mut events) => {
                    next = e.seq + 1;
                    if let Some(line) = progress_line(&e.event) {
                        pb.println(line);
                    }
                }
            }
        };
        // What was committed after the last event shown.
        for r in host.episode(handle.id()).await?.events {
            if r.seq >= next
                && let Some(line) = progress_line(&r.event)
            {
                pb.println(line);
            }
        }
        pb.finish_and_clear();
        out
    } else {
        handle.wait().await?
    };
    finish(g, &out)
}

/// Awaits `work` — compiling and checking a component, which takes tens of
/// seconds for a language runtime — with a spinner and the elapsed time on
/// a terminal.
async fn compiling<T>(
    g: &Global,
    file: &Path,
    bytes: usize,
    work: impl std::future::Future<Output = T>,
) -> T {
    if g.json || !std::io::stderr().is_terminal() {
        return work.await;
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.set_message(format!(
        "compiling and checking {} ({:.1} MiB)…",
        file.display(),
        bytes as f64 / f64::from(1 << 20)
    ));
    pb.enable_steady_tick(Duration::from_millis(120));
    let out = work.await;
    pb.finish_and_clear();
    out
}

fn progress_line(e: &poimen::executor::EpisodeEvent) -> Option<String> {
    use poimen::executor::EpisodeEvent as E;
    Some(match e {
        E::StepStarted {
            step,
            iteration,
            kind,
            ..
        } => {
            if *iteration > 1 {
                format!("  ▸ {step} ({kind}, iteration {iteration})")
            } else {
                format!("  ▸ {step} ({kind})")
            }
        }
        E::StepFinished {
            step,
            status,
            failure,
            ..
        } => match failure {
            Some(f) => format!("  ✗ {step} {status:?}: {f}"),
            None => format!("  ✓ {step} {}", format!("{status:?}").to_lowercase()),
        },
        E::AttemptFinished {
            step,
            attempt,
            failure: Some(f),
            ..
        } => format!("    attempt {attempt} of {step} failed: {f}"),
        _ => return None,
    })
}

fn describe_event(e: &poimen::executor::EpisodeEvent) -> String {
    use poimen::executor::EpisodeEvent as E;
    match e {
        E::RunStarted {
            workflow_id,
            version,
            ..
        } => format!("run started: {workflow_id} {}", version.short(12)),
        E::ToolCalled {
            step,
            attempt,
            tool,
            outcome,
            ..
        } => format!(
            "tool call {step} attempt {attempt}: {}@{} {}",
            tool.name,
            tool.version,
            match outcome {
                poimen::executor::episode::CallOutcome::Ok { output_hash, .. } =>
                    format!("ok {}", short(output_hash)),
                poimen::executor::episode::CallOutcome::Err { failure } =>
                    format!("error: {failure}"),
            }
        ),
        E::ModelCalled {
            step, model, usage, ..
        } => {
            format!(
                "model call {step}: {model} ({} in, {} out)",
                usage.tokens_in, usage.tokens_out
            )
        }
        other => {
            let v = serde_json::to_value(other).unwrap_or(Value::Null);
            let mut s = other.kind().replace('_', " ");
            for k in [
                "step",
                "iteration",
                "attempt",
                "status",
                "reason",
                "chosen",
                "winners",
                "losers",
                "child_run",
                "request_id",
            ] {
                if let Some(x) = v.get(k)
                    && !x.is_null()
                {
                    s.push_str(&format!(" {k}={x}"));
                }
            }
            s
        }
    }
}

async fn status(
    g: &Global,
    host: &Host,
    run: Option<&poimen::RunId>,
    limit: u32,
    tenant: Option<&str>,
) -> Result<u8> {
    match run {
        Some(run) => {
            let (rec, state) = host.status(run).await?;
            if g.json {
                print_json(&json!({"run": rec, "state": state}))?;
            } else {
                outln!(
                    "{}  {}  {} {}",
                    rec.id,
                    rec.status,
                    rec.workflow_id,
                    rec.version.short(12)
                );
                if let Some(r) = &rec.reason {
                    outln!("  {r}");
                }
                for (id, s) in &state.steps {
                    outln!(
                        "  {id:<24} {:?} (iteration {}, attempt {})",
                        s.status,
                        s.iteration,
                        s.attempt
                    );
                }
                if let Some(o) = &state.output {
                    outln!("output: {}", serde_json::to_string(o)?);
                }
            }
            Ok(exit::OK)
        }
        None => {
            let runs = host.runs(limit, tenant).await?;
            if g.json {
                print_json(&runs)?;
            } else if runs.is_empty() {
                outln!("no runs yet; `poimen run FILE` starts one");
            } else {
                for r in &runs {
                    outln!("{}  {:<16} {}", r.id, r.status.as_str(), r.workflow_id);
                }
            }
            Ok(exit::OK)
        }
    }
}

/// Where `poimen serve --http` listens, and the token it requires.
struct HttpListener {
    addr: std::net::SocketAddr,
    config: poimen_server::ServerConfig,
}

/// Checks `--http ADDR [--token-file FILE]` before anything starts: a
/// listener beyond this machine must require a token.
fn http_listener(addr: std::net::SocketAddr, token_file: Option<&Path>) -> Result<HttpListener> {
    let token = match token_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Usage(format!(
                    "--token-file {}: cannot read it ({e})",
                    path.display()
                ))
            })?;
            let token = text.trim().to_owned();
            if token.is_empty() {
                return Err(Usage(format!(
                    "--token-file {} is empty: write the bearer token clients must send into it",
                    path.display()
                ))
                .into());
            }
            Some(token)
        }
    };
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(Usage(format!(
            "--http {addr} listens beyond this machine, and without a token anyone who reaches it could start and cancel runs; give --token-file FILE (a bearer token clients must send), or listen on a loopback address such as 127.0.0.1:{}",
            addr.port()
        ))
        .into());
    }
    Ok(HttpListener {
        addr,
        config: match token {
            Some(t) => poimen_server::ServerConfig::with_token(t),
            None => poimen_server::ServerConfig::open(),
        },
    })
}

/// `poimen serve`: drives runs until SIGTERM or Ctrl-C, and with `--http`
/// serves the HTTP API on the same host.
async fn serve(
    g: &Global,
    host: &Host,
    id: &str,
    runs: usize,
    poll: Duration,
    grace: Duration,
    http: Option<HttpListener>,
) -> Result<u8> {
    // One bound on runs at once for the serving loop and the API's
    // one-request starts, which drive their runs here at once.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(runs));
    let opts = poimen::executor::ServeOptions {
        workers: runs,
        poll,
        grace,
        slots: Some(slots.clone()),
    };
    let sched = host.scheduler();
    eprintln!(
        "poimen serve: host `{id}`, {} workers, up to {runs} runs at once; SIGTERM or Ctrl-C stops it",
        sched.workers
    );
    // One signal stops both the serving loop and the HTTP listener.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let http_task = match http {
        None => None,
        Some(HttpListener { addr, config }) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("poimen serve: cannot listen on {addr}"))?;
            let local = listener
                .local_addr()
                .with_context(|| format!("poimen serve: cannot read the address of {addr}"))?;
            eprintln!(
                "poimen serve: HTTP API on http://{local}/v1 and the console on http://{local}/{}",
                if config.token.is_some() {
                    " (token required)"
                } else {
                    ""
                }
            );
            // Runs started over HTTP go through this host's serving loop
            // (and its `--max-runs`), like runs started by `poimen start`;
            // one started with a wait is driven here at once when one of
            // the loop's slots is free, else queued for the loop too.
            let app = poimen_server::app(
                std::sync::Arc::new(host.clone()),
                config.queue_starts(true).run_slots(slots.clone()),
            )
            .layer(axum::middleware::from_fn(crate::telemetry::trace_context));
            let mut stopped = stopped.clone();
            // A response's last bytes go out at once, not after the
            // client's delayed ACK (Nagle held a finished run's event
            // stream ~40 ms on a kept-alive connection).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::warn!("cannot set TCP_NODELAY on a connection: {e}");
                }
            });
            Some(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            }))
        }
    };
    let signal = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("poimen serve: cannot listen for SIGTERM ({e}); Ctrl-C stops it");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let shutdown = async move {
        signal.await;
        let _ = stop.send(true);
    };
    let report = host.serve(opts, shutdown).await?;
    if let Some(task) = http_task {
        // Open event streams may outlive the grace period: they are cut.
        match tokio::time::timeout(grace, task).await {
            Ok(Ok(Err(e))) => eprintln!("poimen serve: the HTTP listener failed: {e}"),
            Ok(Err(e)) => eprintln!("poimen serve: the HTTP listener stopped: {e}"),
            Ok(Ok(Ok(()))) | Err(_) => {}
        }
    }
    let sched = host.scheduler();
    if g.json {
        print_json(&json!({
            "host": id,
            "driven": report.driven,
            "handed_back": report.handed_back,
            "scheduler": sched,
        }))?;
    } else {
        eprintln!(
            "poimen serve: stopped; drove {} run(s), handed back {}; {} step execution(s), shed {} low and {} normal run(s)",
            report.driven,
            report.handed_back.len(),
            sched.granted,
            sched.shed_low,
            sched.shed_normal
        );
    }
    Ok(exit::OK)
}

async fn judgment(g: &Global, host: &Host, cmd: JudgmentCmd) -> Result<u8> {
    match cmd {
        JudgmentCmd::List => {
            let list = host.judgments().await?;
            if g.json {
                print_json(&list)?;
            } else if list.is_empty() {
                outln!("no open judgment requests");
            } else {
                for j in &list {
                    outln!(
                        "{}  run {} step {}  {}",
                        j.id,
                        j.run,
                        j.step,
                        j.request["question"].as_str().unwrap_or("")
                    );
                }
            }
            Ok(exit::OK)
        }
        JudgmentCmd::Show { id } => {
            let j = host.judgment(&id).await?;
            if g.json {
                print_json(&j)?;
            } else {
                outln!("{} ({:?})  run {} step {}", j.id, j.status, j.run, j.step);
                outln!("request hash: {}", j.request_hash);
                outln!("{}", serde_json::to_string_pretty(&j.request)?);
                if let Some(r) = &j.result {
                    outln!("result: {}", serde_json::to_string(r)?);
                }
            }
            Ok(exit::OK)
        }
        JudgmentCmd::Submit { id, file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Usage(format!("cannot read {}: {e}", file.display())))?;
            let submission: poimen::executor::JudgmentSubmission = serde_json::from_str(&text).map_err(|e| {
                Usage(format!(
                    "{} is not a judgment submission ({e}); expected {{\"request_hash\": \"b3:…\", \"result\": …, \"provenance\": {{\"judge\": \"…\"}}}}",
                    file.display()
                ))
            })?;
            let out = host.submit_judgment(&id, submission).await?;
            finish(g, &out)
        }
    }
}

async fn plugin(g: &Global, host: &Host, cmd: PluginCmd) -> Result<u8> {
    match cmd {
        PluginCmd::List => {
            let mut rows = Vec::new();
            for e in host.tools().into_iter().chain(host.verifiers()) {
                rows.push(json!({
                    "kind": e.kind,
                    "name": e.info.name,
                    "version": e.info.version.to_string(),
                    "digest": e.info.digest,
                    "effect": e.info.effect,
                    "capabilities": e.info.capabilities,
                    "origin": e.origin,
                    "shadow_eligible": e.eligibility.is_ok(),
                    "status": "ready",
                }));
            }
            for w in host.withheld_plugins() {
                rows.push(json!({
                    "kind": w.kind,
                    "name": w.info.name,
                    "version": w.info.version.to_string(),
                    "digest": w.info.digest,
                    "effect": w.info.effect,
                    "capabilities": w.info.capabilities,
                    "origin": w.origin,
                    "shadow_eligible": false,
                    "status": "withheld",
                    "withheld": w.reason,
                }));
            }
            for r in host.refused_plugins() {
                rows.push(json!({
                    "origin": r.origin,
                    "status": "refused",
                    "refused": r.reason,
                }));
            }
            if g.json {
                print_json(&rows)?;
            } else {
                for r in &rows {
                    if let Some(why) = r["refused"].as_str() {
                        outln!("{:<10} {}", "refused", r["origin"].as_str().unwrap_or(""));
                        outln!("{:<10} {why}", "");
                        continue;
                    }
                    outln!(
                        "{:<10} {:<20} {:<8} {:<15} {:<15} {}",
                        r["kind"].as_str().unwrap_or(""),
                        r["name"].as_str().unwrap_or(""),
                        r["version"].as_str().unwrap_or(""),
                        r["effect"].as_str().unwrap_or(""),
                        short(r["digest"].as_str().unwrap_or("")),
                        r["origin"].as_str().unwrap_or("")
                    );
                    if let Some(why) = r["withheld"].as_str() {
                        outln!("{:<10} withheld: {why}", "");
                    }
                }
            }
            Ok(exit::OK)
        }
        PluginCmd::Inspect { file } => {
            let bytes = read_component(&file)?;
            let i = match compiling(g, &file, bytes.len(), host.inspect_plugin(bytes)).await {
                Ok(i) => i,
                // A component whose imports no host serves is a finding of
                // the inspection, not a failure to inspect.
                Err(poimen::Error::Plugin(
                    e @ poimen::sandbox::LoadError::UnknownImport { .. },
                )) => {
                    let problem = e.to_string();
                    if g.json {
                        print_json(&json!({
                            "file": file.display().to_string(),
                            "problems": [problem],
                        }))?;
                    } else {
                        outln!("{}", file.display());
                        outln!("  problem: {problem}");
                    }
                    return Ok(exit::INVALID);
                }
                Err(e) => return Err(e.into()),
            };
            if g.json {
                print_json(&i)?;
            } else {
                outln!(
                    "{} {} ({:?}, {})",
                    i.info.name,
                    i.info.version,
                    i.kind,
                    i.info.effect
                );
                outln!("  {}", i.info.description);
                outln!("  digest {}", i.info.digest);
                outln!(
                    "  declared capabilities: {}",
                    if i.info.capabilities.is_empty() {
                        "none".into()
                    } else {
                        caps(&i.info.capabilities)
                    }
                );
                outln!("  imports:");
                for imp in &i.imports {
                    outln!("    {} ({}: {})", imp.name, imp.class, imp.linked);
                }
                if i.imports.iter().any(|imp| imp.linked == Linked::Denied) {
                    outln!(
                        "  linked, denied: imports it does not declare a capability for are linked with nothing granted; every use is refused and recorded"
                    );
                }
                match &i.eligibility {
                    Ok(()) => outln!("  shadow evaluation: eligible"),
                    Err(why) => outln!(
                        "  shadow evaluation: not eligible: {}",
                        why.iter()
                            .map(|w| w.to_string())
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                }
            }
            Ok(exit::OK)
        }
        PluginCmd::Add { file, replace } => {
            let bytes = read_component(&file)?;
            let i = compiling(g, &file, bytes.len(), host.inspect_plugin(bytes.clone())).await?;
            let dir = plugin_store_dir(g)?;
            let (name, version) = (&i.info.name, i.info.version.to_string());
            let installed: Vec<poimen::sandbox::Entry> =
                host.tools().into_iter().chain(host.verifiers()).collect();
            // A first-party name is not for third parties: it would be served
            // for `NAME@^x` with the first-party grant.
            // (A bundled plugin withheld for want of a grant keeps its name.)
            let taken = installed
                .iter()
                .map(|e| (&e.info, &e.origin))
                .chain(
                    host.withheld_plugins()
                        .iter()
                        .map(|w| (&w.info, &w.origin))
                        .collect::<Vec<_>>(),
                )
                .find(|(info, origin)| &info.name == name && !Path::new(origin).starts_with(&dir))
                .map(|(info, origin)| (origin.clone(), info.version.to_string()));
            if let Some((origin, their_version)) = taken {
                return Err(Invalid(format!(
                    "{}: names itself `{name}`, which {origin} already provides ({name} {their_version}); rename the component (the `NAME` of its tool or verifier) — a first-party or embedder-given name cannot be taken",
                    file.display(),
                ))
                .into());
            }
            let same: Vec<&poimen::sandbox::Entry> = installed
                .iter()
                .filter(|e| &e.info.name == name && e.info.version.to_string() == version)
                .collect();
            if let Some(old) = same.iter().find(|e| e.info.digest != i.info.digest) {
                if !replace {
                    return Err(Invalid(format!(
                        "{name} {version} is already added with another component ({}, digest {}); add it under a new version, or pass --replace to replace that one (runs that pinned the old digest then fail naming it)",
                        old.origin,
                        short(&old.info.digest)
                    ))
                    .into());
                }
                for o in &same {
                    std::fs::remove_file(&o.origin)
                        .with_context(|| format!("cannot remove {}", o.origin))?;
                }
            }
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let hex = i.info.digest.trim_start_matches("b3:");
            let dest = dir.join(format!(
                "{}-{}.wasm",
                i.info.name,
                &hex[..hex.len().min(16)]
            ));
            if !dest.exists() {
                let tmp = dest.with_extension("wasm.tmp");
                std::fs::write(&tmp, &bytes)
                    .with_context(|| format!("cannot write {}", tmp.display()))?;
                std::fs::rename(&tmp, &dest)
                    .with_context(|| format!("cannot write {}", dest.display()))?;
            }
            if g.json {
                print_json(
                    &json!({"name": i.info.name, "version": i.info.version.to_string(), "digest": i.info.digest, "path": dest}),
                )?;
            } else {
                outln!(
                    "{} {} added as {}",
                    i.info.name,
                    i.info.version,
                    dest.display()
                );
            }
            Ok(exit::OK)
        }
        PluginCmd::Remove { plugin } => {
            let (name, version) = match plugin.split_once('@') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (plugin.clone(), None),
            };
            let dir = plugin_store_dir(g)?;
            let mut origins: Vec<(String, String)> = host
                .tools()
                .into_iter()
                .chain(host.verifiers())
                .map(|e| (e.info.name, e.info.version.to_string(), e.origin))
                .chain(
                    host.withheld_plugins()
                        .into_iter()
                        .map(|w| (w.info.name, w.info.version.to_string(), w.origin)),
                )
                .filter(|(n, v, _)| *n == name && version.as_ref().is_none_or(|want| want == v))
                .map(|(_, v, o)| (v, o))
                .collect();
            origins.sort();
            origins.dedup();
            if origins.is_empty() {
                return Err(Usage(format!(
                    "no plugin `{plugin}` is installed; `poimen plugin list` shows what is"
                ))
                .into());
            }
            if let Some((_, o)) = origins
                .iter()
                .find(|(_, o)| !Path::new(o).starts_with(&dir))
            {
                return Err(Usage(format!(
                    "`{plugin}` comes from {o}, not from this store's plugin directory {}: it cannot be removed here",
                    dir.display()
                ))
                .into());
            }
            let mut removed = Vec::new();
            for (v, o) in &origins {
                std::fs::remove_file(o).with_context(|| format!("cannot remove {o}"))?;
                removed.push(json!({"name": name, "version": v, "path": o}));
            }
            if g.json {
                print_json(&removed)?;
            } else {
                for r in &removed {
                    outln!(
                        "{} {} removed ({})",
                        name,
                        r["version"].as_str().unwrap_or(""),
                        r["path"].as_str().unwrap_or("")
                    );
                }
            }
            Ok(exit::OK)
        }
        PluginCmd::Call { tool, args, key } => {
            let args = json_arg(&args, "the arguments")?;
            let r: poimen::workflow::ToolRef = tool.parse().map_err(Usage)?;
            let inv = host.call_tool(r, args, key).await;
            match inv.outcome {
                Ok(output) => {
                    if g.json {
                        print_json(&json!({"output": output, "record": inv.record}))?;
                    } else {
                        outln!("{}", serde_json::to_string_pretty(&output)?);
                    }
                    Ok(exit::OK)
                }
                Err(e) => {
                    if g.json {
                        print_json(&json!({"error": e.to_string(), "record": inv.record}))?;
                    } else {
                        eprintln!("error: {e}");
                    }
                    Ok(exit::RUN_FAILED)
                }
            }
        }
    }
}

fn read_component(file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).map_err(|e| Usage(format!("cannot read {}: {e}", file.display())).into())
}

/// `poimen shadow`.
#[allow(clippy::too_many_arguments)]
async fn shadow_verb(
    g: &Global,
    host: &Host,
    candidate: &str,
    baseline: &str,
    runs: Option<u32>,
    since: Option<String>,
    sample: Option<f64>,
    (models, tools): (poimen::shadow::ModelMode, poimen::shadow::ToolMode),
    workers: Option<usize>,
    html: Option<PathBuf>,
) -> Result<u8> {
    use poimen::shadow::{Selection, ShadowOptions};
    let selection = match (runs, since, sample) {
        (_, Some(t), _) => Selection::Since(parse_since(&t)?),
        (_, None, Some(rate)) => Selection::Sample(rate),
        (n, None, None) => Selection::Latest(n.unwrap_or(100)),
    };
    let mut opts = ShadowOptions {
        selection,
        models,
        tools,
        ..ShadowOptions::default()
    };
    if let Some(w) = workers {
        opts.workers = w.max(1);
    }
    let bar = if std::io::stderr().is_terminal() && !g.json {
        let pb = indicatif::ProgressBar::new(0);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} shadow runs")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(pb)
    } else {
        None
    };
    if let Some(pb) = &bar {
        let pb = pb.clone();
        opts.progress = Some(std::sync::Arc::new(move |done, total| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }));
    }
    let report = host
        .shadow(&Target::parse(candidate), baseline, &opts)
        .await?;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if let Some(path) = &html {
        std::fs::write(path, poimen::shadow::render_html(&report))
            .with_context(|| format!("cannot write the HTML report to {}", path.display()))?;
    }
    if g.json {
        print_json(&report)?;
    } else {
        out!("{}", poimen::shadow::render_text(&report));
        if let Some(path) = &html {
            outln!("HTML report: {}", path.display());
        }
    }
    Ok(exit::OK)
}

/// `--since`: RFC 3339, or a duration ago.
fn parse_since(text: &str) -> Result<i64> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        return Ok(i64::try_from(ms).unwrap_or(i64::MAX));
    }
    match humantime::parse_duration(text) {
        Ok(d) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|n| n.as_millis())
                .unwrap_or(0);
            let ago = now.saturating_sub(d.as_millis());
            Ok(i64::try_from(ago).unwrap_or(i64::MAX))
        }
        Err(_) => Err(Usage(format!(
            "--since `{text}` is neither an RFC 3339 time (2026-11-01T00:00:00Z) nor a duration (24h, 7d)"
        ))
        .into()),
    }
}

/// What `arm` / `disarm` did, for people or as JSON.
fn print_armed(g: &Global, armed: &poimen::Armed) -> anyhow::Result<()> {
    if g.json {
        return print_json(armed);
    }
    match &armed.version {
        Some(v) => outln!("{v}  {} armed", armed.workflow),
        None => outln!("{} disarmed: no new run of it starts", armed.workflow),
    }
    if let Some(p) = armed.previous.as_ref().and_then(|p| p.version)
        && Some(p) != armed.version
    {
        outln!("  was {p}");
    }
    for r in &armed.retired {
        let what = match r.action {
            poimen::Retirement::Cancelled => "cancelled".to_owned(),
            poimen::Retirement::Draining { deadline: None } => "draining (may finish)".to_owned(),
            poimen::Retirement::Draining { deadline: Some(d) } => {
                let at =
                    std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(d).unwrap_or(0));
                format!(
                    "draining, cancelled if not over by {}",
                    humantime::format_rfc3339_millis(at)
                )
            }
            poimen::Retirement::Detached => "detached (runs on, pinned)".to_owned(),
        };
        outln!("  run {} on {}: {what}", r.run, r.version.short(12));
    }
    Ok(())
}
