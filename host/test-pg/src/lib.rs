//! Throwaway PostgreSQL servers for poimen's tests and benches.
//!
//! No system service, port or authentication setting is assumed: a server
//! is `initdb` in a temporary directory, started with `pg_ctl` on a free
//! loopback port with trust authentication, and torn down — stopped, its
//! directory deleted — when it is dropped or, at the latest, when the
//! process that started it exits, however it exits: a watchdog shell holds
//! the read end of a pipe whose write end only this process has, and stops
//! the server once that pipe closes.
//!
//! [`url`] is the server a test binary's PostgreSQL tests share: the one
//! `POIMEN_TEST_PG` names, when it is set, else one throwaway server
//! started on first use. [`Server`] is a server of a test's own (to stop
//! and start it under a running host). The binaries are
//! `POIMEN_TEST_PG_BIN`'s, else the newest `/usr/lib/postgresql/*/bin`
//! (Debian's layout), else `pg_config --bindir`'s; without them the test
//! fails naming the package to install, never skips.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The admin URL (database `postgres`, user `postgres`) of the server this
/// process's PostgreSQL tests share: `POIMEN_TEST_PG` when set, else a
/// throwaway server started now (once per process).
pub fn url() -> String {
    if let Ok(url) = std::env::var("POIMEN_TEST_PG")
        && !url.is_empty()
    {
        return url;
    }
    static SHARED: OnceLock<Server> = OnceLock::new();
    SHARED.get_or_init(Server::start).url()
}

/// `url` naming database `name` instead of its own (its query kept).
pub fn with_dbname(url: &str, name: &str) -> String {
    let (scheme, rest) = url
        .split_once("://")
        .unwrap_or_else(|| panic!("`{url}` is not a postgres:// URL"));
    let query_at = rest.find('?').unwrap_or(rest.len());
    let (head, query) = rest.split_at(query_at);
    let authority = head.split('/').next().unwrap_or(head);
    format!("{scheme}://{authority}/{name}{query}")
}

/// A PostgreSQL server of its own: stopped and deleted when dropped (or
/// when the process exits).
#[derive(Debug)]
pub struct Server {
    bin: PathBuf,
    /// The temporary directory: the data directory and the socket.
    root: PathBuf,
    data: PathBuf,
    port: u16,
    /// Run the binaries as `postgres` (this process is root, which
    /// `initdb` refuses).
    as_postgres: bool,
    /// Whether the server syncs its WAL (a bench's) or not (a test's).
    durable: bool,
    /// The watchdog: it stops the server and deletes `root` once its stdin
    /// closes.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

impl Server {
    /// Creates and starts a server in a new temporary directory, on a free
    /// port. It does not sync its writes to disk (`fsync = off`: what a
    /// test checks does not depend on it, and a test runs faster).
    pub fn start() -> Server {
        Server::create(false)
    }

    /// [`Server::start`] for a benchmark: the server syncs its WAL as a
    /// production server does.
    pub fn start_durable() -> Server {
        Server::create(true)
    }

    fn create(durable: bool) -> Server {
        let bin = bin_dir();
        let as_postgres = is_root();
        let tmp = tempfile::Builder::new()
            .prefix("poimen-pg-")
            .tempdir_in(std::env::temp_dir())
            .unwrap_or_else(|e| panic!("a temporary directory for PostgreSQL: {e}"));
        let root = tmp.keep();
        let data = root.join("data");
        std::fs::create_dir(&data).unwrap_or_else(|e| panic!("{}: {e}", data.display()));
        if as_postgres {
            // The server's user must own its directory and reach it.
            chmod_755(&root);
            let owned = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&root)
                .arg(&data)
                .status();
            assert!(
                owned.is_ok_and(|s| s.success()),
                "this test runs as root and starts PostgreSQL as the `postgres` user, which \
                 does not exist here: install the `postgresql` package (it creates the user)"
            );
        }
        let mut server = Server {
            bin,
            root: root.clone(),
            data,
            port: 0,
            as_postgres,
            durable,
            watchdog: Mutex::new(None),
        };
        server.arm_watchdog();
        let data = server.data_str();
        server.run(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--no-instructions",
            ],
        );
        // A port found free may be taken before the server binds it: try
        // another then.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.try_start() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("PostgreSQL did not start in {}: {last}", root.display());
    }

    /// The admin URL: database `postgres`, user `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on (at 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server (fast shutdown: clients are disconnected).
    pub fn stop(&self) {
        let data = self.data_str();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
    }

    /// Starts it again on the same port and directory.
    pub fn start_again(&self) {
        if let Err(e) = self.try_start() {
            panic!("PostgreSQL did not start again: {e}");
        }
    }

    fn try_start(&self) -> Result<(), String> {
        let data = self.data_str();
        let root = self.root.to_string_lossy().into_owned();
        let mut opts = format!(
            "-p {} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=400",
            self.port
        );
        if !self.durable {
            opts.push_str(" -c fsync=off -c full_page_writes=off");
        }
        let log = format!("{data}/server.log");
        let out = self
            .command("pg_ctl")
            .args([
                "-D", &data, "-o", &opts, "-l", &log, "-w", "-t", "60", "start",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running pg_ctl: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let server_log = std::fs::read_to_string(&log).unwrap_or_default();
        Err(format!(
            "pg_ctl start: {}{}\n{server_log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    fn data_str(&self) -> String {
        self.data.to_string_lossy().into_owned()
    }

    /// A server binary, as `postgres` when this process is root.
    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = self
            .command(tool)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the shell that tears the server down once this process lets
    /// go of its stdin — on drop, or when the process exits.
    fn arm_watchdog(&self) {
        let runuser = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        let script = format!(
            "echo armed; read _; {runuser}\"$1/pg_ctl\" -D \"$2\" -m immediate -w stop \
             >/dev/null 2>&1; rm -rf \"$3\""
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&self.bin)
            .arg(&self.data)
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the PostgreSQL watchdog shell (sh): {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        // Armed before the server exists, so no exit between leaves one behind.
        if let Some(out) = child.stdout.take() {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
        }
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some((child, stdin));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let taken = self
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((mut child, stdin)) = taken {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn chmod_755(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// The directory of `initdb` and `pg_ctl`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("POIMEN_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return bin;
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if bin.join("initdb").exists() {
            return bin;
        }
    }
    panic!(
        "the PostgreSQL tests start a throwaway server of their own and need the server \
         binaries (initdb, pg_ctl): install the `postgresql` package (Debian: `apt-get install \
         postgresql`), point POIMEN_TEST_PG_BIN at their directory, or point POIMEN_TEST_PG at \
         a running server"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_another_database_keeping_its_query() {
        assert_eq!(
            with_dbname("postgres://u@h:1/a?sslmode=disable", "b"),
            "postgres://u@h:1/b?sslmode=disable"
        );
        assert_eq!(with_dbname("postgres://u@h:1", "b"), "postgres://u@h:1/b");
    }

    #[test]
    fn a_server_starts_stops_and_is_gone_when_dropped() {
        let server = Server::start();
        let root = server.root.clone();
        let addr = format!("127.0.0.1:{}", server.port());
        assert!(std::net::TcpStream::connect(&addr).is_ok(), "listening");
        server.stop();
        assert!(std::net::TcpStream::connect(&addr).is_err(), "stopped");
        server.start_again();
        assert!(std::net::TcpStream::connect(&addr).is_ok(), "started again");
        drop(server);
        assert!(std::net::TcpStream::connect(&addr).is_err(), "stopped");
        assert!(!root.exists(), "{} deleted", root.display());
    }
}
