//! The `poimen` command line: argument parsing lives in `cli::args`, the
//! verbs in `cli::commands`; this file only runs them and turns an error into
//! one line, its causes, and a documented exit code.

mod cli;
mod mcp;
mod telemetry;

use std::process::ExitCode;

use clap::Parser;

// A step allocates and frees many small values (events, state, template
// context); mimalloc takes a third off the per-step cost against glibc's
// allocator (BENCHMARKS.md, "Telemetry on vs off": the *off* figure under
// each). Embedders choose their own.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The bundled SQLite allocates with the C allocator, not the one above. A
/// reader connection drops its whole page cache whenever another connection
/// has committed (WAL mode: every run's commit) and refills it page by page
/// on its next read; glibc's default trim threshold (128 KiB) hands the
/// freed pages back to the kernel each time, and the refill takes a page
/// fault per page — measured as a third of the server's CPU per run
/// (BENCHMARKS.md, "A run over HTTP: ... (issue 44, part 3)"). Keeping up
/// to 32 MiB of freed memory in the process ends that. An operator's
/// `GLIBC_TUNABLES` wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    const TRIM_THRESHOLD: libc::c_int = 32 << 20;
    // SAFETY: `mallopt` only sets a parameter of glibc's allocator; it is
    // called first thing in `main`, before any other thread exists.
    let ok = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) };
    if ok != 1 {
        eprintln!("warning: glibc refused M_TRIM_THRESHOLD; SQLite reads will cost more CPU");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
    let args = cli::args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(cli::exit::ERROR);
        }
    };
    // `serve` logs at `info`; other verbs only when POIMEN_LOG asks.
    let log_default = matches!(args.command, cli::args::Command::Serve { .. }).then_some("info");
    let telemetry = match telemetry::init(
        log_default,
        args.global.otlp_endpoint.as_deref(),
        runtime.handle().clone(),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(cli::exit::USAGE);
        }
    };
    let code = match runtime.block_on(cli::commands::run(args)) {
        Ok(code) => ExitCode::from(code),
        // The reader closed stdout (`| head`): what it did not read is not
        // an error of ours.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::from(cli::exit::OK),
        Err(e) => {
            cli::report(&e);
            ExitCode::from(cli::exit_code(&e))
        }
    };
    // The exporter's last requests run on the runtime: flush, then drop it.
    telemetry.shutdown();
    drop(runtime);
    code
}
