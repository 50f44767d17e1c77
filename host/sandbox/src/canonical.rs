//! RFC 8785 (JCS) canonical JSON text of a `serde_json::Value`, on the
//! invocation path.
//!
//! `serde_json_canonicalizer` produces the same text but re-parses every
//! object key and buffers every value, which cost several microseconds per
//! call on the benchmark's small arguments — a tenth of the whole boundary.
//! This writer walks the `Value` directly: keys sorted by UTF-16 code units,
//! strings escaped as serde_json does (which is what JCS prescribes),
//! integers within ±2^53 written as they are, and every other number handed
//! to `serde_json_canonicalizer` (ECMAScript number formatting). The tests
//! hold it to `serde_json_canonicalizer`'s output. Knows nothing of records.

use serde_json::Value;

/// The largest integer an IEEE double represents exactly, 2^53.
const SAFE_INTEGER: u64 = 1 << 53;

/// The canonical text of `v`.
pub(crate) fn to_string(v: &Value) -> Result<String, serde_json::Error> {
    let mut out = String::with_capacity(128);
    write(&mut out, v)?;
    Ok(out)
}

fn write(out: &mut String, v: &Value) -> Result<(), serde_json::Error> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) if u <= SAFE_INTEGER => push_display(out, u),
            (_, Some(i)) if i.unsigned_abs() <= SAFE_INTEGER => push_display(out, i),
            _ => out.push_str(&serde_json_canonicalizer::to_string(n)?),
        },
        Value::String(s) => write_str(out, s)?,
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, item)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k)?;
                out.push(':');
                write(out, v)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn push_display(out: &mut String, n: impl std::fmt::Display) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = write!(out, "{n}");
}

/// serde_json's string escaping is JCS's: `"` and `\`, the short forms
/// `\b \t \n \f \r`, `\u00xx` (lowercase) for other control characters,
/// everything else as is.
fn write_str(out: &mut String, s: &str) -> Result<(), serde_json::Error> {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
        return Ok(());
    }
    out.push_str(&serde_json::to_string(s)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn same(v: &Value) {
        let ours = to_string(v).expect("ours");
        let theirs = serde_json_canonicalizer::to_string(v).expect("theirs");
        assert_eq!(ours, theirs, "for {v}");
    }

    #[test]
    fn matches_serde_json_canonicalizer() {
        for v in [
            json!(null),
            json!([
                true,
                false,
                0,
                -0.0,
                1,
                -1,
                100.0,
                1e2,
                1.5,
                -2.25e-7,
                1e21,
                1e-7,
                123456789012.0
            ]),
            json!([
                9007199254740992_u64,
                9007199254740993_u64,
                u64::MAX,
                i64::MIN,
                -9007199254740992_i64,
                -9007199254740993_i64
            ]),
            json!({"b": 1, "a": {"z": [], "y": {}}, "": "empty key", "aa": null}),
            json!({"é": 1, "e": 2, "\u{10000}": 3, "\u{ffff}": 4, "Z": 5, "a\"b": 6}),
            json!([
                "\"quoted\"",
                "back\\slash",
                "\u{0}\u{1f}\u{7f}\n\t\r\u{8}\u{c}",
                "\u{2028}\u{2029}",
                "😀",
                "plain"
            ]),
            json!({"nested": [{"k": [1, {"b": 2, "a": 1}]}]}),
        ] {
            same(&v);
        }
    }

    #[test]
    fn matches_on_generated_values() {
        // A small deterministic generator: varied shapes, keys and numbers.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        fn generate(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            let keys = ["a", "B", "é", "ab", "\u{1F600}", "", "\n", "a\"", "z9"];
            match next() % if depth > 3 { 5 } else { 7 } {
                0 => Value::Null,
                1 => Value::Bool(next().is_multiple_of(2)),
                2 => json!(next() as i64 >> (next() % 64)),
                3 => json!(f64::from_bits(next()) % 1e6),
                4 => Value::String(keys[(next() % 9) as usize].repeat((next() % 3) as usize)),
                5 => Value::Array((0..next() % 4).map(|_| generate(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next() % 5)
                        .map(|_| {
                            (
                                keys[(next() % 9) as usize].to_owned(),
                                generate(next, depth + 1),
                            )
                        })
                        .collect(),
                ),
            }
        }
        for _ in 0..2000 {
            let v = generate(&mut next, 0);
            if serde_json_canonicalizer::to_string(&v).is_ok() {
                same(&v);
            }
        }
    }
}
