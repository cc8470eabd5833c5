//! Gateway API objects for tests: created through the API server as the CRDs define them.

use anyhow::{Context, Result};
use haptic::gateway::resources::api_resource as resource;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value as Json, json};

pub use haptic::gateway::resources::GROUP;

/// The objects of a Gateway API kind, in a namespace or (cluster-scoped kinds) everywhere.
pub fn api(client: &kube::Client, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource(kind)),
        None => Api::all_with(client.clone(), &resource(kind)),
    }
}

/// Creates a Gateway API object of `kind` (apiVersion and kind are filled in).
pub async fn create(client: &kube::Client, kind: &str, namespace: Option<&str>, mut object: Json) -> Result<()> {
    object["apiVersion"] = json!(format!("{GROUP}/v1"));
    object["kind"] = json!(kind);
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let dynamic: DynamicObject = serde_json::from_value(object)?;
    api(client, kind, namespace)
        .create(&PostParams::default(), &dynamic)
        .await
        .with_context(|| format!("creating {kind} {name}"))?;
    Ok(())
}

/// An HTTPRoute-shaped route (any kind with parents, hostnames and rules).
pub fn route(name: &str, parent: Json, hostnames: &[&str], rules: Json) -> Json {
    json!({"metadata": {"name": name}, "spec": {"parentRefs": [parent], "hostnames": hostnames, "rules": rules}})
}

/// `backendRefs` to port 80 of one Service.
pub fn to(service: &str) -> Json {
    json!([{"name": service, "port": 80}])
}

/// A match on a path prefix.
pub fn prefix(path: &str) -> Json {
    json!({"path": {"type": "PathPrefix", "value": path}})
}

/// An object's `status`.
pub async fn status_of(client: &kube::Client, kind: &str, namespace: Option<&str>, name: &str) -> Result<Json> {
    Ok(api(client, kind, namespace).get(name).await?.data.get("status").cloned().unwrap_or_default())
}

/// Creates the GatewayClass `haptic-<namespace>` of `controller_name` (cluster-scoped, so named
/// after the test's namespace) and gives its name.
pub async fn gateway_class(client: &kube::Client, namespace: &str, controller_name: &str) -> Result<String> {
    let class = format!("haptic-{namespace}");
    let object = json!({"metadata": {"name": class}, "spec": {"controllerName": controller_name}});
    create(client, "GatewayClass", None, object).await?;
    Ok(class)
}
