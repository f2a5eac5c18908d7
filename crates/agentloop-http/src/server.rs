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
//! Issue 52: a TLS connection that sends nothing after its handshake, an HTTP/2
//! connection with no stream open, a response whose client takes nothing (an HTTP/2
//! stream whose window stays shut: its socket never blocks) and a connection that writes
//! nothing during the shutdown are closed (`server/conn.rs`); at the connection cap a peer keeps
//! no more than an equal share while others wait (`server/peers.rs`).
//!
//! Issue 53: on the TLS port, a connection that begins in plain text is answered `400
//! tls_required` when it is an HTTP/1 request ("use https://HOST:PORT/"), not with a
//! TLS alert that curl calls HTTP/0.9 (`server/plain.rs`).
//!
//! This file only accepts connections, admits them and hands them to hyper; routing and
//! everything else is the router's.

mod conn;
mod peers;
mod plain;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use conn::{Bounds, Closed, Conn, ConnService, JsonErrors, Watched};
use peers::{Peers, Refused};

/// Connections served at once by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// How long a request's headers may take to arrive by default.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a write to a client may make no progress by default.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (request line and headers) read by default.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// How long a connection may stay open with no request in flight by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a connection may write nothing once the shutdown began, by default.
pub const DEFAULT_SHUTDOWN_WRITE_TIMEOUT: Duration = Duration::from_millis(500);

/// The connection-level bounds of [`serve`], and its TLS.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Connections at once; one more is closed at once, unless its peer holds fewer
    /// than the peer holding the most: then it takes one of that peer's places (an
    /// idle connection first), so no peer keeps more than an equal share while others
    /// wait (issue 52).
    pub max_connections: usize,
    /// Connections one peer (an IPv4 address, an IPv6 /64) may hold at once; one more
    /// from it is closed at once. `None`: `max_connections` (the fairness at the cap
    /// still applies).
    pub max_connections_per_peer: Option<usize>,
    /// How long a request's headers may take to arrive (also between keep-alive
    /// requests); the connection is closed after it. A TLS connection must finish its
    /// handshake within it, then start its first request (an HTTP/2 client: open a
    /// stream) within it again.
    pub header_read_timeout: Duration,
    /// How long the client may take no data: a write to the socket that makes no
    /// progress, or a response (an event stream on HTTP/2 whose flow-control window
    /// stays shut) whose next frame the client does not take; the connection is closed
    /// after it.
    pub write_timeout: Duration,
    /// How long a connection may stay open with no request in flight (HTTP/2 with no
    /// stream open, HTTP/1.1 between requests); it is closed after it. HTTP/2
    /// connections are also pinged after this long without a frame, and closed when
    /// the ping is not answered within `write_timeout`.
    pub idle_timeout: Duration,
    /// Once the shutdown began, a connection that writes nothing for this long (a
    /// client that stopped reading its event stream) is closed instead of holding the
    /// shutdown.
    pub shutdown_write_timeout: Duration,
    /// The largest request head (its request line and headers, in bytes) read; over it
    /// the answer is 431 `headers_too_large` (JSON) and the connection is closed. Over
    /// HTTP/2 it bounds the header list (the HTTP/2 layer's own 431 over it). At least
    /// 8 KiB is read.
    pub max_header_bytes: usize,
    /// Terminate TLS with this configuration (S43, [`crate::tls::server_config`]):
    /// every connection is a TLS one, served over HTTP/2 or HTTP/1.1 as the client's
    /// ALPN chooses; a plain HTTP/1 request on it is answered `400 tls_required`
    /// ("this port speaks TLS: use https://HOST:PORT/") and closed. `None`: plain
    /// HTTP/1.1.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: None,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            shutdown_write_timeout: DEFAULT_SHUTDOWN_WRITE_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            tls: None,
        }
    }
}

/// What every connection task shares.
struct Shared {
    options: ServeOptions,
    handshake_failures: Throttle,
    closed: Throttle,
    /// Plain HTTP requests answered `400 tls_required` on the TLS port.
    plain_http: Throttle,
}

/// Serves `app` on `listener` under `options` until `shutdown` resolves; then stops
/// accepting, asks every connection to finish (HTTP/1.1 after its current request,
/// HTTP/2 with a GOAWAY) and waits for them; a connection that writes nothing for
/// `shutdown_write_timeout` meanwhile is closed, so a stalled client does not hold the
/// shutdown. (Bound that wait with a timeout still: a stream that keeps writing keeps
/// its connection open.)
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) {
    let peers = Peers::new(
        options.max_connections,
        options
            .max_connections_per_peer
            .unwrap_or(options.max_connections),
    );
    let clock = conn::Clock::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Every connection task holds a sender; all gone = all connections closed.
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    let shared = Arc::new(Shared {
        options,
        handshake_failures: Throttle::default(),
        closed: Throttle::default(),
        plain_http: Throttle::default(),
    });
    let mut shutdown = std::pin::pin!(shutdown);
    let refusals = Throttle::default();
    let evictions = Throttle::default();
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
        let conn = Conn::new(clock);
        let ticket = match peers.admit(peer.ip(), conn.clone()) {
            Ok(t) => t,
            Err(why) => {
                drop(stream);
                // At most one line a second: a flood must not become a flood of logs.
                if let Some(count) = refusals.note() {
                    let o = &shared.options;
                    match why {
                        Refused::Full => tracing::warn!(
                            max_connections = o.max_connections,
                            %peer,
                            closed = count,
                            "connection bound reached: closing new connections until some end ([http] max_connections)"
                        ),
                        Refused::PeerFull => tracing::warn!(
                            max_connections_per_peer = o.max_connections_per_peer.unwrap_or(o.max_connections),
                            %peer,
                            closed = count,
                            "a peer holds all the connections it may: closing its new ones until some end ([http] max_connections_per_peer)"
                        ),
                    }
                }
                continue;
            }
        };
        if ticket.evicted_another {
            if let Some(count) = evictions.note() {
                tracing::info!(
                    max_connections = shared.options.max_connections,
                    %peer,
                    evicted = count,
                    "connection bound reached: closed a connection of the peer holding the most to make room for another peer ([http] max_connections)"
                );
            }
        }
        let _ = stream.set_nodelay(true);
        let service = ConnService::new(app.clone(), conn.clone());
        let shared = shared.clone();
        let stop = stop_rx.clone();
        let alive = alive_tx.clone();
        tokio::spawn(async move {
            match &shared.options.tls {
                Some(tls) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls.clone());
                    serve_tls(acceptor, stream, peer, service, &conn, &shared, stop).await;
                }
                None => {
                    let o = &shared.options;
                    let stream = Watched::new(stream, conn.clone(), o.write_timeout);
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(o.header_read_timeout)
                        .max_header_size(head_bytes(o))
                        .max_buf_size(buf_size(o))
                        .serve_connection(
                            TokioIo::new(JsonErrors::new(stream, conn.clone(), head_bytes(o))),
                            service,
                        );
                    let ended = conn::drive(connection, &conn, bounds(o), stop).await;
                    report(peer, ended, &shared);
                }
            }
            drop(ticket);
            drop(alive);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let _ = alive_rx.recv().await;
}

/// The request head bound: at least 8 KiB (hyper's smallest read buffer).
fn head_bytes(o: &ServeOptions) -> usize {
    o.max_header_bytes.max(8192)
}

/// hyper's read buffer over plain HTTP/1.1: its default (about 400 KB), or more when the
/// head bound needs it.
fn buf_size(o: &ServeOptions) -> usize {
    (8192 + 4096 * 100).max(head_bytes(o).saturating_add(8192))
}

fn bounds(o: &ServeOptions) -> Bounds {
    Bounds {
        first_request: o.header_read_timeout,
        idle: o.idle_timeout,
        write: o.write_timeout,
        shutdown_write: o.shutdown_write_timeout,
    }
}

/// Logs how a connection ended when the server closed it for a bound (at most one line
/// a second for the lot, with the count since).
fn report(
    peer: std::net::SocketAddr,
    (why, error): (Closed, Option<Box<dyn std::error::Error + Send + Sync>>),
    shared: &Shared,
) {
    let timed_out = error.as_deref().is_some_and(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(s) = source {
            if s.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            {
                return true;
            }
            source = s.source();
        }
        false
    });
    let what = match (why, timed_out) {
        (Closed::Ended, true) | (Closed::Stalled, _) => {
            "closed a connection whose client took no data ([http] write_timeout: it stopped reading, or an HTTP/2 stream's window stayed shut)"
        }
        (Closed::Idle, _) => {
            "closed a connection that sent no request in time ([http] header_read_timeout for the first, idle_timeout after)"
        }
        (Closed::Shutdown, _) => {
            "closed a connection that wrote nothing during the shutdown ([http] shutdown_write_timeout)"
        }
        (Closed::Evicted, _) => {
            "closed a connection to give its place to another peer ([http] max_connections)"
        }
        (Closed::Ended, false) => {
            if let Some(e) = error {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            return;
        }
    };
    if let Some(count) = shared.closed.note() {
        tracing::info!(%peer, closed = count, "{what}");
    }
}

/// One TLS connection (S43): the handshake, bounded by `header_read_timeout` like a
/// request's headers, then HTTP/2 or HTTP/1.1 as the client's ALPN chose, under the
/// same bounds as a plain connection: the first request must start within
/// `header_read_timeout`, an idle one closes after `idle_timeout`, HTTP/2 pings.
///
/// A connection that begins in plain text instead (issue 53, `server/plain.rs`) is
/// answered `400 tls_required` when it is an HTTP/1 request, and closed.
async fn serve_tls(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    service: ConnService,
    conn: &Arc<Conn>,
    shared: &Shared,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let o = &shared.options;
    // The first byte and the handshake share one deadline.
    let deadline = tokio::time::Instant::now() + o.header_read_timeout;
    match plain::first(&stream, deadline).await {
        plain::First::Tls => {}
        plain::First::Gone => return,
        plain::First::TimedOut => {
            if let Some(count) = shared.closed.note() {
                tracing::info!(%peer, closed = count, "closed a connection whose TLS handshake did not finish in time ([http] header_read_timeout)");
            }
            return;
        }
        plain::First::Plain => {
            if plain::answer(stream, deadline, o.write_timeout).await {
                if let Some(count) = shared.plain_http.note() {
                    tracing::info!(%peer, answered = count, "answered plain HTTP on the TLS port with 400 tls_required (the client must use https://)");
                }
            } else if let Some(count) = shared.handshake_failures.note() {
                tracing::warn!(%peer, failed = count, "TLS handshakes failed (a client sent plain text that is not an HTTP request to the TLS port)");
            }
            return;
        }
    }
    let stream = Watched::new(stream, conn.clone(), o.write_timeout);
    let tls = match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            // A client that does not speak TLS, or distrusts the certificate: its own
            // side shows why. At most one line a second, with the count since: a
            // scanner must not become a flood of logs.
            if let Some(count) = shared.handshake_failures.note() {
                tracing::warn!(%peer, error = %e, failed = count, "TLS handshakes failed (a client speaking plain HTTP to a TLS port, or one that does not trust the certificate)");
            }
            return;
        }
        Err(_) => {
            if let Some(count) = shared.closed.note() {
                tracing::info!(%peer, closed = count, "closed a connection whose TLS handshake did not finish in time ([http] header_read_timeout)");
            }
            return;
        }
    };
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(o.header_read_timeout)
        // hyper-util's builder has no head bound of its own: its read buffer is it.
        .max_buf_size(head_bytes(o));
    builder
        .http2()
        .max_header_list_size(u32::try_from(head_bytes(o)).unwrap_or(u32::MAX))
        .timer(TokioTimer::new())
        .keep_alive_interval(o.idle_timeout)
        .keep_alive_timeout(o.write_timeout);
    let io = JsonErrors::new(tls, service.conn().clone(), head_bytes(o));
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let ended = conn::drive(connection, conn, bounds(o), stop).await;
    report(peer, ended, shared);
}

/// Counts events and says when to log them: at most once a second, with how many
/// happened since the last line.
#[derive(Default)]
pub(crate) struct Throttle {
    state: parking_lot::Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// A throttle that has logged nothing yet (for a `static`).
    pub(crate) const fn new() -> Self {
        Throttle {
            state: parking_lot::const_mutex((None, 0)),
        }
    }

    /// Counts one; `Some(count)` when a line is due (the count since the last one).
    pub(crate) fn note(&self) -> Option<u64> {
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
