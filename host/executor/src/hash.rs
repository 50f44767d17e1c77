//! Content hashes of JSON values and bytes, as recorded in episodes,
//! intents and receipts: Blake3 over RFC 8785 canonical JSON, written
//! `b3:` + hex. One definition, so every record hashes the same way.

use serde_json::Value;

/// Canonical (RFC 8785) bytes of a JSON value.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    // A `serde_json::Value` always serializes; JCS only rejects non-finite
    // numbers, which `Value` cannot hold. Fall back to plain JSON rather than
    // panic if that ever changes.
    serde_json_canonicalizer::to_vec(value)
        .unwrap_or_else(|_| serde_json::to_vec(value).unwrap_or_default())
}

/// `b3:` + hex of the Blake3 hash of `bytes`.
pub fn hash_bytes(bytes: &[u8]) -> String {
    format!("b3:{}", blake3::hash(bytes).to_hex())
}

/// Hash of a JSON value's canonical form.
pub fn hash_json(value: &Value) -> String {
    hash_bytes(&canonical_json(value))
}

/// The idempotency key of a step execution: derived from (run, step,
/// iteration) — never from the attempt number or the clock, so every attempt
/// and every re-dispatch after a crash carries the same key.
pub fn idempotency_key(run: &str, step: &str, iteration: u32) -> String {
    let mut h = blake3::Hasher::new();
    for part in [run.as_bytes(), step.as_bytes(), &iteration.to_le_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    format!("ik-{}", &h.finalize().to_hex()[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ignores_nothing_but_attempt() {
        let a = idempotency_key("WFR-1", "fetch", 1);
        assert_eq!(a, idempotency_key("WFR-1", "fetch", 1));
        assert_ne!(a, idempotency_key("WFR-1", "fetch", 2));
        assert_ne!(a, idempotency_key("WFR-2", "fetch", 1));
        assert_ne!(a, idempotency_key("WFR-1", "fetcH", 1));
        // Length-prefixing keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(idempotency_key("ab", "c", 1), idempotency_key("a", "bc", 1));
    }

    #[test]
    fn json_hash_is_key_order_independent() {
        let a: Value = serde_json::json!({"b": 1, "a": [1, 2]});
        let b: Value = serde_json::from_str(r#"{"a":[1,2],"b":1}"#).expect("json");
        assert_eq!(hash_json(&a), hash_json(&b));
    }
}
