//! The Services that give each Gateway an address of its own (`gatewayAPI.gatewayServices`):
//! one per served Gateway, in the HAProxy pods' namespace, selecting the pods, each listener
//! port mapped to the fleet port the model gave that Gateway. The model decides them
//! ([`crate::gateway::GatewayService`]); this applies them (server-side, only when they
//! changed) and deletes the ones of this controller no Gateway needs any more. The Services'
//! addresses come back through the watched Services into the next render's Gateway status.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value as Json, json};
use tracing::{info, warn};

use crate::config::GatewayServices;
use crate::gateway::GatewayService;

/// The label marking a Service as one this controller keeps for a Gateway; its value tells
/// controllers (controller names) apart.
const OWNER_LABEL: &str = "haptic.dev/gateway-service";
/// The annotation naming the Service's Gateway, for people.
const GATEWAY_ANNOTATION: &str = "haptic.dev/gateway";
/// The field manager of the Services' server-side applies.
const FIELD_MANAGER: &str = "haptic-gateway-services";

/// The label value for `controller_name`: a label value cannot hold its slashes.
fn owner_value(controller_name: &str) -> String {
    format!("{:016x}", crate::gateway::stable_hash(controller_name))
}

/// The Service manifest for one Gateway.
pub(super) fn manifest(settings: &GatewayServices, controller_name: &str, service: &GatewayService) -> Json {
    let mut annotations: serde_json::Map<String, Json> =
        settings.annotations.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    annotations
        .insert(GATEWAY_ANNOTATION.into(), json!(format!("{}/{}", service.gateway_namespace, service.gateway_name)));
    let ports: Vec<Json> = service
        .ports
        .iter()
        .map(|(port, fleet_port)| {
            json!({"name": format!("listener-{port}"), "port": port, "targetPort": fleet_port, "protocol": "TCP"})
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service.name,
            "namespace": settings.namespace,
            "labels": {"app.kubernetes.io/managed-by": "haptic", OWNER_LABEL: owner_value(controller_name)},
            "annotations": annotations,
        },
        "spec": {"type": settings.service_type, "selector": settings.selector, "ports": ports},
    })
}

/// What the Services should be, and what was last applied.
#[derive(Default)]
pub(super) struct ServiceWriter {
    wanted: Option<(GatewayServices, Vec<GatewayService>)>,
    applied: Option<(GatewayServices, Vec<GatewayService>)>,
    /// Whether the last write failed (it is tried again).
    failed: bool,
}

impl ServiceWriter {
    /// Takes what a render decided; `settings` absent means no Services are kept.
    pub(super) fn offer(&mut self, settings: Option<GatewayServices>, services: Vec<GatewayService>) {
        self.wanted = settings.map(|settings| (settings, services));
    }

    /// Whether a failed write waits for another pass.
    pub(super) fn pending(&self) -> bool {
        self.failed
    }

    /// Applies the wanted Services when they changed since the last success, and deletes this
    /// controller's others in that namespace.
    pub(super) async fn flush(&mut self, client: &kube::Client, controller_name: &str) {
        let Some((settings, services)) = &self.wanted else { return };
        if !self.failed && self.applied == self.wanted {
            return;
        }
        match apply(client, controller_name, settings, services).await {
            Ok(()) => {
                self.failed = false;
                self.applied = self.wanted.clone();
            }
            Err(error) => {
                warn!(namespace = %settings.namespace, %error, "could not bring the Gateways' Services in line; retrying");
                self.failed = true;
            }
        }
    }
}

async fn apply(
    client: &kube::Client,
    controller_name: &str,
    settings: &GatewayServices,
    services: &[GatewayService],
) -> Result<(), kube::Error> {
    let api: Api<Service> = Api::namespaced(client.clone(), &settings.namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for service in services {
        let manifest = manifest(settings, controller_name, service);
        api.patch(&service.name, &params, &Patch::Apply(&manifest)).await?;
    }
    let wanted: BTreeSet<&str> = services.iter().map(|s| s.name.as_str()).collect();
    let selector = format!("{OWNER_LABEL}={}", owner_value(controller_name));
    for existing in api.list(&ListParams::default().labels(&selector)).await? {
        let Some(name) = existing.metadata.name else { continue };
        if !wanted.contains(name.as_str()) {
            info!(namespace = %settings.namespace, service = %name, "deleting the Service of a Gateway no longer served");
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(answer)) if answer.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_service_maps_each_listener_port_to_its_fleet_port_on_the_selected_pods() {
        let settings = GatewayServices {
            namespace: "haptic".into(),
            selector: [("app".to_owned(), "haproxy".to_owned())].into(),
            service_type: "LoadBalancer".into(),
            annotations: [("cloud/lb".to_owned(), "internal".to_owned())].into(),
            first_port: 20000,
            last_port: 20999,
        };
        let service = GatewayService {
            gateway_namespace: "team-a".into(),
            gateway_name: "web".into(),
            name: "gw-web-0123abcd".into(),
            ports: vec![(80, 20017), (443, 20412)],
        };
        let manifest = manifest(&settings, "haptic.dev/gateway-controller", &service);
        assert_eq!(manifest["metadata"]["namespace"], "haptic");
        assert_eq!(manifest["metadata"]["annotations"]["haptic.dev/gateway"], "team-a/web");
        assert_eq!(manifest["metadata"]["annotations"]["cloud/lb"], "internal");
        let label = manifest["metadata"]["labels"][OWNER_LABEL].as_str().unwrap_or_default();
        assert!(label.len() <= 63 && label.bytes().all(|b| b.is_ascii_hexdigit()), "{label}");
        assert_eq!(manifest["spec"]["selector"]["app"], "haproxy");
        assert_eq!(manifest["spec"]["type"], "LoadBalancer");
        assert_eq!(
            manifest["spec"]["ports"],
            json!([
                {"name": "listener-80", "port": 80, "targetPort": 20017, "protocol": "TCP"},
                {"name": "listener-443", "port": 443, "targetPort": 20412, "protocol": "TCP"},
            ])
        );
    }
}
