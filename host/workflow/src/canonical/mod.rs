//! The canonical form of a workflow and its [`WorkflowVersion`].
//!
//! `canonical_bytes` turns the IR into one byte string that depends only on
//! the workflow's *meaning*; `version_of` is the Blake3 hash of those bytes.
//! The encoding is specified precisely enough in `docs/workflow-format.md`
//! ("Canonical form") for a third party to recompute a version by hand:
//!
//! 1. The canonical form is a JSON document of the same shape as the JSON
//!    front end accepts (so `from_canonical` reads it back through the
//!    ordinary front end).
//! 2. Every field whose value equals its default is **omitted**; `schema`,
//!    `id`, `steps`, and each kind's required fields are always present.
//! 3. Every unordered collection is **sorted by a defined key**, ties broken
//!    by comparing the elements' canonical bytes; pure value sets (`tools`,
//!    `retry.on`) are also deduplicated. Ordered collections keep their order.
//! 4. The bytes are RFC 8785 (JSON Canonicalization Scheme): members sorted
//!    by UTF-16 code units, no whitespace, ECMAScript number and string
//!    forms.
//!
//! This module does no IO; it does not know where versions are stored.

pub(crate) mod jcs;

use serde_json::Value;

use crate::frontend::{self, Format, ParseError};
use crate::ir::*;
use crate::version::WorkflowVersion;
use jcs::{Obj, cmp_utf16, write_set, write_str};

// ─────────────────────────────────────────────────────────────────────────
// WHAT IS *NOT* CANONICALIZED — read before "improving" this module.
//
// * Prompt template text is semantic and hashes exactly as written. A model
//   sees every byte of a prompt: a changed space, a trailing newline, a
//   different quote, re-wrapped lines — each is a behaviour change, so each
//   is a new version. No whitespace normalization, no Unicode normalization,
//   no trimming, no line-ending conversion. The same holds for every
//   template (system prompts, argument strings, keys, judgment questions
//   and sources) and every predicate: templates are never
//   whitespace-normalized, because deciding which whitespace a template
//   engine and a model ignore is not something a hash function can know.
//
// * Free-text descriptions (`description`, `tool.description`) ARE meaning
//   and are hashed as written. Agents read workflow and tool descriptions to
//   decide what to call and how, and a version record must hold the
//   complete definition — a description changed without a new version
//   would silently change what every result attributed to that version was
//   produced under. Comments in a YAML file, by contrast, are not part of
//   the definition and never reach the IR.
//
// * Order is kept where order is meaning: Parallel `branches` (the order
//   writes are applied at the join), judgment `sources` and `constraints`
//   (the order the judge sees them), and every JSON array inside arguments,
//   schemas and configurations (JSON arrays are ordered; even where a JSON
//   Schema treats one as a set, e.g. `required`, we do not guess).
//
// * Numbers are IEEE-754 doubles, written as ECMAScript prints them (RFC 8785
//   §3.2.2.3): `1`, `1.0` and `1e0` are the same number and hash the same;
//   a rubric weight of `0.1` is the double nearest 0.1 however it was
//   written. Integers are exact up to 2^53; the front end rejects integer
//   literals beyond ±(2^53 − 1) and the validator rejects IR integers above
//   it, so no two distinct accepted integers share a canonical form.
//   Non-finite floats (only constructible in Rust) are written as `null`
//   and rejected by the validator.
// ─────────────────────────────────────────────────────────────────────────

/// The canonical bytes of a workflow: the input of its version hash.
pub fn canonical_bytes(def: &WorkflowDef) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + def.steps.len() * 160);
    write_def(&mut out, def, &Names::of(def));
    out
}

/// The text of the tool and verifier references in a workflow, formatted
/// once: a workflow names the same few tools many times, and formatting a
/// semver range is slower than finding it again.
struct Names<'a>(Vec<(&'a ToolRef, String)>);

/// Distinct references remembered; any beyond are formatted where used.
const MAX_NAMES: usize = 64;

impl<'a> Names<'a> {
    fn of(def: &'a WorkflowDef) -> Self {
        let mut names = Names(Vec::new());
        let mut add = |r: &'a ToolRef| {
            if names.find(r).is_none() && names.0.len() < MAX_NAMES {
                names.0.push((r, r.to_string()));
            }
        };
        for s in &def.steps {
            if let StepKind::Tool(t) = &s.kind {
                add(&t.tool);
            }
            s.tools.0.iter().for_each(&mut add);
            s.verify.iter().for_each(|v| add(&v.verifier));
            s.rubric.criteria.iter().for_each(|c| add(&c.verifier));
        }
        def.rubric.criteria.iter().for_each(|c| add(&c.verifier));
        names
    }

    fn find(&self, r: &ToolRef) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| std::ptr::eq(*k, r) || *k == r)
            .map(|(_, s)| s.as_str())
    }

    fn get(&self, r: &ToolRef) -> std::borrow::Cow<'_, str> {
        match self.find(r) {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(r.to_string()),
        }
    }
}

/// The version of a workflow: Blake3 of its canonical bytes.
pub fn version_of(def: &WorkflowDef) -> WorkflowVersion {
    WorkflowVersion::of_canonical_bytes(&canonical_bytes(def))
}

/// The workflow in canonical form as an IR: collections sorted, defaults
/// normalized (an explicit default becomes absent). Has the same version.
pub fn canonicalize(def: &WorkflowDef) -> WorkflowDef {
    let bytes = canonical_bytes(def);
    match read_canonical_json(&bytes) {
        Ok(d) => d,
        // Canonical bytes always parse: they are a subset of the JSON format.
        // Should that ever break, the input is still the same workflow.
        Err(_) => def.clone(),
    }
}

/// Why bytes read back as a stored version are not one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FromCanonicalError {
    /// The bytes are not a workflow document at all.
    #[error("stored canonical form does not parse: {0}")]
    Parse(Box<ParseError>),
    /// The bytes are a workflow, but not in canonical form: re-encoding them
    /// gives other bytes (and so another version).
    #[error(
        "stored bytes are a workflow but not its canonical form: they hash to {found}, their canonical form to {canonical}"
    )]
    NotCanonical {
        found: WorkflowVersion,
        canonical: WorkflowVersion,
    },
}

/// Reads back a stored canonical form, checking that it *is* canonical
/// (re-encoding gives the same bytes), so the IR returned has exactly the
/// version the bytes hash to.
pub fn from_canonical(bytes: &[u8]) -> Result<WorkflowDef, FromCanonicalError> {
    let def = read_canonical_json(bytes).map_err(|e| FromCanonicalError::Parse(Box::new(e)))?;
    let again = canonical_bytes(&def);
    if again != bytes {
        return Err(FromCanonicalError::NotCanonical {
            found: WorkflowVersion::of_canonical_bytes(bytes),
            canonical: WorkflowVersion::of_canonical_bytes(&again),
        });
    }
    Ok(def)
}

#[allow(clippy::result_large_err)] // as `frontend::parse`
fn read_canonical_json(bytes: &[u8]) -> Result<WorkflowDef, ParseError> {
    frontend::parse(bytes, Format::Json, "<canonical form>")
}

// ─── the encoder ─────────────────────────────────────────────────────────
//
// Every function destructures its type without `..`: adding a field to the
// IR fails to compile here until the field is given a canonical rule.
// Members are added in JCS order, which lets `Obj` write them straight
// through; any other order would give the same bytes, more slowly.

fn opt_value(v: &Option<Value>) -> Option<&Value> {
    // `null` is how JSON writes "absent"; the front end reads it as `None`.
    v.as_ref().filter(|v| !v.is_null())
}

fn write_def(out: &mut Vec<u8>, def: &WorkflowDef, names: &Names<'_>) {
    let WorkflowDef {
        id,
        schema,
        description,
        inputs,
        outputs,
        output,
        priority,
        concurrency,
        key,
        durable,
        unload,
        state,
        limits,
        tool,
        shadow_evaluable,
        steps,
        transitions,
        rubric,
        budget,
    } = def;
    let mut o = Obj::begin(out);
    o.object_unless_empty("budget", |out| write_budget(out, budget));
    o.object_unless_empty("concurrency", |out| write_concurrency(out, concurrency));
    if let Some(d) = description {
        o.str("description", d);
    }
    // Absent and `true` differ in meaning: absent takes the host's
    // default, `true` overrides an ephemeral one.
    if let Some(d) = durable {
        o.bool("durable", *d);
    }
    o.str("id", id.as_str());
    if let Some(v) = opt_value(inputs) {
        o.value("inputs", v);
    }
    if let Some(Template(k)) = key {
        o.str("key", k);
    }
    o.object_unless_empty("limits", |out| write_limits(out, limits));
    if let Some(ArgTemplate(v)) = output
        && !v.is_null()
    {
        o.value("output", v);
    }
    if let Some(v) = opt_value(outputs) {
        o.value("outputs", v);
    }
    if *priority != Priority::Normal {
        o.str("priority", priority_name(*priority));
    }
    o.object_unless_empty("rubric", |out| write_rubric(out, rubric, names));
    o.u64("schema", u64::from(schema.0));
    if *shadow_evaluable {
        o.bool("shadow_evaluable", true);
    }
    if !state.is_empty() {
        o.field("state", |out| {
            let mut m = Obj::begin(out);
            for (k, decl) in state {
                m.field(k.as_str(), |out| write_state_decl(out, decl));
            }
            m.finish();
        });
    }
    o.field("steps", |out| write_steps(out, steps, names));
    if let Some(t) = tool {
        o.field("tool", |out| {
            let WorkflowTool { name, description } = t;
            let mut m = Obj::begin(out);
            if let Some(d) = description {
                m.str("description", d);
            }
            if let Some(n) = name {
                m.str("name", n);
            }
            m.finish();
        });
    }
    if !transitions.is_empty() {
        o.field("transitions", |out| {
            write_set(
                out,
                transitions,
                |a, b| {
                    cmp_utf16(a.from.as_str(), b.from.as_str())
                        .then_with(|| cmp_utf16(a.to.as_str(), b.to.as_str()))
                },
                false,
                write_transition,
            )
        });
    }
    o.object_unless_empty("unload", |out| write_unload(out, unload));
    o.finish();
}

fn write_unload(out: &mut Vec<u8>, u: &Unload) {
    let Unload { policy, timeout } = u;
    let mut o = Obj::begin(out);
    let name = match policy {
        UnloadPolicy::Drain => None,
        UnloadPolicy::Cancel => Some("cancel"),
        UnloadPolicy::Detach => Some("detach"),
    };
    if let Some(n) = name {
        o.str("policy", n);
    }
    if let Some(Millis(t)) = timeout {
        o.u64("timeout", *t);
    }
    o.finish();
}

/// The steps, sorted by id (see [`write_set`]). Large workflows sort on a
/// copy of each id's first eight bytes first, so most comparisons need not
/// reach the steps themselves (which is where the time goes once a workflow
/// no longer fits in cache); the order is exactly `cmp_utf16` of the ids.
fn write_steps(out: &mut Vec<u8>, steps: &[StepDef], names: &Names<'_>) {
    let all_ascii = steps.iter().all(|s| s.id.as_str().is_ascii());
    if !all_ascii || steps.len() < 64 {
        return write_set(
            out,
            steps,
            |a, b| cmp_utf16(a.id.as_str(), b.id.as_str()),
            false,
            |out, s| write_step(out, s, names),
        );
    }
    // For ASCII ids, UTF-16 order is byte order; a big-endian prefix
    // compares like the first eight bytes.
    let prefix = |id: &str| {
        let mut b = [0u8; 8];
        let n = id.len().min(8);
        b[..n].copy_from_slice(&id.as_bytes()[..n]);
        u64::from_be_bytes(b)
    };
    let mut keyed: Vec<(u64, &StepDef)> =
        steps.iter().map(|s| (prefix(s.id.as_str()), s)).collect();
    keyed.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.id.as_str().cmp(b.1.id.as_str()))
    });
    let sorted: Vec<&StepDef> = keyed.into_iter().map(|(_, s)| s).collect();
    write_set(
        out,
        &sorted,
        |a, b| a.id.as_str().cmp(b.id.as_str()),
        false,
        |out, s| write_step(out, s, names),
    );
}

fn write_fallback(out: &mut Vec<u8>, f: &JudgmentFallback) {
    match f {
        JudgmentFallback::Fail => write_str(out, "fail"),
        JudgmentFallback::Answer(v) => {
            let mut o = Obj::begin(out);
            o.value("answer", v);
            o.finish();
        }
        JudgmentFallback::Escalate { executor, profile } => {
            let mut o = Obj::begin(out);
            o.field("escalate", |out| {
                let mut e = Obj::begin(out);
                if let Some(x) = executor {
                    e.str("executor", x);
                }
                if let Some(p) = profile {
                    e.str("profile", p);
                }
                e.finish();
            });
            o.finish();
        }
    }
}

fn priority_name(p: Priority) -> &'static str {
    match p {
        Priority::Low => "low",
        Priority::Normal => "normal",
        Priority::High => "high",
    }
}

fn write_concurrency(out: &mut Vec<u8>, c: &Concurrency) {
    let Concurrency {
        max_runs,
        scope,
        on_overflow,
    } = c;
    let mut o = Obj::begin(out);
    if let Some(n) = max_runs {
        o.u64("max_runs", u64::from(*n));
    }
    match on_overflow {
        Overflow::Queue => {}
        Overflow::Drop => o.str("on_overflow", "drop"),
        Overflow::Replace => o.str("on_overflow", "replace"),
    }
    match scope {
        ConcurrencyScope::Workflow => {}
        ConcurrencyScope::Key => o.str("scope", "key"),
    }
    o.finish();
}

fn write_state_decl(out: &mut Vec<u8>, d: &StateDecl) {
    let StateDecl { schema, reducer } = d;
    let mut o = Obj::begin(out);
    if let Some(r) = reducer {
        o.str(
            "reducer",
            match r {
                Reducer::Overwrite => "overwrite",
                Reducer::Append => "append",
                Reducer::Merge => "merge",
                Reducer::Union => "union",
            },
        );
    }
    if let Some(s) = opt_value(schema) {
        o.value("schema", s);
    }
    o.finish();
}

fn write_limits(out: &mut Vec<u8>, l: &Limits) {
    let Limits {
        steps,
        tokens,
        deadline,
    } = l;
    let mut o = Obj::begin(out);
    if let Some(d) = deadline {
        o.u64("deadline", d.0);
    }
    if let Some(n) = steps {
        o.u64("steps", u64::from(*n));
    }
    if let Some(n) = tokens {
        o.u64("tokens", *n);
    }
    o.finish();
}

fn write_step(out: &mut Vec<u8>, s: &StepDef, names: &Names<'_>) {
    let StepDef {
        id,
        kind,
        tools,
        verify,
        rubric,
        retry,
        timeout,
        writes,
    } = s;
    let mut o = Obj::begin(out);
    // JCS order: conditional, id, judgment, model, parallel, retry, rubric,
    // timeout, tool, tools, verify, workflow, writes — the kind key among them.
    let name = kind.name();
    if name < "id" {
        o.field(name, |out| write_kind(out, kind, names));
    }
    o.str("id", id.as_str());
    if ("id".."retry").contains(&name) {
        o.field(name, |out| write_kind(out, kind, names));
    }
    o.object_unless_empty("retry", |out| write_retry(out, retry));
    // A step rubric is written exactly as the workflow's; one with no
    // criteria and no threshold does nothing and is left out.
    if !rubric.criteria.is_empty() || rubric.threshold.is_some() {
        o.field("rubric", |out| write_rubric(out, rubric, names));
    }
    if let Some(t) = timeout
        && *t != DEFAULT_STEP_TIMEOUT
    {
        o.u64("timeout", t.0);
    }
    if name == "tool" {
        o.field(name, |out| write_kind(out, kind, names));
    }
    if !tools.is_empty() {
        o.field("tools", |out| {
            write_set(
                out,
                &tools.0,
                |a, b| cmp_utf16(&names.get(a), &names.get(b)),
                true,
                |out, t| write_str(out, &names.get(t)),
            )
        });
    }
    if !verify.is_empty() {
        o.field("verify", |out| {
            write_set(
                out,
                verify,
                |a, b| cmp_utf16(&names.get(&a.verifier), &names.get(&b.verifier)),
                false,
                |out, v| write_verifier(out, v, names),
            )
        });
    }
    if name == "workflow" {
        o.field(name, |out| write_kind(out, kind, names));
    }
    if let Some(w) = writes {
        o.str("writes", w.as_str());
    }
    o.finish();
}

fn write_kind(out: &mut Vec<u8>, kind: &StepKind, names: &Names<'_>) {
    match kind {
        StepKind::Model(m) => {
            let ModelStep {
                prompt,
                system,
                effort,
                format,
                schema,
                model,
            } = m;
            let mut o = Obj::begin(out);
            match effort {
                ReasoningEffort::Medium => {}
                ReasoningEffort::Low => o.str("effort", "low"),
                ReasoningEffort::High => o.str("effort", "high"),
            }
            match format {
                OutputFormat::Text => {}
                OutputFormat::Json => o.str("format", "json"),
            }
            if let Some(m) = model {
                o.str("model", m);
            }
            o.str("prompt", &prompt.0);
            // The answer's JSON Schema, as canonical JSON like every schema
            // (`null` is how JSON writes "absent").
            if let Some(v) = opt_value(schema) {
                o.value("schema", v);
            }
            if let Some(s) = system {
                o.str("system", &s.0);
            }
            o.finish();
        }
        StepKind::Tool(t) => {
            let ToolStep { tool, args } = t;
            let mut o = Obj::begin(out);
            if !args.0.is_null() {
                o.value("args", &args.0);
            }
            o.str("name", &names.get(tool));
            o.finish();
        }
        StepKind::Parallel(p) => {
            let ParallelStep { branches, join } = p;
            let mut o = Obj::begin(out);
            o.field("branches", |out| {
                write_str_seq(out, branches.iter().map(StepId::as_str))
            });
            match join {
                JoinPolicy::All => {}
                JoinPolicy::Any => o.str("join", "any"),
                JoinPolicy::Quorum(n) => o.field("join", |out| {
                    let mut q = Obj::begin(out);
                    q.u64("quorum", u64::from(*n));
                    q.finish();
                }),
            }
            o.finish();
        }
        StepKind::Conditional(c) => {
            let ConditionalStep {
                on,
                then,
                otherwise,
            } = c;
            let mut o = Obj::begin(out);
            o.str("on", &on.0);
            if let Some(x) = otherwise {
                o.str("otherwise", x.as_str());
            }
            o.str("then", then.as_str());
            o.finish();
        }
        StepKind::SubWorkflow(w) => {
            let SubWorkflowStep { id, version, input } = w;
            let mut o = Obj::begin(out);
            o.str("id", id.as_str());
            if !input.0.is_null() {
                o.value("input", &input.0);
            }
            if let VersionSelector::Pinned(v) = version {
                o.str("version", &v.to_string());
            }
            o.finish();
        }
        StepKind::Judgment(j) => {
            let JudgmentStep {
                question,
                sources,
                result_schema,
                executor,
                profile,
                constraints,
                on_timeout,
            } = j;
            let mut o = Obj::begin(out);
            if !constraints.is_empty() {
                o.field("constraints", |out| {
                    write_str_seq(out, constraints.iter().map(String::as_str))
                });
            }
            if let Some(e) = executor {
                o.str("executor", e);
            }
            if let Some(f) = on_timeout {
                o.field("on_timeout", |out| write_fallback(out, f));
            }
            if let Some(p) = profile {
                o.str("profile", p);
            }
            o.str("question", &question.0);
            o.value("result_schema", result_schema);
            if !sources.is_empty() {
                o.field("sources", |out| {
                    write_str_seq(out, sources.iter().map(|s| s.0.as_str()))
                });
            }
            o.finish();
        }
    }
}

fn write_str_seq<'a>(out: &mut Vec<u8>, items: impl Iterator<Item = &'a str>) {
    out.push(b'[');
    for (i, s) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, s);
    }
    out.push(b']');
}

fn write_transition(out: &mut Vec<u8>, t: &Transition) {
    let Transition {
        from,
        to,
        max_iterations,
        when,
    } = t;
    let mut o = Obj::begin(out);
    o.str("from", from.as_str());
    if let Some(n) = max_iterations {
        o.u64("max_iterations", u64::from(n.get()));
    }
    o.str("to", to.as_str());
    if let Some(p) = when {
        o.str("when", &p.0);
    }
    o.finish();
}

fn write_verifier(out: &mut Vec<u8>, v: &VerifierRef, names: &Names<'_>) {
    let VerifierRef { verifier, config } = v;
    let mut o = Obj::begin(out);
    if !config.is_null() {
        o.value("config", config);
    }
    o.str("verifier", &names.get(verifier));
    o.finish();
}

fn write_retry(out: &mut Vec<u8>, r: &RetryPolicy) {
    let RetryPolicy {
        max_attempts,
        backoff,
        factor,
        max_backoff,
        on,
    } = r;
    let mut o = Obj::begin(out);
    if backoff.0 != 0 {
        o.u64("backoff", backoff.0);
    }
    if *factor != 2 {
        o.u64("factor", u64::from(*factor));
    }
    if *max_attempts != 1 {
        o.u64("max_attempts", u64::from(*max_attempts));
    }
    if let Some(m) = max_backoff {
        o.u64("max_backoff", m.0);
    }
    if !RetryOn::is_all(on) {
        o.field("on", |out| {
            write_set(
                out,
                on,
                |a, b| a.name().cmp(b.name()),
                true,
                |out, c| write_str(out, c.name()),
            )
        });
    }
    o.finish();
}

fn write_rubric(out: &mut Vec<u8>, r: &RubricDef, names: &Names<'_>) {
    let RubricDef {
        criteria,
        threshold,
    } = r;
    let mut o = Obj::begin(out);
    if !criteria.is_empty() {
        o.field("criteria", |out| {
            write_set(
                out,
                criteria,
                |a, b| cmp_utf16(&a.name, &b.name),
                false,
                |out, c| write_criterion(out, c, names),
            )
        });
    }
    if let Some(t) = threshold {
        o.field("threshold", |out| jcs::write_f64(out, *t));
    }
    o.finish();
}

fn write_criterion(out: &mut Vec<u8>, c: &Criterion, names: &Names<'_>) {
    let Criterion {
        name,
        verifier,
        config,
        weight,
    } = c;
    let mut o = Obj::begin(out);
    if !config.is_null() {
        o.value("config", config);
    }
    o.str("name", name);
    o.str("verifier", &names.get(verifier));
    if *weight != 1.0 {
        o.field("weight", |out| jcs::write_f64(out, *weight));
    }
    o.finish();
}

fn write_budget(out: &mut Vec<u8>, b: &BudgetDef) {
    let BudgetDef {
        tokens,
        tool_calls,
        wall_time,
    } = b;
    let mut o = Obj::begin(out);
    if let Some(n) = tokens {
        o.u64("tokens", *n);
    }
    if let Some(n) = tool_calls {
        o.u64("tool_calls", *n);
    }
    if let Some(d) = wall_time {
        o.u64("wall_time", d.0);
    }
    o.finish();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_dropped_and_explicit_defaults_hash_the_same() {
        let plain = WorkflowDef::new("w").with_step(StepDef::model("a", "hi"));
        let explicit = WorkflowDef::new("w").with_step(
            StepDef::model("a", "hi")
                .with_timeout(DEFAULT_STEP_TIMEOUT)
                .with_retry(RetryPolicy {
                    on: vec![
                        RetryOn::Verifier,
                        RetryOn::Timeout,
                        RetryOn::Unavailable,
                        RetryOn::Failed,
                    ],
                    ..RetryPolicy::default()
                }),
        );
        assert_eq!(
            String::from_utf8(canonical_bytes(&plain)).expect("utf-8"),
            r#"{"id":"w","schema":1,"steps":[{"id":"a","model":{"prompt":"hi"}}]}"#
        );
        assert_eq!(version_of(&plain), version_of(&explicit));
    }

    #[test]
    fn the_encoder_writes_members_in_order_without_rearranging() {
        let wf = crate::parse(
            include_bytes!("../../../../fixtures/canonical/base.yaml"),
            crate::Format::Yaml,
            "base.yaml",
        )
        .expect("fixture parses");
        jcs::UNSORTED.with(|c| c.set(0));
        let _ = canonical_bytes(&wf);
        assert_eq!(
            jcs::UNSORTED.with(|c| c.get()),
            0,
            "some object took the slow path"
        );
    }

    #[test]
    fn large_workflows_sort_steps_by_id_like_small_ones() {
        // Over the 64 steps where the prefix sort takes over: ids sharing
        // 8-byte prefixes, of different lengths, and in no particular order.
        let mut ids: Vec<String> = Vec::new();
        for i in 0..150u32 {
            let base = [
                "abcdefgh",
                "abcdefg",
                "abcdefghi",
                "a",
                "s",
                "step_000",
                "z_",
            ][i as usize % 7];
            ids.push(format!("{base}{}", (i * 7919) % 1000));
        }
        ids.extend([
            "abcdefgh".to_owned(),
            "abcdefgha".to_owned(),
            "abcdefg".to_owned(),
        ]);
        ids.sort();
        ids.dedup();
        let mut shuffled = ids.clone();
        shuffled.reverse();
        shuffled.rotate_left(37);
        let wf = |order: &[String]| {
            order.iter().fold(WorkflowDef::new("w"), |w, id| {
                w.with_step(StepDef::model(id.as_str(), "x"))
            })
        };
        let bytes = canonical_bytes(&wf(&shuffled));
        assert_eq!(bytes, canonical_bytes(&wf(&ids)));
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        let written: Vec<&str> = v["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|s| s["id"].as_str().unwrap_or(""))
            .collect();
        let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
        want.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
        assert_eq!(written, want);
    }

    #[test]
    fn from_canonical_round_trips_and_refuses_non_canonical_bytes() {
        let wf = WorkflowDef::new("w")
            .with_step(StepDef::tool(
                "b",
                ToolRef::any("text"),
                json!({"z": 1, "a": [2, 1]}),
            ))
            .with_step(StepDef::model("a", "hi"))
            .with_edge("a", "b");
        let bytes = canonical_bytes(&wf);
        let back = from_canonical(&bytes).expect("canonical");
        assert_eq!(canonical_bytes(&back), bytes);
        let pretty = serde_json::to_vec_pretty(&wf).expect("json");
        assert!(matches!(
            from_canonical(&pretty),
            Err(FromCanonicalError::NotCanonical { .. })
        ));
    }
}
