//! What a component's imports need, read from the component's type, and
//! how the host links each one.
//!
//! Every import is classified: served virtually with no capability
//! (baseline), needs a filesystem capability, needs `http`, never grantable
//! (`wasi:sockets`), or unknown. [`settle`] then decides, against the
//! component's declared capabilities, how each is linked
//! ([`Linked`]): served, served through a declared capability (what it
//! reaches is the policy's grant), or **linked and denied** — an import of
//! `wasi:filesystem` or `wasi:http` the component does not declare gets no
//! preopens and an empty allowlist, and `wasi:sockets` denies every socket,
//! each attempt recorded. Language runtimes import these whether or not a
//! tool uses them; linking them denied lets such a tool load and run while
//! it holds nothing. Only an import the host does not serve at all is
//! refused ([`unknown`]). This module never trusts a component's word
//! about what it imports, and knows nothing of policy: whether a declared
//! capability is granted is `policy`'s question.

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

/// How the host links one import of a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Linked {
    /// Served virtually: reaches nothing outside the call.
    Served,
    /// Served through a capability the component declares: it reaches what
    /// the policy grants for that capability, nothing more.
    Declared,
    /// Linked, with nothing granted: every attempted use is refused and
    /// recorded (a filesystem or HTTP import the component does not
    /// declare; `wasi:sockets`, which nothing grants).
    Denied,
    /// Not served at all: the component cannot load.
    Refused,
}

impl fmt::Display for Linked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Linked::Served => "served",
            Linked::Declared => "declared",
            Linked::Denied => "linked, denied",
            Linked::Refused => "refused",
        })
    }
}

/// One import of a component, as its type says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// The full name, e.g. `wasi:filesystem/types@0.2.6`.
    pub name: String,
    pub class: ImportClass,
    /// How it is linked (before [`settle`], as if nothing were declared).
    pub linked: Linked,
}

/// How an import of `class` is linked for a component declaring `declared`.
pub fn linking(class: ImportClass, declared: &[Capability]) -> Linked {
    match class {
        ImportClass::Baseline => Linked::Served,
        ImportClass::Unknown => Linked::Refused,
        ImportClass::Sockets => Linked::Denied,
        c if c.covered_by(declared) => Linked::Declared,
        _ => Linked::Denied,
    }
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
        (
            "wasi:sockets",
            "network" | "instance-network" | "tcp" | "tcp-create-socket" | "udp"
            | "udp-create-socket" | "ip-name-lookup",
        ) => ImportClass::Sockets,
        _ => ImportClass::Unknown,
    }
}

/// The component's imports, classified, from its type (linked as if it
/// declared nothing; see [`settle`]).
pub fn of_component(
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
) -> Vec<Import> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| {
            let class = classify(name);
            Import {
                name: name.to_owned(),
                class,
                linked: linking(class, &[]),
            }
        })
        .collect()
}

/// Settles how each import is linked, now that the component has declared
/// its capabilities.
pub fn settle(imports: &mut [Import], declared: &[Capability]) {
    for i in imports {
        i.linked = linking(i.class, declared);
    }
}

/// The first import the host does not serve at all, if any: checked before
/// the component is instantiated.
pub fn unknown(imports: &[Import]) -> Option<&Import> {
    imports.iter().find(|i| i.class == ImportClass::Unknown)
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

    fn imports(names: &[&str], declared: &[Capability]) -> Vec<Import> {
        let mut out: Vec<Import> = names
            .iter()
            .map(|n| Import {
                name: (*n).into(),
                class: classify(n),
                linked: linking(classify(n), &[]),
            })
            .collect();
        settle(&mut out, declared);
        out
    }

    fn linked(names: &[&str], declared: &[Capability]) -> Vec<Linked> {
        imports(names, declared).iter().map(|i| i.linked).collect()
    }

    #[test]
    fn a_capability_bearing_import_is_served_only_when_declared_and_else_denied() {
        let fs = ["wasi:io/poll@0.2.6", "wasi:filesystem/types@0.2.6"];
        assert_eq!(linked(&fs, &[]), [Linked::Served, Linked::Denied]);
        assert_eq!(
            linked(&fs, &["fs-read:/data".parse().expect("cap")]),
            [Linked::Served, Linked::Declared]
        );
        assert_eq!(
            linked(&fs, &[Capability::Scratch]),
            [Linked::Served, Linked::Declared]
        );
        assert_eq!(
            linked(&fs, &[Capability::Http]),
            [Linked::Served, Linked::Denied]
        );
        let http = ["wasi:http/outgoing-handler@0.2.12"];
        assert_eq!(linked(&http, &[]), [Linked::Denied]);
        assert_eq!(linked(&http, &[Capability::Http]), [Linked::Declared]);
    }

    #[test]
    fn sockets_are_always_denied_and_unknown_imports_refused() {
        let all = [Capability::Http, Capability::Scratch];
        let names = [
            "wasi:sockets/tcp@0.2.0",
            "acme:x/y@1.0.0",
            "wasi:http/types@0.2.0",
        ];
        assert_eq!(
            linked(&names, &all),
            [Linked::Denied, Linked::Refused, Linked::Declared]
        );
        assert_eq!(
            unknown(&imports(&names, &all)).map(|i| i.name.as_str()),
            Some("acme:x/y@1.0.0")
        );
        assert_eq!(classify("wasi:sockets/other@0.2.0"), ImportClass::Unknown);
        for what_python_imports in [
            "wasi:sockets/instance-network@0.2.9",
            "wasi:sockets/ip-name-lookup@0.2.9",
            "wasi:sockets/network@0.2.9",
            "wasi:sockets/tcp-create-socket@0.2.9",
            "wasi:sockets/tcp@0.2.9",
            "wasi:sockets/udp-create-socket@0.2.9",
            "wasi:sockets/udp@0.2.9",
        ] {
            assert_eq!(classify(what_python_imports), ImportClass::Sockets);
        }
    }
}
