//! Writes the status the Gateway API model says each object is owed (`gateway::status`): after
//! each render, as one batch, and only for objects whose status changed since it was last
//! written; a write that fails is retried a second later, or with the next batch. Only the
//! leader writes. The writing runs on a task of its own (`writers::StatusTask`), each write
//! with a timeout and 8 in flight at most, so a slow API server never holds up the
//! controller's loop (its renders, leadership changes, shutdown). With `gatewayServices`, the
//! Gateways' Services are brought in line first (`gateway_services`), so that a Gateway's
//! address exists before its status names it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use tracing::{debug, warn};

use crate::gateway::resources::api_resource as resource;
use crate::gateway::status::{Body, ObjectStatus, StatusSet, without_times};

type Key = (&'static str, String, String);

/// Writes in flight at once.
const WRITES_IN_FLIGHT: usize = 8;
/// How long one write (a read and a patch) may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// One render's batch: what it owes, and the Services' settings of the version it rendered.
pub(super) struct Batch {
    /// Statuses and Services.
    pub(super) owed: crate::gateway::Owed,
    /// `gatewayServices`, when the Gateways get Services.
    pub(super) services: Option<crate::config::GatewayServices>,
}

/// What the Gateway API writer owes: the latest batch a render offered.
#[derive(Default)]
pub(super) struct LatestBatch(Option<Batch>);

impl super::writers::Owed for LatestBatch {
    type Offer = Batch;

    fn merge(&mut self, batch: Batch) -> bool {
        self.0 = Some(batch);
        true
    }
}

impl super::writers::StatusWrites for GatewayStatusWriter {
    type Owed = LatestBatch;

    async fn pass(&mut self, owed: &super::writers::SharedOwed<LatestBatch>, may_write: bool) -> bool {
        if let Some(batch) = owed.lock().0.take() {
            self.services.offer(batch.services, batch.owed.services);
            self.offer(batch.owed.status);
        }
        // A follower keeps the batch: it writes it if it leads again before a newer one comes.
        if may_write {
            self.services.flush(&self.client, &self.controller_name).await;
            self.flush().await;
        }
        self.pending.is_some() || self.services.pending()
    }
}

/// The writer, with what it wrote last.
pub(super) struct GatewayStatusWriter {
    client: kube::Client,
    controller_name: String,
    written: BTreeMap<Key, ObjectStatus>,
    /// The last set asked for, kept to retry what failed.
    pending: Option<StatusSet>,
    /// The Gateways' Services.
    services: super::gateway_services::ServiceWriter,
}

impl GatewayStatusWriter {
    /// A writer for objects of `controller_name`.
    pub(super) fn new(client: kube::Client, controller_name: String) -> Self {
        let services = super::gateway_services::ServiceWriter::default();
        Self { client, controller_name, written: BTreeMap::new(), pending: None, services }
    }

    /// Takes the status a render owes; [`Self::flush`] writes it.
    fn offer(&mut self, statuses: StatusSet) {
        self.pending = Some(statuses);
    }

    /// Writes what changed. Routes this controller wrote for and no longer attaches lose their
    /// parents of this controller.
    async fn flush(&mut self) {
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
        let todo: Vec<(Key, ObjectStatus)> =
            wanted.into_iter().filter(|(key, status)| self.written.get(key) != Some(status)).collect();
        // Each write owns what it needs: borrowed, the futures would not be `Send` for every
        // lifetime, which a spawned task asks of them.
        let writes: Vec<_> = todo
            .into_iter()
            .map(|(key, status)| {
                let (client, controller_name) = (self.client.clone(), self.controller_name.clone());
                async move {
                    let written = write(&client, &controller_name, &status);
                    let result = super::writers::bounded(WRITE_TIMEOUT, written).await;
                    (key, status, result)
                }
            })
            .collect();
        let results: Vec<(Key, ObjectStatus, Result<(), super::writers::WriteFailed>)> =
            futures::stream::iter(writes).buffer_unordered(WRITES_IN_FLIGHT).collect().await;
        let mut failed = false;
        for (key, status, result) in results {
            match result {
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
}

/// Writes one object's status, merged into what it has (other controllers' parts kept).
async fn write(client: &kube::Client, controller_name: &str, status: &ObjectStatus) -> Result<(), kube::Error> {
    let resource = resource(status.kind);
    let api: Api<DynamicObject> = if status.namespace.is_empty() {
        Api::all_with(client.clone(), &resource)
    } else {
        Api::namespaced_with(client.clone(), &status.namespace, &resource)
    };
    let current = match api.get_status(&status.name).await {
        Ok(object) => object.data.get("status").cloned().unwrap_or_default(),
        // Gone since the render: nothing to write.
        Err(kube::Error::Api(answer)) if answer.code == 404 => return Ok(()),
        Err(error) => return Err(error),
    };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let merged = status.merged_into(&current, controller_name, &now);
    if without_times(&merged) == without_times(&current) {
        return Ok(());
    }
    debug!(kind = status.kind, namespace = %status.namespace, name = %status.name, "writing Gateway API status");
    let patch = serde_json::json!({ "status": merged });
    api.patch_status(&status.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
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
