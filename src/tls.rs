//! TLS facts the controller needs: the process's rustls provider, and what it checks of the
//! certificates it serves before any pod sees them.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha1::{Digest, Sha1};

/// Installs aws-lc-rs as the process default rustls provider.
///
/// kube and reqwest both build rustls clients; if two providers are compiled in and none is
/// the default, the first client panics. Call this once, first thing in `main`.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Why a certificate and key cannot be served. Never quotes either.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertificateError {
    /// No `CERTIFICATE` block, or one that is not DER.
    #[error("tls.crt holds no readable certificate")]
    NoCertificate,
    /// No private key block, or one that is not DER.
    #[error("tls.key holds no readable private key")]
    NoKey,
    /// A key of a kind HAProxy's TLS library would not be given by us.
    #[error("tls.key is a private key of an unsupported kind")]
    UnsupportedKey,
    /// The key is not the first certificate's.
    #[error("tls.key is not the key of the first certificate in tls.crt")]
    KeyMismatch,
}

/// Checks that `certificate` (PEM, the served certificate first) and `key` (PEM) belong
/// together, as HAProxy will when it loads them: a pair that does not is refused here, before
/// it is written to any pod, so a bad renewal cannot land on a pod's disk and break its next
/// reload.
pub fn check_pair(certificate: &str, key: &str) -> Result<(), CertificateError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(certificate.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|_| CertificateError::NoCertificate)?;
    if chain.is_empty() {
        return Err(CertificateError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|_| CertificateError::NoKey)?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    match rustls::sign::CertifiedKey::from_der(chain, key, &provider) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => Err(CertificateError::KeyMismatch),
        Err(_) => Err(CertificateError::UnsupportedKey),
    }
}

/// The SHA-1 fingerprint of the first certificate of a PEM file, in the form HAProxy's
/// Runtime API shows it (`show ssl cert`: upper-case hex without separators).
pub fn first_certificate_sha1(pem: &str) -> Option<String> {
    let first = CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()?;
    Some(Sha1::digest(first.as_ref()).iter().map(|byte| format!("{byte:02X}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // A throwaway self-signed P-256 certificate for `a.test`, its key and another key, made with
    // openssl for this test only.
    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBdjCCAR2gAwIBAgIUFTR3psEtLIoURdpIGRDTksiRykswCgYIKoZIzj0EAwIw\nETEPMA0GA1UEAwwGYS50ZXN0MB4XDTI2MTIwMzAzNDEyM1oXDTI2MTIwNjAzNDEy\nM1owETEPMA0GA1UEAwwGYS50ZXN0MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\ndNh7o2+Qc+TspDNNGVQtZA8ZHsVnXLWa0CWSpbKERH7/UUwpc2+9NStqhvuF83zr\n4BL5Jc4KVzecRBXm6u5EEaNTMFEwHQYDVR0OBBYEFKea6fqAoHTl8CrkILnHma9q\n/Ep9MB8GA1UdIwQYMBaAFKea6fqAoHTl8CrkILnHma9q/Ep9MA8GA1UdEwEB/wQF\nMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIgVSu8Sb8539M7uKH7GZRJjkqU8c199n7M\nFBcGfy5JApoCIBU53unfNzLfSivLwiu803dU2WJcT2+clBknDbkDiiis\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgNZyLcaoX82X7LkZ+\nkVsYdcVv62ViGovqwberK0GxrNKhRANCAAR02Hujb5Bz5OykM00ZVC1kDxkexWdc\ntZrQJZKlsoREfv9RTClzb701K2qG+4XzfOvgEvklzgpXN5xEFebq7kQR\n-----END PRIVATE KEY-----\n";
    const OTHER_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgcTxQyGqyWmSCUGfM\ng1/jfc6evAeieMdU6IqNLNwxPkWhRANCAATMQKfJmFANa7ujAP4LnSV54WGTpzyS\n1jqblWIRcfz+NA6XlAS4ShBp1C0uyd7Gju8gAQq4rWLr5AOMLaceGBXk\n-----END PRIVATE KEY-----\n";

    #[test]
    fn a_pair_that_belongs_together_passes_and_others_are_refused_without_quoting() {
        assert_eq!(check_pair(CERT, KEY), Ok(()));
        assert_eq!(check_pair(CERT, OTHER_KEY), Err(CertificateError::KeyMismatch));
        assert_eq!(check_pair("not pem", KEY), Err(CertificateError::NoCertificate));
        assert_eq!(check_pair(CERT, CERT), Err(CertificateError::NoKey));
        let garbled = CERT.replace("MIIBdjCC", "MIIBdjXX");
        assert!(check_pair(&garbled, KEY).is_err());
        for error in [CertificateError::KeyMismatch, CertificateError::NoKey] {
            assert!(!error.to_string().contains("MII"), "{error}");
        }
    }

    #[test]
    fn the_fingerprint_is_the_first_certificates_as_haproxy_shows_it() {
        // `openssl x509 -fingerprint -sha1` said 39:90:60:AE:...:A0:7E.
        let pem = format!("{CERT}{KEY}");
        assert_eq!(first_certificate_sha1(&pem).as_deref(), Some("399060AE9C1003CDA1AF33DCECD23825D744A07E"));
        assert_eq!(first_certificate_sha1(KEY), None);
    }
}
