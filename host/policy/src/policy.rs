//! The capability policy: what each plugin is granted, and its limits.
//!
//! A policy is a TOML file (format in `docs/writing-a-plugin.md`) or a value
//! built in code. It maps plugin names to filesystem mounts (guest path →
//! host directory), HTTP host allowlists, scratch and limit overrides.
//! Nothing is granted unless written here, except `scratch`. This module
//! decides grants from a component's *declared* capabilities; checking the
//! declaration against the component's actual imports is `imports`' job.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use poimen_workflow::{Capability, JudgmentFallback};
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::limits::CallLimits;
use crate::runs::{
    Bounds, DurabilityDefault, JudgmentRules, Retention, RunPolicy, UnwrittenTail, WorkflowRules,
};

/// Where a policy came from, for error messages ("the policy consulted").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PolicySource {
    /// No policy was given: nothing but `scratch` is granted.
    #[default]
    BuiltIn,
    /// Read from this file.
    File(PathBuf),
    /// Built in code by the embedder.
    Code,
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicySource::BuiltIn => {
                f.write_str("the built-in default policy (grants nothing but scratch)")
            }
            PolicySource::File(p) => write!(f, "policy file {}", p.display()),
            PolicySource::Code => f.write_str("the policy given by the embedder"),
        }
    }
}

/// Limit overrides; unset fields keep the value from the level above.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LimitOverrides {
    pub timeout_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub fuel: Option<u64>,
    pub output_bytes: Option<u64>,
    pub output_nodes: Option<u64>,
    pub open_files: Option<u32>,
    pub disk_bytes: Option<u64>,
    pub handles: Option<u32>,
}

impl LimitOverrides {
    /// `base` with these overrides applied. Fuel is only overridden where
    /// the host meters it (`base.fuel` is `Some`).
    pub fn apply(&self, base: CallLimits) -> CallLimits {
        CallLimits {
            timeout: self.timeout_ms.map_or(base.timeout, Duration::from_millis),
            memory_bytes: self.memory_bytes.unwrap_or(base.memory_bytes),
            fuel: base.fuel.map(|f| self.fuel.unwrap_or(f)),
            output_bytes: self.output_bytes.unwrap_or(base.output_bytes),
            output_nodes: self.output_nodes.unwrap_or(base.output_nodes),
            open_files: self.open_files.unwrap_or(base.open_files),
            disk_bytes: self.disk_bytes.unwrap_or(base.disk_bytes),
            handles: self.handles.unwrap_or(base.handles),
        }
    }
}

/// One entry of an HTTP allowlist: `host` (the scheme's default port) or
/// `host:port`. Hosts compare case-insensitively; IPv6 literals are written
/// in brackets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HttpAllow {
    pub host: String,
    pub port: Option<u16>,
}

impl HttpAllow {
    /// Parses `host` or `host:port`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{s}` is not an HTTP allowlist entry: {why}");
        if s.is_empty() || s.contains(['/', '@', ' ']) {
            return Err(bad("write `host` or `host:port`"));
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, after) = rest.split_once(']').ok_or_else(|| bad("unclosed `[`"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after `]`"))?),
            };
            (format!("[{h}]"), port)
        } else {
            match s.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (s.to_owned(), None),
            }
        };
        let port = match port {
            None => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))?,
            ),
        };
        if host.is_empty() || host == "[]" {
            return Err(bad("no host"));
        }
        Ok(HttpAllow {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// Whether a request to `host` on `port` (explicit or the scheme's
    /// default, `default_port`) is allowed by this entry.
    pub fn allows(&self, host: &str, port: u16, default_port: u16) -> bool {
        self.host.eq_ignore_ascii_case(host) && self.port.unwrap_or(default_port) == port
    }
}

impl fmt::Display for HttpAllow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// What one plugin (by registry name) is granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPolicy {
    /// The components (by Blake3 digest, `b3:…`) the grants are for; empty
    /// means any component of this name. A component of the name with
    /// another digest is granted nothing but the defaults.
    pub digests: Vec<String>,
    /// Guest mount (`/data`) → host directory, read-only.
    pub fs_read: BTreeMap<String, PathBuf>,
    /// Guest mount → host directory, read-write.
    pub fs_write: BTreeMap<String, PathBuf>,
    /// Hosts `wasi:http` may reach.
    pub http: Vec<HttpAllow>,
    /// Whether `scratch` is granted (it is unless turned off).
    pub scratch: bool,
    pub limits: LimitOverrides,
}

impl Default for PluginPolicy {
    fn default() -> Self {
        PluginPolicy {
            digests: Vec::new(),
            fs_read: BTreeMap::new(),
            fs_write: BTreeMap::new(),
            http: Vec::new(),
            scratch: true,
            limits: LimitOverrides::default(),
        }
    }
}

/// A capability as granted for one invocation: the declared capability
/// plus what policy resolved it to. Listed in every hostcall record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub capability: Capability,
    /// The host directory behind a filesystem mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_dir: Option<PathBuf>,
    /// The allowlist behind `http`, as written in the policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// A declared capability the policy does not grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotGranted {
    pub capability: Capability,
    /// What the policy would need, in words.
    pub hint: String,
}

/// Why a policy could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error("cannot read policy file {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{source_desc}: {message}")]
    Invalid {
        source_desc: String,
        message: String,
    },
}

/// The host's policy: what plugins are granted and the limits of their
/// calls, and what workflows and their runs may do ([`RunPolicy`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policy {
    source: PolicySource,
    defaults: LimitOverrides,
    plugins: BTreeMap<String, PluginPolicy>,
    runs: RunPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PolicyFile {
    #[serde(default)]
    defaults: DefaultsFile,
    #[serde(default)]
    plugins: BTreeMap<String, PluginFile>,
    #[serde(default)]
    durability: DurabilityFile,
    #[serde(default)]
    workflows: WorkflowsFile,
    #[serde(default)]
    judgment: JudgmentFile,
    #[serde(default)]
    bounds: BoundsFile,
    #[serde(default)]
    retention: RetentionFile,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RetentionFile {
    #[serde(default)]
    keep_finished_ms: Option<Spanned<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct DurabilityFile {
    #[serde(default)]
    work: Option<WorkKind>,
    #[serde(default)]
    tail_events: Option<u32>,
    #[serde(default)]
    tail_ms: Option<Spanned<u32>>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum WorkKind {
    Durable,
    Ephemeral,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct WorkflowsFile {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    enabled_ids: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    allow_custom_definitions: Option<bool>,
    #[serde(default)]
    allow_state_mutations: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct JudgmentFile {
    #[serde(default)]
    executors: Option<Vec<String>>,
    #[serde(default)]
    profiles: Option<Vec<String>>,
    #[serde(default)]
    timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    on_timeout: Option<JudgmentFallback>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct BoundsFile {
    #[serde(default)]
    max_attempts: Option<Spanned<u32>>,
    #[serde(default)]
    max_backoff_ms: Option<Spanned<u64>>,
    #[serde(default)]
    output_bytes: Option<Spanned<u64>>,
}

/// The line (1-based) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A positive number of the file, or why it is not one, naming its line.
fn positive<T: Copy + PartialEq + Default>(
    text: &str,
    key: &str,
    v: Option<Spanned<T>>,
) -> Result<Option<T>, String> {
    match v {
        Some(s) if *s.get_ref() == T::default() => Err(format!(
            "line {}: `{key}` is 0: give a positive number, or leave it out",
            line_of(text, s.span().start)
        )),
        Some(s) => Ok(Some(*s.get_ref())),
        None => Ok(None),
    }
}

impl PolicyFile {
    /// What the file says of workflows and runs, each value checked.
    fn run_policy(&mut self, text: &str) -> Result<RunPolicy, String> {
        let durability = match self.durability.work {
            Some(WorkKind::Ephemeral) => DurabilityDefault::Ephemeral,
            Some(WorkKind::Durable) | None => DurabilityDefault::Durable,
        };
        let tail = UnwrittenTail {
            events: self.durability.tail_events,
            ms: positive(text, "tail-ms", self.durability.tail_ms.take())?,
        };
        let w = &mut self.workflows;
        let enabled_ids = match w.enabled_ids.take() {
            None => None,
            Some(ids) => {
                let mut set = std::collections::BTreeSet::new();
                for id in ids {
                    if !poimen_workflow::validate::is_workflow_id(id.get_ref()) {
                        return Err(format!(
                            "line {}: `{}` in `[workflows] enabled-ids` is not a workflow id (dot-separated lower-case segments, e.g. `billing.refund`)",
                            line_of(text, id.span().start),
                            id.get_ref()
                        ));
                    }
                    set.insert(id.into_inner());
                }
                Some(set)
            }
        };
        let workflows = WorkflowRules {
            enabled: w.enabled.unwrap_or(true),
            enabled_ids,
            allow_custom_definitions: w.allow_custom_definitions.unwrap_or(true),
            allow_state_mutations: w.allow_state_mutations.unwrap_or(true),
        };
        let j = &mut self.judgment;
        let judgment = JudgmentRules {
            executors: j.executors.take().map(|v| v.into_iter().collect()),
            profiles: j.profiles.take().map(|v| v.into_iter().collect()),
            timeout: positive(text, "timeout-ms", j.timeout_ms.take())?
                .map(std::time::Duration::from_millis),
            on_timeout: j.on_timeout.take(),
        };
        let b = &mut self.bounds;
        let bounds = Bounds {
            max_attempts: positive(text, "max-attempts", b.max_attempts.take())?,
            max_backoff: positive(text, "max-backoff-ms", b.max_backoff_ms.take())?
                .map(std::time::Duration::from_millis),
            output_bytes: positive(text, "output-bytes", b.output_bytes.take())?,
        };
        let retention = Retention {
            keep_finished: positive(
                text,
                "keep-finished-ms",
                self.retention.keep_finished_ms.take(),
            )?
            .map(std::time::Duration::from_millis),
        };
        Ok(RunPolicy {
            durability,
            tail,
            workflows,
            judgment,
            bounds,
            retention,
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct DefaultsFile {
    #[serde(default)]
    limits: LimitOverrides,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PluginFile {
    #[serde(default)]
    digests: Vec<String>,
    #[serde(default)]
    fs_read: BTreeMap<String, String>,
    #[serde(default)]
    fs_write: BTreeMap<String, String>,
    #[serde(default)]
    http: Vec<String>,
    #[serde(default = "yes")]
    scratch: bool,
    #[serde(default)]
    limits: LimitOverrides,
}

fn yes() -> bool {
    true
}

/// A component digest as the host names them: `b3:` and 64 lowercase hex
/// digits.
fn check_digest(d: &str) -> Result<String, String> {
    match d.strip_prefix("b3:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(d.to_owned())
        }
        _ => Err(format!(
            "`{d}` is not a component digest: write `b3:` and 64 lowercase hex digits, as `poimen plugin inspect` prints it"
        )),
    }
}

/// A mount must read as a capability path: absolute, no `..`, not `/`.
fn check_mount(kind: &str, mount: &str) -> Result<String, String> {
    match format!("{kind}:{mount}").parse::<Capability>() {
        Ok(Capability::FilesystemRead { mount } | Capability::FilesystemWrite { mount }) => {
            Ok(mount)
        }
        _ => Err(format!(
            "`{mount}` is not a mount: write an absolute guest path like `/data`"
        )),
    }
}

/// `dir` resolved against `base` and checked to be a directory.
fn host_dir(base: &Path, dir: &Path) -> Result<PathBuf, String> {
    let path = base.join(dir);
    let canonical = path
        .canonicalize()
        .map_err(|e| format!("host directory {}: {e}", path.display()))?;
    if !canonical.is_dir() {
        return Err(format!(
            "host path {} is not a directory",
            canonical.display()
        ));
    }
    Ok(canonical)
}

impl Policy {
    /// The built-in policy: grants nothing but `scratch`.
    pub fn new() -> Self {
        Policy::default()
    }

    /// A policy built in code (for embedders and tests); grant with the
    /// `grant_*` and `allow_*` methods.
    pub fn in_code() -> Self {
        Policy {
            source: PolicySource::Code,
            ..Policy::default()
        }
    }

    /// Reads a TOML policy file; relative host directories are resolved
    /// against the file's directory.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::Read {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let base = path.parent().map(Path::to_owned).unwrap_or_default();
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        Policy::from_toml(&text, &base, PolicySource::File(absolute))
    }

    /// Parses policy TOML; relative host directories are resolved against
    /// `base`.
    pub fn from_toml(text: &str, base: &Path, source: PolicySource) -> Result<Self, PolicyError> {
        let invalid = |message: String| PolicyError::Invalid {
            source_desc: source.to_string(),
            message,
        };
        let mut file: PolicyFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let runs = file.run_policy(text).map_err(&invalid)?;
        let mut plugins = BTreeMap::new();
        for (name, p) in file.plugins {
            let at = |m: String| invalid(format!("[plugins.{name}] {m}"));
            let mut pp = PluginPolicy {
                scratch: p.scratch,
                limits: p.limits,
                ..PluginPolicy::default()
            };
            for d in &p.digests {
                pp.digests.push(check_digest(d).map_err(at)?);
            }
            for (mount, dir) in p.fs_read {
                let mount = check_mount("fs-read", &mount).map_err(at)?;
                pp.fs_read
                    .insert(mount, host_dir(base, Path::new(&dir)).map_err(at)?);
            }
            for (mount, dir) in p.fs_write {
                let mount = check_mount("fs-write", &mount).map_err(at)?;
                pp.fs_write
                    .insert(mount, host_dir(base, Path::new(&dir)).map_err(at)?);
            }
            for h in p.http {
                pp.http.push(HttpAllow::parse(&h).map_err(at)?);
            }
            plugins.insert(name, pp);
        }
        Ok(Policy {
            source,
            defaults: file.defaults.limits,
            plugins,
            runs,
        })
    }

    fn plugin_mut(&mut self, plugin: &str) -> &mut PluginPolicy {
        self.plugins.entry(plugin.to_owned()).or_default()
    }

    /// Grants `fs-read:{mount}` to `plugin`, backed by `host_dir`.
    pub fn grant_fs_read(
        mut self,
        plugin: &str,
        mount: &str,
        host_dir: impl AsRef<Path>,
    ) -> Result<Self, PolicyError> {
        let m = check_mount("fs-read", mount).map_err(|message| self.invalid(message))?;
        let dir = self::host_dir(Path::new(""), host_dir.as_ref())
            .map_err(|message| self.invalid(message))?;
        self.plugin_mut(plugin).fs_read.insert(m, dir);
        Ok(self)
    }

    /// Grants `fs-write:{mount}` to `plugin`, backed by `host_dir`.
    pub fn grant_fs_write(
        mut self,
        plugin: &str,
        mount: &str,
        host_dir: impl AsRef<Path>,
    ) -> Result<Self, PolicyError> {
        let m = check_mount("fs-write", mount).map_err(|message| self.invalid(message))?;
        let dir = self::host_dir(Path::new(""), host_dir.as_ref())
            .map_err(|message| self.invalid(message))?;
        self.plugin_mut(plugin).fs_write.insert(m, dir);
        Ok(self)
    }

    /// Lets `plugin` reach `host` or `host:port` over HTTP.
    pub fn allow_http(mut self, plugin: &str, host: &str) -> Result<Self, PolicyError> {
        let allow = HttpAllow::parse(host).map_err(|message| self.invalid(message))?;
        self.plugin_mut(plugin).http.push(allow);
        Ok(self)
    }

    /// Grants what the policy says of `plugin` only to the component with
    /// this digest (repeat for several).
    pub fn pin_digest(mut self, plugin: &str, digest: &str) -> Result<Self, PolicyError> {
        let d = check_digest(digest).map_err(|message| self.invalid(message))?;
        self.plugin_mut(plugin).digests.push(d);
        Ok(self)
    }

    /// Turns `scratch` off for `plugin`.
    pub fn deny_scratch(mut self, plugin: &str) -> Self {
        self.plugin_mut(plugin).scratch = false;
        self
    }

    /// Overrides limits for `plugin`.
    pub fn limit(mut self, plugin: &str, limits: LimitOverrides) -> Self {
        self.plugin_mut(plugin).limits = limits;
        self
    }

    /// What the policy says of workflows and runs.
    pub fn runs(&self) -> &RunPolicy {
        &self.runs
    }

    /// Replaces what the policy says of workflows and runs (for policies
    /// built in code).
    pub fn with_runs(mut self, runs: RunPolicy) -> Self {
        self.runs = runs;
        self
    }

    /// Overrides limits for every plugin (per-plugin overrides still win).
    pub fn default_limits(mut self, limits: LimitOverrides) -> Self {
        self.defaults = limits;
        self
    }

    fn invalid(&self, message: String) -> PolicyError {
        PolicyError::Invalid {
            source_desc: self.source.to_string(),
            message,
        }
    }

    /// Where this policy came from.
    pub fn source(&self) -> &PolicySource {
        &self.source
    }

    /// What `plugin` is granted, if the policy names it.
    pub fn plugin(&self, plugin: &str) -> Option<&PluginPolicy> {
        self.plugins.get(plugin)
    }

    /// What the policy says of the component named `plugin` whose digest
    /// is `digest`: its entry, unless the entry is pinned to other digests.
    fn entry_for(&self, plugin: &str, digest: &str) -> Option<&PluginPolicy> {
        self.plugins
            .get(plugin)
            .filter(|p| p.digests.is_empty() || p.digests.iter().any(|d| d == digest))
    }

    /// The limits the component `plugin` with `digest` runs under: `base`,
    /// then the policy's defaults, then its own overrides.
    pub fn limits_for(&self, plugin: &str, digest: &str, base: CallLimits) -> CallLimits {
        let with_defaults = self.defaults.apply(base);
        match self.entry_for(plugin, digest) {
            Some(p) => p.limits.apply(with_defaults),
            None => with_defaults,
        }
    }

    /// Resolves each capability the component `plugin` with `digest`
    /// declares to a grant, or lists every one the policy does not grant.
    pub fn grant(
        &self,
        plugin: &str,
        digest: &str,
        declared: &[Capability],
    ) -> Result<Vec<Grant>, Vec<NotGranted>> {
        let default = PluginPolicy::default();
        let p = self.entry_for(plugin, digest).unwrap_or(&default);
        // The hint for a component whose name the policy pins to others.
        let pinned = self
            .plugins
            .get(plugin)
            .filter(|p| !p.digests.is_empty() && !p.digests.iter().any(|d| d == digest))
            .map(|p| {
                format!(
                    "[plugins.{plugin}] grants only the component(s) {}; this one is {digest} — add it to `digests` if it is to have the same grants",
                    p.digests.join(", ")
                )
            });
        let mut grants = Vec::new();
        let mut missing = Vec::new();
        for cap in declared {
            let grant = |host_dir: Option<PathBuf>, hosts: Vec<String>| Grant {
                capability: cap.clone(),
                host_dir,
                hosts,
            };
            match cap {
                Capability::FilesystemRead { mount } => match p.fs_read.get(mount) {
                    Some(dir) => grants.push(grant(Some(dir.clone()), Vec::new())),
                    None => missing.push(NotGranted {
                        capability: cap.clone(),
                        hint: format!(
                            "[plugins.{plugin}] fs-read = {{ \"{mount}\" = \"<host dir>\" }}"
                        ),
                    }),
                },
                Capability::FilesystemWrite { mount } => match p.fs_write.get(mount) {
                    Some(dir) => grants.push(grant(Some(dir.clone()), Vec::new())),
                    None => missing.push(NotGranted {
                        capability: cap.clone(),
                        hint: format!(
                            "[plugins.{plugin}] fs-write = {{ \"{mount}\" = \"<host dir>\" }}"
                        ),
                    }),
                },
                Capability::Scratch if p.scratch => grants.push(grant(None, Vec::new())),
                Capability::Scratch => missing.push(NotGranted {
                    capability: cap.clone(),
                    hint: format!("[plugins.{plugin}] scratch = true (it is turned off)"),
                }),
                Capability::Http if !p.http.is_empty() => {
                    grants.push(grant(
                        None,
                        p.http.iter().map(ToString::to_string).collect(),
                    ));
                }
                Capability::Http => missing.push(NotGranted {
                    capability: cap.clone(),
                    hint: format!("[plugins.{plugin}] http = [\"host[:port]\", ...]"),
                }),
            }
        }
        if missing.is_empty() {
            Ok(grants)
        } else {
            if let Some(hint) = pinned {
                for m in &mut missing {
                    m.hint.clone_from(&hint);
                }
            }
            Err(missing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::RunPolicy;

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(d.path().join("data")).expect("mkdir");
        std::fs::create_dir(d.path().join("out")).expect("mkdir");
        d
    }

    const TOML: &str = r#"
        [defaults.limits]
        timeout-ms = 2000

        [plugins.fs-read]
        fs-read = { "/data" = "data" }

        [plugins.ledger]
        fs-write = { "/ledger" = "out" }
        scratch = false
        limits = { memory-bytes = 1048576, fuel = 5 }

        [plugins.http-get]
        http = ["127.0.0.1:8080", "Example.com", "[::1]:9"]
    "#;

    fn cap(s: &str) -> Capability {
        s.parse().expect("capability")
    }

    const D1: &str = "b3:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "b3:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn grants_pinned_to_digests_go_to_those_components_only() {
        let d = dir();
        let text = format!(
            "[plugins.fs-read]\ndigests = [\"{D1}\"]\nfs-read = {{ \"/data\" = \"data\" }}\nlimits = {{ memory-bytes = 1024 }}\n"
        );
        let p = Policy::from_toml(&text, d.path(), PolicySource::Code).expect("policy");
        assert!(p.grant("fs-read", D1, &[cap("fs-read:/data")]).is_ok());
        let missing = p
            .grant("fs-read", D2, &[cap("fs-read:/data")])
            .expect_err("another component of the same name");
        assert!(
            missing[0].hint.contains("grants only") && missing[0].hint.contains(D2),
            "{}",
            missing[0].hint
        );
        // Its limits are not the pinned component's either; scratch is still everyone's.
        assert_eq!(
            p.limits_for("fs-read", D1, CallLimits::default())
                .memory_bytes,
            1024
        );
        assert_eq!(
            p.limits_for("fs-read", D2, CallLimits::default())
                .memory_bytes,
            CallLimits::default().memory_bytes
        );
        assert!(p.grant("fs-read", D2, &[Capability::Scratch]).is_ok());
        // In code too, and a digest must look like one.
        let p = Policy::in_code().pin_digest("x", D2).expect("pinned");
        assert_eq!(p.plugin("x").map(|e| e.digests.len()), Some(1));
        assert!(Policy::in_code().pin_digest("x", "b3:ABC").is_err());
        let bad = Policy::from_toml(
            "[plugins.x]\ndigests = [\"sha256:00\"]",
            d.path(),
            PolicySource::File("p.toml".into()),
        )
        .expect_err("bad digest")
        .to_string();
        assert!(
            bad.contains("[plugins.x]") && bad.contains("not a component digest"),
            "{bad}"
        );
    }

    #[test]
    fn parses_and_resolves_host_dirs_against_the_base() {
        let d = dir();
        let p = Policy::from_toml(TOML, d.path(), PolicySource::Code).expect("policy");
        let g = p
            .grant("fs-read", D1, &[cap("fs-read:/data"), Capability::Scratch])
            .expect("granted");
        assert_eq!(
            g[0].host_dir.as_deref(),
            Some(d.path().join("data").canonicalize().expect("c").as_path())
        );
        assert_eq!(g[1].capability, Capability::Scratch);
        let http = p.plugin("http-get").expect("named");
        assert_eq!(
            http.http[1],
            HttpAllow {
                host: "example.com".into(),
                port: None
            }
        );
        assert_eq!(
            http.http[2],
            HttpAllow {
                host: "[::1]".into(),
                port: Some(9)
            }
        );
    }

    #[test]
    fn grants_only_what_is_written_and_names_what_is_missing() {
        let d = dir();
        let p = Policy::from_toml(TOML, d.path(), PolicySource::Code).expect("policy");
        // fs-read is not fs-write, a mount is not another mount, scratch can be off.
        let missing = p
            .grant(
                "ledger",
                D1,
                &[
                    cap("fs-write:/ledger"),
                    cap("fs-read:/ledger"),
                    Capability::Scratch,
                    Capability::Http,
                ],
            )
            .expect_err("denied");
        let caps: Vec<String> = missing.iter().map(|m| m.capability.to_string()).collect();
        assert_eq!(caps, ["fs-read:/ledger", "scratch", "http"]);
        assert!(
            missing[0].hint.contains("[plugins.ledger] fs-read"),
            "{}",
            missing[0].hint
        );
        // A plugin the policy does not name gets scratch and nothing else.
        assert!(p.grant("unknown", D1, &[Capability::Scratch]).is_ok());
        assert!(p.grant("unknown", D1, &[Capability::Http]).is_err());
        assert!(
            Policy::new()
                .grant("x", D1, &[cap("fs-read:/data")])
                .is_err()
        );
    }

    #[test]
    fn limits_layer_base_then_defaults_then_plugin() {
        let d = dir();
        let p = Policy::from_toml(TOML, d.path(), PolicySource::Code).expect("policy");
        let l = p.limits_for("ledger", D1, CallLimits::default());
        assert_eq!(l.timeout, Duration::from_millis(2000));
        assert_eq!(l.memory_bytes, 1 << 20);
        assert_eq!(l.fuel, Some(5));
        let unmetered = p.limits_for(
            "ledger",
            D1,
            CallLimits {
                fuel: None,
                ..CallLimits::default()
            },
        );
        assert_eq!(unmetered.fuel, None);
        assert_eq!(
            p.limits_for("other", D1, CallLimits::default())
                .memory_bytes,
            CallLimits::default().memory_bytes
        );
    }

    #[test]
    fn bad_policies_say_where_and_why() {
        let d = dir();
        let cases = [
            (
                "[plugins.x]\nfs-read = { \"data\" = \"data\" }",
                "not a mount",
            ),
            ("[plugins.x]\nfs-read = { \"/d\" = \"missing\" }", "missing"),
            (
                "[plugins.x]\nhttp = [\"http://a/\"]",
                "not an HTTP allowlist entry",
            ),
            ("[plugins.x]\nnetwork = true", "unknown field"),
            ("[plugins.x]\nlimits = { timeout = 1 }", "unknown field"),
        ];
        for (text, why) in cases {
            let err = Policy::from_toml(text, d.path(), PolicySource::File("p.toml".into()))
                .expect_err(text)
                .to_string();
            assert!(err.contains(why), "{text}: {err}");
            assert!(err.contains("policy file p.toml"), "{err}");
        }
    }

    #[test]
    fn the_run_sections_read_into_the_run_policy() {
        let d = dir();
        let text = r#"
            [durability]
            work = "ephemeral"
            tail-events = 0
            tail-ms = 100

            [workflows]
            enabled = true
            enabled-ids = ["billing.refund", "ticket"]
            allow-custom-definitions = false
            allow-state-mutations = false

            [judgment]
            executors = ["human", "ai-collab"]
            profiles = ["default"]
            timeout-ms = 3600000
            on-timeout = { escalate = { executor = "human", profile = "default" } }

            [bounds]
            max-attempts = 5
            max-backoff-ms = 60000
            output-bytes = 1048576

            [retention]
            keep-finished-ms = 2592000000
        "#;
        let p = Policy::from_toml(text, d.path(), PolicySource::Code).expect("policy");
        let r = p.runs();
        assert_eq!(r.durability, DurabilityDefault::Ephemeral);
        assert_eq!(
            r.tail,
            UnwrittenTail {
                events: Some(0),
                ms: Some(100)
            }
        );
        assert!(!r.workflows.allow_custom_definitions && !r.workflows.allow_state_mutations);
        assert_eq!(r.workflows.refuses("ticket"), None);
        assert!(
            r.workflows
                .refuses("other")
                .is_some_and(|why| why.contains("enabled-ids")),
        );
        assert_eq!(r.judgment.executors.as_ref().map(|e| e.len()), Some(2));
        assert_eq!(r.judgment.timeout, Some(Duration::from_secs(3600)));
        assert_eq!(
            r.judgment.on_timeout,
            Some(JudgmentFallback::Escalate {
                executor: Some("human".into()),
                profile: Some("default".into())
            })
        );
        assert_eq!(r.bounds.max_attempts, Some(5));
        assert_eq!(r.bounds.output_bytes, Some(1 << 20));
        assert_eq!(
            r.retention.keep_finished,
            Some(Duration::from_secs(30 * 24 * 3600))
        );
        // The defaults change nothing.
        let empty = Policy::from_toml("", d.path(), PolicySource::Code).expect("empty");
        assert_eq!(empty.runs(), &RunPolicy::default());
        assert_eq!(empty.runs().workflows.refuses("anything"), None);
        let off = Policy::from_toml(
            "[workflows]\nenabled = false\n",
            d.path(),
            PolicySource::Code,
        )
        .expect("off");
        assert!(
            off.runs()
                .workflows
                .refuses("x")
                .is_some_and(|w| w.contains("enabled = false"))
        );
        let answer = Policy::from_toml(
            "[judgment]\non-timeout = { answer = { approved = false } }\n",
            d.path(),
            PolicySource::Code,
        )
        .expect("answer");
        assert_eq!(
            answer.runs().judgment.on_timeout,
            Some(JudgmentFallback::Answer(
                serde_json::json!({"approved": false})
            ))
        );
    }

    #[test]
    fn every_bad_value_of_the_run_sections_names_its_line() {
        let d = dir();
        let cases = [
            ("[durability]\nwork = \"sometimes\"\n", "line 2", "durable"),
            ("[durability]\n\ntail-ms = 0\n", "line 3", "tail-ms"),
            (
                "[workflows]\nenabled-ids = [\"ok\",\n  \"Not An Id\"]\n",
                "line 3",
                "not a workflow id",
            ),
            ("[workflows]\nenable = true\n", "line 2", "unknown field"),
            ("\n\n[judgment]\ntimeout-ms = 0\n", "line 4", "is 0"),
            (
                "[judgment]\non-timeout = \"retry\"\n",
                "line 2",
                "unknown variant",
            ),
            ("[bounds]\nmax-attempts = -1\n", "line 2", "max-attempts"),
            ("[bounds]\noutput-bytes = 0\n", "line 2", "is 0"),
            (
                "[retention]\n\nkeep-finished-ms = 0\n",
                "line 3",
                "keep-finished-ms",
            ),
            (
                "[retention]\nkeep-finished = \"30d\"\n",
                "line 2",
                "keep-finished",
            ),
            ("[bonds]\nmax-attempts = 2\n", "line 1", "unknown field"),
        ];
        for (text, line, why) in cases {
            let err = Policy::from_toml(text, d.path(), PolicySource::File("p.toml".into()))
                .expect_err(text)
                .to_string();
            assert!(err.contains(line) && err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn http_allow_matches_host_and_port() {
        let a = HttpAllow::parse("Example.COM").expect("entry");
        assert!(a.allows("example.com", 443, 443));
        assert!(!a.allows("example.com", 8443, 443));
        let b = HttpAllow::parse("127.0.0.1:8080").expect("entry");
        assert!(b.allows("127.0.0.1", 8080, 80));
        assert!(!b.allows("127.0.0.1", 80, 80));
        assert!(!b.allows("127.0.0.2", 8080, 80));
        for bad in ["", "a/b", "u@h", "h:x", "[::1", ":80"] {
            assert!(HttpAllow::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn from_file_resolves_relative_to_the_file() {
        let d = dir();
        let path = d.path().join("policy.toml");
        std::fs::write(
            &path,
            "[plugins.fs-read]\nfs-read = { \"/data\" = \"./data\" }\n",
        )
        .expect("write");
        let p = Policy::from_file(&path).expect("policy");
        assert!(matches!(p.source(), PolicySource::File(f) if f.ends_with("policy.toml")));
        assert!(p.grant("fs-read", D1, &[cap("fs-read:/data")]).is_ok());
        let missing = Policy::from_file(d.path().join("nope.toml")).expect_err("missing");
        assert!(matches!(missing, PolicyError::Read { .. }));
    }
}
