//! Fuzz target: the capability policy file (`poimen_policy::Policy::from_toml`),
//! with relative host directories resolved against `fixtures/policy/` (which
//! has a `data/` directory).
//!
//! Asserts: reading never panics; a refusal is a typed `PolicyError` naming
//! the policy file; an accepted policy has an entry for every
//! `[plugins.NAME]` table, each mount a valid capability path backed by an
//! absolute host directory, each HTTP entry reading back from its text
//! form; what an entry writes is granted (every mount, `http` when it lists
//! hosts, `scratch` unless turned off) to a component it covers, and a
//! component of the same name with another digest is granted none of its
//! mounts or hosts when the entry is pinned to digests; limits resolve for
//! both.
#![no_main]

use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use poimen_policy::{CallLimits, HttpAllow, Policy, PolicyError, PolicySource};
use poimen_workflow::Capability;

/// The plugin names of a policy file.
#[derive(serde::Deserialize)]
struct Names {
    #[serde(default)]
    plugins: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

fn base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/policy")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let base = base();
    let source = PolicySource::File(base.join("fuzz.toml"));
    let policy = match Policy::from_toml(text, &base, source.clone()) {
        Err(e) => {
            let PolicyError::Invalid { source_desc, .. } = &e else {
                panic!("reading text gave a file error: {e}");
            };
            assert_eq!(source_desc, &source.to_string());
            assert!(e.to_string().starts_with(&source.to_string()));
            return;
        }
        Ok(policy) => policy,
    };
    assert_eq!(policy.source(), &source);
    // (Read with the policy's own types: the file format takes limits up to
    // u64::MAX, beyond TOML's i64 integers, so `toml::Table` may refuse it.)
    let names: Names = toml::from_str(text).expect("an accepted policy reads again");
    let names: Vec<String> = names.plugins.into_keys().collect();
    let stranger = format!("b3:{}", "f".repeat(64));
    for name in &names {
        let p = policy
            .plugin(name)
            .unwrap_or_else(|| panic!("[plugins.{name}] is not in the policy"));
        let mut declared = Vec::new();
        for (mount, dir) in &p.fs_read {
            assert!(dir.is_absolute(), "host dir {} is relative", dir.display());
            declared.push(Capability::FilesystemRead {
                mount: mount.clone(),
            });
        }
        for (mount, dir) in &p.fs_write {
            assert!(dir.is_absolute(), "host dir {} is relative", dir.display());
            declared.push(Capability::FilesystemWrite {
                mount: mount.clone(),
            });
        }
        for cap in &declared {
            let again: Capability = cap.to_string().parse().expect("a mount reads back");
            assert_eq!(&again, cap);
        }
        for h in &p.http {
            assert_eq!(HttpAllow::parse(&h.to_string()).as_ref(), Ok(h), "{h}");
        }
        let reaches = !declared.is_empty() || !p.http.is_empty();
        if !p.http.is_empty() {
            declared.push(Capability::Http);
        }
        if p.scratch {
            declared.push(Capability::Scratch);
        }
        let digest = p
            .digests
            .first()
            .cloned()
            .unwrap_or_else(|| stranger.clone());
        let grants = policy
            .grant(name, &digest, &declared)
            .unwrap_or_else(|missing| {
                panic!("[plugins.{name}] written but not granted: {missing:?}")
            });
        assert_eq!(grants.len(), declared.len());
        let _ = policy.limits_for(name, &digest, CallLimits::default());
        if !p.digests.is_empty() && !p.digests.contains(&stranger) {
            let impostor = policy.grant(name, &stranger, &declared);
            assert!(
                !reaches || impostor.is_err(),
                "[plugins.{name}] is pinned, yet another digest was granted {impostor:?}"
            );
            let _ = policy.limits_for(name, &stranger, CallLimits::default());
        }
    }
});
