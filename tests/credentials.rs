//! A credentials rotation (#16), live: the pods' Dataplane APIs restart with a new password,
//! the Secret named by `credentialsSecretRef` follows, and the running controller deploys
//! with it at once: no restart, no pod left behind.

mod env;

use std::time::Duration;

use anyhow::{Result, ensure};
use env::controller::{ControllerProcess, Launch};
use env::{EnvPod, Manifest};
use haptic::dataplane::{Access, Credentials, Endpoint};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_rotated_credentials_secret_is_deployed_with_without_a_restart() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let tag = format!("credentials-{}", std::process::id());
    let template = env::controller::own_template(env, &tag, "");
    let (client, namespace) = env::controller::deployment_test_namespace(env, "credentials", &template, "60s").await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    let rotated = format!("rotated-{}", std::process::id());
    let outcome = rotate(env, &client, &namespace, &controller, &rotated).await;
    // Every sidecar gets the environment's password back, whatever happened.
    for pod in &env.pods {
        env.rotate_dataplane_password(pod, &env.dataplane.password)?;
    }
    outcome
}

async fn rotate(
    env: &Manifest,
    client: &kube::Client,
    namespace: &str,
    controller: &ControllerProcess,
    rotated: &str,
) -> Result<()> {
    // The sidecars take the new password first: the controller's credentials stop working.
    for pod in &env.pods {
        env.rotate_dataplane_password(pod, rotated)?;
    }
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), namespace);
    let ingress = serde_json::from_value(json!({
        "metadata": {"name": "rotation"},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}
    }))?;
    ingresses.create(&PostParams::default(), &ingress).await?;
    controller
        .wait_for_pods("every pod refusing the old credentials", env.pods.len(), Duration::from_secs(30), |pod| {
            pod["lastError"].as_str().is_some_and(|e| e.contains("refused the credentials"))
        })
        .await?;

    // The Secret follows: the running controller deploys with it.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"stringData": {"dataplane_password": rotated}});
    secrets.patch("dataplane", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(30)).await?;
    for pod in &env.pods {
        let raw = with_password(pod, &env.dataplane.username, rotated)?.raw_configuration().await?.text;
        ensure!(
            raw.contains("backend ingress_rotation"),
            "{} does not run the change made during the rotation",
            pod.name
        );
    }
    let log = controller.log_text();
    ensure!(
        log.contains("the Dataplane credentials changed"),
        "the controller did not say it took the new credentials"
    );
    ensure!(!log.contains(rotated), "the password reached the controller's log");
    Ok(())
}

fn with_password(pod: &EnvPod, username: &str, password: &str) -> Result<haptic::dataplane::DataplaneClient> {
    let access = Access { credentials: Credentials::new(username, password), tls: None, request_timeout: None };
    Ok(access.client(Endpoint::parse(&pod.dataplane_url)?)?)
}
