//! S43 at the HTTP front: `agentloop serve --tls-cert --tls-key` terminates TLS itself.
//! Certificates come from a CA the test makes (`rcgen`); the client is hyper with
//! hyper-rustls, trusting that CA alone: it speaks HTTP/2 (ALPN) and HTTP/1.1 to the
//! server, a plain-HTTP client gets nothing, a client that does not trust the CA is
//! refused, the bearer token is still required beyond loopback, and files that are not
//! a certificate or a key stop the server at once with what to do.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{stop, Job, TempDir};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1, as PEM files
/// in `dir`: (ca.pem, cert.pem, key.pem).
fn certificates(dir: &Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca = common::TestCa::new(dir, tag);
    let (cert, key) = ca.issue(tag, &["localhost", "127.0.0.1"]);
    (ca.ca, cert, key)
}

/// A hyper client over rustls that trusts the CA in `ca` alone and offers HTTP/2 and
/// HTTP/1.1 (or HTTP/1.1 alone).
fn client(
    ca: &Path,
    h2: bool,
) -> Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
> {
    let mut roots = rustls::RootCertStore::empty();
    for c in agentloop::tls::certificates(ca, "the CA").expect("the CA") {
        roots.add(c).expect("a root");
    }
    let config = rustls::ClientConfig::builder_with_provider(agentloop::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    let connector = if h2 {
        b.enable_http1().enable_http2().build()
    } else {
        b.enable_http1().build()
    };
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The `https://…` base URL the server printed.
fn base(job: &mut Job) -> String {
    let line = job.wait_for("serving on https://");
    line.split("serving on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the address")
        .replace("127.0.0.1", "localhost")
}

async fn call(
    client: &Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Full<Bytes>,
    >,
    method: &str,
    url: &str,
    body: Option<serde_json::Value>,
    token: Option<&str>,
) -> Result<(u16, hyper::Version, serde_json::Value), String> {
    let mut req = hyper::Request::builder().method(method).uri(url);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = req.body(Full::new(Bytes::from(body))).expect("a request");
    let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let (status, version) = (resp.status().as_u16(), resp.version());
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Ok((status, version, json))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_front_terminates_tls_and_speaks_http2() {
    let dir = TempDir::new("tls");
    let (ca, cert, key) = certificates(&dir.0, "front");
    let mut job = Job::serve(
        &dir.0,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let url = base(&mut job);
    assert!(url.starts_with("https://localhost:"), "{url}");

    // HTTP/2 over TLS, chosen by ALPN; the whole API works over it.
    let h2 = client(&ca, true);
    let (status, version, body) = call(&h2, "GET", &format!("{url}/healthz"), None, None)
        .await
        .expect("healthz over TLS");
    assert_eq!((status, version), (200, hyper::Version::HTTP_2), "{body}");
    let spawn = serde_json::json!({"id": "t", "kind": "sim", "persistent": true,
                                   "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}});
    let (status, _, body) = call(&h2, "POST", &format!("{url}/sessions"), Some(spawn), None)
        .await
        .expect("spawn over TLS");
    assert_eq!(status, 201, "{body}");
    let item = serde_json::json!({"item": {"id": 1, "text": "over TLS"}});
    let (status, _, body) = call(
        &h2,
        "POST",
        &format!("{url}/sessions/t/items"),
        Some(item),
        None,
    )
    .await
    .expect("push over TLS");
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(&h2, "GET", &format!("{url}/sessions/t"), None, None)
        .await
        .expect("view over TLS");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["agent_kind"], "sim");

    // HTTP/1.1 over TLS for a client that offers only that.
    let h1 = client(&ca, false);
    let (status, version, _) = call(&h1, "GET", &format!("{url}/healthz"), None, None)
        .await
        .expect("HTTP/1.1 over TLS");
    assert_eq!((status, version), (200, hyper::Version::HTTP_11));

    // A client that trusts another CA is refused by its own verifier.
    let (other_ca, _, _) = certificates(&dir.0, "other");
    let e = call(
        &client(&other_ca, true),
        "GET",
        &format!("{url}/healthz"),
        None,
        None,
    )
    .await
    .expect_err("an untrusted certificate");
    assert!(
        e.contains("UnknownIssuer") || e.contains("certificate"),
        "{e}"
    );

    // Plain HTTP to the TLS port is not served (it is answered 400 tls_required:
    // tls_plain_http.rs).
    let plain = url.replace("https://localhost", "127.0.0.1");
    let answered = std::net::TcpStream::connect(&plain).and_then(|mut s| {
        use std::io::{Read as _, Write as _};
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        Ok(buf)
    });
    assert!(
        !answered.unwrap_or_default().starts_with(b"HTTP/1.1 200"),
        "plain HTTP must not be served on the TLS port"
    );

    stop(job);
}

/// Beyond loopback the bearer token is still required over TLS; with it the API
/// answers, without it 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_beyond_loopback_still_requires_the_token() {
    let dir = TempDir::new("tls-token");
    let (ca, cert, key) = certificates(&dir.0, "front");
    let token = "tls-token-s3cr3t-m4rk3r-0123";
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, token).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // 0.0.0.0: beyond loopback.
    let mut job = Job::serve_at(
        &dir.0,
        &format!("0.0.0.0:{port}"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    job.wait_for("serving on https://");
    let url = format!("https://localhost:{port}");
    let c = client(&ca, true);
    let (status, _, _) = call(&c, "GET", &format!("{url}/sessions"), None, None)
        .await
        .expect("answered");
    assert_eq!(status, 401, "no token, beyond loopback");
    let (status, _, _) = call(&c, "GET", &format!("{url}/sessions"), None, Some(token))
        .await
        .expect("answered");
    assert_eq!(status, 200);
    // The contract needs no token (it holds no session): a client generator fetches
    // it. It is what `agentloop openapi` prints and what docs/openapi.json holds.
    let (status, _, served) = call(&c, "GET", &format!("{url}/openapi.json"), None, None)
        .await
        .expect("answered");
    assert_eq!(status, 200, "{served}");
    assert!(served["openapi"]
        .as_str()
        .is_some_and(|v| v.starts_with("3.1")));
    let printed = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("openapi")
        .output()
        .expect("agentloop openapi");
    assert!(printed.status.success());
    let printed: serde_json::Value =
        serde_json::from_slice(&printed.stdout).expect("agentloop openapi prints JSON");
    assert_eq!(served, printed);
    let checked_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json"),
    )
    .expect("docs/openapi.json");
    assert_eq!(
        served,
        serde_json::from_str::<serde_json::Value>(&checked_in).expect("JSON"),
        "docs/openapi.json is the served document"
    );
    let out = stop(job);
    assert!(!out.contains(token), "the token never shows in the output");
}

/// A certificate file that is not one, or a key that is not, stops `serve` at once with
/// the file named and what to pass.
#[test]
fn bad_tls_files_stop_the_server_with_what_to_do() {
    let dir = TempDir::new("tls-bad");
    let (_, cert, key) = certificates(&dir.0, "front");
    let junk = dir.0.join("junk.pem");
    std::fs::write(&junk, "not a PEM file\n").unwrap();
    for (c, k, expect) in [
        (&junk, &key, "cannot use"),
        (&cert, &junk, "as the TLS private key"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.0.join("data"))
            .args([
                "--tls-cert",
                c.to_str().unwrap(),
                "--tls-key",
                k.to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains(expect) && err.contains("junk.pem"), "{err}");
    }
    // One without the other is a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--tls-cert"])
        .arg(&cert)
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

/// A token file other users can read is warned about (S43), naming the file and
/// `chmod 600`, never the token.
#[test]
fn a_token_file_others_can_read_is_warned_about() {
    let dir = TempDir::new("tls-token-mode");
    let token = "mode-token-s3cr3t-m4rk3r-0123";
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, token).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let log = dir.0.join("stderr.log");
    let mut job = Job::command(
        &dir.0,
        "serve",
        &[
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        std::fs::File::create(&log).unwrap().into(),
    );
    job.wait_for("serving on http://");
    let out = stop(job);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("the token file can be read by other users") && said.contains("chmod 600"),
        "{said}"
    );
    assert!(!said.contains(token) && !out.contains(token), "{said}");
}

/// S43: secrets given in the environment never show in `--help` (clap would print an
/// environment variable's value as the default).
#[test]
fn help_never_shows_a_secret_from_the_environment() {
    let secrets = [
        ("AGENTLOOP_TOKEN", "help-token-s3cr3t-m4rk3r-01"),
        ("AGENTLOOP_COOKIE", "help-cookie-s3cr3t-m4rk3r"),
        (
            "AGENTLOOP_POSTGRES",
            "postgresql://u:help-db-s3cr3t-m4rk3r@db/x",
        ),
    ];
    for args in [
        &["serve", "--help"][..],
        &["sessions", "list", "--help"],
        &["sessions", "migrate", "--help"],
        &["push", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .args(args)
            .envs(secrets)
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {text}");
        for (var, secret) in secrets {
            assert!(
                !text.contains(secret),
                "{args:?} shows {var}'s value:\n{text}"
            );
        }
    }
}

/// `[http] tls_cert` and `tls_key` in agentloop.toml turn HTTPS on as the flags do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_files_tls_table_turns_https_on() {
    let dir = TempDir::new("tls-config");
    let (ca, cert, key) = certificates(&dir.0, "front");
    let config = dir.0.join("agentloop.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\ntls_cert = {:?}\ntls_key = {:?}\n",
            cert.display().to_string(),
            key.display().to_string()
        ),
    )
    .unwrap();
    let mut job = Job::serve(&dir.0, &["--config", config.to_str().unwrap()]);
    let url = base(&mut job);
    let (status, version, _) = call(
        &client(&ca, true),
        "GET",
        &format!("{url}/healthz"),
        None,
        None,
    )
    .await
    .expect("healthz over TLS");
    assert_eq!((status, version), (200, hyper::Version::HTTP_2));
    stop(job);
}
