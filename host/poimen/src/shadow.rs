//! Shadow evaluation: run a candidate workflow version on the inputs of
//! recorded runs of a baseline version, inside the sandbox, and compare.
//!
//! Isolation is structural, not a flag: every shadow run executes on its own
//! executor over its own in-memory store, so nothing a shadow run records can
//! reach the live store's runs, intents or judgments, and a shadow run can
//! never be resumed as a live one (no live host can find it). The live store
//! is only read. Effects are confined by eligibility: both versions must be
//! sandbox-eligible (no `http`, no `fs-write`, no non-idempotent tool), which
//! the validator decides at load; a tool's filesystem writes go to its
//! per-call scratch directory.
//!
//! Models are answered by [`ReplayModels`]: the baseline run's recorded
//! answer when the rendered prompt's hash matches, else the configured
//! provider (`--models live|replay-or-live`) or a failure naming the prompt
//! hash (`replay`). Judgments are replayed when the request hash matches;
//! otherwise the shadow run ends `waiting_judgment` and is reported so.
//!
//! The report's order never depends on completion order: runs are sorted by
//! score delta (regressions first), then by baseline run id. Fields that
//! measure time are listed in [`ShadowReport::volatile_fields`]; two
//! evaluations of the same runs are otherwise identical.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use futures::StreamExt;
use poimen_executor::episode::EpisodeEvent;
use poimen_executor::{
    Episode, Executor, Failure, FailureClass, ModelProvider, ModelRequest, ModelResponse,
    StartOptions, SystemClock,
};
use poimen_store::{MemoryStore, RunFilter, RunRecord, RunStatus, Store};
use poimen_workflow::{EligibilityReport, Validated, WorkflowVersion};
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where model steps of shadow runs get their answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelMode {
    /// Only the baseline's recorded answers (matched by prompt hash); a
    /// prompt with no recorded answer fails the step, naming its hash.
    #[default]
    Replay,
    /// Always the configured provider.
    Live,
    /// The recorded answer when there is one, else the provider.
    ReplayOrLive,
}

impl std::str::FromStr for ModelMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "replay" => Ok(ModelMode::Replay),
            "live" => Ok(ModelMode::Live),
            "replay-or-live" => Ok(ModelMode::ReplayOrLive),
            other => Err(format!(
                "`{other}` is not a model mode; use replay, live or replay-or-live"
            )),
        }
    }
}

/// Which recorded runs of the baseline to replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// The most recent `n` finished runs.
    Latest(u32),
    /// Finished runs created at or after this time (ms since the epoch).
    Since(i64),
    /// A deterministic sample: a run is in when the Blake3 of its id, read
    /// as a fraction of 2^64, is below `rate` (0..=1).
    Sample(f64),
}

/// How to evaluate.
#[derive(Clone)]
pub struct ShadowOptions {
    pub selection: Selection,
    pub models: ModelMode,
    /// How tools that read the world answer.
    pub tools: ToolMode,
    /// Shadow runs at once (at least 1).
    pub workers: usize,
    /// Called with `(0, total)` once the recorded runs are selected (before
    /// any shadow run), then after each finished shadow run with
    /// `(done, total)`.
    pub progress: Option<Arc<dyn Fn(usize, usize) + Send + Sync>>,
}

impl Default for ShadowOptions {
    fn default() -> Self {
        ShadowOptions {
            selection: Selection::Latest(100),
            models: ModelMode::Replay,
            tools: ToolMode::Replay,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: None,
        }
    }
}

impl std::fmt::Debug for ShadowOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowOptions")
            .field("selection", &self.selection)
            .field("models", &self.models)
            .field("tools", &self.tools)
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

/// Win, tie or loss of the candidate against the baseline on one run — or
/// neither, when the candidate's run could not be compared: a model request
/// had no recorded answer (replay mode) or a judgment was not replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ranking {
    Win,
    Tie,
    Loss,
    Incomparable,
}

/// One rubric criterion's scores on one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionScore {
    pub criterion: String,
    pub weight: f64,
    pub baseline: f64,
    pub candidate: f64,
    /// Why a score is 0 when the verifier could not score (no output, a
    /// verifier failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What one step did in one run, for the episode diff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    pub status: String,
    /// Executions (loops re-enter a step).
    pub executions: u32,
    /// Attempts over all executions.
    pub attempts: u32,
    /// Verifier verdicts, `name: pass|fail`, in recorded order.
    pub verdicts: Vec<String>,
    /// Receipt action (`tool:NAME@VERSION DIGEST`, `model:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_hash: Option<String>,
}

/// One step's difference between the two episodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum StepDiff {
    Added {
        step: String,
        candidate: StepSummary,
    },
    Removed {
        step: String,
        baseline: StepSummary,
    },
    Changed {
        step: String,
        /// Which of the summary's fields differ.
        fields: Vec<String>,
        baseline: StepSummary,
        candidate: StepSummary,
    },
}

/// Usage of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UsageCounts {
    pub tokens: u64,
    pub tool_calls: u64,
    pub step_executions: u64,
}

/// How model steps of a shadow run were answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModelAnswers {
    pub replayed: u32,
    pub live: u32,
    pub missing: u32,
}

/// The comparison on one recorded run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunComparison {
    /// The baseline run.
    pub run: String,
    pub input_hash: String,
    pub baseline_status: RunStatus,
    pub candidate_status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_reason: Option<String>,
    pub output_equal: bool,
    /// RFC 6902 operations turning the baseline's output into the candidate's.
    pub output_diff: Value,
    pub episode_diff: Vec<StepDiff>,
    pub baseline_usage: UsageCounts,
    pub candidate_usage: UsageCounts,
    /// Wall time of the baseline run, from its recorded timestamps (volatile).
    pub baseline_latency_ms: i64,
    /// Wall time of the shadow run (volatile).
    pub candidate_latency_ms: i64,
    pub models: ModelAnswers,
    /// The judgment steps whose recorded answer could not be replayed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreplayed_judgments: Vec<String>,
    /// The model steps whose request the baseline never made (replay mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_replayable: Vec<String>,
    /// How the candidate's world-reading tool calls were answered.
    pub tools: ToolAnswers,
    pub scores: Vec<CriterionScore>,
    pub baseline_score: f64,
    pub candidate_score: f64,
    pub delta: f64,
    pub verdict: Ranking,
}

/// Per-criterion aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionSummary {
    pub criterion: String,
    pub weight: f64,
    pub mean_baseline: f64,
    pub mean_candidate: f64,
}

/// Everything over all runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub runs: usize,
    pub wins: usize,
    pub ties: usize,
    pub losses: usize,
    /// Runs that could not be ranked (not replayable, judgment not replayed):
    /// neither wins, ties nor losses, and left out of the mean delta.
    pub incomparable: usize,
    pub outputs_equal: usize,
    pub mean_delta: f64,
    /// 95% bootstrap confidence interval of the mean delta (2 000
    /// resamples, seeded from the two versions: deterministic).
    pub ci95: (f64, f64),
    pub criteria: Vec<CriterionSummary>,
    pub waiting_judgment: usize,
}

/// The shadow evaluation's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowReport {
    pub workflow: String,
    pub baseline: WorkflowVersion,
    pub candidate: WorkflowVersion,
    /// The candidate is the baseline (it differs at most in formatting).
    pub same_version: bool,
    /// The semantic diff of the two versions, in words.
    pub version_diff: Vec<String>,
    pub models: ModelMode,
    pub tools: ToolMode,
    /// How the score is computed: `rubric` (weighted verifier scores) or
    /// `status` (1 for a completed run, 0 otherwise — no rubric declared).
    pub scoring: String,
    pub aggregate: Aggregate,
    /// Regressions first (most negative delta), then by run id.
    pub runs: Vec<RunComparison>,
    /// JSON paths of the fields that measure time and differ between two
    /// evaluations of the same runs; everything else is deterministic.
    pub volatile_fields: Vec<String>,
}

/// Why a shadow evaluation could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShadowError {
    #[error(
        "{0}; shadow evaluation runs only sandbox-eligible workflows — remove or replace each listed use, or evaluate another version"
    )]
    Ineligible(EligibilityReport),
    #[error(
        "the candidate is workflow `{candidate}` but the baseline is `{baseline}`: compare versions of one workflow"
    )]
    DifferentWorkflows { candidate: String, baseline: String },
    #[error(
        "no finished runs of baseline {baseline} match the selection ({selection}); run the baseline first, or widen --runs/--since/--sample"
    )]
    NoRuns { baseline: String, selection: String },
    #[error("the sample rate {0} is outside 0..=1")]
    BadRate(f64),
    #[error("the store failed while reading recorded runs: {0}")]
    Store(#[from] poimen_store::StoreError),
    #[error("recorded run {run} cannot be replayed: {detail}")]
    Unreadable { run: String, detail: String },
    #[error("the shadow executor failed on run {run}: {detail}")]
    Exec { run: String, detail: String },
}

/// What the evaluation reads and runs on.
pub(crate) struct Bench<'a> {
    pub live: Arc<dyn Store>,
    pub sandbox: poimen_sandbox::PluginHost,
    pub models: Arc<dyn ModelProvider>,
    pub live_executor: &'a Executor,
}

/// Runs a shadow evaluation. `baseline` and `candidate` are validated.
pub(crate) async fn evaluate(
    bench: Bench<'_>,
    baseline: &Validated,
    candidate: &Validated,
    opts: &ShadowOptions,
) -> Result<ShadowReport, ShadowError> {
    if candidate.def().id != baseline.def().id {
        return Err(ShadowError::DifferentWorkflows {
            candidate: candidate.def().id.to_string(),
            baseline: baseline.def().id.to_string(),
        });
    }
    // Refuse before anything runs.
    for v in [candidate, baseline] {
        if !v.eligibility().is_eligible() {
            return Err(ShadowError::Ineligible(v.eligibility().clone()));
        }
    }
    let selected = select(&*bench.live, baseline, &opts.selection).await?;
    if selected.is_empty() {
        return Err(ShadowError::NoRuns {
            baseline: baseline.version().to_string(),
            selection: format!("{:?}", opts.selection),
        });
    }
    // Everything the candidate's runs need, loaded once.
    let sub_versions = sub_workflow_versions(&*bench.live, candidate).await?;
    let rubric = if candidate.def().rubric.criteria.is_empty() {
        baseline.def().rubric.clone()
    } else {
        candidate.def().rubric.clone()
    };
    let total = selected.len();
    if let Some(p) = &opts.progress {
        p(0, total);
    }
    let done = Arc::new(AtomicU32::new(0));
    let workers = opts.workers.max(1);
    let mut results: Vec<(usize, Result<RunComparison, ShadowError>)> =
        futures::stream::iter(selected.into_iter().enumerate())
            .map(|(i, record)| {
                let bench = &bench;
                let sub_versions = &sub_versions;
                let rubric = &rubric;
                let done = done.clone();
                async move {
                    let r = one_run(bench, candidate, sub_versions, rubric, opts, record).await;
                    let n = done.fetch_add(1, Ordering::SeqCst) as usize + 1;
                    if let Some(p) = &opts.progress {
                        p(n, total);
                    }
                    (i, r)
                }
            })
            .buffer_unordered(workers)
            .collect()
            .await;
    results.sort_by_key(|(i, _)| *i);
    let mut runs = Vec::with_capacity(results.len());
    for (_, r) in results {
        runs.push(r?);
    }
    runs.sort_by(|a, b| {
        a.delta
            .partial_cmp(&b.delta)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.run.cmp(&b.run))
    });
    let aggregate = aggregate(&runs, &rubric, baseline.version(), candidate.version());
    Ok(ShadowReport {
        workflow: candidate.def().id.to_string(),
        baseline: baseline.version(),
        candidate: candidate.version(),
        same_version: baseline.version() == candidate.version(),
        version_diff: crate::diff::diff(baseline.def(), candidate.def())
            .iter()
            .map(|c| c.to_string())
            .collect(),
        models: opts.models,
        tools: opts.tools,
        scoring: if rubric.criteria.is_empty() {
            "status".into()
        } else {
            "rubric".into()
        },
        aggregate,
        runs,
        volatile_fields: vec![
            "runs[].baseline_latency_ms".into(),
            "runs[].candidate_latency_ms".into(),
        ],
    })
}

/// The finished top-level runs of the baseline version the selection names,
/// oldest first.
async fn select(
    live: &dyn Store,
    baseline: &Validated,
    selection: &Selection,
) -> Result<Vec<RunRecord>, ShadowError> {
    let mut runs: Vec<RunRecord> = live
        .list_runs(RunFilter {
            workflow_id: Some(baseline.def().id.clone()),
            ..RunFilter::default()
        })
        .await?
        .into_iter()
        .filter(|r| {
            r.version == baseline.version()
                && r.parent.is_none()
                && matches!(r.status, RunStatus::Completed | RunStatus::Failed)
        })
        .collect();
    runs.sort_by(|a, b| {
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.id.as_str().cmp(b.id.as_str()))
    });
    Ok(match selection {
        Selection::Latest(n) => {
            let skip = runs.len().saturating_sub(*n as usize);
            runs.into_iter().skip(skip).collect()
        }
        Selection::Since(t) => runs.into_iter().filter(|r| r.created_at >= *t).collect(),
        Selection::Sample(rate) => {
            if !(0.0..=1.0).contains(rate) {
                return Err(ShadowError::BadRate(*rate));
            }
            runs.into_iter()
                .filter(|r| {
                    let h = blake3::hash(r.id.as_str().as_bytes());
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&h.as_bytes()[..8]);
                    (u64::from_le_bytes(b) as f64 / u64::MAX as f64) < *rate
                })
                .collect()
        }
    })
}

/// The canonical bytes of every sub-workflow version the candidate runs.
async fn sub_workflow_versions(
    live: &dyn Store,
    candidate: &Validated,
) -> Result<Vec<(poimen_workflow::WorkflowId, Vec<u8>)>, ShadowError> {
    let mut out = Vec::new();
    let mut stack: Vec<&Validated> = vec![candidate];
    while let Some(v) = stack.pop() {
        for (step, version) in v.sub_workflow_versions() {
            if let Some(record) = live.version(&version).await? {
                out.push((record.workflow_id.clone(), record.canonical.clone()));
            }
            if let Some(child) = v.sub_workflow(&step) {
                stack.push(child);
            }
        }
    }
    Ok(out)
}

/// Evaluates the candidate on one recorded run.
async fn one_run(
    bench: &Bench<'_>,
    candidate: &Validated,
    sub_versions: &[(poimen_workflow::WorkflowId, Vec<u8>)],
    rubric: &poimen_workflow::RubricDef,
    opts: &ShadowOptions,
    record: RunRecord,
) -> Result<RunComparison, ShadowError> {
    let run = record.id.to_string();
    let unreadable = |detail: String| ShadowError::Unreadable {
        run: run.clone(),
        detail,
    };
    let input: Value = read_json(&*bench.live, &record.input_hash)
        .await?
        .ok_or_else(|| unreadable("its input blob is missing".into()))?;
    let baseline_output = match &record.output_hash {
        Some(h) => read_json(&*bench.live, h).await?,
        None => None,
    };
    let baseline_episode = bench
        .live_executor
        .episode(&record.id)
        .await
        .map_err(|e| unreadable(e.to_string()))?;
    // Recorded answers of the run and its child runs.
    let mut episodes = vec![baseline_episode.clone()];
    for child in bench.live.children(&record.id).await? {
        if let Ok(ep) = bench.live_executor.episode(&child.id).await {
            episodes.push(ep);
        }
    }
    let replay = Arc::new(ReplayModels::new(
        &episodes,
        bench.models.clone(),
        opts.models,
    ));
    let tools = Arc::new(ReplayTools::new(
        &episodes,
        crate::tools::SandboxTools::new(bench.sandbox.clone()),
        opts.tools,
        &run,
    ));
    let judgments = recorded_judgments(&episodes);

    // A private executor over a private in-memory store.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for (id, canonical) in sub_versions {
        store
            .publish_version(poimen_store::NewVersion::of(
                id.clone(),
                canonical.clone(),
                None,
                0,
            ))
            .await?;
    }
    let wiring = crate::wiring::Wiring::with_tools(
        store.clone(),
        bench.sandbox.clone(),
        tools.clone(),
        replay.clone(),
        Arc::new(SystemClock),
        poimen_executor::ExecutorConfig::host("shadow"),
    );
    let exec = &wiring.executor;
    let runnable = wiring.loader.runnable(candidate.clone());
    let exec_err = |e: &dyn std::fmt::Display| ShadowError::Exec {
        run: run.clone(),
        detail: e.to_string(),
    };
    let started = Instant::now();
    let mut outcome = exec
        .run(runnable, input.clone(), StartOptions::default())
        .await
        .map_err(|e| exec_err(&e))?;
    // Replay recorded judgments whose request hash matches.
    let mut unreplayed = Vec::new();
    while outcome.status == RunStatus::WaitingJudgment {
        let open = exec.open_judgments().await.map_err(|e| exec_err(&e))?;
        let Some((j, recorded)) = open
            .iter()
            .find_map(|j| judgments.get(&j.request_hash).map(|r| (j, r)))
        else {
            unreplayed.extend(open.iter().map(|j| j.step.to_string()));
            break;
        };
        let submission = poimen_executor::JudgmentSubmission {
            request_hash: j.request_hash.clone(),
            result: recorded.clone(),
            executor: j.request["executor"].as_str().map(str::to_owned),
            profile: j.request["profile"].as_str().map(str::to_owned),
            provenance: serde_json::json!({"judge": "shadow-replay", "replayed_from": run}),
        };
        outcome = exec
            .submit_judgment(j.id.as_str(), submission)
            .await
            .map_err(|e| exec_err(&e))?;
    }
    let candidate_latency_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let candidate_episode = exec.episode(&outcome.run).await.map_err(|e| exec_err(&e))?;

    let output_equal = baseline_output == outcome.output;
    let output_diff = serde_json::to_value(json_patch::diff(
        baseline_output.as_ref().unwrap_or(&Value::Null),
        outcome.output.as_ref().unwrap_or(&Value::Null),
    ))
    .unwrap_or(Value::Null);
    let episode_diff = episode_diff(&baseline_episode, &candidate_episode);

    // Rubric scores of both outputs, or status scores without a rubric.
    let mut scores = Vec::new();
    for c in &rubric.criteria {
        let (b, bn) = score(bench, c, &input, baseline_output.as_ref()).await;
        let (k, kn) = score(bench, c, &input, outcome.output.as_ref()).await;
        scores.push(CriterionScore {
            criterion: c.name.clone(),
            weight: c.weight,
            baseline: b,
            candidate: k,
            note: kn.or(bn),
        });
    }
    let (baseline_score, candidate_score) = if scores.is_empty() {
        (status_score(record.status), status_score(outcome.status))
    } else {
        (
            weighted(&scores, |s| s.baseline),
            weighted(&scores, |s| s.candidate),
        )
    };
    let delta = candidate_score - baseline_score;
    let missing = replay.missing();
    let not_replayable: Vec<String> = {
        let mut steps: Vec<String> = candidate_episode
            .events
            .iter()
            .filter_map(|r| match &r.event {
                EpisodeEvent::ModelRequested {
                    step, request_hash, ..
                } if missing.contains(request_hash) => Some(step.to_string()),
                _ => None,
            })
            .collect();
        steps.sort();
        steps.dedup();
        steps
    };
    let verdict = if !not_replayable.is_empty() || !unreplayed.is_empty() {
        Ranking::Incomparable
    } else if delta > 1e-9 {
        Ranking::Win
    } else if delta < -1e-9 {
        Ranking::Loss
    } else {
        Ranking::Tie
    };
    Ok(RunComparison {
        run,
        input_hash: record.input_hash.to_string(),
        baseline_status: record.status,
        candidate_status: outcome.status,
        candidate_reason: outcome.reason.clone(),
        output_equal,
        output_diff,
        episode_diff,
        baseline_usage: usage(&baseline_episode),
        candidate_usage: usage(&candidate_episode),
        baseline_latency_ms: latency(&baseline_episode),
        candidate_latency_ms,
        models: replay.answers(),
        unreplayed_judgments: unreplayed,
        not_replayable,
        tools: tools.answers(),
        scores,
        baseline_score,
        candidate_score,
        delta,
        verdict,
    })
}

async fn read_json(
    store: &dyn Store,
    hash: &poimen_store::BlobHash,
) -> Result<Option<Value>, ShadowError> {
    match store.blob(hash).await? {
        Some(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        None => Ok(None),
    }
}

fn status_score(status: RunStatus) -> f64 {
    if status == RunStatus::Completed {
        1.0
    } else {
        0.0
    }
}

fn weighted(scores: &[CriterionScore], pick: impl Fn(&CriterionScore) -> f64) -> f64 {
    let total: f64 = scores.iter().map(|s| s.weight).sum();
    if total <= 0.0 {
        return 0.0;
    }
    scores.iter().map(|s| s.weight * pick(s)).sum::<f64>() / total
}

/// One criterion's score of one output: the verifier's score, 0 with a note
/// when there is no output or the verifier could not score.
async fn score(
    bench: &Bench<'_>,
    c: &poimen_workflow::Criterion,
    input: &Value,
    output: Option<&Value>,
) -> (f64, Option<String>) {
    let Some(output) = output else {
        return (0.0, Some("no output".into()));
    };
    let inv = bench
        .sandbox
        .invoke_verifier(poimen_sandbox::VerifierRequest::new(
            c.verifier.clone(),
            input.clone(),
            output.clone(),
            c.config.clone(),
        ))
        .await;
    match inv.outcome {
        Ok(v) => (v.score.clamp(0.0, 1.0), None),
        Err(e) => (0.0, Some(format!("verifier `{}` failed: {e}", c.verifier))),
    }
}

/// Recorded judgment results by request hash.
fn recorded_judgments(episodes: &[Episode]) -> HashMap<String, Value> {
    let mut hashes = HashMap::new();
    let mut out = HashMap::new();
    for ep in episodes {
        for r in &ep.events {
            match &r.event {
                EpisodeEvent::JudgmentRequested {
                    request_id,
                    request_hash,
                    ..
                } => {
                    hashes.insert(request_id.clone(), request_hash.clone());
                }
                EpisodeEvent::JudgmentReceived {
                    request_id, result, ..
                } => {
                    if let Some(h) = hashes.get(request_id) {
                        out.insert(h.clone(), result.clone());
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn usage(ep: &Episode) -> UsageCounts {
    match poimen_executor::refold(ep) {
        Ok(state) => UsageCounts {
            tokens: state.spent.tokens,
            tool_calls: state.spent.tool_calls,
            step_executions: state.spent.step_executions,
        },
        Err(_) => UsageCounts::default(),
    }
}

fn latency(ep: &Episode) -> i64 {
    match (ep.events.first(), ep.events.last()) {
        (Some(a), Some(b)) => b.at - a.at,
        _ => 0,
    }
}

/// Per step: what it did, from the episode.
fn summaries(ep: &Episode) -> BTreeMap<String, StepSummary> {
    let mut out: BTreeMap<String, StepSummary> = BTreeMap::new();
    let blank = || StepSummary {
        status: String::new(),
        executions: 0,
        attempts: 0,
        verdicts: Vec::new(),
        action: None,
        input_hash: None,
        output_hash: None,
    };
    for r in &ep.events {
        match &r.event {
            EpisodeEvent::StepStarted { step, .. } => {
                out.entry(step.to_string()).or_insert_with(blank).executions += 1;
            }
            EpisodeEvent::AttemptStarted { step, .. } => {
                out.entry(step.to_string()).or_insert_with(blank).attempts += 1;
            }
            EpisodeEvent::Verified { step, verdicts, .. } => {
                let s = out.entry(step.to_string()).or_insert_with(blank);
                for v in verdicts {
                    let pass = v.passed();
                    s.verdicts.push(format!(
                        "{}: {}",
                        v.verifier.name,
                        if pass { "pass" } else { "fail" }
                    ));
                }
            }
            EpisodeEvent::StepFinished {
                step,
                status,
                receipt,
                ..
            } => {
                let s = out.entry(step.to_string()).or_insert_with(blank);
                s.status = serde_json::to_value(status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                if let Some(rc) = receipt {
                    s.action = Some(rc.action.clone());
                    s.input_hash = rc.input_hash.clone();
                    s.output_hash = rc.output_hash.clone();
                }
            }
            _ => {}
        }
    }
    out
}

/// Steps added, removed or changed between two episodes.
pub fn episode_diff(baseline: &Episode, candidate: &Episode) -> Vec<StepDiff> {
    let b = summaries(baseline);
    let c = summaries(candidate);
    let mut out = Vec::new();
    for (step, bs) in &b {
        match c.get(step) {
            None => out.push(StepDiff::Removed {
                step: step.clone(),
                baseline: bs.clone(),
            }),
            Some(cs) if cs != bs => {
                let mut fields = Vec::new();
                if bs.status != cs.status {
                    fields.push("status".into());
                }
                if bs.executions != cs.executions {
                    fields.push("executions".into());
                }
                if bs.attempts != cs.attempts {
                    fields.push("attempts".into());
                }
                if bs.verdicts != cs.verdicts {
                    fields.push("verdicts".into());
                }
                if bs.action != cs.action {
                    fields.push("action".into());
                }
                if bs.input_hash != cs.input_hash {
                    fields.push("input".into());
                }
                if bs.output_hash != cs.output_hash {
                    fields.push("output".into());
                }
                out.push(StepDiff::Changed {
                    step: step.clone(),
                    fields,
                    baseline: bs.clone(),
                    candidate: cs.clone(),
                });
            }
            Some(_) => {}
        }
    }
    for (step, cs) in &c {
        if !b.contains_key(step) {
            out.push(StepDiff::Added {
                step: step.clone(),
                candidate: cs.clone(),
            });
        }
    }
    out
}

fn aggregate(
    runs: &[RunComparison],
    rubric: &poimen_workflow::RubricDef,
    baseline: WorkflowVersion,
    candidate: WorkflowVersion,
) -> Aggregate {
    let n = runs.len();
    // An incomparable run has no meaningful delta.
    let deltas: Vec<f64> = runs
        .iter()
        .filter(|r| r.verdict != Ranking::Incomparable)
        .map(|r| r.delta)
        .collect();
    let m = deltas.len();
    let mean = |xs: &[f64]| {
        if xs.is_empty() {
            0.0
        } else {
            xs.iter().sum::<f64>() / xs.len() as f64
        }
    };
    let mean_delta = mean(&deltas);
    // Bootstrap, seeded from the two versions: the same evaluation gives the
    // same interval.
    let seed = blake3::hash(format!("{baseline}{candidate}").as_bytes());
    let mut rng = rand_pcg::Pcg64::from_seed(*seed.as_bytes());
    let mut means = Vec::with_capacity(2000);
    if m > 0 {
        for _ in 0..2000 {
            let s: f64 = (0..m).map(|_| deltas[rng.random_range(0..m)]).sum();
            means.push(s / m as f64);
        }
    }
    means.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let at = |q: f64| -> f64 {
        if means.is_empty() {
            return 0.0;
        }
        let i = ((means.len() - 1) as f64 * q).round() as usize;
        means[i.min(means.len() - 1)]
    };
    let criteria = rubric
        .criteria
        .iter()
        .map(|c| {
            let pick = |f: fn(&CriterionScore) -> f64| {
                let xs: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.scores.iter().find(|s| s.criterion == c.name).map(f))
                    .collect();
                mean(&xs)
            };
            CriterionSummary {
                criterion: c.name.clone(),
                weight: c.weight,
                mean_baseline: pick(|s| s.baseline),
                mean_candidate: pick(|s| s.candidate),
            }
        })
        .collect();
    Aggregate {
        runs: n,
        wins: runs.iter().filter(|r| r.verdict == Ranking::Win).count(),
        ties: runs.iter().filter(|r| r.verdict == Ranking::Tie).count(),
        losses: runs.iter().filter(|r| r.verdict == Ranking::Loss).count(),
        incomparable: runs
            .iter()
            .filter(|r| r.verdict == Ranking::Incomparable)
            .count(),
        outputs_equal: runs.iter().filter(|r| r.output_equal).count(),
        mean_delta,
        ci95: (at(0.025), at(0.975)),
        criteria,
        waiting_judgment: runs
            .iter()
            .filter(|r| r.candidate_status == RunStatus::WaitingJudgment)
            .count(),
    }
}

// ----------------------------------------------------------------- models

/// Answers model steps from a baseline run's recordings — only for a
/// request identical to a recorded one (everything that reaches the
/// provider, hashed: `ModelRequest::identity`), else from the configured
/// provider (live modes) or not at all (replay: the step is reported not
/// replayable, and the run cannot be ranked).
pub struct ReplayModels {
    recorded: HashMap<String, ModelResponse>,
    /// The baseline's provider and its default model, which a replaying
    /// host answers as (a host needs no model configured to replay).
    recorded_provider: Option<(String, String)>,
    live: Arc<dyn ModelProvider>,
    mode: ModelMode,
    replayed: AtomicU32,
    live_calls: AtomicU32,
    /// Request hashes asked for and not recorded (replay mode).
    missing: std::sync::Mutex<Vec<String>>,
}

impl std::fmt::Debug for ReplayModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayModels")
            .field("recorded", &self.recorded.len())
            .field("mode", &self.mode)
            .field("answers", &self.answers())
            .finish_non_exhaustive()
    }
}

impl ReplayModels {
    fn new(episodes: &[Episode], live: Arc<dyn ModelProvider>, mode: ModelMode) -> Self {
        let mut recorded = HashMap::new();
        let mut recorded_provider = None;
        for ep in episodes {
            for r in &ep.events {
                match &r.event {
                    EpisodeEvent::ModelRequested {
                        request,
                        default_model,
                        ..
                    } if recorded_provider.is_none() => {
                        if let Some(p) = request["provider"].as_str() {
                            recorded_provider = Some((p.to_owned(), default_model.clone()));
                        }
                    }
                    // Answers recorded before requests were have no request
                    // hash: they are never replayed (no false match).
                    EpisodeEvent::ModelCalled {
                        request_hash: Some(hash),
                        text,
                        model,
                        usage,
                        ..
                    } => {
                        recorded.entry(hash.clone()).or_insert(ModelResponse {
                            text: text.clone(),
                            model: model.clone(),
                            usage: *usage,
                        });
                    }
                    _ => {}
                }
            }
        }
        ReplayModels {
            recorded,
            recorded_provider,
            live,
            mode,
            replayed: AtomicU32::new(0),
            live_calls: AtomicU32::new(0),
            missing: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn missing(&self) -> Vec<String> {
        self.missing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn answers(&self) -> ModelAnswers {
        ModelAnswers {
            replayed: self.replayed.load(Ordering::SeqCst),
            live: self.live_calls.load(Ordering::SeqCst),
            missing: u32::try_from(self.missing().len()).unwrap_or(u32::MAX),
        }
    }

    /// Who the requests go to, as the replay compares them.
    fn identity(&self) -> (&str, &str) {
        match (&self.recorded_provider, self.mode) {
            (Some((p, m)), ModelMode::Replay) => (p, m),
            _ => (self.live.provider(), self.live.default_model()),
        }
    }
}

#[async_trait]
impl ModelProvider for ReplayModels {
    fn provider(&self) -> &str {
        self.identity().0
    }

    fn default_model(&self) -> &str {
        self.identity().1
    }

    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, Failure> {
        let (provider, default_model) = self.identity();
        let hash = poimen_executor::hash::hash_json(&request.identity(provider, default_model));
        if self.mode != ModelMode::Live
            && let Some(r) = self.recorded.get(&hash)
        {
            self.replayed.fetch_add(1, Ordering::SeqCst);
            return Ok(r.clone());
        }
        if self.mode == ModelMode::Replay {
            self.missing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(hash.clone());
            return Err(Failure::new(
                FailureClass::Unavailable,
                format!(
                    "not replayable: the baseline recorded no answer for request {hash} (the candidate asks something else: its prompt, system prompt, model, parameters or offered tools differ); use --models replay-or-live to ask the configured model"
                ),
            ));
        }
        self.live_calls.fetch_add(1, Ordering::SeqCst);
        self.live.complete(request).await
    }
}

// ------------------------------------------------------------------ tools

/// Where tool steps and verifiers of shadow runs get their outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolMode {
    /// A tool that reads the world (a filesystem mount, the network)
    /// answers an identical call (same component digest, same arguments)
    /// with the baseline's recorded output, so a difference comes from the
    /// candidate, not from the world changing since. A call the baseline
    /// never made runs live.
    ///
    /// A call whose outcome is a function of its component, arguments and
    /// limits alone (a pure tool or a verifier granted nothing:
    /// `PluginHost::repeatable`) is answered with the baseline's identical
    /// call, when it made one that succeeded under the same limits — and,
    /// for a tool, drew nothing from its random source (seeded by the call's
    /// idempotency key, which differs between runs). Making that call again
    /// would return the same bytes: this saves the guest's time, it changes
    /// no outcome.
    #[default]
    Replay,
    /// Every tool and verifier runs live, against the world as it is now.
    Live,
}

impl std::str::FromStr for ToolMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "replay" => Ok(ToolMode::Replay),
            "live" => Ok(ToolMode::Live),
            other => Err(format!("`{other}` is not a tool mode; use replay or live")),
        }
    }
}

/// How the tool and verifier calls of a shadow run were answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolAnswers {
    /// World-reading tool calls answered with the baseline's recorded output.
    pub replayed: u32,
    /// World-reading tool calls run live (`--tools live`, or a call the
    /// baseline never made).
    pub live: u32,
    /// Repeatable tool calls answered with the baseline's identical call
    /// (see [`ToolMode::Replay`]); the rest ran in the sandbox.
    #[serde(default)]
    pub reused: u32,
    /// Verifier calls answered with the baseline's identical call.
    #[serde(default)]
    pub verdicts_reused: u32,
}

/// What a repeatable call's outcome is a function of: the component, the
/// arguments' hash, and the limits but for the timeout.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RepeatKey {
    digest: String,
    args_hash: String,
    limits: poimen_sandbox::CallLimits,
}

impl RepeatKey {
    fn new(digest: &str, args_hash: String, mut limits: poimen_sandbox::CallLimits) -> Self {
        limits.timeout = std::time::Duration::ZERO;
        RepeatKey {
            digest: digest.to_owned(),
            args_hash,
            limits,
        }
    }

    /// The key of a recorded successful call, when its hostcall record says
    /// it was repeatable: it ran `digest` granted nothing, and (`tool`) drew
    /// no random words.
    fn recorded(digest: &str, args_hash: &str, record: &Value, tool: bool) -> Option<Self> {
        if record["tool"]["digest"].as_str() != Some(digest)
            || record["capabilities"]
                .as_array()
                .is_none_or(|c| !c.is_empty())
            || record["outcome"]["status"] != "ok"
            || (tool && record["baseline"]["random_words"].as_u64() != Some(0))
        {
            return None;
        }
        let limits = poimen_sandbox::CallLimits::deserialize(&record["limits"]).ok()?;
        Some(RepeatKey::new(digest, args_hash.to_owned(), limits))
    }
}

/// The sandbox's tools, with world-reading calls replayed from a baseline,
/// and repeatable calls the baseline made answered from its record.
struct ReplayTools {
    live: crate::tools::SandboxTools,
    /// Recorded outcomes by (component digest, arguments hash).
    recorded: HashMap<(String, String), (Result<Value, Failure>, Value)>,
    /// Recorded successful repeatable tool calls: output and record.
    repeats: HashMap<RepeatKey, (Value, Value)>,
    /// Recorded verdicts of repeatable verifier calls, and their records.
    verdicts: HashMap<RepeatKey, (poimen_executor::Verdict, Value)>,
    mode: ToolMode,
    baseline: String,
    replayed: AtomicU32,
    live_calls: AtomicU32,
    reused: AtomicU32,
    verdicts_reused: AtomicU32,
}

impl ReplayTools {
    fn new(
        episodes: &[Episode],
        live: crate::tools::SandboxTools,
        mode: ToolMode,
        baseline: &str,
    ) -> Self {
        let mut recorded = HashMap::new();
        let mut repeats = HashMap::new();
        let mut verdicts = HashMap::new();
        for ep in episodes {
            for r in &ep.events {
                match &r.event {
                    EpisodeEvent::ToolCalled {
                        tool,
                        args_hash,
                        outcome,
                        record,
                        reconciled: false,
                        ..
                    } => {
                        let outcome = outcome.clone().into_result();
                        if let (Ok(output), Some(key)) = (
                            &outcome,
                            RepeatKey::recorded(&tool.digest, args_hash, record, true),
                        ) {
                            repeats
                                .entry(key)
                                .or_insert_with(|| (output.clone(), record.clone()));
                        }
                        recorded
                            .entry((tool.digest.clone(), args_hash.clone()))
                            .or_insert((outcome, record.clone()));
                    }
                    EpisodeEvent::Verified { verdicts: vs, .. } => {
                        for v in vs {
                            let (
                                poimen_executor::episode::VerdictOutcome::Verdict(verdict),
                                Some(h),
                            ) = (&v.outcome, v.record["args_hash"].as_str())
                            else {
                                continue;
                            };
                            if let Some(key) =
                                RepeatKey::recorded(&v.verifier.digest, h, &v.record, false)
                            {
                                verdicts
                                    .entry(key)
                                    .or_insert_with(|| (verdict.clone(), v.record.clone()));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        ReplayTools {
            live,
            recorded,
            repeats,
            verdicts,
            mode,
            baseline: baseline.to_owned(),
            replayed: AtomicU32::new(0),
            live_calls: AtomicU32::new(0),
            reused: AtomicU32::new(0),
            verdicts_reused: AtomicU32::new(0),
        }
    }

    /// Whether a component reads the world: a filesystem mount or the network.
    fn reads_the_world(
        &self,
        tool: &poimen_executor::ToolIdentity,
    ) -> Option<Vec<poimen_workflow::Capability>> {
        let info =
            poimen_workflow::ToolRegistry::resolve_tool(&self.live.host.tools(), &exact(tool)?)
                .ok()?;
        let reads = info.capabilities.iter().any(|c| {
            matches!(
                c,
                poimen_workflow::Capability::FilesystemRead { .. }
                    | poimen_workflow::Capability::FilesystemWrite { .. }
                    | poimen_workflow::Capability::Http
            )
        });
        reads.then_some(info.capabilities)
    }

    /// The key of a call to `component` with arguments of `args_hash`, when
    /// the call is repeatable on this host.
    fn repeat_key(
        &self,
        kind: poimen_sandbox::PluginKind,
        component: &poimen_executor::ToolIdentity,
        args_hash: impl FnOnce() -> String,
    ) -> Option<RepeatKey> {
        if self.mode != ToolMode::Replay {
            return None;
        }
        let now = self
            .live
            .host
            .repeatable(kind, &exact(component)?, Some(&component.digest))?;
        Some(RepeatKey::new(&now.digest, args_hash(), now.limits))
    }

    fn answers(&self) -> ToolAnswers {
        ToolAnswers {
            replayed: self.replayed.load(Ordering::SeqCst),
            live: self.live_calls.load(Ordering::SeqCst),
            reused: self.reused.load(Ordering::SeqCst),
            verdicts_reused: self.verdicts_reused.load(Ordering::SeqCst),
        }
    }
}

/// The reference that resolves to exactly the pinned version of `tool`.
fn exact(tool: &poimen_executor::ToolIdentity) -> Option<poimen_workflow::ToolRef> {
    Some(poimen_workflow::ToolRef {
        name: tool.name.clone(),
        version: semver::VersionReq::parse(&format!("={}", tool.version)).ok()?,
    })
}

#[async_trait]
impl poimen_executor::ToolHost for ReplayTools {
    async fn invoke(&self, call: poimen_executor::ToolCall) -> poimen_executor::ToolResult {
        if let Some(capabilities) = self.reads_the_world(&call.tool) {
            if self.mode == ToolMode::Replay {
                let key = (
                    call.tool.digest.clone(),
                    poimen_executor::hash::hash_json(&call.args),
                );
                if let Some((outcome, record)) = self.recorded.get(&key) {
                    self.replayed.fetch_add(1, Ordering::SeqCst);
                    return poimen_executor::ToolResult {
                        outcome: outcome.clone(),
                        record: serde_json::json!({
                            "replayed_from": self.baseline,
                            "record": record,
                        }),
                        capabilities,
                    };
                }
            }
            self.live_calls.fetch_add(1, Ordering::SeqCst);
        } else if let Some(key) =
            self.repeat_key(poimen_sandbox::PluginKind::Tool, &call.tool, || {
                poimen_executor::hash::hash_json(&call.args)
            })
            && let Some((output, record)) = self.repeats.get(&key)
        {
            self.reused.fetch_add(1, Ordering::SeqCst);
            return poimen_executor::ToolResult {
                outcome: Ok(output.clone()),
                record: serde_json::json!({
                    "reused_from": self.baseline,
                    "record": record,
                }),
                capabilities: Vec::new(),
            };
        }
        self.live.invoke(call).await
    }

    fn effect_free(&self, tool: &poimen_executor::ToolIdentity) -> bool {
        self.live.effect_free(tool)
    }

    async fn verify(&self, call: poimen_executor::VerifierCall) -> poimen_executor::VerifierResult {
        if let Some(key) =
            self.repeat_key(poimen_sandbox::PluginKind::Verifier, &call.verifier, || {
                poimen_executor::hash::hash_json(&serde_json::json!({
                    "config": call.config,
                    "input": call.input,
                    "output": call.output,
                }))
            })
            && let Some((verdict, record)) = self.verdicts.get(&key)
        {
            self.verdicts_reused.fetch_add(1, Ordering::SeqCst);
            return poimen_executor::VerifierResult {
                outcome: Ok(verdict.clone()),
                record: serde_json::json!({
                    "reused_from": self.baseline,
                    "record": record,
                }),
            };
        }
        self.live.verify(call).await
    }
}

// ------------------------------------------------------------ rendering

/// The report as a terminal table.
pub fn render_text(r: &ShadowReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let a = &r.aggregate;
    let _ = writeln!(
        s,
        "shadow evaluation of `{}`: candidate {} against baseline {}{}",
        r.workflow,
        short(&r.candidate.to_string()),
        short(&r.baseline.to_string()),
        if r.same_version {
            " (the same version)"
        } else {
            ""
        }
    );
    for c in &r.version_diff {
        let _ = writeln!(s, "  ~ {c}");
    }
    let _ = writeln!(
        s,
        "{} run(s): {} win, {} tie, {} loss; outputs equal on {}; mean score delta {:+.4} (95% CI {:+.4} .. {:+.4}); scoring: {}",
        a.runs,
        a.wins,
        a.ties,
        a.losses,
        a.outputs_equal,
        a.mean_delta,
        a.ci95.0,
        a.ci95.1,
        r.scoring
    );
    if a.waiting_judgment > 0 {
        let _ = writeln!(
            s,
            "{} shadow run(s) stopped at a judgment that could not be replayed",
            a.waiting_judgment
        );
    }
    if a.incomparable > 0 {
        let _ = writeln!(
            s,
            "{} run(s) could not be compared (a model request the baseline never made, or a judgment not replayed): neither win, tie nor loss",
            a.incomparable
        );
    }
    for run in r.runs.iter().filter(|x| !x.not_replayable.is_empty()) {
        let _ = writeln!(
            s,
            "  {}: not replayable: {}",
            run.run,
            run.not_replayable.join(", ")
        );
    }
    let sum = |f: fn(&ToolAnswers) -> u32| r.runs.iter().map(|x| f(&x.tools)).sum::<u32>();
    let (replayed, live) = (sum(|t| t.replayed), sum(|t| t.live));
    let mode = match r.tools {
        ToolMode::Replay => "replay",
        ToolMode::Live => "live",
    };
    if replayed + live > 0 {
        let _ = writeln!(
            s,
            "tools that read the world: {replayed} call(s) answered from the baseline, {live} live (--tools {mode})",
        );
    }
    let (reused, verdicts) = (sum(|t| t.reused), sum(|t| t.verdicts_reused));
    if reused + verdicts > 0 {
        let _ = writeln!(
            s,
            "repeatable calls the baseline made identically: {reused} tool call(s) and {verdicts} verdict(s) taken from its record, not run again (--tools {mode})",
        );
    }
    for c in &a.criteria {
        let _ = writeln!(
            s,
            "  criterion {:<20} weight {:<5} baseline {:.3}  candidate {:.3}",
            c.criterion, c.weight, c.mean_baseline, c.mean_candidate
        );
    }
    let _ = writeln!(
        s,
        "{:<32} {:<6} {:>9} {:>9} {:>8} {:<7} steps changed",
        "run", "result", "baseline", "candidate", "delta", "output"
    );
    for run in &r.runs {
        let _ = writeln!(
            s,
            "{:<32} {:<6} {:>9.3} {:>9.3} {:>+8.3} {:<7} {}",
            run.run,
            format!("{:?}", run.verdict).to_lowercase(),
            run.baseline_score,
            run.candidate_score,
            run.delta,
            if run.output_equal { "same" } else { "differs" },
            run.episode_diff
                .iter()
                .map(|d| match d {
                    StepDiff::Added { step, .. } => format!("+{step}"),
                    StepDiff::Removed { step, .. } => format!("-{step}"),
                    StepDiff::Changed { step, fields, .. } => {
                        format!("~{step}({})", fields.join(","))
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    s
}

fn short(v: &str) -> String {
    v.chars().take(15).collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Ten-bin histogram of scores in 0..=1 as an inline SVG.
fn histogram(title: &str, baseline: &[f64], candidate: &[f64]) -> String {
    let bins = |xs: &[f64]| {
        let mut b = [0usize; 10];
        for x in xs {
            let i = ((x.clamp(0.0, 1.0) * 10.0) as usize).min(9);
            b[i] += 1;
        }
        b
    };
    let (bb, cb) = (bins(baseline), bins(candidate));
    let max = bb
        .iter()
        .chain(cb.iter())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut svg = format!(
        "<figure><figcaption>{}</figcaption><svg width=\"420\" height=\"140\" role=\"img\" aria-label=\"{}\">",
        esc(title),
        esc(title)
    );
    for i in 0..10 {
        let x = 10.0 + i as f64 * 40.0;
        let hb = bb[i] as f64 / max * 100.0;
        let hc = cb[i] as f64 / max * 100.0;
        svg.push_str(&format!(
            "<rect x=\"{x:.0}\" y=\"{:.1}\" width=\"16\" height=\"{hb:.1}\" fill=\"#8a9ba8\"><title>baseline {}–{}: {}</title></rect>",
            110.0 - hb,
            i as f64 / 10.0,
            (i + 1) as f64 / 10.0,
            bb[i]
        ));
        svg.push_str(&format!(
            "<rect x=\"{:.0}\" y=\"{:.1}\" width=\"16\" height=\"{hc:.1}\" fill=\"#2b6cb0\"><title>candidate {}–{}: {}</title></rect>",
            x + 17.0,
            110.0 - hc,
            i as f64 / 10.0,
            (i + 1) as f64 / 10.0,
            cb[i]
        ));
        svg.push_str(&format!(
            "<text x=\"{x:.0}\" y=\"128\" font-size=\"10\">{:.1}</text>",
            i as f64 / 10.0
        ));
    }
    svg.push_str("</svg></figure>");
    svg
}

/// The report as one self-contained HTML file (no scripts, no network).
pub fn render_html(r: &ShadowReport) -> String {
    let a = &r.aggregate;
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>poimen shadow evaluation</title><style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}pre{background:#f6f6f6;padding:.5em;overflow:auto}.loss{color:#b00}.win{color:#070}figure{display:inline-block;margin:1em}</style></head><body>",
    );
    h.push_str(&format!(
        "<h1>Shadow evaluation of <code>{}</code></h1><p>Candidate <code>{}</code> against baseline <code>{}</code>{}. Models: {:?}. Scoring: {}.</p>",
        esc(&r.workflow),
        esc(&r.candidate.to_string()),
        esc(&r.baseline.to_string()),
        if r.same_version { " (the same version)" } else { "" },
        r.models,
        esc(&r.scoring)
    ));
    h.push_str(&format!(
        "<h2>Summary</h2><table><tr><th>runs</th><th>wins</th><th>ties</th><th>losses</th><th>incomparable</th><th>outputs equal</th><th>mean delta</th><th>95% CI</th></tr><tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:+.4}</td><td>{:+.4} .. {:+.4}</td></tr></table>",
        a.runs, a.wins, a.ties, a.losses, a.incomparable, a.outputs_equal, a.mean_delta, a.ci95.0, a.ci95.1
    ));
    h.push_str("<h2>Score distributions</h2>");
    if a.criteria.is_empty() {
        let b: Vec<f64> = r.runs.iter().map(|x| x.baseline_score).collect();
        let c: Vec<f64> = r.runs.iter().map(|x| x.candidate_score).collect();
        h.push_str(&histogram(
            "status score (grey: baseline, blue: candidate)",
            &b,
            &c,
        ));
    }
    for crit in &a.criteria {
        let pick = |f: fn(&CriterionScore) -> f64| -> Vec<f64> {
            r.runs
                .iter()
                .filter_map(|x| {
                    x.scores
                        .iter()
                        .find(|s| s.criterion == crit.criterion)
                        .map(f)
                })
                .collect()
        };
        h.push_str(&histogram(
            &format!(
                "{} (weight {}; grey: baseline, blue: candidate)",
                crit.criterion, crit.weight
            ),
            &pick(|s| s.baseline),
            &pick(|s| s.candidate),
        ));
    }
    h.push_str("<h2>What changed between the versions</h2><ul>");
    if r.version_diff.is_empty() {
        h.push_str("<li>nothing: the candidate is the baseline</li>");
    }
    for c in &r.version_diff {
        h.push_str(&format!("<li>{}</li>", esc(c)));
    }
    h.push_str("</ul><h2>Worst regressions</h2>");
    let worst: Vec<&RunComparison> = r
        .runs
        .iter()
        .filter(|x| x.verdict == Ranking::Loss || !x.output_equal)
        .take(10)
        .collect();
    if worst.is_empty() {
        h.push_str("<p>None: no run lost or changed its output.</p>");
    }
    for x in worst {
        h.push_str(&format!(
            "<h3 class=\"{}\">{} — {:?}, delta {:+.3}</h3><p>baseline {:?}, candidate {:?}</p><h4>Output diff (RFC 6902)</h4><pre>{}</pre><h4>Episode diff</h4><pre>{}</pre>",
            if x.verdict == Ranking::Loss { "loss" } else { "win" },
            esc(&x.run),
            x.verdict,
            x.delta,
            x.baseline_status,
            x.candidate_status,
            esc(&serde_json::to_string_pretty(&x.output_diff).unwrap_or_default()),
            esc(&serde_json::to_string_pretty(&x.episode_diff).unwrap_or_default())
        ));
    }
    h.push_str("<h2>All runs</h2><table><tr><th>run</th><th>result</th><th>baseline</th><th>candidate</th><th>delta</th><th>output</th></tr>");
    for x in &r.runs {
        h.push_str(&format!(
            "<tr><td>{}</td><td>{:?}</td><td>{:.3}</td><td>{:.3}</td><td>{:+.3}</td><td>{}</td></tr>",
            esc(&x.run),
            x.verdict,
            x.baseline_score,
            x.candidate_score,
            x.delta,
            if x.output_equal { "same" } else { "differs" }
        ));
    }
    h.push_str("</table></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::RepeatKey;
    use serde_json::{Value, json};

    fn record() -> Value {
        json!({
            "tool": {"name": "text", "version": "0.1.0", "digest": "b3:aa", "wit_package": "poimen:plugin@0.1.0"},
            "capabilities": [],
            "limits": {"timeout_ms": 30000, "memory_bytes": 1, "fuel": 2, "output_bytes": 3},
            "baseline": {"wall_clock_reads": 0, "monotonic_clock_reads": 4, "random_words": 0, "stdout_bytes": 0, "stderr_bytes": 0},
            "outcome": {"status": "ok", "output_hash": "b3:bb", "output_bytes": 2},
        })
    }

    #[test]
    fn a_recorded_call_is_repeatable_only_as_its_record_shows() {
        let key = RepeatKey::recorded("b3:aa", "b3:args", &record(), true).expect("repeatable");
        assert_eq!(key.args_hash, "b3:args");
        // The timeout is not part of what the outcome depends on; the other
        // limits are (defaults where the record predates them).
        assert_eq!(key.limits.timeout, std::time::Duration::ZERO);
        assert_eq!((key.limits.memory_bytes, key.limits.fuel), (1, Some(2)));
        let mut other = record();
        other["limits"]["timeout_ms"] = json!(5);
        assert_eq!(
            RepeatKey::recorded("b3:aa", "b3:args", &other, true),
            Some(key.clone())
        );
        other["limits"]["fuel"] = json!(3);
        assert_ne!(
            RepeatKey::recorded("b3:aa", "b3:args", &other, true),
            Some(key)
        );

        let refused = |edit: fn(&mut Value), tool: bool| {
            let mut r = record();
            edit(&mut r);
            RepeatKey::recorded("b3:aa", "b3:args", &r, tool).is_none()
        };
        // Another component ran.
        assert!(refused(|r| r["tool"]["digest"] = json!("b3:cc"), true));
        // It was granted something: what it read may have changed.
        assert!(refused(
            |r| r["capabilities"] = json!([{"capability": "http"}]),
            true
        ));
        assert!(refused(|r| r["capabilities"] = Value::Null, true));
        // It failed (a failure may be the world's, e.g. a timeout).
        assert!(refused(
            |r| r["outcome"] = json!({"status": "error", "kind": "timeout", "message": ""}),
            true
        ));
        // A tool drew random words, seeded by its run's idempotency key; a
        // verifier's seed is its arguments, so its draws repeat.
        assert!(refused(|r| r["baseline"]["random_words"] = json!(2), true));
        assert!(!refused(
            |r| r["baseline"]["random_words"] = json!(2),
            false
        ));
        // Limits it cannot be sure of.
        assert!(refused(|r| r["limits"] = json!("?"), true));
    }
}
