//! What a component's imports need, read from the component's type.
//!
//! Every import is classified: served virtually with no capability
//! (baseline), needs a filesystem capability, needs `http`, never grantable
//! (`wasi:sockets`), or unknown. [`check`] then holds the imports against
//! the component's declared capabilities. This module never trusts a
//! component's word about what it imports, and knows nothing of policy:
//! whether a declared capability is granted is `policy`'s question.

use std::fmt;

use poimen_workflow::Capability;
use serde::{Deserialize, Serialize};

/// The WASI minor version family the host links (`0.2.x`).
pub const WASI_VERSION_FAMILY: &str = "0.2";

/// What an import needs before a component that has it may load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportClass {
    /// Served virtually; reaches nothing outside the invocation:
    /// `wasi:io`, `wasi:cli` stdio/environment/exit/terminal (empty
    /// environment, empty stdin, captured stdout and stderr),
    /// `wasi:clocks` (deterministic), `wasi:random` (deterministic), and the
    /// types of `poimen:plugin` itself.
    Baseline,
    /// `wasi:filesystem`: needs `fs-read:…`, `fs-write:…` or `scratch`.
    Filesystem,
    /// `wasi:http` outgoing requests: needs `http`.
    Http,
    /// `wasi:sockets`: never granted; network access goes through
    /// `wasi:http` to allowlisted hosts.
    Sockets,
    /// Anything else (another package, another interface, an unsupported
    /// version): refused.
    Unknown,
}

impl ImportClass {
    /// The capabilities that cover an import of this class, in words.
    pub fn needs(self) -> &'static str {
        match self {
            ImportClass::Baseline => "nothing",
            ImportClass::Filesystem => "`fs-read:<mount>`, `fs-write:<mount>` or `scratch`",
            ImportClass::Http => "`http`",
            ImportClass::Sockets => "a capability that does not exist: use `wasi:http`",
            ImportClass::Unknown => "a capability that does not exist",
        }
    }

    /// Whether `declared` covers an import of this class.
    pub fn covered_by(self, declared: &[Capability]) -> bool {
        match self {
            ImportClass::Baseline => true,
            ImportClass::Filesystem => declared.iter().any(|c| {
                matches!(
                    c,
                    Capability::FilesystemRead { .. }
                        | Capability::FilesystemWrite { .. }
                        | Capability::Scratch
                )
            }),
            ImportClass::Http => declared.contains(&Capability::Http),
            ImportClass::Sockets | ImportClass::Unknown => false,
        }
    }
}

impl fmt::Display for ImportClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImportClass::Baseline => "baseline",
            ImportClass::Filesystem => "filesystem",
            ImportClass::Http => "http",
            ImportClass::Sockets => "sockets",
            ImportClass::Unknown => "unknown",
        })
    }
}

/// One import of a component, as its type says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// The full name, e.g. `wasi:filesystem/types@0.2.6`.
    pub name: String,
    pub class: ImportClass,
}

/// Classifies one import name.
pub fn classify(name: &str) -> ImportClass {
    let (path, version) = match name.split_once('@') {
        Some((p, v)) => (p, Some(v)),
        None => (name, None),
    };
    let Some((package, interface)) = path.split_once('/') else {
        return ImportClass::Unknown;
    };
    let in_family = |family: &str| {
        version.is_some_and(|v| {
            v.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('.'))
        })
    };
    if package == "poimen:plugin" {
        return if interface == "types" && in_family("0.1") {
            ImportClass::Baseline
        } else {
            ImportClass::Unknown
        };
    }
    if !package.starts_with("wasi:") || !in_family(WASI_VERSION_FAMILY) {
        return ImportClass::Unknown;
    }
    match (package, interface) {
        ("wasi:io", "error" | "poll" | "streams")
        | ("wasi:random", "random" | "insecure" | "insecure-seed")
        | ("wasi:clocks", "wall-clock" | "monotonic-clock")
        | (
            "wasi:cli",
            "environment" | "exit" | "stdin" | "stdout" | "stderr" | "terminal-input"
            | "terminal-output" | "terminal-stdin" | "terminal-stdout" | "terminal-stderr",
        ) => ImportClass::Baseline,
        ("wasi:filesystem", "types" | "preopens") => ImportClass::Filesystem,
        ("wasi:http", "types" | "outgoing-handler") => ImportClass::Http,
        ("wasi:sockets", _) => ImportClass::Sockets,
        _ => ImportClass::Unknown,
    }
}

/// The component's imports, classified, from its type.
pub fn of_component(
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
) -> Vec<Import> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| Import {
            name: name.to_owned(),
            class: classify(name),
        })
        .collect()
}

/// An import the component may not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportProblem {
    /// `wasi:sockets`: never grantable.
    Sockets { import: String },
    /// Not something the host serves.
    Unknown { import: String },
    /// Needs a capability the component does not declare.
    Undeclared { import: String, needs: &'static str },
}

/// Holds `imports` against `declared`; returns every problem. Imports that
/// can never load (sockets, unknown) are reported whatever is declared.
pub fn check(imports: &[Import], declared: &[Capability]) -> Vec<ImportProblem> {
    imports
        .iter()
        .filter_map(|i| match i.class {
            ImportClass::Sockets => Some(ImportProblem::Sockets {
                import: i.name.clone(),
            }),
            ImportClass::Unknown => Some(ImportProblem::Unknown {
                import: i.name.clone(),
            }),
            c if c.covered_by(declared) => None,
            c => Some(ImportProblem::Undeclared {
                import: i.name.clone(),
                needs: c.needs(),
            }),
        })
        .collect()
}

/// The imports that can never load, whatever is declared: checked before
/// the component is instantiated at all.
pub fn never_loadable(imports: &[Import]) -> Vec<ImportProblem> {
    check(imports, &[])
        .into_iter()
        .filter(|p| !matches!(p, ImportProblem::Undeclared { .. }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_what_a_plain_rust_plugin_imports_as_baseline() {
        // Measured from the first-party plugins built for wasm32-wasip2.
        for name in [
            "poimen:plugin/types@0.1.0",
            "wasi:io/poll@0.2.6",
            "wasi:io/error@0.2.6",
            "wasi:io/streams@0.2.12",
            "wasi:cli/environment@0.2.6",
            "wasi:cli/exit@0.2.6",
            "wasi:cli/stdin@0.2.6",
            "wasi:cli/stdout@0.2.6",
            "wasi:cli/stderr@0.2.6",
            "wasi:cli/terminal-input@0.2.6",
            "wasi:cli/terminal-output@0.2.6",
            "wasi:cli/terminal-stdin@0.2.6",
            "wasi:cli/terminal-stdout@0.2.6",
            "wasi:cli/terminal-stderr@0.2.6",
            "wasi:random/insecure-seed@0.2.6",
            "wasi:random/random@0.2.12",
            "wasi:clocks/wall-clock@0.2.6",
            "wasi:clocks/monotonic-clock@0.2.12",
        ] {
            assert_eq!(classify(name), ImportClass::Baseline, "{name}");
        }
    }

    #[test]
    fn classifies_capability_bearing_and_refused_imports() {
        assert_eq!(
            classify("wasi:filesystem/types@0.2.6"),
            ImportClass::Filesystem
        );
        assert_eq!(
            classify("wasi:filesystem/preopens@0.2.0"),
            ImportClass::Filesystem
        );
        assert_eq!(
            classify("wasi:http/outgoing-handler@0.2.12"),
            ImportClass::Http
        );
        assert_eq!(classify("wasi:http/types@0.2.0"), ImportClass::Http);
        assert_eq!(classify("wasi:sockets/tcp@0.2.0"), ImportClass::Sockets);
        for unknown in [
            "wasi:cli/run@0.2.0",
            "wasi:http/incoming-handler@0.2.0",
            "wasi:io/streams@0.3.0",
            "wasi:io/streams",
            "wasi:io/streams@0.20.0",
            "acme:secrets/vault@1.0.0",
            "poimen:plugin/types@0.2.0",
            "poimen:plugin/host@0.1.0",
            "not-an-interface",
        ] {
            assert_eq!(classify(unknown), ImportClass::Unknown, "{unknown}");
        }
    }

    fn imports(names: &[&str]) -> Vec<Import> {
        names
            .iter()
            .map(|n| Import {
                name: (*n).into(),
                class: classify(n),
            })
            .collect()
    }

    #[test]
    fn every_capability_bearing_import_must_be_declared() {
        let fs = imports(&["wasi:io/poll@0.2.6", "wasi:filesystem/types@0.2.6"]);
        assert_eq!(
            check(&fs, &[]),
            [ImportProblem::Undeclared {
                import: "wasi:filesystem/types@0.2.6".into(),
                needs: ImportClass::Filesystem.needs()
            }]
        );
        assert!(check(&fs, &["fs-read:/data".parse().expect("cap")]).is_empty());
        assert!(check(&fs, &[Capability::Scratch]).is_empty());
        assert!(!check(&fs, &[Capability::Http]).is_empty());

        let http = imports(&["wasi:http/outgoing-handler@0.2.12"]);
        assert_eq!(check(&http, &[]).len(), 1);
        assert!(check(&http, &[Capability::Http]).is_empty());
    }

    #[test]
    fn sockets_and_unknown_imports_never_load() {
        let bad = imports(&[
            "wasi:sockets/tcp@0.2.0",
            "acme:x/y@1.0.0",
            "wasi:http/types@0.2.0",
        ]);
        let all = [Capability::Http, Capability::Scratch];
        assert_eq!(
            check(&bad, &all),
            [
                ImportProblem::Sockets {
                    import: "wasi:sockets/tcp@0.2.0".into()
                },
                ImportProblem::Unknown {
                    import: "acme:x/y@1.0.0".into()
                },
            ]
        );
        assert_eq!(never_loadable(&bad).len(), 2);
    }
}
