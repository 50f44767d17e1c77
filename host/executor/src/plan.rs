//! What the interpreter needs to know about a workflow's shape, computed
//! once per armed version: top-level order, forward predecessors, back-edges,
//! ownership of branch and conditional targets, loop bodies.
//!
//! The validator has already guaranteed the shape is sound (a forward DAG,
//! bounded back-edges, single owners); this module only indexes it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use workflow::{StepDef, StepId, StepKind, Transition, WorkflowDef, WorkflowVersion};

/// A validated workflow version, ready to run.
#[derive(Debug, Clone)]
pub struct Armed {
    pub def: Arc<WorkflowDef>,
    pub version: WorkflowVersion,
    /// Exact versions of the sub-workflows, by the step that runs them.
    pub subworkflows: BTreeMap<StepId, WorkflowVersion>,
    pub(crate) shape: Shape,
}

impl Armed {
    /// Arms a workflow that passed validation (only `validate` makes a
    /// `Validated`, so only a valid workflow can run). Sub-workflow versions
    /// are the ones the validator resolved.
    pub fn new(validated: workflow::Validated) -> Armed {
        let subworkflows = validated.sub_workflow_versions();
        let version = validated.version();
        let def = Arc::new(validated.into_def());
        let shape = Shape::of(&def);
        Armed {
            def,
            version,
            subworkflows,
            shape,
        }
    }

    /// The step with this id.
    pub fn step(&self, id: &StepId) -> Option<&StepDef> {
        self.shape.index.get(id).map(|&i| &self.def.steps[i])
    }
}

/// Indexes of a workflow's control structure.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shape {
    pub index: BTreeMap<StepId, usize>,
    /// Top-level steps in deterministic topological order (ties by id).
    pub topo: Vec<StepId>,
    /// Forward predecessors of each top-level step.
    pub preds: BTreeMap<StepId, Vec<StepId>>,
    /// The back-edge leaving each step, if any.
    pub back_edges: BTreeMap<StepId, Transition>,
}

impl Shape {
    pub fn of(def: &WorkflowDef) -> Shape {
        let index: BTreeMap<StepId, usize> = def
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.clone(), i))
            .collect();
        // Owned steps (Parallel branches, Conditional targets) are not top-level.
        let mut owner = BTreeMap::new();
        for s in &def.steps {
            match &s.kind {
                StepKind::Parallel(p) => {
                    for b in &p.branches {
                        owner.insert(b.clone(), s.id.clone());
                    }
                }
                StepKind::Conditional(c) => {
                    owner.insert(c.then.clone(), s.id.clone());
                    if let Some(o) = &c.otherwise {
                        owner.insert(o.clone(), s.id.clone());
                    }
                }
                _ => {}
            }
        }
        let top: BTreeSet<StepId> = def
            .steps
            .iter()
            .map(|s| s.id.clone())
            .filter(|id| !owner.contains_key(id))
            .collect();
        let mut preds: BTreeMap<StepId, Vec<StepId>> =
            top.iter().map(|id| (id.clone(), Vec::new())).collect();
        let mut succs: BTreeMap<StepId, Vec<StepId>> = BTreeMap::new();
        let mut back_edges = BTreeMap::new();
        for t in &def.transitions {
            if t.max_iterations.is_some() {
                back_edges.insert(t.from.clone(), t.clone());
            } else if top.contains(&t.from) && top.contains(&t.to) {
                preds.entry(t.to.clone()).or_default().push(t.from.clone());
                succs.entry(t.from.clone()).or_default().push(t.to.clone());
            }
        }
        // Kahn's algorithm, always taking the smallest ready id.
        let mut indegree: BTreeMap<&StepId, usize> =
            preds.iter().map(|(k, v)| (k, v.len())).collect();
        let mut ready: BTreeSet<StepId> = indegree
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(k, _)| (*k).clone())
            .collect();
        let mut topo = Vec::with_capacity(top.len());
        while let Some(next) = ready.pop_first() {
            for s in succs.get(&next).into_iter().flatten() {
                if let Some(d) = indegree.get_mut(s) {
                    *d -= 1;
                    if *d == 0 {
                        ready.insert(s.clone());
                    }
                }
            }
            topo.push(next);
        }
        Shape {
            index,
            topo,
            preds,
            back_edges,
        }
    }

    /// Steps of the loop closed by a back-edge `from -> to`: every top-level
    /// step on a forward path from `to` to `from`, in topological order.
    pub fn loop_body(&self, from: &StepId, to: &StepId) -> Vec<StepId> {
        let mut succs: BTreeMap<&StepId, Vec<&StepId>> = BTreeMap::new();
        for (s, ps) in &self.preds {
            for p in ps {
                succs.entry(p).or_default().push(s);
            }
        }
        let reach = |start: &StepId, next: &dyn Fn(&StepId) -> Vec<StepId>| {
            let mut seen = BTreeSet::new();
            let mut queue = VecDeque::from([start.clone()]);
            while let Some(s) = queue.pop_front() {
                if seen.insert(s.clone()) {
                    queue.extend(next(&s));
                }
            }
            seen
        };
        let forward = reach(to, &|s| {
            succs
                .get(s)
                .map(|v| v.iter().map(|x| (*x).clone()).collect())
                .unwrap_or_default()
        });
        let backward = reach(from, &|s| self.preds.get(s).cloned().unwrap_or_default());
        self.topo
            .iter()
            .filter(|s| forward.contains(*s) && backward.contains(*s))
            .cloned()
            .collect()
    }
}
