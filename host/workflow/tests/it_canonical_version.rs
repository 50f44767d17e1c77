//! Canonical form and `WorkflowVersion` (issue 3; seed T3.1's Verify list).
//!
//! 1. Must match: pairs under `fixtures/canonical/must_match/` differing
//!    only in ways that must not matter (top-level key order, map entry
//!    order, indentation, trailing whitespace, YAML vs JSON, set order,
//!    explicit defaults) have the same version — and different bytes, so
//!    hashing the source would fail.
//! 2. Must differ: one character of a prompt (and one space inside one)
//!    changes the version; so do the ordered collections and descriptions.
//! 3. The per-field must-differ table: one row per IR field; the rows are
//!    checked against the fields of the format's JSON Schema, and the IR
//!    structs are destructured without `..`, so adding a field without a
//!    row fails the build or the test. The rubric's fields have rows at
//!    both of their sites (the workflow's rubric and a step's), on
//!    `step_fields.yaml`, a workflow with a step rubric and a model schema.
//! 4. Canonicalizing twice gives identical bytes; stored bytes read back.
//! 5. (Parent pointer with the v1 record unchanged on disk: the store's
//!    tests — `host/store` — own it; this crate does no IO.)
//! 6. Property tests: random IRs with *every* unordered collection permuted
//!    (IR sets, and the key order of every JSON object in the document,
//!    through both front ends) keep their version; the bytes agree with an
//!    independent RFC 8785 implementation.
//! 7. Golden versions of the fixtures are pinned.
//!
//! `cargo test -p workflow canonical` runs them all.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use common::*;
use poimen_workflow::*;
use proptest::prelude::*;
use serde_json::{Value, json};

fn canonical_dir() -> PathBuf {
    fixtures().join("canonical")
}

fn base() -> WorkflowDef {
    load(&canonical_dir().join("base.yaml"))
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .collect();
    v.sort();
    v
}

// ─── 1. must match ───────────────────────────────────────────────────────

#[test]
fn canonical_must_match_pairs_have_equal_versions_and_different_bytes() {
    let dir = canonical_dir().join("must_match");
    let files = files_in(&dir);
    let mut pairs = 0;
    for a in files.iter().filter(|p| p.to_string_lossy().contains(".a.")) {
        let stem = a
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split(".a.").next())
            .expect("name");
        let b = files
            .iter()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}.b.")))
            })
            .unwrap_or_else(|| panic!("{stem}: no .b twin"));
        let (da, db) = (load(a), load(b));
        assert_eq!(version_of(&da), version_of(&db), "{stem}: must match");
        assert_eq!(canonical_bytes(&da), canonical_bytes(&db), "{stem}");
        let (sa, sb) = (std::fs::read(a).expect("a"), std::fs::read(b).expect("b"));
        assert_ne!(
            sa, sb,
            "{stem}: the pair must differ as text, or it tests nothing"
        );
        assert_ne!(
            WorkflowVersion::of_canonical_bytes(&sa),
            WorkflowVersion::of_canonical_bytes(&sb),
            "{stem}: hashing the source would tell them apart"
        );
        if stem != "explicit_defaults" {
            assert_eq!(
                version_of(&da),
                version_of(&base()),
                "{stem}: a rewriting of base.yaml"
            );
        }
        pairs += 1;
    }
    assert_eq!(
        pairs, 7,
        "reordered top-level keys, map entries, collections, indentation, trailing whitespace, YAML vs JSON, explicit defaults"
    );
}

// ─── 2. must differ ──────────────────────────────────────────────────────

#[test]
fn canonical_must_differ_fixtures_each_have_their_own_version() {
    let mut seen = BTreeMap::new();
    seen.insert(version_of(&base()), "base.yaml".to_owned());
    for f in files_in(&canonical_dir().join("must_differ")) {
        let v = version_of(&load(&f));
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(other) = seen.insert(v, name.clone()) {
            panic!("{name} has the same version as {other}");
        }
    }
    assert_eq!(seen.len(), 6);
}

#[test]
fn canonical_one_prompt_character_changes_the_version() {
    let wf = |prompt: &str| WorkflowDef::new("w").with_step(StepDef::model("a", prompt));
    let v = version_of(&wf("Summarize {{ inputs.text }}"));
    // One character, one space, one trailing newline: each a behaviour change.
    for other in [
        "Summarise {{ inputs.text }}",
        "Summarize  {{ inputs.text }}",
        "Summarize {{ inputs.text }}\n",
        "Summarize {{inputs.text}}",
    ] {
        assert_ne!(version_of(&wf(other)), v, "{other:?}");
    }
    assert_eq!(version_of(&wf("Summarize {{ inputs.text }}")), v);
}

// ─── 3. the per-field must-differ table ──────────────────────────────────

fn step_mut<'a>(d: &'a mut WorkflowDef, id: &str) -> &'a mut StepDef {
    d.steps
        .iter_mut()
        .find(|s| s.id.as_str() == id)
        .unwrap_or_else(|| panic!("no step {id}"))
}

macro_rules! kind_mut {
    ($d:expr, $id:expr, $variant:ident) => {
        match &mut step_mut($d, $id).kind {
            StepKind::$variant(k) => k,
            other => panic!("{} is not a {}: {other:?}", $id, stringify!($variant)),
        }
    };
}

type Mutation = fn(&mut WorkflowDef);

/// One row per field of the format, keyed `Type.field` as in the JSON Schema.
fn field_rows() -> Vec<(&'static str, Mutation)> {
    vec![
        // WorkflowDef
        ("WorkflowDoc.id", |d| d.id = "docs.release_notes2".into()),
        ("WorkflowDoc.schema", |d| d.schema = SchemaVersion(2)),
        ("WorkflowDoc.description", |d| {
            d.description = Some("Draft release notes.".into())
        }),
        ("WorkflowDoc.inputs", |d| {
            d.inputs = Some(json!({"type": "object"}))
        }),
        ("WorkflowDoc.outputs", |d| d.outputs = None),
        ("WorkflowDoc.output", |d| {
            d.output = Some(ArgTemplate(json!("{{ steps.draft.output }}")))
        }),
        ("WorkflowDoc.priority", |d| d.priority = Priority::High),
        ("WorkflowDoc.concurrency", |d| {
            d.concurrency = Concurrency::default()
        }),
        ("WorkflowDoc.key", |d| {
            d.key = Some("{{ inputs.since }}".into())
        }),
        ("WorkflowDoc.durable", |d| d.durable = Some(true)),
        ("WorkflowDoc.unload", |d| {
            d.unload = Unload {
                policy: UnloadPolicy::Cancel,
                timeout: None,
            }
        }),
        ("Unload.policy", |d| d.unload.policy = UnloadPolicy::Detach),
        ("Unload.timeout", |d| {
            d.unload.timeout = Some(Millis(60_000))
        }),
        ("WorkflowDoc.state", |d| {
            d.state.remove("draft_count");
        }),
        ("WorkflowDoc.limits", |d| d.limits = Limits::default()),
        ("WorkflowDoc.tool", |d| d.tool = None),
        ("WorkflowDoc.shadow_evaluable", |d| {
            d.shadow_evaluable = true
        }),
        ("WorkflowDoc.steps", |d| {
            d.steps.retain(|s| s.id.as_str() != "redo")
        }),
        ("WorkflowDoc.transitions", |d| {
            d.transitions.pop();
        }),
        ("WorkflowDoc.rubric", |d| d.rubric = RubricDef::default()),
        ("WorkflowDoc.budget", |d| d.budget = BudgetDef::default()),
        // BudgetDef, Concurrency, Limits, WorkflowTool, StateDecl
        ("BudgetDef.tokens", |d| d.budget.tokens = Some(50_001)),
        ("BudgetDef.tool_calls", |d| d.budget.tool_calls = None),
        ("BudgetDef.wall_time", |d| {
            d.budget.wall_time = Some(Millis(900_001))
        }),
        ("Concurrency.max_runs", |d| d.concurrency.max_runs = Some(3)),
        ("Concurrency.on_overflow", |d| {
            d.concurrency.on_overflow = Overflow::Drop
        }),
        ("Concurrency.scope", |d| {
            d.concurrency.scope = ConcurrencyScope::Workflow
        }),
        ("Limits.deadline", |d| {
            d.limits.deadline = Some(Millis(3_600_001))
        }),
        ("Limits.steps", |d| d.limits.steps = Some(41)),
        ("Limits.tokens", |d| d.limits.tokens = None),
        ("WorkflowTool.description", |d| {
            d.tool.as_mut().expect("tool").description = None
        }),
        ("WorkflowTool.name", |d| {
            d.tool.as_mut().expect("tool").name = Some("docs.notes".into())
        }),
        ("StateDecl.reducer", |d| {
            d.state.get_mut("changes").expect("changes").reducer = Some(Reducer::Union)
        }),
        ("StateDecl.schema", |d| {
            d.state.get_mut("changes").expect("changes").schema = None
        }),
        // RubricDef, Criterion
        ("RubricDef.criteria", |d| {
            d.rubric.criteria.pop();
        }),
        ("RubricDef.threshold", |d| d.rubric.threshold = Some(0.6)),
        ("Criterion.config", |d| {
            d.rubric.criteria[1].config = json!({"pointer": "/notes", "contains": "Release"})
        }),
        ("Criterion.name", |d| {
            d.rubric.criteria[1].name = "mentions".into()
        }),
        ("Criterion.verifier", |d| {
            d.rubric.criteria[1].verifier = "matches@^0.1".parse().expect("ref")
        }),
        ("Criterion.weight", |d| {
            d.rubric.criteria[0].weight = 0.250001
        }),
        // StepDef (common fields; the kind keys change a step's kind)
        ("StepDoc.id", |d| {
            step_mut(d, "read_tags").id = "read_tag".into();
        }),
        ("StepDoc.model", |d| {
            step_mut(d, "draft").kind = StepKind::Judgment(JudgmentStep::new("Notes?", json!({})))
        }),
        ("StepDoc.tool", |d| {
            step_mut(d, "read_tags").kind = StepKind::Model(ModelStep::new("{{ inputs }}"))
        }),
        ("StepDoc.parallel", |d| {
            step_mut(d, "collect").kind = StepKind::Model(ModelStep::new("collect"))
        }),
        ("StepDoc.conditional", |d| {
            step_mut(d, "check").kind = StepKind::Model(ModelStep::new("check"))
        }),
        ("StepDoc.workflow", |d| {
            step_mut(d, "redo").kind = StepKind::Model(ModelStep::new("redo"))
        }),
        ("StepDoc.judgment", |d| {
            step_mut(d, "approve").kind = StepKind::Model(ModelStep::new("approve"))
        }),
        ("StepDoc.tools", |d| {
            step_mut(d, "draft").tools.0.pop();
        }),
        ("StepDoc.verify", |d| {
            step_mut(d, "draft").verify.pop();
        }),
        ("StepDoc.retry", |d| {
            step_mut(d, "fetch_prs").retry = RetryPolicy::default()
        }),
        ("StepDoc.rubric", |d| {
            step_mut(d, "draft").rubric = RubricDef {
                criteria: vec![
                    Criterion::new("is_json", "json-schema".parse().expect("ref"))
                        .with_config(json!({"schema": true})),
                ],
                threshold: None,
            }
        }),
        ("StepDoc.timeout", |d| {
            step_mut(d, "fetch_prs").timeout = Some(Millis(15_001))
        }),
        ("StepDoc.writes", |d| step_mut(d, "draft").writes = None),
        // RetryPolicy
        ("RetryPolicy.backoff", |d| {
            step_mut(d, "fetch_prs").retry.backoff = Millis(251)
        }),
        ("RetryPolicy.factor", |d| {
            step_mut(d, "fetch_prs").retry.factor = 2
        }),
        ("RetryPolicy.max_attempts", |d| {
            step_mut(d, "fetch_prs").retry.max_attempts = 4
        }),
        ("RetryPolicy.max_backoff", |d| {
            step_mut(d, "fetch_prs").retry.max_backoff = None
        }),
        ("RetryPolicy.on", |d| {
            step_mut(d, "fetch_prs").retry.on = vec![RetryOn::Unavailable]
        }),
        // VerifierRef
        ("VerifierRef.config", |d| {
            step_mut(d, "draft").verify[1].config = json!({"regex": "Notes"})
        }),
        ("VerifierRef.verifier", |d| {
            step_mut(d, "draft").verify[1].verifier = "matches@^0.1".parse().expect("ref")
        }),
        // ModelStep
        ("ModelStep.effort", |d| {
            kind_mut!(d, "draft", Model).effort = ReasoningEffort::Medium
        }),
        ("ModelStep.format", |d| {
            kind_mut!(d, "draft", Model).format = OutputFormat::Text
        }),
        ("ModelStep.model", |d| {
            kind_mut!(d, "draft", Model).model = Some("small".into())
        }),
        ("ModelStep.schema", |d| {
            kind_mut!(d, "draft", Model).schema = Some(json!({"type": "object"}))
        }),
        ("ModelStep.prompt", |d| {
            kind_mut!(d, "draft", Model).prompt.0.push('.')
        }),
        ("ModelStep.system", |d| {
            kind_mut!(d, "draft", Model).system = None
        }),
        // ToolStep
        ("ToolStep.args", |d| {
            kind_mut!(d, "read_tags", Tool).args =
                ArgTemplate(json!({"value": "{{ inputs }}", "select": "/repo"}))
        }),
        ("ToolStep.name", |d| {
            kind_mut!(d, "read_tags", Tool).tool = "json@^0.1".parse().expect("ref")
        }),
        // ParallelStep, JoinPolicy
        ("ParallelStep.branches", |d| {
            kind_mut!(d, "collect", Parallel).branches.pop();
        }),
        ("ParallelStep.join", |d| {
            kind_mut!(d, "collect", Parallel).join = JoinPolicy::Any
        }),
        ("JoinPolicy.quorum", |d| {
            kind_mut!(d, "collect", Parallel).join = JoinPolicy::Quorum(3)
        }),
        // ConditionalStep
        ("ConditionalStep.on", |d| {
            kind_mut!(d, "check", Conditional).on = "size(steps.draft.output) > 11".into()
        }),
        ("ConditionalStep.otherwise", |d| {
            kind_mut!(d, "check", Conditional).otherwise = None
        }),
        ("ConditionalStep.then", |d| {
            kind_mut!(d, "check", Conditional).then = "redo".into()
        }),
        // SubWorkflowStep
        ("SubWorkflowStep.id", |d| {
            kind_mut!(d, "redo", SubWorkflow).id = "docs.rewrite2".into()
        }),
        ("SubWorkflowStep.input", |d| {
            kind_mut!(d, "redo", SubWorkflow).input = ArgTemplate(Value::Null)
        }),
        ("SubWorkflowStep.version", |d| {
            kind_mut!(d, "redo", SubWorkflow).version = VersionSelector::Latest
        }),
        // JudgmentStep
        ("JudgmentStep.constraints", |d| {
            kind_mut!(d, "approve", Judgment).constraints.pop();
        }),
        ("JudgmentStep.executor", |d| {
            kind_mut!(d, "approve", Judgment).executor = Some("ai-collab".into())
        }),
        ("JudgmentStep.profile", |d| {
            kind_mut!(d, "approve", Judgment).profile = None
        }),
        ("JudgmentStep.question", |d| {
            kind_mut!(d, "approve", Judgment).question.0.push(' ')
        }),
        ("JudgmentStep.result_schema", |d| {
            kind_mut!(d, "approve", Judgment).result_schema = json!({"type": "string"})
        }),
        ("JudgmentStep.sources", |d| {
            kind_mut!(d, "approve", Judgment).sources.pop();
        }),
        ("JudgmentStep.on_timeout", |d| {
            kind_mut!(d, "approve", Judgment).on_timeout = Some(JudgmentFallback::Fail)
        }),
        ("JudgmentFallback.answer", |d| {
            kind_mut!(d, "approve", Judgment).on_timeout =
                Some(JudgmentFallback::Answer(json!({"approved": false})))
        }),
        ("JudgmentFallback.escalate", |d| {
            kind_mut!(d, "approve", Judgment).on_timeout = Some(JudgmentFallback::Escalate {
                executor: Some("ai-collab".into()),
                profile: None,
            })
        }),
        // Transition
        ("Transition.from", |d| {
            d.transitions[0].from = "draft".into()
        }),
        ("Transition.to", |d| d.transitions[0].to = "check".into()),
        ("Transition.max_iterations", |d| {
            d.transitions[2].max_iterations = NonZeroU32::new(4)
        }),
        ("Transition.when", |d| d.transitions[2].when = None),
    ]
}

/// `Type.field` for every property the format's JSON Schema declares.
fn schema_fields() -> BTreeSet<String> {
    fn props(prefix: &str, schema: &Value, out: &mut BTreeSet<String>) {
        if let Some(p) = schema.get("properties").and_then(Value::as_object) {
            for k in p.keys() {
                out.insert(format!("{prefix}.{k}"));
            }
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            for sub in schema
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                props(prefix, sub, out);
            }
        }
    }
    let schema = json_schema();
    let mut out = BTreeSet::new();
    props("WorkflowDoc", &schema, &mut out);
    for (name, def) in schema["$defs"].as_object().expect("$defs") {
        props(name, def, &mut out);
    }
    out
}

#[test]
fn canonical_per_field_must_differ_table_covers_every_field() {
    let rows: BTreeSet<String> = field_rows().iter().map(|(k, _)| (*k).to_owned()).collect();
    let fields = schema_fields();
    let missing: Vec<&String> = fields.difference(&rows).collect();
    let extra: Vec<&String> = rows.difference(&fields).collect();
    assert!(
        missing.is_empty(),
        "IR fields without a must-differ row: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "rows for fields the format does not have: {extra:?}"
    );
    assert_eq!(field_rows().len(), rows.len(), "a field has two rows");
}

#[test]
fn canonical_per_field_must_differ_table() {
    let base = base();
    let v = version_of(&base);
    let mut failures = Vec::new();
    for (field, mutate) in field_rows() {
        let mut d = base.clone();
        mutate(&mut d);
        if d == base {
            failures.push(format!("{field}: the row does not change the IR"));
        } else if version_of(&d) == v {
            failures.push(format!(
                "{field}: changed, but the version did not (the canonicalizer drops it)"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `fixtures/canonical/step_fields.yaml`: a model step with an answer
/// schema and a step rubric.
fn step_fields_base() -> WorkflowDef {
    load(&canonical_dir().join("step_fields.yaml"))
}

/// The rubric fields again, at their second site — a step's rubric — so a
/// canonicalizer that writes the workflow's rubric but drops a field of a
/// step's (or the reverse) is caught; and the two step-level fields on a
/// workflow that has them. Mutates [`step_fields_base`].
fn step_field_rows() -> Vec<(&'static str, Mutation)> {
    fn rubric(d: &mut WorkflowDef) -> &mut RubricDef {
        &mut step_mut(d, "summarize").rubric
    }
    vec![
        ("StepDoc.rubric", |d| *rubric(d) = RubricDef::default()),
        ("RubricDef.criteria", |d| {
            rubric(d).criteria.pop();
        }),
        ("RubricDef.threshold", |d| rubric(d).threshold = None),
        ("Criterion.config", |d| {
            rubric(d).criteria[1].config = json!({"pointer": "/summary", "regex": "\\w+"})
        }),
        ("Criterion.name", |d| {
            rubric(d).criteria[1].name = "long_summary".into()
        }),
        ("Criterion.verifier", |d| {
            rubric(d).criteria[1].verifier = "matches@^0.2".parse().expect("ref")
        }),
        ("Criterion.weight", |d| rubric(d).criteria[0].weight = 1.0),
        ("ModelStep.schema", |d| {
            // One element of one array: JSON arrays are ordered, schemas are
            // written as they are.
            kind_mut!(d, "summarize", Model).schema = Some(json!({
                "type": "object",
                "properties": {"title": {"type": "string"}, "summary": {"type": "string"}},
                "required": ["summary", "title"]
            }))
        }),
    ]
}

#[test]
fn canonical_step_field_rows_cover_every_rubric_field_at_the_step_site() {
    let rows: BTreeSet<String> = step_field_rows()
        .iter()
        .map(|(k, _)| (*k).to_owned())
        .collect();
    let want: BTreeSet<String> = schema_fields()
        .into_iter()
        .filter(|f| {
            f.starts_with("RubricDef.")
                || f.starts_with("Criterion.")
                || f == "StepDoc.rubric"
                || f == "ModelStep.schema"
        })
        .collect();
    assert_eq!(rows, want);
    assert_eq!(step_field_rows().len(), rows.len(), "a field has two rows");
}

#[test]
fn canonical_per_field_must_differ_table_for_step_rubric_and_model_schema() {
    let base = step_fields_base();
    let v = version_of(&base);
    let mut failures = Vec::new();
    for (field, mutate) in step_field_rows() {
        let mut d = base.clone();
        mutate(&mut d);
        if d == base {
            failures.push(format!("{field}: the row does not change the IR"));
        } else if version_of(&d) == v {
            failures.push(format!(
                "{field}: changed, but the version did not (the canonicalizer drops it)"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Pairs of documents that differ only in ways that must not matter for
/// the step-level fields; each pair must have one version.
#[test]
fn canonical_step_rubric_and_model_schema_must_match() {
    let step = |extra: &str| {
        format!("id: w\nsteps:\n  - id: a\n    model: {{prompt: hi, format: json}}\n{extra}")
    };
    let pairs: Vec<(&str, String, String)> = vec![
        (
            "step rubric criteria in two orders (and members reordered)",
            step(
                "    rubric:\n      criteria:\n        - {name: shape, verifier: json-schema, config: {schema: true}, weight: 2}\n        - {name: word, verifier: matches@^0.1, config: {regex: x}}\n      threshold: 0.5\n",
            ),
            step(
                "    rubric:\n      threshold: 0.5\n      criteria:\n        - {config: {regex: x}, verifier: matches@^0.1, name: word}\n        - {weight: 2.0, name: shape, config: {schema: true}, verifier: json-schema}\n",
            ),
        ),
        (
            "an explicit empty step rubric and none",
            step("    rubric: {}\n"),
            step(""),
        ),
        (
            "empty criteria and a null threshold, and none",
            step("    rubric: {criteria: [], threshold: null}\n"),
            step(""),
        ),
        (
            "criterion weight 1 written and left out",
            step("    rubric:\n      criteria: [{name: c, verifier: matches, config: {regex: x}, weight: 1}]\n"),
            step("    rubric:\n      criteria: [{name: c, verifier: matches, config: {regex: x}}]\n"),
        ),
        (
            "`schema: null` and no schema",
            "id: w\nsteps:\n  - id: a\n    model: {prompt: hi, format: json, schema: null}\n".to_owned(),
            "id: w\nsteps:\n  - id: a\n    model: {prompt: hi, format: json}\n".to_owned(),
        ),
        (
            "schema members reordered",
            "id: w\nsteps:\n  - id: a\n    model: {prompt: hi, format: json, schema: {type: object, required: [x]}}\n".to_owned(),
            "id: w\nsteps:\n  - id: a\n    model: {schema: {required: [x], type: object}, format: json, prompt: hi}\n".to_owned(),
        ),
    ];
    for (what, a, b) in &pairs {
        let da = parse(a.as_bytes(), Format::Yaml, "a").expect("a parses");
        let db = parse(b.as_bytes(), Format::Yaml, "b").expect("b parses");
        assert_ne!(a, b, "{what}: the pair must differ as text");
        assert_eq!(version_of(&da), version_of(&db), "{what}: must match");
        assert_eq!(canonical_bytes(&da), canonical_bytes(&db), "{what}");
    }
    // An empty rubric and a null schema leave no trace in the bytes.
    let plain = parse(step("    rubric: {}\n").as_bytes(), Format::Yaml, "p").expect("parses");
    assert_eq!(
        String::from_utf8(canonical_bytes(&plain)).expect("utf-8"),
        r#"{"id":"w","schema":1,"steps":[{"id":"a","model":{"format":"json","prompt":"hi"}}]}"#
    );
}

#[test]
fn canonical_step_rubric_and_model_schema_are_written_in_key_order_and_read_back() {
    // retry < rubric < timeout; prompt < schema < system; criteria sorted by
    // name; the schema written as canonical JSON with its arrays in order.
    let d = parse(
        b"id: w\nsteps:\n  - id: a\n    model:\n      system: Be terse.\n      schema: {type: object, required: [b, a]}\n      format: json\n      prompt: Hi\n    timeout: 30s\n    retry: {max_attempts: 2}\n    rubric:\n      criteria:\n        - {name: z, verifier: matches@^0.1, config: {regex: x}}\n        - {name: b, verifier: json-schema, config: {schema: true}, weight: 2.50}\n      threshold: 0.5\n",
        Format::Yaml,
        "w",
    )
    .expect("parses");
    let bytes = canonical_bytes(&d);
    assert_eq!(
        String::from_utf8(bytes.clone()).expect("utf-8"),
        r#"{"id":"w","schema":1,"steps":[{"id":"a","model":{"format":"json","prompt":"Hi","schema":{"required":["b","a"],"type":"object"},"system":"Be terse."},"retry":{"max_attempts":2},"rubric":{"criteria":[{"config":{"schema":true},"name":"b","verifier":"json-schema","weight":2.5},{"config":{"regex":"x"},"name":"z","verifier":"matches@^0.1"}],"threshold":0.5},"timeout":30000}]}"#
    );
    let back = from_canonical(&bytes).expect("canonical bytes read back");
    assert_eq!(canonical_bytes(&back), bytes);
    assert_eq!(back, canonicalize(&d));
    let step = back.step("a").expect("step a");
    let StepKind::Model(m) = &step.kind else {
        panic!("{step:?}")
    };
    assert_eq!(
        m.schema,
        Some(json!({"type": "object", "required": ["b", "a"]}))
    );
    let names: Vec<&str> = step
        .rubric
        .criteria
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["b", "z"]);
    assert_eq!(step.rubric.threshold, Some(0.5));
    // The fixture with both fields, too; and the builders make the same IR.
    let f = step_fields_base();
    let once = canonical_bytes(&f);
    assert_eq!(
        canonical_bytes(&from_canonical(&once).expect("reads back")),
        once
    );
    let built = WorkflowDef::new("w").with_step(
        StepDef::new(
            "a",
            ModelStep::new("Hi")
                .with_system("Be terse.")
                .with_format(OutputFormat::Json)
                .with_schema(json!({"type": "object", "required": ["b", "a"]})),
        )
        .with_retry(RetryPolicy::attempts(2))
        .with_timeout(Millis::secs(30))
        .with_rubric(RubricDef {
            criteria: vec![
                Criterion::new("z", "matches@^0.1".parse().expect("ref"))
                    .with_config(json!({"regex": "x"})),
                Criterion::new("b", ToolRef::any("json-schema"))
                    .with_config(json!({"schema": true}))
                    .with_weight(2.5),
            ],
            threshold: Some(0.5),
        }),
    );
    assert_eq!(canonical_bytes(&built), bytes);
}

/// Lists every IR field by destructuring without `..`: a new field is a
/// compile error here until it is given a row above (and a rule in the
/// canonicalizer, whose encoder destructures the same way).
#[allow(dead_code)]
fn every_ir_field_is_listed(d: &WorkflowDef) {
    let WorkflowDef {
        id: _,
        schema: _,
        description: _,
        inputs: _,
        outputs: _,
        output: _,
        priority: _,
        concurrency:
            Concurrency {
                max_runs: _,
                scope: _,
                on_overflow: _,
            },
        key: _,
        durable: _,
        unload: Unload {
            policy: _,
            timeout: _,
        },
        state: _,
        limits:
            Limits {
                steps: _,
                tokens: _,
                deadline: _,
            },
        tool: _,
        shadow_evaluable: _,
        steps,
        transitions,
        rubric: RubricDef {
            criteria,
            threshold: _,
        },
        budget:
            BudgetDef {
                tokens: _,
                tool_calls: _,
                wall_time: _,
            },
    } = d;
    for StateDecl {
        schema: _,
        reducer: _,
    } in d.state.values()
    {}
    if let Some(WorkflowTool {
        name: _,
        description: _,
    }) = &d.tool
    {}
    for Criterion {
        name: _,
        verifier: _,
        config: _,
        weight: _,
    } in criteria
    {}
    for Transition {
        from: _,
        to: _,
        max_iterations: _,
        when: _,
    } in transitions
    {}
    for StepDef {
        id: _,
        kind,
        tools: _,
        verify,
        rubric: RubricDef {
            criteria: step_criteria,
            threshold: _,
        },
        retry,
        timeout: _,
        writes: _,
    } in steps
    {
        for Criterion {
            name: _,
            verifier: _,
            config: _,
            weight: _,
        } in step_criteria
        {}
        for VerifierRef {
            verifier: _,
            config: _,
        } in verify
        {}
        let RetryPolicy {
            max_attempts: _,
            backoff: _,
            factor: _,
            max_backoff: _,
            on: _,
        } = retry;
        match kind {
            StepKind::Model(ModelStep {
                prompt: _,
                system: _,
                effort: _,
                format: _,
                schema: _,
                model: _,
            }) => {}
            StepKind::Tool(ToolStep { tool: _, args: _ }) => {}
            StepKind::Parallel(ParallelStep { branches: _, join }) => match join {
                JoinPolicy::All | JoinPolicy::Any | JoinPolicy::Quorum(_) => {}
            },
            StepKind::Conditional(ConditionalStep {
                on: _,
                then: _,
                otherwise: _,
            }) => {}
            StepKind::SubWorkflow(SubWorkflowStep {
                id: _,
                version: _,
                input: _,
            }) => {}
            StepKind::Judgment(JudgmentStep {
                question: _,
                sources: _,
                result_schema: _,
                executor: _,
                profile: _,
                constraints: _,
                on_timeout: _,
            }) => {}
        }
    }
}

// ─── 4. stability ────────────────────────────────────────────────────────

#[test]
fn canonical_twice_gives_identical_bytes_and_reads_back() {
    for f in [
        canonical_dir().join("base.yaml"),
        fixtures().join("valid/support.triage.yaml"),
    ] {
        let d = load(&f);
        let once = canonical_bytes(&d);
        assert_eq!(once, canonical_bytes(&d));
        let normalized = canonicalize(&d);
        assert_eq!(
            canonical_bytes(&normalized),
            once,
            "canonicalize keeps the version"
        );
        assert_eq!(
            canonicalize(&normalized),
            normalized,
            "canonicalize is idempotent"
        );
        let back = from_canonical(&once).expect("canonical bytes read back");
        assert_eq!(back, normalized);
        assert_eq!(canonical_bytes(&back), once);
        // Re-encoding a non-canonical spelling of the same workflow is refused.
        let pretty = serde_json::to_vec_pretty(&d).expect("json");
        assert!(matches!(
            from_canonical(&pretty),
            Err(FromCanonicalError::NotCanonical { .. })
        ));
    }
}

#[test]
fn canonical_form_of_a_small_workflow_is_exactly_as_documented() {
    let d = parse(
        b"id: w\nsteps:\n  - id: b\n    tool: {name: text@^0.1, args: {z: 1.50, a: [2, 1]}}\n    timeout: 60s\n  - id: a\n    model: {prompt: \"Hi\\n\"}\ntransitions: [{from: a, to: b}]\n",
        Format::Yaml,
        "small",
    )
    .expect("parses");
    let text = String::from_utf8(canonical_bytes(&d)).expect("utf-8");
    assert_eq!(
        text,
        r#"{"id":"w","schema":1,"steps":[{"id":"a","model":{"prompt":"Hi\n"}},{"id":"b","tool":{"args":{"a":[2,1],"z":1.5},"name":"text@^0.1"}}],"transitions":[{"from":"a","to":"b"}]}"#
    );
    assert_eq!(
        version_of(&d),
        WorkflowVersion::of_canonical_bytes(text.as_bytes())
    );
    assert_eq!(
        version_of(&d).to_string(),
        format!("b3:{}", blake3::hash(text.as_bytes()).to_hex())
    );
    assert_eq!(
        version_of(&d).to_string(),
        "b3:c0bf982f44b1f7a0edfa18c3a0cedae73e89466d30c5002bc66c8e2a1f56726d"
    );
}

/// The fenced blocks of `docs/workflow-format.md` with the given info string.
fn doc_blocks(lang: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/workflow-format.md"),
    )
    .expect("doc");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match &mut current {
            None if line == format!("```{lang}") => current = Some(String::new()),
            Some(b) if line == "```" => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn canonical_docs_worked_example_recomputes_by_hand() {
    // The format reference's worked example: its YAML, canonical bytes and
    // version are what this crate computes.
    let yaml = doc_blocks("yaml");
    let worked = yaml
        .iter()
        .find(|b| b.starts_with("id: w\n"))
        .expect("worked example");
    let d = parse(worked.as_bytes(), Format::Yaml, "doc").expect("parses");
    let text = doc_blocks("text");
    assert_eq!(
        String::from_utf8(canonical_bytes(&d)).expect("utf-8"),
        text[0].trim_end()
    );
    // And the complete example is the reference fixture, comments aside.
    let complete = parse(yaml[0].as_bytes(), Format::Yaml, "doc").expect("parses");
    assert_eq!(
        version_of(&complete),
        version_of(&load(&fixtures().join("valid/support.triage.yaml")))
    );
}

#[test]
fn canonical_docs_step_fields_example_recomputes_by_hand() {
    // The second worked example (a model `schema` and a step `rubric`).
    let yaml = doc_blocks("yaml");
    let example = yaml
        .iter()
        .find(|b| b.starts_with("id: s\n"))
        .expect("step fields example");
    let d = parse(example.as_bytes(), Format::Yaml, "doc").expect("parses");
    let text = doc_blocks("text");
    assert_eq!(
        String::from_utf8(canonical_bytes(&d)).expect("utf-8"),
        text[1].trim_end()
    );
    // The step examples of the reference (the step rubric's among them)
    // parse as steps.
    for b in yaml.iter().filter(|b| b.starts_with("- id:")) {
        let steps: String = b.lines().map(|l| format!("  {l}\n")).collect();
        let doc = format!("id: w\nsteps:\n{steps}");
        parse(doc.as_bytes(), Format::Yaml, "doc").unwrap_or_else(|e| panic!("{e}\n{doc}"));
    }
}

// ─── 7. golden versions ──────────────────────────────────────────────────

/// The published versions of the fixtures. A change to the canonical
/// encoding that moves any of them fails here; a deliberate change updates
/// them in the same commit, with a note in the commit message.
const GOLDEN: &[(&str, &str)] = &[
    (
        "canonical/base.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/different_indentation.a.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/different_indentation.b.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/explicit_defaults.a.yaml",
        "b3:68cf173009ccee106634fb6be203af5dc2ce5c3bce5b1d4db3fd4491ea6c24da",
    ),
    (
        "canonical/must_match/explicit_defaults.b.yaml",
        "b3:68cf173009ccee106634fb6be203af5dc2ce5c3bce5b1d4db3fd4491ea6c24da",
    ),
    (
        "canonical/must_match/reordered_collections.a.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/reordered_collections.b.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/reordered_map_entries.a.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/reordered_map_entries.b.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/reordered_top_level_keys.a.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/reordered_top_level_keys.b.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/trailing_whitespace.a.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/trailing_whitespace.b.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/yaml_vs_json.a.yaml",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/must_match/yaml_vs_json.b.json",
        "b3:a09cb2c0ca32d88bfaedb480e54e2ea6ec5e59031f806ae55ef2968c83a24c59",
    ),
    (
        "canonical/step_fields.yaml",
        "b3:f7ed5244b1e29e807c29b5ddb8fea39530853faf546a9b862682f0b231b0c98a",
    ),
    (
        "canonical/must_differ/branch_order.yaml",
        "b3:e4d1107c745ff533cc4e0f73b8416276e7d022279d6faf222eb848338a1ebc42",
    ),
    (
        "canonical/must_differ/description.yaml",
        "b3:dd406270f28dced278e2506115dc2c6e4bac77e035ef9ace2bfc21e7e15e0d8a",
    ),
    (
        "canonical/must_differ/judgment_source_order.yaml",
        "b3:d8cde823e1aa5ea216ecd8d245cbadcad446270630ed555bdaac58cf72adfebb",
    ),
    (
        "canonical/must_differ/prompt_one_char.yaml",
        "b3:a452ee3e1bcff8caaa30da9a0eab1cbcf2c99ad4a114a879d2472d93a3712c7c",
    ),
    (
        "canonical/must_differ/prompt_whitespace.yaml",
        "b3:8642193a4ad59b2742c098b4d9188a0d3a9faf50fbc9ee3f6c0b4eaa5be5bd1f",
    ),
    (
        "valid/billing.refund_review.yaml",
        "b3:f3c86e77059c06e0957e75f08bb5b844ef13aec17929f4fdbc02487262ce0921",
    ),
    (
        "valid/support.triage.yaml",
        "b3:c5584053a2ef64158fdef629e4df2f519235b3e91bafd758b7827bfd412f9f28",
    ),
];

#[test]
fn canonical_golden_versions_are_pinned() {
    let mut failures = Vec::new();
    for (file, want) in GOLDEN {
        let got = version_of(&load(&fixtures().join(file))).to_string();
        if got != *want {
            failures.push(format!("    (\"{file}\", \"{got}\"),"));
        }
    }
    assert!(
        failures.is_empty(),
        "golden versions moved; if deliberate, update GOLDEN:\n{}",
        failures.join("\n")
    );
}

// ─── 6. property tests ───────────────────────────────────────────────────

fn arb_id() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", "d", "fetch", "draft", "x1", "y_2"])
        .prop_map(str::to_owned)
}

fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "hi",
            "Summarize {{ inputs.x }}",
            " spaced ",
            "a\nb",
            "tab\there",
            "q\"uote\\",
            "é ünï 𝄞",
            "\u{1}\u{1f}",
            "\u{e000}"
        ])
        .prop_map(str::to_owned),
        "[a-z {}.]{0,12}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-1_000_000i64..1_000_000).prop_map(Value::from),
        prop::sample::select(vec![0.1, 1.5, -2.25, 1e21, 1e-7, 123456.789, 0.0])
            .prop_map(Value::from),
        arb_text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop_oneof![arb_text(), arb_id()], inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_tool_ref() -> impl Strategy<Value = ToolRef> {
    (
        prop::sample::select(vec!["text", "json", "http-get", "matches"]),
        prop::sample::select(vec!["*", "^0.1", ">=1.0.0, <2.0.0"]),
    )
        .prop_map(|(n, r)| format!("{n}@{r}").parse().expect("ref"))
}

fn arb_millis() -> impl Strategy<Value = Millis> {
    prop_oneof![Just(Millis(60_000)), (0u64..10_000_000).prop_map(Millis)]
}

fn arb_retry() -> impl Strategy<Value = RetryPolicy> {
    (
        0u32..6,
        arb_millis(),
        1u32..4,
        prop::option::of(arb_millis()),
        prop::collection::vec(
            prop::sample::select(vec![
                RetryOn::Failed,
                RetryOn::Unavailable,
                RetryOn::Timeout,
                RetryOn::Verifier,
            ]),
            0..6,
        ),
    )
        .prop_map(
            |(max_attempts, backoff, factor, max_backoff, on)| RetryPolicy {
                max_attempts,
                backoff,
                factor,
                max_backoff,
                on,
            },
        )
}

fn arb_kind() -> impl Strategy<Value = StepKind> {
    prop_oneof![
        (
            arb_text(),
            prop::option::of(arb_text()),
            prop::sample::select(vec![
                ReasoningEffort::Low,
                ReasoningEffort::Medium,
                ReasoningEffort::High
            ]),
            any::<bool>(),
            prop::option::of(arb_json()),
            prop::option::of(arb_id())
        )
            .prop_map(
                |(p, s, effort, json, schema, model)| StepKind::Model(ModelStep {
                    prompt: PromptTemplate(p),
                    system: s.map(PromptTemplate),
                    effort,
                    format: if json {
                        OutputFormat::Json
                    } else {
                        OutputFormat::Text
                    },
                    schema,
                    model,
                })
            ),
        (arb_tool_ref(), arb_json()).prop_map(|(tool, args)| StepKind::Tool(ToolStep {
            tool,
            args: ArgTemplate(args)
        })),
        (
            prop::collection::vec(arb_id(), 0..4),
            prop_oneof![
                Just(JoinPolicy::All),
                Just(JoinPolicy::Any),
                (0u32..4).prop_map(JoinPolicy::Quorum)
            ]
        )
            .prop_map(|(branches, join)| StepKind::Parallel(ParallelStep {
                branches: branches.into_iter().map(StepId).collect(),
                join
            })),
        (arb_text(), arb_id(), prop::option::of(arb_id())).prop_map(|(on, then, otherwise)| {
            StepKind::Conditional(ConditionalStep {
                on: Predicate(on),
                then: StepId(then),
                otherwise: otherwise.map(StepId),
            })
        }),
        (arb_id(), any::<bool>(), arb_json()).prop_map(
            |(id, pinned, input)| StepKind::SubWorkflow(SubWorkflowStep {
                id: WorkflowId(format!("w.{id}")),
                version: if pinned {
                    VersionSelector::Pinned(WorkflowVersion::of_canonical_bytes(id.as_bytes()))
                } else {
                    VersionSelector::Latest
                },
                input: ArgTemplate(input),
            })
        ),
        (
            arb_text(),
            prop::collection::vec(arb_text(), 0..3),
            arb_json(),
            prop::option::of(arb_id()),
            prop::option::of(arb_id()),
            prop::collection::vec(arb_text(), 0..3)
        )
            .prop_map(|(q, sources, schema, executor, profile, constraints)| {
                StepKind::Judgment(JudgmentStep {
                    question: PromptTemplate(q),
                    sources: sources.into_iter().map(Template).collect(),
                    result_schema: schema,
                    executor,
                    profile,
                    constraints,
                    on_timeout: None,
                })
            }),
    ]
}

/// A step's rubric: often none, criteria possibly sharing a name (ties are
/// broken by canonical bytes).
fn arb_rubric() -> impl Strategy<Value = RubricDef> {
    (
        prop::collection::vec(
            (
                arb_id(),
                arb_tool_ref(),
                arb_json(),
                prop::sample::select(vec![1.0, 0.5, 2.0, 0.1]),
            )
                .prop_map(|(name, verifier, config, weight)| Criterion {
                    name,
                    verifier,
                    config,
                    weight,
                }),
            0..4,
        ),
        prop::option::of(prop::sample::select(vec![0.0, 0.5, 0.75, 1.0])),
    )
        .prop_map(|(criteria, threshold)| RubricDef {
            criteria,
            threshold,
        })
}

fn arb_step() -> impl Strategy<Value = StepDef> {
    (
        arb_id(),
        arb_kind(),
        prop::collection::vec(arb_tool_ref(), 0..3),
        prop::collection::vec(
            (arb_tool_ref(), arb_json())
                .prop_map(|(verifier, config)| VerifierRef { verifier, config }),
            0..3,
        ),
        arb_rubric(),
        arb_retry(),
        prop::option::of(arb_millis()),
        prop::option::of(arb_id()),
    )
        .prop_map(
            |(id, kind, tools, verify, rubric, retry, timeout, writes)| StepDef {
                id: StepId(id),
                kind,
                tools: ToolSelector(tools),
                verify,
                rubric,
                retry,
                timeout,
                writes: writes.map(StateKey),
            },
        )
}

fn arb_workflow() -> impl Strategy<Value = WorkflowDef> {
    let head = (
        arb_id(),
        prop::option::of(arb_text()),
        prop::option::of(arb_json()),
        prop::option::of(arb_json()),
        prop::option::of(arb_json()),
        prop::sample::select(vec![Priority::Low, Priority::Normal, Priority::High]),
        (
            prop::option::of(0u32..5),
            any::<bool>(),
            prop::sample::select(vec![Overflow::Queue, Overflow::Drop, Overflow::Replace]),
        ),
        prop::option::of(arb_text()),
        any::<bool>(),
        prop::collection::btree_map(
            arb_id(),
            (
                prop::option::of(arb_json()),
                prop::option::of(prop::sample::select(vec![
                    Reducer::Overwrite,
                    Reducer::Append,
                    Reducer::Merge,
                    Reducer::Union,
                ])),
            ),
            0..3,
        ),
    );
    let tail = (
        (
            prop::option::of(0u32..100),
            prop::option::of(0u64..100_000),
            prop::option::of(arb_millis()),
        ),
        prop::option::of((prop::option::of(arb_id()), prop::option::of(arb_text()))),
        any::<bool>(),
        prop::collection::vec(arb_step(), 0..6),
        prop::collection::vec(
            (
                arb_id(),
                arb_id(),
                prop::option::of(1u32..5),
                prop::option::of(arb_text()),
            ),
            0..5,
        ),
        prop::collection::vec(
            (
                arb_id(),
                arb_tool_ref(),
                arb_json(),
                prop::sample::select(vec![1.0, 0.5, 2.0, 0.1]),
            ),
            0..3,
        ),
        prop::option::of(prop::sample::select(vec![0.0, 0.5, 0.75, 1.0])),
        (
            prop::option::of(0u64..100_000),
            prop::option::of(0u64..1000),
            prop::option::of(arb_millis()),
        ),
    );
    (head, tail).prop_map(|(h, t)| {
        let (
            id,
            description,
            inputs,
            outputs,
            output,
            priority,
            (max_runs, key_scope, on_overflow),
            key,
            durable,
            state,
        ) = h;
        let (
            (lsteps, ltokens, deadline),
            tool,
            shadow,
            steps,
            transitions,
            criteria,
            threshold,
            (btokens, calls, wall),
        ) = t;
        WorkflowDef {
            id: WorkflowId(format!("p.{id}")),
            schema: CURRENT_SCHEMA,
            description,
            inputs: inputs.filter(|v| !v.is_null()),
            outputs: outputs.filter(|v| !v.is_null()),
            output: output.filter(|v| !v.is_null()).map(ArgTemplate),
            priority,
            concurrency: Concurrency {
                max_runs,
                scope: if key_scope {
                    ConcurrencyScope::Key
                } else {
                    ConcurrencyScope::Workflow
                },
                on_overflow,
            },
            key: key.map(Template),
            durable: Some(durable),
            unload: Unload::default(),
            state: state
                .into_iter()
                .map(|(k, (schema, reducer))| {
                    (
                        StateKey(k),
                        StateDecl {
                            schema: schema.filter(|v| !v.is_null()),
                            reducer,
                        },
                    )
                })
                .collect(),
            limits: Limits {
                steps: lsteps,
                tokens: ltokens,
                deadline,
            },
            tool: tool.map(|(name, description)| WorkflowTool { name, description }),
            shadow_evaluable: shadow,
            steps,
            transitions: transitions
                .into_iter()
                .map(|(from, to, max, when)| Transition {
                    from: StepId(from),
                    to: StepId(to),
                    max_iterations: max.and_then(NonZeroU32::new),
                    when: when.map(Predicate),
                })
                .collect(),
            rubric: RubricDef {
                criteria: criteria
                    .into_iter()
                    .map(|(name, verifier, config, weight)| Criterion {
                        name,
                        verifier,
                        config,
                        weight,
                    })
                    .collect(),
                threshold,
            },
            budget: BudgetDef {
                tokens: btokens,
                tool_calls: calls,
                wall_time: wall,
            },
        }
    })
}

/// A deterministic permutation driven by `seed` (xorshift).
fn shuffle<T>(v: &mut [T], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let j = (*seed % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// Permutes every unordered collection of the IR — whether or not the
/// canonicalizer is known to sort it: steps, transitions, each step's
/// tools and verifiers, retry classes, the criteria of the workflow's rubric
/// and of each step's. (Maps — `state` and JSON objects — are permuted at
/// the document level below.)
fn permute_ir(d: &WorkflowDef, seed: u64) -> WorkflowDef {
    let mut s = seed | 1;
    let mut d = d.clone();
    shuffle(&mut d.steps, &mut s);
    shuffle(&mut d.transitions, &mut s);
    shuffle(&mut d.rubric.criteria, &mut s);
    for step in &mut d.steps {
        shuffle(&mut step.tools.0, &mut s);
        shuffle(&mut step.verify, &mut s);
        shuffle(&mut step.retry.on, &mut s);
        shuffle(&mut step.rubric.criteria, &mut s);
    }
    d
}

/// Writes a JSON value as JSON text with the members of every object in a
/// permuted order (so the document's map order differs from any sorted one).
fn write_shuffled(v: &Value, seed: &mut u64, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            shuffle(&mut entries, seed);
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_shuffled(x, seed, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_shuffled(x, seed, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The same value as a YAML block document with permuted map order.
fn to_yaml_shuffled(v: &Value, seed: &mut u64) -> serde_norway::Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            shuffle(&mut entries, seed);
            let mut map = serde_norway::Mapping::new();
            for (k, x) in entries {
                map.insert(
                    serde_norway::Value::String(k.clone()),
                    to_yaml_shuffled(x, seed),
                );
            }
            serde_norway::Value::Mapping(map)
        }
        Value::Array(items) => {
            serde_norway::Value::Sequence(items.iter().map(|x| to_yaml_shuffled(x, seed)).collect())
        }
        other => serde_norway::to_value(other).unwrap_or(serde_norway::Value::Null),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn canonical_property_permuting_every_unordered_collection_keeps_the_version(d in arb_workflow(), seed in any::<u64>()) {
        let v = version_of(&d);
        // IR level: every set, in another order.
        let p = permute_ir(&d, seed);
        prop_assert_eq!(version_of(&p), v);
        // Document level: every JSON object (state, schemas, args, configs,
        // and each struct's fields) in another member order, through both
        // front ends.
        let doc = serde_json::to_value(&p).expect("serializes");
        let mut s = seed | 1;
        let mut json_text = String::new();
        write_shuffled(&doc, &mut s, &mut json_text);
        let from_json = parse(json_text.as_bytes(), Format::Json, "prop.json").expect("shuffled JSON parses");
        prop_assert_eq!(version_of(&from_json), v);
        let yaml_text = serde_norway::to_string(&to_yaml_shuffled(&doc, &mut s)).expect("yaml");
        let from_yaml = parse(yaml_text.as_bytes(), Format::Yaml, "prop.yaml").expect("shuffled YAML parses");
        prop_assert_eq!(version_of(&from_yaml), v);
        // ... and a flow-style YAML document (JSON text read as YAML).
        let from_flow = parse(json_text.as_bytes(), Format::Yaml, "prop-flow.yaml").expect("flow YAML parses");
        prop_assert_eq!(version_of(&from_flow), v);
    }

    #[test]
    fn canonical_property_bytes_agree_with_an_independent_rfc8785_implementation(d in arb_workflow()) {
        let bytes = canonical_bytes(&d);
        let normalized = from_canonical(&bytes).expect("canonical bytes read back");
        prop_assert_eq!(canonical_bytes(&normalized), bytes.clone());
        // The IR's own serde shape, canonicalized by serde_json_canonicalizer.
        let oracle = serde_json_canonicalizer::to_vec(&serde_json::to_value(&normalized).expect("json")).expect("jcs");
        prop_assert_eq!(String::from_utf8_lossy(&bytes), String::from_utf8_lossy(&oracle));
    }

    #[test]
    fn canonical_property_ordered_collections_keep_their_order(
        branches in prop::collection::btree_set(arb_id(), 2..5),
        sources in prop::collection::btree_set(arb_text(), 2..4),
    ) {
        let branches: Vec<StepId> = branches.into_iter().map(StepId).collect();
        let mut reversed = branches.clone();
        reversed.reverse();
        let wf = |b: Vec<StepId>| WorkflowDef::new("w").with_step(StepDef::new("p", ParallelStep { branches: b, join: JoinPolicy::All }));
        prop_assert_ne!(version_of(&wf(branches)), version_of(&wf(reversed)));
        let sources: Vec<Template> = sources.into_iter().map(Template).collect();
        let mut rev = sources.clone();
        rev.reverse();
        let jw = |s: Vec<Template>| {
            let mut j = JudgmentStep::new("q", json!({}));
            j.sources = s;
            WorkflowDef::new("w").with_step(StepDef::new("j", j))
        };
        prop_assert_ne!(version_of(&jw(sources)), version_of(&jw(rev)));
    }
}

// ─── builders ────────────────────────────────────────────────────────────

/// `fixtures/valid/support.triage.yaml`, built in Rust with the IR
/// constructors: the same workflow, so the same version.
fn support_triage_built() -> WorkflowDef {
    let r = |s: &str| ToolRef::parse(s).expect("tool reference");
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    WorkflowDef::new("support.triage")
        .with_description(
            "Triage a support ticket: classify it, gather context, route it, have a lead approve the outcome, and record the decision.",
        )
        .with_inputs(json!({
            "type": "object",
            "properties": {"ticket": {"type": "string"}, "account": {"type": "string"}, "attachment": {"type": "string"}},
            "required": ["ticket", "account", "attachment"]
        }))
        .with_outputs(json!({"type": "object", "required": ["category", "approved"]}))
        .with_output(json!({"category": "{{ steps.classify.output }}", "approved": "{{ steps.record.output }}"}))
        .with_priority(Priority::High)
        .with_concurrency(Concurrency { max_runs: Some(1), scope: ConcurrencyScope::Key, on_overflow: Overflow::Queue })
        .with_key("{{ inputs.account }}")
        .with_state("notes", StateDecl::reduced(Reducer::Append).with_schema(json!({"type": "array", "items": {}})))
        .with_state("approved", StateDecl { schema: Some(json!({"type": "boolean"})), reducer: None })
        .with_limits(Limits { steps: Some(50), tokens: Some(20_000), deadline: Some(Millis::secs(7_200)) })
        .with_budget(BudgetDef { tokens: Some(100_000), tool_calls: Some(40), wall_time: Some(Millis::secs(1_800)) })
        .with_rubric(RubricDef {
            criteria: vec![
                Criterion::new("shape", r("json-schema@^0.1"))
                    .with_config(json!({"schema": {"type": "object", "required": ["category", "approved"]}}))
                    .with_weight(2.0),
                Criterion::new("known_category", r("matches@^0.1"))
                    .with_config(json!({"pointer": "/category", "regex": "^(billing|bug|other)$"})),
            ],
            threshold: Some(0.75),
        })
        .with_step(
            StepDef::new(
                "classify",
                ModelStep::new(
                    "Classify this support ticket as billing, bug or other.\nAnswer with the single word.\n\n{{ inputs.ticket }}\n",
                )
                .with_system("You are a careful support engineer.")
                .with_effort(ReasoningEffort::Low),
            )
            .with_verifier(r("matches@^0.1"), json!({"regex": "^(billing|bug|other)$"}))
            .with_retry(RetryPolicy {
                on: vec![RetryOn::Verifier, RetryOn::Timeout],
                ..RetryPolicy::attempts(3).with_backoff(Millis::secs(1))
            })
            .with_timeout(Millis::secs(30)),
        )
        .with_step(StepDef::parallel("gather", ["read_attachment", "fetch_status"]))
        .with_step(
            StepDef::tool("read_attachment", r("fs-read@^0.1"), json!({"path": "{{ inputs.attachment }}"})).with_writes("notes"),
        )
        .with_step(
            StepDef::tool(
                "fetch_status",
                r("http-get@^0.1"),
                json!({"url": "https://status.example.com/accounts/{{ inputs.account }}", "max_bytes": 65536}),
            )
            .with_writes("notes")
            .with_retry(RetryPolicy::attempts(2).with_backoff(Millis(500))),
        )
        .with_step(StepDef::conditional("route", "steps.classify.output == 'billing'", "refund").with_otherwise("summarize"))
        .with_step(StepDef::new(
            "refund",
            SubWorkflowStep::new("billing.refund_review")
                .with_input(json!({"account": "{{ inputs.account }}", "ticket": "{{ inputs.ticket }}"})),
        ))
        .with_step(StepDef::tool(
            "summarize",
            r("text@^0.1"),
            json!({"op": "extract", "pattern": "[^.]*\\.", "text": "{{ inputs.ticket }}"}),
        ))
        .with_step(
            StepDef::new(
                "review",
                JudgmentStep::new(
                    "Ticket for account {{ inputs.account }} was classified as {{ steps.classify.output }}. Is the proposed outcome right?",
                    json!({"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]}),
                )
                .with_source("{{ steps.route.output }}")
                .with_source("{{ state.notes }}")
                .with_executor("human")
                .with_profile("support-lead")
                .with_constraint("Answer within one business day.")
                .with_constraint("Cite the ticket when you disagree."),
            )
            .with_timeout(Millis::secs(86_400)),
        )
        .with_step(
            StepDef::tool("record", r("json@^0.1"), json!({"value": "{{ steps.review.output }}", "select": "/approve"}))
                .with_writes("approved"),
        )
        .with_edge("classify", "gather")
        .with_edge("gather", "route")
        .with_edge("route", "review")
        .with_edge("review", "record")
        .with_loop("record", "classify", nz(2), Some("steps.record.output == false"))
}

#[test]
fn canonical_builders_reproduce_the_reference_fixture() {
    let built = support_triage_built();
    let parsed = load(&fixtures().join("valid/support.triage.yaml"));
    assert_eq!(version_of(&built), version_of(&parsed));
    assert_eq!(canonicalize(&built), canonicalize(&parsed));
}
