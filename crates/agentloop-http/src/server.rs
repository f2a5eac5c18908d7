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

/// The connection-level bounds of [`serve`], and its TLS.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Connections at once; one more is closed at once.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive (also between keep-alive
    /// requests); the connection is closed after it.
    pub header_read_timeout: Duration,
    /// How long a write to the client may make no progress (its socket buffer stays
    /// full); the connection is closed after it.
    pub write_timeout: Duration,
    /// Terminate TLS with this configuration (S43, [`crate::tls::server_config`]):
    /// every connection is a TLS one, served over HTTP/2 or HTTP/1.1 as the client's
    /// ALPN chooses. `None`: plain HTTP/1.1.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            tls: None,
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
    let handshake_failures: Arc<Throttle> = Arc::default();
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
        if let Some(tls) = &options.tls {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.clone());
            let watcher = graceful.watcher();
            let header_read_timeout = options.header_read_timeout;
            let failures = handshake_failures.clone();
            tokio::spawn(async move {
                serve_tls(
                    acceptor,
                    Box::pin(stream),
                    peer,
                    service,
                    header_read_timeout,
                    watcher,
                    &failures,
                )
                .await;
                drop(permit);
            });
            continue;
        }
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

/// One TLS connection (S43): the handshake, bounded by `header_read_timeout` like a
/// request's headers, then HTTP/2 or HTTP/1.1 as the client's ALPN chose, watched for
/// the graceful shutdown.
async fn serve_tls<S>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: S,
    peer: std::net::SocketAddr,
    service: TowerToHyperService<Router>,
    header_read_timeout: Duration,
    watcher: hyper_util::server::graceful::Watcher,
    failures: &Throttle,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let tls = match tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            // A client that does not speak TLS, or distrusts the certificate: its own
            // side shows why. At most one line a second, with the count since: a
            // scanner must not become a flood of logs.
            if let Some(count) = failures.note() {
                tracing::warn!(%peer, error = %e, failed = count, "TLS handshakes failed (a client speaking plain HTTP to a TLS port, or one that does not trust the certificate)");
            }
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "closed a connection whose TLS handshake did not finish in time ([http] header_read_timeout)");
            return;
        }
    };
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
    if let Err(e) = watcher.watch(connection.into_owned()).await {
        tracing::debug!(%peer, error = %e, "TLS connection ended with an error");
    }
}

/// Counts events and says when to log them: at most once a second, with how many
/// happened since the last line.
#[derive(Default)]
struct Throttle {
    state: parking_lot::Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// Counts one; `Some(count)` when a line is due (the count since the last one).
    fn note(&self) -> Option<u64> {
        let mut s = self.state.lock();
        s.1 += 1;
        if s.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            let count = s.1;
            *s = (Some(Instant::now()), 0);
            return Some(count);
        }
        None
    }
}
