//! TLS at the HTTP front (S43, `agentloop serve --tls-cert --tls-key`): the server's
//! certificate chain and private key (PEM, read by [`agentloop::tls`]) as a rustls
//! configuration that offers HTTP/2 and HTTP/1.1 (ALPN). [`crate::server::serve`]
//! terminates TLS with it on every accepted connection.
//!
//! This file only builds the configuration; it accepts nothing and never logs a key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a TLS configuration could not be built; each message names the file and what
/// to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read, or does not hold what it should.
    #[error(transparent)]
    Pem(#[from] agentloop::tls::PemError),
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

/// A server configuration from the certificate chain in `cert` and the key in `key`
/// (PEM), offering HTTP/2 and HTTP/1.1.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain =
        agentloop::tls::certificates(cert, "the TLS certificate (--tls-cert or [http] tls_cert)")?;
    let private =
        agentloop::tls::private_key(key, "the TLS private key (--tls-key or [http] tls_key)")?;
    let pair = |reason: String| TlsError::Pair {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        reason,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(agentloop::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| pair(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| pair(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
