//! Rendering templates and evaluating predicates over recorded run state.
//!
//! The only inputs are the run's recorded state — `inputs`, declared
//! `state`, and `steps.<id>.output` — assembled by [`context`]. No clock, no
//! environment, no randomness is reachable from here, which is what keeps a
//! refolded run identical to the live one. Templates are minijinja with
//! strict undefined names; predicates are CEL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use minijinja::value::{Enumerator, Object, ObjectExt};
use minijinja::{Environment, UndefinedBehavior};
use serde_json::{Map, Value};

use crate::state::RunState;

/// Why a template or predicate could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("template `{template}` failed: {message}")]
    Template { template: String, message: String },
    #[error("predicate `{predicate}` failed: {message}")]
    Predicate { predicate: String, message: String },
}

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env
    })
}

/// How many distinct `{{ expression }}`s [`compiled`] keeps.
const MAX_COMPILED: usize = 4096;

/// The `{{ expression }}` `expr`, compiled once: a step's argument
/// templates are the same text at every step of every run of a version, and
/// compiling one costs more than evaluating it. Bounded: past
/// [`MAX_COMPILED`] distinct expressions the cache starts over, so a host
/// running many versions compiles again rather than growing without end.
fn compiled(expr: &str) -> Result<Arc<minijinja::Expression<'static, 'static>>, minijinja::Error> {
    type Cache = Mutex<HashMap<Box<str>, Arc<minijinja::Expression<'static, 'static>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let lock = || cache.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(e) = lock().get(expr) {
        return Ok(Arc::clone(e));
    }
    let e = Arc::new(env().compile_expression_owned(expr.to_owned())?);
    let mut c = lock();
    if c.len() >= MAX_COMPILED {
        c.clear();
    }
    c.insert(expr.into(), Arc::clone(&e));
    Ok(e)
}

fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        s.to_owned()
    } else {
        let mut end = MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

/// The predicate context of a run, as JSON: `{inputs, state, steps}`, where
/// `steps.<id>` has `output` (completed steps only) and `status`. CEL
/// takes its variables whole; templates read [`template_context`] instead,
/// which copies only what a template reads.
pub fn context(run: &RunState) -> Value {
    let mut steps = Map::new();
    for (id, s) in &run.steps {
        let mut entry = Map::new();
        if let Some(out) = &s.output {
            entry.insert("output".into(), out.clone());
        }
        entry.insert("status".into(), Value::from(s.status.as_str()));
        steps.insert(id.0.clone(), Value::Object(entry));
    }
    let mut ctx = Map::new();
    ctx.insert("inputs".into(), run.input.clone());
    ctx.insert(
        "state".into(),
        Value::Object(
            run.state
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
    );
    ctx.insert("steps".into(), Value::Object(steps));
    Value::Object(ctx)
}

/// The template context of a run: the same `{inputs, state, steps}` as
/// [`context`], read from the run's state on demand. Building it copies
/// nothing; a template that reads `steps.a.output` converts that one output,
/// so a step's rendering costs what its templates read, not the size of
/// the run.
pub fn template_context(run: &Arc<RunState>) -> minijinja::Value {
    minijinja::Value::from_object(RunView(Arc::clone(run)))
}

/// `{inputs, state, steps}` of a run.
#[derive(Debug)]
struct RunView(Arc<RunState>);

/// `steps`: each step by id.
#[derive(Debug)]
struct StepsView(Arc<RunState>);

/// `steps.<id>`: `output` (once completed) and `status`.
#[derive(Debug)]
struct StepView(Arc<RunState>, poimen_workflow::StepId);

/// `state`: the declared state keys.
#[derive(Debug)]
struct StateView(Arc<RunState>);

/// `inputs`, when the run's input is an object: its keys.
#[derive(Debug)]
struct InputsView(Arc<RunState>);

impl Object for RunView {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        Some(match key.as_str()? {
            // An object input is read a key at a time, as `state` is: a
            // template reading `inputs.n` does not convert a large input
            // beside it on every step.
            "inputs" if self.0.input.is_object() => {
                minijinja::Value::from_object(InputsView(Arc::clone(&self.0)))
            }
            "inputs" => from_json(&self.0.input),
            "state" => minijinja::Value::from_object(StateView(Arc::clone(&self.0))),
            "steps" => minijinja::Value::from_object(StepsView(Arc::clone(&self.0))),
            _ => return None,
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["inputs", "state", "steps"])
    }
}

impl Object for StepsView {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let (id, _) = self.0.steps.get_key_value(key.as_str()?)?;
        Some(minijinja::Value::from_object(StepView(
            Arc::clone(&self.0),
            id.clone(),
        )))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| {
            Box::new(
                this.0
                    .steps
                    .keys()
                    .map(|id| minijinja::Value::from(id.as_str())),
            )
        })
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.steps.len())
    }
}

impl Object for StepView {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let step = self.0.steps.get(&self.1)?;
        match key.as_str()? {
            "output" => step.output.as_ref().map(from_json),
            "status" => Some(minijinja::Value::from(step.status.as_str())),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let completed = self
            .0
            .steps
            .get(&self.1)
            .is_some_and(|s| s.output.is_some());
        if completed {
            Enumerator::Str(&["output", "status"])
        } else {
            Enumerator::Str(&["status"])
        }
    }
}

impl Object for StateView {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        self.0.state.get(key.as_str()?).map(from_json)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| {
            Box::new(
                this.0
                    .state
                    .keys()
                    .map(|k| minijinja::Value::from(k.as_str())),
            )
        })
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.state.len())
    }
}

impl Object for InputsView {
    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        self.0.input.get(key.as_str()?).map(from_json)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| match this.0.input.as_object() {
            Some(map) => Box::new(map.keys().map(|k| minijinja::Value::from(k.as_str()))),
            None => Box::new(std::iter::empty()),
        })
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        self.0.input.as_object().map(serde_json::Map::len)
    }
}

/// A JSON value as a template context (a start's `key` template reads
/// `{inputs}` only).
pub fn json_context(ctx: &Value) -> minijinja::Value {
    from_json(ctx)
}

fn from_json(v: &Value) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(v))
}

/// Renders a text template. Also returns the partition: the state paths the
/// template read, sorted.
pub fn render_text(
    template: &str,
    ctx: &minijinja::Value,
) -> Result<(String, Vec<String>), RenderError> {
    let err = |e: minijinja::Error| RenderError::Template {
        template: shorten(template),
        message: describe(&e),
    };
    let tmpl = env().template_from_str(template).map_err(err)?;
    let mut partition: Vec<String> = tmpl.undeclared_variables(true).into_iter().collect();
    partition.sort();
    let text = tmpl.render(ctx.clone()).map_err(err)?;
    Ok((text, partition))
}

fn describe(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// Renders argument JSON: every string leaf is a template. A string that is
/// exactly one `{{ expression }}` yields the expression's JSON value.
pub fn render_args(args: &Value, ctx: &minijinja::Value) -> Result<Value, RenderError> {
    match args {
        Value::String(s) => render_string_leaf(s, ctx),
        Value::Array(items) => items
            .iter()
            .map(|v| render_args(v, ctx))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| Ok((k.clone(), render_args(v, ctx)?)))
            .collect::<Result<Map<_, _>, _>>()
            .map(Value::Object),
        other => Ok(other.clone()),
    }
}

/// The expression inside a string that is exactly one `{{ … }}`.
pub fn sole_expression(s: &str) -> Option<&str> {
    let inner = s.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    if inner.contains("{{") || inner.contains("}}") || inner.contains("{%") {
        return None;
    }
    Some(
        inner
            .trim()
            .trim_start_matches('-')
            .trim_end_matches('-')
            .trim(),
    )
}

fn render_string_leaf(s: &str, ctx: &minijinja::Value) -> Result<Value, RenderError> {
    if !s.contains("{{") && !s.contains("{%") {
        return Ok(Value::String(s.to_owned()));
    }
    if let Some(expr) = sole_expression(s) {
        let err = |e: minijinja::Error| RenderError::Template {
            template: shorten(s),
            message: describe(&e),
        };
        let compiled = compiled(expr).map_err(err)?;
        let value = compiled.eval(ctx.clone()).map_err(err)?;
        if value.is_undefined() {
            return Err(RenderError::Template {
                template: shorten(s),
                message: "the expression is undefined".into(),
            });
        }
        return serde_json::to_value(&value).map_err(|e| RenderError::Template {
            template: shorten(s),
            message: format!("the value is not JSON: {e}"),
        });
    }
    render_text(s, ctx).map(|(text, _)| Value::String(text))
}

/// Evaluates a CEL predicate to a boolean.
pub fn eval_predicate(predicate: &str, ctx: &Value) -> Result<bool, RenderError> {
    let err = |message: String| RenderError::Predicate {
        predicate: shorten(predicate),
        message,
    };
    let program = cel::Program::compile(predicate).map_err(|e| err(e.to_string()))?;
    let mut context = cel::Context::default();
    if let Value::Object(vars) = ctx {
        for (name, value) in vars {
            let v = cel::to_value(value).map_err(|e| err(e.to_string()))?;
            context.add_variable_from_value(name.clone(), v);
        }
    }
    match program
        .execute(&context)
        .map_err(|e| err(execution_error(&e)))?
    {
        cel::Value::Bool(b) => Ok(b),
        other => Err(err(format!("it gave {}, not true or false", show(&other)))),
    }
}

/// A CEL evaluation error in words, the same on every evaluation: the
/// failure is recorded, and CEL's own messages show a map's entries in the
/// order of its hash map, which differs from one evaluation to the next.
#[allow(deprecated)] // matched so that they too are shown deterministically
fn execution_error(e: &cel::ExecutionError) -> String {
    use cel::ExecutionError as X;
    match e {
        X::UnsupportedTargetType { target } => format!("Invalid argument type: {}", show(target)),
        X::NotSupportedAsMethod { method, target } => {
            format!("Method '{method}' not supported on type '{}'", show(target))
        }
        X::UnsupportedKeyType(v) => format!("Unable to use value '{}' as a key", show(v)),
        X::ValuesNotComparable(a, b) => {
            format!("{} can not be compared to {}", show(a), show(b))
        }
        X::UnsupportedUnaryOperator(op, v) => {
            format!("Unsupported unary operator '{op}': {}", show(v))
        }
        X::UnsupportedBinaryOperator(op, a, b) => {
            format!(
                "Unsupported binary operator '{op}': {}, {}",
                show(a),
                show(b)
            )
        }
        X::UnsupportedMapIndex(v) => format!("Cannot use value as map index: {}", show(v)),
        X::UnsupportedListIndex(v) => format!("Cannot use value as list index: {}", show(v)),
        X::UnsupportedIndex(a, b) => format!("Cannot use value {} to index {}", show(a), show(b)),
        X::DivisionByZero(v) => format!("Division by zero of {}", show(v)),
        X::RemainderByZero(v) => format!("Remainder by zero of {}", show(v)),
        X::Overflow(op, a, b) => {
            format!(
                "Overflow from binary operator '{op}': {}, {}",
                show(a),
                show(b)
            )
        }
        X::IndexOutOfBounds(v) => format!("Index out of bounds: {}", show(v)),
        X::DuplicateKey(v) => format!("Failed with repeated key: {}", show(v)),
        other => other.to_string(),
    }
}

/// A CEL value as its `Debug` form shows it, but with a map's entries
/// sorted, so that it reads the same every time.
fn show(v: &cel::Value) -> String {
    use cel::Value as V;
    match v {
        V::List(items) => format!(
            "[{}]",
            items.iter().map(show).collect::<Vec<_>>().join(", ")
        ),
        V::Map(m) => {
            let mut entries: Vec<String> = m
                .map
                .iter()
                .map(|(k, v)| format!("{k:?}: {}", show(v)))
                .collect();
            entries.sort();
            format!("{{{}}}", entries.join(", "))
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json() -> Value {
        json!({"inputs": {"text": "hi", "n": 5}, "state": {"seen": [1]}, "steps": {"a": {"output": {"label": "spam"}, "status": "completed"}}})
    }

    #[test]
    fn an_expression_is_compiled_once_and_a_bad_one_every_time() {
        let a = compiled("inputs.cache_probe + 1").expect("compiles");
        let b = compiled("inputs.cache_probe + 1").expect("compiles");
        assert!(Arc::ptr_eq(&a, &b), "the second use is the cached one");
        // A syntax error is not cached: it is reported at every use.
        for _ in 0..2 {
            assert!(compiled("inputs.(").is_err());
        }
        let v = render_args(&json!("{{ inputs.n + 1 }}"), &ctx()).expect("renders");
        assert_eq!(v, json!(6));
        let v = render_args(&json!("{{ inputs.n + 1 }}"), &ctx()).expect("renders again");
        assert_eq!(v, json!(6));
    }

    fn ctx() -> minijinja::Value {
        json_context(&json())
    }

    #[test]
    fn text_and_partition() {
        let (text, partition) =
            render_text("{{ inputs.text }} / {{ steps.a.output.label }}", &ctx()).expect("renders");
        assert_eq!(text, "hi / spam");
        assert_eq!(
            partition,
            vec!["inputs.text".to_owned(), "steps.a.output.label".to_owned()]
        );
    }

    #[test]
    fn strict_undefined_is_an_error() {
        let e = render_text("{{ inputs.missing }}", &ctx()).expect_err("undefined");
        assert!(matches!(e, RenderError::Template { .. }));
        let e =
            render_args(&json!({"x": "{{ steps.zzz.output }}"}), &ctx()).expect_err("undefined");
        assert!(matches!(e, RenderError::Template { .. }));
    }

    #[test]
    fn sole_expression_keeps_json_type() {
        let out = render_args(
            &json!({"n": "{{ inputs.n }}", "o": "{{ steps.a.output }}", "s": "n={{ inputs.n }}", "k": 1}),
            &ctx(),
        )
        .expect("renders");
        assert_eq!(
            out,
            json!({"n": 5, "o": {"label": "spam"}, "s": "n=5", "k": 1})
        );
    }

    /// The run's state behind `json()`, for the lazy context.
    fn run_state() -> Arc<RunState> {
        use crate::episode::StepStatus;
        use crate::state::StepState;
        let mut run = RunState {
            input: json!({"text": "hi", "n": 5}),
            ..RunState::default()
        };
        run.state.insert("seen".into(), json!([1]));
        run.steps.insert(
            "a".into(),
            StepState {
                status: StepStatus::Completed,
                output: Some(json!({"label": "spam"})),
                ..StepState::default()
            },
        );
        run.steps.insert("b".into(), StepState::default());
        Arc::new(run)
    }

    /// The lazy context renders exactly as the JSON one: values, whole
    /// objects, iteration, and strict undefined names.
    #[test]
    fn the_template_context_reads_as_the_json_one() {
        let lazy = template_context(&run_state());
        let mut whole = json();
        whole["steps"]["b"] = json!({"status": "pending"});
        let eager = json_context(&whole);
        for t in [
            "{{ inputs.text }} {{ inputs.n + 1 }} {{ state.seen[0] }}",
            "{{ steps.a.output.label }} {{ steps.a.status }} {{ steps.b.status }}",
            "{% for k in steps %}{{ k }},{% endfor %} {{ steps|length }} {{ state|length }}",
            "{% for k, v in steps|items %}{{ k }}={{ v.status }};{% endfor %}",
            "{{ steps.b.output is defined }} {{ 'a' in steps }} {{ 'zz' in steps }}",
            "{% for k in inputs %}{{ k }},{% endfor %} {{ inputs|length }} {{ inputs }}",
            "{{ 'n' in inputs }} {{ 'zz' in inputs }} {{ inputs.zz is defined }}",
        ] {
            assert_eq!(
                render_text(t, &lazy).expect(t),
                render_text(t, &eager).expect(t),
                "{t}"
            );
        }
        let args = json!({"o": "{{ steps.a }}", "i": "{{ inputs }}", "s": "{{ state }}"});
        assert_eq!(
            render_args(&args, &lazy).expect("renders"),
            render_args(&args, &eager).expect("renders")
        );
        for t in [
            "{{ steps.b.output }}",
            "{{ steps.zzz.output }}",
            "{{ inputs.zz }}",
            "{{ nope }}",
        ] {
            assert!(render_text(t, &lazy).is_err(), "{t}");
            assert!(render_text(t, &eager).is_err(), "{t}");
        }
    }

    #[test]
    fn predicates() {
        assert!(eval_predicate("steps.a.output.label == 'spam'", &json()).expect("evaluates"));
        assert!(eval_predicate("inputs.n > 3", &json()).expect("evaluates"));
        assert!(!eval_predicate("size(state.seen) > 1", &json()).expect("evaluates"));
        assert!(matches!(
            eval_predicate("inputs.n", &json()),
            Err(RenderError::Predicate { .. })
        ));
        assert!(matches!(
            eval_predicate("now() > 1", &json()),
            Err(RenderError::Predicate { .. })
        ));
    }
}
