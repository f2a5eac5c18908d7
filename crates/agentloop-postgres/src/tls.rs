//! TLS to PostgreSQL (S43): the connection URL's `sslmode` and `sslrootcert` read as
//! libpq reads them, and the rustls configuration each mode means.
//!
//! | `sslmode` | what it does |
//! |---|---|
//! | absent, `disable` | plain TCP (the default, as before this module) |
//! | `prefer` | TLS when the server offers it, without verifying the server; plain otherwise |
//! | `require` | TLS or no connection; the server is not verified, unless `sslrootcert` is given: then as `verify-ca` (libpq does the same) |
//! | `verify-ca` | TLS; the server's certificate must chain to a CA in `sslrootcert` |
//! | `verify-full` | as `verify-ca`, and the certificate must name the host connected to |
//!
//! `verify-ca` and `verify-full` need `sslrootcert=PATH` (a PEM file of CAs). The
//! parameters are taken out of the URL before tokio-postgres reads it (it knows only
//! `disable`, `prefer` and `require`). This file reads files and builds configurations;
//! it connects nothing, and its errors never repeat the URL (it may hold a password).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::StoreError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// How a connection uses TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS part of a connection URL, taken out of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsParams {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
}

fn refused(reason: String) -> StoreError {
    StoreError::Backend {
        operation: "connect",
        session: String::new(),
        message: reason,
    }
}

/// Splits `url` (a `postgresql://…?k=v&…` URL or a `k=v k=v` string) into the URL
/// tokio-postgres reads and the TLS parameters.
pub(crate) fn split(url: &str) -> Result<(String, TlsParams), StoreError> {
    let mut mode = None;
    let mut root_cert = None;
    let mut take = |k: &str, v: &str| -> bool {
        match k {
            "sslmode" => {
                mode = Some(v.to_string());
                true
            }
            "sslrootcert" => {
                root_cert = Some(PathBuf::from(v));
                true
            }
            _ => false,
        }
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|kv| match kv.split_once('=') {
                        Some((k, v)) => !take(k, &percent_decode(v)),
                        None => true,
                    })
                    .collect();
                match kept.is_empty() {
                    true => base.to_string(),
                    false => format!("{base}?{}", kept.join("&")),
                }
            }
        }
    } else {
        url.split_whitespace()
            .filter(|kv| match kv.split_once('=') {
                Some((k, v)) => !take(k, v.trim_matches('\'')),
                None => true,
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mode = match mode.as_deref() {
        None | Some("disable") => SslMode::Disable,
        Some("allow") | Some("prefer") => SslMode::Prefer,
        Some("require") => SslMode::Require,
        Some("verify-ca") => SslMode::VerifyCa,
        Some("verify-full") => SslMode::VerifyFull,
        Some(other) => {
            return Err(refused(format!(
                "sslmode `{other}` is not one of disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    let mode = match (mode, &root_cert) {
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(refused(
                "sslmode verify-ca and verify-full need the CA to verify the server with: add \
                 sslrootcert=PATH (a PEM file) to the URL"
                    .into(),
            ))
        }
        (m, _) => m,
    };
    Ok((rest, TlsParams { mode, root_cert }))
}

fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&v[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The rustls configuration `params` asks for; `None` for plain TCP.
pub(crate) fn client_config(
    params: &TlsParams,
) -> Result<Option<rustls::ClientConfig>, StoreError> {
    let provider = agentloop::tls::provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(format!("TLS: {e}")))?;
    let config = match params.mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth(),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let path = params.root_cert.as_deref().unwrap_or(Path::new(""));
            let roots = roots(path)?;
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| refused(format!("TLS: the CAs of {}: {e}", path.display())))?;
            match params.mode {
                SslMode::VerifyCa => builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
                    .with_no_client_auth(),
                _ => builder.with_webpki_verifier(webpki).with_no_client_auth(),
            }
        }
    };
    Ok(Some(config))
}

fn roots(path: &Path) -> Result<rustls::RootCertStore, StoreError> {
    agentloop::tls::roots(path, "sslrootcert (the CAs to verify the server with)")
        .map_err(|e| refused(e.to_string()))
}

/// `prefer` and `require` without a CA: encrypts, verifies nothing about the server
/// (as libpq); the handshake's signatures are still checked.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a given CA; the name is not checked.
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_are_taken_out_of_both_url_forms() {
        let (rest, p) = split("postgresql://u:pw@db:5432/x?sslmode=verify-full&sslrootcert=%2Fca.pem&application_name=a").unwrap();
        assert_eq!(rest, "postgresql://u:pw@db:5432/x?application_name=a");
        assert_eq!(
            p,
            TlsParams {
                mode: SslMode::VerifyFull,
                root_cert: Some("/ca.pem".into())
            }
        );
        let (rest, p) = split("host=db user=u sslmode=require dbname=x").unwrap();
        assert_eq!(rest, "host=db user=u dbname=x");
        assert_eq!(p.mode, SslMode::Require);
        let (rest, p) = split("postgresql://db/x").unwrap();
        assert_eq!(
            (rest.as_str(), p.mode),
            ("postgresql://db/x", SslMode::Disable)
        );
        // require with a CA verifies the chain, as libpq does.
        let (_, p) = split("postgresql://db/x?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(p.mode, SslMode::VerifyCa);
    }

    #[test]
    fn a_verifying_mode_without_a_ca_or_an_unknown_mode_is_refused_without_the_url() {
        let e = split("postgresql://u:secret@db/x?sslmode=verify-full")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sslrootcert=PATH") && !e.contains("secret"),
            "{e}"
        );
        let e = split("postgresql://u:secret@db/x?sslmode=sometimes")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`sometimes`") && !e.contains("secret"), "{e}");
    }
}
