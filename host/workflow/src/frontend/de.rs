//! A serde `Deserializer` over [`Node`] whose errors are typed.
//!
//! serde reports what went wrong through the error type's constructors
//! (`unknown_field`, `invalid_type`, `missing_field`, ...); with our own
//! error type those arrive as data — the field, the allowed names, the
//! expected and found types — instead of pre-formatted text, and each error
//! collects the path (`steps[3].retry.max_attempts`) on its way out, which
//! the front end turns into a line and column.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::node::Node;
use super::{ParseErrorKind, PathSeg, nearest};

/// A typed deserialization error and where in the document it happened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeError {
    pub(crate) kind: ParseErrorKind,
    /// Innermost segment first (segments are added while unwinding).
    pub(crate) rev_path: Vec<PathSeg>,
    /// The error is about a mapping key rather than a value.
    pub(crate) at_key: bool,
}

impl DeError {
    fn new(kind: ParseErrorKind) -> Self {
        DeError {
            kind,
            rev_path: Vec::new(),
            at_key: false,
        }
    }

    /// The path from the root.
    pub(crate) fn path(&self) -> Vec<PathSeg> {
        self.rev_path.iter().rev().cloned().collect()
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::new(ParseErrorKind::InvalidValue {
            message: msg.to_string(),
        })
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        DeError::new(ParseErrorKind::WrongType {
            expected: exp.to_string(),
            found: unexp.to_string(),
        })
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        DeError::new(ParseErrorKind::InvalidValue {
            message: format!("{unexp} is not {exp}"),
        })
    }

    fn invalid_length(len: usize, exp: &dyn de::Expected) -> Self {
        DeError::new(ParseErrorKind::InvalidValue {
            message: format!("{len} elements is not {exp}"),
        })
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        DeError::new(ParseErrorKind::UnknownVariant {
            variant: variant.to_owned(),
            allowed: expected.iter().map(|s| (*s).to_owned()).collect(),
            suggestion: nearest(variant, expected.iter().copied()),
        })
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let mut e = DeError::new(ParseErrorKind::UnknownField {
            field: field.to_owned(),
            allowed: expected.iter().map(|s| (*s).to_owned()).collect(),
            suggestion: nearest(field, expected.iter().copied()),
        });
        e.at_key = true;
        e.rev_path.push(PathSeg::Key(field.to_owned()));
        e
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::new(ParseErrorKind::MissingField {
            field: field.to_owned(),
        })
    }

    fn duplicate_field(field: &'static str) -> Self {
        let mut e = DeError::new(ParseErrorKind::DuplicateKey {
            key: field.to_owned(),
        });
        e.at_key = true;
        e
    }
}

impl Node<'_> {
    fn unexpected(&self) -> de::Unexpected<'_> {
        match self {
            Node::Null => de::Unexpected::Unit,
            Node::Bool(b) => de::Unexpected::Bool(*b),
            Node::Int(n) => de::Unexpected::Signed(*n),
            Node::UInt(n) => de::Unexpected::Unsigned(*n),
            Node::Float(f) => de::Unexpected::Float(*f),
            Node::Str(s) => de::Unexpected::Str(s),
            Node::Seq(_) => de::Unexpected::Seq,
            Node::Map(_) => de::Unexpected::Map,
        }
    }
}

impl<'de> de::Deserializer<'de> for Node<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self {
            Node::Null => v.visit_unit(),
            Node::Bool(b) => v.visit_bool(b),
            Node::Int(n) => v.visit_i64(n),
            Node::UInt(n) => v.visit_u64(n),
            Node::Float(f) => v.visit_f64(f),
            Node::Str(Cow::Borrowed(s)) => v.visit_borrowed_str(s),
            Node::Str(Cow::Owned(s)) => v.visit_string(s),
            Node::Seq(items) => {
                let mut seq = SeqDe {
                    items: items.into_iter(),
                    index: 0,
                };
                let value = v.visit_seq(&mut seq)?;
                if seq.items.len() > 0 {
                    return Err(de::Error::invalid_length(
                        seq.index + seq.items.len(),
                        &"fewer elements",
                    ));
                }
                Ok(value)
            }
            Node::Map(entries) => v.visit_map(MapDe {
                entries: entries.into_iter(),
                current: None,
                pending: None,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match self {
            Node::Null => v.visit_none(),
            other => v.visit_some(other),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        match self {
            Node::Str(s) => v.visit_enum(s.into_owned().into_deserializer()),
            // `{variant: value}`: a variant with data, one key.
            Node::Map(mut entries) if entries.len() == 1 => {
                let (variant, value) = entries.remove(0);
                let key = variant.to_string();
                v.visit_enum(EnumDe { variant, value }).map_err(|mut e| {
                    if !e.at_key {
                        e.rev_path.push(PathSeg::Key(key));
                    }
                    e
                })
            }
            Node::Map(entries) => Err(DeError::new(ParseErrorKind::InvalidValue {
                message: format!(
                    "a mapping of {} keys is not {}: write one key, the variant, with its value",
                    entries.len(),
                    &v as &dyn de::Expected
                ),
            })),
            other => Err(de::Error::invalid_type(other.unexpected(), &v)),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

/// An enum written `{variant: value}`.
struct EnumDe<'de> {
    variant: Cow<'de, str>,
    value: Node<'de>,
}

impl<'de> de::EnumAccess<'de> for EnumDe<'de> {
    type Error = DeError;
    type Variant = Node<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Node<'de>), DeError> {
        let variant = seed.deserialize(KeyDe(&self.variant)).map_err(|mut e| {
            e.at_key = true;
            e.rev_path.push(PathSeg::Key(self.variant.to_string()));
            e
        })?;
        Ok((variant, self.value))
    }
}

impl<'de> de::VariantAccess<'de> for Node<'de> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        match self {
            Node::Null => Ok(()),
            other => Err(de::Error::invalid_type(other.unexpected(), &"no value")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, v: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self, v)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_map(self, v)
    }
}

struct SeqDe<'de> {
    items: std::vec::IntoIter<Node<'de>>,
    index: usize,
}

impl<'de> SeqAccess<'de> for &mut SeqDe<'de> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(node) = self.items.next() else {
            return Ok(None);
        };
        let i = self.index;
        self.index += 1;
        seed.deserialize(node).map(Some).map_err(|mut e| {
            e.rev_path.push(PathSeg::Index(i));
            e
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapDe<'de> {
    entries: std::vec::IntoIter<(Cow<'de, str>, Node<'de>)>,
    /// The key whose value is read next (kept for error paths).
    current: Option<Cow<'de, str>>,
    pending: Option<Node<'de>>,
}

impl<'de> MapAccess<'de> for MapDe<'de> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((k, v)) = self.entries.next() else {
            return Ok(None);
        };
        let key = seed.deserialize(KeyDe(&k)).map_err(|mut e| {
            if !e.at_key {
                e.rev_path.push(PathSeg::Key(k.to_string()));
                e.at_key = true;
            }
            e
        })?;
        self.current = Some(k);
        self.pending = Some(v);
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let node = self.pending.take().unwrap_or(Node::Null);
        let key = self.current.take().unwrap_or_default();
        seed.deserialize(node).map_err(|mut e| {
            e.rev_path.push(PathSeg::Key(key.into_owned()));
            e
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// A mapping key, lent to whatever reads it (a struct's field name, or a
/// map's `String` key).
struct KeyDe<'a>(&'a str);

impl<'de> de::Deserializer<'de> for KeyDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_str(self.0)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_some(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_enum(self.0.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}
