//! Failed renders do not freeze the pod set (issue #45, defect 6), live: while every render
//! fails, a HAProxy pod that appears is given the last good render through its Dataplane API,
//! like the pods that were there before.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch, deployment_namespace_with, own_template};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_pod_that_appears_while_renders_fail_gets_the_last_good_render() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    ensure!(env.pods.len() >= 2, "the environment needs two pods at least");
    let (first_pods, late) = env.pods.split_at(env.pods.len() - 1);
    let late = &late[0];
    // Renders fail once there is more than one Ingress: not an object's fault, so nothing can be
    // left out to save them.
    let hint = format!("frozen-{}", std::process::id());
    let breaking = "{% if resources.ingresses.list() | length > 1 %}{{ no_such_function() }}{% endif %}\n";
    let templates = json!({"haproxyConfig": own_template(env, &hint, breaking)});
    let settings = json!({"driftPreventionInterval": "60s"});
    let (client, namespace) = deployment_namespace_with(env, "frozen", first_pods, settings, templates).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress("first")?).await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    let pods = controller.wait_all_in_sync(first_pods.len(), WITHIN).await?;
    let good = pods[0]["pushedChecksums"].clone();

    ingresses.create(&PostParams::default(), &ingress("second")?).await?;
    let deadline = Instant::now() + WITHIN;
    while !controller.log_text().contains("render failed") {
        ensure!(Instant::now() < deadline, "the render did not fail\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    env::register_pod(&client, &namespace, late).await.context("registering the late pod")?;
    let pods = controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    for pod in &pods {
        ensure!(pod["pushedChecksums"] == good, "{} does not run the last good render: {pod:#}", pod["name"]);
    }
    let config = env.dataplane(late).raw_configuration().await?.text;
    ensure!(
        config.contains("backend ingress_first") && !config.contains("backend ingress_second"),
        "{} does not hold the last good configuration:\n{config}",
        late.name
    );
    Ok(())
}

fn ingress(name: &str) -> Result<Ingress> {
    Ok(serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}}))?)
}
