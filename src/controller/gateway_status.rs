//! Writes the status the Gateway API model says each object is owed (`gateway::status`): after
//! each render, as one batch, and only for objects whose status changed since it was last
//! written; a write that fails is retried with the next batch. Only the leader writes.

use std::collections::BTreeMap;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use tracing::{debug, warn};

use crate::gateway::resources::api_resource as resource;
use crate::gateway::status::{Body, ObjectStatus, StatusSet, without_times};

type Key = (&'static str, String, String);

/// The writer, with what it wrote last.
pub(super) struct GatewayStatusWriter {
    client: kube::Client,
    controller_name: String,
    written: BTreeMap<Key, ObjectStatus>,
    /// The last set asked for, kept to retry what failed.
    pending: Option<StatusSet>,
}

impl GatewayStatusWriter {
    /// A writer for objects of `controller_name`.
    pub(super) fn new(client: kube::Client, controller_name: String) -> Self {
        Self { client, controller_name, written: BTreeMap::new(), pending: None }
    }

    /// Takes the status a render owes; [`Self::flush`] writes it.
    pub(super) fn offer(&mut self, statuses: StatusSet) {
        self.pending = Some(statuses);
    }

    /// Writes what changed. Routes this controller wrote for and no longer attaches lose their
    /// parents of this controller.
    pub(super) async fn flush(&mut self) {
        let Some(statuses) = self.pending.take() else { return };
        let mut wanted: BTreeMap<Key, ObjectStatus> = BTreeMap::new();
        for status in &statuses {
            wanted.insert((status.kind, status.namespace.clone(), status.name.clone()), status.clone());
        }
        for (key, before) in &self.written {
            if !wanted.contains_key(key) && matches!(before.body, Body::Route(_)) {
                wanted.insert(key.clone(), ObjectStatus { body: Body::Route(Vec::new()), ..before.clone() });
            }
        }
        let mut failed = false;
        for (key, status) in wanted {
            if self.written.get(&key) == Some(&status) {
                continue;
            }
            match self.write(&status).await {
                Ok(()) => {
                    if matches!(&status.body, Body::Route(parents) if parents.is_empty()) {
                        self.written.remove(&key);
                    } else {
                        self.written.insert(key, status);
                    }
                }
                Err(error) => {
                    failed = true;
                    warn!(kind = status.kind, namespace = %status.namespace, name = %status.name, %error,
                          "could not write the Gateway API status; retrying");
                }
            }
        }
        if failed {
            self.pending = Some(statuses);
        }
    }

    async fn write(&self, status: &ObjectStatus) -> Result<(), kube::Error> {
        let resource = resource(status.kind);
        let api: Api<DynamicObject> = if status.namespace.is_empty() {
            Api::all_with(self.client.clone(), &resource)
        } else {
            Api::namespaced_with(self.client.clone(), &status.namespace, &resource)
        };
        let current = match api.get_status(&status.name).await {
            Ok(object) => object.data.get("status").cloned().unwrap_or_default(),
            // Gone since the render: nothing to write.
            Err(kube::Error::Api(answer)) if answer.code == 404 => return Ok(()),
            Err(error) => return Err(error),
        };
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let merged = status.merged_into(&current, &self.controller_name, &now);
        if without_times(&merged) == without_times(&current) {
            return Ok(());
        }
        debug!(kind = status.kind, namespace = %status.namespace, name = %status.name, "writing Gateway API status");
        let patch = serde_json::json!({ "status": merged });
        api.patch_status(&status.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_are_the_gateway_apis_own() {
        assert_eq!(resource("GatewayClass").plural, "gatewayclasses");
        assert_eq!(resource("Gateway").plural, "gateways");
        assert_eq!(resource("HTTPRoute").plural, "httproutes");
        assert_eq!(resource("TCPRoute").plural, "tcproutes");
    }
}
