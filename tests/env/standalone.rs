//! The chart's library on the environment's pods: backends on the environment's backend host
//! (EndpointSlices refuse loopback addresses), their Services and Ingresses, and the chart's
//! configuration for the pods, which the real controller deploys through their Dataplane APIs.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

/// The address of the environment's backend host (a network namespace on 198.18.0.0/15 that
/// `envctl.py up` makes): EndpointSlices refuse loopback, and the machine's own address is
/// neither the environment's nor always a local one. Backends started by `start_backends`
/// listen there.
pub fn backend_host_address() -> Result<String> {
    Ok(super::environment().backend_host.address.clone())
}

/// A child process killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the backends `name=address:port` (one process) on the environment's backend host
/// (inside its network namespace), answering with their names.
pub fn start_backends(dir: &Path, address: &str, specs: &[(String, u16)]) -> Result<Process> {
    let specs: Vec<String> = specs.iter().map(|(name, port)| format!("{name}={address}:{port}")).collect();
    start_backend_specs(dir, &specs)
}

/// Starts backends from `backend.py` specs (`name=address:port[=cert.pem]`) on the backend host.
pub fn start_backend_specs(dir: &Path, specs: &[String]) -> Result<Process> {
    let host = &super::environment().backend_host;
    let child = Command::new("ip")
        .args(["netns", "exec", &host.namespace, "python3"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/backend.py"))
        .args(specs)
        // `<dir>/<name>.sick` fails that backend's /healthz.
        .env("HAPTIC_BACKEND_STATE", dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("backends.log"))?)
        .spawn()
        .context("starting the backends")?;
    Ok(Process(child))
}

/// Starts `auth_server.py` (oauth2-proxy's protocol) at `address:port` on the backend host.
pub fn start_auth_server(dir: &Path, address: &str, port: u16) -> Result<Process> {
    let host = &super::environment().backend_host;
    let child = Command::new("ip")
        .args(["netns", "exec", &host.namespace, "python3"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/auth_server.py"))
        .arg(format!("{address}:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("auth.log"))?)
        .spawn()
        .context("starting the auth server")?;
    Ok(Process(child))
}

/// An Ingress `name` of the chart's class sending every path of `host` to port 80 of `service`.
pub fn ingress_to(name: &str, host: &str, service: &str) -> Result<k8s_openapi::api::networking::v1::Ingress> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}
    }))?)
}

/// `count` routed Services for benches, 16 written at a time: Service `app-i` (port 80 to 8080),
/// its EndpointSlice of three addresses nothing answers on (198.19.0.0/16, the benchmark
/// range) and an Ingress for `app-i.<domain>` to it.
#[allow(dead_code)]
pub async fn bulk_routed(client: &kube::Client, namespace: &str, count: usize, domain: &str) -> Result<()> {
    use futures::StreamExt;
    let post = PostParams::default();
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let ingresses: Api<k8s_openapi::api::networking::v1::Ingress> = Api::namespaced(client.clone(), namespace);
    let routed = |i: usize| {
        let (post, services, slices, ingresses) = (&post, &services, &slices, &ingresses);
        async move {
            let name = format!("app-{i}");
            let service = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
            }))?;
            services.create(post, &service).await?;
            let endpoints: Vec<_> = (3 * i..3 * i + 3)
                .map(|k| {
                    json!({"addresses": [format!("198.19.{}.{}", k / 250 % 250, k % 250 + 1)],
                                 "conditions": {"ready": true}})
                })
                .collect();
            let slice = serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}],
                "endpoints": endpoints
            }))?;
            slices.create(post, &slice).await?;
            ingresses.create(post, &ingress_to(&name, &format!("{name}.{domain}"), &name)?).await?;
            anyhow::Ok(())
        }
    };
    let written: Vec<Result<()>> = futures::stream::iter(0..count).map(routed).buffer_unordered(16).collect().await;
    written.into_iter().collect()
}

/// A Service `name` (port 80, named `http`) with one ready endpoint at `address:port`.
pub async fn service_with_endpoints(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    address: &str,
    port: u16,
) -> Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": port}]}
    }))?;
    services.create(&PostParams::default(), &service).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let slice = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]
    }))?;
    slices.create(&PostParams::default(), &slice).await?;
    Ok(())
}

/// An EndpointSlice `name` of `service` with one ready endpoint at `address:port` (port named
/// `http`).
pub fn endpoint_slice(name: &str, service: &str, address: &str, port: u16) -> Result<EndpointSlice> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]
    }))?)
}

/// Applies the chart's default configuration (`haptic`) for release `release`, bound to
/// `frontend` (HTTP 8080, HTTPS 8443, health 8404) with its files under `dir`, watching only
/// `namespace` (other tests share the API server): for a controller that only renders.
pub async fn apply_library_config(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    frontend: &str,
    dir: &Path,
) -> Result<()> {
    apply_library_config_with(client, namespace, release, frontend, dir, &[]).await
}

/// [`apply_library_config`] with more chart values (`key`, `value`), set after the others.
pub async fn apply_library_config_with(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    frontend: &str,
    dir: &Path,
    values: &[(&str, String)],
) -> Result<()> {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut placement = vec![
        ("haproxy.bindAddress", frontend.to_owned()),
        ("haproxy.paths.maps", path("maps")),
        ("haproxy.paths.general", path("general")),
        ("haproxy.paths.certs", path("certs")),
        ("haproxy.paths.runtimeSocket", path("runtime.sock")),
    ];
    placement.extend(values.iter().cloned());
    apply_chart_config(client, namespace, release, &placement, None).await
}

/// A namespace of its own for the chart's library on the environment's pods: the chart's CRD
/// served, the pods registered in it, and the Dataplane credentials Secret `dataplane`.
pub async fn library_namespace(env: &super::Manifest, client: &kube::Client, test: &str) -> Result<String> {
    super::chart::apply_chart_crd(client).await?;
    let namespace = env.fresh_namespace(client, test).await?;
    super::fixtures::dataplane_secret(client, &namespace, &env.dataplane.username, &env.dataplane.password).await?;
    Ok(namespace)
}

/// Applies the chart's default configuration (`haptic`) for the environment's pods: each binds
/// its own address (`POD_IP` in its environment), keeps its files and its runtime socket
/// below `/var/run/haproxy` (each pod sees its own there, at the same absolute paths, which
/// the runtime map endpoints need), and is deployed to through its Dataplane API
/// with the credentials of the Secret `dataplane` (see `fixtures::dataplane_secret`).
pub async fn apply_library_config_for_pods(client: &kube::Client, namespace: &str, release: &str) -> Result<()> {
    apply_library_config_for_pods_with(client, namespace, release, &[]).await
}

/// [`apply_library_config_for_pods`] with more chart values (`key`, `value`), set after the others.
pub async fn apply_library_config_for_pods_with(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    values: &[(&str, String)],
) -> Result<()> {
    let mut placement = vec![
        ("haproxy.bindAddress", "\"${POD_IP}\"".to_owned()),
        // Where the environment's pods see their own storage directories (envctl.py).
        ("haproxy.paths.maps", "/var/run/haproxy/maps".into()),
        ("haproxy.paths.general", "/var/run/haproxy/general".into()),
        ("haproxy.paths.certs", "/var/run/haproxy/ssl".into()),
        ("haproxy.dataplane.existingSecret", "dataplane".into()),
    ];
    placement.extend(values.iter().cloned());
    let env_pods =
        json!({"matchLabels": {"app.kubernetes.io/name": "haproxy", "app.kubernetes.io/part-of": "haptic-env"}});
    apply_chart_config(client, namespace, release, &placement, Some(env_pods)).await
}

/// Renders the chart's configuration with the environment's ports (HTTP 8080, HTTPS 8443,
/// health 8404), `placement` and, when given, another pod selector, watching only `namespace`
/// (other tests share the API server), and applies it.
async fn apply_chart_config(
    client: &kube::Client,
    namespace: &str,
    release: &str,
    placement: &[(&str, String)],
    pod_selector: Option<serde_json::Value>,
) -> Result<()> {
    let only_here = format!("{{{namespace}}}");
    let mut values = vec![
        ("haproxy.ports.http", "8080".to_owned()),
        ("haproxy.ports.https", "8443".into()),
        ("haproxy.ports.health", "8404".into()),
        // The environment's pods serve their Dataplane API over http (its TLS pods are
        // tests/pods/dataplane_tls.rs's), not with the Secret the chart's controller would make.
        ("haproxy.dataplane.tls.enabled", "false".into()),
        ("config.watchedResources.ingresses.namespaces", only_here.clone()),
        ("config.watchedResources.services.namespaces", only_here.clone()),
        ("config.watchedResources.endpoints.namespaces", only_here.clone()),
        ("config.watchedResources.secrets.namespaces", only_here.clone()),
        ("config.watchedResources.opaquesecrets.namespaces", only_here),
    ];
    values.extend(placement.iter().cloned());
    let sets: Vec<String> = values.iter().map(|(key, value)| format!("{key}={value}")).collect();
    let mut args: Vec<&str> = Vec::new();
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    let documents = super::chart::render_chart(release, namespace, &args)?;
    let mut config = documents
        .iter()
        .find(|d| d["kind"] == "HAProxyTemplateConfig")
        .cloned()
        .context("the chart has no HAProxyTemplateConfig")?;
    if let Some(selector) = pod_selector {
        config["spec"]["podSelector"] = selector;
        // The pods that count rate limits together are the environment's, where it keeps them.
        if let Some(peers) = config["spec"]["watchedResources"].get_mut("haproxypods") {
            peers["namespaces"] = json!([super::environment().namespace]);
            peers["labelSelector"] = json!("app.kubernetes.io/name=haproxy,app.kubernetes.io/part-of=haptic-env");
        }
    }
    // The certificate the chart makes for the pods' rate-limit peers, as the chart would install it.
    for secret in documents
        .iter()
        .filter(|d| d["kind"] == "Secret" && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-peers-tls")))
    {
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret.clone())?;
        let name = secret.metadata.name.clone().context("the peers Secret has no name")?;
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), namespace);
        if secrets.get_opt(&name).await?.is_none() {
            secrets.create(&PostParams::default(), &secret).await?;
        }
    }
    let config: DynamicObject = serde_json::from_value(config)?;
    let discovery = kube::discovery::Discovery::new(client.clone()).filter(&["haptic.dev"]).run().await?;
    let (resource, _) = discovery
        .resolve_gvk(&kube::api::GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyTemplateConfig"))
        .context("the HAProxyTemplateConfig CRD is not served")?;
    let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    // Named as config.name says ("haptic" unless a test gives another).
    let name = config.metadata.name.clone().context("the configuration has no name")?;
    configs.patch(&name, &PatchParams::apply("haptic-tests"), &Patch::Apply(&config)).await?;
    Ok(())
}
