//! RFC 8785 JSON Canonicalization Scheme (JCS) primitives.
//!
//! Writes JSON text the way RFC 8785 prescribes: no insignificant
//! whitespace; object members sorted by the UTF-16 code units of their
//! names; strings escaped as ECMAScript's `JSON.stringify` does (only `"`,
//! `\` and control characters, with the short forms `\b \t \n \f \r` and
//! lower-case `\u00xx` otherwise); numbers as IEEE-754 doubles printed by
//! ECMAScript's `Number.prototype.toString` (shortest round-trip digits).
//!
//! This module knows JSON only; what is written, and which fields are
//! dropped, is the business of the canonicalizer in the parent module.
//! It is written here rather than taken from `serde_json_canonicalizer`
//! (which the tests use as an oracle) because that crate re-parses every
//! key to sort it, which is an order of magnitude too slow for large
//! workflows.

use std::cmp::Ordering;

use serde_json::{Number, Value};

/// 2^53: every integer of magnitude up to this is exactly a double.
pub(crate) const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// Orders two strings by their UTF-16 code units, as RFC 8785 §3.2.3 orders
/// object member names.
pub(crate) fn cmp_utf16(a: &str, b: &str) -> Ordering {
    // UTF-8 byte order is code point order, which is UTF-16 order except
    // between a supplementary character (4-byte UTF-8, lead byte F0-F4;
    // surrogates D800-DFFF in UTF-16) and one in E000-FFFF (lead byte EE
    // or EF). Equal prefixes keep character boundaries aligned, so such a
    // pair can only differ at a lead byte: swap the order there.
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) => {
            let (p, q) = (x[i], y[i]);
            let bmp_high = |c: u8| c == 0xEE || c == 0xEF;
            let supplementary = |c: u8| c >= 0xF0;
            if (bmp_high(p) && supplementary(q)) || (supplementary(p) && bmp_high(q)) {
                q.cmp(&p)
            } else {
                p.cmp(&q)
            }
        }
    }
}

/// Bytes a JSON string must escape: control characters, `"` and `\`.
const NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Writes `s` as a JSON string.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !NEEDS_ESCAPE[usize::from(b)] {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x0d => out.extend_from_slice(b"\\r"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Writes a double as ECMAScript prints it. Non-finite values have no JSON
/// form; they are written as `null` (as `serde_json` does), which the
/// validator rejects before any such workflow is published.
pub(crate) fn write_f64(out: &mut Vec<u8>, f: f64) {
    if !f.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    if f == f.trunc() && f.abs() < MAX_EXACT_INTEGER as f64 {
        // Integral and exact: ECMAScript prints the plain digits (and -0 as 0).
        write_i64(out, f as i64);
        return;
    }
    let mut buf = ryu_js::Buffer::new();
    out.extend_from_slice(buf.format_finite(f).as_bytes());
}

/// Writes an unsigned integer; above 2^53 it is written as the double it
/// rounds to, as JCS requires.
pub(crate) fn write_u64(out: &mut Vec<u8>, n: u64) {
    if n <= MAX_EXACT_INTEGER {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        let mut n = n;
        loop {
            i -= 1;
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        out.extend_from_slice(&buf[i..]);
    } else {
        write_f64(out, n as f64);
    }
}

/// Writes a signed integer (see [`write_u64`]).
pub(crate) fn write_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        if n.unsigned_abs() <= MAX_EXACT_INTEGER {
            out.push(b'-');
            write_u64(out, n.unsigned_abs());
        } else {
            write_f64(out, n as f64);
        }
    } else {
        write_u64(out, n.unsigned_abs());
    }
}

pub(crate) fn write_number(out: &mut Vec<u8>, n: &Number) {
    if let Some(u) = n.as_u64() {
        write_u64(out, u);
    } else if let Some(i) = n.as_i64() {
        write_i64(out, i);
    } else {
        write_f64(out, n.as_f64().unwrap_or(f64::NAN));
    }
}

/// Writes any JSON value canonically.
pub(crate) fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut obj = Obj::begin(out);
            for (k, v) in map {
                obj.field(k, |out| write_value(out, v));
            }
            obj.finish();
        }
    }
}

/// Writes one JSON object whose members may be added in any order, and
/// emits them sorted as RFC 8785 requires.
///
/// Members are written straight into the output (name, colon, value,
/// separating commas) on the assumption that they arrive sorted — the
/// encoder adds struct fields in order, and JSON maps iterate in an order
/// that is almost always the JCS order. Only when a member arrives out of
/// order is the object's text rearranged at [`Obj::finish`]; the result is
/// the same either way.
pub(crate) struct Obj<'o, 'k> {
    out: &'o mut Vec<u8>,
    /// Position just after the opening brace.
    start: usize,
    /// Name of the last member written.
    last: Option<&'k str>,
    sorted: bool,
}

#[cfg(test)]
thread_local! {
    /// Objects that had to be rearranged (the slow path), for tests.
    pub(crate) static UNSORTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl<'o, 'k> Obj<'o, 'k> {
    pub(crate) fn begin(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        let start = out.len();
        Obj {
            out,
            start,
            last: None,
            sorted: true,
        }
    }

    /// Adds a member whose value `write` appends to the buffer.
    pub(crate) fn field(&mut self, name: &'k str, write: impl FnOnce(&mut Vec<u8>)) {
        let _ = self.member(name, write);
    }

    /// Writes a member; returns where it starts (before any comma) and
    /// where its value starts.
    fn member(&mut self, name: &'k str, write: impl FnOnce(&mut Vec<u8>)) -> (usize, usize) {
        let before = self.out.len();
        if let Some(last) = self.last {
            if cmp_utf16(last, name) != Ordering::Less {
                self.sorted = false;
            }
            self.out.push(b',');
        }
        write_str(self.out, name);
        self.out.push(b':');
        let value = self.out.len();
        write(self.out);
        self.last = Some(name);
        (before, value)
    }

    pub(crate) fn str(&mut self, name: &'k str, value: &str) {
        self.field(name, |out| write_str(out, value));
    }

    pub(crate) fn u64(&mut self, name: &'k str, value: u64) {
        self.field(name, |out| write_u64(out, value));
    }

    pub(crate) fn value(&mut self, name: &'k str, value: &Value) {
        self.field(name, |out| write_value(out, value));
    }

    pub(crate) fn bool(&mut self, name: &'k str, value: bool) {
        self.field(name, |out| {
            out.extend_from_slice(if value { b"true" } else { b"false" })
        });
    }

    /// Adds a member whose value is an object, unless that object comes out
    /// empty (`{}`): an all-default nested object is itself a default.
    pub(crate) fn object_unless_empty(&mut self, name: &'k str, write: impl FnOnce(&mut Vec<u8>)) {
        let (was_sorted, was_last) = (self.sorted, self.last);
        let (before, value) = self.member(name, write);
        if &self.out[value..] == b"{}" {
            self.out.truncate(before);
            self.sorted = was_sorted;
            self.last = was_last;
        }
    }

    /// Closes the object, first putting its members in order if they were
    /// not written in order (the slow path: the object's text is split back
    /// into members and rearranged).
    pub(crate) fn finish(self) {
        if !self.sorted {
            #[cfg(test)]
            UNSORTED.with(|c| c.set(c.get() + 1));
            let text = self.out.split_off(self.start);
            let mut members: Vec<(String, &[u8])> = split_members(&text)
                .into_iter()
                .map(|(key, member)| {
                    (
                        serde_json::from_slice::<String>(key).unwrap_or_default(),
                        member,
                    )
                })
                .collect();
            members.sort_by(|a, b| cmp_utf16(&a.0, &b.0).then_with(|| a.1.cmp(b.1)));
            for (i, (_, m)) in members.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                self.out.extend_from_slice(m);
            }
        }
        self.out.push(b'}');
    }
}

/// Splits the inside of a JSON object we wrote (`"a":1,"b":[2,3]`) into its
/// members: (quoted name, whole member text).
fn split_members(text: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    let mut start = 0;
    let mut key_end = None;
    for (i, &b) in text.iter().enumerate() {
        if in_str {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    in_str = false;
                    if depth == 0 && key_end.is_none() {
                        key_end = Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                out.push((&text[start..key_end.unwrap_or(start)], &text[start..i]));
                start = i + 1;
                key_end = None;
            }
            _ => {}
        }
    }
    if start < text.len() {
        out.push((&text[start..key_end.unwrap_or(start)], &text[start..]));
    }
    out
}

/// Writes the elements of a JSON array that is a *set*: ordered by `cmp`
/// and, where `cmp` ties, by their canonical bytes. With `dedup`,
/// byte-identical elements are written once.
pub(crate) fn write_set<T>(
    out: &mut Vec<u8>,
    items: &[T],
    cmp: impl Fn(&T, &T) -> Ordering,
    dedup: bool,
    write: impl Fn(&mut Vec<u8>, &T),
) {
    let mut order: Vec<usize> = (0..items.len()).collect();
    // Ties are re-ordered below by their bytes, so stability is not needed.
    order.sort_unstable_by(|&a, &b| cmp(&items[a], &items[b]));
    out.push(b'[');
    let mut first = true;
    let mut i = 0;
    while i < order.len() {
        let mut j = i + 1;
        while j < order.len() && cmp(&items[order[i]], &items[order[j]]) == Ordering::Equal {
            j += 1;
        }
        if j == i + 1 {
            if !first {
                out.push(b',');
            }
            write(out, &items[order[i]]);
            first = false;
        } else {
            // Equal keys: order by the elements' canonical bytes.
            let mut group: Vec<Vec<u8>> = order[i..j]
                .iter()
                .map(|&k| {
                    let mut b = Vec::new();
                    write(&mut b, &items[k]);
                    b
                })
                .collect();
            group.sort();
            if dedup {
                group.dedup();
            }
            for b in group {
                if !first {
                    out.push(b',');
                }
                out.extend_from_slice(&b);
                first = false;
            }
        }
        i = j;
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jcs(v: &Value) -> String {
        let mut out = Vec::new();
        write_value(&mut out, v);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn rfc8785_examples() {
        // RFC 8785 §3.2.2.3 number examples.
        let cases: [(f64, &str); 8] = [
            (0.0, "0"),
            (-0.0, "0"),
            (1e21, "1e+21"),
            (1e-7, "1e-7"),
            (123456789012345680000.0, "123456789012345680000"),
            (0.000001, "0.000001"),
            (4.5, "4.5"),
            (-1.5e-10, "-1.5e-10"),
        ];
        for (f, want) in cases {
            let mut out = Vec::new();
            write_f64(&mut out, f);
            assert_eq!(String::from_utf8(out).expect("utf-8"), want, "{f}");
        }
        let v =
            serde_json::json!({"b": [1, "\u{1}\n\"é"], "a": null, "\u{e000}": 1, "\u{10000}": 2});
        assert_eq!(
            jcs(&v),
            "{\"a\":null,\"b\":[1,\"\\u0001\\n\\\"é\"],\"\u{10000}\":2,\"\u{e000}\":1}"
        );
    }

    #[test]
    fn members_out_of_order_are_rearranged() {
        let mut out = Vec::new();
        let mut o = Obj::begin(&mut out);
        o.str("b", "x,\"}");
        o.field("a", |out| {
            write_value(out, &serde_json::json!({"z": [1, {"y": ","}], "c": "\\"}))
        });
        o.str("a\"", "q");
        o.finish();
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            r#"{"a":{"c":"\\","z":[1,{"y":","}]},"a\"":"q","b":"x,\"}"}"#
        );
    }

    #[test]
    fn utf16_order_matches_encode_utf16() {
        let words = [
            "",
            "a",
            "ab",
            "b",
            "é",
            "\u{e000}",
            "\u{ffff}",
            "\u{10000}",
            "𝄞",
            "a\u{e000}",
            "a𝄞",
            "\u{7ff}",
            "\u{800}",
        ];
        for x in words {
            for y in words {
                assert_eq!(
                    cmp_utf16(x, y),
                    x.encode_utf16().cmp(y.encode_utf16()),
                    "{x:?} {y:?}"
                );
            }
        }
    }

    #[test]
    fn big_integers_are_written_as_the_double_they_round_to() {
        let mut out = Vec::new();
        write_u64(&mut out, u64::MAX);
        assert_eq!(out, b"18446744073709552000");
    }
}
