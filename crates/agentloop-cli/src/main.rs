//! The `agentloop` binary (DESIGN §9).
//!
//! - `agentloop run` runs sessions of the simulated agent (see [`run`]).
//! - `agentloop sessions list|show` prints the stored session records of a data
//!   directory, offline (see [`sessions`]).
//!
//! Exit codes: 0 success, 1 failure (the message says what and what to do), 2 bad
//! arguments (with the usage).

mod run;
mod sessions;
mod timefmt;

use std::io::Write as _;
use std::process::ExitCode;

const USAGE: &str = "\
usage: agentloop run [--sessions N] [--items-per-session M] [--model-ms MS] [--tool-ms MS]
       agentloop sessions list [--data-dir DIR] [--status STATUS[,STATUS...]] [--json]
       agentloop sessions show <id> [--data-dir DIR] [--json]";

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

/// `agentloop run`: parses its arguments, then runs it on a multi-threaded tokio
/// runtime. Any failure exits 2, as it always has.
fn run_command(args: &[String]) -> ExitCode {
    let result = run::parse_run(args).and_then(|a| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the tokio runtime: {e}"))?
            .block_on(run::run(a))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentloop: {e}");
            ExitCode::from(2)
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
