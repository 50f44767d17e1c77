//! Turning a document path (`steps[3].retry`) back into a line and column.
//!
//! The document tree carries no spans (keeping it lean on the success path).
//! When an error is found at a path, the source is read once more by a
//! `DeserializeSeed` that walks down that path, ignoring everything else,
//! and fails on purpose at the target node; the format's own parser then
//! reports where it was, exactly as it would for a syntax error. Only the
//! error path pays for this.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Format, PathSeg};

/// Line and column (1-based) of the node at `path`, or of its key when
/// `at_key`; `None` when the path is not in the document.
pub(crate) fn locate(
    text: &str,
    format: Format,
    path: &[PathSeg],
    at_key: bool,
) -> Option<(usize, usize)> {
    let seed = Locate { path, at_key };
    match format {
        Format::Json => {
            let mut d = serde_json::Deserializer::from_str(text);
            match seed.deserialize(&mut d) {
                Ok(()) => None,
                Err(e) if e.line() > 0 => Some((e.line(), e.column().max(1))),
                Err(_) => None,
            }
        }
        Format::Yaml => match seed.deserialize(serde_norway::Deserializer::from_str(text)) {
            Ok(()) => None,
            Err(e) => e.location().map(|l| (l.line(), l.column())),
        },
    }
}

const HERE: &str = "located";

struct Locate<'p> {
    path: &'p [PathSeg],
    at_key: bool,
}

impl<'de> DeserializeSeed<'de> for Locate<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Locate<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.leaf()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.leaf()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.leaf()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.leaf()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.leaf()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(HERE));
        };
        let PathSeg::Index(want) = first else {
            return Ok(());
        };
        let mut i = 0usize;
        loop {
            if i == *want {
                return seq
                    .next_element_seed(Locate {
                        path: rest,
                        at_key: self.at_key,
                    })
                    .map(|_| ());
            }
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(HERE));
        };
        let PathSeg::Key(want) = first else {
            return Ok(());
        };
        let key_is_target = rest.is_empty() && self.at_key;
        loop {
            let found = map.next_key_seed(KeyProbe {
                want,
                fail: key_is_target,
            })?;
            match found {
                None => return Ok(()),
                Some(true) => {
                    return map.next_value_seed(Locate {
                        path: rest,
                        at_key: self.at_key,
                    });
                }
                Some(false) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
    }
}

impl Locate<'_> {
    fn leaf<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(HERE))
        } else {
            Ok(())
        }
    }
}

/// Reads a key: is it the one wanted? With `fail`, finding it is the target.
struct KeyProbe<'w> {
    want: &'w str,
    fail: bool,
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyProbe<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<bool, E> {
        if s == self.want {
            if self.fail {
                Err(E::custom(HERE))
            } else {
                Ok(true)
            }
        } else {
            Ok(false)
        }
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<bool, A::Error> {
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<bool, A::Error> {
        Ok(false)
    }
}
