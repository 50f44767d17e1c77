//! Load-time validation: every structural check on the IR, each with its own
//! typed diagnostic, all found in one pass.
//!
//! [`validate`] is a pure function of the definition and the registries
//! (traits: no IO here, no wasmtime). It returns every problem at once, or a
//! [`Validated`] — the only way to obtain one — holding the definition, its
//! version, every tool and verifier it resolved, each sub-workflow validated
//! and pinned to a version, and its shadow-eligibility report. The
//! interpreter runs a `Validated` and never checks again.
//!
//! Every numeric limit is its own named constant, gathered in
//! [`ValidatorLimits`] so that a caller (or the constant-audit test) can move
//! exactly one of them.

pub(crate) mod error;
pub(crate) mod limits;
mod reads;
mod refs;
mod resolve;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

pub use error::{IneligibleStep, SchemaViolation, Site, ValidationCode, ValidationError};
pub use limits::*;
pub use refs::{PURE_CEL_FUNCTIONS, ROOTS, TEMPLATE_GLOBALS};

use crate::canonical::version_of;
use crate::ir::*;
use crate::registry::{Registries, ToolInfo, Unresolved, UnresolvedWorkflow};
use crate::shape::{self, Reach, Shape};
use crate::version::WorkflowVersion;
use refs::Reader;
use resolve::Resolver;

/// Whether a workflow may run in shadow evaluation, and if not, which uses
/// of which tools disqualify it (sub-workflows included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EligibilityReport {
    pub workflow: WorkflowId,
    /// Every disqualifying use; empty when eligible.
    pub ineligible: Vec<IneligibleStep>,
}

impl EligibilityReport {
    pub fn is_eligible(&self) -> bool {
        self.ineligible.is_empty()
    }
}

impl std::fmt::Display for EligibilityReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_eligible() {
            return write!(f, "`{}` is eligible for shadow evaluation", self.workflow);
        }
        write!(
            f,
            "`{}` is not eligible for shadow evaluation:",
            self.workflow
        )?;
        for s in &self.ineligible {
            write!(f, "\n  - {s}")?;
        }
        Ok(())
    }
}

/// A workflow that passed validation. Only [`validate`] makes one.
#[derive(Debug, Clone)]
pub struct Validated {
    def: Arc<WorkflowDef>,
    version: WorkflowVersion,
    tools: BTreeMap<ToolRef, ToolInfo>,
    verifiers: BTreeMap<ToolRef, ToolInfo>,
    sub_workflows: BTreeMap<StepId, Arc<Validated>>,
    eligibility: EligibilityReport,
    shape: Arc<Shape>,
}

impl Validated {
    /// The workflow's shape — ready order, owners, back-edges — as the
    /// validator computed it: the executor runs this order and `plan` shows
    /// it.
    pub fn shape(&self) -> &Arc<Shape> {
        &self.shape
    }

    /// The step with this id.
    pub fn step(&self, id: &str) -> Option<&StepDef> {
        self.shape.lookup(id).map(|i| &self.def.steps[i])
    }

    pub fn def(&self) -> &WorkflowDef {
        &self.def
    }

    /// The definition, shared.
    pub fn def_arc(&self) -> Arc<WorkflowDef> {
        Arc::clone(&self.def)
    }

    pub fn into_def(self) -> WorkflowDef {
        Arc::unwrap_or_clone(self.def)
    }

    pub fn version(&self) -> WorkflowVersion {
        self.version
    }

    /// Every tool the workflow references (tool steps and tool selectors),
    /// resolved, by reference as written.
    pub fn tools(&self) -> &BTreeMap<ToolRef, ToolInfo> {
        &self.tools
    }

    pub fn tool(&self, r: &ToolRef) -> Option<&ToolInfo> {
        self.tools.get(r)
    }

    /// Every verifier the workflow references — steps' `verify`, steps'
    /// rubrics and the workflow's rubric — resolved, by reference as written.
    pub fn verifiers(&self) -> &BTreeMap<ToolRef, ToolInfo> {
        &self.verifiers
    }

    pub fn verifier(&self, r: &ToolRef) -> Option<&ToolInfo> {
        self.verifiers.get(r)
    }

    /// The validated sub-workflow each sub-workflow step runs.
    pub fn sub_workflows(&self) -> &BTreeMap<StepId, Arc<Validated>> {
        &self.sub_workflows
    }

    pub fn sub_workflow(&self, step: &StepId) -> Option<&Arc<Validated>> {
        self.sub_workflows.get(step)
    }

    /// The exact version each sub-workflow step runs.
    pub fn sub_workflow_versions(&self) -> BTreeMap<StepId, WorkflowVersion> {
        self.sub_workflows
            .iter()
            .map(|(s, v)| (s.clone(), v.version))
            .collect()
    }

    pub fn eligibility(&self) -> &EligibilityReport {
        &self.eligibility
    }

    /// Whether a run can wait on an external event: a judgment step here or
    /// in any sub-workflow.
    pub fn is_long_lived(&self) -> bool {
        self.def.is_long_lived() || self.sub_workflows.values().any(|c| c.is_long_lived())
    }
}

impl std::ops::Deref for Validated {
    type Target = WorkflowDef;
    fn deref(&self) -> &WorkflowDef {
        &self.def
    }
}

/// The shadow-eligibility report of a validated workflow.
pub fn eligibility_report(v: &Validated) -> EligibilityReport {
    v.eligibility.clone()
}

/// Validates with the kernel limits. Every error is reported, in one pass.
///
/// On success the [`Validated`] holds a copy of `def`; [`validate_arc`]
/// validates a shared definition without copying it.
pub fn validate(
    def: &WorkflowDef,
    registries: &Registries<'_>,
) -> Result<Validated, Vec<ValidationError>> {
    validate_with(def, registries, &ValidatorLimits::default())
}

/// [`validate`] for a definition already behind an [`Arc`] (no copy).
pub fn validate_arc(
    def: Arc<WorkflowDef>,
    registries: &Registries<'_>,
) -> Result<Validated, Vec<ValidationError>> {
    run(def, registries, &ValidatorLimits::default(), false)
}

/// Validates for shadow evaluation: as [`validate`], and additionally
/// rejected (with [`ValidationError::ShadowIneligible`]) unless every tool
/// and verifier it could reach may run in shadow evaluation.
pub fn validate_for_shadow(
    def: &WorkflowDef,
    registries: &Registries<'_>,
) -> Result<Validated, Vec<ValidationError>> {
    run(
        Arc::new(def.clone()),
        registries,
        &ValidatorLimits::default(),
        true,
    )
}

/// Validates against the given limits.
pub fn validate_with(
    def: &WorkflowDef,
    registries: &Registries<'_>,
    limits: &ValidatorLimits,
) -> Result<Validated, Vec<ValidationError>> {
    run(Arc::new(def.clone()), registries, limits, false)
}

fn run(
    def: Arc<WorkflowDef>,
    registries: &Registries<'_>,
    limits: &ValidatorLimits,
    for_shadow: bool,
) -> Result<Validated, Vec<ValidationError>> {
    let mut walk = walk(def, registries, limits);
    let mut resolver = Resolver::new(registries);
    let mut reader = Reader::new();
    let mut results: Vec<Option<Result<Arc<Validated>, Vec<ValidationError>>>> =
        vec![None; walk.nodes.len()];
    let post = std::mem::take(&mut walk.post);
    for v in post {
        let node = &walk.nodes[v];
        let children: HashMap<usize, ChildOutcome> = walk.edges[v]
            .iter()
            .map(|&(step, c)| {
                let outcome = match &results[c] {
                    Some(Ok(x)) => ChildOutcome::Valid(Arc::clone(x)),
                    Some(Err(errors)) => {
                        ChildOutcome::Invalid(walk.nodes[c].version, errors.clone())
                    }
                    None => ChildOutcome::Skipped,
                };
                (step, outcome)
            })
            .collect();
        let is_root = v == 0;
        let mut r = check(
            &node.def,
            node.version,
            &children,
            &mut resolver,
            &mut reader,
            limits,
            is_root && for_shadow,
        );
        if is_root {
            if let Err(errors) = &mut r {
                let mut all = std::mem::take(&mut walk.errors);
                all.append(errors);
                *errors = all;
            } else if !walk.errors.is_empty() {
                r = Err(std::mem::take(&mut walk.errors));
            }
        }
        results[v] = Some(r.map(Arc::new));
    }
    match results.into_iter().next().flatten() {
        Some(Ok(v)) => Ok(Arc::unwrap_or_clone(v)),
        Some(Err(e)) => Err(e),
        None => Err(walk.errors),
    }
}

// ─── the sub-workflow graph ──────────────────────────────────────────────

enum ChildOutcome {
    Valid(Arc<Validated>),
    Invalid(Option<WorkflowVersion>, Vec<ValidationError>),
    /// Not validated: the walk stopped at it (cycle or depth, reported).
    Skipped,
}

struct WalkNode {
    def: Arc<WorkflowDef>,
    /// `None` for the workflow being validated (its version is computed
    /// only once it is valid).
    version: Option<WorkflowVersion>,
}

struct Walk {
    /// Node 0 is the workflow being validated.
    nodes: Vec<WalkNode>,
    /// Per node: (step index, child node) for every sub-workflow step whose
    /// child was resolved and explored.
    edges: Vec<Vec<(usize, usize)>>,
    /// Nodes in post-order: children before their callers.
    post: Vec<usize>,
    errors: Vec<ValidationError>,
}

/// Walks the graph of sub-workflows from `root` (iterative depth-first
/// search, each version explored once): resolves every reference, and
/// reports unresolved references, cycles (with their path) and chains
/// deeper than the limit. Resolves nothing beyond the depth limit.
fn walk(root_def: Arc<WorkflowDef>, registries: &Registries<'_>, limits: &ValidatorLimits) -> Walk {
    let root_id = root_def.id.clone();
    let mut w = Walk {
        nodes: vec![WalkNode {
            def: root_def,
            version: None,
        }],
        edges: vec![Vec::new()],
        post: Vec::new(),
        errors: Vec::new(),
    };
    let mut by_version: HashMap<WorkflowVersion, usize> = HashMap::new();
    let mut memo: HashMap<(WorkflowId, VersionSelector), Result<usize, UnresolvedWorkflow>> =
        HashMap::new();
    // 0 = new, 1 = on the stack, 2 = done.
    let mut state: Vec<u8> = vec![1];
    let mut height: Vec<usize> = vec![0];
    let mut deepest: Vec<Option<usize>> = vec![None];
    let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
    let id_of = |w: &Walk, n: usize| w.nodes[n].def.id.clone();

    while let Some(&(v, cursor)) = stack.last() {
        let def_v = Arc::clone(&w.nodes[v].def);
        let next = def_v
            .steps
            .iter()
            .enumerate()
            .skip(cursor)
            .find_map(|(i, s)| match &s.kind {
                StepKind::SubWorkflow(sw) => {
                    Some((i, s.id.clone(), sw.id.clone(), sw.version.clone()))
                }
                _ => None,
            });
        let Some((step_i, step_id, child_id, selector)) = next else {
            stack.pop();
            state[v] = 2;
            // Every explored child is done by now: settle this node's height.
            let mut best: Option<(usize, usize)> = None;
            for &(_, c) in &w.edges[v] {
                let h = height[c] + 1;
                if best.is_none_or(|(bh, _)| h > bh) {
                    best = Some((h, c));
                }
            }
            height[v] = best.map_or(0, |b| b.0);
            deepest[v] = best.map(|b| b.1);
            w.post.push(v);
            continue;
        };
        if let Some(top) = stack.last_mut() {
            top.1 = step_i + 1;
        }
        let key = (child_id.clone(), selector.clone());
        let resolved = match memo.get(&key) {
            Some(r) => r.clone(),
            None => {
                let r = match registries.workflows.resolve_workflow(&child_id, &selector) {
                    Err(u) => Err(u),
                    Ok((version, def)) => Ok(*by_version.entry(version).or_insert_with(|| {
                        w.nodes.push(WalkNode {
                            def,
                            version: Some(version),
                        });
                        w.edges.push(Vec::new());
                        state.push(0);
                        height.push(0);
                        deepest.push(None);
                        w.nodes.len() - 1
                    })),
                };
                memo.insert(key, r.clone());
                r
            }
        };
        let path_ids = |w: &Walk, from: usize| -> Vec<WorkflowId> {
            stack[from..].iter().map(|&(n, _)| id_of(w, n)).collect()
        };
        let c = match resolved {
            Err(u) => {
                let via = if stack.len() > 1 {
                    path_ids(&w, 0)
                } else {
                    Vec::new()
                };
                w.errors.push(ValidationError::UnresolvedSubWorkflow {
                    step: step_id,
                    workflow: child_id,
                    selector: u.selector,
                    searched: u.searched,
                    via,
                });
                continue;
            }
            Ok(c) => c,
        };
        // A cycle: back to a version on the stack, or to the workflow being validated.
        let on_stack_at = if state[c] == 1 {
            stack.iter().position(|&(n, _)| n == c)
        } else if child_id == root_id {
            Some(0)
        } else {
            None
        };
        if let Some(at) = on_stack_at {
            let mut path = path_ids(&w, at);
            path.push(child_id);
            w.errors.push(ValidationError::SubWorkflowCycle { path });
            continue;
        }
        let depth = stack.len();
        let too_deep = depth > limits.max_subworkflow_depth
            || (state[c] == 2 && depth + height[c] > limits.max_subworkflow_depth);
        if too_deep {
            let mut path = path_ids(&w, 0);
            path.push(child_id);
            if state[c] == 2 {
                let mut k = deepest[c];
                while let Some(x) = k {
                    path.push(id_of(&w, x));
                    k = deepest[x];
                }
            }
            w.errors.push(ValidationError::SubWorkflowTooDeep {
                path,
                limit: limits.max_subworkflow_depth,
            });
            continue;
        }
        w.edges[v].push((step_i, c));
        if state[c] == 0 {
            state[c] = 1;
            stack.push((c, 0));
        }
    }
    w
}

// ─── one workflow ────────────────────────────────────────────────────────

struct Checker<'a, 'b> {
    def: &'a WorkflowDef,
    limits: &'b ValidatorLimits,
    errors: Vec<ValidationError>,
    shape: Shape,
}

#[allow(clippy::too_many_arguments)]
fn check(
    def_arc: &Arc<WorkflowDef>,
    version: Option<WorkflowVersion>,
    children: &HashMap<usize, ChildOutcome>,
    resolver: &mut Resolver<'_>,
    reader: &mut Reader,
    limits: &ValidatorLimits,
    shadow_required: bool,
) -> Result<Validated, Vec<ValidationError>> {
    let def: &WorkflowDef = def_arc;
    let mut errors = Vec::new();
    if def.schema != CURRENT_SCHEMA {
        errors.push(ValidationError::UnsupportedSchema {
            found: def.schema.0,
            supported: CURRENT_SCHEMA.0,
        });
    }
    if !is_workflow_id(def.id.as_str()) {
        errors.push(ValidationError::InvalidWorkflowId {
            workflow: def.id.clone(),
        });
    }
    if let Some(WorkflowTool {
        name: Some(name), ..
    }) = &def.tool
        && !is_workflow_id(name)
    {
        errors.push(ValidationError::InvalidToolName { name: name.clone() });
    }
    if def.steps.is_empty() {
        errors.push(ValidationError::NoSteps);
    }
    if def.steps.len() > limits.max_steps {
        errors.push(ValidationError::TooManySteps {
            count: def.steps.len(),
            limit: limits.max_steps,
        });
    }
    for key in def.state.keys() {
        if !is_step_id(key.as_str()) {
            errors.push(ValidationError::InvalidStateKey { key: key.clone() });
        }
    }
    let shape = shape::build(def, limits, &mut errors);
    let mut c = Checker {
        def,
        limits,
        errors,
        shape,
    };
    c.back_edges_point_backwards();
    let read_errors = reads::check(def, &c.shape, limits, reader);
    c.errors.extend(read_errors);
    c.state_writes();
    c.unload();
    c.concurrency();
    c.step_limits();
    c.integers();
    c.schemas(resolver);
    c.rubrics();
    let (tools, verifiers, ineligible) = c.registries(resolver);
    let sub_workflows = c.sub_workflows(children);
    let eligibility = c.eligibility(ineligible, &sub_workflows);
    if (def.shadow_evaluable || shadow_required) && !eligibility.is_eligible() {
        c.errors.push(ValidationError::ShadowIneligible {
            steps: eligibility.ineligible.clone(),
        });
    }
    if !c.errors.is_empty() {
        return Err(c.errors);
    }
    let version = version.unwrap_or_else(|| version_of(def));
    Ok(Validated {
        def: Arc::clone(def_arc),
        version,
        tools,
        verifiers,
        sub_workflows,
        eligibility,
        shape: Arc::new(c.shape),
    })
}

impl<'a> Checker<'a, '_> {
    fn back_edges_point_backwards(&mut self) {
        if !self.shape.acyclic {
            return;
        }
        let queries: Vec<(usize, usize)> = self
            .shape
            .back_edges
            .iter()
            .filter(|(f, t, _)| f != t)
            .map(|&(f, t, _)| (t, f))
            .collect();
        let answers = Reach::new(&self.shape).ancestors(&queries);
        let mut k = 0;
        for &(f, t, _) in &self.shape.back_edges {
            if f == t {
                continue;
            }
            if !answers[k] {
                self.errors.push(ValidationError::BackEdgeNotBackward {
                    from: self.shape.id(f).clone(),
                    to: self.shape.id(t).clone(),
                });
            }
            k += 1;
        }
    }

    fn state_writes(&mut self) {
        let def = self.def;
        for s in &def.steps {
            if let Some(k) = &s.writes
                && !def.state.contains_key(k)
            {
                self.errors.push(ValidationError::UndeclaredStateWrite {
                    step: s.id.clone(),
                    key: k.clone(),
                });
            }
        }
        if !def
            .steps
            .iter()
            .any(|s| matches!(s.kind, StepKind::Parallel(_)))
        {
            return;
        }
        // The keys written within each step's ownership subtree: merged from
        // the deepest owned steps up to their owners (ownership is a forest
        // here: steps on ownership cycles have no root and are skipped).
        let n = def.steps.len();
        let mut depth: Vec<Option<usize>> = vec![None; n];
        let mut chain = Vec::new();
        for i in 0..n {
            if self.shape.root[i].is_none() || depth[i].is_some() {
                continue;
            }
            chain.clear();
            let mut cur = i;
            let base = loop {
                if let Some(d) = depth[cur] {
                    break d + 1;
                }
                chain.push(cur);
                match self.shape.owner[cur] {
                    Some(o) => cur = o,
                    None => break 0,
                }
            };
            for (k, &c) in chain.iter().rev().enumerate() {
                depth[c] = Some(base + k);
            }
        }
        let mut order: Vec<usize> = (0..n).filter(|&i| depth[i].is_some()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(depth[i]));
        let mut writes: Vec<Vec<&StateKey>> = def
            .steps
            .iter()
            .map(|s| s.writes.iter().collect())
            .collect();
        for &i in &order {
            if let Some(o) = self.shape.owner[i] {
                let mine = writes[i].clone();
                let theirs = &mut writes[o];
                theirs.extend(mine);
                theirs.sort();
                theirs.dedup();
            }
        }
        for (p, s) in def.steps.iter().enumerate() {
            if !matches!(s.kind, StepKind::Parallel(_)) || depth[p].is_none() {
                continue;
            }
            let mut by_key: BTreeMap<&StateKey, Vec<StepId>> = BTreeMap::new();
            for &b in &self.shape.owned[p] {
                for k in &writes[b] {
                    by_key.entry(k).or_default().push(self.shape.id(b).clone());
                }
            }
            for (k, branches) in by_key {
                let needs = matches!(def.state.get(k), Some(StateDecl { reducer: None, .. }));
                if branches.len() > 1 && needs {
                    self.errors
                        .push(ValidationError::ParallelWritesNeedReducer {
                            step: s.id.clone(),
                            key: k.clone(),
                            branches,
                        });
                }
            }
        }
    }

    fn unload(&mut self) {
        let u = &self.def.unload;
        if let Some(t) = u.timeout {
            if u.policy != UnloadPolicy::Drain {
                let policy = match u.policy {
                    UnloadPolicy::Cancel => "cancel",
                    _ => "detach",
                };
                self.errors
                    .push(ValidationError::UnloadTimeoutWithoutDrain {
                        policy: policy.to_owned(),
                    });
            } else if t.0 == 0 {
                self.errors.push(ValidationError::ZeroUnloadTimeout);
            }
        }
    }

    fn concurrency(&mut self) {
        let c = &self.def.concurrency;
        if c.scope == ConcurrencyScope::Key && self.def.key.is_none() {
            self.errors.push(ValidationError::KeyScopeWithoutKey);
        }
        if c.max_runs == Some(0) {
            self.errors.push(ValidationError::ZeroMaxRuns);
        }
    }

    fn step_limits(&mut self) {
        for s in &self.def.steps {
            let a = s.retry.max_attempts;
            if a == 0 || a > self.limits.max_retry_attempts {
                self.errors.push(ValidationError::RetryAttemptsOutOfRange {
                    step: s.id.clone(),
                    attempts: a,
                    limit: self.limits.max_retry_attempts,
                });
            }
            if let Some(t) = s.timeout
                && (t.0 == 0 || t > self.limits.max_step_timeout)
            {
                self.errors.push(ValidationError::TimeoutOutOfRange {
                    step: s.id.clone(),
                    timeout_ms: t.0,
                    limit_ms: self.limits.max_step_timeout.0,
                });
            }
        }
    }

    /// IR integers the canonical form could not represent exactly (only
    /// constructible in Rust: the front end refuses such literals).
    fn integers(&mut self) {
        const MAX: u64 = crate::frontend::node::MAX_SAFE_INTEGER;
        let d = self.def;
        let mut check = |field: String, v: Option<u64>| {
            if let Some(v) = v.filter(|&v| v > MAX) {
                self.errors
                    .push(ValidationError::IntegerTooLarge { field, value: v });
            }
        };
        check("limits.tokens".into(), d.limits.tokens);
        check("limits.deadline".into(), d.limits.deadline.map(|m| m.0));
        check("budget.tokens".into(), d.budget.tokens);
        check("budget.tool_calls".into(), d.budget.tool_calls);
        check("budget.wall_time".into(), d.budget.wall_time.map(|m| m.0));
        for s in &d.steps {
            check(
                format!("steps.{}.retry.backoff", s.id),
                Some(s.retry.backoff.0),
            );
            check(
                format!("steps.{}.retry.max_backoff", s.id),
                s.retry.max_backoff.map(|m| m.0),
            );
        }
    }

    fn schemas(&mut self, resolver: &mut Resolver<'_>) {
        let d = self.def;
        let mut sites: Vec<(Site, &Value)> = Vec::new();
        if let Some(v) = &d.inputs {
            sites.push((Site::workflow("inputs"), v));
        }
        if let Some(v) = &d.outputs {
            sites.push((Site::workflow("outputs"), v));
        }
        for (k, decl) in &d.state {
            if let Some(v) = &decl.schema {
                sites.push((Site::workflow(format!("state.{k}.schema")), v));
            }
        }
        for s in &d.steps {
            match &s.kind {
                StepKind::Judgment(j) => sites.push((
                    Site::step(&s.id, "judgment.result_schema"),
                    &j.result_schema,
                )),
                // `null` is "absent" (it has the version of no schema).
                StepKind::Model(m) => {
                    if let Some(v) = m.schema.as_ref().filter(|v| !v.is_null()) {
                        sites.push((Site::step(&s.id, "model.schema"), v));
                        if m.format != OutputFormat::Json {
                            self.errors.push(ValidationError::SchemaNeedsJsonFormat {
                                step: s.id.clone(),
                            });
                        }
                    }
                }
                _ => {}
            }
        }
        for (site, v) in sites {
            if let Err(message) = resolver.schema(v) {
                self.errors
                    .push(ValidationError::InvalidSchema { site, message });
            }
        }
        // A fallback answer is taken as a judge's: it must be one.
        for s in &d.steps {
            if let StepKind::Judgment(j) = &s.kind
                && let Some(JudgmentFallback::Answer(answer)) = &j.on_timeout
                && let Ok(validator) = resolver.schema(&j.result_schema)
            {
                // The answer is taken as it is, never rendered: every
                // violation counts.
                let violations: Vec<SchemaViolation> = validator
                    .iter_errors(answer)
                    .map(|e| SchemaViolation {
                        at: e.instance_path().as_str().to_owned(),
                        rule: e.kind().keyword().to_owned(),
                        message: e.to_string(),
                    })
                    .collect();
                if !violations.is_empty() {
                    self.errors
                        .push(ValidationError::FallbackAnswerViolatesSchema {
                            step: s.id.clone(),
                            violations,
                        });
                }
            }
        }
    }

    /// The workflow's rubric, then each step's: the same checks, the step
    /// named in the errors of a step's.
    fn rubrics(&mut self) {
        let d = self.def;
        self.rubric(None, &d.rubric);
        for s in &d.steps {
            self.rubric(Some(&s.id), &s.rubric);
        }
    }

    fn rubric(&mut self, step: Option<&StepId>, r: &RubricDef) {
        let mut seen: BTreeMap<&str, bool> = BTreeMap::new();
        for c in &r.criteria {
            if let Some(reported) = seen.get_mut(c.name.as_str()) {
                if !*reported {
                    self.errors.push(ValidationError::DuplicateCriterion {
                        step: step.cloned(),
                        name: c.name.clone(),
                    });
                    *reported = true;
                }
            } else {
                seen.insert(&c.name, false);
            }
            if !c.weight.is_finite() || c.weight <= 0.0 {
                self.errors.push(ValidationError::InvalidWeight {
                    step: step.cloned(),
                    criterion: c.name.clone(),
                    weight: c.weight,
                });
            }
        }
        if let Some(t) = r.threshold
            && !(0.0..=1.0).contains(&t)
        {
            self.errors.push(ValidationError::InvalidThreshold {
                step: step.cloned(),
                threshold: t,
            });
        }
    }

    /// Resolves every tool and verifier; checks static arguments and
    /// configurations against their schemas; notes every use that may not
    /// run in shadow evaluation.
    #[allow(clippy::type_complexity)]
    fn registries(
        &mut self,
        resolver: &mut Resolver<'_>,
    ) -> (
        BTreeMap<ToolRef, ToolInfo>,
        BTreeMap<ToolRef, ToolInfo>,
        Vec<IneligibleStep>,
    ) {
        let d = self.def;
        let mut tools: HashMap<&ToolRef, Arc<ToolInfo>> = HashMap::new();
        let mut found = Found::default();
        for s in &d.steps {
            let mut step_tools: Vec<&ToolRef> = Vec::new();
            if let StepKind::Tool(t) = &s.kind {
                step_tools.push(&t.tool);
            }
            step_tools.extend(s.tools.0.iter());
            for (k, r) in step_tools.into_iter().enumerate() {
                match resolver.tool(r) {
                    Err(u) => self.errors.push(unresolved_tool(&s.id, r, u)),
                    Ok(info) => {
                        if k == 0
                            && matches!(s.kind, StepKind::Tool(_))
                            && let (Some(t), Some(max)) = (s.timeout, info.max_timeout_ms)
                            && t.0 > max
                        {
                            self.errors.push(ValidationError::TimeoutAbovePolicy {
                                step: s.id.clone(),
                                tool: r.to_string(),
                                timeout_ms: t.0,
                                max_ms: max,
                            });
                        }
                        if k == 0
                            && let StepKind::Tool(t) = &s.kind
                        {
                            self.check_value_against(
                                resolver,
                                &info,
                                &t.args.0,
                                &mut found.bad_schema_reported,
                                |violations| ValidationError::ArgsViolateSchema {
                                    step: s.id.clone(),
                                    tool: r.to_string(),
                                    violations,
                                },
                            );
                        }
                        found.note(resolver, &info, d, Some(&s.id), None, r);
                        tools.entry(r).or_insert(info);
                    }
                }
            }
            for v in &s.verify {
                let site = || Site::step(&s.id, "verify");
                self.verifier_use(
                    resolver,
                    &mut found,
                    Some(&s.id),
                    None,
                    &v.verifier,
                    &v.config,
                    site,
                );
            }
            for c in &s.rubric.criteria {
                let site = || Site::step(&s.id, format!("rubric.criteria.{}", c.name));
                self.verifier_use(
                    resolver,
                    &mut found,
                    Some(&s.id),
                    Some(&c.name),
                    &c.verifier,
                    &c.config,
                    site,
                );
            }
        }
        for c in &d.rubric.criteria {
            let site = || Site::workflow(format!("rubric.criteria.{}", c.name));
            self.verifier_use(
                resolver,
                &mut found,
                None,
                Some(&c.name),
                &c.verifier,
                &c.config,
                site,
            );
        }
        let own = |m: HashMap<&ToolRef, Arc<ToolInfo>>| -> BTreeMap<ToolRef, ToolInfo> {
            m.into_iter()
                .map(|(r, i)| (r.clone(), Arc::unwrap_or_clone(i)))
                .collect()
        };
        (own(tools), own(found.verifiers), found.ineligible)
    }

    /// One use of a verifier — in a step's `verify` (no criterion), a
    /// step's rubric, or the workflow's rubric (no step): resolved, its
    /// configuration checked against the verifier's schema, its shadow
    /// eligibility noted. `site` names the use in errors.
    #[allow(clippy::too_many_arguments)]
    fn verifier_use(
        &mut self,
        resolver: &mut Resolver<'_>,
        found: &mut Found<'a>,
        step: Option<&StepId>,
        criterion: Option<&str>,
        verifier: &'a ToolRef,
        config: &Value,
        site: impl Fn() -> Site,
    ) {
        match resolver.verifier(verifier) {
            Err(u) => self.errors.push(unresolved_verifier(site(), verifier, u)),
            Ok(info) => {
                if !config.is_null() {
                    self.check_value_against(
                        resolver,
                        &info,
                        config,
                        &mut found.bad_schema_reported,
                        |violations| ValidationError::ConfigViolatesSchema {
                            site: site(),
                            verifier: verifier.to_string(),
                            violations,
                        },
                    );
                }
                found.note(resolver, &info, self.def, step, criterion, verifier);
                found.verifiers.entry(verifier).or_insert(info);
            }
        }
    }

    fn check_value_against(
        &mut self,
        resolver: &mut Resolver<'_>,
        info: &ToolInfo,
        value: &Value,
        bad_schema_reported: &mut Vec<String>,
        make: impl FnOnce(Vec<SchemaViolation>) -> ValidationError,
    ) {
        match resolver.input_schema(info) {
            None => {}
            Some(Err(message)) => {
                let tool = format!("{}@{}", info.name, info.version);
                if !bad_schema_reported.contains(&tool) {
                    self.errors.push(ValidationError::ToolSchemaInvalid {
                        tool: tool.clone(),
                        message,
                    });
                    bad_schema_reported.push(tool);
                }
            }
            Some(Ok(validator)) => {
                let violations = resolve::static_violations(&validator, value);
                if !violations.is_empty() {
                    self.errors.push(make(violations));
                }
            }
        }
    }

    fn sub_workflows(
        &mut self,
        children: &HashMap<usize, ChildOutcome>,
    ) -> BTreeMap<StepId, Arc<Validated>> {
        let mut out = BTreeMap::new();
        for (i, s) in self.def.steps.iter().enumerate() {
            let StepKind::SubWorkflow(sw) = &s.kind else {
                continue;
            };
            match children.get(&i) {
                Some(ChildOutcome::Valid(v)) => {
                    out.insert(s.id.clone(), Arc::clone(v));
                }
                Some(ChildOutcome::Invalid(version, errors)) => {
                    self.errors.push(ValidationError::SubWorkflowInvalid {
                        step: s.id.clone(),
                        workflow: sw.id.clone(),
                        version: version.unwrap_or(WorkflowVersion([0; 32])),
                        errors: errors.clone(),
                    });
                }
                // Unresolved, cyclic or too deep: reported by the walk.
                Some(ChildOutcome::Skipped) | None => {}
            }
        }
        out
    }

    fn eligibility(
        &self,
        own: Vec<IneligibleStep>,
        subs: &BTreeMap<StepId, Arc<Validated>>,
    ) -> EligibilityReport {
        let mut ineligible = own;
        for (step, child) in subs {
            for x in &child.eligibility.ineligible {
                let mut x = x.clone();
                x.via.insert(0, step.clone());
                ineligible.push(x);
            }
        }
        ineligible.sort();
        ineligible.dedup();
        EligibilityReport {
            workflow: self.def.id.clone(),
            ineligible,
        }
    }
}

/// What [`Checker::registries`] gathers besides errors.
#[derive(Default)]
struct Found<'a> {
    verifiers: HashMap<&'a ToolRef, Arc<ToolInfo>>,
    ineligible: Vec<IneligibleStep>,
    /// Tools whose registered schema was reported invalid (once each).
    bad_schema_reported: Vec<String>,
}

impl Found<'_> {
    /// Notes a use of `info` that may not run in shadow evaluation.
    fn note(
        &mut self,
        resolver: &mut Resolver<'_>,
        info: &ToolInfo,
        def: &WorkflowDef,
        step: Option<&StepId>,
        criterion: Option<&str>,
        r: &ToolRef,
    ) {
        if let Err(reasons) = resolver.eligibility(info) {
            self.ineligible.push(IneligibleStep {
                via: Vec::new(),
                workflow: def.id.clone(),
                step: step.cloned(),
                criterion: criterion.map(str::to_owned),
                tool: r.to_string(),
                reasons,
            });
        }
    }
}

fn unresolved_tool(step: &StepId, r: &ToolRef, u: Unresolved) -> ValidationError {
    if let Some(reason) = u.withheld {
        return ValidationError::WithheldTool {
            step: step.clone(),
            tool: r.to_string(),
            reason,
        };
    }
    ValidationError::UnresolvedTool {
        step: step.clone(),
        tool: r.to_string(),
        name: u.name,
        requested: u.requested,
        registry: u.registry,
        nearest: u.nearest,
        available_versions: u.available_versions,
    }
}

fn unresolved_verifier(site: Site, r: &ToolRef, u: Unresolved) -> ValidationError {
    ValidationError::UnresolvedVerifier {
        site,
        verifier: r.to_string(),
        name: u.name,
        requested: u.requested,
        registry: u.registry,
        nearest: u.nearest,
        available_versions: u.available_versions,
    }
}
