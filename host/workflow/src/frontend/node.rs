//! The format-neutral document tree both front ends build first.
//!
//! YAML (through `serde_norway`) and JSON (through `serde_json`) are read
//! into a [`Node`] by one `DeserializeSeed`, which is where the format
//! quirks that the IR must never see are settled, each as a typed error:
//! duplicate keys (serde_json would silently keep the last one), alias
//! expansion beyond a bound (a "billion laughs" document is refused after a
//! bounded number of nodes, not expanded), nesting beyond a bound, YAML
//! tags and merge keys, non-string keys, and integers outside the range a
//! canonical JSON number represents exactly. The position of such an error
//! is the parser's own (the node being read when it was found).

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::ParseErrorKind;

/// One node of a parsed document. Maps keep document order (for error
/// positions); their keys are unique (checked while building).
/// Strings and keys borrow from the source text where the parser allows
/// (most of them, in JSON), so building the tree copies little.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node<'de> {
    Null,
    Bool(bool),
    /// A negative integer.
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    Float(f64),
    Str(Cow<'de, str>),
    Seq(Vec<Node<'de>>),
    Map(Vec<(Cow<'de, str>, Node<'de>)>),
}

/// Largest integer magnitude accepted in a document: 2^53 − 1, the largest
/// the canonical form (RFC 8785, numbers as doubles) represents exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Shared state of one build: the node budget and the first typed error.
pub(crate) struct Build {
    remaining_nodes: Cell<usize>,
    node_limit: usize,
    max_depth: usize,
    /// The typed error behind the `custom` error handed to the parser.
    pub(crate) error: RefCell<Option<ParseErrorKind>>,
}

impl Build {
    pub(crate) fn new(node_limit: usize, max_depth: usize) -> Self {
        Build {
            remaining_nodes: Cell::new(node_limit),
            node_limit,
            max_depth,
            error: RefCell::new(None),
        }
    }

    fn fail<E: de::Error>(&self, kind: ParseErrorKind) -> E {
        let msg = kind.to_string();
        let mut slot = self.error.borrow_mut();
        if slot.is_none() {
            *slot = Some(kind);
        }
        E::custom(msg)
    }

    fn count<E: de::Error>(&self) -> Result<(), E> {
        let left = self.remaining_nodes.get();
        if left == 0 {
            return Err(self.fail(ParseErrorKind::AliasExpansion {
                limit: self.node_limit,
            }));
        }
        self.remaining_nodes.set(left - 1);
        Ok(())
    }
}

/// Reads one node (and everything under it).
pub(crate) struct NodeSeed<'b> {
    pub(crate) build: &'b Build,
    pub(crate) depth: usize,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = Node<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Node<'de>, D::Error> {
        if self.depth > self.build.max_depth {
            return Err(self.build.fail(ParseErrorKind::TooDeep {
                limit: self.build.max_depth,
            }));
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node<'de>, E> {
        self.build.count()?;
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node<'de>, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Node<'de>, D::Error> {
        NodeSeed {
            build: self.build,
            depth: self.depth,
        }
        .deserialize(d)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Node<'de>, E> {
        self.build.count()?;
        Ok(Node::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Node<'de>, E> {
        self.build.count()?;
        if n.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(self.build.fail(ParseErrorKind::NumberOutOfRange {
                value: n.to_string(),
            }));
        }
        Ok(if n < 0 {
            Node::Int(n)
        } else {
            Node::UInt(n.unsigned_abs())
        })
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Node<'de>, E> {
        self.build.count()?;
        if n > MAX_SAFE_INTEGER {
            return Err(self.build.fail(ParseErrorKind::NumberOutOfRange {
                value: n.to_string(),
            }));
        }
        Ok(Node::UInt(n))
    }

    fn visit_i128<E: de::Error>(self, n: i128) -> Result<Node<'de>, E> {
        match i64::try_from(n) {
            Ok(n) => self.visit_i64(n),
            Err(_) => Err(self.build.fail(ParseErrorKind::NumberOutOfRange {
                value: n.to_string(),
            })),
        }
    }

    fn visit_u128<E: de::Error>(self, n: u128) -> Result<Node<'de>, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => Err(self.build.fail(ParseErrorKind::NumberOutOfRange {
                value: n.to_string(),
            })),
        }
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Node<'de>, E> {
        self.build.count()?;
        // Past 2^53 every double is an integer, and below 1e21 RFC 8785
        // writes it as one (`9007199254740992.5` is stored as
        // `9007199254740992`): an integer out of range, which reading the
        // canonical form back would refuse. Refused here, as an integer
        // that large would be.
        let integer_text = f.abs() > MAX_SAFE_INTEGER as f64 && f.abs() < 1e21;
        if !f.is_finite() || integer_text {
            return Err(self.build.fail(ParseErrorKind::NumberOutOfRange {
                value: f.to_string(),
            }));
        }
        Ok(Node::Float(f))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Node<'de>, E> {
        self.build.count()?;
        Ok(Node::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Node<'de>, E> {
        self.build.count()?;
        Ok(Node::Str(Cow::Borrowed(s)))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Node<'de>, E> {
        self.build.count()?;
        Ok(Node::Str(Cow::Owned(s)))
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node<'de>, E> {
        Err(self.build.fail(ParseErrorKind::UnsupportedYaml {
            what: "binary values".into(),
        }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        self.build.count()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(n) = seq.next_element_seed(NodeSeed {
            build: self.build,
            depth: self.depth + 1,
        })? {
            items.push(n);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        self.build.count()?;
        let mut entries: Vec<(Cow<'de, str>, Node<'de>)> =
            Vec::with_capacity(map.size_hint().unwrap_or(4).min(64));
        let mut seen: Option<HashSet<Cow<'de, str>>> = None;
        loop {
            let key = map.next_key_seed(KeySeed {
                build: self.build,
                entries: &entries,
                seen: &mut seen,
            })?;
            let Some(key) = key else { break };
            let value = map.next_value_seed(NodeSeed {
                build: self.build,
                depth: self.depth + 1,
            })?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Node<'de>, A::Error> {
        Err(self.build.fail(ParseErrorKind::UnsupportedYaml {
            what: "tags (`!name value`); write the plain value".into(),
        }))
    }
}

/// Reads a mapping key, refusing duplicates and non-string keys where the
/// key itself is read (so the error points at the duplicate).
struct KeySeed<'b, 'e, 'de> {
    build: &'b Build,
    entries: &'e [(Cow<'de, str>, Node<'de>)],
    /// Keys seen so far, once the map is large enough for a set to pay off.
    seen: &'e mut Option<HashSet<Cow<'de, str>>>,
}

/// Maps up to this many entries are checked for duplicates by a scan.
const SCAN_LIMIT: usize = 16;

impl<'de> KeySeed<'_, '_, 'de> {
    fn accept<E: de::Error>(self, key: Cow<'de, str>) -> Result<Cow<'de, str>, E> {
        if key == "<<" {
            return Err(self.build.fail(ParseErrorKind::UnsupportedYaml {
                what: "merge keys (`<<`); write the fields out".into(),
            }));
        }
        let dup = if self.entries.len() < SCAN_LIMIT {
            self.entries.iter().any(|(k, _)| *k == key)
        } else {
            let set = self
                .seen
                .get_or_insert_with(|| self.entries.iter().map(|(k, _)| k.clone()).collect());
            !set.insert(key.clone())
        };
        if dup {
            return Err(self.build.fail(ParseErrorKind::DuplicateKey {
                key: key.into_owned(),
            }));
        }
        Ok(key)
    }

    fn non_string<E: de::Error>(self, found: String) -> E {
        self.build.fail(ParseErrorKind::NonStringKey { found })
    }
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_, '_, 'de> {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_, '_, 'de> {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Cow<'de, str>, E> {
        self.build.count()?;
        self.accept(Cow::Owned(s.to_owned()))
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        self.build.count()?;
        self.accept(Cow::Borrowed(s))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Cow<'de, str>, E> {
        self.build.count()?;
        self.accept(Cow::Owned(s))
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Cow<'de, str>, E> {
        Err(self.non_string(format!("boolean `{b}`")))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Cow<'de, str>, E> {
        Err(self.non_string(format!("number `{n}`")))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Cow<'de, str>, E> {
        Err(self.non_string(format!("number `{n}`")))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Cow<'de, str>, E> {
        Err(self.non_string(format!("number `{n}`")))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Cow<'de, str>, E> {
        Err(self.non_string("null".into()))
    }

    fn visit_none<E: de::Error>(self) -> Result<Cow<'de, str>, E> {
        Err(self.non_string("null".into()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Cow<'de, str>, A::Error> {
        Err(self.non_string("a sequence".into()))
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Cow<'de, str>, A::Error> {
        Err(self.non_string("a mapping".into()))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Cow<'de, str>, A::Error> {
        Err(self.non_string("a tagged value".into()))
    }
}
