//! Fuzz target: the canonical form and `WorkflowVersion`.
//!
//! For any document a front end accepts (JSON when it starts with `{`, YAML
//! otherwise), with `b = canonical_bytes(def)`, asserts:
//! * `from_canonical(b)` accepts `b` (canonical bytes are canonical), giving
//!   `d2` with `canonical_bytes(d2) == b`;
//! * `canonicalize(def) == d2` and `canonicalize(d2) == d2` (idempotent);
//! * `version_of(def) == version_of(d2) == Blake3(b)`, and the version's
//!   text form parses back to it;
//! * `b` is RFC 8785: re-canonicalizing it with an independent JCS
//!   implementation (`serde_json_canonicalizer`) gives `b` again.
//!
//! And for the raw input read as stored bytes: `from_canonical` never
//! panics, and what it accepts re-encodes to exactly the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poimen_workflow::{
    WorkflowVersion, canonical_bytes, canonicalize, from_canonical, parse, version_of,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(def) = from_canonical(data) {
        assert_eq!(
            canonical_bytes(&def),
            data,
            "from_canonical accepted non-canonical bytes"
        );
        assert_eq!(version_of(&def), WorkflowVersion::of_canonical_bytes(data));
    }

    let format = poimen_fuzz::format_of(data);
    let Ok(def) = parse(data, format, poimen_fuzz::source_name(format)) else {
        return;
    };
    let b = canonical_bytes(&def);
    let text = String::from_utf8_lossy(&b);
    let d2 = from_canonical(&b)
        .unwrap_or_else(|e| panic!("canonical bytes are not canonical: {e}\n{text}"));
    assert_eq!(canonical_bytes(&d2), b, "re-encoding changed the bytes");
    assert_eq!(
        canonicalize(&def),
        d2,
        "canonicalize differs from reading b back\n{text}"
    );
    assert_eq!(
        canonicalize(&d2),
        d2,
        "canonicalize is not idempotent\n{text}"
    );

    let v = version_of(&def);
    assert_eq!(
        v,
        version_of(&d2),
        "the canonical IR has another version\n{text}"
    );
    assert_eq!(v, WorkflowVersion::of_canonical_bytes(&b));
    assert_eq!(
        v.to_string().parse::<WorkflowVersion>(),
        Ok(v),
        "version text"
    );

    let value: serde_json::Value = serde_json::from_slice(&b)
        .unwrap_or_else(|e| panic!("canonical bytes are not JSON: {e}\n{text}"));
    let jcs = serde_json_canonicalizer::to_vec(&value).expect("JCS of a JSON value");
    assert_eq!(
        String::from_utf8_lossy(&jcs),
        text,
        "canonical bytes are not RFC 8785"
    );
});
