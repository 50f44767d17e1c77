//! Names of stored things: [`BlobHash`], [`RunId`], [`JudgmentId`].
//!
//! This module owns their text forms and parsing. It deliberately generates
//! nothing random: a run or judgment id is made from a [`Ulid`] the caller
//! produced (the store never reads the clock or a random source, so a
//! recorded run can be replayed against it).

use std::fmt;
use std::str::FromStr;

use ulid::Ulid;

/// Text prefix of every content hash the store shows.
pub const HASH_PREFIX: &str = "b3:";

/// The Blake3 hash of a blob's bytes, shown `b3:` + 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlobHash([u8; 32]);

impl BlobHash {
    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        BlobHash(*blake3::hash(bytes).as_bytes())
    }

    /// From the raw 32 bytes of a Blake3 hash.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        BlobHash(bytes)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, without the `b3:` prefix.
    pub fn hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{HASH_PREFIX}{}", self.hex())
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobHash({self})")
    }
}

impl FromStr for BlobHash {
    type Err = IdParseError;
    fn from_str(s: &str) -> Result<Self, IdParseError> {
        let err = || IdParseError {
            what: "blob hash",
            input: s.to_owned(),
            expected: "`b3:` followed by 64 lower-case hex digits",
        };
        let hex = s.strip_prefix(HASH_PREFIX).ok_or_else(err)?;
        if hex.len() != 64 || hex.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(err());
        }
        blake3::Hash::from_hex(hex)
            .map(|h| BlobHash(*h.as_bytes()))
            .map_err(|_| err())
    }
}

/// Why a text is not an id or a hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdParseError {
    /// What was expected (`run id`, `blob hash`, ...).
    pub what: &'static str,
    /// The text given.
    pub input: String,
    /// The form the text must have.
    pub expected: &'static str,
}

impl fmt::Display for IdParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a {}: expected {}",
            self.input, self.what, self.expected
        )
    }
}

impl std::error::Error for IdParseError {}

macro_rules! ulid_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The text every id of this kind starts with.
            pub const PREFIX: &'static str = $prefix;

            /// The id made from a ULID the caller generated. ULIDs sort by
            /// creation time, and so do these ids.
            pub fn generate(ulid: Ulid) -> Self {
                $name(format!("{}{}", $prefix, ulid))
            }

            /// Parses `PREFIX` + a 26-character ULID (Crockford base32, any case).
            pub fn parse(s: &str) -> Result<Self, IdParseError> {
                let err = || IdParseError {
                    what: $what,
                    input: s.to_owned(),
                    expected: concat!("`", $prefix, "` followed by a 26-character ULID"),
                };
                let rest = s.strip_prefix($prefix).ok_or_else(err)?;
                let ulid = Ulid::from_string(rest).map_err(|_| err())?;
                Ok(Self::generate(ulid))
            }

            /// The ULID inside the id.
            pub fn ulid(&self) -> Ulid {
                // The constructor only keeps well-formed ids.
                Ulid::from_string(&self.0[$prefix.len()..]).unwrap_or(Ulid::nil())
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;
            fn from_str(s: &str) -> Result<Self, IdParseError> {
                Self::parse(s)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

ulid_id!(
    /// A run: `WFR-` + a ULID. Duplicate-safe because the ULID carries 80
    /// random bits the caller drew; the store refuses a second, different run
    /// under an id it already holds.
    RunId,
    "WFR-",
    "run id"
);

ulid_id!(
    /// A judgment request: `WFJ-` + a ULID.
    JudgmentId,
    "WFJ-",
    "judgment id"
);

impl serde::Serialize for BlobHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for BlobHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Every blob hash (`b3:` and 64 lower-case hex digits) written in `text`,
/// as it is written: what retention takes as a reference from an event, an
/// intent record or a judgment. A string that merely looks like a hash
/// keeps a blob it names, which is the safe side.
pub(crate) fn hashes_in(text: &str) -> impl Iterator<Item = &str> + '_ {
    text.match_indices(HASH_PREFIX).filter_map(move |(at, _)| {
        let hash = text.get(at..at + HASH_PREFIX.len() + 64)?;
        hash[HASH_PREFIX.len()..]
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(hash)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_round_trip_and_normalize_case() {
        let id = RunId::generate(Ulid::from_parts(1_700_000_000_000, 42));
        assert!(id.as_str().starts_with("WFR-"));
        assert_eq!(RunId::parse(id.as_str()), Ok(id.clone()));
        assert_eq!(
            RunId::parse(&id.as_str().to_lowercase().replace("wfr-", "WFR-")),
            Ok(id.clone())
        );
        assert_eq!(id.ulid(), Ulid::from_parts(1_700_000_000_000, 42));
        for bad in [
            "",
            "WFR-",
            "WFR-123",
            "wfr-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "WFJ-01ARZ3NDEKTSV4RRFFQ69G5FAV",
        ] {
            assert!(RunId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn blob_hash_text_form() {
        let h = BlobHash::of(b"abc");
        let s = h.to_string();
        assert_eq!(s, format!("b3:{}", blake3::hash(b"abc").to_hex()));
        assert_eq!(s.parse::<BlobHash>(), Ok(h));
        assert!(s.to_uppercase().parse::<BlobHash>().is_err());
        assert!("b3:abc".parse::<BlobHash>().is_err());
    }

    #[test]
    fn hashes_in_text_are_found_whole() {
        let a = BlobHash::of(b"a").to_string();
        let b = BlobHash::of(b"b").to_string();
        let text = format!(
            r#"{{"prompt":"{a}","x":["{b}"],"short":"b3:abc","upper":"{}"}}"#,
            b.to_uppercase().replace("B3:", "b3:")
        );
        let found: Vec<&str> = hashes_in(&text).collect();
        assert_eq!(found, vec![a.as_str(), b.as_str()]);
        assert_eq!(hashes_in(&a[..20]).count(), 0);
    }
}
