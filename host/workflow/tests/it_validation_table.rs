//! Load-time validation, table-driven (issue 4; seed T3.3's Verify list).
//!
//! * `fixtures/invalid/`: one malformed workflow per check. Each row names
//!   the exact variants it must produce, with their ids; a row fails if an
//!   expected variant is missing *or* if any other error appears (so a
//!   validator that reports everything, or reports a generic error, fails).
//! * Every `ValidationCode` must be produced by some row.
//! * The multi-error fixture (three defects, all reported), the cycle path,
//!   the depth bound (nothing resolved past it, no `Validated`), the
//!   unresolved tool (name + registry + nearest), the positive control and
//!   the constant audit have their own tests.
//!
//! `cargo test -p workflow validation` runs them all.

mod common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;

use common::*;
use poimen_workflow::validate::{MAX_PARALLEL_WIDTH, MAX_STEP_TIMEOUT, ValidationCode};
use poimen_workflow::*;
use serde_json::json;
use strum::IntoEnumIterator;

type Expect = Box<dyn Fn(&ValidationError) -> bool>;

fn ids<T: std::fmt::Display>(v: &[T]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

/// How a row is validated, beyond loading its fixture.
#[derive(Default)]
struct Setup {
    limits: Option<fn(&mut ValidatorLimits)>,
    mutate: Option<fn(&mut WorkflowDef)>,
    extra_tool: Option<ToolInfo>,
}

struct Row {
    fixture: &'static str,
    setup: Setup,
    expect: Vec<Expect>,
}

fn row(fixture: &'static str, expect: Vec<Expect>) -> Row {
    Row {
        fixture,
        setup: Setup::default(),
        expect,
    }
}

macro_rules! e {
    ($p:pat $(if $g:expr)?) => {
        Box::new(|e: &ValidationError| matches!(e, $p $(if $g)?)) as Expect
    };
}

fn s(x: &StepId, want: &str) -> bool {
    x.as_str() == want
}

/// Validates a fixture: a file, or a directory whose `main.yaml` is the
/// workflow and whose files are all published (sub-workflows).
fn run_fixture(fixture: &str, setup: &Setup) -> Result<Validated, Vec<ValidationError>> {
    let path = fixtures().join("invalid").join(fixture);
    let (def, workflows) = if path.is_dir() {
        (load(&path.join("main.yaml")), workflows_in(&path))
    } else {
        (load(&path), MemoryWorkflows::new())
    };
    let mut def = def;
    if let Some(m) = setup.mutate {
        m(&mut def);
    }
    let (mut tools, verifiers) = registries();
    if let Some(t) = &setup.extra_tool {
        tools.insert(t.clone());
    }
    let mut limits = ValidatorLimits::default();
    if let Some(l) = setup.limits {
        l(&mut limits);
    }
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    validate_with(&def, &reg, &limits)
}

fn table() -> Vec<Row> {
    use ValidationError as V;
    vec![
        row("no_steps.yaml", vec![e!(V::NoSteps)]),
        row(
            "unsupported_schema.yaml",
            vec![e!(V::UnsupportedSchema {
                found: 2,
                supported: 1
            })],
        ),
        row(
            "invalid_workflow_id.yaml",
            vec![e!(V::InvalidWorkflowId { workflow } if workflow.as_str() == "Billing..Refund")],
        ),
        row(
            "invalid_tool_name.yaml",
            vec![e!(V::InvalidToolName { name } if name == "Bad Name")],
        ),
        row(
            "invalid_step_id.yaml",
            vec![e!(V::InvalidStepId { step } if s(step, "Fetch-Data"))],
        ),
        row(
            "duplicate_step_id.yaml",
            vec![e!(V::DuplicateStepId { step } if s(step, "fetch"))],
        ),
        row(
            "invalid_state_key.yaml",
            vec![e!(V::InvalidStateKey { key } if key.as_str() == "Notes")],
        ),
        row(
            "unknown_transition_step.yaml",
            vec![
                e!(V::UnknownTransitionStep { from, to, missing } if s(from, "a") && s(to, "ghost") && s(missing, "ghost")),
            ],
        ),
        row(
            "duplicate_transition.yaml",
            vec![e!(V::DuplicateTransition { from, to } if s(from, "a") && s(to, "b"))],
        ),
        row(
            "forward_cycle.yaml",
            vec![e!(V::ForwardCycle { path } if ids(path) == ["a", "b", "c", "a"])],
        ),
        row(
            "back_edge_not_backward.yaml",
            vec![e!(V::BackEdgeNotBackward { from, to } if s(from, "a") && s(to, "c"))],
        ),
        row(
            "loop_bound_too_large.yaml",
            vec![
                e!(V::LoopBoundTooLarge { from, to, max_iterations: 1001, limit: 1000 } if s(from, "b") && s(to, "a")),
            ],
        ),
        row(
            "multiple_back_edges.yaml",
            vec![e!(V::MultipleBackEdges { from, to } if s(from, "c") && ids(to) == ["a", "b"])],
        ),
        row(
            "predicate_on_forward_edge.yaml",
            vec![e!(V::PredicateOnForwardEdge { from, to } if s(from, "a") && s(to, "b"))],
        ),
        row(
            "unknown_owned_step.yaml",
            vec![e!(V::UnknownOwnedStep { owner, step } if s(owner, "fan") && s(step, "ghost"))],
        ),
        row(
            "duplicate_owned_step.yaml",
            vec![e!(V::DuplicateOwnedStep { owner, step } if s(owner, "fan") && s(step, "x"))],
        ),
        row(
            "multiple_owners.yaml",
            vec![
                e!(V::MultipleOwners { step, owners } if s(step, "x") && ids(owners) == ["fan1", "fan2"]),
            ],
        ),
        row(
            "owned_step_in_transition.yaml",
            vec![
                e!(V::OwnedStepInTransition { step, owner, from, to } if s(step, "x") && s(owner, "fan") && s(from, "x") && s(to, "b")),
            ],
        ),
        row(
            "ownership_cycle.yaml",
            vec![e!(V::OwnershipCycle { path } if ids(path) == ["p1", "p2", "p1"])],
        ),
        row(
            "unreachable.yaml",
            vec![
                e!(V::Unreachable { step } if s(step, "c")),
                e!(V::ForwardCycle { path } if ids(path) == ["a", "b", "a"]),
            ],
        ),
        row(
            "empty_parallel.yaml",
            vec![e!(V::EmptyParallel { step } if s(step, "fan"))],
        ),
        row(
            "parallel_too_wide.yaml",
            vec![
                e!(V::ParallelTooWide { step, width: 65, limit } if s(step, "fan") && *limit == MAX_PARALLEL_WIDTH),
            ],
        ),
        row(
            "invalid_quorum.yaml",
            vec![e!(V::InvalidQuorum { step, quorum: 3, branches: 2 } if s(step, "fan"))],
        ),
        row(
            "parallel_writes_need_reducer.yaml",
            vec![
                e!(V::ParallelWritesNeedReducer { step, key, branches } if s(step, "fan") && key.as_str() == "notes" && ids(branches) == ["x", "y"]),
            ],
        ),
        row(
            "undeclared_state_write.yaml",
            vec![
                e!(V::UndeclaredStateWrite { step, key } if s(step, "a") && key.as_str() == "ghost"),
            ],
        ),
        row(
            "template_syntax.yaml",
            vec![
                e!(V::TemplateSyntax { site: Site::Step { step, field }, .. } if s(step, "a") && field == "model.prompt"),
            ],
        ),
        row(
            "template_too_large.yaml",
            vec![
                e!(V::TemplateTooLarge { site: Site::Step { step, .. }, bytes, limit: 65536 } if s(step, "a") && *bytes > 65536),
            ],
        ),
        row(
            "predicate_syntax.yaml",
            vec![
                e!(V::PredicateSyntax { site: Site::Step { step, field }, .. } if s(step, "route") && field == "conditional.on"),
            ],
        ),
        row(
            "predicate_too_large.yaml",
            vec![
                e!(V::PredicateTooLarge { site: Site::Step { step, .. }, limit: 4096, .. } if s(step, "route")),
            ],
        ),
        row(
            "predicate_too_deep.yaml",
            vec![
                e!(V::PredicateTooDeep { site: Site::Step { step, .. }, depth: 101, limit: 32 } if s(step, "route")),
            ],
        ),
        row(
            "predicate_loops_too_deep.yaml",
            vec![
                e!(V::PredicateLoopsTooDeep { site: Site::Step { step, .. }, nesting: 3, limit: 2 } if s(step, "route")),
            ],
        ),
        row(
            "predicate_not_pure.yaml",
            vec![
                e!(V::PredicateNotPure { site: Site::Step { step, .. }, function } if s(step, "route") && function == "now"),
            ],
        ),
        row(
            "unknown_variable.yaml",
            vec![
                e!(V::UnknownVariable { site: Site::Step { step, .. }, variable } if s(step, "a") && variable == "env.HOME"),
            ],
        ),
        row(
            "dynamic_step_reference.yaml",
            vec![
                e!(V::DynamicStepReference { site: Site::Step { step, field } } if s(step, "b") && field == "model.prompt"),
            ],
        ),
        row(
            "unknown_step_reference.yaml",
            vec![
                e!(V::UnknownStepReference { site: Site::Step { step: reader, .. }, step } if s(reader, "a") && s(step, "ghost")),
            ],
        ),
        row(
            "step_not_before.yaml",
            vec![
                e!(V::StepNotBefore { site: Site::Step { step: reader, .. }, step } if s(reader, "a") && s(step, "b")),
            ],
        ),
        row(
            "undeclared_state_read.yaml",
            vec![
                e!(V::UndeclaredStateRead { site: Site::Step { step, .. }, key } if s(step, "a") && key == "ghost"),
            ],
        ),
        row(
            "key_not_from_inputs.yaml",
            vec![e!(V::KeyNotFromInputs { variable } if variable == "steps.a.output")],
        ),
        row(
            "key_scope_without_key.yaml",
            vec![e!(V::KeyScopeWithoutKey)],
        ),
        row("zero_max_runs.yaml", vec![e!(V::ZeroMaxRuns)]),
        Row {
            fixture: "too_many_steps.yaml",
            setup: Setup {
                limits: Some(|l| l.max_steps = 2),
                ..Setup::default()
            },
            expect: vec![e!(V::TooManySteps { count: 3, limit: 2 })],
        },
        row(
            "retry_attempts_out_of_range.yaml",
            vec![e!(V::RetryAttemptsOutOfRange { step, attempts: 11, limit: 10 } if s(step, "a"))],
        ),
        row(
            "unload_timeout_without_drain.yaml",
            vec![e!(V::UnloadTimeoutWithoutDrain { policy } if policy == "cancel")],
        ),
        row("zero_unload_timeout.yaml", vec![e!(V::ZeroUnloadTimeout)]),
        row(
            "fallback_answer_violates_schema.yaml",
            vec![
                e!(V::FallbackAnswerViolatesSchema { step, violations } if s(step, "approve") && violations.iter().any(|v| v.at == "/approved" && v.rule == "type")),
            ],
        ),
        row(
            "timeout_out_of_range.yaml",
            vec![
                e!(V::TimeoutOutOfRange { step, timeout_ms: 720_000_000, limit_ms } if s(step, "a") && *limit_ms == MAX_STEP_TIMEOUT.0),
            ],
        ),
        Row {
            fixture: "integer_too_large.yaml",
            setup: Setup {
                mutate: Some(|d| d.budget.tokens = Some(1 << 60)),
                ..Setup::default()
            },
            expect: vec![
                e!(V::IntegerTooLarge { field, value } if field == "budget.tokens" && *value == 1 << 60),
            ],
        },
        row(
            "invalid_schema.yaml",
            vec![e!(V::InvalidSchema { site: Site::Workflow { field }, .. } if field == "inputs")],
        ),
        row(
            "invalid_model_schema.yaml",
            vec![
                e!(V::InvalidSchema { site: Site::Step { step, field }, .. } if s(step, "a") && field == "model.schema"),
            ],
        ),
        row(
            "schema_needs_json_format.yaml",
            vec![e!(V::SchemaNeedsJsonFormat { step } if s(step, "a"))],
        ),
        row(
            "unresolved_tool.yaml",
            vec![e!(V::UnresolvedTool { step, name, registry, nearest, .. }
                if s(step, "fetch") && name == "http-gte" && registry.starts_with("tools:") && nearest.first().map(String::as_str) == Some("http-get"))],
        ),
        row(
            "withheld_tool.yaml",
            vec![e!(V::WithheldTool { step, tool, reason }
                if s(step, "read") && tool == "vault-read" && reason.contains("vault-read:/vault"))],
        ),
        row(
            "unresolved_verifier.yaml",
            vec![
                e!(V::UnresolvedVerifier { site: Site::Step { step, .. }, name, registry, nearest, .. }
                if s(step, "a") && name == "jsonschema" && registry.starts_with("verifiers:") && nearest.contains(&"json-schema".to_owned())),
            ],
        ),
        row(
            "args_violate_schema.yaml",
            vec![
                e!(V::ArgsViolateSchema { step, tool, violations } if s(step, "shout") && tool == "text" && violations.len() == 1 && violations[0].at == "/op"),
            ],
        ),
        row(
            "config_violates_schema.yaml",
            vec![
                e!(V::ConfigViolatesSchema { site: Site::Step { step, .. }, verifier, .. } if s(step, "a") && verifier == "matches"),
            ],
        ),
        Row {
            fixture: "tool_schema_invalid.yaml",
            setup: Setup {
                extra_tool: Some(ToolInfo {
                    name: "broken".into(),
                    version: semver::Version::new(0, 1, 0),
                    digest: "b3:00".into(),
                    description: String::new(),
                    input_schema: json!({"type": 12}),
                    output_schema: serde_json::Value::Null,
                    capabilities: Vec::new(),
                    effect: EffectClass::Pure,
                    max_timeout_ms: None,
                    workflow: None,
                }),
                ..Setup::default()
            },
            expect: vec![e!(V::ToolSchemaInvalid { tool, .. } if tool == "broken@0.1.0")],
        },
        Row {
            fixture: "timeout_above_policy.yaml",
            setup: Setup {
                extra_tool: Some(ToolInfo {
                    name: "slow".into(),
                    version: semver::Version::new(0, 1, 0),
                    digest: "b3:01".into(),
                    description: String::new(),
                    input_schema: serde_json::Value::Bool(true),
                    output_schema: serde_json::Value::Null,
                    capabilities: Vec::new(),
                    effect: EffectClass::Pure,
                    max_timeout_ms: Some(10_000),
                    workflow: None,
                }),
                ..Setup::default()
            },
            expect: vec![
                e!(V::TimeoutAbovePolicy { step, tool, timeout_ms: 60_000, max_ms: 10_000 } if s(step, "fetch") && tool == "slow"),
            ],
        },
        row(
            "duplicate_criterion.yaml",
            vec![e!(V::DuplicateCriterion { step: None, name } if name == "shape")],
        ),
        row(
            "invalid_weight.yaml",
            vec![
                e!(V::InvalidWeight { step: None, criterion, weight } if criterion == "shape" && *weight == 0.0),
            ],
        ),
        row(
            "invalid_threshold.yaml",
            vec![e!(V::InvalidThreshold { step: None, threshold } if *threshold == 1.5)],
        ),
        // A step's rubric: the same checks, naming the step.
        row(
            "invalid_step_rubric_weight.yaml",
            vec![
                e!(V::InvalidWeight { step: Some(step), criterion, weight } if s(step, "a") && criterion == "shape" && *weight == -1.0),
            ],
        ),
        row(
            "unresolved_step_rubric_verifier.yaml",
            vec![
                e!(V::UnresolvedVerifier { site: Site::Step { step, field }, name, registry, nearest, .. }
                if s(step, "a") && field == "rubric.criteria.shape" && name == "jsonschema"
                    && registry.starts_with("verifiers:") && nearest.contains(&"json-schema".to_owned())),
            ],
        ),
        row(
            "step_rubric_checks.yaml",
            vec![
                e!(V::DuplicateCriterion { step: Some(step), name } if s(step, "a") && name == "shape"),
                e!(V::InvalidThreshold { step: Some(step), threshold } if s(step, "a") && *threshold == 2.0),
                e!(V::ConfigViolatesSchema { site: Site::Step { step, field }, verifier, .. }
                if s(step, "a") && field == "rubric.criteria.word" && verifier == "matches"),
            ],
        ),
        row(
            "unresolved_sub_workflow.yaml",
            vec![
                e!(V::UnresolvedSubWorkflow { step, workflow, selector, via, .. }
                if s(step, "child") && workflow.as_str() == "billing.ghost" && selector == "latest" && via.is_empty()),
            ],
        ),
        row(
            "sub_workflow_cycle",
            vec![
                e!(V::SubWorkflowCycle { path } if ids(path) == ["cyc.a", "cyc.b", "cyc.c", "cyc.a"]),
            ],
        ),
        row(
            "sub_workflow_too_deep",
            vec![
                e!(V::SubWorkflowTooDeep { path, limit: 8 } if path.len() == 10 && path[9].as_str() == "deep.d9"),
            ],
        ),
        row(
            "sub_workflow_invalid",
            vec![e!(V::SubWorkflowInvalid { step, workflow, errors, .. }
                if s(step, "child") && workflow.as_str() == "child.broken"
                    && matches!(errors.as_slice(), [V::DuplicateStepId { step }] if s(step, "a")))],
        ),
        row(
            "shadow_ineligible.yaml",
            vec![e!(V::ShadowIneligible { steps } if steps.len() == 1
                && steps[0].step.as_ref().is_some_and(|x| s(x, "book"))
                && steps[0].tool == "ledger"
                && steps[0].reasons.contains(&Ineligibility::Effect { effect: EffectClass::NonIdempotent })
                && steps[0].reasons.contains(&Ineligibility::Capability { capability: "fs-write:/ledger".parse().expect("cap") }))],
        ),
    ]
}

#[test]
fn validation_table_every_fixture_gets_exactly_its_variants() {
    let mut failures = Vec::new();
    for r in table() {
        let errors = match run_fixture(r.fixture, &r.setup) {
            Ok(_) => {
                failures.push(format!("{}: validated, expected errors", r.fixture));
                continue;
            }
            Err(e) => e,
        };
        for (k, want) in r.expect.iter().enumerate() {
            if !errors.iter().any(want) {
                failures.push(format!(
                    "{}: expectation #{k} not met; got {errors:#?}",
                    r.fixture
                ));
            }
        }
        for e in &errors {
            if !r.expect.iter().any(|want| want(e)) {
                failures.push(format!("{}: unexpected error {e:?}", r.fixture));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn validation_table_covers_every_variant() {
    let mut covered = BTreeSet::new();
    for r in table() {
        if let Err(errors) = run_fixture(r.fixture, &r.setup) {
            covered.extend(errors.iter().map(ValidationError::code));
        }
    }
    let missing: Vec<ValidationCode> = ValidationCode::iter()
        .filter(|c| !covered.contains(c))
        .collect();
    assert!(
        missing.is_empty(),
        "variants without a fixture: {missing:?}"
    );
}

#[test]
fn validation_invalid_fixture_files_all_have_a_row() {
    let rows: BTreeSet<&str> = table().iter().map(|r| r.fixture).collect();
    let dir = fixtures().join("invalid");
    let mut orphans = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fixtures/invalid") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name != "multi_error.yaml" && !rows.contains(name.as_str()) {
            orphans.push(name);
        }
    }
    assert!(orphans.is_empty(), "fixtures nobody checks: {orphans:?}");
}

#[test]
fn validation_errors_render_as_json_with_their_code_and_ids() {
    let errors = run_fixture("forward_cycle.yaml", &Setup::default()).expect_err("invalid");
    let v = serde_json::to_value(&errors).expect("json");
    assert_eq!(
        v,
        json!([{"code": "forward_cycle", "path": ["a", "b", "c", "a"]}])
    );
    let text = errors[0].to_string();
    assert!(
        text.contains("a -> b -> c -> a") && text.contains("max_iterations"),
        "{text}"
    );
}

#[test]
fn validation_multi_error_fixture_reports_all_three_defects_in_one_pass() {
    let errors = run_fixture("multi_error.yaml", &Setup::default()).expect_err("invalid");
    let codes: BTreeSet<ValidationCode> = errors.iter().map(ValidationError::code).collect();
    assert_eq!(
        codes,
        BTreeSet::from([
            ValidationCode::DuplicateStepId,
            ValidationCode::UnresolvedTool,
            ValidationCode::LoopBoundTooLarge
        ]),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, ValidationError::DuplicateStepId { step } if s(step, "a")))
    );
    assert!(
        errors.iter().any(
            |e| matches!(e, ValidationError::UnresolvedTool { name, .. } if name == "htp-get")
        )
    );
    assert!(errors.iter().any(
        |e| matches!(e, ValidationError::LoopBoundTooLarge { from, to, max_iterations: 5000, .. } if s(from, "fetch") && s(to, "a"))
    ));
}

#[test]
fn validation_cycle_error_carries_the_full_path() {
    let errors = run_fixture("forward_cycle.yaml", &Setup::default()).expect_err("invalid");
    let [ValidationError::ForwardCycle { path }] = errors.as_slice() else {
        panic!("{errors:?}")
    };
    assert_eq!(ids(path), ["a", "b", "c", "a"]);
    let errors = run_fixture("sub_workflow_cycle", &Setup::default()).expect_err("invalid");
    let [ValidationError::SubWorkflowCycle { path }] = errors.as_slice() else {
        panic!("{errors:?}")
    };
    assert_eq!(ids(path), ["cyc.a", "cyc.b", "cyc.c", "cyc.a"]);
    assert!(
        errors[0]
            .to_string()
            .contains("cyc.a -> cyc.b -> cyc.c -> cyc.a")
    );
}

/// Records every resolution the validator asks of the workflow store.
struct LoggingResolver {
    inner: MemoryWorkflows,
    log: RefCell<Vec<String>>,
}

impl WorkflowResolver for LoggingResolver {
    fn resolve_workflow(
        &self,
        id: &WorkflowId,
        selector: &VersionSelector,
    ) -> Result<(WorkflowVersion, Arc<WorkflowDef>), UnresolvedWorkflow> {
        self.log.borrow_mut().push(id.to_string());
        self.inner.resolve_workflow(id, selector)
    }
}

#[test]
fn validation_depth_bound_rejects_at_load_and_resolves_nothing_past_it() {
    let dir = fixtures().join("invalid/sub_workflow_too_deep");
    let def = load(&dir.join("main.yaml"));
    let resolver = LoggingResolver {
        inner: workflows_in(&dir),
        log: RefCell::new(Vec::new()),
    };
    let (tools, verifiers) = registries();
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &resolver,
    };
    // The chain is d0 -> d1 -> ... -> d11; the kernel bound is 8 levels.
    let result = validate(&def, &reg);
    let Err(errors) = result else {
        panic!("a too-deep workflow validated: it could have been run")
    };
    let [ValidationError::SubWorkflowTooDeep { path, limit }] = errors.as_slice() else {
        panic!("{errors:#?}")
    };
    assert_eq!(*limit, validate::MAX_SUBWORKFLOW_DEPTH);
    assert_eq!(
        ids(path),
        (0..=9).map(|i| format!("deep.d{i}")).collect::<Vec<_>>()
    );
    // The walk stopped at the bound: d10 and d11 were never even looked up,
    // and no tool was resolved for any level past it (nothing executable
    // exists in this crate; without a `Validated` nothing can run).
    let log = resolver.log.borrow().clone();
    assert_eq!(
        log,
        (1..=9).map(|i| format!("deep.d{i}")).collect::<Vec<_>>()
    );
}

#[test]
fn validation_unresolved_tool_names_the_name_the_registry_and_the_nearest() {
    let errors = run_fixture("unresolved_tool.yaml", &Setup::default()).expect_err("invalid");
    let [
        ValidationError::UnresolvedTool {
            step,
            tool,
            name,
            requested,
            registry,
            nearest,
            ..
        },
    ] = errors.as_slice()
    else {
        panic!("{errors:#?}")
    };
    assert_eq!(
        (
            step.as_str(),
            tool.as_str(),
            name.as_str(),
            requested.as_str()
        ),
        ("fetch", "http-gte", "http-gte", "*")
    );
    assert_eq!(registry, "tools: fixtures/registry/tools.json");
    assert_eq!(nearest.first().map(String::as_str), Some("http-get"));
    let text = errors[0].to_string();
    assert!(
        text.contains("http-gte")
            && text.contains("tools: fixtures/registry/tools.json")
            && text.contains("http-get"),
        "{text}"
    );
}

#[test]
fn validation_positive_control_reference_workflow_has_zero_errors() {
    let (tools, verifiers) = registries();
    let workflows = workflows_in(&fixtures().join("valid"));
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    for file in ["support.triage.yaml", "billing.refund_review.yaml"] {
        let def = load(&fixtures().join("valid").join(file));
        let v = match validate(&def, &reg) {
            Ok(v) => v,
            Err(errors) => panic!(
                "{file}: {} errors:\n{}",
                errors.len(),
                errors
                    .iter()
                    .map(|e| format!("  {e}\n"))
                    .collect::<String>()
            ),
        };
        assert_eq!(v.version(), version_of(&def));
    }
    let v = validate(&load(&fixtures().join("valid/support.triage.yaml")), &reg).expect("valid");
    assert!(
        v.is_long_lived(),
        "a judgment step waits on an external judge"
    );
    assert_eq!(v.sub_workflow_versions().len(), 1);
    assert!(v.tool(&"http-get@^0.1".parse().expect("ref")).is_some());
    // Eligibility: only the network tool disqualifies it.
    let report = eligibility_report(&v);
    assert_eq!(report.ineligible.len(), 1, "{report}");
    assert_eq!(
        report.ineligible[0].step.as_ref().map(StepId::as_str),
        Some("fetch_status")
    );
    assert_eq!(
        report.ineligible[0].reasons,
        [Ineligibility::Capability {
            capability: Capability::Http
        }]
    );
    // ... so loading it for shadow evaluation is refused at load.
    let errors = validate_for_shadow(&load(&fixtures().join("valid/support.triage.yaml")), &reg)
        .expect_err("ineligible");
    assert!(
        matches!(errors.as_slice(), [ValidationError::ShadowIneligible { steps }] if steps.len() == 1)
    );
}

#[test]
fn validation_step_rubric_verifiers_are_resolved_pinned_and_checked_for_shadow() {
    // `fixtures/canonical/step_fields.yaml` validates; `matches@^0.1` is
    // used only by its step's rubric, and `Validated::verifiers` (what the
    // executor pins) has it.
    let (tools, verifiers) = registries();
    let workflows = MemoryWorkflows::new();
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    let def = load(&fixtures().join("canonical/step_fields.yaml"));
    let v = validate(&def, &reg).unwrap_or_else(|e| panic!("{e:#?}"));
    let pinned: Vec<String> = v.verifiers().keys().map(ToString::to_string).collect();
    assert_eq!(pinned, ["json-schema@^0.1", "matches@^0.1"]);
    assert!(v.eligibility().is_eligible());

    // A step-rubric verifier that may not run in shadow evaluation is named
    // with its step and criterion, and refuses a shadow-evaluable workflow.
    let mut verifiers = verifiers;
    verifiers.insert(ToolInfo {
        name: "net-judge".into(),
        version: semver::Version::new(0, 1, 0),
        digest: "b3:00".into(),
        description: String::new(),
        input_schema: serde_json::Value::Null,
        output_schema: serde_json::Value::Null,
        capabilities: vec![Capability::Http],
        effect: EffectClass::Pure,
        max_timeout_ms: None,
        workflow: None,
    });
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    let def = WorkflowDef::new("w").with_shadow_evaluable(true).with_step(
        StepDef::model("a", "hi").with_rubric(RubricDef {
            criteria: vec![Criterion::new("remote", ToolRef::any("net-judge"))],
            threshold: None,
        }),
    );
    let errors = validate(&def, &reg).expect_err("ineligible");
    let [ValidationError::ShadowIneligible { steps }] = errors.as_slice() else {
        panic!("{errors:#?}")
    };
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].step.as_ref().map(StepId::as_str), Some("a"));
    assert_eq!(steps[0].criterion.as_deref(), Some("remote"));
    assert_eq!(steps[0].tool, "net-judge");
    assert!(
        steps[0]
            .to_string()
            .starts_with("rubric criterion `remote` of step `a`"),
        "{}",
        steps[0]
    );
}

#[test]
fn validation_step_rubric_errors_name_the_step_and_workflow_ones_render_as_before() {
    let errors =
        run_fixture("invalid_step_rubric_weight.yaml", &Setup::default()).expect_err("invalid");
    assert_eq!(
        serde_json::to_value(&errors).expect("json"),
        json!([{"code": "invalid_weight", "step": "a", "criterion": "shape", "weight": -1.0}])
    );
    assert!(
        errors[0]
            .to_string()
            .starts_with("rubric criterion `shape` of step `a` has weight -1"),
        "{}",
        errors[0]
    );
    // The workflow's rubric: no `step` member, the message as it was.
    let errors = run_fixture("invalid_weight.yaml", &Setup::default()).expect_err("invalid");
    assert_eq!(
        serde_json::to_value(&errors).expect("json"),
        json!([{"code": "invalid_weight", "criterion": "shape", "weight": 0.0}])
    );
    assert!(
        errors[0]
            .to_string()
            .starts_with("rubric criterion `shape` has weight 0"),
        "{}",
        errors[0]
    );
}

/// A workflow sitting exactly at every limit of `at_limits()`.
fn at_limits_workflow() -> (WorkflowDef, MemoryWorkflows) {
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let mut children = MemoryWorkflows::new();
    let leaf = WorkflowDef::new("limits.leaf").with_step(StepDef::model("a", "leaf"));
    let mid =
        WorkflowDef::new("limits.mid").with_step(StepDef::sub_workflow("call", "limits.leaf"));
    children.insert(version_of(&leaf), leaf);
    children.insert(version_of(&mid), mid);
    let def = WorkflowDef::new("limits.root")
        .with_step(
            StepDef::model("first", "x".repeat(100))
                .with_retry(RetryPolicy::attempts(4))
                .with_timeout(Millis::secs(90)),
        )
        .with_step(StepDef::parallel("fan", ["b1", "b2", "b3"]))
        .with_step(StepDef::model("b1", "one"))
        .with_step(StepDef::model("b2", "two"))
        .with_step(StepDef::model("b3", "three"))
        .with_step(StepDef::conditional(
            "route",
            "[1, 2].exists(x, inputs.n == x)",
            "then_step",
        ))
        .with_step(StepDef::model("then_step", "then"))
        .with_step(StepDef::sub_workflow("child", "limits.mid"))
        .with_edge("first", "fan")
        .with_edge("fan", "route")
        .with_edge("route", "child")
        .with_loop("child", "first", nz(5), None);
    (def, children)
}

/// The limits `at_limits_workflow` meets exactly.
fn at_limits() -> ValidatorLimits {
    ValidatorLimits {
        max_steps: 8,
        max_parallel_width: 3,
        max_retry_attempts: 4,
        max_step_timeout: Millis::secs(90),
        max_loop_iterations: 5,
        max_subworkflow_depth: 2,
        max_template_bytes: 100,
        max_predicate_bytes: "[1, 2].exists(x, inputs.n == x)".len(),
        // the comprehension → its step `_||_` → `_==_` → `.n` → `inputs`
        max_predicate_depth: 5,
        max_predicate_loop_nesting: 1,
    }
}

#[test]
fn validation_constant_audit_each_limit_is_its_own_constant() {
    // The defaults are the named kernel constants, one each.
    let d = ValidatorLimits::default();
    assert_eq!(d.max_steps, validate::MAX_STEPS);
    assert_eq!(d.max_parallel_width, validate::MAX_PARALLEL_WIDTH);
    assert_eq!(d.max_retry_attempts, validate::MAX_RETRY_ATTEMPTS);
    assert_eq!(d.max_step_timeout, validate::MAX_STEP_TIMEOUT);
    assert_eq!(d.max_loop_iterations, validate::MAX_LOOP_ITERATIONS);
    assert_eq!(d.max_subworkflow_depth, validate::MAX_SUBWORKFLOW_DEPTH);
    assert_eq!(d.max_template_bytes, validate::MAX_TEMPLATE_BYTES);
    assert_eq!(d.max_predicate_bytes, validate::MAX_PREDICATE_BYTES);
    assert_eq!(d.max_predicate_depth, validate::MAX_PREDICATE_DEPTH);
    assert_eq!(
        d.max_predicate_loop_nesting,
        validate::MAX_PREDICATE_LOOP_NESTING
    );

    let (def, children) = at_limits_workflow();
    let (tools, verifiers) = registries();
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &children,
    };
    if let Err(errors) = validate_with(&def, &reg, &at_limits()) {
        panic!("at the limits, not over: {errors:#?}");
    }
    // Lowering exactly one limit by one moves exactly its own check.
    type Lower = fn(&mut ValidatorLimits);
    let cases: [(&str, Lower, ValidationCode); 10] = [
        (
            "max_steps",
            |l| l.max_steps -= 1,
            ValidationCode::TooManySteps,
        ),
        (
            "max_parallel_width",
            |l| l.max_parallel_width -= 1,
            ValidationCode::ParallelTooWide,
        ),
        (
            "max_retry_attempts",
            |l| l.max_retry_attempts -= 1,
            ValidationCode::RetryAttemptsOutOfRange,
        ),
        (
            "max_step_timeout",
            |l| l.max_step_timeout.0 -= 1,
            ValidationCode::TimeoutOutOfRange,
        ),
        (
            "max_loop_iterations",
            |l| l.max_loop_iterations -= 1,
            ValidationCode::LoopBoundTooLarge,
        ),
        (
            "max_subworkflow_depth",
            |l| l.max_subworkflow_depth -= 1,
            ValidationCode::SubWorkflowTooDeep,
        ),
        (
            "max_template_bytes",
            |l| l.max_template_bytes -= 1,
            ValidationCode::TemplateTooLarge,
        ),
        (
            "max_predicate_bytes",
            |l| l.max_predicate_bytes -= 1,
            ValidationCode::PredicateTooLarge,
        ),
        (
            "max_predicate_depth",
            |l| l.max_predicate_depth -= 1,
            ValidationCode::PredicateTooDeep,
        ),
        (
            "max_predicate_loop_nesting",
            |l| l.max_predicate_loop_nesting -= 1,
            ValidationCode::PredicateLoopsTooDeep,
        ),
    ];
    for (name, lower, code) in cases {
        let mut limits = at_limits();
        lower(&mut limits);
        let errors = validate_with(&def, &reg, &limits).expect_err(name);
        let codes: Vec<ValidationCode> = errors.iter().map(ValidationError::code).collect();
        assert_eq!(codes, [code], "{name} moved other checks: {errors:#?}");
    }
}

#[test]
fn validation_fixture_paths_are_relative_to_the_repository() {
    assert!(Path::new(&fixtures().join("registry/tools.json")).exists());
}

/// Predicates the `cel_predicates` fuzz target found too deep to evaluate
/// (`fixtures/fuzz/predicates_too_deep/`: a chain of 2 000 additions, within
/// the byte limit, overflowed a worker thread's stack when a run evaluated
/// it): each is refused at load, as a conditional's `on` and as a loop's
/// `when`, with its depth and the limit.
#[test]
fn validation_fuzz_regressions_deep_predicates() {
    let dir = fixtures().join("fuzz/predicates_too_deep");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures/fuzz/predicates_too_deep")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no regression inputs in {}",
        dir.display()
    );
    let (tools, verifiers) = registries();
    let workflows = MemoryWorkflows::new();
    let reg = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    for path in files {
        let predicate = std::fs::read_to_string(&path).expect("predicate");
        let def = WorkflowDef::new("fuzz.deep")
            .with_step(StepDef::model("a", "hi"))
            .with_step(StepDef::conditional("route", predicate.as_str(), "b"))
            .with_step(StepDef::model("b", "there"))
            .with_edge("a", "route")
            .with_loop(
                "route",
                "a",
                NonZeroU32::new(2).expect("2"),
                Some(predicate.as_str()),
            );
        let errors = validate(&def, &reg).expect_err("too deep");
        let deep = |e: &ValidationError| {
            matches!(e, ValidationError::PredicateTooDeep { depth, limit, .. }
                if *depth > *limit && *limit == validate::MAX_PREDICATE_DEPTH)
        };
        assert_eq!(
            errors.iter().filter(|e| deep(e)).count(),
            2,
            "{}: {errors:#?}",
            path.display()
        );
        assert_eq!(errors.len(), 2, "{}: {errors:#?}", path.display());
    }
    // Predicates whose macros nest so deep that evaluating them took minutes
    // (`fixtures/fuzz/predicates_too_many_loops/`) are refused the same way.
    let dir = fixtures().join("fuzz/predicates_too_many_loops");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures/fuzz/predicates_too_many_loops")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no regression inputs in {}",
        dir.display()
    );
    for path in files {
        let predicate = std::fs::read_to_string(&path).expect("predicate");
        let def = WorkflowDef::new("fuzz.loops")
            .with_step(StepDef::conditional("route", predicate.as_str(), "b"))
            .with_step(StepDef::model("b", "there"));
        let errors = validate(&def, &reg).expect_err("too many loops");
        assert!(
            matches!(&errors[..], [ValidationError::PredicateLoopsTooDeep { nesting, limit, .. }]
                if *nesting > *limit && *limit == validate::MAX_PREDICATE_LOOP_NESTING),
            "{}: {errors:#?}",
            path.display()
        );
    }
    // The deepest chain the validator still compiles (to measure it) does
    // not overflow this test thread's 2 MiB stack either.
    let chained = validate::MAX_PREDICATE_DEPTH * 8;
    let predicate = vec!["1"; chained + 1].join(" + ");
    let def = WorkflowDef::new("fuzz.deep")
        .with_step(StepDef::conditional("route", predicate.as_str(), "b"))
        .with_step(StepDef::model("b", "there"));
    let errors = validate(&def, &reg).expect_err("too deep");
    assert!(
        matches!(&errors[..], [ValidationError::PredicateTooDeep { depth, .. }] if *depth == chained + 1),
        "{errors:#?}"
    );
}
