//! Seeds the fuzz corpora cannot take from `fixtures/` as they are:
//!
//! * `DIR/refold/`: real episodes, recorded by running a table of small
//!   workflows (every step kind, retries, verifiers, joins, loops, budgets,
//!   a judgment's pause and answer, a sub-workflow, an operator's retry) on
//!   the executor's scripted doubles and an in-memory store, each written
//!   as the JSON array of its recorded events (`Recorded::to_json`);
//! * `DIR/canonical/`: the canonical bytes of every workflow fixture, so
//!   `from_canonical`'s accepting path is reached from the first input.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example gen_seeds -- DIR`
//! (an uninstrumented build); then copy each into `fuzz/work/TARGET` and
//! `fuzz/run.sh minimize TARGET`.

use std::num::NonZeroU32;

// Built with the fuzz targets' instrumentation, this binary needs the
// coverage callbacks libFuzzer defines.
use libfuzzer_sys as _;
use std::sync::Arc;

use poimen_executor::model::{Rule, ScriptedProvider};
use poimen_executor::testing::{ManualClock, MemoryLoader, ScriptedTools};
use poimen_executor::{
    Executor, ExecutorConfig, FailureClass, JudgmentSubmission, StartOptions, Verdict,
};
use poimen_store::MemoryStore;
use poimen_workflow::*;
use serde_json::{Value, json};

fn r(name: &str) -> ToolRef {
    format!("{name}@^1").parse().expect("tool ref")
}

fn tools() -> ScriptedTools {
    ScriptedTools::new()
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

fn retried(tool: &str, attempts: u32) -> WorkflowDef {
    WorkflowDef::new("t.retry").with_step(
        StepDef::tool("a", r(tool), json!({"x": 1}))
            .with_retry(RetryPolicy::attempts(attempts).with_backoff(Millis(100))),
    )
}

fn conditional() -> WorkflowDef {
    WorkflowDef::new("t.cond")
        .with_inputs(json!({"type": "object", "properties": {"go": {"type": "boolean"}}}))
        .with_step(StepDef::conditional("route", "inputs.go", "yes").with_otherwise("no"))
        .with_step(StepDef::tool("yes", r("echo"), json!("took yes")))
        .with_step(StepDef::tool("no", r("echo"), json!("took no")))
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

fn table() -> Vec<(&'static str, WorkflowDef, Value)> {
    let two = NonZeroU32::new(2).expect("2");
    vec![
        (
            "tool",
            WorkflowDef::new("t.one").with_step(StepDef::tool("a", r("echo"), json!({"x": 1}))),
            json!({}),
        ),
        ("retry_then_success", retried("flaky", 3), json!({})),
        ("retry_exhausted", retried("broken", 2), json!({})),
        ("invalid_input", retried("picky", 3), json!({})),
        ("parallel_all", parallel(JoinPolicy::All, "echo"), json!({})),
        ("parallel_any", parallel(JoinPolicy::Any, "hang"), json!({})),
        (
            "parallel_failed",
            parallel(JoinPolicy::All, "broken"),
            json!({}),
        ),
        ("conditional_then", conditional(), json!({"go": true})),
        ("conditional_otherwise", conditional(), json!({"go": false})),
        (
            "loop",
            WorkflowDef::new("t.loop")
                .with_step(StepDef::tool("a", r("echo"), json!(1)))
                .with_step(StepDef::tool("b", r("echo"), json!(2)))
                .with_edge("a", "b")
                .with_transition(Transition::back("b", "a", two)),
            json!({}),
        ),
        (
            "loop_when",
            WorkflowDef::new("t.when")
                .with_step(StepDef::tool("a", r("echo"), json!(1)))
                .with_step(StepDef::tool("b", r("echo"), json!(2)))
                .with_edge("a", "b")
                .with_loop("b", "a", two, Some("steps.b.output == 2")),
            json!({}),
        ),
        (
            "verifier_rejects",
            WorkflowDef::new("t.verify").with_step(
                StepDef::tool("a", r("echo"), json!({"x": 1}))
                    .with_verifier(r("never"), Value::Null)
                    .with_retry(RetryPolicy::attempts(2)),
            ),
            json!({}),
        ),
        (
            "tool_budget",
            chain(3).with_budget(BudgetDef {
                tool_calls: Some(2),
                ..BudgetDef::default()
            }),
            json!({}),
        ),
        (
            "models",
            WorkflowDef::new("t.models")
                .with_step(StepDef::model("m1", "Classify: {{ inputs.text }}"))
                .with_step(StepDef::model("m2", "Summarize it"))
                .with_edge("m1", "m2"),
            json!({"text": "refund"}),
        ),
        (
            "token_budget",
            WorkflowDef::new("t.tokens")
                .with_step(StepDef::model("m1", "Classify: {{ inputs.text }}"))
                .with_step(StepDef::model("m2", "Summarize it"))
                .with_edge("m1", "m2")
                .with_budget(BudgetDef {
                    tokens: Some(2),
                    ..BudgetDef::default()
                }),
            json!({"text": "refund"}),
        ),
        ("chain", chain(4), json!({})),
    ]
}

fn write(dir: &std::path::Path, name: &str, episode: &poimen_executor::Episode) {
    let events: Vec<Value> = episode.events.iter().map(|r| r.to_json()).collect();
    let text = serde_json::to_string(&events).expect("episode JSON");
    std::fs::write(dir.join(format!("{name}.json")), text).expect("write a seed");
}

/// The canonical bytes of every workflow under `fixtures/` that parses.
fn canonical_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("seed dir");
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let mut pending = vec![fixtures.clone()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).expect("fixtures dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let name = path.display().to_string();
            let Some(format) = Format::from_path(&name) else {
                continue;
            };
            let bytes = std::fs::read(&path).expect("fixture");
            if let Ok(def) = parse(&bytes, format, &name) {
                let rel = path.strip_prefix(&fixtures).expect("under fixtures");
                let seed = rel.display().to_string().replace('/', "_");
                std::fs::write(dir.join(format!("{seed}.canonical")), canonical_bytes(&def))
                    .expect("write a seed");
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let root = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: DIR"));
    canonical_seeds(&root.join("canonical"));
    let dir = root.join("refold");
    std::fs::create_dir_all(&dir).expect("seed dir");
    let store = Arc::new(MemoryStore::new());
    let tools = Arc::new(tools());
    let loader = MemoryLoader::new();
    let models = Arc::new(ScriptedProvider::new(vec![
        Rule::contains("Classify", "billing"),
        Rule::contains("", "ok"),
    ]));
    let exec = Executor::new(
        store.clone(),
        tools.clone(),
        models,
        ManualClock::auto(1_000_000),
        loader.clone(),
        ExecutorConfig::default(),
    );
    let add = |def: &WorkflowDef| {
        loader
            .add(def, &tools)
            .unwrap_or_else(|e| panic!("{} does not validate: {e:?}", def.id))
    };

    for (name, def, input) in table() {
        let out = exec
            .run(add(&def), input, StartOptions::default())
            .await
            .expect("the run starts");
        write(&dir, name, &exec.episode(&out.run).await.expect("episode"));
    }

    // A judgment: the episode while waiting, and after the answer.
    let def = WorkflowDef::new("t.judge")
        .with_step(StepDef::tool("a", r("echo"), json!({"amount": 40})))
        .with_step(
            StepDef::judgment(
                "ok",
                "Refund {{ steps.a.output.amount }}?",
                json!({"type": "boolean"}),
            )
            .with_verifier(r("nonempty"), Value::Null),
        )
        .with_edge("a", "ok");
    let out = exec
        .run(add(&def), json!({}), StartOptions::default())
        .await
        .expect("the run starts");
    write(
        &dir,
        "judgment_waiting",
        &exec.episode(&out.run).await.expect("episode"),
    );
    let open = exec.open_judgments().await.expect("judgments").remove(0);
    let answered = exec
        .submit_judgment(
            open.id.as_str(),
            JudgmentSubmission {
                request_hash: open.request_hash.clone(),
                result: json!(true),
                executor: None,
                profile: None,
                provenance: json!({"judge": "seed"}),
            },
        )
        .await
        .expect("answered");
    write(
        &dir,
        "judgment_answered",
        &exec.episode(&answered.run).await.expect("episode"),
    );

    // A sub-workflow: the parent's and the child's episodes.
    let child = WorkflowDef::new("t.child").with_step(StepDef::tool(
        "c",
        r("echo"),
        json!("{{ inputs.word }}"),
    ));
    add(&child);
    let mut step = StepDef::sub_workflow("call", "t.child");
    if let StepKind::SubWorkflow(s) = &mut step.kind {
        s.input = ArgTemplate(json!({"word": "hi"}));
    }
    let parent = WorkflowDef::new("t.parent").with_step(step);
    let out = exec
        .run(add(&parent), json!({}), StartOptions::default())
        .await
        .expect("the run starts");
    write(
        &dir,
        "sub_parent",
        &exec.episode(&out.run).await.expect("episode"),
    );
    if let Some(link) = out.state.steps[&StepId::from("call")].child.clone() {
        write(
            &dir,
            "sub_child",
            &exec.episode(&link.run).await.expect("episode"),
        );
    }

    // An operator's retry from a failed step.
    let def = retried("broken", 1);
    let out = exec
        .run(add(&def), json!({}), StartOptions::default())
        .await
        .expect("the run starts");
    if let Ok(again) = exec.retry(&out.run, Some(StepId::from("a"))).await {
        write(
            &dir,
            "retried_run",
            &exec.episode(&again.run).await.expect("episode"),
        );
    }
    eprintln!("seeds written to {}", dir.display());
}
