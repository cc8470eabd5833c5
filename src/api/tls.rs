//! TLS for the controller's listeners (the HTTP API, the admission webhook): a certificate from
//! a directory, or one made at start when none is given, and the accept loop that serves a
//! router over it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tracing::warn;

/// Why a listener's TLS material cannot be used.
#[derive(Debug, Error)]
pub enum ListenerTlsError {
    /// The certificate or key in the directory is unreadable.
    #[error("the TLS material in {}: {detail}", dir.display())]
    Certificate {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A certificate could not be made.
    #[error("making a self-signed certificate: {0}")]
    SelfSigned(String),
}

/// A server configuration from `tls.crt` (the chain) and `tls.key` in `dir`.
pub fn from_directory(dir: &Path) -> Result<rustls::ServerConfig, ListenerTlsError> {
    let failed = |detail: String| ListenerTlsError::Certificate { dir: dir.into(), detail };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("tls.crt"))
        .map_err(|e| failed(format!("tls.crt: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| failed(format!("tls.crt: {e}")))?;
    if chain.is_empty() {
        return Err(failed("tls.crt holds no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_file(dir.join("tls.key")).map_err(|e| failed(format!("tls.key: {e}")))?;
    server_config(chain, key).map_err(failed)
}

/// A server configuration with a certificate made now for `names` (valid while the process
/// runs; nobody can pin it, so clients skip verification or read its fingerprint from the
/// log), and that fingerprint (SHA-256 of the certificate, hex).
pub fn self_signed(names: &[String]) -> Result<(rustls::ServerConfig, String), ListenerTlsError> {
    let failed = |e: rcgen::Error| ListenerTlsError::SelfSigned(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(failed)?;
    let certificate =
        rcgen::CertificateParams::new(names.to_vec()).map_err(failed)?.self_signed(&key).map_err(failed)?;
    let fingerprint = crate::files::Checksum::of(certificate.der()).to_string();
    let key = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| ListenerTlsError::SelfSigned(e.to_string()))?;
    let config = server_config(vec![certificate.der().clone()], key).map_err(ListenerTlsError::SelfSigned)?;
    Ok((config, fingerprint))
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ServerConfig, String> {
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves `app` over TLS on `listener` until the task is dropped: each connection's handshake
/// and requests on a task of its own, so a slow client holds up nobody else.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    app: axum::Router,
    what: &'static str,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    // The connections are this server's: they stop when it is stopped.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "{what} could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        connections.spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::debug!(%peer, %error, "a TLS handshake with {what} failed");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let io = hyper_util::rt::TokioIo::new(tls);
            if let Err(error) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(%peer, %error, "a connection to {what} ended badly");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_serves_and_names_its_fingerprint() {
        crate::tls::install_crypto_provider();
        let (config, fingerprint) = self_signed(&["haptic.example".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert_eq!(fingerprint.len(), 64, "{fingerprint}");
    }

    #[test]
    fn a_directory_without_a_certificate_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let error = from_directory(dir.path()).unwrap_err().to_string();
        assert!(error.contains(&dir.path().display().to_string()) && error.contains("tls.crt"), "{error}");
    }
}
