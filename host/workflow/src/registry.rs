//! The registries the validator resolves references against, as traits.
//!
//! `workflow` owns only the traits and a plain in-memory implementation; the
//! sandbox implements them over loaded WebAssembly components and the store
//! implements [`WorkflowResolver`] over published versions. This keeps the
//! validator pure: no wasmtime, no IO.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capability::{Capability, EffectClass};
use crate::ir::{ToolRef, VersionSelector, WorkflowDef, WorkflowId};
use crate::version::WorkflowVersion;

/// What the validator (and the planner) knows of a registered tool or verifier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    pub name: String,
    pub version: semver::Version,
    /// Blake3 digest of the component bytes, `b3:`-prefixed.
    pub digest: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the invocation arguments (of the verifier configuration,
    /// for a verifier).
    #[serde(default)]
    pub input_schema: Value,
    /// JSON Schema of the result.
    #[serde(default)]
    pub output_schema: Value,
    #[serde(default)]
    pub capabilities: Vec<Capability>,
    pub effect: EffectClass,
    /// The longest call the host's sandbox policy lets this component run,
    /// in milliseconds; a step timeout above it is refused at load rather
    /// than clamped. `None`: the registry states no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_timeout_ms: Option<u64>,
    /// For a workflow registered as a tool (`tool:`): the version a call
    /// runs, as a child run. `None`: a component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<crate::WorkflowVersion>,
}

/// A reference that matched nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unresolved {
    /// The name that was asked for.
    pub name: String,
    /// The semver range that was asked for.
    pub requested: String,
    /// The registry searched, in words (`tools: bundled, /srv/plugins`).
    pub registry: String,
    /// Versions registered under the same name that did not match the range.
    pub available_versions: Vec<String>,
    /// Registered names nearest to the one asked for, nearest first.
    pub nearest: Vec<String>,
    /// Set when the name is installed but withheld from use (its declared
    /// capabilities are not granted by the policy): why, and how to grant it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld: Option<String>,
}

/// Resolves tool references.
pub trait ToolRegistry {
    fn resolve_tool(&self, tool: &ToolRef) -> Result<ToolInfo, Unresolved>;
}

/// Resolves verifier references.
pub trait VerifierRegistry {
    fn resolve_verifier(&self, verifier: &ToolRef) -> Result<ToolInfo, Unresolved>;
}

/// A sub-workflow reference that matched nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnresolvedWorkflow {
    pub id: String,
    pub selector: String,
    /// Where it was looked for, in words.
    pub searched: String,
}

/// Resolves sub-workflow references to a concrete version.
pub trait WorkflowResolver {
    fn resolve_workflow(
        &self,
        id: &WorkflowId,
        selector: &VersionSelector,
    ) -> Result<(WorkflowVersion, Arc<WorkflowDef>), UnresolvedWorkflow>;
}

/// Everything the validator resolves against.
#[derive(Clone, Copy)]
pub struct Registries<'a> {
    pub tools: &'a dyn ToolRegistry,
    pub verifiers: &'a dyn VerifierRegistry,
    pub workflows: &'a dyn WorkflowResolver,
}

impl std::fmt::Debug for Registries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registries { .. }")
    }
}

/// Names nearest to `wanted` among `names`, nearest first (at most three,
/// and only reasonably close ones).
pub fn nearest_names<'a>(wanted: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut scored: Vec<(f64, &str)> = names
        .into_iter()
        .map(|n| (strsim::jaro_winkler(wanted, n), n))
        .filter(|(score, _)| *score >= 0.7)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(3)
        .map(|(_, n)| n.to_owned())
        .collect()
}

/// A registry held in memory: for offline validation against a saved list of
/// descriptors, and for embedding hosts that register tools themselves.
#[derive(Debug, Clone, Default)]
pub struct MemoryRegistry {
    /// What this registry is called in error messages.
    pub label: String,
    entries: BTreeMap<String, Vec<ToolInfo>>,
    /// Names installed but withheld, with the reason.
    withheld: BTreeMap<String, String>,
}

impl MemoryRegistry {
    pub fn new(label: impl Into<String>) -> Self {
        MemoryRegistry {
            label: label.into(),
            entries: BTreeMap::new(),
            withheld: BTreeMap::new(),
        }
    }

    /// Marks `name` as installed but withheld from use, for `reason`
    /// (e.g. the policy does not grant its capabilities).
    pub fn withhold(&mut self, name: impl Into<String>, reason: impl Into<String>) {
        self.withheld.insert(name.into(), reason.into());
    }

    /// Adds (or replaces) one name+version.
    pub fn insert(&mut self, info: ToolInfo) {
        let versions = self.entries.entry(info.name.clone()).or_default();
        versions.retain(|v| v.version != info.version);
        versions.push(info);
        versions.sort_by(|a, b| a.version.cmp(&b.version));
    }

    /// The highest version of `r.name` matching `r.version`.
    pub fn resolve(&self, r: &ToolRef) -> Result<ToolInfo, Unresolved> {
        let found = self
            .entries
            .get(&r.name)
            .and_then(|vs| vs.iter().rev().find(|v| r.version.matches(&v.version)));
        match found {
            Some(info) => Ok(info.clone()),
            None => Err(Unresolved {
                name: r.name.clone(),
                requested: r.version.to_string(),
                registry: self.label.clone(),
                available_versions: self
                    .entries
                    .get(&r.name)
                    .map(|vs| vs.iter().map(|v| v.version.to_string()).collect())
                    .unwrap_or_default(),
                nearest: if self.entries.contains_key(&r.name) {
                    Vec::new()
                } else {
                    nearest_names(&r.name, self.entries.keys().map(String::as_str))
                },
                withheld: self.withheld.get(&r.name).cloned(),
            }),
        }
    }

    /// Every registered entry, by name then version.
    pub fn iter(&self) -> impl Iterator<Item = &ToolInfo> {
        self.entries.values().flatten()
    }
}

impl ToolRegistry for MemoryRegistry {
    fn resolve_tool(&self, tool: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.resolve(tool)
    }
}

impl VerifierRegistry for MemoryRegistry {
    fn resolve_verifier(&self, verifier: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.resolve(verifier)
    }
}

/// Sub-workflows held in memory, keyed by id; `Latest` is the last inserted.
#[derive(Debug, Clone, Default)]
pub struct MemoryWorkflows {
    by_id: BTreeMap<WorkflowId, Vec<(WorkflowVersion, Arc<WorkflowDef>)>>,
}

impl MemoryWorkflows {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, version: WorkflowVersion, def: WorkflowDef) {
        self.by_id
            .entry(def.id.clone())
            .or_default()
            .push((version, Arc::new(def)));
    }
}

impl WorkflowResolver for MemoryWorkflows {
    fn resolve_workflow(
        &self,
        id: &WorkflowId,
        selector: &VersionSelector,
    ) -> Result<(WorkflowVersion, Arc<WorkflowDef>), UnresolvedWorkflow> {
        let versions = self.by_id.get(id);
        let found = match selector {
            VersionSelector::Latest => versions.and_then(|v| v.last()),
            VersionSelector::Pinned(p) => versions.and_then(|v| v.iter().find(|(ver, _)| ver == p)),
        };
        found.cloned().ok_or_else(|| UnresolvedWorkflow {
            id: id.to_string(),
            selector: match selector {
                VersionSelector::Latest => "latest".to_owned(),
                VersionSelector::Pinned(v) => v.to_string(),
            },
            searched: "workflows held in memory".to_owned(),
        })
    }
}
