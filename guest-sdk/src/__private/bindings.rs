//! The wit-bindgen output for the `poimen:plugin` worlds, and nothing else.
//!
//! Plugin authors never name anything here: the crate root's traits and
//! export macros are the interface, and this module is public only so that
//! those macros can reach it from the author's crate. It knows nothing of
//! serde or of the author's types.

/// The `tool` world: `describe` and `invoke`.
pub mod tool {
    wit_bindgen::generate!({
        path: "../wit",
        world: "poimen:plugin/tool@0.1.0",
        pub_export_macro: true,
        export_macro_name: "export_tool_world",
        default_bindings_module: "poimen_guest::__private::bindings::tool",
        runtime_path: "poimen_guest::__private::wit_bindgen::rt",
    });
}

/// The `verifier` world: `describe` and `verify`. Shares the `types`
/// interface with [`tool`].
pub mod verifier {
    wit_bindgen::generate!({
        path: "../wit",
        world: "poimen:plugin/verifier@0.1.0",
        pub_export_macro: true,
        export_macro_name: "export_verifier_world",
        default_bindings_module: "poimen_guest::__private::bindings::verifier",
        runtime_path: "poimen_guest::__private::wit_bindgen::rt",
        with: {
            "poimen:plugin/types@0.1.0": super::tool::poimen::plugin::types,
        },
    });
}
