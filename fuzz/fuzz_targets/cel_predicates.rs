//! Fuzz target: CEL predicates, where the validator compiles and checks them
//! and where the executor evaluates them over recorded state.
//!
//! Input: the predicate's text, optionally followed by a NUL byte and a JSON
//! document used as the run's `inputs` (a fixed one otherwise). The
//! predicate is placed both as a conditional step's `on` and as a
//! back-edge's `when` in a small workflow, which is validated; and it is
//! evaluated with `render::eval_predicate` over a recorded-state context
//! (`inputs`, declared `state`, `steps.<id>.output`/`status`).
//!
//! Asserts: neither compiling and checking any predicate, nor evaluating one
//! whose text the validator accepts (the executor evaluates only those),
//! panics, overflows a worker thread's 2 MiB stack, or fails to end within
//! the per-input timeout; evaluation is deterministic (two evaluations over
//! the same state give the same answer); a predicate the validator accepts
//! compiles when the executor evaluates it (the answer is a boolean or a
//! typed evaluation error, never a compile error).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use poimen_executor::render::{RenderError, eval_predicate};
use poimen_workflow::{Format, Predicate, StepKind, ValidationError, WorkflowDef, parse, validate};
use serde_json::{Value, json};

const TEMPLATE: &str = r#"
id: fuzz.cel
inputs: {type: object}
state:
  seen: {reducer: append}
  label: {}
steps:
  - id: a
    model: {prompt: "hi"}
  - id: c
    conditional: {on: "true", then: b, otherwise: d}
  - id: b
    model: {prompt: "b"}
  - id: d
    model: {prompt: "d"}
transitions:
  - {from: a, to: c}
  - {from: c, to: a, max_iterations: 3, when: "true"}
"#;

fn template() -> &'static WorkflowDef {
    static DEF: OnceLock<WorkflowDef> = OnceLock::new();
    DEF.get_or_init(|| parse(TEMPLATE.as_bytes(), Format::Yaml, "cel.yaml").expect("template"))
}

fn with_predicate(p: &str) -> WorkflowDef {
    let mut def = template().clone();
    for s in &mut def.steps {
        if let StepKind::Conditional(c) = &mut s.kind {
            c.on = Predicate(p.to_owned());
        }
    }
    for t in &mut def.transitions {
        if t.when.is_some() {
            t.when = Some(Predicate(p.to_owned()));
        }
    }
    def
}

fn context(inputs: Value) -> Value {
    json!({
        "inputs": inputs,
        "state": {"seen": [1, "two", {"three": 3.5}], "label": null},
        "steps": {
            "a": {"output": {"label": "spam", "n": 5, "list": [1, 2, 3]}, "status": "completed"},
            "b": {"status": "pending"},
            "c": {"output": "b", "status": "completed"},
        },
    })
}

fuzz_target!(|data: &[u8]| {
    let (pred, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let Ok(pred) = std::str::from_utf8(pred) else {
        return;
    };
    let inputs = rest
        .and_then(|r| serde_json::from_slice::<Value>(r).ok())
        .unwrap_or_else(|| json!({"text": "hi", "n": 5, "flag": true}));
    let ctx = context(inputs);

    poimen_fuzz::on_worker_stack(|| {
        let def = with_predicate(pred);
        let fixed = poimen_fuzz::fixed();
        // What the executor may evaluate: a predicate whose text the
        // validator accepts (it compiles, within the size, depth and loop
        // nesting limits; what it reads and calls is checked separately).
        let evaluable = match validate(&def, &fixed.registries()) {
            Ok(_) => true,
            Err(errors) => {
                assert!(!errors.is_empty());
                !errors.iter().any(|e| {
                    matches!(
                        e,
                        ValidationError::PredicateSyntax { .. }
                            | ValidationError::PredicateTooLarge { .. }
                            | ValidationError::PredicateTooDeep { .. }
                            | ValidationError::PredicateLoopsTooDeep { .. }
                    )
                })
            }
        };
        if !evaluable {
            return;
        }
        let first = eval_predicate(pred, &ctx);
        let second = eval_predicate(pred, &ctx);
        assert_eq!(
            first, second,
            "a predicate evaluated twice gave two answers"
        );
        if let Err(RenderError::Predicate { message, .. }) = &first {
            let compiles = cel::Program::compile(pred).is_ok();
            assert!(
                compiles,
                "accepted by the validator, refused by the executor: {message}"
            );
        }
    });
});
