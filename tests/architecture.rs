//! The architecture's invariants, checked (ARCHITECTURE.md states them):
//!
//! - what each crate must not know, from `cargo metadata`'s resolved
//!   dependency graph: only the sandbox reaches wasmtime, only the store
//!   SQLite, the core does no async runtime, the facade carries no CLI
//!   crates, nothing depends on the binary, and no workspace crate has a
//!   dev-dependency on a crate above it;
//! - no import circles between the files of a crate: every `crate::…` and
//!   `super::…` path of every source file is resolved to the file that
//!   defines it, and the graph of files must be acyclic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The host's target triple (`rustc -vV`).
fn host_triple() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

/// The workspace's resolved dependency graph, for this platform only (the
/// packages built here, so nothing needs downloading): for every workspace
/// package, everything it pulls in through normal and build dependencies,
/// transitively; and its declared dev-dependencies.
///
/// Features are unified over the workspace, as one `cargo build` resolves
/// them, which can only add dependencies: a crate that passes here knows
/// no more than this. (The one rule that depends on a feature — the
/// executor builds without the store's SQLite — is checked with
/// `cargo tree -p`, which resolves features for one crate.)
fn graph() -> (
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<String, BTreeSet<String>>,
) {
    let m: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--offline",
        "--filter-platform",
        &host_triple(),
    ]))
    .expect("cargo metadata prints JSON");
    let packages = m["packages"].as_array().cloned().unwrap_or_default();
    let name_of = |id: &str| -> String {
        packages
            .iter()
            .find(|p| p["id"] == id)
            .and_then(|p| p["name"].as_str())
            .unwrap_or(id)
            .to_owned()
    };
    let mut normal: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for n in m["resolve"]["nodes"].as_array().into_iter().flatten() {
        let me = name_of(n["id"].as_str().unwrap_or_default());
        for d in n["deps"].as_array().into_iter().flatten() {
            let not_dev = d["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"] != "dev");
            if not_dev {
                normal
                    .entry(me.clone())
                    .or_default()
                    .insert(name_of(d["pkg"].as_str().unwrap_or_default()));
            }
        }
    }
    let mut closure = BTreeMap::new();
    let mut dev = BTreeMap::new();
    for id in m["workspace_members"].as_array().into_iter().flatten() {
        let id = id.as_str().unwrap_or_default();
        let member = name_of(id);
        let mut seen = BTreeSet::new();
        let mut stack = vec![member.clone()];
        while let Some(p) = stack.pop() {
            for d in normal.get(&p).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        closure.insert(member.clone(), seen);
        let declared: BTreeSet<String> = packages
            .iter()
            .find(|p| p["id"] == id)
            .and_then(|p| p["dependencies"].as_array())
            .into_iter()
            .flatten()
            .filter(|d| d["kind"] == "dev")
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        dev.insert(member, declared);
    }
    (closure, dev)
}

/// Every package `krate` pulls in through normal and build dependencies,
/// with features resolved as when `krate` is built on its own.
fn closure_alone(krate: &str) -> BTreeSet<String> {
    cargo(&[
        "tree",
        "-p",
        krate,
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "--offline",
    ])
    .lines()
    .skip(1)
    .filter_map(|l| l.split_whitespace().next())
    .map(str::to_owned)
    .collect()
}

#[test]
fn architecture_each_crate_knows_only_what_it_may() {
    let (mut deps, dev) = graph();
    // Built alone, the executor gets the store without SQLite.
    deps.insert(
        "poimen-executor".to_owned(),
        closure_alone("poimen-executor"),
    );
    let must_not: &[(&str, &[&str])] = &[
        (
            "poimen-workflow",
            &[
                "tokio",
                "wasmtime",
                "rusqlite",
                "poimen-store",
                "poimen-sandbox",
                "poimen-executor",
            ],
        ),
        (
            "poimen-policy",
            &[
                "wasmtime",
                "tokio",
                "rusqlite",
                "poimen-store",
                "poimen-sandbox",
                "poimen-executor",
                "poimen",
            ],
        ),
        (
            "poimen-store",
            &["wasmtime", "poimen-sandbox", "poimen-executor", "poimen"],
        ),
        (
            "poimen-sandbox",
            &["rusqlite", "poimen-store", "poimen-executor", "poimen"],
        ),
        (
            "poimen-executor",
            &[
                "wasmtime",
                "rusqlite",
                "tokio-postgres",
                "deadpool-postgres",
                "poimen-sandbox",
                "poimen",
            ],
        ),
        (
            "poimen",
            &[
                "clap",
                "clap_complete",
                "indicatif",
                "humantime",
                "rmcp",
                "tracing-subscriber",
                "poimen-cli",
                // The HTTP API is its own crate: the facade stays lean.
                "poimen-server",
                "axum",
                "utoipa",
                // An embedder never builds the test-only components.
                "plugin-artifacts",
            ],
        ),
        (
            "poimen-server",
            &[
                "clap",
                "clap_complete",
                "indicatif",
                "rmcp",
                "tracing-subscriber",
                "poimen-cli",
                "plugin-artifacts",
            ],
        ),
        (
            "poimen-guest",
            &[
                "wasmtime",
                "poimen-workflow",
                "poimen-store",
                "poimen-sandbox",
                "poimen-executor",
            ],
        ),
    ];
    let mut problems = Vec::new();
    for (krate, forbidden) in must_not {
        let Some(known) = deps.get(*krate) else {
            problems.push(format!("{krate} is not a workspace member"));
            continue;
        };
        for f in *forbidden {
            if known.contains(*f) {
                problems.push(format!("{krate} depends on {f}"));
            }
        }
    }
    for (krate, known) in &deps {
        if known.contains("poimen-cli") {
            problems.push(format!("{krate} depends on the binary crate poimen-cli"));
        }
    }
    // A dev-dependency on a crate that depends on you is a cycle.
    for (krate, devs) in &dev {
        for d in devs {
            if deps.get(d).is_some_and(|x| x.contains(krate)) {
                problems.push(format!(
                    "{krate} has a dev-dependency on {d}, which depends on {krate}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The HTTP API reaches the engine only through the facade: it names no
/// crate below `poimen`, nor wasmtime or a database client, itself
/// (through the facade it has them all, so this is about its own
/// dependencies).
#[test]
fn architecture_the_server_knows_only_the_facade() {
    let m: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--offline",
        "--no-deps",
    ]))
    .expect("cargo metadata prints JSON");
    let server = m["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "poimen-server")
        .expect("poimen-server is a workspace member");
    let forbidden = [
        "wasmtime",
        "rusqlite",
        "tokio-postgres",
        "poimen-workflow",
        "poimen-store",
        "poimen-sandbox",
        "poimen-executor",
    ];
    let direct: Vec<&str> = server["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["kind"] != "dev")
        .filter_map(|d| d["name"].as_str())
        .filter(|name| forbidden.contains(name))
        .collect();
    assert!(direct.is_empty(), "poimen-server depends on {direct:?}");
}

// ------------------------------------------------------- import circles

/// The module path of each source file of a crate (`["run", "steps"]` for
/// `run/steps/mod.rs`), and the file of each module path.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("source dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts, p);
        }
    }
    out
}

/// The module a path inside `file` (module `me`) refers to — the longest
/// prefix of the path that is a module of the crate — and the segments
/// after it.
fn target(
    me: &[String],
    path: &[String],
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<(Vec<String>, Vec<String>)> {
    let mut full: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super") => {
            full.extend_from_slice(me);
            while rest.first().map(String::as_str) == Some("super") {
                full.pop();
                rest = &rest[1..];
            }
        }
        Some("self") => {
            full.extend_from_slice(me);
            rest = &path[1..];
        }
        _ => return None,
    }
    full.extend(rest.iter().cloned());
    longest_module(&full, mods)
}

/// The longest prefix of an absolute module path that is a module, and the
/// rest.
fn longest_module(
    full: &[String],
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<(Vec<String>, Vec<String>)> {
    (0..=full.len())
        .rev()
        .find(|&n| mods.contains_key(&full[..n]))
        .map(|n| (full[..n].to_vec(), full[n..].to_vec()))
}

/// What module `me` re-exports (`pub use`, `pub(crate) use`, ...): each
/// exported name and the absolute path it stands for. A path into another
/// crate is left out.
fn reexports(
    me: &[String],
    text: &str,
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut k = 0;
    while k < lines.len() {
        let line = lines[k].trim_start();
        k += 1;
        let Some(after) = line.strip_prefix("pub") else {
            continue;
        };
        let after = match after.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or("", |(_, r)| r),
            None => after,
        };
        let Some(stmt) = after.trim_start().strip_prefix("use ") else {
            continue;
        };
        let mut stmt = stmt.to_owned();
        while !stmt.contains(';') && k < lines.len() {
            stmt.push(' ');
            stmt.push_str(lines[k].trim());
            k += 1;
        }
        let mut paths = Vec::new();
        expand(
            stmt.split(';').next().unwrap_or_default().trim(),
            &[],
            &mut paths,
        );
        for p in paths {
            let absolute: Vec<String> = match p.first().map(String::as_str) {
                Some("crate") => p[1..].to_vec(),
                Some("self") => me.iter().chain(&p[1..]).cloned().collect(),
                Some("super") => {
                    let mut base = me.to_vec();
                    let mut rest = &p[..];
                    while rest.first().map(String::as_str) == Some("super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().cloned());
                    base
                }
                Some(first) => {
                    let mut child = me.to_vec();
                    child.push(first.to_owned());
                    if !mods.contains_key(&child) {
                        continue;
                    }
                    me.iter().chain(&p).cloned().collect()
                }
                None => continue,
            };
            if let Some(name) = p.last() {
                out.insert(name.clone(), absolute);
            }
        }
    }
    out
}

/// `crate::`, `super::` and `self::` paths in one file, `use` trees expanded.
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let code: String = text
        .lines()
        .map(|l| match l.trim_start() {
            t if t.starts_with("//") => "",
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    // `use a::b::{c, d::e};` statements (rustfmt puts each at the start of
    // a line), flattened. `pub use` re-exports are a facade, not a
    // dependency of the file.
    let lines: Vec<&str> = code.lines().collect();
    let mut k = 0;
    while k < lines.len() {
        let line = lines[k].trim_start();
        k += 1;
        if !line.starts_with("use ") {
            continue;
        }
        let mut stmt = line["use ".len()..].to_owned();
        while !stmt.contains(';') && k < lines.len() {
            stmt.push(' ');
            stmt.push_str(lines[k].trim());
            k += 1;
        }
        let stmt = stmt.split(';').next().unwrap_or_default();
        expand(stmt.trim(), &[], &mut out);
    }
    let bytes = code.as_bytes();
    // Inline paths: `crate::x::y` anywhere else.
    for prefix in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(p) = code[from..].find(prefix) {
            let at = from + p;
            from = at + prefix.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let seg: String = code[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let parts: Vec<String> = seg
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            out.push(parts);
        }
    }
    out
}

fn expand(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim_end_matches("::");
        let mut base = prefix.to_vec();
        base.extend(
            head.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let mut depth = 0;
        let mut item = String::new();
        for c in inner.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&item, &base, out);
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        if !item.trim().is_empty() {
            expand(&item, &base, out);
        }
    } else {
        let mut p = prefix.to_vec();
        let path = tree.split(" as ").next().unwrap_or(tree);
        p.extend(
            path.split("::")
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty() && s != "self"),
        );
        out.push(p);
    }
}

/// The import cycles among the files of the crate whose sources are `src`.
fn cycles(src: &Path) -> Vec<Vec<String>> {
    let mods = modules(src);
    let texts: BTreeMap<Vec<String>, String> = mods
        .iter()
        .map(|(m, f)| (m.clone(), std::fs::read_to_string(f).expect("source")))
        .collect();
    let exported: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = texts
        .iter()
        .map(|(m, t)| (m.clone(), reexports(m, t, &mods)))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (me, text) in &texts {
        for path in paths(text) {
            let Some(mut found) = target(me, &path, &mods) else {
                continue;
            };
            // The crate root and a module's parents declare it: a path
            // through one of them is a path to what it re-exports, followed
            // to the module that defines it.
            for _ in 0..8 {
                let (module, rest) = &found;
                let through = module != me && me.starts_with(module);
                let Some(to) = rest
                    .first()
                    .filter(|_| through)
                    .and_then(|name| exported.get(module)?.get(name))
                else {
                    break;
                };
                let full: Vec<String> = to.iter().chain(&rest[1..]).cloned().collect();
                match longest_module(&full, &mods) {
                    Some(next) if next != found => found = next,
                    _ => break,
                }
            }
            let t = found.0;
            if !t.is_empty() && &t != me && !me.starts_with(&t) {
                edges.entry(me.clone()).or_default().insert(t);
            }
        }
    }
    // Depth-first search for back edges.
    let mut found = Vec::new();
    let mut state: BTreeMap<Vec<String>, u8> = BTreeMap::new();
    fn visit(
        n: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        found: &mut Vec<Vec<String>>,
    ) {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                0 => visit(m, edges, state, stack, found),
                1 => {
                    let at = stack.iter().position(|x| x == m).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[at..].iter().map(|x| x.join("::")).collect();
                    cycle.push(m.join("::"));
                    found.push(cycle);
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
    }
    for n in mods.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            visit(n, &edges, &mut state, &mut Vec::new(), &mut found);
        }
    }
    found
}

#[test]
fn architecture_no_import_circles_between_files() {
    let mut problems = Vec::new();
    for krate in [
        "host/workflow",
        "host/policy",
        "host/store",
        "host/sandbox",
        "host/executor",
        "host/poimen",
        "host/server",
        ".",
    ] {
        for cycle in cycles(&root().join(krate).join("src")) {
            problems.push(format!("{krate}: {}", cycle.join(" → ")));
        }
    }
    assert!(
        problems.is_empty(),
        "import circles:\n{}",
        problems.join("\n")
    );
}

#[test]
fn architecture_the_cycle_finder_finds_cycles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\npub use a::A;\n").expect("write");
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").expect("write");
    std::fs::create_dir(src.join("b")).expect("dir");
    std::fs::write(
        src.join("b/mod.rs"),
        "mod c;\npub struct B;\nfn f() { let _ = crate::a::A; }\n",
    )
    .expect("write");
    std::fs::write(src.join("b/c.rs"), "use super::B;\n").expect("write");
    let found = cycles(src);
    assert_eq!(found, vec![vec!["a", "b", "a"]]);

    // A circle through a re-export of the crate root is a circle too.
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\npub use b::B;\n").expect("write");
    std::fs::write(
        src.join("a.rs"),
        "pub struct A;\nfn f() { let _ = crate::B; }\n",
    )
    .expect("write");
    std::fs::write(src.join("b.rs"), "use crate::a::A;\npub struct B;\n").expect("write");
    assert_eq!(cycles(src), vec![vec!["a", "b", "a"]]);
}
