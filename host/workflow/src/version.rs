//! `WorkflowVersion`: the Blake3 hash of a workflow's canonical bytes.
//!
//! Shown as `b3:` followed by 64 lower-case hex digits. This module owns the
//! type, its text form and prefix matching; it does not know how the bytes are
//! produced (that is `canonical`) or where versions are kept (crate `store`).

use std::fmt;
use std::str::FromStr;

/// Text prefix of a version.
pub const VERSION_PREFIX: &str = "b3:";

/// Shortest hex prefix accepted as an abbreviation of a version.
pub const MIN_VERSION_ABBREV: usize = 6;

/// The content hash naming one workflow version.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkflowVersion(pub [u8; 32]);

impl WorkflowVersion {
    /// The version of the given canonical bytes.
    pub fn of_canonical_bytes(bytes: &[u8]) -> Self {
        WorkflowVersion(*blake3::hash(bytes).as_bytes())
    }

    /// Lower-case hex, without the `b3:` prefix.
    pub fn hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// `b3:` and the first `n` hex digits, for display.
    pub fn short(&self, n: usize) -> String {
        let hex = self.hex();
        format!("{VERSION_PREFIX}{}", &hex[..n.min(hex.len())])
    }
}

impl fmt::Display for WorkflowVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION_PREFIX}{}", self.hex())
    }
}

impl fmt::Debug for WorkflowVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkflowVersion({self})")
    }
}

/// Why a text is not a version or a version prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionParseError {
    #[error("`{0}` is not a workflow version: expected `b3:` followed by 64 hex digits")]
    Malformed(String),
    #[error(
        "`{input}` is too short to name a version: give at least {MIN_VERSION_ABBREV} hex digits after `b3:`"
    )]
    TooShort { input: String },
}

impl FromStr for WorkflowVersion {
    type Err = VersionParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s
            .strip_prefix(VERSION_PREFIX)
            .ok_or_else(|| VersionParseError::Malformed(s.to_owned()))?;
        if hex.len() != 64 {
            return Err(VersionParseError::Malformed(s.to_owned()));
        }
        blake3::Hash::from_hex(hex)
            .map(|h| WorkflowVersion(*h.as_bytes()))
            .map_err(|_| VersionParseError::Malformed(s.to_owned()))
    }
}

impl serde::Serialize for WorkflowVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for WorkflowVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An abbreviated version as typed by a user: `b3:` (optional) and at least
/// [`MIN_VERSION_ABBREV`] lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VersionPrefix(String);

impl VersionPrefix {
    /// Parses a full version or an abbreviation of one.
    pub fn parse(s: &str) -> Result<Self, VersionParseError> {
        let hex = s
            .strip_prefix(VERSION_PREFIX)
            .unwrap_or(s)
            .to_ascii_lowercase();
        if hex.is_empty() || hex.len() > 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(VersionParseError::Malformed(s.to_owned()));
        }
        if hex.len() < MIN_VERSION_ABBREV {
            return Err(VersionParseError::TooShort {
                input: s.to_owned(),
            });
        }
        Ok(VersionPrefix(hex))
    }

    /// The hex digits.
    pub fn hex(&self) -> &str {
        &self.0
    }

    /// Whether `v` starts with this prefix.
    pub fn matches(&self, v: &WorkflowVersion) -> bool {
        v.hex().starts_with(&self.0)
    }

    /// The full version, when every digit was given.
    pub fn full(&self) -> Option<WorkflowVersion> {
        format!("{VERSION_PREFIX}{}", self.0).parse().ok()
    }
}

impl fmt::Display for VersionPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION_PREFIX}{}", self.0)
    }
}
