//! The registries of loaded tools and verifiers, keyed by name and semver
//! version (their views that implement `poimen_workflow`'s registry traits
//! are the host's: `host/mod.rs`).
//!
//! Resolution picks the highest version matching the requested range (or,
//! when the caller pins a digest, the matching version with that digest); a
//! miss names what was searched and the nearest names. This module knows
//! nothing of how a component is loaded or run: it stores what `host` hands
//! it.

use std::collections::BTreeMap;
use std::sync::Arc;

use poimen_workflow::registry::nearest_names;
use poimen_workflow::{Ineligibility, ToolInfo, ToolRef, Unresolved, shadow_eligibility};
use serde::{Deserialize, Serialize};

use crate::bindings::{ToolPre, VerifierPre};
use crate::engine::CacheOutcome;
use crate::error::{InvokeError, LoadError};
use crate::imports::Import;
use crate::limits::CallLimits;
use crate::policy::Grant;
use crate::record::{ComponentIdentity, HostcallRecord};
use crate::schema::OutputSchema;
use crate::state::CallState;

/// Which world a component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    Tool,
    Verifier,
}

impl PluginKind {
    fn plural(self) -> &'static str {
        match self {
            PluginKind::Tool => "tools",
            PluginKind::Verifier => "verifiers",
        }
    }
}

/// The pre-linked component, ready to instantiate into a fresh store.
pub(crate) enum Pre {
    Tool(ToolPre<CallState>),
    Verifier(VerifierPre<CallState>),
}

/// A loaded component and everything decided about it at load.
pub(crate) struct Loaded {
    pub info: ToolInfo,
    pub kind: PluginKind,
    pub origin: String,
    pub identity: ComponentIdentity,
    pub pre: Pre,
    pub imports: Vec<Import>,
    pub grants: Vec<Grant>,
    pub limits: CallLimits,
    pub cache: CacheOutcome,
    pub describe_record: HostcallRecord,
    pub describe_cached: bool,
    /// `info.output_schema`, compiled at load; a tool's every result is
    /// checked against it (a verifier's result is a verdict, not JSON).
    pub output_schema: OutputSchema,
}

/// A registry entry, as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub info: ToolInfo,
    pub kind: PluginKind,
    /// Where the component came from (a file path, or the embedder's label).
    pub origin: String,
    /// The component's imports, from its type.
    pub imports: Vec<Import>,
    /// What policy granted it.
    pub grants: Vec<Grant>,
    /// The limits its invocations run under (before a caller's timeout).
    pub limits: CallLimits,
    /// Whether it may run in shadow evaluation, and why not.
    pub eligibility: Result<(), Vec<Ineligibility>>,
    /// Whether its compiled code came from the on-disk cache.
    pub cache: CacheOutcome,
    /// The record of the `describe` call made at load.
    pub describe_record: HostcallRecord,
    /// Whether the description came from the compile cache, authenticated
    /// and keyed by the component's digest, instead of a `describe` call
    /// (a hit never runs the guest at load).
    #[serde(default)]
    pub describe_cached: bool,
}

impl Loaded {
    pub fn entry(&self) -> Entry {
        Entry {
            info: self.info.clone(),
            kind: self.kind,
            origin: self.origin.clone(),
            imports: self.imports.clone(),
            grants: self.grants.clone(),
            limits: self.limits,
            eligibility: shadow_eligibility(&self.info.capabilities, self.info.effect),
            cache: self.cache,
            describe_record: self.describe_record.clone(),
            describe_cached: self.describe_cached,
        }
    }
}

/// A component that was read and described but is not runnable: the policy
/// does not grant a capability it declares. Listed, and named in every error
/// that resolves it, so the operator learns what to grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WithheldEntry {
    pub info: ToolInfo,
    pub kind: PluginKind,
    /// Where the component came from.
    pub origin: String,
    /// Why it is withheld and how to grant it.
    pub reason: String,
}

/// A component the host refused to load, and why: the host started
/// without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedEntry {
    /// Where the component came from (its file).
    pub origin: String,
    /// Why it was refused and what to do (the load error's message).
    pub reason: String,
}

/// What replacing a component did.
#[derive(Debug, Clone, PartialEq)]
pub struct Replacement {
    /// The component now loaded under the name.
    pub loaded: Entry,
    /// The ones it replaced: still served to calls that pin their digest.
    pub retired: Vec<Entry>,
}

/// Everything loaded, by kind then name, versions ascending.
#[derive(Default)]
pub(crate) struct Registry {
    tools: BTreeMap<String, Vec<Arc<Loaded>>>,
    verifiers: BTreeMap<String, Vec<Arc<Loaded>>>,
    /// Replaced components: resolved only by a caller that pins their
    /// digest (a run that started on one finishes on it).
    retired: Vec<Arc<Loaded>>,
    /// Components withheld for want of a grant.
    withheld: Vec<WithheldEntry>,
    /// Components from plugin directories the host refused (it started
    /// without them).
    refused: Vec<RefusedEntry>,
    /// Names taken by the components the embedder gave the builder (the
    /// bundled first-party plugins): name → where it came from. No other
    /// component may register under them.
    reserved: BTreeMap<String, String>,
    /// Where components were loaded from, in words.
    pub sources: Vec<String>,
}

impl Registry {
    pub fn new(sources: Vec<String>) -> Self {
        Registry {
            sources,
            ..Registry::default()
        }
    }

    fn map(&self, kind: PluginKind) -> &BTreeMap<String, Vec<Arc<Loaded>>> {
        match kind {
            PluginKind::Tool => &self.tools,
            PluginKind::Verifier => &self.verifiers,
        }
    }

    /// Adds a component; the same name, version and digest again is a
    /// no-op, a different digest is a conflict.
    pub fn insert(&mut self, loaded: Loaded) -> Result<Arc<Loaded>, LoadError> {
        let map = match loaded.kind {
            PluginKind::Tool => &mut self.tools,
            PluginKind::Verifier => &mut self.verifiers,
        };
        let versions = map.entry(loaded.info.name.clone()).or_default();
        if let Some(existing) = versions
            .iter()
            .find(|v| v.info.version == loaded.info.version)
        {
            if existing.info.digest == loaded.info.digest {
                return Ok(existing.clone());
            }
            return Err(LoadError::Conflict {
                name: loaded.info.name.clone(),
                version: loaded.info.version.to_string(),
                first: existing.origin.clone(),
                second: loaded.origin,
            });
        }
        let loaded = Arc::new(loaded);
        versions.push(loaded.clone());
        versions.sort_by(|a, b| a.info.version.cmp(&b.info.version));
        Ok(loaded)
    }

    fn label(&self, kind: PluginKind) -> String {
        if self.sources.is_empty() {
            kind.plural().to_owned()
        } else {
            format!("{} loaded from {}", kind.plural(), self.sources.join(", "))
        }
    }

    /// The entry `r` names: the highest matching version, or the matching
    /// version with `digest` when one is pinned.
    pub fn resolve(
        &self,
        kind: PluginKind,
        r: &ToolRef,
        digest: Option<&str>,
    ) -> Result<Arc<Loaded>, InvokeError> {
        let map = self.map(kind);
        let versions = map.get(&r.name);
        let mut matching = versions
            .into_iter()
            .flatten()
            .rev()
            .filter(|v| r.version.matches(&v.info.version));
        let Some(highest) = matching.next() else {
            // Replaced by another version: a pinned caller still gets its own.
            if let Some(pinned) = digest.and_then(|d| self.retired_with(kind, r, d)) {
                return Ok(pinned);
            }
            if let Some(w) = self.withheld.iter().find(|w| {
                w.kind == kind && w.info.name == r.name && r.version.matches(&w.info.version)
            }) {
                return Err(InvokeError::Withheld {
                    tool: format!("{}@{}", w.info.name, w.info.version),
                    reason: w.reason.clone(),
                });
            }
            return Err(InvokeError::NotFound(Unresolved {
                name: r.name.clone(),
                requested: r.version.to_string(),
                registry: self.label(kind),
                available_versions: versions
                    .map(|vs| vs.iter().map(|v| v.info.version.to_string()).collect())
                    .unwrap_or_default(),
                nearest: if versions.is_some() {
                    Vec::new()
                } else {
                    nearest_names(&r.name, map.keys().map(String::as_str))
                },
                withheld: None,
            }));
        };
        match digest {
            None => Ok(highest.clone()),
            Some(d) if highest.info.digest == d => Ok(highest.clone()),
            Some(d) => match matching.find(|v| v.info.digest == d) {
                Some(pinned) => Ok(pinned.clone()),
                None => match self.retired_with(kind, r, d) {
                    Some(pinned) => Ok(pinned),
                    None => Err(InvokeError::DigestMismatch {
                        tool: r.to_string(),
                        expected: d.to_owned(),
                        found: highest.info.digest.clone(),
                    }),
                },
            },
        }
    }

    /// The retired component `r` names with exactly this digest.
    fn retired_with(&self, kind: PluginKind, r: &ToolRef, digest: &str) -> Option<Arc<Loaded>> {
        self.retired
            .iter()
            .find(|l| {
                l.kind == kind
                    && l.info.name == r.name
                    && l.info.digest == digest
                    && r.version.matches(&l.info.version)
            })
            .cloned()
    }

    /// Whether a component of this kind and name is loaded.
    pub fn has(&self, kind: PluginKind, name: &str) -> bool {
        self.map(kind).get(name).is_some_and(|v| !v.is_empty())
    }

    /// Takes every loaded version of `name` out of resolution, keeping each
    /// for calls that pin its digest; returns them.
    pub fn retire(&mut self, kind: PluginKind, name: &str) -> Vec<Entry> {
        let map = match kind {
            PluginKind::Tool => &mut self.tools,
            PluginKind::Verifier => &mut self.verifiers,
        };
        let gone = map.remove(name).unwrap_or_default();
        let entries = gone.iter().map(|l| l.entry()).collect();
        for l in gone {
            if !self.retired.iter().any(|r| r.info.digest == l.info.digest) {
                self.retired.push(l);
            }
        }
        entries
    }

    /// Unloads `name` (every version, or `version`), retired and withheld
    /// ones included; returns what was loaded or retired.
    pub fn remove(&mut self, name: &str, version: Option<&semver::Version>) -> Vec<Entry> {
        let hit = |l: &Loaded| l.info.name == name && version.is_none_or(|v| &l.info.version == v);
        let mut removed = Vec::new();
        for map in [&mut self.tools, &mut self.verifiers] {
            if let Some(versions) = map.get_mut(name) {
                versions.retain(|l| {
                    let h = hit(l);
                    if h {
                        removed.push(l.entry());
                    }
                    !h
                });
                if versions.is_empty() {
                    map.remove(name);
                }
            }
        }
        self.retired.retain(|l| {
            let h = hit(l);
            if h {
                removed.push(l.entry());
            }
            !h
        });
        self.withheld
            .retain(|w| !(w.info.name == name && version.is_none_or(|v| &w.info.version == v)));
        if !self.has(PluginKind::Tool, name) && !self.has(PluginKind::Verifier, name) {
            self.reserved.remove(name);
        }
        removed
    }

    /// Hands `name`'s reservation (if it has one) to the component from
    /// `origin` that replaces its owner.
    pub fn transfer(&mut self, name: &str, origin: &str) {
        if let Some(owner) = self.reserved.get_mut(name) {
            *owner = origin.to_owned();
        }
    }

    /// Every loaded name, tools then verifiers.
    pub fn names(&self) -> Vec<String> {
        self.tools
            .keys()
            .chain(self.verifiers.keys())
            .cloned()
            .collect()
    }

    /// Records a component withheld for want of a grant.
    pub fn withhold(&mut self, entry: WithheldEntry) {
        if !self.withheld.contains(&entry) {
            self.withheld.push(entry);
        }
    }

    /// Every withheld component, in load order.
    pub fn withheld(&self) -> Vec<WithheldEntry> {
        self.withheld.clone()
    }

    /// Records a component refused at build.
    pub fn refuse(&mut self, entry: RefusedEntry) {
        if !self.refused.contains(&entry) {
            self.refused.push(entry);
        }
    }

    /// Every refused component, in load order.
    pub fn refused(&self) -> Vec<RefusedEntry> {
        self.refused.clone()
    }

    /// Reserves `name` for the component loaded from `origin`.
    pub fn reserve(&mut self, name: &str, origin: &str) {
        self.reserved
            .entry(name.to_owned())
            .or_insert_with(|| origin.to_owned());
    }

    /// Who reserved `name`, unless a component with `digest` is registered
    /// under it (loading the very same component again is no conflict).
    pub fn reserved_against(&self, name: &str, digest: &str) -> Option<String> {
        let owner = self.reserved.get(name)?;
        let same = [&self.tools, &self.verifiers]
            .into_iter()
            .filter_map(|m| m.get(name))
            .flatten()
            .any(|l| l.info.digest == digest);
        (!same).then(|| owner.clone())
    }

    pub fn list(&self, kind: PluginKind) -> Vec<Entry> {
        self.map(kind)
            .values()
            .flatten()
            .map(|l| l.entry())
            .collect()
    }
}
