//! The `floodgate` binary: parses the command line, runs one command, maps it to an exit code.
//!
//! Exit codes: 0 success; 1 `check-config` found errors; 2 usage errors (clap) and commands
//! not available in this build.

use std::process::ExitCode;

use clap::Parser;
use floodgate::cli::{Cli, Command, ServeArgs};
use floodgate::config;

fn main() -> ExitCode {
    match Cli::parse().into_command() {
        Command::Serve(args) => serve(&args),
        Command::CheckConfig { dir } => check_config(&dir),
    }
}

/// Prints every error of `dir` to stderr, one per line, or a summary to stdout.
fn check_config(dir: &std::path::Path) -> ExitCode {
    match config::load_dir(dir) {
        Ok(loaded) => {
            println!(
                "OK: {} domains, {} rules",
                loaded.domains.len(),
                loaded.rule_count()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

/// The service is wired in by the service module; until then say so plainly.
fn serve(args: &ServeArgs) -> ExitCode {
    eprintln!(
        "floodgate: `serve` is not available yet: it is wired by the service module \
         (parsed settings: {args:?}); use `floodgate check-config DIR` to validate rules"
    );
    ExitCode::from(2)
}
