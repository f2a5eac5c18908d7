//! The `agentloop` binary (DESIGN §9).
//!
//! - `agentloop run` runs sessions of the simulated agent on the sled store, with live
//!   progress and a graceful shutdown on Ctrl+C / SIGTERM (see [`run`]).
//! - `agentloop serve` serves sessions over HTTP (see [`serve`]).
//! - `agentloop push|stop|cancel|resume|delete|watch --server URL` and `agentloop
//!   sessions list|show --server URL` talk to a running server (see [`remote`]).
//! - `agentloop sessions list|show|history|delete|export|import` reads, deletes and
//!   moves the stored session records of a data directory, offline (see [`sessions`]).
//!
//! Exit codes: 0 success, 1 failure (the message says what and what to do), 2 bad
//! arguments (one line saying what was wrong; clap, `cli.rs`).

mod cli;
mod otel;
mod remote;
mod report_table;
mod run;
mod serve;
mod sessions;
mod text_table;
mod timefmt;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use clap::Parser as _;

/// Why a command did not succeed.
pub(crate) enum Failure {
    /// Bad arguments found after parsing (exit 2): what was wrong, in one line.
    Usage { message: String },
    /// The command failed (exit 1).
    Error(String),
}

/// The live heap is counted for the memory budget (`[limits] memory`, issue 52).
#[global_allocator]
static ALLOC: agentloop::memory::CountingAlloc<std::alloc::System> =
    agentloop::memory::CountingAlloc::new(std::alloc::System);

fn main() -> ExitCode {
    // clap prints help and the version (exit 0) and usage errors: one line saying what
    // was wrong, the usage line, a hint to --help (exit 2).
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Cmd::Run(flags) => match run::RunArgs::from_flags(flags) {
            Ok(args) => run_command(args),
            Err(message) => usage_error(&message),
        },
        cli::Cmd::Serve(flags) => serve_command(*flags),
        cli::Cmd::Watch(f) => match remote::Server::new(&f.server.server, f.server.token)
            .and_then(|s| remote::watch(&s, &f.id, f.reconnects))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(e),
        },
        cli::Cmd::Push(_)
        | cli::Cmd::Stop(_)
        | cli::Cmd::Cancel(_)
        | cli::Cmd::Resume(_)
        | cli::Cmd::Delete(_)
        | cli::Cmd::Timer(_)
        | cli::Cmd::CancelTimer(_) => match live(cli.command) {
            Ok(out) => print_stdout(&out),
            Err(e) => failure(e),
        },
        cli::Cmd::Sessions(cmd) => match sessions::command(cmd).and_then(sessions::run) {
            Ok(out) => print_stdout(&out),
            Err(e) => failure(e),
        },
        cli::Cmd::Openapi => print_stdout(agentloop_http::openapi::document_json()),
    }
}

/// A live command against a running server; what to print.
fn live(cmd: cli::Cmd) -> Result<String, Failure> {
    let server = |a: cli::ServerArgs| remote::Server::new(&a.server, a.token);
    match cmd {
        cli::Cmd::Push(f) => {
            let item = remote::json_arg("item", &f.item)?;
            remote::push(
                &server(f.server)?,
                &f.id,
                item,
                f.preempt.as_deref(),
                f.key,
                f.retry_for,
            )
        }
        cli::Cmd::Stop(f) => {
            let mut options = serde_json::Map::new();
            for (k, v) in [
                ("mode", f.mode),
                ("timeout", f.timeout),
                ("at", f.at),
                ("idle_for", f.idle_for),
                ("cause", f.cause),
            ] {
                if let Some(v) = v {
                    options.insert(k.into(), v.into());
                }
            }
            if f.skip_checkpoint {
                options.insert("skip_checkpoint".into(), true.into());
            }
            remote::stop(&server(f.server)?, &f.id, options.into())
        }
        cli::Cmd::Cancel(f) => remote::cancel(&server(f.server)?, &f.id),
        cli::Cmd::Resume(f) => {
            let answer = remote::json_arg("answer", &f.answer)?;
            remote::resume(&server(f.server)?, &f.id, answer)
        }
        cli::Cmd::Delete(f) => remote::delete(&server(f.server)?, &f.id),
        cli::Cmd::Timer(f) => {
            let item = remote::json_arg("item", &f.item)?;
            let mut body = serde_json::json!({ "item": item });
            match (f.in_, f.at_ms, f.every, f.cron) {
                (Some(d), _, _, _) => body["in"] = d.into(),
                (_, Some(ms), _, _) => body["at_ms"] = ms.into(),
                (_, _, Some(every), _) => {
                    body["schedule"] = format!("every {}ms", every.as_millis()).into()
                }
                (_, _, _, Some(expr)) => body["schedule"] = expr.into(),
                (None, None, None, None) => {
                    return Err(Failure::Usage {
                        message: "say when: --in, --at-ms, --every or --cron".into(),
                    })
                }
            }
            remote::arm_timer(&server(f.server)?, &f.id, body)
        }
        cli::Cmd::CancelTimer(f) => remote::cancel_timer(&server(f.server)?, &f.id, f.timer),
        _ => Err(Failure::Error("not a live command".into())),
    }
}

/// A failure's exit: 2 with a usage line, or 1 with the message.
fn failure(e: Failure) -> ExitCode {
    match e {
        Failure::Usage { message } => usage_error(&message),
        Failure::Error(message) => {
            eprintln!("agentloop: {message}");
            ExitCode::from(1)
        }
    }
}

/// A usage error found after parsing: one line, a hint, exit 2.
fn usage_error(message: &str) -> ExitCode {
    eprintln!("error: {message}\n\nFor more information, try '--help'.");
    ExitCode::from(2)
}

/// `agentloop run`: runs the job on a multi-threaded tokio runtime: 0 after a clean
/// shutdown, 1 if it could not start or a record could not be written. Logs go to
/// stderr (`RUST_LOG`, default `warn`); progress and the report go to stdout.
fn run_command(args: run::RunArgs) -> ExitCode {
    block_on(run::run(args))
}

/// `agentloop serve`: like `run`, until a signal shuts it down; with
/// `--otlp-endpoint`, its spans are exported over OTLP (S42) and flushed at the end.
fn serve_command(flags: cli::ServeFlags) -> ExitCode {
    let otlp = flags.otlp_endpoint.clone();
    block_on_traced(serve::serve(flags), otlp.as_deref())
}

/// Logs to stderr (`RUST_LOG`, default `warn`, and the access log at INFO when `[http]
/// access_log` installs it), runs `job` on a multi-threaded tokio
/// runtime: 0 after a clean shutdown, 1 if it could not start or a record could not be
/// written.
fn block_on(job: impl std::future::Future<Output = Result<bool, String>>) -> ExitCode {
    block_on_traced(job, None)
}

/// [`block_on`], exporting spans to the OTLP collector at `otlp` when given.
fn block_on_traced(
    job: impl std::future::Future<Output = Result<bool, String>>,
    otlp: Option<&str>,
) -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,agentloop_http::access=info,tower_http::trace::on_response=info",
        )
    });
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log redirected to a file stays plain text.
        .with_ansi(std::io::stderr().is_terminal())
        // A log line that cannot be written (stderr a closed pipe: `serve 2>&1 | head`)
        // is dropped: reporting it with eprintln! would panic the task that logged,
        // such as the one that starts the shutdown (S34a).
        .log_internal_errors(false)
        .with_filter(filter);
    let (otel, provider) = match otlp.map(otel::layer) {
        None => (None, None),
        Some(Ok((layer, provider))) => (Some(layer), Some(provider)),
        Some(Err(e)) => {
            let _ = writeln!(std::io::stderr(), "agentloop: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))
        .and_then(|rt| rt.block_on(job));
    if let Some(p) = provider {
        // Flushes the batched spans (blocking, outside the runtime).
        if let Err(e) = p.shutdown() {
            let _ = writeln!(
                std::io::stderr(),
                "agentloop: the last traces were not exported: {e}"
            );
        }
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            // Not eprintln!: a closed stderr must not turn an exit into a panic.
            let _ = writeln!(std::io::stderr(), "agentloop: {e}");
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
