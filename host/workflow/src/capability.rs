//! The vocabulary a tool uses to describe what it may reach, and the pure
//! shadow-eligibility rule over it.
//!
//! Components declare [`Capability`]s and an [`EffectClass`]; the sandbox
//! checks the declaration against what the component actually imports and
//! what host policy grants. This module knows none of that: it holds the
//! shared words and the one rule that the validator needs at load.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Guest path of the per-invocation scratch directory.
pub const SCRATCH_MOUNT: &str = "/scratch";

/// Something a component may reach outside its own memory. Written
/// `fs-read:/data`, `fs-write:/out`, `scratch` or `http`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// Read files under a host directory mounted at this guest path.
    FilesystemRead { mount: String },
    /// Read and write files under a host directory mounted at this guest path.
    FilesystemWrite { mount: String },
    /// A fresh, empty, writable directory at [`SCRATCH_MOUNT`], discarded
    /// after the invocation.
    Scratch,
    /// Outbound HTTP(S) through `wasi:http`, to the hosts policy allows.
    Http,
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capability::FilesystemRead { mount } => write!(f, "fs-read:{mount}"),
            Capability::FilesystemWrite { mount } => write!(f, "fs-write:{mount}"),
            Capability::Scratch => f.write_str("scratch"),
            Capability::Http => f.write_str("http"),
        }
    }
}

/// Why a text is not a capability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a capability; write `fs-read:/path`, `fs-write:/path`, `scratch` or `http`")]
pub struct CapabilityParseError(pub String);

impl FromStr for Capability {
    type Err = CapabilityParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || CapabilityParseError(s.to_owned());
        let mount = |m: &str| -> Result<String, CapabilityParseError> {
            if m.starts_with('/') && !m.split('/').any(|c| c == "..") && m.len() > 1 {
                Ok(m.trim_end_matches('/').to_owned())
            } else {
                Err(bad())
            }
        };
        match s.split_once(':') {
            Some(("fs-read", m)) => Ok(Capability::FilesystemRead { mount: mount(m)? }),
            Some(("fs-write", m)) => Ok(Capability::FilesystemWrite { mount: mount(m)? }),
            None if s == "scratch" => Ok(Capability::Scratch),
            None if s == "http" => Ok(Capability::Http),
            _ => Err(bad()),
        }
    }
}

impl Serialize for Capability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Capability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What calling a tool twice with the same idempotency key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EffectClass {
    /// No effect outside the result: always safe to call again.
    Pure,
    /// An external effect that happens at most once per idempotency key.
    Idempotent,
    /// An external effect that happens again on every call.
    NonIdempotent,
}

impl fmt::Display for EffectClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EffectClass::Pure => "pure",
            EffectClass::Idempotent => "idempotent",
            EffectClass::NonIdempotent => "non-idempotent",
        })
    }
}

/// One reason a component may not run in shadow evaluation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Ineligibility {
    /// The capability reaches outside the sandbox (network, or writes outside scratch).
    Capability { capability: Capability },
    /// The effect class is non-idempotent.
    Effect { effect: EffectClass },
}

impl fmt::Display for Ineligibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ineligibility::Capability {
                capability: c @ Capability::Http,
            } => {
                write!(f, "capability `{c}` reaches the network")
            }
            Ineligibility::Capability { capability } => {
                write!(
                    f,
                    "capability `{capability}` writes outside the scratch directory"
                )
            }
            Ineligibility::Effect { effect } => {
                write!(f, "effect class `{effect}` cannot be repeated safely")
            }
        }
    }
}

/// Whether a component with these declared capabilities and this effect
/// class may run in shadow evaluation: nothing that reaches outside the
/// sandbox — no network, no writes outside a scratch directory, no
/// non-idempotent effect. Returns every reason when it may not.
pub fn shadow_eligibility(
    capabilities: &[Capability],
    effect: EffectClass,
) -> Result<(), Vec<Ineligibility>> {
    let mut why: Vec<Ineligibility> = capabilities
        .iter()
        .filter(|c| matches!(c, Capability::Http | Capability::FilesystemWrite { .. }))
        .map(|c| Ineligibility::Capability {
            capability: c.clone(),
        })
        .collect();
    if effect == EffectClass::NonIdempotent {
        why.push(Ineligibility::Effect { effect });
    }
    why.sort();
    why.dedup();
    if why.is_empty() { Ok(()) } else { Err(why) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_text_round_trips() {
        for s in ["fs-read:/data", "fs-write:/out/x", "scratch", "http"] {
            let c: Capability = s.parse().expect("parses");
            assert_eq!(c.to_string(), s);
        }
        for bad in [
            "fs-read:data",
            "fs-read:/a/../b",
            "net",
            "fs-write:",
            "fs-read:/",
        ] {
            assert_eq!(
                bad.parse::<Capability>(),
                Err(CapabilityParseError(bad.to_owned()))
            );
        }
    }

    #[test]
    fn eligibility_names_each_reason() {
        assert_eq!(
            shadow_eligibility(
                &["fs-read:/d".parse().expect("cap"), Capability::Scratch],
                EffectClass::Pure
            ),
            Ok(())
        );
        let why = shadow_eligibility(
            &[Capability::Http, "fs-write:/o".parse().expect("cap")],
            EffectClass::NonIdempotent,
        )
        .expect_err("ineligible");
        assert_eq!(why.len(), 3);
        assert!(why.contains(&Ineligibility::Effect {
            effect: EffectClass::NonIdempotent
        }));
        assert!(why.contains(&Ineligibility::Capability {
            capability: Capability::Http
        }));
    }
}
