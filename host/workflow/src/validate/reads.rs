//! Checking what every template and predicate of one workflow reads.
//!
//! Each template and predicate is found, size-checked, compiled (through
//! [`Reader`]), and each variable path it reads is checked: `inputs` always;
//! `state.<key>` only for declared keys; `steps.<id>` only for top-level
//! steps that run before the reader on every path — those last checks are
//! collected and answered in one batch by the reachability oracle.
//!
//! Sites are kept as borrowed [`SiteRef`]s and turned into owned [`Site`]s
//! only for an error, so a valid workflow costs no allocation per template.

use serde_json::Value;

use crate::ir::*;

use super::ValidatorLimits;
use super::error::{Site, ValidationError};
use super::refs::{PURE_CEL_FUNCTIONS, Reader, TEMPLATE_GLOBALS};
use crate::shape::{Reach, Shape};

/// Where a template or predicate sits, borrowed from the workflow.
#[derive(Clone, Copy)]
pub(crate) enum SiteRef<'a> {
    Field {
        step: &'a StepId,
        field: &'static str,
    },
    Source {
        step: &'a StepId,
        index: usize,
    },
    /// A string leaf of an argument template rooted at `root`.
    Leaf {
        step: Option<&'a StepId>,
        root: &'static str,
        tree: &'a Value,
        leaf: &'a Value,
    },
    Transition {
        from: &'a StepId,
        to: &'a StepId,
    },
    Workflow {
        field: &'static str,
    },
}

impl SiteRef<'_> {
    pub(crate) fn site(&self) -> Site {
        match *self {
            SiteRef::Field { step, field } => Site::step(step, field),
            SiteRef::Source { step, index } => {
                Site::step(step, format!("judgment.sources[{index}]"))
            }
            SiteRef::Leaf {
                step,
                root,
                tree,
                leaf,
            } => {
                let mut path = root.to_owned();
                leaf_path(tree, leaf, &mut path);
                match step {
                    Some(s) => Site::step(s, path),
                    None => Site::workflow(path),
                }
            }
            SiteRef::Transition { from, to } => Site::Transition {
                from: from.clone(),
                to: to.clone(),
            },
            SiteRef::Workflow { field } => Site::workflow(field),
        }
    }
}

/// Appends the path from `tree` to `leaf` (found by identity) to `path`.
fn leaf_path(tree: &Value, leaf: &Value, path: &mut String) -> bool {
    if std::ptr::eq(tree, leaf) {
        return true;
    }
    let len = path.len();
    match tree {
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                if leaf_path(x, leaf, path) {
                    return true;
                }
                path.truncate(len);
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                path.push('.');
                path.push_str(k);
                if leaf_path(x, leaf, path) {
                    return true;
                }
                path.truncate(len);
            }
        }
        _ => {}
    }
    false
}

/// What a template or predicate may read, by where it sits.
#[derive(Clone, Copy)]
pub(crate) enum ReadAt {
    /// Inside step `i`: forward ancestors of its top-level root.
    Step(usize),
    /// A back-edge's `when`: `from` and its forward ancestors.
    BackEdge(usize),
    /// The workflow `output`: any top-level step (all have run at the end).
    Output,
    /// The workflow `key`: `inputs` only.
    Key,
}

/// A step output read, checked in bulk once every read is known.
struct StepRead<'a> {
    site: SiteRef<'a>,
    referenced: usize,
    reader: usize,
    /// Whether the reader itself may be read (a back-edge's `when` reads `from`).
    inclusive: bool,
}

pub(crate) struct Reads<'a, 's> {
    def: &'a WorkflowDef,
    shape: &'s Shape,
    limits: &'s ValidatorLimits,
    pub(crate) errors: Vec<ValidationError>,
    pending: Vec<StepRead<'a>>,
}

/// Checks every template and predicate of `def`.
pub(crate) fn check(
    def: &WorkflowDef,
    shape: &Shape,
    limits: &ValidatorLimits,
    reader: &mut Reader,
) -> Vec<ValidationError> {
    let mut r = Reads {
        def,
        shape,
        limits,
        errors: Vec::new(),
        pending: Vec::new(),
    };
    if let Some(Template(k)) = &def.key {
        r.template(reader, SiteRef::Workflow { field: "key" }, k, ReadAt::Key);
    }
    if let Some(ArgTemplate(v)) = &def.output {
        r.leaves(reader, v, v, None, "output", ReadAt::Output);
    }
    for (i, s) in def.steps.iter().enumerate() {
        let at = ReadAt::Step(i);
        let id = &s.id;
        match &s.kind {
            StepKind::Model(m) => {
                r.template(
                    reader,
                    SiteRef::Field {
                        step: id,
                        field: "model.prompt",
                    },
                    &m.prompt.0,
                    at,
                );
                if let Some(sys) = &m.system {
                    r.template(
                        reader,
                        SiteRef::Field {
                            step: id,
                            field: "model.system",
                        },
                        &sys.0,
                        at,
                    );
                }
            }
            StepKind::Tool(t) => r.leaves(reader, &t.args.0, &t.args.0, Some(id), "tool.args", at),
            StepKind::SubWorkflow(w) => r.leaves(
                reader,
                &w.input.0,
                &w.input.0,
                Some(id),
                "workflow.input",
                at,
            ),
            StepKind::Judgment(j) => {
                r.template(
                    reader,
                    SiteRef::Field {
                        step: id,
                        field: "judgment.question",
                    },
                    &j.question.0,
                    at,
                );
                for (index, src) in j.sources.iter().enumerate() {
                    r.template(reader, SiteRef::Source { step: id, index }, &src.0, at);
                }
            }
            StepKind::Conditional(c) => {
                r.predicate(
                    reader,
                    SiteRef::Field {
                        step: id,
                        field: "conditional.on",
                    },
                    &c.on.0,
                    at,
                );
            }
            StepKind::Parallel(_) => {}
        }
    }
    for &(f, t, ti) in &shape.back_edges {
        if let Some(p) = &def.transitions[ti].when {
            let site = SiteRef::Transition {
                from: &def.steps[f].id,
                to: &def.steps[t].id,
            };
            r.predicate(reader, site, &p.0, ReadAt::BackEdge(f));
        }
    }
    r.settle();
    r.errors.dedup();
    r.errors
}

impl<'a> Reads<'a, '_> {
    /// Every string leaf of an argument template that holds template syntax.
    fn leaves(
        &mut self,
        reader: &mut Reader,
        tree: &'a Value,
        v: &'a Value,
        step: Option<&'a StepId>,
        root: &'static str,
        at: ReadAt,
    ) {
        match v {
            Value::String(s) if (s.contains('{') || s.len() > self.limits.max_template_bytes) => {
                self.template(
                    reader,
                    SiteRef::Leaf {
                        step,
                        root,
                        tree,
                        leaf: v,
                    },
                    s,
                    at,
                );
            }
            Value::Array(items) => items
                .iter()
                .for_each(|x| self.leaves(reader, tree, x, step, root, at)),
            Value::Object(m) => m
                .values()
                .for_each(|x| self.leaves(reader, tree, x, step, root, at)),
            _ => {}
        }
    }

    fn template(&mut self, reader: &mut Reader, site: SiteRef<'a>, src: &str, at: ReadAt) {
        if src.len() > self.limits.max_template_bytes {
            self.errors.push(ValidationError::TemplateTooLarge {
                site: site.site(),
                bytes: src.len(),
                limit: self.limits.max_template_bytes,
            });
            return;
        }
        if !src.contains('{') {
            return;
        }
        let result = reader.template_paths(src, |path| self.path(site, path, at, true));
        if let Err(message) = result {
            self.errors.push(ValidationError::TemplateSyntax {
                site: site.site(),
                message,
            });
        }
    }

    fn predicate(&mut self, reader: &mut Reader, site: SiteRef<'a>, src: &str, at: ReadAt) {
        if src.len() > self.limits.max_predicate_bytes {
            self.errors.push(ValidationError::PredicateTooLarge {
                site: site.site(),
                bytes: src.len(),
                limit: self.limits.max_predicate_bytes,
            });
            return;
        }
        match reader.predicate(src, self.limits.max_predicate_depth) {
            Err(message) => self.errors.push(ValidationError::PredicateSyntax {
                site: site.site(),
                message,
            }),
            Ok(reads) if reads.depth > self.limits.max_predicate_depth => {
                self.errors.push(ValidationError::PredicateTooDeep {
                    site: site.site(),
                    depth: reads.depth,
                    limit: self.limits.max_predicate_depth,
                })
            }
            Ok(reads) if reads.loops > self.limits.max_predicate_loop_nesting => {
                self.errors.push(ValidationError::PredicateLoopsTooDeep {
                    site: site.site(),
                    nesting: reads.loops,
                    limit: self.limits.max_predicate_loop_nesting,
                })
            }
            Ok(reads) => {
                for f in &reads.functions {
                    if !PURE_CEL_FUNCTIONS.contains(&f.as_str()) {
                        self.errors.push(ValidationError::PredicateNotPure {
                            site: site.site(),
                            function: f.clone(),
                        });
                    }
                }
                for p in &reads.paths {
                    let segs: Vec<&str> = p.iter().map(String::as_str).collect();
                    self.path(site, &segs, at, false);
                }
            }
        }
    }

    /// Checks one variable path a template or predicate reads.
    fn path(&mut self, site: SiteRef<'a>, path: &[&str], at: ReadAt, template: bool) {
        let Some(&root) = path.first() else { return };
        if let ReadAt::Key = at {
            if root != "inputs" && !(template && TEMPLATE_GLOBALS.contains(&root)) {
                self.errors.push(ValidationError::KeyNotFromInputs {
                    variable: path.join("."),
                });
            }
            return;
        }
        match root {
            "inputs" => {}
            "state" => {
                if let Some(&key) = path.get(1)
                    && !self.def.state.contains_key(key)
                {
                    self.errors.push(ValidationError::UndeclaredStateRead {
                        site: site.site(),
                        key: key.to_owned(),
                    });
                }
            }
            "steps" => {
                let Some(&id) = path.get(1) else {
                    self.errors
                        .push(ValidationError::DynamicStepReference { site: site.site() });
                    return;
                };
                if let Some(&attr) = path.get(2)
                    && attr != "output"
                    && attr != "status"
                {
                    self.errors.push(ValidationError::UnknownVariable {
                        site: site.site(),
                        variable: path.join("."),
                    });
                    return;
                }
                let Some(x) = self.shape.lookup(id) else {
                    self.errors.push(ValidationError::UnknownStepReference {
                        site: site.site(),
                        step: StepId::from(id),
                    });
                    return;
                };
                if !self.shape.is_top(x) {
                    self.errors.push(ValidationError::StepNotBefore {
                        site: site.site(),
                        step: StepId::from(id),
                    });
                    return;
                }
                match at {
                    ReadAt::Output | ReadAt::Key => {}
                    ReadAt::Step(i) => {
                        if let Some(r) = self.shape.root[i] {
                            self.pending.push(StepRead {
                                site,
                                referenced: x,
                                reader: r,
                                inclusive: false,
                            });
                        }
                    }
                    ReadAt::BackEdge(f) => {
                        self.pending.push(StepRead {
                            site,
                            referenced: x,
                            reader: f,
                            inclusive: true,
                        });
                    }
                }
            }
            other => {
                if !(template && TEMPLATE_GLOBALS.contains(&other)) {
                    self.errors.push(ValidationError::UnknownVariable {
                        site: site.site(),
                        variable: path.join("."),
                    });
                }
            }
        }
    }

    /// Answers every "does the referenced step run before the reader" at
    /// once. Skipped when the forward transitions have a cycle (reported
    /// already; "before" has no meaning on a cycle).
    fn settle(&mut self) {
        if !self.shape.acyclic || self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let queries: Vec<(usize, usize)> =
            pending.iter().map(|r| (r.referenced, r.reader)).collect();
        let answers = Reach::new(self.shape).ancestors(&queries);
        for (r, ok) in pending.into_iter().zip(answers) {
            if !(ok || (r.inclusive && r.referenced == r.reader)) {
                self.errors.push(ValidationError::StepNotBefore {
                    site: r.site.site(),
                    step: self.shape.id(r.referenced).clone(),
                });
            }
        }
    }
}
