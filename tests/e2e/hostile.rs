//! Hostile plugins against the host process: every attack of `adv-hog`
//! and `adv-http-hog` run through `poimen plugin call`, each in a process
//! of its own whose peak resident memory the kernel reports (`wait4`), so
//! the bound is the host's own — no other test shares it. Before these
//! limits the same attacks took the host to 4.7 GiB (the journal), 1.9 GiB
//! (header fields), 4.4 GiB (a result of many tiny objects), or aborted it
//! (a deep scratch tree).

use std::io::Read;
use std::process::Stdio;

use serde_json::{Value, json};

use crate::support::Env;

/// What no attack may push one `poimen plugin call` process past.
const PEAK_RSS_BOUND: u64 = 768 << 20;

/// A finished `poimen` process: its exit code, stdout, stderr, and the
/// peak resident memory the kernel measured for it alone.
struct Finished {
    code: i32,
    stdout: String,
    stderr: String,
    peak_rss: u64,
}

/// Runs `cmd` to its end and reaps it with `wait4`, which reports that one
/// child's resource use.
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which reports its resource use"
)]
fn run_measured(mut cmd: std::process::Command) -> Finished {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn poimen");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    let _ = out.read_to_string(&mut stdout);
    let stderr = reader.join().expect("stderr reader");
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of that plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped (`Child::wait` is never
    // called on it); `status` and `usage` are valid for writes.
    let reaped = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    };
    Finished {
        code,
        stdout,
        stderr,
        // Kilobytes on Linux.
        peak_rss: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
    }
}

fn call(env: &Env, tool: &str, args: Value) -> Finished {
    let mut cmd = env.std_cmd();
    cmd.args([
        "--json",
        "--no-bundled",
        "--plugins",
        "plugins",
        "--policy",
        "policy.toml",
        "plugin",
        "call",
        tool,
        &args.to_string(),
    ]);
    run_measured(cmd)
}

fn setup() -> Env {
    let env = Env::new();
    let plugins = env.path().join("plugins");
    std::fs::create_dir(&plugins).expect("mkdir");
    for (name, path) in [
        ("adv-hog.wasm", plugin_artifacts::ADV_HOG),
        ("adv-http-hog.wasm", plugin_artifacts::ADV_HTTP_HOG),
        ("text.wasm", plugin_artifacts::TEXT),
    ] {
        std::fs::copy(path, plugins.join(name)).expect("copy");
    }
    // Time enough for each attack to reach its limit however slow the
    // machine (a debug build, a busy CI): the test is about which limit
    // stops it, not how soon.
    env.write(
        "policy.toml",
        "[plugins.adv-hog]\nlimits = { timeout-ms = 300000 }\n\n\
         [plugins.adv-http-hog]\nhttp = [\"127.0.0.1:9\"]\nlimits = { timeout-ms = 300000 }\n",
    );
    env
}

#[test]
fn hostile_plugins_never_push_the_host_past_its_memory_bound_and_each_meets_its_own_error() {
    let env = setup();
    // The baseline: an ordinary call.
    let ok = call(
        &env,
        "text",
        json!({"op": "count", "pattern": "a", "text": "banana"}),
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let baseline = ok.peak_rss;

    // (attack, arguments, the error kind and words it must end with)
    let attacks: &[(&str, Value, &str, &str)] = &[
        ("adv-hog", json!({"attack": "journal", "n": 60_000}), "", ""),
        (
            "adv-hog",
            json!({"attack": "long-path"}),
            "resource_exhausted",
            "bytes passed to the host in one call",
        ),
        (
            "adv-hog",
            json!({"attack": "fds"}),
            "resource_exhausted",
            "files open at once",
        ),
        (
            "adv-hog",
            json!({"attack": "deep"}),
            "resource_exhausted",
            "directory depth below a mount",
        ),
        (
            "adv-hog",
            json!({"attack": "disk"}),
            "resource_exhausted",
            "bytes written to disk",
        ),
        (
            "adv-hog",
            json!({"attack": "handles"}),
            "resource_exhausted",
            "resources held at once",
        ),
        (
            "adv-hog",
            json!({"attack": "listings", "n": 5000}),
            "resource_exhausted",
            "files open at once",
        ),
        (
            "adv-hog",
            json!({"attack": "tiny-objects"}),
            "resource_exhausted",
            "JSON values in the result",
        ),
        (
            "adv-http-hog",
            json!({"attack": "fields"}),
            "resource_exhausted",
            "resources held at once",
        ),
    ];
    let mut report = Vec::new();
    for (tool, args, kind, words) in attacks {
        let f = call(&env, tool, args.clone());
        let parsed: Value = serde_json::from_str(&f.stdout).unwrap_or_else(|e| {
            panic!(
                "{tool} {args}: exit {} and no JSON ({e}):\n{}\n{}",
                f.code, f.stdout, f.stderr
            )
        });
        // What a failure shows of the answer: its error and outcome, not
        // thousands of recorded host calls.
        let v = json!({
            "error": parsed["error"],
            "outcome": parsed["record"]["outcome"],
            "omitted": parsed["record"]["omitted"],
        });
        if kind.is_empty() {
            assert_eq!(f.code, 0, "{tool} {args}: {v}");
            let omitted = v["omitted"]["host_calls"].as_u64().unwrap_or(0);
            assert!(
                omitted > 50_000,
                "{tool} {args}: the journal was not bounded: {omitted}"
            );
        } else {
            assert_eq!(f.code, 1, "{tool} {args}: {v}\n{}", f.stderr);
            assert_eq!(v["outcome"]["kind"], *kind, "{tool} {args}: {v}");
            let message = v["error"].as_str().unwrap_or_default();
            assert!(message.contains(words), "{tool} {args}: {message}");
        }
        report.push(format!(
            "{tool} {}: peak {} MiB",
            args["attack"],
            f.peak_rss >> 20
        ));
        assert!(
            f.peak_rss < PEAK_RSS_BOUND,
            "{tool} {args}: the host process peaked at {} MiB (bound {} MiB; an ordinary call {} MiB)",
            f.peak_rss >> 20,
            PEAK_RSS_BOUND >> 20,
            baseline >> 20
        );
    }
    // The numbers, for whoever reads the test's output.
    println!(
        "ordinary call: peak {} MiB\n{}",
        baseline >> 20,
        report.join("\n")
    );
}
