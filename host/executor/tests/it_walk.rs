//! The walk, tested through the executor's traits: scripted tools and
//! verifiers, a manual clock, an in-memory store, a scripted model. No
//! wasmtime, no database, no network — every case runs in milliseconds.
//!
//! One table of workflows with what each must come to (status, structure,
//! intents, clock), then the cases a table cannot say: cancellation in
//! flight, a judgment's pause and answer, an operator's retry. Every run's
//! live state is checked against a refold of its stored episode.
//! (`cargo test -p poimen-executor walk`.)

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use poimen_executor::model::{Rule, ScriptedProvider};
use poimen_executor::testing::{ManualClock, MemoryLoader, ScriptedTools};
use poimen_executor::{
    Executor, ExecutorConfig, FailureClass, JudgmentSubmission, Pressure, RunOutcome, StartOptions,
    StepStatus, TailBound, Verdict, assert_refold_identical, structure,
};
use poimen_store::{IntentPhase, MemoryStore, RunStatus, Store};
use poimen_workflow::*;
use serde_json::{Value, json};

// ---------------------------------------------------------------- harness

/// Waits until a tool call is in flight (a bounded wait: a run that never
/// makes its call fails the test instead of hanging it).
async fn until_in_flight(tools: &ScriptedTools) {
    for _ in 0..100_000 {
        if tools.in_flight() > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("no tool call was ever in flight");
}

struct Kernel {
    store: Arc<MemoryStore>,
    tools: Arc<ScriptedTools>,
    clock: Arc<ManualClock>,
    loader: Arc<MemoryLoader>,
    exec: Executor,
}

/// A child workflow around a call that hangs.
fn hangs() -> WorkflowDef {
    WorkflowDef::new("t.hangs")
        .with_step(StepDef::tool("c", r("hang"), json!(null)).with_timeout(Millis(600_000)))
}

/// A child workflow that answers its input back through `echo`.
fn echoes() -> WorkflowDef {
    WorkflowDef::new("t.echoes").with_step(StepDef::tool(
        "c",
        r("echo"),
        json!({"got": "{{ inputs.n }}"}),
    ))
}

fn tools() -> ScriptedTools {
    ScriptedTools::new()
        .workflow_tool("t.hangs", poimen_workflow::canonical::version_of(&hangs()))
        .workflow_tool(
            "t.echoes",
            poimen_workflow::canonical::version_of(&echoes()),
        )
        .echo("echo")
        .flaky("flaky", 2, FailureClass::Failed)
        .flaky("broken", u32::MAX, FailureClass::Failed)
        .flaky("picky", u32::MAX, FailureClass::InvalidInput)
        .hanging("hang")
        .timing_out("slow")
        .verifier("nonempty", |call| Verdict {
            pass: call.output != json!({}) && !call.output.is_null(),
            score: 1.0,
            reason: "the output is empty".into(),
        })
        .verifier("never", |_| Verdict {
            pass: false,
            score: 0.0,
            reason: "never satisfied".into(),
        })
}

fn kernel_with(tools: ScriptedTools, clock: Arc<ManualClock>) -> Kernel {
    let store = Arc::new(MemoryStore::new());
    let tools = Arc::new(tools);
    let loader = MemoryLoader::new();
    let models = Arc::new(ScriptedProvider::new(vec![
        Rule::contains("Classify", "billing"),
        Rule::contains("", "ok"),
    ]));
    let exec = Executor::new(
        store.clone(),
        tools.clone(),
        models,
        clock.clone(),
        loader.clone(),
        ExecutorConfig::default(),
    );
    Kernel {
        store,
        tools,
        clock,
        loader,
        exec,
    }
}

fn kernel() -> Kernel {
    kernel_with(tools(), ManualClock::auto(1_000_000))
}

fn r(name: &str) -> ToolRef {
    format!("{name}@^1").parse().expect("tool ref")
}

impl Kernel {
    fn add(&self, def: &WorkflowDef) -> Arc<poimen_executor::Runnable> {
        self.loader
            .add(def, &self.tools)
            .unwrap_or_else(|e| panic!("{} does not validate: {e:?}", def.id))
    }

    async fn run(&self, def: &WorkflowDef, input: Value) -> RunOutcome {
        let runnable = self.add(def);
        let out = self
            .exec
            .run(runnable, input, StartOptions::default())
            .await
            .expect("the run starts");
        self.check_refold(&out).await;
        out
    }

    /// Starts a run of `def` and drives it on a task of its own.
    async fn start_driven(
        &self,
        def: &WorkflowDef,
    ) -> (
        poimen_store::RunId,
        tokio::task::JoinHandle<Result<RunOutcome, poimen_executor::RunError>>,
    ) {
        let runnable = self.add(def);
        let started = self
            .exec
            .start(runnable, json!({}), StartOptions::default())
            .await
            .expect("start");
        let exec = self.exec.clone();
        let run = started.run.clone();
        let driver = tokio::spawn(async move { exec.resume(&run).await });
        (started.run, driver)
    }

    async fn check_refold(&self, out: &RunOutcome) {
        let episode = self.exec.episode(&out.run).await.expect("episode");
        assert_refold_identical(&out.state, &episode).expect("refold equals the live state");
    }

    async fn structure(&self, out: &RunOutcome) -> Vec<String> {
        structure(&self.exec.episode(&out.run).await.expect("episode"))
    }

    async fn phases(&self, out: &RunOutcome, step: &str) -> Vec<IntentPhase> {
        self.store
            .intents(&out.run)
            .await
            .expect("intents")
            .into_iter()
            .filter(|i| i.step.as_str() == step)
            .map(|i| i.phase)
            .collect()
    }
}

fn one_tool(tool: &str) -> WorkflowDef {
    WorkflowDef::new("t.one").with_step(StepDef::tool("a", r(tool), json!({"x": 1})))
}

fn retried(tool: &str, attempts: u32) -> WorkflowDef {
    WorkflowDef::new("t.retry").with_step(
        StepDef::tool("a", r(tool), json!({"x": 1}))
            .with_retry(RetryPolicy::attempts(attempts).with_backoff(Millis(100))),
    )
}

fn parallel(join: JoinPolicy, second: &str) -> WorkflowDef {
    WorkflowDef::new("t.par")
        .with_state(
            "seen",
            StateDecl::reduced(Reducer::Append).with_schema(json!({"type": "array"})),
        )
        .with_step(StepDef::parallel("fan", ["left", "right"]).with_join(join))
        .with_step(StepDef::tool("left", r("echo"), json!("L")).with_writes("seen"))
        .with_step(StepDef::tool("right", r(second), json!("R")).with_writes("seen"))
}

fn conditional() -> WorkflowDef {
    WorkflowDef::new("t.cond")
        .with_inputs(json!({"type": "object", "properties": {"go": {"type": "boolean"}}}))
        .with_step(StepDef::conditional("route", "inputs.go", "yes").with_otherwise("no"))
        .with_step(StepDef::tool("yes", r("echo"), json!("took yes")))
        .with_step(StepDef::tool("no", r("echo"), json!("took no")))
}

fn looped() -> WorkflowDef {
    WorkflowDef::new("t.loop")
        .with_step(StepDef::tool("a", r("echo"), json!(1)))
        .with_step(StepDef::tool("b", r("echo"), json!(2)))
        .with_edge("a", "b")
        .with_transition(Transition::back("b", "a", NonZeroU32::new(2).expect("2")))
}

/// `a` then `b`, with a back-edge from `b` to `a` taken at most `max`
/// times while `when` holds.
fn looped_when(max: u32, when: &str) -> WorkflowDef {
    WorkflowDef::new("t.when")
        .with_step(StepDef::tool("a", r("echo"), json!(1)))
        .with_step(StepDef::tool("b", r("echo"), json!(2)))
        .with_edge("a", "b")
        .with_loop("b", "a", NonZeroU32::new(max).expect("max"), Some(when))
}

fn chain(n: usize) -> WorkflowDef {
    let mut def = WorkflowDef::new("t.chain");
    for i in 0..n {
        def = def.with_step(StepDef::tool(
            format!("s{i}").as_str(),
            r("echo"),
            json!({ "i": i }),
        ));
        if i > 0 {
            def = def.with_edge(format!("s{}", i - 1), format!("s{i}"));
        }
    }
    def
}

// ------------------------------------------------------------------ table

/// What a case must come to.
struct Expect {
    status: RunStatus,
    /// Text the run's reason must contain.
    reason: Option<&'static str>,
    output: Option<Value>,
    /// Lines the episode's structure must contain, in this order.
    structure: &'static [&'static str],
    /// Intent phases of step `a`, if checked.
    intents_of_a: Option<&'static [IntentPhase]>,
    /// Sleeps the run asked the clock for.
    slept_ms: &'static [u64],
    /// Calls the scripted tools received.
    tool_calls: usize,
}

const NONE: Expect = Expect {
    status: RunStatus::Completed,
    reason: None,
    output: None,
    structure: &[],
    intents_of_a: None,
    slept_ms: &[],
    tool_calls: 0,
};

fn cases() -> Vec<(&'static str, WorkflowDef, Value, Expect)> {
    use IntentPhase::*;
    vec![
        (
            "tool step: three intents and a first-class tool call",
            one_tool("echo"),
            json!({}),
            Expect {
                output: Some(json!({"x": 1})),
                structure: &[
                    "step_started step=a iteration=1",
                    "tool_called step=a iteration=1 attempt=1",
                    "step_finished step=a iteration=1 status=completed",
                    "run_completed",
                ],
                intents_of_a: Some(&[Pending, Dispatched, Committed]),
                tool_calls: 1,
                ..NONE
            },
        ),
        (
            "retries with backoff under the clock, then success",
            retried("flaky", 3),
            json!({}),
            Expect {
                output: Some(json!({"x": 1})),
                structure: &[
                    "attempt_finished step=a iteration=1 attempt=1",
                    "attempt_started step=a iteration=1 attempt=2",
                    "attempt_started step=a iteration=1 attempt=3",
                    "step_finished step=a iteration=1 status=completed",
                ],
                intents_of_a: Some(&[
                    Pending, Dispatched, Failed, Pending, Dispatched, Failed, Pending, Dispatched,
                    Committed,
                ]),
                slept_ms: &[100, 200],
                tool_calls: 3,
                ..NONE
            },
        ),
        (
            "retries exhausted fail the run naming the step",
            retried("broken", 2),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("step `a` failed: failed: scripted failure 2"),
                structure: &[
                    "step_finished step=a iteration=1 status=failed",
                    "run_failed",
                ],
                slept_ms: &[100],
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "invalid input is never retried",
            retried("picky", 3),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("invalid input: scripted failure 1"),
                tool_calls: 1,
                ..NONE
            },
        ),
        (
            "parallel join all: both branches, writes in branch order",
            parallel(JoinPolicy::All, "echo"),
            json!({}),
            Expect {
                output: Some(json!({"left": "L", "right": "R"})),
                structure: &[
                    "branches_forked step=fan iteration=1",
                    "branches_joined step=fan iteration=1",
                    "state_written",
                    "state_written",
                    "step_finished step=fan iteration=1 status=completed",
                ],
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "parallel join any: the hanging loser is cancelled",
            parallel(JoinPolicy::Any, "hang"),
            json!({}),
            Expect {
                output: Some(json!({"left": "L"})),
                structure: &[
                    "step_finished step=right iteration=1 status=lost",
                    "branches_joined step=fan iteration=1",
                ],
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "parallel join all fails when a branch fails",
            parallel(JoinPolicy::All, "broken"),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("1 of 2 needed branches succeeded"),
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "conditional: the then arm, the other skipped",
            conditional(),
            json!({"go": true}),
            Expect {
                output: Some(json!("took yes")),
                structure: &[
                    "condition_evaluated step=route iteration=1",
                    "step_finished step=no iteration=0 status=skipped",
                    "step_finished step=yes iteration=1 status=completed",
                ],
                tool_calls: 1,
                ..NONE
            },
        ),
        (
            "conditional: the otherwise arm",
            conditional(),
            json!({"go": false}),
            Expect {
                output: Some(json!("took no")),
                structure: &["step_finished step=yes iteration=0 status=skipped"],
                tool_calls: 1,
                ..NONE
            },
        ),
        (
            "a bounded loop runs its body again",
            looped(),
            json!({}),
            Expect {
                structure: &[
                    "step_finished step=b iteration=1 status=completed",
                    "loop_iterated",
                    "step_started step=a iteration=2",
                    "loop_iterated",
                    "step_started step=a iteration=3",
                    "step_finished step=b iteration=3 status=completed",
                ],
                tool_calls: 6,
                ..NONE
            },
        ),
        (
            "a verifier's rejection retries, then fails the run",
            WorkflowDef::new("t.verify").with_step(
                StepDef::tool("a", r("echo"), json!({"x": 1}))
                    .with_verifier(r("never"), Value::Null)
                    .with_retry(RetryPolicy::attempts(2)),
            ),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("`never` rejected it: never satisfied"),
                structure: &[
                    "verified step=a iteration=1 attempt=1",
                    "verified step=a iteration=1 attempt=2",
                ],
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "a tool-call budget stops the run before the call over it",
            chain(3).with_budget(BudgetDef {
                tool_calls: Some(2),
                ..BudgetDef::default()
            }),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("the run may make 2 tool calls and step `s2` would make one more"),
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "a step limit stops the run",
            chain(3).with_limits(Limits {
                steps: Some(2),
                ..Limits::default()
            }),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("the run has executed 2 steps, its limit is 2"),
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "a deadline passed during backoff fails the run at the next step",
            retried("flaky", 3)
                .with_step(StepDef::tool("b", r("echo"), json!(2)))
                .with_edge("a", "b")
                .with_limits(Limits {
                    deadline: Some(Millis(250)),
                    ..Limits::default()
                }),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some(
                    "deadline exceeded: the run started 300 ms ago and its limit is 250 ms",
                ),
                slept_ms: &[100, 200],
                tool_calls: 3,
                ..NONE
            },
        ),
        (
            "parallel join quorum: the first two of three win, the hanging one is lost",
            WorkflowDef::new("t.quorum")
                .with_step(
                    StepDef::parallel("fan", ["left", "mid", "right"])
                        .with_join(JoinPolicy::Quorum(2)),
                )
                .with_step(StepDef::tool("left", r("echo"), json!("L")))
                .with_step(StepDef::tool("mid", r("echo"), json!("M")))
                .with_step(StepDef::tool("right", r("hang"), json!("R"))),
            json!({}),
            Expect {
                output: Some(json!({"left": "L", "mid": "M"})),
                structure: &[
                    "step_finished step=right iteration=1 status=lost",
                    "branches_joined step=fan iteration=1",
                ],
                tool_calls: 3,
                ..NONE
            },
        ),
        (
            "a token budget stops the run at the step after it is spent",
            WorkflowDef::new("t.tokens")
                .with_step(StepDef::model("m1", "Classify: {{ inputs.text }}"))
                .with_step(StepDef::model("m2", "Summarize it"))
                .with_edge("m1", "m2")
                .with_budget(BudgetDef {
                    tokens: Some(2),
                    ..BudgetDef::default()
                }),
            json!({"text": "refund"}),
            Expect {
                status: RunStatus::Failed,
                // "Classify: refund" is 2 words in, "billing" 1 out.
                reason: Some("budget exceeded: 3 tokens used, the budget is 2"),
                structure: &["model_called step=m1 iteration=1 attempt=1", "run_failed"],
                ..NONE
            },
        ),
        (
            "a wall-time budget spent in backoff fails the run at the next step",
            retried("flaky", 3)
                .with_step(StepDef::tool("b", r("echo"), json!(2)))
                .with_edge("a", "b")
                .with_budget(BudgetDef {
                    wall_time: Some(Millis(250)),
                    ..BudgetDef::default()
                }),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("budget exceeded: wall time 300 ms is over the budget of 250 ms"),
                slept_ms: &[100, 200],
                tool_calls: 3,
                ..NONE
            },
        ),
        (
            "a step's timeout reaches the tool host, and its expiry fails the step",
            WorkflowDef::new("t.slow")
                .with_step(StepDef::tool("a", r("slow"), json!(1)).with_timeout(Millis(50))),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("did not answer within the call's 50 ms limit"),
                tool_calls: 1,
                ..NONE
            },
        ),
        (
            "a loop whose `when` is false is not taken",
            looped_when(3, "steps.b.output != 2"),
            json!({}),
            Expect {
                output: Some(json!(2)),
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "a loop whose `when` is true runs until its bound",
            looped_when(2, "steps.b.output == 2"),
            json!({}),
            Expect {
                structure: &["loop_iterated", "loop_iterated", "run_completed"],
                tool_calls: 6,
                ..NONE
            },
        ),
        (
            "a loop condition that cannot be evaluated fails the run naming the edge",
            looped_when(2, "steps.b.output.count > 1"),
            json!({}),
            Expect {
                status: RunStatus::Failed,
                reason: Some("the loop condition from `b` to `a` failed"),
                tool_calls: 2,
                ..NONE
            },
        ),
        (
            "a model step renders its prompt from recorded state",
            WorkflowDef::new("t.model")
                .with_step(StepDef::model("classify", "Classify: {{ inputs.text }}")),
            json!({"text": "refund"}),
            Expect {
                output: Some(json!("billing")),
                structure: &["model_called step=classify iteration=1 attempt=1"],
                ..NONE
            },
        ),
    ]
}

#[tokio::test]
async fn walk_table() {
    for (name, def, input, want) in cases() {
        let k = kernel();
        let out = k.run(&def, input).await;
        assert_eq!(out.status, want.status, "{name}: {:?}", out.reason);
        if let Some(reason) = want.reason {
            let got = out.reason.clone().unwrap_or_default();
            assert!(got.contains(reason), "{name}: reason {got:?}");
        }
        if let Some(output) = &want.output {
            assert_eq!(out.output.as_ref(), Some(output), "{name}");
        }
        let lines = k.structure(&out).await;
        let mut at = 0;
        for expected in want.structure {
            match lines[at..].iter().position(|l| l.starts_with(expected)) {
                Some(p) => at += p + 1,
                None => panic!("{name}: `{expected}` not found (in order) in {lines:#?}"),
            }
        }
        if let Some(phases) = want.intents_of_a {
            assert_eq!(k.phases(&out, "a").await, phases, "{name}");
        }
        let slept: Vec<u64> = k
            .clock
            .slept()
            .into_iter()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .collect();
        assert_eq!(slept, want.slept_ms, "{name}");
        assert_eq!(k.tools.calls().len(), want.tool_calls, "{name}");
        assert_eq!(k.tools.in_flight(), 0, "{name}: a call was left running");
    }
}

// ---------------------------------------------------- beyond the table

#[tokio::test]
async fn walk_serial_spine_and_stable_idempotency_keys() {
    let k = kernel();
    let out = k.run(&retried("flaky", 3), json!({})).await;
    assert_eq!(out.status, RunStatus::Completed);
    // Every attempt of one step execution carries the same key.
    let keys: Vec<String> = k
        .tools
        .calls()
        .into_iter()
        .map(|c| c.idempotency_key)
        .collect();
    assert_eq!(keys.len(), 3);
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
    // A ten-step chain records exactly one start and one end per step, in order.
    let out = k.run(&chain(10), json!({})).await;
    let starts: Vec<String> = k
        .structure(&out)
        .await
        .into_iter()
        .filter(|l| l.starts_with("step_started"))
        .collect();
    let expected: Vec<String> = (0..10)
        .map(|i| format!("step_started step=s{i} iteration=1"))
        .collect();
    assert_eq!(starts, expected);
}

#[tokio::test]
async fn walk_cancel_in_flight_stops_the_guest_and_closes_the_intent() {
    let k = kernel();
    let def = WorkflowDef::new("t.hang").with_step(StepDef::tool("a", r("hang"), json!(null)));
    let (run, driver) = k.start_driven(&def).await;
    until_in_flight(&k.tools).await;
    let rec = k.exec.cancel(&run, "test").await.expect("cancel");
    assert_eq!(rec.status, RunStatus::Cancelled);
    let out = driver.await.expect("driver").expect("outcome");
    assert_eq!(out.status, RunStatus::Cancelled);
    assert_eq!(k.tools.in_flight(), 0, "the guest call was dropped");
    assert_eq!(
        k.phases(&out, "a").await,
        [
            IntentPhase::Pending,
            IntentPhase::Dispatched,
            IntentPhase::Abandoned
        ]
    );
    let st = &out.state.steps[&StepId::from("a")];
    assert_eq!(st.status, StepStatus::Cancelled);
    k.check_refold(&out).await;
}

#[tokio::test]
async fn walk_backoff_waits_for_the_clock() {
    let k = kernel_with(tools(), ManualClock::new(5_000));
    let runnable = k.add(&retried("flaky", 2));
    let exec = k.exec.clone();
    let driver =
        tokio::spawn(async move { exec.run(runnable, json!({}), StartOptions::default()).await });
    // The first attempt fails; the retry sleeps until the clock moves.
    while k.clock.sleeping() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(k.tools.calls().len(), 1);
    k.clock.advance(Duration::from_millis(99));
    tokio::task::yield_now().await;
    assert_eq!(k.tools.calls().len(), 1, "not before the backoff ends");
    k.clock.advance(Duration::from_millis(1));
    let out = driver.await.expect("driver").expect("outcome");
    // `flaky` fails twice; two attempts are not enough.
    assert_eq!(out.status, RunStatus::Failed);
    assert_eq!(k.tools.calls().len(), 2);
}

#[tokio::test]
async fn walk_cancel_during_backoff_ends_the_run_without_another_attempt() {
    let k = kernel_with(tools(), ManualClock::new(5_000));
    let (run, driver) = k.start_driven(&retried("broken", 3)).await;
    // The first attempt fails; the run sleeps out its backoff.
    while k.clock.sleeping() == 0 {
        tokio::task::yield_now().await;
    }
    let rec = k.exec.cancel(&run, "test").await.expect("cancel");
    assert_eq!(rec.status, RunStatus::Cancelled);
    let out = driver.await.expect("driver").expect("outcome");
    assert_eq!(out.status, RunStatus::Cancelled);
    // The backoff's end comes and goes: no second attempt.
    k.clock.advance(Duration::from_secs(10));
    tokio::task::yield_now().await;
    assert_eq!(k.tools.calls().len(), 1);
    k.check_refold(&out).await;
}

#[tokio::test]
async fn walk_cancel_while_waiting_for_a_judgment_closes_the_request() {
    let k = kernel();
    let def = WorkflowDef::new("t.judge").with_step(StepDef::judgment(
        "ok",
        "Refund?",
        json!({"type": "boolean"}),
    ));
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::WaitingJudgment);
    let open = k.exec.open_judgments().await.expect("judgments");
    assert_eq!(open.len(), 1);
    let rec = k
        .exec
        .cancel(&out.run, "no longer needed")
        .await
        .expect("cancel");
    assert_eq!(rec.status, RunStatus::Cancelled);
    assert!(
        k.exec.open_judgments().await.expect("judgments").is_empty(),
        "a cancelled run's request is not open"
    );
    let late = k
        .exec
        .submit_judgment(
            open[0].id.as_str(),
            JudgmentSubmission {
                request_hash: open[0].request_hash.clone(),
                result: json!(true),
                executor: None,
                profile: None,
                provenance: json!({"judge": "test"}),
            },
        )
        .await;
    assert!(
        late.is_err(),
        "an answer to a cancelled run is refused: {late:?}"
    );
    let rec = k.exec.status(&out.run).await.expect("status");
    assert_eq!(rec.status, RunStatus::Cancelled);
}

#[tokio::test]
async fn walk_a_failing_child_run_fails_its_step_and_the_parent() {
    let k = kernel();
    let child = WorkflowDef::new("t.child").with_step(StepDef::tool("c", r("broken"), json!(1)));
    k.add(&child);
    let parent = WorkflowDef::new("t.parent").with_step(StepDef::sub_workflow("call", "t.child"));
    let out = k.run(&parent, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let reason = out.reason.clone().unwrap_or_default();
    assert!(reason.contains("step `call` failed"), "{reason}");
    let st = &out.state.steps[&StepId::from("call")];
    assert_eq!(st.status, StepStatus::Failed);
    let link = st.child.clone().expect("linked");
    let child_rec = k.exec.status(&link.run).await.expect("child");
    assert_eq!(child_rec.status, RunStatus::Failed);
    assert!(
        child_rec
            .reason
            .unwrap_or_default()
            .contains("step `c` failed"),
        "the child's own reason names its step"
    );
}

#[tokio::test]
async fn walk_workflow_outputs_are_checked_against_their_schema() {
    let k = kernel();
    let def = WorkflowDef::new("t.outputs")
        .with_outputs(json!({"type": "object", "required": ["total"]}))
        .with_step(StepDef::tool("a", r("echo"), json!({"count": 1})));
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let reason = out.reason.clone().unwrap_or_default();
    assert!(reason.contains("outputs"), "{reason}");
    assert!(
        reason.contains("total"),
        "the reason names the rule: {reason}"
    );
    // The same workflow whose output has the field completes.
    let fine = WorkflowDef::new("t.outputs")
        .with_outputs(json!({"type": "object", "required": ["total"]}))
        .with_step(StepDef::tool("a", r("echo"), json!({"total": 1})));
    let out = k.run(&fine, json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
}

#[tokio::test]
async fn walk_judgment_pauses_until_answered() {
    let k = kernel();
    let def = WorkflowDef::new("t.judge")
        .with_step(StepDef::tool("a", r("echo"), json!({"amount": 40})))
        .with_step(StepDef::judgment(
            "ok",
            "Refund {{ steps.a.output.amount }}?",
            json!({"type": "boolean"}),
        ))
        .with_edge("a", "ok");
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::WaitingJudgment);
    let open = k.exec.open_judgments().await.expect("judgments");
    assert_eq!(open.len(), 1);
    let j = &open[0];
    assert_eq!(j.request["question"], json!("Refund 40?"));
    let answer = |result: Value| JudgmentSubmission {
        request_hash: j.request_hash.clone(),
        result,
        executor: None,
        profile: None,
        provenance: json!({"judge": "test"}),
    };
    let refused = k
        .exec
        .submit_judgment(j.id.as_str(), answer(json!("yes")))
        .await;
    assert!(
        matches!(
            refused,
            Err(poimen_executor::JudgmentError::ResultSchema { .. })
        ),
        "{refused:?}"
    );
    let out = k
        .exec
        .submit_judgment(j.id.as_str(), answer(json!(true)))
        .await
        .expect("answered");
    assert_eq!(out.status, RunStatus::Completed);
    assert_eq!(out.output, Some(json!(true)));
    k.check_refold(&out).await;
}

/// An answered judgment (or a reconciled call) makes its run runnable
/// again, and the host that wrote it drives it on: a serving loop of the
/// same host woken by that write finds nothing to claim, so the run has one
/// driver — two would fence each other, and the second would block on the
/// first's open call.
#[tokio::test]
async fn walk_an_answered_run_is_held_by_its_resumer_not_claimed_in_between() {
    let claimed: Arc<std::sync::Mutex<Vec<poimen_store::RunId>>> = Arc::default();
    let config = ExecutorConfig::default();
    let interloper = Some((config.host_id.clone(), claimed.clone()));
    let (k, _) = counted_kernel_over(config, None, interloper);
    let def = WorkflowDef::new("t.judge.held")
        .with_step(StepDef::judgment("ok", "Go?", json!({"type": "boolean"})))
        .with_step(StepDef::tool(
            "a",
            r("once"),
            json!({"go": "{{ steps.ok.output }}"}),
        ))
        .with_edge("ok", "a");
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::WaitingJudgment);
    let j = k.exec.open_judgments().await.expect("judgments").remove(0);
    let out = k
        .exec
        .submit_judgment(
            j.id.as_str(),
            JudgmentSubmission {
                request_hash: j.request_hash.clone(),
                result: json!(true),
                executor: None,
                profile: None,
                provenance: json!({"judge": "test"}),
            },
        )
        .await
        .expect("answered");
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    assert_eq!(
        *claimed.lock().expect("claims"),
        Vec::<poimen_store::RunId>::new(),
        "a serving loop claimed the run between the answer and its drive"
    );
    k.check_refold(&out).await;
}

/// A serving loop sharing its slots for runs at once with the API's
/// waited starts holds a slot only while it drives a run with it: idle, it
/// leaves every slot to others; with none free it claims nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_a_loop_sharing_its_slots_holds_only_those_it_drives_with() {
    let k = kernel();
    let slots = Arc::new(tokio::sync::Semaphore::new(2));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let exec = k.exec.clone();
    let opts = poimen_executor::ServeOptions {
        workers: 2,
        poll: Duration::from_millis(5),
        grace: Duration::from_secs(5),
        slots: Some(slots.clone()),
    };
    let serving = tokio::spawn(async move {
        exec.serve(opts, async move {
            let _ = stopped.await;
        })
        .await
    });
    // As the API takes a slot: without waiting for one.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let all = loop {
        if let Ok(all) = slots.clone().try_acquire_many_owned(2) {
            break all;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "an idle loop leaves its slots to others"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let def = WorkflowDef::new("t.slots").with_step(StepDef::tool("a", r("echo"), json!({"x": 1})));
    let queued = k
        .exec
        .enqueue(k.add(&def), json!({}), StartOptions::default())
        .await
        .expect("enqueued");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rec = k.exec.status(&queued.run).await.expect("status");
    assert_eq!(rec.status, RunStatus::Queued, "claimed with no slot free");
    drop(all);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rec = k.exec.status(&queued.run).await.expect("status");
        if rec.status == RunStatus::Completed {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{rec:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    let report = serving.await.expect("the loop").expect("served");
    assert_eq!(report.driven, 1);
    assert_eq!(slots.available_permits(), 2, "every slot back");
}

#[tokio::test]
async fn walk_sub_workflow_links_both_ways() {
    let k = kernel();
    let child = WorkflowDef::new("t.child").with_step(StepDef::tool(
        "c",
        r("echo"),
        json!("{{ inputs.word }}"),
    ));
    k.add(&child);
    let mut step = StepDef::sub_workflow("call", "t.child");
    if let StepKind::SubWorkflow(s) = &mut step.kind {
        s.input = ArgTemplate(json!({"word": "hi"}));
    }
    let parent = WorkflowDef::new("t.parent").with_step(step);
    let out = k.run(&parent, json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    assert_eq!(out.output, Some(json!("hi")));
    let link = out.state.steps[&StepId::from("call")]
        .child
        .clone()
        .expect("linked");
    let child_rec = k.exec.status(&link.run).await.expect("child");
    assert_eq!(child_rec.parent.map(|p| p.0), Some(out.run.clone()));
    assert_eq!(child_rec.status, RunStatus::Completed);
}

#[tokio::test]
async fn walk_retry_from_a_step_runs_it_again_as_a_new_iteration() {
    // `gate` fails its first call: the run fails at s1, and a retry from s0
    // runs s0, s1 and s2 again as new iterations.
    let k = kernel_with(tools_gate(), ManualClock::auto(0));
    let def = chain(3)
        .with_step(StepDef::tool("s3", r("gate"), json!(3)))
        .with_edge("s2", "s3");
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let again = k
        .exec
        .retry(&out.run, Some(StepId::from("s1")))
        .await
        .expect("retry");
    assert_eq!(again.status, RunStatus::Completed, "{:?}", again.reason);
    let st = &again.state.steps;
    assert_eq!(st[&StepId::from("s0")].iteration, 1);
    assert_eq!(st[&StepId::from("s1")].iteration, 2);
    assert_eq!(st[&StepId::from("s3")].iteration, 2);
    assert_eq!(k.tools.calls().len(), 4 + 3);
    k.check_refold(&again).await;
    // A completed run is final; a step that is not top-level is named.
    let refused = k.exec.retry(&again.run, None).await;
    assert!(
        matches!(
            refused,
            Err(poimen_executor::OperatorError::WrongStatus {
                status: RunStatus::Completed,
                ..
            })
        ),
        "{refused:?}"
    );
    let failed = k.run(&def, json!({})).await;
    assert_eq!(failed.status, RunStatus::Completed, "`gate` now passes");
    let k = kernel_with(tools_gate(), ManualClock::auto(0));
    let out = k.run(&def, json!({})).await;
    let refused = k.exec.retry(&out.run, Some(StepId::from("nope"))).await;
    assert!(
        matches!(
            refused,
            Err(poimen_executor::OperatorError::NotTopLevel { ref top_level, .. }) if top_level.len() == 4
        ),
        "{refused:?}"
    );
}

fn tools_gate() -> ScriptedTools {
    tools().flaky("gate", 1, FailureClass::Failed)
}

// ------------------------------------------------ contracts at run time

fn writer(reducer: Reducer, schema: Value, tool: &str, args: Value) -> WorkflowDef {
    WorkflowDef::new("t.contract")
        .with_state("k", StateDecl::reduced(reducer).with_schema(schema))
        .with_step(StepDef::tool("a", r(tool), args).with_writes("k"))
}

#[tokio::test]
async fn walk_a_state_write_breaking_its_schema_fails_the_step_with_the_contract() {
    let k = kernel();
    let def = writer(
        Reducer::Overwrite,
        json!({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}),
        "echo",
        json!({"n": "seven"}),
    );
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let failure = out.state.steps[&StepId::from("a")]
        .failure
        .clone()
        .expect("failure");
    assert_eq!(failure.class, FailureClass::Contract);
    match failure.contract.as_deref() {
        Some(poimen_executor::Contract::StateSchema { key, violations }) => {
            assert_eq!(key, "k");
            assert_eq!(violations[0].at, "/n");
            assert_eq!(violations[0].rule, "type");
        }
        other => panic!("expected a state-schema contract, got {other:?}"),
    }
    assert!(out.reason.unwrap_or_default().contains("state key `k`"));
    // A valid write passes the same check.
    let ok = writer(
        Reducer::Overwrite,
        json!({"type": "object"}),
        "echo",
        json!({"n": 7}),
    );
    assert_eq!(k.run(&ok, json!({})).await.status, RunStatus::Completed);
}

#[tokio::test]
async fn walk_merge_into_a_non_object_is_refused_not_replaced() {
    let k = kernel();
    // `merge` of a string: before, the string silently replaced the object.
    let def = writer(
        Reducer::Merge,
        json!({"type": "object"}),
        "echo",
        json!("oops"),
    );
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let failure = out.state.steps[&StepId::from("a")]
        .failure
        .clone()
        .expect("failure");
    assert!(
        matches!(
            failure.contract.as_deref(),
            Some(poimen_executor::Contract::Reducer {
                reducer: Reducer::Merge,
                value: poimen_executor::JsonType::Object,
                write: poimen_executor::JsonType::String,
                ..
            })
        ),
        "{failure:?}"
    );
    assert!(out.state.state.get("k").is_none_or(|v| v == &json!({})));
}

#[tokio::test]
async fn walk_a_model_answer_breaking_the_step_schema_fails_before_it_is_written() {
    let k = kernel();
    let model = ModelStep::new("Classify: {{ inputs.text }}")
        .with_format(OutputFormat::Json)
        .with_schema(json!({"type": "object"}));
    let def = WorkflowDef::new("t.schema").with_step(StepDef::new("m", model));
    // The scripted model answers `billing`: not JSON at all.
    let out = k.run(&def, json!({"text": "x"})).await;
    assert_eq!(out.status, RunStatus::Failed);
    // `"billing"` parses as a JSON string when quoted; the schema wants an object.
    let tools = tools();
    let k2 = kernel_with(tools, ManualClock::auto(0));
    let model = ModelStep::new("Anything")
        .with_format(OutputFormat::Json)
        .with_schema(json!({"type": "object", "required": ["label"]}));
    let def = WorkflowDef::new("t.schema2").with_step(StepDef::new("m", model));
    let runnable = k2.add(&def);
    let exec = Executor::new(
        k2.store.clone(),
        k2.tools.clone(),
        Arc::new(ScriptedProvider::new(vec![Rule::contains(
            "",
            r#"{"other": 1}"#,
        )])),
        k2.clock.clone(),
        k2.loader.clone(),
        ExecutorConfig::default(),
    );
    let out = exec
        .run(runnable, json!({}), StartOptions::default())
        .await
        .expect("runs");
    let failure = out.state.steps[&StepId::from("m")]
        .failure
        .clone()
        .expect("failure");
    match failure.contract.as_deref() {
        Some(poimen_executor::Contract::ModelOutput { violations }) => {
            assert_eq!(violations[0].rule, "required");
        }
        other => panic!("expected a model-output contract, got {other:?}"),
    }
}

// ------------------------------------------------------- live rubrics

fn scored(threshold: Option<f64>, score: f64, second: Option<bool>) -> WorkflowDef {
    let mut criteria =
        vec![Criterion::new("quality", r("score")).with_config(json!({"score": score}))];
    if let Some(pass) = second {
        criteria.push(
            Criterion::new("other", r("score")).with_config(json!({"score": 1.0, "pass": pass})),
        );
    }
    WorkflowDef::new("t.rubric")
        .with_step(StepDef::tool("a", r("echo"), json!({"x": 1})))
        .with_rubric(RubricDef {
            criteria,
            threshold,
        })
}

fn rubric_tools() -> ScriptedTools {
    tools().verifier("score", |call| {
        let score = call.config["score"].as_f64().unwrap_or(0.0);
        Verdict {
            pass: call.config["pass"].as_bool().unwrap_or(score >= 0.5),
            score,
            reason: format!("scored {score}"),
        }
    })
}

#[tokio::test]
async fn walk_a_workflow_rubric_decides_the_run_by_its_threshold() {
    let k = kernel_with(rubric_tools(), ManualClock::auto(0));
    let pass = k.run(&scored(Some(0.7), 0.8, None), json!({})).await;
    assert_eq!(pass.status, RunStatus::Completed, "{:?}", pass.reason);
    let v = pass.state.rubric.clone().expect("scored");
    assert!((v.score - 0.8).abs() < 1e-9 && v.passed);
    let fail = k.run(&scored(Some(0.7), 0.5, None), json!({})).await;
    assert_eq!(fail.status, RunStatus::Failed);
    assert!(
        fail.reason
            .as_deref()
            .is_some_and(|r| r.contains("below its threshold 0.7")),
        "{:?}",
        fail.reason
    );
    // No threshold: every criterion must pass; one failing fails the run.
    let strict = k.run(&scored(None, 0.9, Some(false)), json!({})).await;
    assert_eq!(strict.status, RunStatus::Failed);
    assert!(
        strict
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("every criterion to pass")),
        "{:?}",
        strict.reason
    );
    let lenient = k.run(&scored(None, 0.9, Some(true)), json!({})).await;
    assert_eq!(lenient.status, RunStatus::Completed);
    assert!(
        k.structure(&fail)
            .await
            .iter()
            .any(|l| l.starts_with("rubric_scored")),
        "the verdict is recorded"
    );
}

#[tokio::test]
async fn walk_a_step_rubric_fails_the_attempt_and_follows_the_retry_policy() {
    // The verifier passes from its second call on.
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = calls.clone();
    let tools = tools().verifier("warming", move |_| {
        let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Verdict {
            pass: n >= 1,
            score: if n >= 1 { 0.9 } else { 0.1 },
            reason: format!("call {n}"),
        }
    });
    let k = kernel_with(tools, ManualClock::auto(0));
    let step = StepDef::tool("a", r("echo"), json!({"x": 1}))
        .with_rubric(RubricDef {
            criteria: vec![Criterion::new("warm", r("warming"))],
            threshold: Some(0.5),
        })
        .with_retry(RetryPolicy::attempts(2));
    let out = k
        .run(&WorkflowDef::new("t.steprubric").with_step(step), json!({}))
        .await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    assert_eq!(out.state.steps[&StepId::from("a")].attempt, 2);
    let scored: Vec<String> = k
        .structure(&out)
        .await
        .into_iter()
        .filter(|l| l.starts_with("rubric_scored"))
        .collect();
    assert_eq!(scored.len(), 2, "{scored:?}");
}

// ------------------------------------------------ judgments by content

#[tokio::test]
async fn walk_a_retried_judgment_opens_a_new_request_and_completes() {
    let k = kernel();
    let def = WorkflowDef::new("t.rejudge").with_step(
        StepDef::judgment("ok", "Approve?", json!({"type": "object"}))
            .with_verifier(r("nonempty"), Value::Null)
            .with_retry(RetryPolicy::attempts(2)),
    );
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::WaitingJudgment);
    let answer = |hash: &str, result: Value| JudgmentSubmission {
        request_hash: hash.to_owned(),
        result,
        executor: None,
        profile: None,
        provenance: json!({"judge": "test"}),
    };
    let first = k.exec.open_judgments().await.expect("open").remove(0);
    // An empty answer fails the verifier: the step retries, and its second
    // attempt asks again under a new request id.
    let out = k
        .exec
        .submit_judgment(first.id.as_str(), answer(&first.request_hash, json!({})))
        .await
        .expect("answered");
    assert_eq!(out.status, RunStatus::WaitingJudgment, "{:?}", out.reason);
    let second = k.exec.open_judgments().await.expect("open").remove(0);
    assert_ne!(second.id, first.id);
    // Same question, same content: the same request hash.
    assert_eq!(second.request_hash, first.request_hash);
    let out = k
        .exec
        .submit_judgment(
            second.id.as_str(),
            answer(&second.request_hash, json!({"ok": true})),
        )
        .await
        .expect("answered");
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    assert_eq!(out.output, Some(json!({"ok": true})));
    k.check_refold(&out).await;
}

// ------------------------------------------------ predicates at the limit

/// The validator refuses predicates nested deeper than
/// `MAX_PREDICATE_DEPTH` (fuzzing found a 2 000-level one, within the byte
/// limit, that overflowed a worker thread's stack when evaluated, aborting
/// the host): one exactly at the limit evaluates on a thread with a tokio
/// worker's 2 MiB stack, as a conditional's `on` and as a loop's `when`.
#[test]
fn walk_a_predicate_at_the_depth_limit_evaluates_on_a_worker_stack() {
    // `_==_` over a chain of additions: one level per term, one for `==`.
    let terms = poimen_workflow::validate::MAX_PREDICATE_DEPTH - 1;
    let predicate = format!("{} == {terms}", vec!["1"; terms].join(" + "));
    let def = WorkflowDef::new("t.deep")
        .with_step(StepDef::tool("a", r("echo"), json!(1)))
        .with_step(StepDef::conditional("route", predicate.as_str(), "yes"))
        .with_step(StepDef::tool("yes", r("echo"), json!("took yes")))
        .with_edge("a", "route")
        .with_loop(
            "route",
            "a",
            NonZeroU32::new(1).expect("1"),
            Some(predicate.as_str()),
        );
    let status = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async {
                    let k = kernel();
                    let out = k.run(&def, json!({})).await;
                    (out.status, out.reason)
                })
        })
        .expect("thread")
        .join()
        .expect("evaluated without overflowing the stack");
    assert_eq!(status.0, RunStatus::Completed, "{:?}", status.1);
}

/// A predicate that fails to give a boolean fails its step with the same
/// reason on every run: fuzzing found that the reason showed maps with
/// their entries in hash order (a map instead of a boolean, a map in an
/// operator CEL refuses), so two runs of one workflow recorded different
/// failures. Inputs: `fixtures/fuzz/predicates/`, one predicate per file.
#[tokio::test]
async fn walk_a_predicate_that_is_not_a_boolean_fails_the_same_way_every_time() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/fuzz/predicates");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures/fuzz/predicates")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 2, "regression inputs in {}", dir.display());
    for file in files {
        let predicate = std::fs::read_to_string(&file).expect("regression input");
        failing_predicate_is_deterministic(predicate.trim()).await;
    }
}

async fn failing_predicate_is_deterministic(predicate: &str) {
    let def = WorkflowDef::new("t.notbool")
        .with_step(StepDef::conditional("route", predicate, "yes"))
        .with_step(StepDef::tool("yes", r("echo"), json!(1)));
    let input = json!({"alpha": 1, "beta": 2, "gamma": 3, "delta": 4, "epsilon": 5, "zeta": 6});
    let mut reasons = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let out = kernel().run(&def, input.clone()).await;
        assert_eq!(out.status, RunStatus::Failed);
        reasons.insert(out.reason.unwrap_or_default());
    }
    assert_eq!(reasons.len(), 1, "{predicate}: {reasons:#?}");
    let reason = reasons.pop_first().unwrap_or_default();
    assert!(reason.contains("predicate"), "{predicate}: {reason}");
}

// ------------------------------------------------------ timers and limits

fn expiring(fallback: Option<JudgmentFallback>) -> WorkflowDef {
    let mut judgment =
        JudgmentStep::new("Refund?", json!({"type": "boolean"})).with_executor("human");
    judgment.on_timeout = fallback;
    let mut step =
        StepDef::judgment("ok", "Refund?", json!({"type": "boolean"})).with_timeout(Millis(1_000));
    step.kind = StepKind::Judgment(judgment);
    WorkflowDef::new("t.expiring").with_step(step)
}

/// Starts `def` on a clock that moves only when told, waits for it to halt
/// waiting, and moves the clock past its judgment's timeout.
async fn expired(k: &Kernel, def: &WorkflowDef) -> RunOutcome {
    let out = k.run(def, json!({})).await;
    assert_eq!(out.status, RunStatus::WaitingJudgment, "{:?}", out.reason);
    // The timer is in the store: whichever host serves it looks again then.
    let rec = k.store.run(&out.run).await.expect("read").expect("run");
    assert_eq!(rec.wake_at, Some(5_000 + 1_000));
    // Not yet: driven again, it stays waiting.
    let early = k.exec.resume(&out.run).await.expect("resume");
    assert_eq!(early.status, RunStatus::WaitingJudgment);
    k.clock.advance(Duration::from_millis(1_000));
    out
}

#[tokio::test]
async fn walk_a_judgment_that_expires_fails_or_takes_its_fallback_answer() {
    // fail
    let k = kernel_with(tools(), ManualClock::new(5_000));
    let out = expired(&k, &expiring(Some(JudgmentFallback::Fail))).await;
    let request = k.exec.open_judgments().await.expect("open").remove(0);
    // A serving host claims the run when its timer comes, and drives it.
    let claimed = k.exec.claim_runnable(10).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let (rec, lease) = claimed.into_iter().next().expect("one");
    let out2 = k.exec.drive_claimed(&rec.id, lease).await.expect("drive");
    assert_eq!(out2.run, out.run);
    assert_eq!(out2.status, RunStatus::Failed);
    let reason = out2.reason.clone().unwrap_or_default();
    assert!(reason.contains("got no answer within 1000 ms"), "{reason}");
    assert!(k.exec.open_judgments().await.expect("open").is_empty());
    let stored = k.exec.judgment(request.id.as_str()).await.expect("request");
    assert_eq!(stored.status, poimen_store::JudgmentStatus::Expired);
    assert!(
        k.structure(&out2)
            .await
            .iter()
            .any(|e| e.contains("judgment_expired")),
        "recorded"
    );
    k.check_refold(&out2).await;

    // answer
    let k = kernel_with(tools(), ManualClock::new(5_000));
    let out = expired(&k, &expiring(Some(JudgmentFallback::Answer(json!(false))))).await;
    let out = k.exec.resume(&out.run).await.expect("resume");
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    assert_eq!(out.output, Some(json!(false)));
    let episode = k.exec.episode(&out.run).await.expect("episode");
    let received = episode
        .events
        .iter()
        .find_map(|e| match &e.event {
            poimen_executor::EpisodeEvent::JudgmentReceived { provenance, .. } => {
                Some(provenance.clone())
            }
            _ => None,
        })
        .expect("the fallback answer is recorded as received");
    assert_eq!(received, json!({"fallback": "on_timeout"}));
    k.check_refold(&out).await;
}

#[tokio::test]
async fn walk_an_expired_judgment_escalates_once_then_fails() {
    let k = kernel_with(tools(), ManualClock::new(5_000));
    let out = expired(
        &k,
        &expiring(Some(JudgmentFallback::Escalate {
            executor: Some("ai-collab".into()),
            profile: None,
        })),
    )
    .await;
    let first = k.exec.open_judgments().await.expect("open").remove(0);
    let out = k.exec.resume(&out.run).await.expect("resume");
    assert_eq!(out.status, RunStatus::WaitingJudgment, "{:?}", out.reason);
    let open = k.exec.open_judgments().await.expect("open");
    assert_eq!(open.len(), 1, "the first request expired, a second is open");
    let second = &open[0];
    assert_ne!(second.id, first.id);
    assert_eq!(second.request["executor"], json!("ai-collab"));
    assert_eq!(
        k.store
            .run(&out.run)
            .await
            .expect("read")
            .expect("run")
            .wake_at,
        Some(6_000 + 1_000),
        "the escalated request has the same timeout, from now"
    );
    // Nobody answers the escalated request either: the step fails.
    k.clock.advance(Duration::from_millis(1_000));
    let out = k.exec.resume(&out.run).await.expect("resume");
    assert_eq!(out.status, RunStatus::Failed, "{:?}", out.reason);
    k.check_refold(&out).await;
}

#[tokio::test]
async fn walk_a_deadline_and_a_wall_time_budget_interrupt_a_call_in_flight() {
    for (limits, budget, words) in [
        (
            Limits {
                deadline: Some(Millis(5_000)),
                ..Limits::default()
            },
            BudgetDef::default(),
            "deadline exceeded",
        ),
        (
            Limits::default(),
            BudgetDef {
                wall_time: Some(Millis(3_000)),
                ..BudgetDef::default()
            },
            "wall time",
        ),
    ] {
        let k = kernel_with(tools(), ManualClock::new(5_000));
        let def = WorkflowDef::new("t.deadline")
            .with_limits(limits)
            .with_budget(budget)
            .with_step(StepDef::tool("a", r("hang"), json!(null)).with_timeout(Millis(600_000)));
        let (_, driver) = k.start_driven(&def).await;
        until_in_flight(&k.tools).await;
        k.clock.advance(Duration::from_millis(2_000));
        tokio::task::yield_now().await;
        assert_eq!(k.tools.in_flight(), 1, "not before the limit");
        k.clock.advance(Duration::from_millis(4_000));
        let out = tokio::time::timeout(Duration::from_secs(10), driver)
            .await
            .expect("the limit interrupts the run")
            .expect("driver")
            .expect("outcome");
        assert_eq!(out.status, RunStatus::Failed);
        let reason = out.reason.clone().unwrap_or_default();
        assert!(reason.contains(words), "{reason}");
        assert_eq!(k.tools.in_flight(), 0, "the call was dropped");
        assert_eq!(
            k.phases(&out, "a").await,
            [
                IntentPhase::Pending,
                IntentPhase::Dispatched,
                IntentPhase::Abandoned
            ]
        );
        k.check_refold(&out).await;
    }
}

#[tokio::test]
async fn walk_a_waiting_run_fails_when_its_deadline_passes() {
    let k = kernel_with(tools(), ManualClock::new(5_000));
    let def = WorkflowDef::new("t.waits")
        .with_limits(Limits {
            deadline: Some(Millis(10_000)),
            ..Limits::default()
        })
        .with_step(StepDef::judgment(
            "ok",
            "Refund?",
            json!({"type": "boolean"}),
        ));
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::WaitingJudgment);
    assert_eq!(
        k.store
            .run(&out.run)
            .await
            .expect("read")
            .expect("run")
            .wake_at,
        Some(15_000),
        "no request timeout: the deadline is the timer"
    );
    k.clock.advance(Duration::from_millis(10_000));
    let out = k.exec.resume(&out.run).await.expect("resume");
    assert_eq!(out.status, RunStatus::Failed);
    assert!(
        out.reason
            .clone()
            .unwrap_or_default()
            .contains("deadline exceeded"),
        "{:?}",
        out.reason
    );
    k.check_refold(&out).await;
}

#[tokio::test]
async fn walk_a_bounded_group_step_stops_what_it_runs_at_its_timeout() {
    // A fan-out, a choice, a child run and a workflow called as a tool,
    // each around a call that hangs.
    let child = hangs();
    let cases: Vec<(&str, WorkflowDef)> = vec![
        (
            "parallel",
            WorkflowDef::new("t.fan")
                .with_step(StepDef::parallel("fan", ["x", "y"]).with_timeout(Millis(2_000)))
                .with_step(StepDef::tool("x", r("echo"), json!(1)))
                .with_step(StepDef::tool("y", r("hang"), json!(2)).with_timeout(Millis(600_000))),
        ),
        (
            "conditional",
            WorkflowDef::new("t.choice")
                .with_step(StepDef::conditional("pick", "true", "y").with_timeout(Millis(2_000)))
                .with_step(StepDef::tool("y", r("hang"), json!(2)).with_timeout(Millis(600_000))),
        ),
        (
            "workflow",
            WorkflowDef::new("t.parent")
                .with_step(StepDef::sub_workflow("call", "t.hangs").with_timeout(Millis(2_000))),
        ),
        (
            "workflow tool",
            WorkflowDef::new("t.tooled").with_step(
                StepDef::tool("call", ToolRef::any("t.hangs"), json!({}))
                    .with_timeout(Millis(2_000)),
            ),
        ),
    ];
    for (kind, def) in cases {
        let k = kernel_with(tools(), ManualClock::new(5_000));
        k.add(&child);
        let (_, driver) = k.start_driven(&def).await;
        until_in_flight(&k.tools).await;
        k.clock.advance(Duration::from_millis(1_999));
        tokio::task::yield_now().await;
        assert_eq!(k.tools.in_flight(), 1, "{kind}: not before the timeout");
        k.clock.advance(Duration::from_millis(1));
        let out = tokio::time::timeout(Duration::from_secs(10), driver)
            .await
            .unwrap_or_else(|_| panic!("{kind}: the timeout stops the step"))
            .expect("driver")
            .expect("outcome");
        assert_eq!(out.status, RunStatus::Failed, "{kind}");
        let reason = out.reason.clone().unwrap_or_default();
        assert!(
            reason.contains("did not finish within its timeout of 2000 ms"),
            "{kind}: {reason}"
        );
        assert_eq!(k.tools.in_flight(), 0, "{kind}: the call was dropped");
        k.check_refold(&out).await;
        if kind.starts_with("workflow") {
            let link = out.state.steps[&StepId::from("call")]
                .child
                .clone()
                .expect("linked");
            let child = k.exec.status(&link.run).await.expect("child");
            assert_eq!(
                child.status,
                RunStatus::Cancelled,
                "the child was cancelled"
            );
        } else {
            let hung = &out.state.steps[&StepId::from("y")];
            assert!(
                matches!(hung.status, StepStatus::Lost | StepStatus::Cancelled),
                "{kind}: the stopped branch is recorded: {:?}",
                hung.status
            );
        }
    }
}

#[tokio::test]
async fn walk_a_model_call_over_limits_tokens_fails_its_step() {
    let k = kernel();
    let def = |tokens: u64| {
        WorkflowDef::new("t.tokens")
            .with_limits(Limits {
                tokens: Some(tokens),
                ..Limits::default()
            })
            .with_step(StepDef::model("ask", "one two three four five six"))
    };
    // Six words in, one out (the scripted provider counts words).
    let out = k.run(&def(5), json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let reason = out.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("used 7 tokens, over the workflow's `limits.tokens` of 5"),
        "{reason}"
    );
    let out = k.run(&def(7), json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
}

#[tokio::test]
async fn walk_the_policys_output_bound_fails_a_step_and_a_run_over_it() {
    let store = Arc::new(MemoryStore::new());
    let tools = Arc::new(tools());
    let loader = MemoryLoader::new();
    let exec = Executor::new(
        store.clone(),
        tools.clone(),
        Arc::new(ScriptedProvider::new(vec![Rule::contains("", "ok")])),
        ManualClock::auto(1_000),
        loader.clone(),
        ExecutorConfig {
            output_bytes: Some(20),
            ..ExecutorConfig::default()
        },
    );
    let run = |value: Value| {
        let def = WorkflowDef::new("t.big").with_step(StepDef::tool("a", r("echo"), value));
        let runnable = loader.add(&def, &tools).expect("valid");
        let exec = exec.clone();
        async move {
            exec.run(runnable, json!({}), StartOptions::default())
                .await
                .expect("starts")
        }
    };
    let out = run(json!("a string longer than twenty bytes")).await;
    assert_eq!(out.status, RunStatus::Failed);
    let reason = out.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("over the policy's `[bounds] output-bytes` of 20"),
        "{reason}"
    );
    let out = run(json!("short")).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
}

// -------------------------------------------------------------- scheduler
//
// A host runs a bounded number of step executions at once; the ready steps
// beyond them wait, higher priority first, and age so that none waits
// forever; under pressure new runs are shed by priority. Each case holds
// the only worker with a gated call, lines steps up behind it, and counts
// the order the tool calls start in.

struct Sched {
    tools: Arc<ScriptedTools>,
    loader: Arc<MemoryLoader>,
    exec: Executor,
}

fn sched(cfg: poimen_executor::SchedulerConfig) -> Sched {
    let tools = Arc::new(ScriptedTools::new().echo("echo").gated("gate"));
    let loader = MemoryLoader::new();
    let exec = Executor::new(
        Arc::new(MemoryStore::new()),
        tools.clone(),
        Arc::new(ScriptedProvider::new(vec![Rule::contains("", "ok")])),
        ManualClock::auto(1_000),
        loader.clone(),
        ExecutorConfig {
            scheduler: cfg,
            ..ExecutorConfig::default()
        },
    );
    Sched {
        tools,
        loader,
        exec,
    }
}

type Driven = tokio::task::JoinHandle<Result<RunOutcome, poimen_executor::RunError>>;

impl Sched {
    /// Starts a one-step run of `priority` calling `tool` with `{who}`.
    async fn start(
        &self,
        who: &str,
        priority: Priority,
        tool: &str,
    ) -> Result<(poimen_store::RunId, Driven), poimen_executor::StartError> {
        let mut def = WorkflowDef::new(format!("t.sched.{who}").as_str()).with_step(StepDef::tool(
            "a",
            r(tool),
            json!({"who": who}),
        ));
        def.priority = priority;
        let runnable = self.loader.add(&def, &self.tools).expect("valid");
        let started = self
            .exec
            .start(runnable, json!({}), StartOptions::default())
            .await?;
        let run = started.run.clone();
        let exec = self.exec.clone();
        Ok((
            run,
            tokio::spawn(async move { exec.drive_started(started).await }),
        ))
    }

    /// Starts a run and waits until its step waits for a worker.
    async fn queue(&self, who: &str, priority: Priority) -> (poimen_store::RunId, Driven) {
        let before = self.exec.scheduler().queued;
        let started = self.start(who, priority, "echo").await.expect("admitted");
        self.until(|s| s.queued == before + 1).await;
        started
    }

    /// Holds the only worker with a gated call.
    async fn block(&self) -> Driven {
        let (_, driven) = self
            .start("blocker", Priority::Normal, "gate")
            .await
            .expect("admitted");
        self.until(|s| s.running == 1).await;
        until_in_flight(&self.tools).await;
        driven
    }

    async fn until(&self, ok: impl Fn(&poimen_executor::SchedulerStats) -> bool) {
        for _ in 0..10_000 {
            if ok(&self.exec.scheduler()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the scheduler never got there: {:?}", self.exec.scheduler());
    }

    /// The `who` of every echo call, in the order the calls started.
    fn order(&self) -> Vec<String> {
        self.tools
            .calls_of("echo")
            .iter()
            .map(|c| c.args["who"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

async fn completed(driven: Vec<Driven>) {
    for d in driven {
        let out = d.await.expect("join").expect("drives");
        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    }
}

#[tokio::test]
async fn sched_a_saturated_host_runs_the_waiting_steps_of_higher_priority_first() {
    let k = sched(poimen_executor::SchedulerConfig::workers(1));
    let blocker = k.block().await;
    let mut driven = vec![blocker];
    for (who, p) in [
        ("low", Priority::Low),
        ("normal", Priority::Normal),
        ("high", Priority::High),
        ("normal-2", Priority::Normal),
    ] {
        driven.push(k.queue(who, p).await.1);
    }
    assert!(
        k.order().is_empty(),
        "nothing ran while the worker was held"
    );
    k.tools.open_gate(1);
    completed(driven).await;
    // Highest first; among equals, the first ready.
    assert_eq!(k.order(), ["high", "normal", "normal-2", "low"]);
    let stats = k.exec.scheduler();
    assert_eq!((stats.granted, stats.running, stats.queued), (5, 0, 0));
    // `low` was overtaken by the three that became ready after it.
    assert_eq!(stats.max_overtaken, 3);
}

#[tokio::test]
async fn sched_aging_bounds_how_often_low_work_is_overtaken() {
    let k = sched(poimen_executor::SchedulerConfig::workers(1));
    let mut driven = vec![k.block().await];
    driven.push(k.queue("low", Priority::Low).await.1);
    for i in 0..24 {
        driven.push(k.queue(&format!("high-{i}"), Priority::High).await.1);
    }
    k.tools.open_gate(1);
    completed(driven).await;
    let order = k.order();
    let at = order.iter().position(|w| w == "low").expect("low ran");
    // Overtaken by exactly MAX_OVERTAKEN later `high` steps, then — ranked
    // with them by age and older than the rest — it goes first.
    assert_eq!(
        at,
        poimen_executor::sched::MAX_OVERTAKEN as usize,
        "{order:?}"
    );
    assert_eq!(
        k.exec.scheduler().max_overtaken,
        poimen_executor::sched::MAX_OVERTAKEN
    );
}

#[tokio::test]
async fn sched_under_pressure_new_runs_are_shed_by_priority_with_a_typed_retryable_error() {
    let k = sched(poimen_executor::SchedulerConfig {
        workers: 1,
        warn_queue: 2,
        shed_queue: 3,
    });
    let mut driven = vec![k.block().await];
    let shed = |r: Result<(poimen_store::RunId, Driven), poimen_executor::StartError>| match r {
        Err(e @ poimen_executor::StartError::Shed { .. }) => e,
        Err(other) => panic!("another refusal: {other}"),
        Ok((run, _)) => panic!("{run} was admitted"),
    };
    assert_eq!(k.exec.scheduler().pressure, Some(Pressure::Ok));
    driven.push(k.queue("a", Priority::Low).await.1);
    driven.push(k.queue("b", Priority::Normal).await.1);
    assert_eq!(k.exec.scheduler().pressure, Some(Pressure::Warn));

    // `warn`: low is shed; normal and high are admitted.
    let e = shed(k.start("low-1", Priority::Low, "echo").await);
    assert!(e.is_retryable());
    assert!(
        matches!(
            e,
            poimen_executor::StartError::Shed {
                level: Pressure::Warn,
                priority: Priority::Low,
                queued: 2,
                workers: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("under pressure (`warn`"), "{e}");
    driven.push(k.queue("c", Priority::Normal).await.1);
    assert_eq!(k.exec.scheduler().pressure, Some(Pressure::Shed));

    // `shed`: normal too; high never.
    let e = shed(k.start("normal-1", Priority::Normal, "echo").await);
    assert!(
        matches!(
            e,
            poimen_executor::StartError::Shed {
                level: Pressure::Shed,
                priority: Priority::Normal,
                ..
            }
        ),
        "{e:?}"
    );
    shed(k.start("low-2", Priority::Low, "echo").await);
    driven.push(k.queue("h", Priority::High).await.1);

    let stats = k.exec.scheduler();
    assert_eq!((stats.shed_low, stats.shed_normal), (2, 1));
    k.tools.open_gate(1);
    completed(driven).await;
    assert_eq!(k.order(), ["h", "b", "c", "a"]);
    // The queue drained: new low runs are admitted again.
    assert_eq!(k.exec.scheduler().pressure, Some(Pressure::Ok));
    let (_, again) = k
        .start("low-3", Priority::Low, "echo")
        .await
        .expect("admitted");
    completed(vec![again]).await;
}

#[tokio::test]
async fn sched_a_run_cancelled_while_its_step_waits_leaves_the_queue_and_no_worker_is_lost() {
    let k = sched(poimen_executor::SchedulerConfig::workers(1));
    let blocker = k.block().await;
    let (waiting, driven) = k.queue("w", Priority::Normal).await;
    k.exec
        .cancel(&waiting, "no longer wanted")
        .await
        .expect("cancel");
    let out = driven.await.expect("join").expect("drives");
    assert_eq!(out.status, RunStatus::Cancelled);
    assert_eq!(k.exec.scheduler().queued, 0);
    k.tools.open_gate(1);
    completed(vec![blocker]).await;
    let stats = k.exec.scheduler();
    assert_eq!((stats.running, stats.queued), (0, 0));
    // The worker is free: the next run runs at once.
    let (_, next) = k
        .start("next", Priority::Low, "echo")
        .await
        .expect("admitted");
    completed(vec![next]).await;
    assert_eq!(k.order(), ["next"]);
}

#[tokio::test]
async fn walk_a_workflow_called_as_a_tool_is_one_child_run_whose_output_is_the_steps() {
    let k = kernel();
    k.add(&echoes());
    let parent = WorkflowDef::new("t.caller").with_step(StepDef::tool(
        "call",
        ToolRef::any("t.echoes"),
        json!({"n": 3}),
    ));
    let out = k.run(&parent, json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    let link = out.state.steps[&StepId::from("call")]
        .child
        .clone()
        .expect("the call is a linked child run");
    let child = k.exec.status(&link.run).await.expect("child");
    assert_eq!(child.status, RunStatus::Completed);
    assert_eq!(child.parent, Some((out.run.clone(), StepId::from("call"))));
    assert_eq!(out.output, Some(json!({"got": 3})));
    // The tool's pin names the workflow version it runs.
    let pin = &out.state.tools["t.echoes"];
    assert_eq!(pin.workflow, Some(link.version));
    assert_eq!(pin.identity.digest, link.version.to_string());
    // Driving the run again finds the child, never makes a second.
    let again = k.exec.resume(&out.run).await.expect("resume");
    assert_eq!(again.status, RunStatus::Completed);
    let children = k.store.children(&out.run).await.expect("children");
    assert_eq!(children.len(), 1, "{children:?}");
    k.check_refold(&out).await;
}

// ------------------------------------------------------- durable steps
//
// Issue 16: a durable tool step costs at most two fsyncs on its critical
// path in every shape — on the spine, in a fan-out branch, with verifiers,
// in a sub-workflow's run — counted here structurally: a store that logs
// each commit (its durability, the events and intents in it) and tools
// that log each call, in one order.
//
// Sync commits (fsyncs) / commits per tool step, before and after the
// change that gave fan-out branches and verified steps the deferral
// (`Deferred` in `run/mod.rs`):
//
// | shape             | pure, idempotent | non-idempotent |
// |-------------------|------------------|----------------|
// | spine             | 2/2 → 2/2        | 2/3 → 2/3      |
// | fan-out branch    | 2/4 → 2/2        | 2/5 → 2/3      |
// | with a verifier   | 2/4 → 2/3        | 2/5 → 2/4      |
// | in a sub-workflow | 2/2 → 2/2        | 2/3 → 2/3      |
//
// An effect-free tool (pure, granted no network and no writable mount:
// `ToolHost::effect_free`) wrote nothing ahead of its call: 1/1 on the
// spine, in a branch and in a sub-workflow, 1/2 with a verifier.
//
// Issue 44, durability at effects (`Tail` in `run/mod.rs`): a commit that
// needs no durability is held in the run's unwritten tail and rides in the
// run's next written commit. A step's cost is now the commits it *makes*
// (those its own records end: `trigger`), whoever's records they carry:
//
// | shape             | pure, idempotent | non-idempotent | effect-free |
// |-------------------|------------------|----------------|-------------|
// | spine             | 2/2              | 2/3 → 2/2      | 1/1 → 0/0   |
// | fan-out branch    | 2/2              | 2/3 → 2/2      | 1/1 → 0/0   |
// | with a verifier   | 2/3 → 2/2        | 2/4 → 2/2      | 1/2 → 0/0   |
// | in a sub-workflow | 2/2              | 2/3 → 2/2      | 1/1 → 0/0   |
//
// A non-idempotent tool's `Pending` is held in the tail and written with
// its `Dispatched` (see `durable_a_spine_tool_step_takes_two_fsyncs`).
// When verifiers follow a call, its outcome is fsynced before they run
// (`AfterCall` in `run/attempt.rs`), the verdicts and the step's end
// riding in the tail.

/// What the counting store and the counting tools saw, in the order it
/// happened: a store write once it returned, a tool call when it began.
#[derive(Debug, Clone)]
enum Logged {
    /// A `commit` that returned `Ok`.
    Commit {
        run: poimen_store::RunId,
        sync: bool,
        /// The steps its events and intents name.
        steps: std::collections::BTreeSet<String>,
        /// Its events' kinds, with the step each names.
        events: Vec<(String, Option<String>)>,
        /// Its intents: step, phase, idempotency key, tool.
        intents: Vec<(String, IntentPhase, String, String)>,
    },
    /// Another write, durable when it returns (every write but a commit
    /// is: a run's creation, a blob, a claim, a timer), by its method.
    Write(&'static str),
    /// A tool call began, under this idempotency key.
    Called(String),
    /// A read of a run's episode or intents, when it was asked for.
    Read(&'static str),
}

type Log = Arc<std::sync::Mutex<Vec<Logged>>>;

fn push(log: &Log, entry: Logged) {
    log.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
}

/// A store that logs every write it passes on to a [`MemoryStore`]: what
/// it held, how durable, in the order the writes returned. A commit first
/// yields to the runtime, as a real store's round trip does, so that a
/// fan-out's branches interleave their commits.
#[derive(Debug)]
struct CountingStore {
    inner: Arc<MemoryStore>,
    log: Log,
    /// Commits still to pass before one is refused (`Busy`), if any.
    refuse_after: std::sync::Mutex<Option<usize>>,
    /// When set, a serving loop of the same host (`host_id`) asks for
    /// claimable runs right after every commit that resumes a run, as a
    /// loop woken by that write would: what it claimed.
    interloper: Option<(String, Arc<std::sync::Mutex<Vec<poimen_store::RunId>>>)>,
}

impl CountingStore {
    fn wrote<T>(
        &self,
        what: &'static str,
        r: poimen_store::StoreResult<T>,
    ) -> poimen_store::StoreResult<T> {
        if r.is_ok() {
            push(&self.log, Logged::Write(what));
        }
        r
    }
}

fn step_of(body: &Value) -> Option<String> {
    body.get("step").and_then(Value::as_str).map(str::to_owned)
}

#[async_trait::async_trait]
impl Store for CountingStore {
    async fn publish_version(
        &self,
        new: poimen_store::NewVersion,
    ) -> poimen_store::StoreResult<poimen_store::PublishOutcome> {
        let r = self.inner.publish_version(new).await;
        self.wrote("publish_version", r)
    }
    async fn version(
        &self,
        version: &WorkflowVersion,
    ) -> poimen_store::StoreResult<Option<poimen_store::VersionRecord>> {
        self.inner.version(version).await
    }
    async fn resolve_version_prefix(
        &self,
        prefix: &VersionPrefix,
    ) -> poimen_store::StoreResult<WorkflowVersion> {
        self.inner.resolve_version_prefix(prefix).await
    }
    async fn versions_of(
        &self,
        workflow: &WorkflowId,
    ) -> poimen_store::StoreResult<Vec<poimen_store::VersionRecord>> {
        self.inner.versions_of(workflow).await
    }
    async fn latest_version(
        &self,
        workflow: &WorkflowId,
    ) -> poimen_store::StoreResult<Option<poimen_store::VersionRecord>> {
        self.inner.latest_version(workflow).await
    }
    async fn workflows(&self) -> poimen_store::StoreResult<Vec<poimen_store::WorkflowSummary>> {
        self.inner.workflows().await
    }
    async fn put_blob(&self, bytes: Vec<u8>) -> poimen_store::StoreResult<poimen_store::BlobHash> {
        let r = self.inner.put_blob(bytes).await;
        self.wrote("put_blob", r)
    }
    async fn blob(
        &self,
        hash: &poimen_store::BlobHash,
    ) -> poimen_store::StoreResult<Option<Vec<u8>>> {
        self.inner.blob(hash).await
    }
    async fn create_run(
        &self,
        new: poimen_store::NewRun,
    ) -> poimen_store::StoreResult<poimen_store::CreateRun> {
        let r = self.inner.create_run(new).await;
        self.wrote("create_run", r)
    }
    async fn run(
        &self,
        id: &poimen_store::RunId,
    ) -> poimen_store::StoreResult<Option<poimen_store::RunRecord>> {
        self.inner.run(id).await
    }
    async fn list_runs(
        &self,
        filter: poimen_store::RunFilter,
    ) -> poimen_store::StoreResult<Vec<poimen_store::RunRecord>> {
        self.inner.list_runs(filter).await
    }
    async fn children(
        &self,
        parent: &poimen_store::RunId,
    ) -> poimen_store::StoreResult<Vec<poimen_store::RunRecord>> {
        self.inner.children(parent).await
    }
    async fn commit(&self, commit: poimen_store::Commit) -> poimen_store::StoreResult<()> {
        let events: Vec<(String, Option<String>)> = commit
            .events
            .iter()
            .map(|e| {
                let body = e.body.to_value().expect("an event body is JSON");
                (e.kind.clone(), step_of(&body))
            })
            .collect();
        let intents: Vec<(String, IntentPhase, String, String)> = commit
            .intents
            .iter()
            .map(|i| {
                (
                    i.step.to_string(),
                    i.phase,
                    i.idempotency_key.clone(),
                    i.tool.clone(),
                )
            })
            .collect();
        let steps = events
            .iter()
            .filter_map(|(_, s)| s.clone())
            .chain(intents.iter().map(|(s, _, _, _)| s.clone()))
            .collect();
        let entry = Logged::Commit {
            run: commit.run.clone(),
            sync: commit.durability == poimen_store::Durability::Sync,
            steps,
            events,
            intents,
        };
        tokio::task::yield_now().await;
        {
            let mut left = self.refuse_after.lock().unwrap_or_else(|p| p.into_inner());
            match *left {
                Some(0) => {
                    *left = None;
                    return Err(poimen_store::StoreError::Busy {
                        path: "counted".into(),
                    });
                }
                Some(n) => *left = Some(n - 1),
                None => {}
            }
        }
        let resumed = commit
            .run_update
            .as_ref()
            .filter(|_| commit.events.iter().any(|e| e.kind == "run_resumed"))
            .map(|u| u.updated_at);
        let r = self.inner.commit(commit).await;
        if r.is_ok() {
            push(&self.log, entry);
        }
        if let (Some(now), Some((host, claimed))) = (resumed, &self.interloper) {
            let got = self.inner.claim_runnable(host, now, 30_000, 8).await?;
            let mut claimed = claimed.lock().unwrap_or_else(|p| p.into_inner());
            claimed.extend(got.into_iter().map(|(r, _)| r.id));
        }
        r
    }
    async fn events(
        &self,
        run: &poimen_store::RunId,
    ) -> poimen_store::StoreResult<Vec<poimen_store::StoredEvent>> {
        push(&self.log, Logged::Read("events"));
        self.inner.events(run).await
    }
    async fn events_after(
        &self,
        run: &poimen_store::RunId,
        seq: u64,
    ) -> poimen_store::StoreResult<Vec<poimen_store::StoredEvent>> {
        push(&self.log, Logged::Read("events_after"));
        self.inner.events_after(run, seq).await
    }
    async fn intents(
        &self,
        run: &poimen_store::RunId,
    ) -> poimen_store::StoreResult<Vec<poimen_store::IntentRecord>> {
        push(&self.log, Logged::Read("intents"));
        self.inner.intents(run).await
    }
    async fn judgment(
        &self,
        id: &poimen_store::JudgmentId,
    ) -> poimen_store::StoreResult<Option<poimen_store::JudgmentRecord>> {
        self.inner.judgment(id).await
    }
    async fn open_judgments(&self) -> poimen_store::StoreResult<Vec<poimen_store::JudgmentRecord>> {
        self.inner.open_judgments().await
    }
    async fn claim_run(
        &self,
        run: &poimen_store::RunId,
        owner: &str,
        now: i64,
        ttl_ms: i64,
    ) -> poimen_store::StoreResult<Option<poimen_store::Lease>> {
        let r = self.inner.claim_run(run, owner, now, ttl_ms).await;
        self.wrote("claim_run", r)
    }
    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl_ms: i64,
        limit: u32,
    ) -> poimen_store::StoreResult<Vec<(poimen_store::RunRecord, poimen_store::Lease)>> {
        let r = self.inner.claim_runnable(owner, now, ttl_ms, limit).await;
        self.wrote("claim_runnable", r)
    }
    async fn renew_lease(
        &self,
        lease: &poimen_store::Lease,
        now: i64,
        ttl_ms: i64,
    ) -> poimen_store::StoreResult<poimen_store::Lease> {
        let r = self.inner.renew_lease(lease, now, ttl_ms).await;
        self.wrote("renew_lease", r)
    }
    async fn release_lease(&self, lease: &poimen_store::Lease) -> poimen_store::StoreResult<()> {
        let r = self.inner.release_lease(lease).await;
        self.wrote("release_lease", r)
    }
    async fn sync(&self) -> poimen_store::StoreResult<()> {
        let r = self.inner.sync().await;
        self.wrote("sync", r)
    }
    async fn runs_owned_by(
        &self,
        owner: &str,
    ) -> poimen_store::StoreResult<Vec<poimen_store::RunRecord>> {
        self.inner.runs_owned_by(owner).await
    }
    async fn set_wake(
        &self,
        run: &poimen_store::RunId,
        at: Option<i64>,
    ) -> poimen_store::StoreResult<()> {
        let r = self.inner.set_wake(run, at).await;
        self.wrote("set_wake", r)
    }
    async fn next_wake(&self) -> poimen_store::StoreResult<Option<i64>> {
        self.inner.next_wake().await
    }
    async fn arm(
        &self,
        workflow: &WorkflowId,
        version: Option<&WorkflowVersion>,
        at: i64,
    ) -> poimen_store::StoreResult<Option<poimen_store::ArmedRecord>> {
        let r = self.inner.arm(workflow, version, at).await;
        self.wrote("arm", r)
    }
    async fn armed(
        &self,
        workflow: &WorkflowId,
    ) -> poimen_store::StoreResult<Option<poimen_store::ArmedRecord>> {
        self.inner.armed(workflow).await
    }
    async fn set_unload_deadline(
        &self,
        version: &WorkflowVersion,
        deadline: i64,
        at: i64,
    ) -> poimen_store::StoreResult<()> {
        let r = self.inner.set_unload_deadline(version, deadline, at).await;
        self.wrote("set_unload_deadline", r)
    }
    async fn unload_deadline(
        &self,
        version: &WorkflowVersion,
    ) -> poimen_store::StoreResult<Option<i64>> {
        self.inner.unload_deadline(version).await
    }
    async fn in_flight_runs(&self) -> poimen_store::StoreResult<Vec<poimen_store::RunRecord>> {
        self.inner.in_flight_runs().await
    }
    async fn gc(
        &self,
        finished_before: i64,
        dry_run: bool,
    ) -> poimen_store::StoreResult<poimen_store::GcReport> {
        let r = self.inner.gc(finished_before, dry_run).await;
        self.wrote("gc", r)
    }
}

/// Tools that log each call's start in the store's log: `free` (pure and
/// effect-free), `pure` (pure, but answered as not effect-free — as a
/// sandbox answers for a pure component granted the network),
/// `idempotent`, `once` (non-idempotent), each echoing its arguments, and
/// the verifier `nonempty`.
fn counted_tools(log: &Log) -> ScriptedTools {
    let mut tools = ScriptedTools::new()
        .verifier("nonempty", |call| Verdict {
            pass: !call.output.is_null(),
            score: 1.0,
            reason: "the output is empty".into(),
        })
        .effect_free("free");
    for (name, effect) in [
        ("free", EffectClass::Pure),
        ("pure", EffectClass::Pure),
        ("idempotent", EffectClass::Idempotent),
        ("once", EffectClass::NonIdempotent),
    ] {
        let log = log.clone();
        tools = tools.tool(name, effect, move |call, _| {
            push(&log, Logged::Called(call.idempotency_key.clone()));
            Ok(call.args.clone())
        });
    }
    tools
}

/// A kernel whose executor writes through a [`CountingStore`].
fn counted_kernel() -> (Kernel, Log) {
    counted_kernel_with(ExecutorConfig::default())
}

/// [`counted_kernel`] under `config`.
fn counted_kernel_with(config: ExecutorConfig) -> (Kernel, Log) {
    counted_kernel_refusing(config, None)
}

/// [`counted_kernel_with`], its store refusing the commit after the first
/// `refuse_after` (once).
fn counted_kernel_refusing(config: ExecutorConfig, refuse_after: Option<usize>) -> (Kernel, Log) {
    counted_kernel_over(config, refuse_after, None)
}

/// [`counted_kernel_refusing`], with a serving loop of the same host
/// claiming after every resuming commit when `interloper` is set (see
/// [`CountingStore::interloper`]).
fn counted_kernel_over(
    config: ExecutorConfig,
    refuse_after: Option<usize>,
    interloper: Option<(String, Arc<std::sync::Mutex<Vec<poimen_store::RunId>>>)>,
) -> (Kernel, Log) {
    let log: Log = Arc::default();
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(CountingStore {
        inner: memory.clone(),
        log: log.clone(),
        refuse_after: std::sync::Mutex::new(refuse_after),
        interloper,
    });
    let tools = Arc::new(counted_tools(&log));
    let loader = MemoryLoader::new();
    let clock = ManualClock::auto(1_000_000);
    let exec = Executor::new(
        store,
        tools.clone(),
        Arc::new(ScriptedProvider::new(vec![Rule::contains("", "ok")])),
        clock.clone(),
        loader.clone(),
        config,
    );
    let k = Kernel {
        store: memory,
        tools,
        clock,
        loader,
        exec,
    };
    (k, log)
}

/// What one tool step cost: the store commits naming it, and how many of
/// them were fsynced.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StepCost {
    syncs: usize,
    commits: usize,
}

fn cost(syncs: usize, commits: usize) -> StepCost {
    StepCost { syncs, commits }
}

/// The step whose records end a commit — `None` when a record of the run
/// (its end) does, else its last intent's step, else its last event's: the
/// step that made the commit. Records ahead of them are what the commit carried (queued
/// records of the same lane, the run's unwritten tail).
fn trigger(entry: &Logged) -> Option<&str> {
    let Logged::Commit {
        events, intents, ..
    } = entry
    else {
        return None;
    };
    if events
        .last()
        .is_some_and(|(kind, _)| kind.starts_with("run_"))
    {
        return None;
    }
    match intents.last() {
        Some((step, ..)) => Some(step.as_str()),
        None => events.last().and_then(|(_, s)| s.as_deref()),
    }
}

/// Checks the guarantees of every tool call in `log` and returns what each
/// call's step cost, by step name:
///
/// - the `Dispatched` and outcome intents of calls that may have an effect
///   in one commit are of one step at most (a fan-out branch's queued
///   records never ride in a sibling's commit; only the unwritten tail —
///   effect-free records, and a non-idempotent call's `Pending` — is the
///   run's, and rides in whichever commit is written next: if that commit
///   fails, every later commit of the run is refused);
/// - the call's `Dispatched` intent is in a `Sync` commit that returned
///   before the call began, and its `Pending` in that commit or an earlier
///   one of the run (durable no later than `Dispatched`: a buffered commit
///   is ordered before the fsync that follows it) — unless the tool is
///   `free` (effect-free): then nothing of the call is written before it,
///   and `Pending`, `Dispatched` and the outcome are in one commit after it;
/// - its outcome (`Committed`/`Failed`) follows the call and is made
///   durable — by its own commit or a later `Sync` write — before the run
///   commits anything of another step, or its end (an effect-free call's:
///   by some later `Sync` write);
/// - no other durable write (a blob, a run, a claim) falls between the
///   step's first commit and its last: the step's fsyncs are its commits'.
fn step_costs(log: &[Logged]) -> BTreeMap<String, StepCost> {
    for e in log {
        if let Logged::Commit { intents, .. } = e {
            let steps: std::collections::BTreeSet<&str> = intents
                .iter()
                .filter(|(_, phase, _, tool)| tool != "free" && *phase != IntentPhase::Pending)
                .map(|(s, ..)| s.as_str())
                .collect();
            assert!(steps.len() <= 1, "one commit, intents of one step: {e:?}");
        }
    }
    let durable = |from: usize| {
        log[from..]
            .iter()
            .position(|e| matches!(e, Logged::Commit { sync: true, .. } | Logged::Write(_)))
            .map(|n| from + n)
    };
    let mut costs = BTreeMap::new();
    for (called, entry) in log.iter().enumerate() {
        let Logged::Called(key) = entry else { continue };
        let with = |phase: IntentPhase| {
            log.iter().position(|e| match e {
                Logged::Commit { intents, .. } => {
                    intents.iter().any(|(_, p, k, _)| *p == phase && k == key)
                }
                _ => false,
            })
        };
        let dispatched = with(IntentPhase::Dispatched).expect("a dispatched intent");
        let Logged::Commit {
            run, sync, intents, ..
        } = &log[dispatched]
        else {
            unreachable!("`with` finds commits only")
        };
        let (step, tool) = intents
            .iter()
            .find(|(_, _, k, _)| k == key)
            .map(|(s, _, _, t)| (s.clone(), t.clone()))
            .expect("the intent's step");
        let pending = with(IntentPhase::Pending).expect("a pending intent");
        let outcome = with(IntentPhase::Committed)
            .or_else(|| with(IntentPhase::Failed))
            .expect("an outcome");
        if tool == "free" {
            assert!(
                pending == dispatched && dispatched == outcome,
                "`{step}`: an effect-free call's intents ride with its outcome"
            );
        } else {
            assert!(*sync, "`{step}`: its `Dispatched` is fsynced");
            assert!(
                dispatched < called,
                "`{step}`: `Dispatched` is durable before the call"
            );
            assert!(pending <= dispatched, "`{step}`: `Pending` first");
        }
        assert!(outcome > called, "`{step}`: the outcome follows the call");
        let durable_at = durable(outcome).expect("the outcome is made durable");
        // The run's next commit that is not about this step: another
        // step's records, or the run's end.
        let moves_on = log[outcome + 1..].iter().position(|e| match e {
            Logged::Commit {
                run: r,
                steps,
                events,
                ..
            } => {
                r == run
                    && (steps.iter().any(|s| *s != step)
                        || events.iter().any(|(k, _)| k.starts_with("run_")))
            }
            _ => false,
        });
        // An effect-free outcome need not be durable before the run moves
        // on: lost, it is made again.
        if let Some(n) = moves_on.filter(|_| tool != "free") {
            assert!(
                durable_at <= outcome + n,
                "`{step}`: its outcome (entry {outcome}) is durable (at {durable_at}) before the run moves on (entry {})",
                outcome + 1 + n
            );
        }
        let mine: Vec<(usize, bool)> = log
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Logged::Commit {
                    run: r,
                    sync,
                    steps,
                    ..
                } if r == run && steps.contains(&step) => Some((i, *sync)),
                _ => None,
            })
            .collect();
        if let (Some((first, _)), Some((last, _))) = (mine.first(), mine.last()) {
            let other: Vec<&str> = log[*first..*last]
                .iter()
                .filter_map(|e| match e {
                    Logged::Write(what) => Some(*what),
                    _ => None,
                })
                .collect();
            assert!(other.is_empty(), "`{step}`: other fsyncs {other:?}");
        }
        let made: Vec<bool> = log
            .iter()
            .filter_map(|e| match e {
                Logged::Commit { run: r, sync, .. }
                    if r == run && trigger(e) == Some(step.as_str()) =>
                {
                    Some(*sync)
                }
                _ => None,
            })
            .collect();
        costs.insert(
            step,
            StepCost {
                syncs: made.iter().filter(|s| **s).count(),
                commits: made.len(),
            },
        );
    }
    costs
}

/// Runs `def` (with `child` added first, if any) on a counted kernel to
/// completion and returns the log.
async fn counted_log(def: &WorkflowDef, child: Option<&WorkflowDef>) -> Vec<Logged> {
    let (k, log) = counted_kernel();
    if let Some(c) = child {
        k.add(c);
    }
    let out = k.run(def, json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    log.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Runs `def` and checks each tool step named in `expect` cost exactly
/// that (never more than two fsyncs).
async fn assert_costs(
    def: &WorkflowDef,
    child: Option<&WorkflowDef>,
    expect: &[(&str, StepCost)],
) -> Vec<Logged> {
    let log = counted_log(def, child).await;
    let costs = step_costs(&log);
    for (step, want) in expect {
        let got = costs
            .get(*step)
            .unwrap_or_else(|| panic!("{}: no tool call of `{step}`", def.id));
        assert!(got.syncs <= 2, "{}: `{step}` fsyncs {got:?}", def.id);
        assert_eq!(got, want, "{}: `{step}`\n{log:#?}", def.id);
    }
    log
}

/// How a tool's calls are written (see `run/intent.rs`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Writes {
    /// Effect-free: nothing ahead of the call, nothing after it but the
    /// run's unwritten tail.
    Nothing,
    /// Pure or idempotent: `Pending` and `Dispatched` in one fsynced commit.
    Ahead,
    /// Non-idempotent: `Pending` held in the tail, then written with
    /// `Dispatched`, fsynced.
    PendingApart,
}

/// Each counted tool, and how its calls are written.
const TOOLS: [(&str, Writes); 4] = [
    ("free", Writes::Nothing),
    ("pure", Writes::Ahead),
    ("idempotent", Writes::Ahead),
    ("once", Writes::PendingApart),
];

/// What a plain tool step (on the spine, in a branch, in a child run)
/// costs for each way of writing.
fn plain_cost(writes: Writes) -> StepCost {
    match writes {
        Writes::Nothing => cost(0, 0),
        Writes::Ahead | Writes::PendingApart => cost(2, 2),
    }
}

/// Two tool steps of `tool` one after the other (so the first's outcome
/// must be durable before the second starts).
fn spine_of(tool: &str) -> WorkflowDef {
    WorkflowDef::new("t.spine")
        .with_step(StepDef::tool("a", r(tool), json!({"x": 1})))
        .with_step(StepDef::tool("b", r(tool), json!({"x": 2})))
        .with_edge("a", "b")
}

#[tokio::test]
async fn durable_a_spine_tool_step_takes_two_fsyncs() {
    // Pure or idempotent: start + `Pending` + `Dispatched` in one fsynced
    // commit, `tool_called` + outcome + the step's end in the next.
    //
    // Non-idempotent: the intent protocol (DESIGN.md, "The intent
    // protocol") wants `Pending` durable no later than `Dispatched`, so
    // that no crash leaves `Dispatched` without it. `Pending` is a commit
    // of its own that needs no durability: held in the run's unwritten
    // tail, it is written with `Dispatched`, in one transaction, fsynced.
    // A crash before that leaves no record of the call, which recovery
    // then makes. Two commits, both fsyncs.
    //
    // Effect-free: start, `Pending`, `Dispatched`, `tool_called`, outcome
    // and the step's end are held in the tail and ride in the run's next
    // written commit (here its end): the step makes no commit.
    for (tool, writes) in TOOLS {
        let c = plain_cost(writes);
        assert_costs(&spine_of(tool), None, &[("a", c), ("b", c)]).await;
    }
}

#[tokio::test]
async fn durable_a_tool_step_in_each_branch_of_a_fanout_takes_two_fsyncs() {
    // Each branch is a lane of its own: its start rides with its own
    // `Dispatched`, its outcome with its own end (2 fsyncs, 2 commits; the
    // non-idempotent `Pending` a buffered commit more). The commits of the
    // branches interleave, and none carries another branch's records
    // (`step_costs`).
    for (tool, writes) in TOOLS {
        let def = WorkflowDef::new("t.fan")
            .with_step(StepDef::parallel("fan", ["left", "mid", "right"]))
            .with_step(StepDef::tool("left", r(tool), json!("L")))
            .with_step(StepDef::tool("mid", r(tool), json!("M")))
            .with_step(StepDef::tool("right", r(tool), json!("R")))
            .with_step(StepDef::tool("after", r(tool), json!("A")))
            .with_edge("fan", "after");
        let c = plain_cost(writes);
        let log = assert_costs(
            &def,
            None,
            &[("left", c), ("mid", c), ("right", c), ("after", c)],
        )
        .await;
        // The branches ran concurrently: some branch committed between
        // another's first and last commit.
        let of = |step: &str| -> Vec<usize> {
            log.iter()
                .enumerate()
                .filter(|(_, e)| matches!(e, Logged::Commit { steps, .. } if steps.contains(step)))
                .map(|(i, _)| i)
                .collect()
        };
        let spans: Vec<(usize, usize)> = ["left", "mid", "right"]
            .iter()
            .map(|b| {
                let at = of(b);
                (at[0], at[at.len() - 1])
            })
            .collect();
        let overlap = spans.iter().enumerate().any(|(i, (f, l))| {
            spans
                .iter()
                .enumerate()
                .any(|(j, (f2, l2))| i != j && f2 < l && f < l2)
        });
        // (An effect-free branch is one commit: nothing to interleave.)
        assert!(
            overlap || writes == Writes::Nothing,
            "{tool}: the branches interleave: {spans:?}"
        );
    }
}

#[tokio::test]
async fn durable_a_tool_step_with_a_verifier_takes_two_fsyncs() {
    // The call's outcome is fsynced on its own before the verifier runs
    // (a crash while it runs must not cost the call), and the verdicts
    // ride with the step's end in the tail: 2 fsyncs, 2 commits (none for
    // an effect-free call, whose outcome is only made again if lost).
    for (tool, writes) in TOOLS {
        let verified = |id: &str| {
            StepDef::tool(id, r(tool), json!({"x": 1})).with_verifier(r("nonempty"), Value::Null)
        };
        let def = WorkflowDef::new("t.verified")
            .with_step(verified("a"))
            .with_step(verified("b"))
            .with_edge("a", "b");
        let c = plain_cost(writes);
        assert_costs(&def, None, &[("a", c), ("b", c)]).await;
    }
}

#[tokio::test]
async fn durable_a_tool_step_in_a_sub_workflow_takes_two_fsyncs() {
    // The child run's tool steps are its spine's: they cost what a spine
    // step costs, and so does the parent's step after the child's.
    for (tool, writes) in TOOLS {
        let child = WorkflowDef::new("t.inner")
            .with_step(StepDef::tool("c", r(tool), json!({"x": 1})))
            .with_step(StepDef::tool("d", r(tool), json!({"x": 2})))
            .with_edge("c", "d");
        let parent = WorkflowDef::new("t.outer")
            .with_step(StepDef::sub_workflow("call", "t.inner"))
            .with_step(StepDef::tool("after", r(tool), json!({"x": 3})))
            .with_edge("call", "after");
        let c = plain_cost(writes);
        assert_costs(&parent, Some(&child), &[("c", c), ("d", c), ("after", c)]).await;
    }
}

/// The run's store commits in `log`: (fsynced, events in it).
fn run_commits(log: &[Logged]) -> Vec<(bool, usize)> {
    log.iter()
        .filter_map(|e| match e {
            Logged::Commit { sync, events, .. } => Some((*sync, events.len())),
            _ => None,
        })
        .collect()
}

/// Three steps of `tools`, one after another.
fn chain_of(tools: [&str; 3]) -> WorkflowDef {
    WorkflowDef::new("t.chain")
        .with_step(StepDef::tool("a", r(tools[0]), json!({"x": 1})))
        .with_step(StepDef::tool("b", r(tools[1]), json!({"x": 2})))
        .with_step(StepDef::tool("c", r(tools[2]), json!({"x": 3})))
        .with_edge("a", "b")
        .with_edge("b", "c")
}

#[tokio::test]
async fn durable_an_effect_free_run_is_written_at_its_start_and_its_end() {
    // Issue 44: three effect-free steps make no commit of their own; the
    // run is written when it starts and when it ends, the end carrying
    // every step's records in one fsynced commit — the only fsync of the
    // run: its caller waits for it, so its start (and its creation) are
    // made durable by the end.
    let log = counted_log(&chain_of(["free", "free", "free"]), None).await;
    let commits = run_commits(&log);
    let synced: Vec<bool> = commits.iter().map(|(sync, _)| *sync).collect();
    assert_eq!(synced, [false, true], "{log:#?}");
    assert!(
        !log.iter().any(|e| matches!(e, Logged::Write("sync"))),
        "{log:#?}"
    );
    let last = log
        .iter()
        .rev()
        .find(|e| matches!(e, Logged::Commit { .. }))
        .expect("a commit");
    let Logged::Commit { steps, events, .. } = last else {
        unreachable!()
    };
    assert_eq!(steps.len(), 3, "every step rides in the end: {last:?}");
    assert!(events.iter().any(|(k, _)| k == "run_completed"), "{last:?}");
}

#[tokio::test]
async fn durable_a_run_driven_as_it_starts_reads_back_neither_its_episode_nor_its_intents() {
    // Issue 44: the run is driven from the context its start was written
    // through; reading the episode back and refolding it (and its intents)
    // is for a run loaded from the store — recovered, claimed, resumed.
    for tools in [["free", "free", "free"], ["free", "idempotent", "free"]] {
        let (k, log) = counted_kernel();
        let runnable = k.add(&chain_of(tools));
        // Not `Kernel::run`: it refolds the episode after, a read of its own.
        let out = k
            .exec
            .run(runnable, json!({}), StartOptions::default())
            .await
            .expect("the run starts");
        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
        let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let reads: Vec<&str> = log
            .iter()
            .filter_map(|e| match e {
                Logged::Read(what) => Some(*what),
                _ => None,
            })
            .collect();
        assert!(reads.is_empty(), "{tools:?}: read back {reads:?}\n{log:#?}");
    }
    // A run resumed is loaded from the store: the same log shows its reads.
    let (k, log) = counted_kernel();
    let runnable = k.add(&chain_of(["free", "free", "free"]));
    let started = k
        .exec
        .start(runnable, json!({}), StartOptions::default())
        .await
        .expect("started");
    let out = k.exec.resume(&started.run).await.expect("resumed");
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        log.iter().any(|e| matches!(e, Logged::Read("events"))),
        "{log:#?}"
    );
}

#[tokio::test]
async fn durable_a_run_whose_id_is_out_before_it_stops_has_its_start_fsynced() {
    // `start` hands the run's id back before the run is driven: its start
    // is fsynced before it returns. One started for a waiting caller is
    // not, until the caller makes it durable (or the run stops).
    let (k, log) = counted_kernel();
    let def = chain_of(["free", "free", "free"]);
    let runnable = k.add(&def);
    let handed = k
        .exec
        .start(runnable.clone(), json!({"n": 1}), StartOptions::default())
        .await
        .expect("start");
    let waited = k
        .exec
        .start(
            runnable,
            json!({"n": 2}),
            StartOptions {
                waited: true,
                ..StartOptions::default()
            },
        )
        .await
        .expect("start");
    k.exec.make_durable(&waited.run).await.expect("durable");
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let starts: Vec<(&poimen_store::RunId, bool)> = log
        .iter()
        .filter_map(|e| match e {
            Logged::Commit { run, sync, .. } => Some((run, *sync)),
            _ => None,
        })
        .collect();
    assert_eq!(
        starts,
        [(&handed.run, true), (&waited.run, false)],
        "{log:#?}"
    );
    assert!(
        matches!(log.last(), Some(Logged::Write("sync"))),
        "the waited start made durable: {log:#?}"
    );
    for s in [handed, waited] {
        let out = k.exec.drive_started(s).await.expect("driven");
        assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
        k.check_refold(&out).await;
    }
}

#[tokio::test]
async fn durable_an_effect_between_effect_free_steps_costs_its_two_fsyncs_and_no_more() {
    // The middle step may have an effect: its `Dispatched` (carrying the
    // first step's records) and its outcome are fsynced; the last step
    // rides in the run's end. Start (made durable by the effect's first
    // fsync), two for the effect, end.
    for tool in ["pure", "idempotent", "once"] {
        let def = chain_of(["free", tool, "free"]);
        let log = assert_costs(
            &def,
            None,
            &[("a", cost(0, 0)), ("b", cost(2, 2)), ("c", cost(0, 0))],
        )
        .await;
        let commits = run_commits(&log);
        assert_eq!(commits.len(), 4, "{tool}: {log:#?}");
        let synced: Vec<bool> = commits.iter().map(|(sync, _)| *sync).collect();
        assert_eq!(synced, [false, true, true, true], "{tool}: {log:#?}");
    }
}

#[tokio::test]
async fn durable_a_long_effect_free_run_is_written_at_the_tail_bound() {
    // With a bound of 4 events the tail is written, buffered, whenever it
    // would reach it: no written commit but the run's end is fsynced (its
    // caller waits, so not its start either), and the run still ends with
    // every step recorded once.
    let config = ExecutorConfig {
        tail: TailBound {
            events: 4,
            ms: u32::MAX,
        },
        ..ExecutorConfig::default()
    };
    let (k, log) = counted_kernel_with(config);
    let def = chain_of(["free", "free", "free"]);
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let commits = run_commits(&log);
    assert!(commits.len() > 2, "the bound wrote the tail: {log:#?}");
    let (first, rest) = commits.split_first().expect("commits");
    let (last, middle) = rest.split_last().expect("an end");
    assert!(!first.0 && last.0, "the end alone is fsynced: {commits:?}");
    assert!(middle.iter().all(|(sync, _)| !*sync), "{commits:?}");
    assert_eq!(k.tools.calls().len(), 3);
}

#[tokio::test]
async fn durable_a_refused_write_that_carried_the_tail_stops_every_lane() {
    // Three branches of effect-free steps, then a step with an effect: the
    // first written commit after the run's start (the effect's, carrying
    // every branch's tail) is refused. The tail it carried is in no store,
    // so the run writes nothing after it — no lane goes on past what the
    // store holds — and the stored episode is the run's start alone, which
    // refolds; the effect was never called.
    let (k, log) = counted_kernel_refusing(ExecutorConfig::default(), Some(1));
    let def = WorkflowDef::new("t.refused")
        .with_step(StepDef::parallel("fan", ["left", "right"]))
        .with_step(StepDef::tool("left", r("free"), json!("L")))
        .with_step(StepDef::tool("right", r("free"), json!("R")))
        .with_step(StepDef::tool("after", r("idempotent"), json!("A")))
        .with_edge("fan", "after");
    let out = k
        .exec
        .run(k.add(&def), json!({}), StartOptions::default())
        .await
        .expect("an outcome");
    assert!(
        out.reason
            .as_deref()
            .unwrap_or("")
            .contains("refused a write"),
        "{:?}",
        out.reason
    );
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let commits = run_commits(&log);
    assert_eq!(commits.len(), 1, "only the start was written: {log:#?}");
    assert!(
        !log.iter()
            .any(|e| matches!(e, Logged::Called(key) if key.contains("after"))),
        "{log:#?}"
    );
    let stored = k.store.events(&out.run).await.expect("events");
    assert_eq!(stored.len(), 1, "{stored:?}");
    let ep = k.exec.episode(&out.run).await.expect("episode");
    poimen_executor::refold(&ep).expect("the stored episode refolds");
}

#[tokio::test]
async fn durable_with_no_tail_every_step_is_written_when_it_ends() {
    // `tail-events = 0`: each effect-free step is one commit of its own,
    // buffered (written before the run moves on, fsynced by the next
    // fsync: lost only to a power loss, and then only made again).
    let config = ExecutorConfig {
        tail: TailBound::NONE,
        ..ExecutorConfig::default()
    };
    let (k, log) = counted_kernel_with(config);
    let out = k.run(&chain_of(["free", "free", "free"]), json!({})).await;
    assert_eq!(out.status, RunStatus::Completed, "{:?}", out.reason);
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let costs = step_costs(&log);
    for step in ["a", "b", "c"] {
        assert_eq!(costs[step].commits, 1, "`{step}`: {log:#?}");
    }
}

#[tokio::test]
async fn durable_a_fanout_holds_the_step_limit_with_its_starts_queued() {
    // Branch starts are queued in their lanes until their first commit:
    // the step limit counts them there, so three branches under a limit of
    // three executions (the fan-out's own, and two) start two.
    let (k, _log) = counted_kernel();
    let def = WorkflowDef::new("t.limited")
        .with_step(StepDef::parallel("fan", ["left", "mid", "right"]))
        .with_step(StepDef::tool("left", r("pure"), json!("L")))
        .with_step(StepDef::tool("mid", r("pure"), json!("M")))
        .with_step(StepDef::tool("right", r("pure"), json!("R")))
        .with_limits(Limits {
            steps: Some(3),
            ..Limits::default()
        });
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    let reason = out.reason.clone().unwrap_or_default();
    assert!(reason.contains("its limit is 3"), "{reason}");
    assert_eq!(out.state.spent.step_executions, 3, "{:?}", out.state.spent);
    assert!(k.tools.calls().len() <= 2, "{:?}", k.tools.calls());
}

#[tokio::test]
async fn durable_a_branch_that_halts_commits_what_its_lane_queued() {
    // The tool-call budget stops every branch after its start was queued
    // and before its intent: each branch's own lane commits its start (as
    // the run's failure carries a spine step's), and the episode refolds to
    // the live state (`Kernel::run`).
    let (k, log) = counted_kernel();
    let def = WorkflowDef::new("t.spent")
        .with_step(StepDef::parallel("fan", ["left", "right"]))
        .with_step(StepDef::tool("left", r("pure"), json!("L")))
        .with_step(StepDef::tool("right", r("pure"), json!("R")))
        .with_budget(BudgetDef {
            tool_calls: Some(0),
            ..BudgetDef::default()
        });
    let out = k.run(&def, json!({})).await;
    assert_eq!(out.status, RunStatus::Failed);
    assert!(k.tools.calls().is_empty());
    let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for branch in ["left", "right"] {
        let started = log.iter().any(|e| match e {
            Logged::Commit { steps, events, .. } => {
                steps.contains(branch) && events.iter().any(|(k, _)| k == "step_started")
            }
            _ => false,
        });
        assert!(started, "`{branch}`: its start is committed\n{log:#?}");
    }
}
