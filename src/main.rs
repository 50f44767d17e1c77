//! The `poimen` command line: argument parsing lives in `cli::args`, the
//! verbs in `cli::commands`; this file only runs them and turns an error into
//! one line, its causes, and a documented exit code.

mod cli;
mod mcp;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
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
    match runtime.block_on(cli::commands::run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            cli::report(&e);
            ExitCode::from(cli::exit_code(&e))
        }
    }
}
