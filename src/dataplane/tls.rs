//! TLS to the pods' Dataplane APIs: the CA bundle pods' certificates are checked against, the
//! controller's optional client certificate (the Dataplane API's `tls_ca` makes it required),
//! and the name the pods' certificates are issued for.
//!
//! Pods are reached by IP address, which changes with every pod; a certificate issued for a
//! fixed name (`serverName`) is checked against that name while the connection still goes to
//! the pod's address. Without a server name the pod's IP must be in the certificate.

use std::fmt;

use thiserror::Error;

use crate::files::Checksum;

/// TLS settings for every pod, parsed once from the Secret the configuration names.
#[derive(Clone)]
pub struct TlsSettings {
    pub(super) roots: Vec<reqwest::Certificate>,
    pub(super) identity: Option<reqwest::Identity>,
    pub(super) server_name: Option<String>,
    /// A digest of everything above, so that unchanged settings keep the connections open.
    fingerprint: Checksum,
}

/// What is wrong with the TLS material; never quotes it (it holds a private key).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TlsSettingsError {
    /// The CA bundle holds no certificate.
    #[error("the CA bundle holds no PEM certificate")]
    NoCaCertificate,
    /// The CA bundle could not be parsed.
    #[error("the CA bundle is not PEM: {0}")]
    UnreadableCa(String),
    /// The client certificate or key could not be parsed.
    #[error("the client certificate and key are not a PEM certificate with its private key: {0}")]
    UnreadableClientCertificate(String),
    /// The server name is not a DNS name.
    #[error("server name {0:?} is not a DNS name")]
    InvalidServerName(String),
}

impl TlsSettings {
    /// Parses PEM material: a CA bundle, optionally a client certificate chain and its key.
    pub fn from_pem(
        ca_bundle: &[u8],
        client: Option<(&[u8], &[u8])>,
        server_name: Option<&str>,
    ) -> Result<Self, TlsSettingsError> {
        let roots = reqwest::Certificate::from_pem_bundle(ca_bundle)
            .map_err(|e| TlsSettingsError::UnreadableCa(e.to_string()))?;
        if roots.is_empty() {
            return Err(TlsSettingsError::NoCaCertificate);
        }
        let identity = match client {
            Some((certificate, key)) => {
                let mut pem = certificate.to_vec();
                if !pem.ends_with(b"\n") {
                    pem.push(b'\n');
                }
                pem.extend_from_slice(key);
                Some(
                    reqwest::Identity::from_pem(&pem)
                        .map_err(|e| TlsSettingsError::UnreadableClientCertificate(error_chain(&e)))?,
                )
            }
            None => None,
        };
        let server_name = server_name.filter(|name| !name.is_empty()).map(str::to_owned);
        if let Some(name) = &server_name
            && !is_dns_name(name)
        {
            return Err(TlsSettingsError::InvalidServerName(name.clone()));
        }
        let mut digest = Vec::with_capacity(ca_bundle.len() + 64);
        for part in [ca_bundle, client.map_or(&[][..], |c| c.0), client.map_or(&[][..], |c| c.1)] {
            digest.extend_from_slice(Checksum::of(part).to_string().as_bytes());
        }
        digest.extend_from_slice(server_name.as_deref().unwrap_or("").as_bytes());
        Ok(Self { roots, identity, server_name, fingerprint: Checksum::of(&digest) })
    }

    /// The name pods' certificates are checked against, when not their IP.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// Whether the controller presents a client certificate.
    pub fn has_client_certificate(&self) -> bool {
        self.identity.is_some()
    }
}

impl PartialEq for TlsSettings {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl Eq for TlsSettings {}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca_certificates", &self.roots.len())
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// An error and all its causes on one line: a TLS failure is several layers deep (reqwest,
/// hyper, an I/O error, rustls's reason), and only the last says what was wrong.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut current = error;
    loop {
        // An io::Error wrapping another error gives that error's *source* as its own, skipping
        // the wrapped error itself; look inside it first.
        let inner = current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        let next = match inner {
            Some(inner) if !std::ptr::addr_eq(inner, current) => Some(inner),
            _ => current.source(),
        };
        let Some(next) = next else { break };
        let text = next.to_string();
        if !parts.iter().any(|seen| seen.contains(&text)) {
            parts.push(text);
        }
        current = next;
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_garbled_ca_bundle_is_refused() {
        assert_eq!(TlsSettings::from_pem(b"", None, None).unwrap_err(), TlsSettingsError::NoCaCertificate);
        assert_eq!(TlsSettings::from_pem(b"hello", None, None).unwrap_err(), TlsSettingsError::NoCaCertificate);
    }

    #[test]
    fn server_names_must_be_dns_names() {
        assert!(is_dns_name("haproxy-dataplane"));
        assert!(is_dns_name("dataplane.haptic.svc"));
        for bad in ["", "a..b", "-a", "a b", "a_b", "x\n"] {
            assert!(!is_dns_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_error_chain_reaches_inside_io_errors() {
        #[derive(Debug, Error)]
        #[error("invalid peer certificate: UnknownIssuer")]
        struct Rustls;
        #[derive(Debug, Error)]
        #[error("client error (Connect)")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::new(std::io::ErrorKind::InvalidData, Rustls));
        assert_eq!(error_chain(&error), "client error (Connect): invalid peer certificate: UnknownIssuer");
    }
}
