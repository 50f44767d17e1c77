//! poimen's first-party plugins (`plugins/<name>`), built for
//! `wasm32-wasip2` by `build.rs` (adding the target through rustup when it
//! is missing) and embedded.
//!
//! - [`BUNDLED`]: each plugin's component bytes, embedded with
//!   `include_bytes!`, for the library to hand to the sandbox host.
//! - One `&str` constant per plugin with the path of the built `.wasm`
//!   file, e.g. [`JSON`].
//!
//! The test-only (adversarial) components are built by `plugin-artifacts`,
//! a dev-dependency of the crates whose tests use them: an embedder of the
//! library never builds them. This crate knows nothing of what a plugin
//! does or how the host loads it.

/// A first-party plugin embedded in the library.
#[derive(Debug, Clone, Copy)]
pub struct Bundled {
    /// The plugin's identifier here (`fs_read`); its registry name comes
    /// from the component's own `describe`.
    pub ident: &'static str,
    /// The component.
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_first_party_plugin_is_an_embedded_component() {
        assert!(!BUNDLED.is_empty());
        for b in BUNDLED {
            assert!(!b.ident.starts_with("adv_"), "{} is test-only", b.ident);
            // A component, not a core module: the layer field is 1.
            assert_eq!(&b.bytes[..4], b"\0asm", "{}", b.ident);
            assert_eq!(&b.bytes[6..8], &[1, 0], "{} is not a component", b.ident);
        }
    }
}
