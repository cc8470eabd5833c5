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
