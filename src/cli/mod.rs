//! The CLI's shared parts: exit codes, the error report, output helpers.

/// `println!` for the CLI's output: a closed stdout (`poimen … | head -1`)
/// ends the output, not the command — the run it reports on still completes
/// and the exit code still says how it ended.
macro_rules! outln {
    () => {
        $crate::cli::emit(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::emit(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the CLI's output (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::emit(format_args!($($arg)*))
    };
}

pub mod args;
pub mod commands;

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout refused a write: everything after it is dropped.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Writes to stdout, unless it is gone. The first failed write ends all
/// output; a closed pipe is the reader's choice and says nothing, any other
/// failure (a full disk behind a redirect) gets one warning on stderr.
pub fn emit(args: std::fmt::Arguments<'_>) {
    write_stdout(|out| out.write_fmt(args));
}

/// [`emit`] for bytes.
pub fn emit_bytes(bytes: &[u8]) {
    write_stdout(|out| out.write_all(bytes));
}

fn write_stdout(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = write(&mut out).and_then(|()| out.flush()) {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = writeln!(
                std::io::stderr(),
                "warning: cannot write to stdout ({e}); the rest of the output is dropped"
            );
        }
    }
}

/// Whether an error is stdout closing under us (nothing to report).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Documented, stable exit codes (see `poimen --help`).
pub mod exit {
    /// The command did what it was asked; a run completed.
    pub const OK: u8 = 0;
    /// A run failed or was cancelled.
    pub const RUN_FAILED: u8 = 1;
    /// The command line or its input is wrong: bad arguments, a missing
    /// file, input that is not JSON, an unknown run, version or judgment.
    pub const USAGE: u8 = 2;
    /// A workflow does not parse or does not validate.
    pub const INVALID: u8 = 3;
    /// A run is blocked (needs an operator) or waiting (needs a judge).
    pub const STOPPED: u8 = 4;
    /// The environment failed: the store, the plugin host, the disk.
    pub const ERROR: u8 = 5;
}

/// A usage error found by the CLI itself (not by the library).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// An invalid-workflow outcome already reported in detail.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// The exit code of an error.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<Usage>().is_some() || e.downcast_ref::<clap::Error>().is_some() {
        return exit::USAGE;
    }
    if e.downcast_ref::<Invalid>().is_some() {
        return exit::INVALID;
    }
    match e.downcast_ref::<poimen::Error>() {
        Some(p) => exit_code_of(p),
        None => exit::ERROR,
    }
}

/// The exit code of a library error.
pub fn exit_code_of(p: &poimen::Error) -> u8 {
    {
        match p {
            poimen::Error::Parse(_)
            | poimen::Error::Invalid { .. }
            | poimen::Error::Policy { .. }
            | poimen::Error::ToolNameTaken { .. } => exit::INVALID,
            // Refused by the policy: the request is not one this host takes.
            poimen::Error::NotAllowed { .. }
            | poimen::Error::Disarmed { .. }
            | poimen::Error::NotArmed { .. } => exit::USAGE,
            poimen::Error::Shadow(s) => match s {
                poimen::shadow::ShadowError::Ineligible(_)
                | poimen::shadow::ShadowError::DifferentWorkflows { .. } => exit::INVALID,
                poimen::shadow::ShadowError::NoRuns { .. }
                | poimen::shadow::ShadowError::BadRate(_) => exit::USAGE,
                _ => exit::ERROR,
            },
            poimen::Error::Read { .. }
            | poimen::Error::TooLarge { .. }
            | poimen::Error::UnknownFormat { .. }
            | poimen::Error::NotFound { .. }
            | poimen::Error::BadTarget { .. }
            | poimen::Error::BadInput(_)
            | poimen::Error::BadId(_)
            | poimen::Error::NoRetention => exit::USAGE,
            poimen::Error::Start(s) => start_code(s),
            poimen::Error::Run(r) => run_code(r),
            poimen::Error::Driver { cause, .. } => run_code(cause),
            poimen::Error::Operator(poimen::OperatorError::Run(r))
            | poimen::Error::Judgment(poimen::JudgmentError::Run(r)) => run_code(r),
            // The run is in another state, the step has no such call, the
            // answer does not fit its request: the request is wrong.
            poimen::Error::Operator(_) | poimen::Error::Judgment(_) => exit::USAGE,
            _ => exit::ERROR,
        }
    }
}

fn start_code(e: &poimen::StartError) -> u8 {
    use poimen::StartError as S;
    match e {
        S::Store(_) | S::Fold(_) | S::Unavailable { .. } | S::Replace(_) => exit::ERROR,
        // Refused for want of a slot: like a blocked run, try later.
        S::Overflow { .. } | S::Shed { .. } => exit::STOPPED,
        _ => exit::USAGE,
    }
}

fn run_code(e: &poimen::RunError) -> u8 {
    use poimen::RunError as R;
    match e {
        R::UnknownRun(_) | R::TooDeep { .. } => exit::USAGE,
        R::Start(s) => start_code(s),
        _ => exit::ERROR,
    }
}

/// Prints an error: one line that says what went wrong and what to do, then
/// its causes. Never a panic or a Debug dump.
pub fn report(e: &anyhow::Error) {
    let red = std::io::stderr().is_terminal();
    let label = if red {
        "\x1b[1;31merror\x1b[0m"
    } else {
        "error"
    };
    eprintln!("{label}: {e}");
    match e.downcast_ref::<poimen::Error>() {
        Some(poimen::Error::Invalid { errors, .. }) => {
            for err in errors {
                eprintln!("  - {err}");
            }
        }
        Some(poimen::Error::Policy { violations, .. }) => {
            for v in violations {
                eprintln!("  - {v}");
            }
        }
        _ => {}
    }
    // Causes, unless the line above already says them.
    let mut shown = e.to_string();
    for c in e.chain().skip(1) {
        let text = c.to_string();
        if !shown.contains(&text) {
            eprintln!("  caused by: {text}");
            shown.push_str(&text);
        }
    }
}
