// The nested build both build scripts share (`bundled-plugins` builds the
// first-party plugins under `plugins/<name>`, `plugin-artifacts` the
// test-only ones under `plugins/adversarial/<name>`): found by directory,
// built for `wasm32-wasip2` with a nested `cargo build`, the target added
// through rustup when it is missing. Included with `include!`; it knows
// nothing of what the plugins do.
//
// Modelled on wasmtime's `crates/test-programs/artifacts/build.rs`. The
// nested build uses its own target directory under `OUT_DIR`, so it never
// waits on the lock of the outer build's target directory.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every plugin is built for.
const TARGET: &str = "wasm32-wasip2";

struct Plugin {
    /// Cargo package name, e.g. `poimen-plugin-fs-read`.
    package: String,
    /// Rust identifier, e.g. `fs_read`, `adv_spin`.
    ident: String,
}

impl Plugin {
    /// The built component in the nested build's release directory.
    fn wasm(&self, release: &Path) -> PathBuf {
        release.join(format!("{}.wasm", self.package.replace('-', "_")))
    }
}

/// The workspace root, two levels above the crate that builds.
fn workspace_root() -> PathBuf {
    PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"))
        .join("..")
        .join("..")
}

/// Finds `dir/*/Cargo.toml` and reads each package name, sorted by ident.
fn discover(dir: &Path, prefix: &str) -> Vec<Plugin> {
    let mut out = Vec::new();
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let manifest = path.join("Cargo.toml");
        if !manifest.is_file() {
            continue;
        }
        let text = fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
        let package = text
            .lines()
            .find_map(|l| {
                let v = l
                    .trim()
                    .strip_prefix("name")?
                    .trim_start()
                    .strip_prefix('=')?;
                Some(v.trim().trim_matches('"').to_owned())
            })
            .unwrap_or_else(|| panic!("{} has no package name", manifest.display()));
        let dir_name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .replace('-', "_");
        out.push(Plugin {
            package,
            ident: format!("{prefix}{dir_name}"),
        });
    }
    out.sort_by(|a, b| a.ident.cmp(&b.ident));
    out
}

/// The rustc the outer build uses (cargo sets `RUSTC` for build scripts).
fn rustc() -> std::ffi::OsString {
    env::var_os("RUSTC").unwrap_or_else(|| "rustc".into())
}

/// Whether the standard library for [`TARGET`] is installed for `rustc`.
fn target_installed() -> bool {
    Command::new(rustc())
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .and_then(|dir| fs::read_dir(dir).ok())
        .is_some_and(|mut entries| {
            entries.any(|e| {
                e.is_ok_and(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with("libstd-") && name.ends_with(".rlib")
                })
            })
        })
}

/// The toolchain the outer build runs on, as rustup names it: the one
/// rustup's proxy says (`RUSTUP_TOOLCHAIN`), else the name of rustc's
/// sysroot directory when it is one of rustup's toolchains.
fn toolchain() -> Option<String> {
    if let Some(t) = env::var("RUSTUP_TOOLCHAIN").ok().filter(|t| !t.is_empty()) {
        return Some(t);
    }
    let out = Command::new(rustc())
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let parent = sysroot.parent()?;
    (parent.file_name()? == "toolchains")
        .then(|| sysroot.file_name()?.to_str().map(str::to_owned))
        .flatten()
}

/// Adds [`TARGET`] to the toolchain in use when it is missing: rustup adds
/// a `rust-toolchain.toml`'s targets only when it installs that toolchain,
/// not to one that is already there. Without rustup, fails naming what to
/// install.
fn ensure_target(root: &Path) {
    if target_installed() {
        return;
    }
    let toolchain = toolchain();
    let add = match &toolchain {
        Some(t) => format!("rustup target add {TARGET} --toolchain {t}"),
        None => format!("rustup target add {TARGET}"),
    };
    if !Command::new("rustup")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        panic!(
            "the plugins are built for {TARGET}, whose standard library is not installed for \
             {} and rustup was not found to add it: install it for this compiler (with \
             rustup: `{add}`)",
            rustc().to_string_lossy()
        );
    }
    // Both plugin crates' build scripts may get here at once: one adds the
    // target, the other finds it added.
    let lock_path = env::temp_dir().join("poimen-rustup-target-add.lock");
    let lock = fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    if target_installed() {
        return;
    }
    println!("cargo:warning=the {TARGET} target is missing; adding it for the plugins: {add}");
    let mut cmd = Command::new("rustup");
    cmd.current_dir(root).args(["target", "add", TARGET]);
    if let Some(t) = &toolchain {
        cmd.args(["--toolchain", t]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running `{add}`: {e}"));
    assert!(
        out.status.success(),
        "`{add}` failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        target_installed(),
        "`{add}` succeeded but {} still has no {TARGET} standard library",
        rustc().to_string_lossy()
    );
}

/// Runs the nested `cargo build --target wasm32-wasip2 --release` of
/// `plugins` into `target_dir`; returns the release directory.
fn build(root: &Path, target_dir: &Path, plugins: &[Plugin]) -> PathBuf {
    for watched in ["plugins", "guest-sdk", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    ensure_target(root);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .arg("build")
        .arg("--release")
        .arg("--target")
        .arg(TARGET)
        .arg("--target-dir")
        .arg(target_dir);
    for p in plugins {
        cmd.arg("--package").arg(&p.package);
    }
    // The outer build's flags are for the host target (and `cargo clippy`
    // sets a workspace wrapper that would lint instead of build): none of
    // them belong to the nested build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(var);
    }
    // Small components: they are embedded in the poimen binary.
    cmd.env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        status.success(),
        "building the plugins for {TARGET} failed ({status}); the compiler's messages are above"
    );
    let release = target_dir.join(TARGET).join("release");
    for p in plugins {
        let file = p.wasm(&release);
        assert!(file.is_file(), "{} was not built", file.display());
    }
    release
}
