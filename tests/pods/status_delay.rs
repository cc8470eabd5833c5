//! A slow API server does not hold renders back (issue #45, defect 5), live: the API server's
//! status and Event writes of the test's namespace are delayed 30 s (an admission webhook that
//! answers late, so the real API server itself is slow to answer them), and every change still
//! reaches every pod within 2 s, because the status is written by a task of its own.

use crate::env;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use env::controller::{ControllerProcess, Launch};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// The webhook's own timeout: the API server waits this long, then writes anyway (Ignore).
const DELAY_SECONDS: u64 = 30;
const SERVED_WITHIN: Duration = Duration::from_secs(2);

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn changes_reach_every_pod_within_two_seconds_while_status_writes_take_thirty() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let tag = format!("status-delay-{}", std::process::id());
    let template = env::controller::own_template(env, &tag, "");
    let (client, namespace) = env::controller::deployment_test_namespace(env, "status-delay", &template, "60s").await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;

    let work = tempfile::tempdir()?;
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=slow-webhook", "-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(work.path().join("tls.key"))
        .arg("-out")
        .arg(work.path().join("tls.crt"))
        .output()
        .context("running openssl")?;
    ensure!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    let port_file = work.path().join("port");
    let _webhook = Killed(
        Command::new("python3")
            .arg(env::repo_root().join("tests/env/slow_webhook.py"))
            .arg(work.path().join("tls.crt"))
            .arg(work.path().join("tls.key"))
            .arg(&port_file)
            .arg((DELAY_SECONDS + 10).to_string())
            .spawn()
            .context("starting tests/env/slow_webhook.py")?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            break port;
        }
        ensure!(Instant::now() < deadline, "the slow webhook did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ca = std::fs::read_to_string(work.path().join("tls.crt"))?;
    let name = format!("haptic-slow-{namespace}");
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "slow.haptic.dev",
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
            "timeoutSeconds": DELAY_SECONDS,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/"),
                             "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "rules": [
                {"apiGroups": ["haptic.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
                 "resources": ["haproxytemplateconfigs/status"]},
                {"apiGroups": ["events.k8s.io", ""], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["events"]}]
        }]
    }))?;
    webhooks.create(&PostParams::default(), &configuration).await?;
    let outcome = changes_served(env, &client, &namespace, &controller).await;
    webhooks.delete(&name, &DeleteParams::default()).await?;
    outcome
}

async fn changes_served(
    env: &env::Manifest,
    client: &kube::Client,
    namespace: &str,
    controller: &ControllerProcess,
) -> Result<()> {
    // The API server takes a moment to call a webhook it was just given.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), namespace);
    let mut slowest = Duration::ZERO;
    for i in 0..6 {
        let name = format!("change-{i}");
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}
        }))?;
        let started = Instant::now();
        ingresses.create(&PostParams::default(), &ingress).await?;
        let wanted = format!("backend ingress_{name}");
        for pod in &env.pods {
            loop {
                let raw = env.dataplane(pod).raw_configuration().await?.text;
                if raw.contains(&wanted) {
                    break;
                }
                ensure!(
                    started.elapsed() < Duration::from_secs(30),
                    "{} never ran {name}\n{}",
                    pod.name,
                    controller.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let took = started.elapsed();
        println!("{name}: on every pod after {took:.2?}");
        slowest = slowest.max(took);
        // Spaced so that each change meets the status writes the last one caused.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let log = controller.log_text();
    ensure!(
        log.contains("could not write the configuration's status"),
        "the status writes were not slowed (the webhook did not take):\n{}",
        controller.log_tail()
    );
    ensure!(slowest <= SERVED_WITHIN, "a change took {slowest:.2?} to reach every pod while status writes were slow");
    Ok(())
}
