//! PEM files into rustls (S43), shared by every link that encrypts: the HTTP front's
//! certificate, the cluster nodes' mutual TLS, the PostgreSQL store's CA. Behind the
//! `tls` feature (the crates that serve or connect over TLS turn it on), so a runtime
//! built alone carries no TLS stack.
//!
//! This file reads files and builds rustls values; it listens on and connects to
//! nothing, and its errors name files, never a key's bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A PEM file that could not be used; the message names the file, what it was for and
/// what to pass instead.
#[derive(Debug, thiserror::Error)]
#[error("cannot use {path} as {what}: {reason}; {hint}")]
pub struct PemError {
    /// The file.
    pub path: PathBuf,
    /// What it was for ("the TLS certificate", "the cluster's CA"...).
    pub what: &'static str,
    /// Why.
    pub reason: String,
    /// What to pass.
    pub hint: &'static str,
}

/// The certificates of a PEM file, in order (a chain: the certificate first, then its
/// intermediates; or a set of CAs). `what` names the file's purpose in errors.
pub fn certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let bad = |reason: String| PemError {
        path: path.to_path_buf(),
        what,
        reason,
        hint: "pass a PEM file of certificates (-----BEGIN CERTIFICATE-----)",
    };
    // Read whole, with a size bound (issue 52: `/dev/zero` made the start abort).
    let bytes = crate::operator_file::read(path, what).map_err(|e| bad(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("it holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path, what: &'static str) -> Result<PrivateKeyDer<'static>, PemError> {
    let bad = |reason: String| PemError {
        path: path.to_path_buf(),
        what,
        reason,
        hint: "pass the PEM file of the certificate's private key (PKCS#8, PKCS#1 or SEC1)",
    };
    // Read whole, with a size bound (issue 52).
    let bytes = crate::operator_file::read(path, what).map_err(|e| bad(e.to_string()))?;
    // The error names the PEM section, never the key's bytes.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| bad(e.to_string()))
}

/// The CAs of a PEM file as a root store (what a peer's certificate must chain to).
pub fn roots(path: &Path, what: &'static str) -> Result<rustls::RootCertStore, PemError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(path, what)? {
        roots.add(c).map_err(|e| PemError {
            path: path.to_path_buf(),
            what,
            reason: e.to_string(),
            hint: "pass a PEM file of CA certificates",
        })?;
    }
    Ok(roots)
}

/// The crypto provider every configuration uses (rustls's default, aws-lc-rs), given
/// explicitly so no process-wide default needs installing.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
