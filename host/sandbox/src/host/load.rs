//! Loading a component: compile it (or read the compile cache), check its
//! imports against the capabilities it declares and those against the
//! policy, call `describe`, and register it — or withhold it, naming the
//! grant it lacks.

use std::borrow::Cow;
use std::sync::PoisonError;
use std::time::Instant;

use poimen_workflow::{Capability, EffectClass, ToolInfo, shadow_eligibility};
use serde_json::Value;
use wasmtime::component::Component;

use super::PluginHost;
use super::call::Inspection;
use super::guest::{GuestCall, Returned};
use super::invoke::canonical;
use crate::bindings::{self, Descriptor, ToolPre, VerifierPre};
use crate::engine;
use crate::error::{InvokeError, LoadError};
use crate::imports::{self, Import};
use crate::record::{CallKind, ComponentIdentity, HostcallRecord, Outcome, WIT_PACKAGE, b3};
use crate::registry::{Loaded, PluginKind, Pre};
use crate::schema::OutputSchema;
use crate::state;

/// A registry name: lowercase letters, digits and `-`, starting with a
/// letter or digit.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

fn descriptor_info(origin: &str, d: Descriptor, digest: &str) -> Result<ToolInfo, LoadError> {
    let bad = |field: &'static str, message: String| LoadError::BadDescriptor {
        origin: origin.to_owned(),
        field,
        message,
    };
    if !valid_name(&d.name) {
        return Err(bad(
            "name",
            format!("`{}` is not lowercase letters, digits and `-`", d.name),
        ));
    }
    let version = semver::Version::parse(&d.version)
        .map_err(|e| bad("version", format!("`{}`: {e}", d.version)))?;
    let schema = |field: &'static str, text: &str| -> Result<Value, LoadError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| bad(field, format!("not JSON: {e}")))?;
        if v.is_object() || v.is_boolean() {
            Ok(v)
        } else {
            Err(bad(field, "a JSON Schema is an object or a boolean".into()))
        }
    };
    let capabilities = d
        .capabilities
        .iter()
        .map(|c| {
            c.parse::<Capability>()
                .map_err(|e| bad("capabilities", e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ToolInfo {
        name: d.name,
        version,
        digest: digest.to_owned(),
        description: d.description,
        input_schema: schema("input-schema", &d.input_schema)?,
        output_schema: schema("output-schema", &d.output_schema)?,
        capabilities,
        effect: match d.effect {
            bindings::EffectClass::Pure => EffectClass::Pure,
            bindings::EffectClass::Idempotent => EffectClass::Idempotent,
            bindings::EffectClass::NonIdempotent => EffectClass::NonIdempotent,
        },
        max_timeout_ms: None,
        workflow: None,
    })
}

/// Compiles a declared output schema once, for every call to check against;
/// one that does not compile (`{"type": 12}`, an external `$ref`) refuses
/// the component.
fn compile_output_schema(origin: &str, schema: &Value) -> Result<OutputSchema, LoadError> {
    OutputSchema::compile(schema).map_err(|e| LoadError::BadDescriptor {
        origin: origin.to_owned(),
        field: "output-schema",
        message: format!("not a JSON Schema this host can check outputs against: {e}"),
    })
}

/// A component compiled and checked up to (not including) policy.
pub(super) struct Checked {
    kind: PluginKind,
    info: ToolInfo,
    pre: Pre,
    imports: Vec<Import>,
    cache: engine::CacheOutcome,
    /// What the compile cache keeps once the component is accepted.
    compiled: (Component, String),
    describe_record: HostcallRecord,
    /// Whether the description came from the cache (`describe` not run).
    describe_cached: bool,
    /// What the cache keeps of a description made now, once accepted.
    described: Option<Vec<u8>>,
    output_schema: OutputSchema,
}

/// A component on its way to the registry (see `PluginHost::prepare`).
pub(super) enum Prepared {
    /// Compiled, checked and described, or why not.
    Checked(Result<Box<Checked>, LoadError>),
    /// Its kept description says the policy denies it: withheld again
    /// unless its name is reserved against it meanwhile (then checked).
    DeniedBefore {
        digest_hex: String,
        bytes: Cow<'static, [u8]>,
        info: Box<ToolInfo>,
        kind: PluginKind,
    },
}

/// What a component's `describe` returned, as the compile cache keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Described {
    info: ToolInfo,
    record: HostcallRecord,
    /// Which world it exports (absent in files written before it was
    /// kept: such a file never short-cuts a load).
    #[serde(default)]
    kind: Option<PluginKind>,
}

impl PluginHost {
    /// Compiles (or reads from the cache), checks imports, calls `describe`.
    async fn check(
        &self,
        origin: &str,
        bytes: Cow<'static, [u8]>,
        digest_hex: String,
    ) -> Result<Checked, LoadError> {
        let digest = format!("b3:{digest_hex}");
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let hex = digest_hex.clone();
        let compiled = tokio::task::spawn_blocking(move || cache.load(&engine, &bytes, &hex)).await;
        let (component, cache) = match compiled {
            Ok(r) => r.map_err(|message| LoadError::Compile {
                origin: origin.to_owned(),
                message,
            })?,
            Err(e) => {
                return Err(LoadError::Compile {
                    origin: origin.to_owned(),
                    message: e.to_string(),
                });
            }
        };
        if cache != engine::CacheOutcome::Hit {
            self.inner
                .compiles
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut imports = imports::of_component(&component, &self.inner.engine);
        if let Some(unknown) = imports::unknown(&imports) {
            return Err(LoadError::UnknownImport {
                origin: origin.to_owned(),
                import: unknown.name.clone(),
            });
        }
        let (kind, pre) = self.prelink(origin, &component)?;
        let cached = match cache {
            engine::CacheOutcome::Hit => self
                .inner
                .cache
                .described(&digest_hex)
                .and_then(|bytes| serde_json::from_slice::<Described>(&bytes).ok())
                .filter(|d| d.info.digest == digest),
            _ => None,
        };
        let (info, record, described) = match cached {
            Some(Described {
                info, mut record, ..
            }) => {
                record.requested = origin.to_owned();
                (info, record, None)
            }
            None => {
                let (info, record) = self.describe(origin, &pre, &digest).await?;
                let keep = serde_json::to_vec(&Described {
                    info: info.clone(),
                    record: record.clone(),
                    kind: Some(kind),
                })
                .ok();
                (info, record, keep)
            }
        };
        let output_schema = compile_output_schema(origin, &info.output_schema)?;
        // What the declared capabilities cover is served through them; any
        // other filesystem or HTTP import stays linked with nothing granted.
        imports::settle(&mut imports, &info.capabilities);
        Ok(Checked {
            kind,
            info,
            pre,
            imports,
            cache,
            compiled: (component, digest_hex),
            describe_record: record,
            describe_cached: described.is_none(),
            described,
            output_schema,
        })
    }

    /// Calls the component's `describe`, under the policy's default limits
    /// and no grants, and reads what it returned.
    async fn describe(
        &self,
        origin: &str,
        pre: &Pre,
        digest: &str,
    ) -> Result<(ToolInfo, HostcallRecord), LoadError> {
        let limits = self
            .inner
            .policy
            .limits_for("", digest, self.inner.base_limits);
        let started = Instant::now();
        let mut record = Self::record(
            CallKind::Describe,
            origin.to_owned(),
            "null".to_owned(),
            None,
            limits,
        );
        let run = self
            .run_guest(
                pre,
                &[],
                limits,
                &state::seed(digest, &record.args_hash),
                GuestCall::Describe,
            )
            .await;
        let result = self.fill(&mut record, run, origin, started);
        let descriptor = match result {
            Ok(Returned::Described(d)) => d,
            Ok(_) => {
                return Err(LoadError::Describe {
                    origin: origin.to_owned(),
                    error: Box::new(InvokeError::Host("unexpected return".into())),
                });
            }
            Err(error) => {
                return Err(LoadError::Describe {
                    origin: origin.to_owned(),
                    error: Box::new(error),
                });
            }
        };
        let info = descriptor_info(origin, descriptor, digest)?;
        record.tool = Some(ComponentIdentity {
            name: info.name.clone(),
            version: info.version.to_string(),
            digest: digest.to_owned(),
            wit_package: WIT_PACKAGE.to_owned(),
        });
        let described = serde_json::to_value(&info).map_err(|e| LoadError::BadDescriptor {
            origin: origin.to_owned(),
            field: "descriptor",
            message: format!("cannot be encoded as JSON: {e}"),
        })?;
        let text = canonical(&described).unwrap_or_default();
        record.outcome = Outcome::Ok {
            output_hash: b3(text.as_bytes()),
            output_bytes: text.len() as u64,
        };
        Ok((info, record))
    }

    /// Writes an accepted component's compiled form and description to the
    /// cache (off the async threads: a language runtime's compiled form is
    /// tens of megabytes).
    async fn keep_compiled(
        &self,
        compiled: (Component, String),
        outcome: engine::CacheOutcome,
        described: Option<Vec<u8>>,
    ) {
        if outcome == engine::CacheOutcome::Disabled
            || (outcome == engine::CacheOutcome::Hit && described.is_none())
        {
            return;
        }
        let cache = self.inner.cache.clone();
        let _ = tokio::task::spawn_blocking(move || {
            cache.keep(&compiled.0, &compiled.1, outcome);
            if let Some(d) = described {
                cache.keep_described(&compiled.1, &d);
            }
        })
        .await;
    }

    fn prelink(&self, origin: &str, component: &Component) -> Result<(PluginKind, Pre), LoadError> {
        let engine = &self.inner.engine;
        let ty = component.component_type();
        let exports: Vec<&str> = ty.exports(engine).map(|(n, _)| n).collect();
        let kind = match (exports.contains(&"invoke"), exports.contains(&"verify")) {
            (true, false) => PluginKind::Tool,
            (false, true) => PluginKind::Verifier,
            _ => {
                return Err(LoadError::NotAPlugin {
                    origin: origin.to_owned(),
                    reason: format!(
                        "it exports {exports:?}; a tool exports `describe` and `invoke`, a verifier `describe` and `verify`"
                    ),
                });
            }
        };
        let pre = self
            .inner
            .linker
            .instantiate_pre(component)
            .map_err(|e| LoadError::Compile {
                origin: origin.to_owned(),
                message: format!("cannot link: {e:#}"),
            })?;
        let not_a_plugin = |e: wasmtime::Error| LoadError::NotAPlugin {
            origin: origin.to_owned(),
            reason: format!("{e:#}"),
        };
        let pre = match kind {
            PluginKind::Tool => Pre::Tool(ToolPre::new(pre).map_err(not_a_plugin)?),
            PluginKind::Verifier => Pre::Verifier(VerifierPre::new(pre).map_err(not_a_plugin)?),
        };
        Ok((kind, pre))
    }

    /// Loads one component into the registries: compiles it (or reads the
    /// cache), checks its imports against its declared capabilities and
    /// those against policy, and registers it. A running host takes it as
    /// one being built does: the same checks, the same refusals.
    pub async fn load_component(
        &self,
        origin: impl Into<String>,
        bytes: impl Into<Vec<u8>>,
    ) -> Result<crate::registry::Entry, LoadError> {
        self.load_inner(origin.into(), Cow::Owned(bytes.into()), false, false)
            .await
            .map(|(entry, _)| entry)
    }

    /// Loads a component in place of every loaded one of the same kind and
    /// name, checked as [`load_component`](Self::load_component) checks. The
    /// replaced ones are retired, not dropped: a call that pins one's digest
    /// (a run that started on it) is still served by it, while every new
    /// resolution finds the replacement. [`LoadError::NotLoaded`] if there
    /// is nothing of that name to replace (load it instead).
    pub async fn replace_component(
        &self,
        origin: impl Into<String>,
        bytes: impl Into<Vec<u8>>,
    ) -> Result<crate::registry::Replacement, LoadError> {
        let (loaded, retired) = self
            .load_inner(origin.into(), Cow::Owned(bytes.into()), false, true)
            .await?;
        Ok(crate::registry::Replacement { loaded, retired })
    }

    /// Unloads every version of the component `name` (or only `version`),
    /// retired ones included: a call that reaches it afterwards — a run
    /// that pinned it — fails, naming it. Returns what was unloaded;
    /// [`LoadError::NotLoaded`] if nothing matched.
    pub fn remove_component(
        &self,
        name: &str,
        version: Option<&semver::Version>,
    ) -> Result<Vec<crate::registry::Entry>, LoadError> {
        let mut registry = self
            .inner
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let removed = registry.remove(name, version);
        if removed.is_empty() {
            return Err(LoadError::NotLoaded {
                name: name.to_owned(),
                version: version.map(ToString::to_string),
                loaded: registry.names(),
            });
        }
        Ok(removed)
    }

    /// The refusal of `component` for the first capability the policy
    /// does not grant it.
    fn denied(
        &self,
        component: &str,
        origin: &str,
        missing: &[poimen_policy::NotGranted],
    ) -> LoadError {
        let (capability, hint) = match missing.first() {
            Some(first) => (first.capability.to_string(), first.hint.clone()),
            None => ("(unnamed)".to_owned(), String::new()),
        };
        LoadError::CapabilityDenied {
            component: component.to_owned(),
            origin: origin.to_owned(),
            capability,
            policy: self.inner.policy.source().to_string(),
            hint,
        }
    }

    /// A component this host withheld before, withheld again from its
    /// kept description without compiling it or running its `describe`
    /// (a start pays nothing for the bundled components its policy does
    /// not grant), from the description [`prepare`](Self::prepare) found
    /// kept in the cache (authenticated, written by this installation,
    /// naming this digest and its world). `None` — take the full path —
    /// unless its name is not reserved against it and the policy still
    /// denies it.
    fn withheld_as_before(
        &self,
        origin: &str,
        info: ToolInfo,
        kind: PluginKind,
    ) -> Option<LoadError> {
        let mut registry = self
            .inner
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if registry
            .reserved_against(&info.name, &info.digest)
            .is_some()
        {
            return None;
        }
        let policy = &self.inner.policy;
        let missing = policy
            .grant(&info.name, &info.digest, &info.capabilities)
            .err()?;
        let denied = self.denied(&info.name, origin, &missing);
        registry.withhold(crate::registry::WithheldEntry {
            info,
            kind,
            origin: origin.to_owned(),
            reason: denied.to_string(),
        });
        Some(denied)
    }

    /// A component's description as this installation kept it, if it names
    /// this digest and its world.
    fn kept_description(&self, digest_hex: &str) -> Option<(ToolInfo, PluginKind)> {
        let kept = self.inner.cache.described(digest_hex)?;
        let Described { info, kind, .. } = serde_json::from_slice::<Described>(&kept).ok()?;
        let kind = kind?;
        if info.digest != format!("b3:{digest_hex}") {
            return None;
        }
        Some((info, kind))
    }

    /// Loads a component. With `withhold`, one denied a capability is also
    /// recorded as withheld; the denial is returned either way. With
    /// `replace`, it takes the place of the loaded ones of its kind and
    /// name, which are returned (retired).
    pub(super) async fn load_inner(
        &self,
        origin: String,
        bytes: Cow<'static, [u8]>,
        withhold: bool,
        replace: bool,
    ) -> Result<(crate::registry::Entry, Vec<crate::registry::Entry>), LoadError> {
        let prepared = self.prepare(&origin, bytes, withhold && !replace).await;
        self.register(origin, prepared, withhold, replace).await
    }

    /// What loading a component does before it meets the registry: its
    /// digest, then compiled (or read from the cache), checked and
    /// described — unless, with `withhold`, its kept description says the
    /// policy denies it (then [`register`](Self::register) withholds it
    /// again without compiling it). Touches no registry: the components of
    /// one start are prepared at once, and registered in their order.
    pub(super) async fn prepare(
        &self,
        origin: &str,
        bytes: Cow<'static, [u8]>,
        withhold: bool,
    ) -> Prepared {
        let digest_hex = blake3::hash(&bytes).to_hex().to_string();
        if withhold
            && let Some((info, kind)) = self.kept_description(&digest_hex)
            && self
                .inner
                .policy
                .grant(&info.name, &info.digest, &info.capabilities)
                .is_err()
        {
            return Prepared::DeniedBefore {
                digest_hex,
                bytes,
                info: Box::new(info),
                kind,
            };
        }
        Prepared::Checked(self.check(origin, bytes, digest_hex).await.map(Box::new))
    }

    /// Registers a prepared component (see [`load_inner`](Self::load_inner)).
    pub(super) async fn register(
        &self,
        origin: String,
        prepared: Prepared,
        withhold: bool,
        replace: bool,
    ) -> Result<(crate::registry::Entry, Vec<crate::registry::Entry>), LoadError> {
        let c = match prepared {
            Prepared::Checked(c) => *c?,
            Prepared::DeniedBefore {
                digest_hex,
                bytes,
                info,
                kind,
            } => {
                if let Some(denied) = self.withheld_as_before(&origin, *info, kind) {
                    return Err(denied);
                }
                // Its name is reserved against it now: the full path says
                // why.
                self.check(&origin, bytes, digest_hex).await?
            }
        };
        let reserved = {
            let registry = self
                .inner
                .registry
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            // The name's owner may replace its own component.
            if replace && registry.has(c.kind, &c.info.name) {
                None
            } else {
                registry.reserved_against(&c.info.name, &c.info.digest)
            }
        };
        if let Some(owner) = reserved {
            return Err(LoadError::ReservedName {
                name: c.info.name,
                origin,
                owner,
            });
        }
        let policy = &self.inner.policy;
        let grants = match policy.grant(&c.info.name, &c.info.digest, &c.info.capabilities) {
            Ok(grants) => grants,
            Err(missing) => {
                let denied = self.denied(&c.info.name, &origin, &missing);
                if !withhold {
                    return Err(denied);
                }
                // Its description is kept (not its compiled form): the
                // next start withholds it again without compiling it, as
                // long as the policy still denies it.
                if let Some(d) = &c.described {
                    self.inner.cache.keep_described(&c.compiled.1, d);
                }
                let entry = crate::registry::WithheldEntry {
                    info: c.info,
                    kind: c.kind,
                    origin,
                    reason: denied.to_string(),
                };
                self.inner
                    .registry
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .withhold(entry);
                return Err(denied);
            }
        };
        let limits = policy.limits_for(&c.info.name, &c.info.digest, self.inner.base_limits);
        let identity = ComponentIdentity {
            name: c.info.name.clone(),
            version: c.info.version.to_string(),
            digest: c.info.digest.clone(),
            wit_package: WIT_PACKAGE.to_owned(),
        };
        let loaded = Loaded {
            info: c.info,
            kind: c.kind,
            origin,
            identity,
            pre: c.pre,
            imports: c.imports,
            grants,
            limits,
            cache: c.cache,
            describe_record: c.describe_record,
            describe_cached: c.describe_cached,
            output_schema: c.output_schema,
        };
        let (entry, retired) = {
            let mut registry = self
                .inner
                .registry
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            // Retired and replaced under one lock: no resolution ever finds
            // the name missing in between.
            let retired = if replace {
                let retired = registry.retire(loaded.kind, &loaded.info.name);
                if retired.is_empty() {
                    return Err(LoadError::NotLoaded {
                        name: loaded.info.name.clone(),
                        version: None,
                        loaded: registry.names(),
                    });
                }
                registry.transfer(&loaded.info.name, &loaded.origin);
                retired
            } else {
                Vec::new()
            };
            let entry = registry.insert(loaded).map(|l| l.entry())?;
            (entry, retired)
        };
        self.keep_compiled(c.compiled, entry.cache, c.described)
            .await;
        Ok((entry, retired))
    }

    /// Describes a component and lists its imports without registering it.
    pub async fn inspect(&self, bytes: impl Into<Vec<u8>>) -> Result<Inspection, LoadError> {
        let bytes: Vec<u8> = bytes.into();
        let digest_hex = blake3::hash(&bytes).to_hex().to_string();
        let c = self
            .check("inspected component", Cow::Owned(bytes), digest_hex)
            .await?;
        // One this host would load is compiled once: its next load hits the
        // cache. One it would refuse leaves nothing behind.
        if self
            .inner
            .policy
            .grant(&c.info.name, &c.info.digest, &c.info.capabilities)
            .is_ok()
        {
            self.keep_compiled(c.compiled, c.cache, c.described).await;
        }
        Ok(Inspection {
            kind: c.kind,
            eligibility: shadow_eligibility(&c.info.capabilities, c.info.effect),
            info: c.info,
            imports: c.imports,
        })
    }
}

/// Describes a component and lists its imports, on a throwaway host that
/// grants nothing (for `poimen plugin inspect`).
pub async fn inspect(bytes: impl Into<Vec<u8>>) -> Result<Inspection, LoadError> {
    let host = PluginHost::builder()
        .pooling(false)
        .build()
        .await
        .map_err(|e| LoadError::Compile {
            origin: "inspected component".into(),
            message: e.to_string(),
        })?;
    host.inspect(bytes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names() {
        assert!(valid_name("fs-read"));
        assert!(valid_name("adv-2"));
        assert!(!valid_name("Fs"));
        assert!(!valid_name("-x"));
        assert!(!valid_name(""));
    }

    #[test]
    fn an_output_schema_that_does_not_compile_refuses_the_component() {
        let descriptor = Descriptor {
            name: "bad-schema".into(),
            version: "0.1.0".into(),
            description: String::new(),
            input_schema: "{}".into(),
            output_schema: r#"{"type": 12}"#.into(),
            capabilities: Vec::new(),
            effect: bindings::EffectClass::Pure,
        };
        // `describe` lets it through: it is a JSON object.
        let info = descriptor_info("test:bad", descriptor, "b3:00").expect("described");
        match compile_output_schema("test:bad", &info.output_schema) {
            Err(LoadError::BadDescriptor {
                origin,
                field,
                message,
            }) => {
                assert_eq!((origin.as_str(), field), ("test:bad", "output-schema"));
                assert!(message.contains("12"), "{message}");
            }
            Err(e) => panic!("expected BadDescriptor, got {e:?}"),
            Ok(_) => panic!("an invalid schema compiled"),
        }
        for fine in [serde_json::json!(true), serde_json::json!({})] {
            assert!(matches!(
                compile_output_schema("x", &fine),
                Ok(OutputSchema::Any)
            ));
        }
    }
}
