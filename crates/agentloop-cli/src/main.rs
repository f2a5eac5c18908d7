//! The `agentloop` binary (DESIGN §9).
//!
//! - `agentloop run` runs sessions of the simulated agent on the sled store, with live
//!   progress and a graceful shutdown on Ctrl+C / SIGTERM (see [`run`]).
//! - `agentloop sessions list|show|history|delete` reads (and deletes) the stored
//!   session records of a data directory, offline (see [`sessions`]).
//!
//! Exit codes: 0 success, 1 failure (the message says what and what to do), 2 bad
//! arguments (with the usage).

mod report_table;
mod run;
mod sessions;
mod timefmt;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

const USAGE: &str = "\
usage: agentloop run [--config FILE] [--data-dir DIR] [--engine sled|fjall] [--durability crash|power]
                     [--sessions N] [--items-per-session M]
                     [--push-ms MS] [--rounds R] [--model-ms MS] [--tool-ms MS]
                     [--item-log FILE]
       agentloop sessions list [--data-dir DIR] [--status STATUS[,STATUS...]] [--json]
       agentloop sessions show <id> [--data-dir DIR] [--config FILE] [--json] [--raw]
       agentloop sessions history <id> [--data-dir DIR] [--json]
       agentloop sessions delete <id> [--data-dir DIR]";

/// Why a command did not succeed.
pub(crate) enum Failure {
    /// Bad arguments: the message and the usage to print with it (exit 2).
    Usage {
        message: String,
        usage: &'static str,
    },
    /// The command failed (exit 1).
    Error(String),
}

fn main() -> ExitCode {
    let mut args = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(a) => args.push(a),
            Err(bad) => {
                eprintln!("agentloop: argument {bad:?} is not valid UTF-8\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match args.first().map(String::as_str) {
        Some("run") if args[1..].iter().any(|a| a == "-h" || a == "--help") => {
            print_stdout(&format!("{}\n", run::RUN_USAGE))
        }
        Some("run") => run_command(&args[1..]),
        Some("sessions") => match sessions::main(&args[1..]) {
            Ok(out) => print_stdout(&out),
            Err(Failure::Usage { message, usage }) => {
                eprintln!("agentloop: {message}\n{usage}");
                ExitCode::from(2)
            }
            Err(Failure::Error(message)) => {
                eprintln!("agentloop: {message}");
                ExitCode::from(1)
            }
        },
        Some("-h" | "--help" | "help") => print_stdout(&format!("{USAGE}\n")),
        _ => {
            eprintln!("agentloop: {USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `agentloop run`: parses its arguments (bad ones exit 2 with the usage), then runs
/// the job on a multi-threaded tokio runtime: 0 after a clean shutdown, 1 if it could
/// not start or a record could not be written. Logs go to stderr (`RUST_LOG`, default
/// `warn`); progress and the report go to stdout.
fn run_command(args: &[String]) -> ExitCode {
    let args = match run::parse_run(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agentloop: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log redirected to a file stays plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))
        .and_then(|rt| rt.block_on(run::run(args)));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("agentloop: {e}");
            ExitCode::from(1)
        }
    }
}

/// Writes `out` to stdout; a closed pipe (`agentloop sessions list | head`) is not an
/// error.
fn print_stdout(out: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentloop: cannot write to stdout: {e}");
            ExitCode::from(1)
        }
    }
}
