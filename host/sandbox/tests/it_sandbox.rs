//! Integration tests of the sandbox host against the real components built
//! by `plugin-artifacts`: every first-party plugin round-trips, every
//! adversarial component is contained with its own error, and the boundary
//! (records, concurrency, cancellation, registries, load-time checks,
//! compile cache) holds.
//!
//! One test binary, because each links wasmtime. Every component needs a
//! test function named after it in `plugins`: `foreach_plugin!` below makes
//! a component that no test uses a build error.

#[path = "it_sandbox/boundary.rs"]
mod boundary;
#[path = "it_sandbox/hostile.rs"]
mod hostile;
#[path = "it_sandbox/languages.rs"]
mod languages;
#[path = "it_sandbox/plugins.rs"]
mod plugins;
#[path = "it_sandbox/support.rs"]
mod support;

macro_rules! assert_test_exists {
    ($name:ident) => {
        #[allow(unused_imports)]
        use self::plugins::$name as _;
    };
}
plugin_artifacts::foreach_plugin!(assert_test_exists);
