//! Fuzz target: the JSON front end (`poimen_workflow::parse`, `Format::Json`)
//! over arbitrary bytes.
//!
//! Asserts what `frontend_yaml` asserts, and that the two front ends agree:
//! a JSON document the JSON front end accepts, written out as YAML, is
//! accepted by the YAML front end as the same workflow (same version).
#![no_main]

use libfuzzer_sys::fuzz_target;
use poimen_workflow::{Format, parse, version_of};

fuzz_target!(|data: &[u8]| {
    let Some(def) = poimen_fuzz::check_front_end(data, Format::Json) else {
        return;
    };
    // Accepted as JSON, so it is JSON (after an optional byte-order mark).
    let text = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let value: serde_json::Value =
        serde_json::from_slice(text).expect("the JSON front end accepted what is not JSON");
    let yaml = serde_norway::to_string(&value).expect("a JSON value writes as YAML");
    let again = parse(yaml.as_bytes(), Format::Yaml, "fuzz.yaml").unwrap_or_else(|e| {
        panic!("accepted as JSON but refused as YAML: {e}\n--- YAML ---\n{yaml}")
    });
    assert_eq!(
        version_of(&def),
        version_of(&again),
        "JSON and YAML front ends read different workflows\n--- YAML ---\n{yaml}"
    );
});
