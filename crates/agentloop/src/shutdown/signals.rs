//! Signals (DESIGN S28): SIGINT (Ctrl+C, everywhere through tokio) and SIGTERM (on Unix)
//! start the shutdown; a second signal skips to force.
//!
//! This module only turns signals into coordinator messages; it decides nothing about
//! sessions.

use super::coordinator::ShutdownHandle;

/// Which signal arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT / Ctrl+C.
    Interrupt,
    /// SIGTERM.
    Terminate,
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        })
    }
}

/// Listens for SIGINT and SIGTERM from now on: the first starts the shutdown, the
/// second skips to force; later ones are ignored. `on_signal` is told of each one: it
/// is where the program says so to its user (a CLI prints a line). Each one is also
/// logged, at INFO, for a log file: a program that says it and logs at WARN (the
/// `agentloop` binary's default) shows it once, not twice (issue 53). Fails only when
/// the signal handlers cannot be installed.
pub fn listen(
    shutdown: ShutdownHandle,
    on_signal: impl Fn(Signal, usize) + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Installs the SIGINT handler now, so a signal right after this call is not missed.
    #[cfg(unix)]
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    Ok(tokio::spawn(async move {
        let mut count = 0usize;
        loop {
            #[cfg(unix)]
            let sig = tokio::select! {
                Some(()) = int.recv() => Signal::Interrupt,
                Some(()) = term.recv() => Signal::Terminate,
                else => return,
            };
            #[cfg(not(unix))]
            let sig = match tokio::signal::ctrl_c().await {
                Ok(()) => Signal::Interrupt,
                Err(_) => return,
            };
            count += 1;
            // The shutdown starts before anything is said about it: a callback or a
            // logger that fails (a closed stderr) must not keep it from starting (S34a).
            match count {
                1 => shutdown.begin(),
                2 => shutdown.force(),
                _ => {}
            }
            on_signal(sig, count);
            match count {
                1 => {
                    tracing::info!(signal = %sig, "signal received: shutting down (send it again to force)");
                }
                2 => {
                    tracing::info!(signal = %sig, "second signal: skipping to force");
                }
                _ => {
                    tracing::info!(signal = %sig, "shutdown already forced; waiting for it to finish")
                }
            }
        }
    }))
}
