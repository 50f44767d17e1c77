//! Every component of this workspace, for the tests and benches: the
//! test-only (adversarial) components under `plugins/adversarial/`, built
//! for `wasm32-wasip2` by `build.rs`, and the first-party plugins, which
//! `bundled-plugins` builds and embeds (re-exported here).
//!
//! - One `&str` constant per component (first-party and test-only) with the
//!   path of the built `.wasm` file, e.g. [`JSON`], [`ADV_SPIN`]; and
//!   [`ALL`] listing them; [`BUNDLED`], the first-party plugins' bytes.
//! - [`foreach_plugin!`]: calls a macro once per component. The sandbox's
//!   integration tests use it to demand a test function named after every
//!   component, so a plugin that no test uses fails the build.
//! - [`lang::lang_plugins`]: the example plugins written in Python and
//!   JavaScript, built from source on first use.
//!
//! A dev-dependency only: the library depends on `bundled-plugins`, so an
//! embedder never builds a test-only component. This crate knows nothing of
//! what a plugin does or how the host loads it.

pub use bundled_plugins::{BUNDLED, Bundled};

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

pub mod lang;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_component_was_built_and_first_party_ones_are_embedded() {
        assert!(ALL.len() >= BUNDLED.len());
        for (ident, path) in ALL {
            let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{ident}: {path}: {e}"));
            assert!(meta.len() > 0, "{ident} is empty");
        }
        for b in BUNDLED {
            assert!(!b.ident.starts_with("adv_"), "{} is test-only", b.ident);
            // A component, not a core module: the layer field is 1.
            assert_eq!(&b.bytes[..4], b"\0asm", "{}", b.ident);
            assert_eq!(&b.bytes[6..8], &[1, 0], "{} is not a component", b.ident);
        }
    }
}
