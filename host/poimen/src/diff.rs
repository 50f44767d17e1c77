//! What changed between two workflow versions, in words.
//!
//! Compares the canonical forms (so formatting and key order never show up
//! as changes): steps added, removed and changed (with the fields that
//! changed), transitions added and removed, and workflow-level fields.

use std::collections::BTreeMap;

use poimen_workflow::WorkflowDef;
use serde::Serialize;
use serde_json::Value;

/// One difference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    StepAdded {
        step: String,
        kind: String,
    },
    StepRemoved {
        step: String,
        kind: String,
    },
    /// A step changed; `fields` are JSON paths inside the step (`retry.max_attempts`).
    StepChanged {
        step: String,
        fields: Vec<String>,
    },
    TransitionAdded {
        transition: String,
    },
    TransitionRemoved {
        transition: String,
    },
    /// A workflow-level field changed (`budget.tokens`, `description`).
    FieldChanged {
        field: String,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::StepAdded { step, kind } => write!(f, "step `{step}` ({kind}) was added"),
            Change::StepRemoved { step, kind } => write!(f, "step `{step}` ({kind}) was removed"),
            Change::StepChanged { step, fields } => {
                write!(f, "step `{step}` changed: {}", fields.join(", "))
            }
            Change::TransitionAdded { transition } => {
                write!(f, "transition {transition} was added")
            }
            Change::TransitionRemoved { transition } => {
                write!(f, "transition {transition} was removed")
            }
            Change::FieldChanged { field } => write!(f, "`{field}` changed"),
        }
    }
}

fn canonical_value(def: &WorkflowDef) -> Value {
    serde_json::from_slice(&poimen_workflow::canonical_bytes(def)).unwrap_or(Value::Null)
}

fn kind_of(step: &Value) -> String {
    [
        "model",
        "tool",
        "parallel",
        "conditional",
        "workflow",
        "judgment",
    ]
    .into_iter()
    .find(|k| step.get(*k).is_some())
    .unwrap_or("step")
    .to_owned()
}

fn transition_text(t: &Value) -> String {
    let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    let mut text = format!("`{}` -> `{}`", s("from"), s("to"));
    if let Some(n) = t.get("max_iterations") {
        text.push_str(&format!(" (loop, at most {n} times"));
        if let Some(w) = t.get("when").and_then(Value::as_str) {
            text.push_str(&format!(" while `{w}`"));
        }
        text.push(')');
    }
    text
}

/// Paths under `a`/`b` whose values differ.
fn changed_paths(a: &Value, b: &Value, prefix: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) if va != vb => changed_paths(va, vb, &path, out),
                    (Some(_), None) => out.push(format!("{path} (removed)")),
                    (None, Some(_)) => out.push(format!("{path} (added)")),
                    _ => {}
                }
            }
        }
        _ if a != b => out.push(if prefix.is_empty() {
            "(value)".to_owned()
        } else {
            prefix.to_owned()
        }),
        _ => {}
    }
}

/// The changes that turn `old` into `new`; empty when they are the same version.
pub fn diff(old: &WorkflowDef, new: &WorkflowDef) -> Vec<Change> {
    let (a, b) = (canonical_value(old), canonical_value(new));
    let mut changes = Vec::new();
    let steps = |v: &Value| -> BTreeMap<String, Value> {
        v.get("steps")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| Some((s.get("id")?.as_str()?.to_owned(), s.clone())))
            .collect()
    };
    let (sa, sb) = (steps(&a), steps(&b));
    for (id, s) in &sa {
        match sb.get(id) {
            None => changes.push(Change::StepRemoved {
                step: id.clone(),
                kind: kind_of(s),
            }),
            Some(t) if t != s => {
                let mut fields = Vec::new();
                changed_paths(s, t, "", &mut fields);
                changes.push(Change::StepChanged {
                    step: id.clone(),
                    fields,
                });
            }
            _ => {}
        }
    }
    for (id, s) in &sb {
        if !sa.contains_key(id) {
            changes.push(Change::StepAdded {
                step: id.clone(),
                kind: kind_of(s),
            });
        }
    }
    let transitions = |v: &Value| -> Vec<Value> {
        v.get("transitions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (ta, tb) = (transitions(&a), transitions(&b));
    for t in &ta {
        if !tb.contains(t) {
            changes.push(Change::TransitionRemoved {
                transition: transition_text(t),
            });
        }
    }
    for t in &tb {
        if !ta.contains(t) {
            changes.push(Change::TransitionAdded {
                transition: transition_text(t),
            });
        }
    }
    let (mut oa, mut ob) = (a.clone(), b.clone());
    for o in [&mut oa, &mut ob] {
        if let Some(m) = o.as_object_mut() {
            m.remove("steps");
            m.remove("transitions");
        }
    }
    let mut fields = Vec::new();
    changed_paths(&oa, &ob, "", &mut fields);
    changes.extend(
        fields
            .into_iter()
            .map(|field| Change::FieldChanged { field }),
    );
    changes
}
