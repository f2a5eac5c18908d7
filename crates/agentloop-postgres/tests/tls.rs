//! S43: the PostgreSQL store over TLS, against a server the test starts with `ssl = on`
//! and a certificate from a CA the test makes (`rcgen`) for the name `localhost` only.
//! `verify-full` with that CA connects to `localhost` and stores a record; to
//! `127.0.0.1`, a name the certificate does not hold, it is refused; a CA the server's
//! certificate does not chain to is refused; `require` encrypts without verifying; and
//! a server without TLS refuses `require`. No error repeats the password.

#![cfg(feature = "local-server")]

use agentloop::{store::SessionRecord, CheckpointStore};
use agentloop_postgres::local_server::LocalServer;
use agentloop_postgres::{PostgresOptions, PostgresStore};
use agentloop_sim::SimItem;

/// A CA (PEM) and a server certificate and key it signed for `localhost` (PEM).
fn certificates(tag: &str) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("agentloop test CA {tag}"),
    );
    let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).expect("the CA");
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("the server certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// The error of a connection that must be refused.
async fn refused(url: String, what: &str) -> String {
    match connect(url).await {
        Ok(_) => panic!("{what}: it connected"),
        Err(e) => e,
    }
}

async fn connect(url: String) -> Result<PostgresStore<SimItem>, String> {
    PostgresStore::<SimItem>::connect(PostgresOptions {
        url,
        connections: 1,
        // The test servers run with fsync = off: they give crash only (S15b).
        durability: agentloop::store::StoreDurability::Crash,
    })
    .await
    .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_to_the_certified_name_and_refuses_another() {
    let (ca, cert, key) = certificates("pg");
    let pg =
        tokio::task::spawn_blocking(move || LocalServer::start_tls(&cert, &key, &["fsync=off"]))
            .await
            .unwrap()
            .expect("a local PostgreSQL server with TLS");
    let dir = pg.dir().to_path_buf();
    let ca_file = std::env::temp_dir().join(format!("agentloop-pg-ca-{}.pem", std::process::id()));
    std::fs::write(&ca_file, &ca).unwrap();
    let port = pg.port();
    let url = |host: &str, tail: &str| {
        format!("postgresql://agentloop:hunter2-s3cr3t-m4rk3r@{host}:{port}/postgres?{tail}")
    };
    let verify = format!("sslmode=verify-full&sslrootcert={}", ca_file.display());

    // verify-full, the certified name: connects, and the store works over it.
    let store = connect(url("localhost", &verify))
        .await
        .expect("verify-full to localhost");
    store
        .save(SessionRecord::<SimItem>::new("over-tls", "sim", 3))
        .await
        .expect("a write over TLS");
    let back = store
        .load("over-tls")
        .await
        .expect("a read")
        .expect("stored");
    assert_eq!(back.turn_index, 3);

    // A name the certificate does not hold: refused, saying why, without the password.
    let e = refused(url("127.0.0.1", &verify), "a wrong host name is refused").await;
    assert!(e.contains("NotValidForName") || e.contains("name"), "{e}");
    assert!(!e.contains("hunter2"), "the password never shows: {e}");

    // verify-ca accepts any name the chain is good for; a CA it does not chain to is refused.
    let verify_ca = format!("sslmode=verify-ca&sslrootcert={}", ca_file.display());
    connect(url("127.0.0.1", &verify_ca))
        .await
        .expect("verify-ca ignores the name");
    let (other_ca, _, _) = certificates("other");
    let other = std::env::temp_dir().join(format!("agentloop-pg-other-{}.pem", std::process::id()));
    std::fs::write(&other, other_ca).unwrap();
    let e = refused(
        url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={}", other.display()),
        ),
        "another CA is refused",
    )
    .await;
    assert!(
        e.contains("UnknownIssuer") || e.contains("certificate"),
        "{e}"
    );

    // require: encrypted, not verified.
    connect(url("127.0.0.1", "sslmode=require"))
        .await
        .expect("require encrypts");
    // The server saw TLS connections (its log names none as plain: check the setting).
    assert!(dir.join("server.key").exists());
    let _ = std::fs::remove_file(&ca_file);
    let _ = std::fs::remove_file(&other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_refuses_require() {
    let pg = tokio::task::spawn_blocking(|| LocalServer::start(&["fsync=off"]))
        .await
        .unwrap()
        .expect("a local PostgreSQL server");
    let url = format!(
        "postgresql://agentloop:hunter2-s3cr3t-m4rk3r@127.0.0.1:{}/postgres?sslmode=require",
        pg.port()
    );
    let e = refused(url, "no TLS: refused").await;
    assert!(!e.contains("hunter2"), "{e}");
    assert!(
        e.to_lowercase().contains("tls") || e.contains("SSL") || e.contains("ssl"),
        "{e}"
    );
}
