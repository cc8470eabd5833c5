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

/// Creates the Dataplane credentials Secret `namespace/name` (keys `dataplane_username`,
/// `dataplane_password`: 32 random letters and digits) when it does not exist; an existing one
/// is never changed. The chart's way when it is given no password: a template's `lookup`
/// (which GitOps tools render without a cluster) made a new password on every sync. Several
/// replicas may race: the one that loses finds the winner's. Whether it was created.
pub async fn ensure_secret(client: &kube::Client, namespace: &str, name: &str, username: &str) -> Result<bool, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let said = |e: kube::Error| format!("Secret {namespace}/{name}: {e}");
    if secrets.get_metadata_opt(name).await.map_err(said)?.is_some() {
        return Ok(false);
    }
    let password = random_password().map_err(|e| format!("no randomness for a password: {e}"))?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "haptic"}},
        "type": "Opaque",
        "stringData": {"dataplane_username": username, "dataplane_password": password}
    }))
    .map_err(|e| format!("Secret {namespace}/{name}: {e}"))?;
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
