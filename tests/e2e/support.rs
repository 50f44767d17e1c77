//! Helpers: an isolated environment (its own store and working directory)
//! and the `poimen` binary built for these tests.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file under `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    repo().join("fixtures").join(rel)
}

/// The `poimen` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_poimen")
}

/// A compile cache shared by every test process: components are keyed by
/// digest and engine settings, so sharing is safe and saves recompiling the
/// plugins in every `poimen` process.
pub fn shared_cache() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("poimen-e2e-cache");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// A working directory with its own store, isolated from the environment.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `poimen` in this environment.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.current_dir(self.path())
            .env("POIMEN_HOME", self.path().join("home"))
            .env_remove("POIMEN_POLICY")
            .env_remove("POIMEN_MODEL_URL")
            .env_remove("POIMEN_CRASH_AT")
            .env_remove("POIMEN_STORE")
            .env("POIMEN_CACHE_DIR", shared_cache())
            .env("NO_COLOR", "1");
        c
    }

    /// A `std::process::Command` for `poimen` in this environment.
    pub fn std_cmd(&self) -> std::process::Command {
        let mut c = std::process::Command::new(bin());
        c.current_dir(self.path())
            .env("POIMEN_HOME", self.path().join("home"))
            .env_remove("POIMEN_POLICY")
            .env_remove("POIMEN_MODEL_URL")
            .env_remove("POIMEN_CRASH_AT")
            .env_remove("POIMEN_STORE")
            .env("POIMEN_CACHE_DIR", shared_cache());
        c
    }

    /// Writes a file into the environment.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, text).expect("write");
        p
    }

    /// Runs `poimen --json ARGS…` and parses its stdout; returns (exit code, JSON).
    pub fn json(&self, args: &[&str]) -> (i32, Value) {
        let out = self
            .cmd()
            .arg("--json")
            .args(args)
            .output()
            .expect("run poimen");
        let code = out.status.code().unwrap_or(-1);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "poimen {args:?} (exit {code}) did not print JSON ({e}):\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (code, v)
    }
}

/// A `poimen serve` process, killed when dropped.
pub struct Served {
    pub id: String,
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl Served {
    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} {}", self.id);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Env {
    /// `poimen ARGS… serve` with a short poll, as a background process
    /// whose log is `ID.log` (killed when the value drops).
    pub fn serve(&self, args: &[&str], id: &str) -> Served {
        let log = self.path().join(format!("{id}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = self
            .std_cmd()
            .args(args)
            .arg("serve")
            .args(["--host-id", id, "--poll", "20ms", "--lease-ttl", "2s"])
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn poimen serve");
        Served {
            id: id.to_owned(),
            child,
            log,
        }
    }
}
