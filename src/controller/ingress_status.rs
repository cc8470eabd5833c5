//! `status.loadBalancer` of the Ingresses a configuration serves: what each should say, as a
//! plain function of the render's stores ([`changes`]), and the writer that sends only the
//! differences. An Ingress of another class, or one the render left out, loses the addresses
//! this controller wrote (and keeps any another controller wrote).

use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value as Json, json};
use tracing::warn;

use crate::config::IngressStatusSettings;
use crate::store::{ObjectRef, Stores};

/// One Ingress whose `status.loadBalancer.ingress` must change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressStatusChange {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The new list (empty: none).
    pub ingress: Vec<Json>,
}

fn entries(addresses: &[String]) -> Vec<Json> {
    addresses
        .iter()
        .map(|address| {
            if address.parse::<std::net::IpAddr>().is_ok() {
                json!({"ip": address})
            } else {
                json!({"hostname": address})
            }
        })
        .collect()
}

/// The Ingresses whose status must change: those served (of the class, not left out) that do
/// not say `addresses` (the pods' IPs when none are configured), and those no longer served
/// that still say exactly what this controller writes.
pub fn changes(
    stores: &Stores,
    settings: &IngressStatusSettings,
    pod_ips: &[String],
    left_out: &[ObjectRef],
) -> Vec<IngressStatusChange> {
    let addresses = if settings.addresses.is_empty() { pod_ips.to_vec() } else { settings.addresses.clone() };
    let ours = entries(&addresses);
    let mut out = Vec::new();
    for store in stores.values().filter(|store| store.kind() == "Ingress") {
        for object in store.iter() {
            // Read from the stored template value: no copy of each Ingress on every render.
            let at = |path: &[&str]| {
                let mut value = object.value.clone();
                for key in path {
                    value = value.get_attr(key).ok().filter(|v| !v.is_undefined() && !v.is_none())?;
                }
                Some(value)
            };
            let class = at(&["spec", "ingressClassName"])
                .or_else(|| {
                    at(&["metadata", "annotations"])
                        .and_then(|a| a.get_item(&"kubernetes.io/ingress.class".into()).ok())
                })
                .and_then(|class| class.as_str().map(str::to_owned))
                .unwrap_or_default();
            let of_class = class == settings.ingress_class || (class.is_empty() && settings.default_class);
            let served = of_class && !left_out.contains(&object.reference);
            let current: Vec<Json> = at(&["status", "loadBalancer", "ingress"])
                .and_then(|list| serde_json::to_value(&list).ok())
                .and_then(|list| list.as_array().cloned())
                .unwrap_or_default();
            let wanted = if served {
                ours.clone()
            } else if !current.is_empty() && current == ours {
                Vec::new()
            } else {
                continue;
            };
            if current != wanted {
                out.push(IngressStatusChange {
                    namespace: object.reference.key.namespace.clone(),
                    name: object.reference.key.name.clone(),
                    ingress: wanted,
                });
            }
        }
    }
    out
}

/// Sends each change as a merge patch of the Ingress's status; a failure is logged and the
/// next render (which still sees the difference) tries again.
pub async fn write(client: &kube::Client, changes: Vec<IngressStatusChange>) {
    for change in changes {
        let api: Api<k8s_openapi::api::networking::v1::Ingress> = Api::namespaced(client.clone(), &change.namespace);
        let list = if change.ingress.is_empty() { Json::Null } else { Json::Array(change.ingress) };
        let patch = json!({"status": {"loadBalancer": {"ingress": list}}});
        if let Err(error) = api.patch_status(&change.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            warn!(namespace = %change.namespace, name = %change.name, %error, "could not write the Ingress status");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::{ObjectKey, ResourceStore};

    fn stores(objects: Vec<Json>) -> Stores {
        let mut store = ResourceStore::new("Ingress", Vec::new());
        for object in objects {
            store.apply(object).expect("an Ingress");
        }
        Stores::from([("ingresses".to_owned(), Arc::new(store))])
    }

    fn ingress(name: &str, class: &str, status: Json) -> Json {
        json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"ingressClassName": class}, "status": status})
    }

    #[test]
    fn served_ingresses_get_the_addresses_and_others_lose_only_ours() {
        let settings = IngressStatusSettings {
            ingress_class: "haproxy".into(),
            default_class: false,
            addresses: vec!["192.0.2.1".into(), "lb.example.com".into()],
        };
        let ours = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "lb.example.com"}]}});
        let theirs = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}});
        let stores = stores(vec![
            ingress("new", "haproxy", json!({})),
            ingress("done", "haproxy", ours.clone()),
            ingress("moved", "nginx", ours.clone()),
            ingress("other", "nginx", theirs),
            ingress("refused", "haproxy", ours),
        ]);
        let refused =
            ObjectRef { kind: "Ingress".into(), key: ObjectKey { namespace: "ns".into(), name: "refused".into() } };
        let changes = changes(&stores, &settings, &[], &[refused]);
        let names: Vec<(&str, usize)> = changes.iter().map(|c| (c.name.as_str(), c.ingress.len())).collect();
        assert_eq!(names, vec![("moved", 0), ("new", 2), ("refused", 0)]);
    }

    #[test]
    fn without_addresses_the_pods_ips_are_written() {
        let settings =
            IngressStatusSettings { ingress_class: "haproxy".into(), default_class: true, addresses: vec![] };
        let stores = stores(vec![json!({"metadata": {"namespace": "ns", "name": "classless"}, "spec": {}})]);
        let changes = changes(&stores, &settings, &["10.0.0.7".into()], &[]);
        assert_eq!(changes[0].ingress, vec![json!({"ip": "10.0.0.7"})]);
    }
}
