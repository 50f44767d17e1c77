//! The wasmtime bindgen output for the `poimen:plugin` worlds, and nothing
//! else. The rest of the crate reaches the guest only through these types.

/// The `tool` world: `describe` and `invoke`.
mod tool_world {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "poimen:plugin/tool@0.1.0",
        exports: { default: async },
    });
}

/// The `verifier` world: `describe` and `verify`, sharing the `types`
/// interface with the tool world.
mod verifier_world {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "poimen:plugin/verifier@0.1.0",
        exports: { default: async },
        with: {
            "poimen:plugin/types": super::tool_world::poimen::plugin::types,
        },
    });
}

pub(crate) use tool_world::ToolPre;
pub(crate) use tool_world::poimen::plugin::types::{Descriptor, EffectClass, ToolError, Verdict};
pub(crate) use verifier_world::VerifierPre;
