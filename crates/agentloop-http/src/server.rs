//! Serving the router on a TCP listener with the bounds `axum::serve` does not set
//! (S34a, issue 29): at most `max_connections` connections at once (one over the bound
//! is closed at once and logged), and a request whose headers have not arrived within
//! `header_read_timeout` is answered by closing its connection (hyper's HTTP/1 header
//! timer). Without them, 20 000 half-sent requests took every descriptor and the server
//! stopped answering. A connection whose writes make no progress for `write_timeout`
//! (a client that stopped reading an event stream, Ctrl+Z on `agentloop watch`) is
//! closed (`tokio-io-timeout` around the socket), so it holds no stream slot, no
//! subscription and no shutdown.
//!
//! This file only accepts connections and hands them to hyper (hyper-util's tower
//! adapter, its graceful-shutdown watcher); routing and everything else is the router's.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// How long a request's headers may take to arrive by default.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a write to a client may make no progress by default.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection-level bounds of [`serve`].
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Connections at once; one more is closed at once.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive (also between keep-alive
    /// requests); the connection is closed after it.
    pub header_read_timeout: Duration,
    /// How long a write to the client may make no progress (its socket buffer stays
    /// full); the connection is closed after it.
    pub write_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

/// Serves `app` on `listener` under `options` until `shutdown` resolves; then stops
/// accepting and waits for the connections in flight to finish (bound that wait with a
/// timeout: a stream that never ends keeps it open).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) {
    let connections = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut last_refusal_logged: Option<Instant> = None;
    let mut last_accept_logged: Option<Instant> = None;
    let mut accept_failures = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was
                    // taken: say so (at most one line a second, with how many failed
                    // since), give the process a moment, go on.
                    accept_failures += 1;
                    if last_accept_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        last_accept_logged = Some(Instant::now());
                        tracing::warn!(error = %e, failures = accept_failures, "cannot accept a connection (out of file descriptors? raise `ulimit -n` or lower [http] max_connections); retrying");
                        accept_failures = 0;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            // At most one line a second: a flood must not become a flood of logs.
            if last_refusal_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                last_refusal_logged = Some(Instant::now());
                tracing::warn!(
                    max_connections = options.max_connections,
                    %peer,
                    "connection bound reached: closing new connections until some end ([http] max_connections)"
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(options.write_timeout));
        let service = TowerToHyperService::new(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(options.header_read_timeout)
            .serve_connection(TokioIo::new(Box::pin(stream)), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                let timed_out = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
                match timed_out {
                    true => {
                        tracing::info!(%peer, "closed a connection that stopped reading ([http] write_timeout)")
                    }
                    false => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
