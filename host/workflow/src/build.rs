//! Constructors for building a workflow in Rust, without a document.
//!
//! Each constructor yields exactly the IR the YAML/JSON front end would
//! produce for the same workflow written out, with every optional field at
//! its default; chained `with_*` methods set the rest. Nothing here
//! validates: a built workflow goes through [`crate::validate`] like a
//! parsed one.
//!
//! ```
//! use poimen_workflow::*;
//! use serde_json::json;
//!
//! let wf = WorkflowDef::new("support.triage")
//!     .with_inputs(json!({"type": "object", "required": ["ticket"]}))
//!     .with_step(StepDef::model("classify", "Classify: {{ inputs.ticket }}"))
//!     .with_step(
//!         StepDef::tool("shout", ToolRef::any("text"), json!({"op": "upper", "text": "{{ steps.classify.output }}"}))
//!             .with_timeout(Millis::secs(5)),
//!     )
//!     .with_edge("classify", "shout");
//! assert_eq!(wf.topo_order().len(), 2);
//! ```

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use serde_json::Value;

use crate::ir::*;

impl WorkflowDef {
    /// An empty workflow named `id`: no steps, every field at its default.
    pub fn new(id: impl Into<WorkflowId>) -> Self {
        WorkflowDef {
            id: id.into(),
            schema: CURRENT_SCHEMA,
            description: None,
            inputs: None,
            outputs: None,
            output: None,
            priority: Priority::Normal,
            concurrency: Concurrency::default(),
            key: None,
            durable: None,
            unload: Unload::default(),
            state: BTreeMap::new(),
            limits: Limits::default(),
            tool: None,
            shadow_evaluable: false,
            steps: Vec::new(),
            transitions: Vec::new(),
            rubric: RubricDef::default(),
            budget: BudgetDef::default(),
        }
    }

    /// Adds a step.
    pub fn with_step(mut self, step: StepDef) -> Self {
        self.steps.push(step);
        self
    }

    /// Adds a transition as given.
    pub fn with_transition(mut self, t: Transition) -> Self {
        self.transitions.push(t);
        self
    }

    /// Adds a forward dependency edge `from -> to`.
    pub fn with_edge(self, from: impl Into<StepId>, to: impl Into<StepId>) -> Self {
        self.with_transition(Transition::forward(from, to))
    }

    /// Adds a bounded back-edge `from -> to`: after `from`, run the steps from
    /// `to` through `from` again, at most `max_iterations` extra times, while
    /// `when` holds (always, when `None`).
    pub fn with_loop(
        self,
        from: impl Into<StepId>,
        to: impl Into<StepId>,
        max_iterations: NonZeroU32,
        when: Option<&str>,
    ) -> Self {
        let mut t = Transition::back(from, to, max_iterations);
        t.when = when.map(Predicate::from);
        self.with_transition(t)
    }

    pub fn with_description(mut self, d: impl Into<String>) -> Self {
        self.description = Some(d.into());
        self
    }

    /// JSON Schema of the run input.
    pub fn with_inputs(mut self, schema: Value) -> Self {
        self.inputs = Some(schema);
        self
    }

    /// JSON Schema of the run output.
    pub fn with_outputs(mut self, schema: Value) -> Self {
        self.outputs = Some(schema);
        self
    }

    /// How the run output is built (JSON whose strings are templates).
    pub fn with_output(mut self, output: Value) -> Self {
        self.output = Some(ArgTemplate(output));
        self
    }

    pub fn with_priority(mut self, p: Priority) -> Self {
        self.priority = p;
        self
    }

    pub fn with_concurrency(mut self, c: Concurrency) -> Self {
        self.concurrency = c;
        self
    }

    /// Template of the logical thing a run is about.
    pub fn with_key(mut self, key: impl Into<Template>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// `Some(false)`: runs in memory only; `Some(true)`: durable whatever
    /// the host's default.
    pub fn with_durable(mut self, durable: bool) -> Self {
        self.durable = Some(durable);
        self
    }

    pub fn with_unload(mut self, unload: Unload) -> Self {
        self.unload = unload;
        self
    }

    /// Declares a state key.
    pub fn with_state(mut self, key: impl Into<StateKey>, decl: StateDecl) -> Self {
        self.state.insert(key.into(), decl);
        self
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Exposes the workflow as a tool.
    pub fn with_tool(mut self, tool: WorkflowTool) -> Self {
        self.tool = Some(tool);
        self
    }

    pub fn with_shadow_evaluable(mut self, yes: bool) -> Self {
        self.shadow_evaluable = yes;
        self
    }

    pub fn with_rubric(mut self, rubric: RubricDef) -> Self {
        self.rubric = rubric;
        self
    }

    pub fn with_budget(mut self, budget: BudgetDef) -> Self {
        self.budget = budget;
        self
    }
}

impl Transition {
    /// A forward dependency edge.
    pub fn forward(from: impl Into<StepId>, to: impl Into<StepId>) -> Self {
        Transition {
            from: from.into(),
            to: to.into(),
            max_iterations: None,
            when: None,
        }
    }

    /// A bounded back-edge without a predicate.
    pub fn back(
        from: impl Into<StepId>,
        to: impl Into<StepId>,
        max_iterations: NonZeroU32,
    ) -> Self {
        Transition {
            from: from.into(),
            to: to.into(),
            max_iterations: Some(max_iterations),
            when: None,
        }
    }
}

impl StepDef {
    /// A step of any kind with every common field at its default.
    pub fn new(id: impl Into<StepId>, kind: impl Into<StepKind>) -> Self {
        StepDef {
            id: id.into(),
            kind: kind.into(),
            tools: ToolSelector::default(),
            verify: Vec::new(),
            rubric: RubricDef::default(),
            retry: RetryPolicy::default(),
            timeout: None,
            writes: None,
        }
    }

    /// A model step with this prompt.
    pub fn model(id: impl Into<StepId>, prompt: impl Into<PromptTemplate>) -> Self {
        StepDef::new(id, ModelStep::new(prompt))
    }

    /// A tool step.
    pub fn tool(id: impl Into<StepId>, tool: ToolRef, args: Value) -> Self {
        StepDef::new(
            id,
            ToolStep {
                tool,
                args: ArgTemplate(args),
            },
        )
    }

    /// A parallel step owning `branches`, joined with [`JoinPolicy::All`].
    pub fn parallel<I, S>(id: impl Into<StepId>, branches: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<StepId>,
    {
        StepDef::new(
            id,
            ParallelStep {
                branches: branches.into_iter().map(Into::into).collect(),
                join: JoinPolicy::All,
            },
        )
    }

    /// A conditional step running `then` when `on` holds (and nothing otherwise).
    pub fn conditional(
        id: impl Into<StepId>,
        on: impl Into<Predicate>,
        then: impl Into<StepId>,
    ) -> Self {
        StepDef::new(
            id,
            ConditionalStep {
                on: on.into(),
                then: then.into(),
                otherwise: None,
            },
        )
    }

    /// A sub-workflow step running the latest version of `workflow` with no input.
    pub fn sub_workflow(id: impl Into<StepId>, workflow: impl Into<WorkflowId>) -> Self {
        StepDef::new(
            id,
            SubWorkflowStep {
                id: workflow.into(),
                version: VersionSelector::Latest,
                input: ArgTemplate::default(),
            },
        )
    }

    /// A judgment step asking `question`, whose answer must match `result_schema`.
    pub fn judgment(
        id: impl Into<StepId>,
        question: impl Into<PromptTemplate>,
        result_schema: Value,
    ) -> Self {
        StepDef::new(id, JudgmentStep::new(question, result_schema))
    }

    /// Adds a tool to the step's selector.
    pub fn with_tool(mut self, tool: ToolRef) -> Self {
        self.tools.0.push(tool);
        self
    }

    /// Adds a verifier run after every attempt.
    pub fn with_verifier(mut self, verifier: ToolRef, config: Value) -> Self {
        self.verify.push(VerifierRef { verifier, config });
        self
    }

    /// Sets the rubric every attempt's output must meet.
    pub fn with_rubric(mut self, rubric: RubricDef) -> Self {
        self.rubric = rubric;
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn with_timeout(mut self, timeout: Millis) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Writes the step's output to a declared state key.
    pub fn with_writes(mut self, key: impl Into<StateKey>) -> Self {
        self.writes = Some(key.into());
        self
    }

    /// Sets the `otherwise` target of a conditional step; other kinds are
    /// returned unchanged.
    pub fn with_otherwise(mut self, otherwise: impl Into<StepId>) -> Self {
        if let StepKind::Conditional(c) = &mut self.kind {
            c.otherwise = Some(otherwise.into());
        }
        self
    }

    /// Sets the join policy of a parallel step; other kinds are returned unchanged.
    pub fn with_join(mut self, join: JoinPolicy) -> Self {
        if let StepKind::Parallel(p) = &mut self.kind {
            p.join = join;
        }
        self
    }
}

impl ModelStep {
    /// A model step with this prompt and defaults elsewhere.
    pub fn new(prompt: impl Into<PromptTemplate>) -> Self {
        ModelStep {
            prompt: prompt.into(),
            system: None,
            effort: ReasoningEffort::Medium,
            format: OutputFormat::Text,
            schema: None,
            model: None,
        }
    }

    pub fn with_system(mut self, system: impl Into<PromptTemplate>) -> Self {
        self.system = Some(system.into());
        self
    }

    pub fn with_effort(mut self, effort: ReasoningEffort) -> Self {
        self.effort = effort;
        self
    }

    pub fn with_format(mut self, format: OutputFormat) -> Self {
        self.format = format;
        self
    }

    /// A JSON Schema the answer must satisfy (with `format: json`).
    pub fn with_schema(mut self, schema: Value) -> Self {
        self.schema = Some(schema);
        self
    }

    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }
}

impl SubWorkflowStep {
    /// The latest version of `workflow`, no input.
    pub fn new(workflow: impl Into<WorkflowId>) -> Self {
        SubWorkflowStep {
            id: workflow.into(),
            version: VersionSelector::Latest,
            input: ArgTemplate::default(),
        }
    }

    pub fn with_version(mut self, version: VersionSelector) -> Self {
        self.version = version;
        self
    }

    /// The child's input (JSON whose strings are templates).
    pub fn with_input(mut self, input: Value) -> Self {
        self.input = ArgTemplate(input);
        self
    }
}

impl JudgmentStep {
    /// A judgment with only its question and result schema.
    pub fn new(question: impl Into<PromptTemplate>, result_schema: Value) -> Self {
        JudgmentStep {
            question: question.into(),
            sources: Vec::new(),
            result_schema,
            executor: None,
            profile: None,
            constraints: Vec::new(),
            on_timeout: None,
        }
    }

    /// What happens when no answer comes within the step's timeout.
    pub fn with_on_timeout(mut self, fallback: JudgmentFallback) -> Self {
        self.on_timeout = Some(fallback);
        self
    }

    /// Adds a source template.
    pub fn with_source(mut self, source: impl Into<Template>) -> Self {
        self.sources.push(source.into());
        self
    }

    pub fn with_executor(mut self, executor: impl Into<String>) -> Self {
        self.executor = Some(executor.into());
        self
    }

    pub fn with_profile(mut self, profile: impl Into<String>) -> Self {
        self.profile = Some(profile.into());
        self
    }

    /// Adds a constraint stated to the judge.
    pub fn with_constraint(mut self, constraint: impl Into<String>) -> Self {
        self.constraints.push(constraint.into());
        self
    }
}

impl StateDecl {
    /// A state key with this reducer and no schema.
    pub fn reduced(reducer: Reducer) -> Self {
        StateDecl {
            schema: None,
            reducer: Some(reducer),
        }
    }

    pub fn with_schema(mut self, schema: Value) -> Self {
        self.schema = Some(schema);
        self
    }
}

impl RetryPolicy {
    /// `max_attempts` attempts in all, no backoff, every failure class retried.
    pub fn attempts(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        }
    }

    pub fn with_backoff(mut self, backoff: Millis) -> Self {
        self.backoff = backoff;
        self
    }
}

impl Criterion {
    /// A criterion of weight 1 without configuration.
    pub fn new(name: impl Into<String>, verifier: ToolRef) -> Self {
        Criterion {
            name: name.into(),
            verifier,
            config: Value::Null,
            weight: 1.0,
        }
    }

    pub fn with_config(mut self, config: Value) -> Self {
        self.config = config;
        self
    }

    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }
}

macro_rules! into_kind {
    ($($t:ident => $v:ident),*) => {$(
        impl From<$t> for StepKind {
            fn from(s: $t) -> StepKind {
                StepKind::$v(s)
            }
        }
    )*};
}

into_kind!(
    ModelStep => Model,
    ToolStep => Tool,
    ParallelStep => Parallel,
    ConditionalStep => Conditional,
    SubWorkflowStep => SubWorkflow,
    JudgmentStep => Judgment
);
