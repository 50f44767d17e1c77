//! Fuzz target: the YAML front end (`poimen_workflow::parse`, `Format::Yaml`)
//! over arbitrary bytes.
//!
//! Asserts: parsing never panics and ends (alias bombs and deep nesting are
//! refused by bound, not by running out of memory or stack); a refusal is a
//! `ParseError` whose message renders, whose JSON form encodes, and whose
//! line (when given) lies within the document; an accepted document has a
//! version and its canonical bytes read back to that same version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use poimen_workflow::Format;

fuzz_target!(|data: &[u8]| {
    poimen_fuzz::check_front_end(data, Format::Yaml);
});
