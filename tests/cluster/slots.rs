//! Server names survive a controller restart: the slots are journaled, so a restarted
//! controller renders every endpoint under the server name the pods already run, where a fresh
//! assignment would rename them (and cost every pod a reload). Real API server, real binary.

use crate::env;

use std::time::Duration;

use anyhow::Result;
use env::controller::{ControllerProcess, create_test_config, ensure_haptic_crd};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const TEMPLATE: &str = r#"backend be_web
{% set ready = collector() %}
{% for slice in resources.endpoints.list() %}
{% for endpoint in endpoints([slice], "http") if endpoint.ready %}
{% set _ = ready.push(endpoint) %}
{% endfor %}
{% endfor %}
{% for s in server_slots("be_web", ready.items(), 4) %}
    server {{ s.name | bare_word }} {{ s.address | bare_word }}:{{ s.port }}{% if not s.enabled %} disabled{% endif +%}
{% endfor %}
"#;

fn addresses(list: &[&str]) -> serde_json::Value {
    json!(list.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": true}})).collect::<Vec<_>>())
}

#[tokio::test]
async fn a_restarted_controller_keeps_every_endpoints_server_name() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "slots").await?;
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"ports": [{"name": "http", "port": 80}]}}),
    )?;
    services.create(&PostParams::default(), &service).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let slice = serde_json::from_value(json!({
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": addresses(&["10.0.0.1", "10.0.0.2"])
    }))?;
    slices.create(&PostParams::default(), &slice).await?;
    create_test_config(
        &client,
        &namespace,
        json!({
            "podSelector": {"matchLabels": {"haptic.dev/test": "none"}},
            "watchedResources": {"endpoints": {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                                               "namespaces": [namespace]}},
            "templates": {"haproxyConfig": TEMPLATE}
        }),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::start_in(env, &namespace, "test", dir, &journal)?;
    let within = Duration::from_secs(30);
    controller.wait_for_config("two endpoints", within, |cfg| cfg.contains("server srv2 10.0.0.2:8080")).await?;

    // 10.0.0.1 goes, 10.0.0.3 comes: it takes srv3 (free before; srv1, freed by this change,
    // stays free), 10.0.0.2 stays srv2. A fresh assignment of the same two would give srv1 to
    // 10.0.0.2.
    let churn = Patch::Merge(json!({"endpoints": addresses(&["10.0.0.2", "10.0.0.3"])}));
    slices.patch("web-1", &PatchParams::default(), &churn).await?;
    let churned = |cfg: &str| cfg.contains("server srv3 10.0.0.3:8080") && cfg.contains("server srv2 10.0.0.2:8080");
    controller.wait_for_config("the churn", within, churned).await?;
    let dir = controller.kill();
    // Only what the restarted controller renders counts.
    std::fs::remove_dir_all(dir.path().join("renders"))?;

    let restarted = ControllerProcess::start_in(env, &namespace, "test", dir, &journal)?;
    restarted.wait_for_config("the render after the restart", within, |cfg| cfg.contains("backend be_web")).await?;
    let cfg = restarted.file("haproxy.cfg");
    anyhow::ensure!(churned(&cfg), "the restart renamed servers:\n{cfg}\n{}", restarted.log_tail());
    Ok(())
}
