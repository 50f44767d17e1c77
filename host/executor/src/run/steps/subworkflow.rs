//! A sub-workflow step: create the child run (once — the link is recorded
//! and followed on resume), drive it inside the parent's scope, and take its
//! end as the step's.

use std::sync::Arc;

use poimen_store::{RunId, RunStatus};
use poimen_workflow::{StepDef, SubWorkflowStep, VersionSelector};
use serde_json::Value;

use super::render_failure;
use crate::crash::crash_point;
use crate::effects::{Failure, FailureClass};
use crate::episode::{EpisodeEvent, ParentLink};
use crate::hash::hash_json;
use crate::kernel::MAX_SUBWORKFLOW_DEPTH;
use crate::render::{render_args, template_context};
use crate::run::attempt::AttemptId;
use crate::run::start::{CreateError, NewRunSpec, create, load, new_ulid};
use crate::run::{Batch, Halt, Inconsistency, RunCtx, RunOutcome, StatusChange, StepEnd};
use crate::scope::RunScope;

impl RunCtx {
    pub(in crate::run) async fn subworkflow_attempt(
        self: Arc<Self>,
        def: &StepDef,
        s: &SubWorkflowStep,
        at: AttemptId,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        // The child pinned at this run's start; a run recorded before runs
        // pinned their children uses the version the workflow resolved
        // when it was loaded.
        let snap = self.snapshot().await;
        let pinned = snap.subworkflows.get(&def.id).cloned();
        let version = pinned
            .as_ref()
            .map(|p| p.version)
            .or_else(|| self.runnable.subworkflows.get(&def.id).copied())
            .or(match &s.version {
                VersionSelector::Pinned(v) => Some(*v),
                VersionSelector::Latest => None,
            });
        let child = version.map(|v| (v, pinned.map(|p| p.pins)));
        self.child_attempt(def, child, &s.input.0, at, scope, || {
            Inconsistency::SubWorkflowUnresolved {
                step: def.id.clone(),
                workflow: s.id.to_string(),
            }
        })
        .await
    }

    /// A tool step whose tool is a workflow registered as a tool: the call
    /// is a child run of the pinned version, created once under its
    /// recorded intent and driven like a sub-workflow's, its arguments the
    /// child's input and its output the step's.
    pub(in crate::run) async fn workflow_tool_attempt(
        self: Arc<Self>,
        def: &StepDef,
        t: &poimen_workflow::ToolStep,
        version: poimen_workflow::WorkflowVersion,
        at: AttemptId,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        self.child_attempt(def, Some((version, None)), &t.args.0, at, scope, || {
            Inconsistency::NotPinned {
                what: "tool",
                name: t.tool.to_string(),
                step: def.id.clone(),
            }
        })
        .await
    }

    /// The child run of a step: created once (the link is recorded and
    /// followed on resume), driven inside the parent's scope, its end the
    /// step's. `child`: the version to run and what it pins (`None`: what
    /// it resolves when created).
    async fn child_attempt(
        self: Arc<Self>,
        def: &StepDef,
        child: Option<(
            poimen_workflow::WorkflowVersion,
            Option<crate::episode::Pins>,
        )>,
        input_template: &Value,
        at: AttemptId,
        scope: &RunScope,
        unresolved: impl FnOnce() -> Inconsistency,
    ) -> Result<StepEnd, Halt> {
        let iteration = at.iteration;
        let snap = self.snapshot().await;
        let st = snap.steps.get(&def.id);
        let link = st.and_then(|st| st.child.clone());
        let (child_run, version, lease) = match link {
            Some(l) => {
                if let Some((status, output)) = &l.finished {
                    return Ok(child_result(&l.run, *status, output.clone()).into());
                }
                (l.run, l.version, None)
            }
            None => {
                let Some((version, pins)) = child else {
                    return Err(unresolved().into());
                };
                let input = match render_args(input_template, &template_context(&snap)) {
                    Ok(i) => i,
                    Err(e) => return Ok(StepEnd::Failed(render_failure(e))),
                };
                // Creating the child is an intent: its id is durable before
                // it exists, so after any crash this step creates this one
                // child (or finds it), never a second.
                let requested = st
                    .filter(|st| st.iteration == iteration && st.attempt == at.attempt)
                    .and_then(|st| st.current.child_request.clone());
                let child_id = match requested {
                    Some((id, _)) => id,
                    None => {
                        let id = RunId::generate(new_ulid(self.kernel.clock.now_ms()));
                        self.commit(Batch::intents(
                            vec![EpisodeEvent::ChildRunRequested {
                                step: def.id.clone(),
                                iteration,
                                attempt: at.attempt,
                                child_run: id.clone(),
                                child_version: version,
                                input_hash: hash_json(&input),
                            }],
                            Vec::new(),
                        ))
                        .await?;
                        id
                    }
                };
                crash_point("after_child_requested");
                let parent = ParentLink {
                    run: self.run.clone(),
                    step: def.id.clone(),
                    iteration,
                };
                let spec = NewRunSpec {
                    runnable: match self.kernel.loader.load(&version).await {
                        Ok(r) => r,
                        Err(failure) => return Ok(StepEnd::Failed(failure)),
                    },
                    input,
                    parent: Some(parent),
                    idempotency_key: None,
                    id: Some(child_id),
                    pins,
                    tenant: self.scope.tenant.clone(),
                    hold: true,
                    admission: None,
                    // Driven inside this run's span.
                    trace: None,
                    // A child's creation is durable before it is linked.
                    waited: false,
                };
                let child = match self.create_child(spec).await {
                    Ok(c) => c,
                    Err(failure) => return Ok(StepEnd::Failed(failure)),
                };
                let (child, child_lease) = (child.run, child.lease);
                crash_point("after_child_created");
                self.commit(
                    Batch::events(vec![EpisodeEvent::ChildRunLinked {
                        step: def.id.clone(),
                        iteration,
                        child_run: child.clone(),
                        child_version: version,
                    }])
                    .durability(poimen_store::Durability::Sync),
                )
                .await?;
                (child, version, child_lease)
            }
        };
        let outcome = match self
            .drive_child(
                &child_run,
                version,
                scope.child_run(child_run.to_string()),
                lease,
            )
            .await
        {
            Ok(o) => o,
            Err(failure) => return Ok(StepEnd::Failed(failure)),
        };
        match outcome.status {
            RunStatus::Completed | RunStatus::Failed => {
                self.record(vec![EpisodeEvent::ChildRunFinished {
                    step: def.id.clone(),
                    iteration,
                    child_run: child_run.clone(),
                    status: outcome.status,
                    output: outcome.output.clone(),
                }])
                .await?;
                let mut r = child_result(&child_run, outcome.status, outcome.output);
                if let (Err(f), Some(reason)) = (&mut r, outcome.reason) {
                    f.message = format!("{}: {reason}", f.message);
                }
                Ok(r.into())
            }
            RunStatus::WaitingJudgment => {
                self.mark_waiting(format!("child run {child_run} waits for a judgment"))
                    .await?;
                Err(Halt::Waiting)
            }
            RunStatus::Blocked => {
                let reason = format!(
                    "child run {child_run} is blocked: {}",
                    outcome.reason.unwrap_or_default()
                );
                self.commit(Batch::status(
                    vec![EpisodeEvent::RunBlocked {
                        step: def.id.clone(),
                        iteration,
                        attempt: 0,
                        reason: reason.clone(),
                    }],
                    StatusChange::because(RunStatus::Blocked, reason),
                ))
                .await?;
                Err(Halt::Blocked)
            }
            RunStatus::Cancelled => Ok(scope.stopped().map_or(StepEnd::Cancelled, StepEnd::from)),
            RunStatus::Running | RunStatus::Queued => Err(Inconsistency::ChildStillRunning {
                child: child_run,
                reason: outcome.reason.unwrap_or_default(),
            }
            .into()),
        }
    }

    /// Creates the child run of a sub-workflow step, in the parent's store.
    async fn create_child(&self, spec: NewRunSpec) -> Result<crate::run::Started, Failure> {
        if self.depth + 1 > MAX_SUBWORKFLOW_DEPTH {
            return Err(Failure::new(
                FailureClass::InvalidInput,
                format!(
                    "sub-workflow nesting would exceed the kernel's bound of {MAX_SUBWORKFLOW_DEPTH}"
                ),
            ));
        }
        match create(&self.kernel, self.store.clone(), spec).await {
            Ok(s) => Ok(s),
            Err(CreateError::InvalidInput {
                workflow,
                violations,
            }) => Err(Failure::new(
                FailureClass::InvalidInput,
                format!("the child workflow `{workflow}` refuses its input: {violations}"),
            )),
            Err(e) => Err(Failure::new(FailureClass::Unavailable, e.to_string())),
        }
    }

    /// Drives a child run inside its parent's scope.
    async fn drive_child(
        &self,
        child: &RunId,
        version: poimen_workflow::WorkflowVersion,
        scope: RunScope,
        lease: Option<poimen_store::Lease>,
    ) -> Result<RunOutcome, Failure> {
        let runnable = self.kernel.loader.load(&version).await?;
        let ctx = load(
            &self.kernel,
            self.store.clone(),
            child,
            runnable,
            scope,
            self.depth + 1,
            lease,
        )
        .await
        .map_err(|e| Failure::new(FailureClass::Unavailable, e.to_string()))?;
        Ok(ctx.drive_registered().await)
    }

    /// Marks the run as waiting for a judgment (once).
    pub(in crate::run) async fn mark_waiting(
        &self,
        reason: String,
    ) -> Result<(), crate::run::CommitError> {
        if self.snapshot().await.status == Some(RunStatus::WaitingJudgment) {
            return Ok(());
        }
        self.commit(Batch::status(
            vec![EpisodeEvent::RunWaiting {
                reason: reason.clone(),
            }],
            StatusChange::because(RunStatus::WaitingJudgment, reason),
        ))
        .await
    }
}

fn child_result(run: &RunId, status: RunStatus, output: Option<Value>) -> Result<Value, Failure> {
    match status {
        RunStatus::Completed => Ok(output.unwrap_or(Value::Null)),
        other => Err(Failure::new(
            FailureClass::Failed,
            format!("child run {run} ended {other:?}"),
        )),
    }
}
