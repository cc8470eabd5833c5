//! Watching survives a restart of the API server under it: the watches resume by themselves,
//! and since nothing changed while it was down, nothing is rendered until something changes.
//! (Its own test binary: restarting the shared API server would disturb other tests.)

mod env;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, create_test_config, ensure_haptic_crd};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn watching_resumes_after_an_api_server_restart_without_spurious_renders() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "apiserver-restart").await?;
    create_test_config(&client, &namespace, json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "watchedResources": {"services": {"apiVersion": "v1", "kind": "Service", "namespaces": [namespace]}},
            "dataplane": {"debounce": {"window": "200ms", "maxDelay": "2s"}},
            "templates": {"haproxyConfig": "{% for s in resources.services %}service {{ s.metadata.name | bare_word }}\n{% endfor %}"}
        })).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let service = |name: &str| {
        serde_json::from_value::<Service>(json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}))
    };
    services.create(&PostParams::default(), &service("before")?).await?;

    let controller = ControllerProcess::start(env, &namespace, "test")?;
    let long = Duration::from_secs(60);
    controller.wait_for_config("the first render", long, |cfg| cfg.contains("service before")).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let renders_before = controller.renders().len();

    let restart = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/envctl.py"))
        .args(["restart-apiserver", "--quiet", "--state-dir"])
        .arg(&env.state_dir)
        .status()?;
    ensure!(restart.success(), "restarting the API server failed");
    // Give the watches time to notice, back off, reconnect and (if they must) re-list.
    env::holds_throughout(Duration::from_secs(8), "an API server restart with no change rendered anyway", || async {
        Ok(controller.renders().len() == renders_before)
    })
    .await
    .with_context(|| controller.log_tail())?;

    let client = env.kube_client().await?;
    let services: Api<Service> = Api::namespaced(client, &namespace);
    services.create(&PostParams::default(), &service("after")?).await?;
    controller.wait_for_config("a change after the restart", long, |cfg| cfg.contains("service after")).await?;
    ensure!(controller.renders().len() > renders_before);
    Ok(())
}
