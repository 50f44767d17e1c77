//! Shared setup: a host with every component loaded under a policy that
//! grants the first-party plugins temporary directories and a loopback
//! HTTP server, and helpers to call it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use poimen_sandbox::{
    Invocation, InvokeError, LimitOverrides, PluginHost, Policy, ToolRef, ToolRequest,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Every component `plugin-artifacts` built, except the two that must be
/// refused at load.
pub const LOADABLE: &[(&str, &str)] = &[
    ("json", plugin_artifacts::JSON),
    ("text", plugin_artifacts::TEXT),
    ("fs-read", plugin_artifacts::FS_READ),
    ("ledger", plugin_artifacts::LEDGER),
    ("ledger-idempotent", plugin_artifacts::LEDGER_IDEMPOTENT),
    ("http-get", plugin_artifacts::HTTP_GET),
    ("json-schema", plugin_artifacts::JSON_SCHEMA),
    ("matches", plugin_artifacts::MATCHES),
    ("adv-spin", plugin_artifacts::ADV_SPIN),
    ("adv-grow-memory", plugin_artifacts::ADV_GROW_MEMORY),
    ("adv-stack-overflow", plugin_artifacts::ADV_STACK_OVERFLOW),
    ("adv-panic", plugin_artifacts::ADV_PANIC),
    ("adv-huge-output", plugin_artifacts::ADV_HUGE_OUTPUT),
    ("adv-fs-escape", plugin_artifacts::ADV_FS_ESCAPE),
    ("adv-bad-output", plugin_artifacts::ADV_BAD_OUTPUT),
    ("adv-hog", plugin_artifacts::ADV_HOG),
    ("adv-http-hog", plugin_artifacts::ADV_HTTP_HOG),
];

/// A compile cache shared by every host in this test binary.
pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sandbox-compile-cache")
}

/// Compiles every component into the shared cache, once per test binary,
/// before any test builds a host: otherwise, on a cold cache, every test
/// would compile every component at the same time.
fn prime() {
    static PRIMED: OnceLock<()> = OnceLock::new();
    PRIMED.get_or_init(|| {
        // A runtime of its own, on a thread of its own: the caller is
        // already inside a test's runtime.
        let primer = std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let host = PluginHost::builder()
                    .cache_dir(cache_dir())
                    .build()
                    .await
                    .expect("host");
                for (_, path) in plugin_artifacts::ALL {
                    // Compiling is the point; whether it loads is each test's business.
                    let _ = host.inspect(bytes(path)).await;
                }
            });
        });
        primer.join().expect("priming the compile cache");
    });
}

/// A host builder using the shared compile cache (primed).
pub fn builder() -> poimen_sandbox::PluginHostBuilder {
    prime();
    PluginHost::builder().cache_dir(cache_dir())
}

/// The compiled components (`*.cwasm`) in a compile cache directory.
pub fn compiled_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .expect("ls")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .count()
}

pub fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A loopback HTTP server that answers every request with `hello` and
/// counts the connections it accepted.
pub struct Server {
    pub port: u16,
    pub connections: Arc<AtomicUsize>,
}

impl Server {
    pub async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let response = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Server { port, connections }
    }

    pub fn accepted(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// The directories and server one test host uses.
pub struct World {
    pub host: PluginHost,
    /// `/data` of `fs-read` and `adv-fs-escape`: holds `notes.txt`,
    /// `sub/inner.txt`, and symlinks `link-out` (to a directory outside)
    /// and `link-file` (to `../secret.txt`).
    pub data: PathBuf,
    /// `/ledger` of both ledgers.
    pub ledger: PathBuf,
    pub server: Server,
    _root: tempfile::TempDir,
}

pub const SECRET: &str = "the secret outside the grant";

/// A host with every loadable component, under a policy built in code.
pub async fn world() -> World {
    world_with(|p| p).await
}

/// As [`world`], with extra policy.
pub async fn world_with(extra: impl FnOnce(Policy) -> Policy) -> World {
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path().join("data");
    let ledger = root.path().join("ledger");
    let outside = root.path().join("outside");
    for d in [&data, &ledger, &outside, &data.join("sub")] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(data.join("notes.txt"), "inside the grant\n").expect("write");
    std::fs::write(data.join("sub/inner.txt"), "deeper\n").expect("write");
    std::fs::write(root.path().join("secret.txt"), SECRET).expect("write");
    std::fs::write(outside.join("secret.txt"), SECRET).expect("write");
    std::os::unix::fs::symlink(&outside, data.join("link-out")).expect("symlink");
    std::os::unix::fs::symlink("../secret.txt", data.join("link-file")).expect("symlink");

    let server = Server::start().await;
    let policy = Policy::in_code()
        .grant_fs_read("fs-read", "/data", &data)
        .and_then(|p| p.grant_fs_read("adv-fs-escape", "/data", &data))
        .and_then(|p| p.grant_fs_write("ledger", "/ledger", &ledger))
        .and_then(|p| p.grant_fs_write("ledger-idempotent", "/ledger", &ledger))
        .and_then(|p| p.allow_http("http-get", &format!("127.0.0.1:{}", server.port)))
        .and_then(|p| p.allow_http("adv-http-hog", &format!("127.0.0.1:{}", server.port)))
        .and_then(|p| p.allow_http("adv-http-hog", &format!("localhost:{}", server.port)))
        .expect("policy")
        .limit(
            "adv-grow-memory",
            LimitOverrides {
                memory_bytes: Some(64 << 20),
                ..LimitOverrides::default()
            },
        );
    let mut builder = builder().policy(extra(policy));
    for (name, path) in LOADABLE {
        builder = builder.component_bytes(format!("test:{name}"), bytes(path));
    }
    let host = builder.build().await.expect("host");
    World {
        host,
        data,
        ledger,
        server,
        _root: root,
    }
}

pub fn tool(name: &str) -> ToolRef {
    name.parse().expect("tool ref")
}

pub async fn call(host: &PluginHost, name: &str, args: Value) -> Invocation {
    host.invoke_tool(ToolRequest::new(tool(name), args, format!("key-{name}")))
        .await
}

/// Asserts the host still serves a plain call, after whatever went before.
pub async fn still_healthy(host: &PluginHost) {
    let r = call(
        host,
        "text",
        json!({"op": "count", "pattern": "a", "text": "banana"}),
    )
    .await;
    assert_eq!(
        r.outcome,
        Ok(json!({"count": 3})),
        "the next call on the same host failed"
    );
}

/// The error of an invocation that must have failed.
pub fn error(r: &Invocation) -> &InvokeError {
    match &r.outcome {
        Err(e) => e,
        Ok(v) => panic!("expected an error, got {v}"),
    }
}
