//! The Secrets the pods are reached with (`credentialsSecretRef`, and `dataplane.tls`'s),
//! watched: a rotation is read again and handed to the loop, which deploys with it at once,
//! without a restart. A Secret changed into something unusable is reported and the previous
//! credentials stay in use.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tracing::warn;

use crate::config::HAProxyTemplateConfigSpec;
use crate::dataplane::Access;

/// The pods' access read again after one of its Secrets changed.
pub(crate) struct AccessChanged {
    /// The configuration version whose Secrets these are.
    pub(crate) generation: i64,
    /// The new access, or why the changed Secrets cannot be used.
    pub(crate) access: Result<Access, String>,
}

/// Why a Secret haptic makes could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The API server refused a read or a write.
    #[error("Secret {secret}: {source}")]
    Api {
        /// `namespace/name`.
        secret: String,
        /// Its answer.
        source: kube::Error,
    },
    /// The Secret object could not be formed.
    #[error("Secret {secret}: {source}")]
    Shape {
        /// `namespace/name`.
        secret: String,
        /// What was wrong.
        source: serde_json::Error,
    },
    /// The system had no randomness to give.
    #[error("no randomness for a password: {0}")]
    NoRandomness(#[source] std::io::Error),
    /// The certificates could not be made.
    #[error("making the Dataplane API's certificates: {0}")]
    Certificates(#[source] rcgen::Error),
}

/// Creates the Dataplane credentials Secret `namespace/name` (keys `dataplane_username`,
/// `dataplane_password`: 32 random letters and digits) when it does not exist; an existing one
/// is never changed. The chart's way when it is given no password: a template's `lookup`
/// (which GitOps tools render without a cluster) made a new password on every sync. Several
/// replicas may race: the one that loses finds the winner's. Whether it was created.
pub async fn ensure_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    username: &str,
) -> Result<bool, SecretError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let said = |source: kube::Error| SecretError::Api { secret: format!("{namespace}/{name}"), source };
    if secrets.get_metadata_opt(name).await.map_err(said)?.is_some() {
        return Ok(false);
    }
    let password = random_password().map_err(SecretError::NoRandomness)?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "haptic"}},
        "type": "Opaque",
        "stringData": {"dataplane_username": username, "dataplane_password": password}
    }))
    .map_err(|source| SecretError::Shape { secret: format!("{namespace}/{name}"), source })?;
    match secrets.create(&kube::api::PostParams::default(), &secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(answer)) if answer.code == 409 => Ok(false),
        Err(error) => Err(said(error)),
    }
}

/// A CA and a serving certificate it signed for the pods' Dataplane APIs, in PEM.
pub struct DataplanePki {
    /// The CA's certificate (`ca.crt`): what the controller checks the pods with.
    pub ca: String,
    /// The pods' certificate (`tls.crt`), for `server_name`.
    pub certificate: String,
    /// Its key (`tls.key`).
    pub key: String,
}

/// Makes a CA and a certificate for `server_name` signed by it (ECDSA P-256, valid ten years:
/// it is made once and kept; deleting the Secret and restarting makes new ones). The CA's key
/// is dropped here: nothing else can be signed with it.
pub fn make_dataplane_pki(server_name: &str) -> Result<DataplanePki, SecretError> {
    let failed = SecretError::Certificates;
    let now = time::OffsetDateTime::now_utc();
    let valid = |params: &mut rcgen::CertificateParams| {
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(3650);
    };
    let ca_key = rcgen::KeyPair::generate().map_err(failed)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca.distinguished_name.push(rcgen::DnType::CommonName, "haptic dataplane CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    valid(&mut ca);
    let ca_certificate = ca.self_signed(&ca_key).map_err(failed)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().map_err(failed)?;
    let mut leaf = rcgen::CertificateParams::new(vec![server_name.to_owned()]).map_err(failed)?;
    leaf.distinguished_name.push(rcgen::DnType::CommonName, server_name);
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    valid(&mut leaf);
    let certificate = leaf.signed_by(&key, &issuer).map_err(failed)?;
    Ok(DataplanePki { ca: ca_certificate.pem(), certificate: certificate.pem(), key: key.serialize_pem() })
}

/// Creates the Dataplane TLS Secret `namespace/name` (type `kubernetes.io/tls`: `ca.crt`,
/// `tls.crt`, `tls.key`, the certificate for `server_name`) when it does not exist; an existing
/// one is never changed. The pods mount it to serve their Dataplane API (their start waits for
/// it); the controller checks them with its `ca.crt`. Whether it was created.
pub async fn ensure_tls_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    server_name: &str,
) -> Result<bool, SecretError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let said = |source: kube::Error| SecretError::Api { secret: format!("{namespace}/{name}"), source };
    if secrets.get_metadata_opt(name).await.map_err(said)?.is_some() {
        return Ok(false);
    }
    let pki = make_dataplane_pki(server_name)?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "haptic"}},
        "type": "kubernetes.io/tls",
        "stringData": {"ca.crt": pki.ca, "tls.crt": pki.certificate, "tls.key": pki.key}
    }))
    .map_err(|source| SecretError::Shape { secret: format!("{namespace}/{name}"), source })?;
    match secrets.create(&kube::api::PostParams::default(), &secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(answer)) if answer.code == 409 => Ok(false),
        Err(error) => Err(said(error)),
    }
}

/// 32 letters and digits from the kernel's random source.
fn random_password() -> std::io::Result<String> {
    use std::io::Read as _;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut password = String::with_capacity(32);
    let mut source = std::fs::File::open("/dev/urandom")?;
    while password.len() < 32 {
        let mut byte = [0u8; 1];
        source.read_exact(&mut byte)?;
        // 248 = 4 * 62: bytes above it are drawn again, so every character is equally likely.
        if usize::from(byte[0]) < 4 * ALPHABET.len() {
            password.push(char::from(ALPHABET[usize::from(byte[0]) % ALPHABET.len()]));
        }
    }
    Ok(password)
}

/// The Secrets `spec` reaches pods with, as (namespace, name); `namespace` is the
/// configuration's, for references that name none.
pub(crate) fn secrets(spec: &HAProxyTemplateConfigSpec, namespace: &str) -> Vec<(String, String)> {
    let dataplane = &spec.dataplane;
    let references = dataplane.credentials_secret_ref.iter().chain(dataplane.tls.iter().map(|tls| &tls.secret_ref));
    let mut found: Vec<(String, String)> =
        references.map(|r| (r.namespace.clone().unwrap_or_else(|| namespace.to_owned()), r.name.clone())).collect();
    found.sort();
    found.dedup();
    found
}

/// Watches each of `spec`'s Secrets until dropped (the caller aborts it with the version);
/// every change after the first listing sends the access read again.
pub(crate) async fn watch(
    client: kube::Client,
    spec: HAProxyTemplateConfigSpec,
    namespace: String,
    generation: i64,
    changes: mpsc::Sender<AccessChanged>,
) {
    let watched = secrets(&spec, &namespace);
    let streams = watched.iter().map(|(secret_namespace, name)| {
        let api: Api<Secret> = Api::namespaced(client.clone(), secret_namespace);
        let selector = format!("metadata.name={name}");
        watcher::watcher(api, watcher::Config::default().fields(&selector)).boxed()
    });
    let mut events = futures::stream::select_all(streams);
    // Each stream lists first; the access was read at activation, after that listing began.
    let mut listings_done = 0;
    let watched = watched.len();
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(Event::InitDone) => {
                listings_done += 1;
                // A re-listing after a lost watch may hide a change: read again then too.
                listings_done > watched
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => true,
            Ok(Event::Init | Event::InitApply(_)) => false,
            Err(error) => {
                warn!(%error, "watching the Dataplane credentials Secret failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                false
            }
        };
        if changed {
            let access = super::deploy::access(&client, &spec, &namespace).await;
            if changes.send(AccessChanged { generation, access }).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_password_is_32_letters_and_digits_and_new_each_time() {
        let (first, second) = (random_password().unwrap(), random_password().unwrap());
        assert_eq!(first.len(), 32);
        assert!(first.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(first, second);
    }

    /// The made certificate is served and checked as the controller checks a pod: against the
    /// CA alone, by the server name, over a real TLS handshake on loopback.
    #[tokio::test]
    async fn the_made_certificate_is_trusted_by_its_ca_for_its_server_name_only() {
        crate::tls::install_crypto_provider();
        let pki = make_dataplane_pki("dataplane.haptic.internal").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &pki.certificate).unwrap();
        std::fs::write(dir.path().join("tls.key"), &pki.key).unwrap();
        let config = crate::api::tls::from_directory(dir.path()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/v3/info", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(crate::api::tls::serve(listener, config, app, "a test"));
        let ca = reqwest::Certificate::from_pem(pki.ca.as_bytes()).unwrap();
        let ask = |name: &'static str| {
            let client =
                reqwest::Client::builder().tls_certs_only([ca.clone()]).resolve(name, address).build().unwrap();
            async move { client.get(format!("https://{name}:{}/v3/info", address.port())).send().await }
        };
        let answer = ask("dataplane.haptic.internal").await.unwrap();
        assert_eq!(answer.text().await.unwrap(), "ok");
        let error = ask("elsewhere.haptic.internal").await.unwrap_err();
        assert!(format!("{error:?}").contains("NotValidForName"), "{error:?}");
        server.abort();
        assert_ne!(make_dataplane_pki("x").unwrap().ca, pki.ca, "a new CA each time");
    }

    #[test]
    fn the_credentials_and_tls_secrets_are_watched_each_once() {
        let spec: HAProxyTemplateConfigSpec = serde_json::from_value(serde_json::json!({
            "watchedResources": {},
            "podSelector": {"matchLabels": {"app": "haproxy"}},
            "dataplane": {"credentialsSecretRef": {"name": "dataplane"},
                          "tls": {"secretRef": {"name": "dataplane-ca", "namespace": "pki"}}},
            "templates": {"haproxyConfig": "global\n"}
        }))
        .unwrap();
        let found = secrets(&spec, "haptic");
        assert_eq!(found, [("haptic".into(), "dataplane".into()), ("pki".into(), "dataplane-ca".into())]);
    }
}
