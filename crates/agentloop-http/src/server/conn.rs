//! What [`super::serve`] knows about one connection while hyper serves it (issue 52):
//! the requests in flight, when it last was idle, whether its responses make progress
//! and when its socket last took bytes. The socket wrapper ([`Watched`]) times out
//! writes that make no progress; the service wrapper ([`ConnService`]) counts requests
//! and watches every response body ([`WatchedBody`]); [`drive`] runs the connection and
//! closes it when it is idle too long, when a response waits on the client for longer
//! than the write timeout (an HTTP/2 stream whose flow-control window stays shut: the
//! socket never blocks, so the socket's timeout never fires), when the shutdown began and
//! it writes nothing, or when the connection cap evicts it.
//!
//! This file only watches and closes; routing is the router's, admission the
//! [`super::peers`] registry's.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::Router;
use hyper::body::{Frame, Incoming};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// Milliseconds since the server started (never 0: 0 means "none" in the atomics).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn new() -> Self {
        Clock(Instant::now())
    }

    fn now(&self) -> u64 {
        self.0.elapsed().as_millis() as u64 + 1
    }

    fn at(&self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms.saturating_sub(1))
    }
}

/// The bounds [`drive`] enforces on one connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// The first request must start within this (the TLS handshake done; an HTTP/2
    /// client must open a stream): a connection that sends nothing is closed.
    pub(crate) first_request: Duration,
    /// A connection with no request in flight is closed after this.
    pub(crate) idle: Duration,
    /// A response the client takes nothing of for this long closes its connection.
    pub(crate) write: Duration,
    /// Once the shutdown began, a connection that writes nothing for this long is
    /// closed.
    pub(crate) shutdown_write: Duration,
}

/// One connection's state, shared by its socket, its service, its responses, the
/// connection registry and its driver.
#[derive(Debug)]
pub(crate) struct Conn {
    clock: Clock,
    in_flight: AtomicUsize,
    /// Requests started on it so far.
    served: AtomicU64,
    /// When it last had no request in flight (ms of [`Clock`]).
    idle_since: AtomicU64,
    /// When its socket last took bytes.
    last_write: AtomicU64,
    /// Bytes its socket took so far.
    written: AtomicU64,
    bodies: parking_lot::Mutex<Vec<Weak<BodyWatch>>>,
    /// Told when the connection cap takes this connection's place for another peer.
    pub(crate) evict: Notify,
}

impl Conn {
    pub(crate) fn new(clock: Clock) -> Arc<Self> {
        let now = clock.now();
        Arc::new(Conn {
            clock,
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(now),
            last_write: AtomicU64::new(now),
            written: AtomicU64::new(0),
            bodies: parking_lot::Mutex::new(Vec::new()),
            evict: Notify::new(),
        })
    }

    /// Whether a request is in flight on it now.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    fn watch_body(&self) -> Arc<BodyWatch> {
        let watch = Arc::new(BodyWatch {
            waiting_since: AtomicU64::new(0),
            written_at: AtomicU64::new(0),
            frame_len: AtomicU64::new(0),
        });
        let mut bodies = self.bodies.lock();
        bodies.retain(|w| w.strong_count() > 0);
        bodies.push(Arc::downgrade(&watch));
        watch
    }

    /// A response waiting on the client since at least `write` ago, with the socket
    /// quiet for as long or having taken that response's whole last frame since (so
    /// hyper could have asked for the next one): `Err(())`. Else when to look again,
    /// if a response is waiting.
    fn stalled(&self, now: u64, write: u64) -> Result<Option<u64>, ()> {
        let quiet = now.saturating_sub(self.last_write.load(Ordering::Acquire)) >= write;
        let written = self.written.load(Ordering::Acquire);
        let mut next = None::<u64>;
        for w in self.bodies.lock().iter().filter_map(Weak::upgrade) {
            let since = w.waiting_since.load(Ordering::Acquire);
            if since == 0 {
                continue;
            }
            let due = since + write;
            if now < due {
                next = Some(next.map_or(due, |n| n.min(due)));
                continue;
            }
            let taken = written.saturating_sub(w.written_at.load(Ordering::Acquire));
            if quiet || taken >= w.frame_len.load(Ordering::Acquire) {
                return Err(());
            }
            // Still flushing that frame, and the socket moves: the socket's own write
            // timeout watches it.
            next = Some(next.map_or(now + write, |n| n.min(now + write)));
        }
        Ok(next)
    }

    /// Notes that a response handed hyper a frame of `len` bytes (or was created: 0).
    fn handed(&self, watch: &BodyWatch, len: u64) {
        watch
            .written_at
            .store(self.written.load(Ordering::Acquire), Ordering::Release);
        watch.frame_len.store(len, Ordering::Release);
        watch
            .waiting_since
            .store(self.clock.now(), Ordering::Release);
    }
}

/// A request in flight, until its response body is done or dropped.
#[derive(Debug)]
struct RequestGuard(Arc<Conn>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let now = self.0.clock.now();
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle_since.store(now, Ordering::Release);
        }
    }
}

/// Whether hyper is waiting on a response body (0) or the body handed it a frame (or
/// was created) at this moment and hyper has not asked for the next one since.
#[derive(Debug)]
struct BodyWatch {
    waiting_since: AtomicU64,
    /// The connection's bytes written when the frame was handed.
    written_at: AtomicU64,
    /// That frame's length.
    frame_len: AtomicU64,
}

/// A response body that notes when hyper takes its frames.
struct WatchedBody {
    inner: Body,
    watch: Arc<BodyWatch>,
    request: RequestGuard,
}

impl HttpBody for WatchedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                self.request.0.handed(&self.watch, len);
            }
            _ => self.watch.waiting_since.store(0, Ordering::Release),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The router as hyper's service on one connection, counting its requests and watching
/// their responses.
#[derive(Clone)]
pub(crate) struct ConnService {
    app: TowerToHyperService<Router>,
    conn: Arc<Conn>,
}

impl ConnService {
    pub(crate) fn new(app: Router, conn: Arc<Conn>) -> Self {
        ConnService {
            app: TowerToHyperService::new(app),
            conn,
        }
    }

    /// The connection it serves.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnService {
    type Response = hyper::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let request = self.conn.request_started();
        let watch = self.conn.watch_body();
        let response = self.app.call(req);
        Box::pin(async move {
            let response = response.await?;
            // Created: hyper has not asked for a frame yet.
            request.0.handed(&watch, 0);
            Ok(response.map(|inner| {
                Body::new(WatchedBody {
                    inner,
                    watch,
                    request,
                })
            }))
        })
    }
}

/// A socket whose writes time out when they make no progress for `write_timeout`, and
/// that notes when it last took bytes.
pub(crate) struct Watched<S> {
    io: S,
    conn: Arc<Conn>,
    write_timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> Watched<S> {
    pub(crate) fn new(io: S, conn: Arc<Conn>, write_timeout: Duration) -> Self {
        Watched {
            io,
            conn,
            write_timeout,
            timer: None,
        }
    }

    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.timer = None;
                if r.is_ok() {
                    let now = self.conn.clock.now();
                    self.conn.last_write.store(now, Ordering::Release);
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.timer = None;
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client took no data for the write timeout",
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.conn.written.fetch_add(n as u64, Ordering::AcqRel);
        }
        self.after_write(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.conn.written.fetch_add(n as u64, Ordering::AcqRel);
        }
        self.after_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.after_write(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.after_write(cx, r)
    }
}

/// Why [`drive`] closed a connection itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// hyper ended it (the client closed, a protocol error, the socket's write timeout).
    Ended,
    /// No request came within the first-request bound or the idle bound.
    Idle,
    /// A response waited on the client for the write timeout.
    Stalled,
    /// The shutdown began and it wrote nothing for the shutdown write timeout.
    Shutdown,
    /// The connection cap gave its place to another peer's connection.
    Evicted,
}

/// What the periodic check decided.
enum Verdict {
    /// Check again at this moment.
    Later(Instant),
    /// Idle: begin a graceful close.
    Idle,
    /// Close now.
    Close(Closed),
}

fn check(conn: &Conn, bounds: &Bounds, shutting: bool, closing_since: Option<u64>) -> Verdict {
    let now = conn.clock.now();
    let ms = |d: Duration| d.as_millis() as u64;
    let write = ms(bounds.write).max(1);
    let mut next = now + write;
    match conn.stalled(now, write) {
        Err(()) => return Verdict::Close(Closed::Stalled),
        Ok(Some(due)) => next = next.min(due),
        Ok(None) => {}
    }
    match closing_since {
        Some(closing) if shutting => {
            let quiet_since = conn.last_write.load(Ordering::Acquire).max(closing);
            let due = quiet_since + ms(bounds.shutdown_write);
            if now >= due {
                return Verdict::Close(Closed::Shutdown);
            }
            next = next.min(due);
        }
        Some(closing) => {
            // Idle and told to go: it had its chance to finish.
            let due = closing + ms(bounds.first_request);
            if now >= due {
                return Verdict::Close(Closed::Idle);
            }
            next = next.min(due);
        }
        None if !conn.busy() => {
            let limit = match conn.served.load(Ordering::Relaxed) {
                0 => bounds.first_request,
                _ => bounds.idle,
            };
            let due = conn.idle_since.load(Ordering::Acquire) + ms(limit);
            if now >= due {
                return Verdict::Idle;
            }
            next = next.min(due);
        }
        None => {}
    }
    Verdict::Later(conn.clock.at(next.max(now + 1)))
}

/// Serves `connection` until it ends or one of `bounds` closes it; a graceful close
/// when `shutdown` turns true. Returns why it ended, and hyper's error if any.
pub(crate) async fn drive<C>(
    connection: C,
    conn: &Conn,
    bounds: Bounds,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> (Closed, Option<Box<dyn std::error::Error + Send + Sync>>)
where
    C: GracefulConnection,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connection = std::pin::pin!(connection);
    let mut shutting = false;
    let mut closing_since: Option<u64> = None;
    loop {
        if !shutting && *shutdown.borrow() {
            shutting = true;
            connection.as_mut().graceful_shutdown();
            closing_since = Some(conn.clock.now());
        }
        let next = match check(conn, &bounds, shutting, closing_since) {
            Verdict::Later(at) => at,
            Verdict::Close(why) => return (why, None),
            Verdict::Idle => {
                connection.as_mut().graceful_shutdown();
                closing_since = Some(conn.clock.now());
                continue;
            }
        };
        tokio::select! {
            biased;
            r = connection.as_mut() => return (Closed::Ended, r.err().map(Into::into)),
            () = conn.evict.notified() => return (Closed::Evicted, None),
            changed = shutdown.changed(), if !shutting => {
                if changed.is_err() {
                    // The server is gone: as good as a shutdown.
                    shutting = true;
                    connection.as_mut().graceful_shutdown();
                    closing_since = Some(conn.clock.now());
                }
            }
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

/// hyper's own answers to a request it cannot parse (400, 414, 431) carry no body
/// (issue 52, S34a: every error is JSON with a stable code). This wrapper, between
/// hyper and the socket (above TLS), recognises such an answer (an empty-bodied 400,
/// 414 or 431 head written while no request is in flight on the connection: hyper's,
/// since the router's own errors have bodies) and writes the same status with a JSON
/// body instead. hyper closes the connection after it either way. It hands hyper one
/// buffer per write (no vectored writes), so an answer is seen whole.
pub(crate) struct JsonErrors<S> {
    io: S,
    conn: Arc<Conn>,
    /// The request head bound, for the 431's message.
    max_header_bytes: usize,
    /// The answer being written instead: its bytes, how many went out, and the length
    /// of hyper's buffer to report once they all did.
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl<S> JsonErrors<S> {
    pub(crate) fn new(io: S, conn: Arc<Conn>, max_header_bytes: usize) -> Self {
        JsonErrors {
            io,
            conn,
            max_header_bytes,
            replacing: None,
        }
    }
}

/// The JSON answer for hyper's automatic answer `head`, if it is one.
pub(crate) fn json_error_for(head: &[u8], max_header_bytes: usize) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    if !text.ends_with("\r\n\r\n")
        || !text
            .to_ascii_lowercase()
            .contains("\r\ncontent-length: 0\r\n")
    {
        return None;
    }
    let (status, code, message) = match text.get(..13)? {
        "HTTP/1.1 400 " => (
            "400 Bad Request",
            "bad_request",
            "the request is not valid HTTP/1.1 (its request line or a header cannot be parsed); fix the client",
        ),
        "HTTP/1.1 414 " => (
            "414 URI Too Long",
            "uri_too_long",
            "the request's URI is longer than this server reads (64 KiB); send the data in a body",
        ),
        "HTTP/1.1 431 " => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "",
        ),
        _ => return None,
    };
    let message = match message {
        "" => format!(
            "the request's head (request line and headers) is larger than this server reads \
             ({max_header_bytes} bytes, [http] max_header_bytes), or has more than 100 headers; \
             send fewer or shorter headers"
        ),
        m => m.to_string(),
    };
    let body = serde_json::json!({"code": code, "message": message}).to_string();
    Some(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() && !this.conn.busy() {
            if let Some(json) = json_error_for(buf, this.max_header_bytes) {
                this.replacing = Some((json, 0, buf.len()));
            }
        }
        let Some((bytes, written, reported)) = &mut this.replacing else {
            return Pin::new(&mut this.io).poll_write(cx, buf);
        };
        while *written < bytes.len() {
            match Pin::new(&mut this.io).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let reported = *reported;
        this.replacing = None;
        Poll::Ready(Ok(reported))
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_error_answers_become_json_and_nothing_else_does() {
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sat, 28 Nov 2026 22:00:00 GMT\r\n\r\n";
        let json = json_error_for(hyper_431, 65_536).expect("replaced");
        let text = String::from_utf8(json).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], "headers_too_large");
        assert!(
            v["message"].as_str().unwrap().contains("65536 bytes"),
            "{v}"
        );
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
        for (head, code) in [
            (
                &b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n"[..],
                "uri_too_long",
            ),
            (
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
                "bad_request",
            ),
        ] {
            let text = String::from_utf8(json_error_for(head, 65_536).unwrap()).unwrap();
            assert!(text.contains(code), "{text}");
        }
        // The router's answers (a body, another status, a partial head) go through.
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"code\":1}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n",
        ] {
            assert!(json_error_for(other, 65_536).is_none());
        }
    }
}
