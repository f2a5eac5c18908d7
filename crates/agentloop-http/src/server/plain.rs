//! Plain HTTP on the TLS port (issue 53): a client that speaks `http://` to a port that
//! speaks TLS got a TLS alert, which curl reports as "Received HTTP/0.9 when not
//! allowed". Like Go's and nginx's servers, the connection's first byte is peeked: a TLS
//! record starts with its content type (22, a handshake), never an ASCII letter, so a
//! connection that begins with one is plain text. When its first line is an HTTP/1
//! request line, it is answered `400` with a JSON body (`tls_required`) that says to use
//! `https://HOST:PORT/`, and closed; anything else is closed unanswered.
//!
//! Every wait here is bounded: the peek and the head's read by the connection's
//! handshake deadline (`header_read_timeout`), the answer's write by `write_timeout`,
//! and the read of what the client sent after it by [`LINGER`] and [`LINGER_BYTES`].

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The most bytes of a plain request's head read to find its request line and `Host`.
const HEAD_BYTES: usize = 8 << 10;
/// How long what a client sends after the answer is read (and dropped) before the
/// connection closes, so that its kernel does not reset the connection (unread data at
/// close) before the client has read the answer.
const LINGER: Duration = Duration::from_millis(500);
/// The most bytes read (and dropped) after the answer.
const LINGER_BYTES: usize = 64 << 10;

/// The request methods a plain HTTP/1 request line may start with.
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE",
];

/// What a new connection to the TLS port began with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum First {
    /// A byte a TLS record may start with: the handshake goes on.
    Tls,
    /// An ASCII letter: plain text, not TLS.
    Plain,
    /// The client closed (or the socket failed) before it sent a byte.
    Gone,
    /// Nothing came before the deadline.
    TimedOut,
}

/// Peeks the connection's first byte (nothing is consumed), waiting until `deadline`.
pub(crate) async fn first(stream: &TcpStream, deadline: Instant) -> First {
    let mut byte = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut byte)).await {
        Ok(Ok(0)) | Ok(Err(_)) => First::Gone,
        Ok(Ok(_)) if byte[0].is_ascii_alphabetic() => First::Plain,
        Ok(Ok(_)) => First::Tls,
        Err(_) => First::TimedOut,
    }
}

/// Reads the plain connection's head (until its blank line, [`HEAD_BYTES`], the
/// client's end or `deadline`); when its first line is an HTTP/1 request line, answers
/// `400 tls_required` within `write_timeout`, reads what the client still sends for a
/// moment, and closes. Whether it answered.
pub(crate) async fn answer(
    mut stream: TcpStream,
    deadline: Instant,
    write_timeout: Duration,
) -> bool {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < HEAD_BYTES && !ends_head(&head) {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n.min(HEAD_BYTES - head.len())]),
            _ => break,
        }
    }
    if !is_request_line(&head) {
        return false;
    }
    let local = stream.local_addr().ok();
    let url = https_url(host_header(&head), local);
    let response = response(&url);
    let wrote = tokio::time::timeout(write_timeout, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(wrote, Ok(Ok(()))) {
        return false;
    }
    // What the client sends after the answer (a body) is read and dropped for a
    // moment: closing with unread data would reset the connection, and the client
    // could lose the answer.
    let linger = Instant::now() + LINGER;
    let mut dropped = 0usize;
    while dropped < LINGER_BYTES {
        match tokio::time::timeout_at(linger, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => dropped += n,
            _ => break,
        }
    }
    true
}

/// Whether `head` holds the blank line that ends a request head.
fn ends_head(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// Whether `head` begins with an HTTP/1 request line: a known method, a space, a
/// target, a space and `HTTP/1.` (a line cut by the head bound still counts when its
/// start says so).
fn is_request_line(head: &[u8]) -> bool {
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').splitn(3, ' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    METHODS.contains(&method) && !target.is_empty() && version.starts_with("HTTP/1.")
}

/// The request's `Host` header, when it is a plausible `host[:port]` (letters, digits,
/// `.`, `-`, `:`, `[`, `]`; at most 255 bytes): it is written back in the answer.
fn host_header(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let value = text.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim().to_string())
    })?;
    let plausible = !value.is_empty()
        && value.len() <= 255
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
    plausible.then_some(value)
}

/// `https://HOST:PORT/`: the client's `Host` (with the port it connected to when it
/// named none), else the address the connection reached.
fn https_url(host: Option<String>, local: Option<std::net::SocketAddr>) -> String {
    match (host, local) {
        (Some(h), local) => {
            let has_port = match h.rfind(']') {
                Some(end) => h[end..].contains(':'),
                None => h.contains(':'),
            };
            match local {
                Some(l) if !has_port => format!("https://{h}:{}/", l.port()),
                _ => format!("https://{h}/"),
            }
        }
        (None, Some(l)) => format!("https://{l}/"),
        (None, None) => "https://".to_string(),
    }
}

/// The `400` answer: JSON like the server's other errors, the connection closed.
fn response(url: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "code": "tls_required",
        "message": format!("this port speaks TLS: use {url}"),
    })
    .to_string();
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_told_from_other_text() {
        for yes in [
            &b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"POST /sessions HTTP/1.0\r\n",
            b"OPTIONS * HTTP/1.1\r\n",
            b"DELETE /sessions/a HTTP/1.1",
        ] {
            assert!(is_request_line(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"HELLO there\r\n"[..],
            b"GET /healthz\r\n",
            b"GET  HTTP/1.1\r\n",
            b"get / HTTP/1.1\r\n",
            b"PRI * HTTP/2.0\r\n",
            b"",
        ] {
            assert!(!is_request_line(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn the_url_names_the_clients_host_and_the_port() {
        let local: std::net::SocketAddr = "127.0.0.1:7420".parse().unwrap();
        let head = b"GET / HTTP/1.1\r\nhost: localhost:7420\r\n\r\n";
        assert_eq!(
            https_url(host_header(head), Some(local)),
            "https://localhost:7420/"
        );
        let head = b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n";
        assert_eq!(
            https_url(host_header(head), Some(local)),
            "https://example.org:7420/"
        );
        let head = b"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n";
        assert_eq!(
            https_url(host_header(head), Some(local)),
            "https://[::1]:7420/"
        );
        // A Host that is not a host is not written back.
        let head = b"GET / HTTP/1.1\r\nHost: <script>\r\n\r\n";
        assert_eq!(
            https_url(host_header(head), Some(local)),
            "https://127.0.0.1:7420/"
        );
        let text = String::from_utf8(response("https://localhost:7420/")).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], "tls_required");
        assert_eq!(
            v["message"],
            "this port speaks TLS: use https://localhost:7420/"
        );
    }
}
