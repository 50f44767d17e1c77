//! Generated workflows for the benchmarks: `n` steps of realistic shape.
//!
//! Top-level steps form a chain with extra fan-in edges (every 7th step
//! also waits on the step three back). Most steps are `text` tool calls
//! whose arguments template the previous step's output; every 10th is a
//! model step; every 20th a parallel step owning two tool branches that
//! both append to declared state; every 100th a conditional owning a model
//! step; every 200th closes a bounded loop with a `when` predicate.
#![allow(dead_code)]

use std::num::NonZeroU32;

use poimen_workflow::*;
use serde_json::json;

pub fn workflow(n: usize) -> WorkflowDef {
    let mut wf = WorkflowDef::new(format!("bench.w{n}").as_str())
        .with_inputs(json!({"type": "object", "properties": {"text": {"type": "string"}}}))
        .with_state(
            "notes",
            StateDecl::reduced(Reducer::Append).with_schema(json!({"type": "array"})),
        );
    let text = ToolRef::parse("text@^0.1").expect("ref");
    let mut count = 0;
    let mut prev: Option<String> = None;
    let mut back3: Vec<String> = Vec::new();
    let mut k = 0usize;
    while count < n {
        let id = format!("s{k}");
        let input = match &prev {
            Some(p) => format!("{{{{ steps.{p}.output }}}}"),
            None => "{{ inputs.text }}".to_owned(),
        };
        let left = n - count;
        if k % 20 == 5 && left >= 3 {
            let (a, b) = (format!("{id}_a"), format!("{id}_b"));
            wf = wf
                .with_step(StepDef::parallel(id.as_str(), [a.as_str(), b.as_str()]))
                .with_step(
                    StepDef::tool(
                        a.as_str(),
                        text.clone(),
                        json!({"op": "count", "pattern": "a", "text": input}),
                    )
                    .with_writes("notes"),
                )
                .with_step(
                    StepDef::tool(
                        b.as_str(),
                        text.clone(),
                        json!({"op": "count", "pattern": "b", "text": input}),
                    )
                    .with_writes("notes"),
                );
            count += 3;
        } else if k % 100 == 50 && left >= 2 && prev.is_some() {
            let then = format!("{id}_then");
            let p = prev.clone().unwrap_or_default();
            wf = wf
                .with_step(StepDef::conditional(
                    id.as_str(),
                    format!("size(steps.{p}.output) > {k}").as_str(),
                    then.as_str(),
                ))
                .with_step(StepDef::model(
                    then.as_str(),
                    format!("Explain {input}").as_str(),
                ));
            count += 2;
        } else if k.is_multiple_of(10) {
            wf = wf.with_step(
                StepDef::new(
                    id.as_str(),
                    ModelStep::new(format!("Summarize step {k}: {input}").as_str())
                        .with_effort(ReasoningEffort::Low),
                )
                .with_timeout(Millis::secs(30)),
            );
            count += 1;
        } else {
            wf = wf.with_step(StepDef::tool(
                id.as_str(),
                text.clone(),
                json!({"op": "count", "pattern": "x", "text": input}),
            ));
            count += 1;
        }
        if let Some(p) = &prev {
            wf = wf.with_edge(p.as_str(), id.as_str());
        }
        if k % 7 == 6
            && let Some(b) = back3.get(back3.len().saturating_sub(3))
            && Some(b) != prev.as_ref()
        {
            wf = wf.with_edge(b.as_str(), id.as_str());
        }
        if k % 200 == 199 && k >= 5 {
            let to = format!("s{}", k - 5);
            let when = format!("steps.{id}.output != {k}");
            wf = wf.with_loop(
                id.as_str(),
                to.as_str(),
                NonZeroU32::new(3).expect("3"),
                Some(when.as_str()),
            );
        }
        back3.push(id.clone());
        prev = Some(id);
        k += 1;
    }
    wf
}

/// `n` workflows calling one another: a root fans out to `fanout`
/// children, each of which calls the next layer, down to `depth` levels;
/// later workflows also call earlier ones of the next layer (shared
/// children), so the graph is a DAG, not a tree.
pub fn workflow_graph(n: usize, fanout: usize) -> (WorkflowDef, MemoryWorkflows) {
    let mut layers: Vec<Vec<String>> = vec![vec!["graph.root".to_owned()]];
    let mut made = 1;
    while made < n {
        let width = (layers.last().map_or(1, Vec::len) * fanout).min(n - made);
        layers.push(
            (0..width)
                .map(|i| format!("graph.l{}.w{i}", layers.len()))
                .collect(),
        );
        made += width;
    }
    let mut store = MemoryWorkflows::new();
    let mut root = None;
    for (l, layer) in layers.iter().enumerate().rev() {
        for (i, id) in layer.iter().enumerate() {
            let mut wf = WorkflowDef::new(id.as_str())
                .with_step(StepDef::model("plan", "Plan {{ inputs }}"))
                .with_step(StepDef::tool(
                    "count",
                    ToolRef::parse("text@^0.1").expect("ref"),
                    json!({"op": "count", "pattern": "x", "text": "{{ steps.plan.output }}"}),
                ))
                .with_edge("plan", "count");
            if let Some(next) = layers.get(l + 1) {
                for j in 0..fanout {
                    let c = (i * fanout + j) % next.len();
                    let step = format!("call{j}");
                    wf = wf
                        .with_step(StepDef::new(
                            step.as_str(),
                            SubWorkflowStep::new(next[c].as_str())
                                .with_input(json!({"text": "{{ steps.count.output }}"})),
                        ))
                        .with_edge("count", step.as_str());
                }
            }
            if l == 0 {
                root = Some(wf);
            } else {
                store.insert(version_of(&wf), wf);
            }
        }
    }
    (
        root.unwrap_or_else(|| WorkflowDef::new("graph.root")),
        store,
    )
}

/// The first-party plugin registry fixture.
pub fn registries() -> (MemoryRegistry, MemoryRegistry) {
    #[derive(serde::Deserialize)]
    struct Fixture {
        tools: Vec<ToolInfo>,
        verifiers: Vec<ToolInfo>,
    }
    let f: Fixture = serde_json::from_str(include_str!("../../../fixtures/registry/tools.json"))
        .expect("fixture");
    let mut tools = MemoryRegistry::new("tools");
    f.tools.into_iter().for_each(|t| tools.insert(t));
    let mut verifiers = MemoryRegistry::new("verifiers");
    f.verifiers.into_iter().for_each(|t| verifiers.insert(t));
    (tools, verifiers)
}
