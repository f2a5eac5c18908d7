//! TLS at the HTTP front (S43, `agentloop serve --tls-cert --tls-key`): the server's
//! certificate chain and private key read from PEM files into a rustls configuration
//! that offers HTTP/2 and HTTP/1.1 (ALPN). [`crate::server::serve`] terminates TLS with
//! it on every accepted connection.
//!
//! This file only reads files and builds the configuration; it accepts nothing and
//! never logs a key's bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a TLS configuration could not be built; each message names the file and what
/// to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file could not be read or holds no certificate.
    #[error("cannot use {path} as the TLS certificate: {reason}; pass a PEM file that holds the server's certificate first, then its intermediates")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key file could not be read or holds no private key.
    #[error("cannot use {path} as the TLS private key: {reason}; pass the PEM file of the certificate's private key (PKCS#8, PKCS#1 or SEC1)")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the pair (the key does not match the certificate, an
    /// unsupported algorithm).
    #[error("the TLS certificate {cert} and key {key} cannot be used together: {reason}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        reason: String,
    },
}

/// The certificates of a PEM file, in order.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::Certificate {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("it holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Key {
        path: path.to_path_buf(),
        // The error names the PEM section, never the key's bytes.
        reason: e.to_string(),
    })
}

/// The crypto provider every configuration here uses (rustls's default, aws-lc-rs),
/// explicit so no process-wide default needs installing.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A server configuration from the certificate chain in `cert` and the key in `key`
/// (PEM), offering HTTP/2 and HTTP/1.1.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = read_certificates(cert)?;
    let private = read_key(key)?;
    let pair = |reason: String| TlsError::Pair {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        reason,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| pair(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| pair(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
