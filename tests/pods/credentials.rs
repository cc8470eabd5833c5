//! A credentials rotation (#16), live: the pods' Dataplane APIs restart with a new password,
//! the Secret named by `credentialsSecretRef` follows, and the running controller deploys
//! with it at once: no restart, no pod left behind. And the other order, a rotation as the
//! chart makes it (#45, defect 3): the Secret changes first, while changes flow; pods not yet
//! rolled are asked with the previous password, pods rolled with the new one; none is ever
//! refused, none is left unconfigured.

use crate::env;

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
    let (client, namespace, controller) = controller_in_sync(env, "credentials").await?;
    let rotated = format!("rotated-{}", std::process::id());
    let outcome = rotate(env, &client, &namespace, &controller, &rotated).await;
    restore_passwords(env)?;
    outcome
}

/// A namespace of its own with a controller whose pods all run its first render.
async fn controller_in_sync(env: &Manifest, test: &str) -> Result<(kube::Client, String, ControllerProcess)> {
    let tag = format!("{test}-{}", std::process::id());
    let template = env::controller::own_template(env, &tag, "");
    let (client, namespace) = env::controller::deployment_test_namespace(env, test, &template, "60s").await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    Ok((client, namespace, controller))
}

/// Every sidecar gets the environment's password back, whatever the test did.
fn restore_passwords(env: &Manifest) -> Result<()> {
    for pod in &env.pods {
        env.rotate_dataplane_password(pod, &env.dataplane.password)?;
    }
    Ok(())
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
    let access = Access {
        credentials: Credentials::new(username, password),
        previous_credentials: None,
        tls: None,
        request_timeout: None,
    };
    Ok(access.client(Endpoint::parse(&pod.dataplane_url)?)?)
}

#[tokio::test]
async fn a_secret_rotated_before_the_pods_roll_locks_no_pod_out_while_changes_flow() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let (client, namespace, controller) = controller_in_sync(env, "rollover").await?;
    let rotated = format!("rolled-{}", std::process::id());
    let outcome = roll_over(env, &client, &namespace, &controller, &rotated).await;
    restore_passwords(env)?;
    outcome
}

async fn roll_over(
    env: &Manifest,
    client: &kube::Client,
    namespace: &str,
    controller: &ControllerProcess,
    rotated: &str,
) -> Result<()> {
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), namespace);
    let change = |i: usize| -> Result<Ingress> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": format!("change-{i}")},
            "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}
        }))?)
    };
    // Changes every 300 ms all along; the Secret rotates first, then the pods roll one by one.
    let mut made = 0;
    let next = |made: &mut usize| {
        *made += 1;
        change(*made)
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..3 {
        ingresses.create(&PostParams::default(), &next(&mut made)?).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let patch = json!({"stringData": {"dataplane_password": rotated}});
    secrets.patch("dataplane", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    for pod in &env.pods {
        for _ in 0..4 {
            ingresses.create(&PostParams::default(), &next(&mut made)?).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        env.rotate_dataplane_password(pod, rotated)?;
    }
    for _ in 0..3 {
        ingresses.create(&PostParams::default(), &next(&mut made)?).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    let last = format!("backend ingress_change-{made}");
    for pod in &env.pods {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let raw = with_password(pod, &env.dataplane.username, rotated)?.raw_configuration().await?.text;
            if raw.contains(&last) {
                break;
            }
            ensure!(std::time::Instant::now() < deadline, "{} does not run the last change ({last})", pod.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let log = controller.log_text();
    ensure!(
        !log.contains("refused the credentials"),
        "a pod refused the controller during the rotation:\n{}",
        controller.log_tail()
    );
    ensure!(log.contains("asking with the other ones of the rotation"), "no pod was asked with the other credentials");
    ensure!(!log.contains(rotated), "the password reached the controller's log");
    Ok(())
}
