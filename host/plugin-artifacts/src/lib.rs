//! The plugins of this workspace, built for `wasm32-wasip2` by `build.rs`.
//!
//! - [`BUNDLED`]: the first-party plugins' component bytes, embedded with
//!   `include_bytes!`, for the poimen binary to hand to the sandbox host.
//! - One `&str` constant per component (first-party and test-only) with the
//!   path of the built `.wasm` file, e.g. [`JSON`], [`ADV_SPIN`]; and
//!   [`ALL`] listing them.
//! - [`foreach_plugin!`]: calls a macro once per component. The sandbox's
//!   integration tests use it to demand a test function named after every
//!   component, so a plugin that no test uses fails the build.
//! - [`lang::lang_plugins`]: the example plugins written in Python and
//!   JavaScript, built from source on first use.
//!
//! Test-only (adversarial) components are never embedded. This crate knows
//! nothing of what a plugin does or how the host loads it.

/// A first-party plugin embedded in the binary.
#[derive(Debug, Clone, Copy)]
pub struct Bundled {
    /// The plugin's identifier here (`fs_read`); its registry name comes
    /// from the component's own `describe`.
    pub ident: &'static str,
    /// The component.
    pub bytes: &'static [u8],
}

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
