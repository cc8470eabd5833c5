//! The validating admission webhook (#16), live: the real API server calls the real binary
//! over TLS before storing an Ingress. An Ingress with a hostile value and one whose render
//! HAProxy refuses are refused with the webhook's message; a valid one is admitted; a broken
//! version of the configuration is refused; with haptic down, admission follows failurePolicy.

mod env;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use env::controller::{ControllerProcess, Launch};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Each Ingress gets a backend whose server timeout is its `test/timeout` annotation.
const TEMPLATE: &str = "global\n    maxconn 100\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
frontend http\n    bind 127.0.0.1:1\n    default_backend none\nbackend none\n\
{% for i in resources.ingresses.list() %}backend ingress_{{ i.metadata.name | bare_word }}\n    timeout server {{ (i.metadata.annotations or {})[\"test/timeout\"] | default(\"5s\") | bare_word }}\n{% endfor %}";

fn ingress(name: &str, timeout: &str) -> Result<Ingress> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"test/timeout": timeout}},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}
    }))?)
}

/// A self-signed certificate for 127.0.0.1 (the API server checks the webhook's address).
fn certificate(dir: &std::path::Path) -> Result<String> {
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=haptic-webhook", "-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .output()
        .context("running openssl")?;
    ensure!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    Ok(std::fs::read_to_string(dir.join("tls.crt"))?)
}

async fn refused(ingresses: &Api<Ingress>, object: &Ingress) -> Result<String> {
    match ingresses.create(&PostParams::default(), object).await {
        Ok(_) => bail!("{:?} was admitted", object.metadata.name),
        Err(kube::Error::Api(status)) => Ok(status.message),
        Err(other) => Err(other.into()),
    }
}

#[tokio::test]
async fn the_webhook_refuses_hostile_and_invalid_objects_admits_valid_ones_and_follows_its_failure_policy() -> Result<()>
{
    let env = env::environment();
    let (client, namespace, configs) =
        env::controller::ingress_test_namespace(env, "admission", json!({"templates": {"haproxyConfig": TEMPLATE}}))
            .await?;
    let work = tempfile::tempdir()?;
    let ca = certificate(work.path())?;
    let haproxy = env::chart::haproxy_binaries()?.into_iter().next().context("no HAProxy")?;
    let launch = Launch {
        args: vec![
            "--render-only".into(),
            "--webhook-address".into(),
            "127.0.0.1:0".into(),
            "--webhook-cert-dir".into(),
            work.path().display().to_string(),
            "--validation-haproxy".into(),
            haproxy.display().to_string(),
        ],
        ..Launch::default()
    };
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let mut controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch)?;
    let address = controller.listening_address("admission webhook listening").await?;
    controller.wait_for_config("the first render", Duration::from_secs(30), |c| c.contains("backend none")).await?;

    // Only this test's namespace is judged: the API server is shared with other tests.
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = format!("haptic-test-{namespace}");
    let configuration = |policy: &str| -> Result<ValidatingWebhookConfiguration> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "validate.haptic.dev",
                "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": policy, "timeoutSeconds": 5,
                "clientConfig": {"url": format!("https://{address}/validate"),
                                 "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "rules": [
                    {"apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["ingresses"]},
                    {"apiGroups": ["haptic.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["haproxytemplateconfigs"]}]
            }]
        }))?)
    };
    webhooks.create(&PostParams::default(), &configuration("Ignore")?).await?;
    let outcome = async {
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
        // The API server takes a moment to see a new webhook configuration.
        let deadline = Instant::now() + Duration::from_secs(20);
        let hostile = ingress("hostile", "5s\n    http-request deny")?;
        let message = loop {
            match ingresses.create(&PostParams::default(), &hostile).await {
                Err(kube::Error::Api(status)) => break status.message,
                Ok(_) => {
                    ingresses.delete("hostile", &DeleteParams::default()).await?;
                    ensure!(Instant::now() < deadline, "the webhook never judged the hostile Ingress");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(other) => return Err(other.into()),
            }
        };
        ensure!(message.contains("denied the request") && message.contains("haptic would leave it out"), "{message}");
        ensure!(message.contains("test/timeout") || message.contains("annotations"), "the field is named: {message}");
        ensure!(!message.contains("http-request deny"), "the hostile value is never quoted: {message}");

        println!("hostile: {message}");
        let invalid = refused(&ingresses, &ingress("invalid", "banana")?).await?;
        println!("invalid: {invalid}");
        ensure!(invalid.contains("HAProxy refuses the render") && invalid.contains("haproxy.cfg:"), "{invalid}");
        ingresses.create(&PostParams::default(), &ingress("valid", "7s")?).await?;
        controller
            .wait_for_config("the valid Ingress served", Duration::from_secs(30), |c| {
                c.contains("backend ingress_valid")
            })
            .await?;
        // An update is judged as a creation is.
        let patch = json!({"metadata": {"annotations": {"test/timeout": "banana"}}});
        match ingresses.patch("valid", &PatchParams::default(), &Patch::Merge(&patch)).await {
            Err(kube::Error::Api(status)) if status.message.contains("HAProxy refuses the render") => {}
            other => bail!("a bad update was not refused: {other:?}"),
        }
        // A broken version of the followed configuration.
        let broken = json!({"spec": {"templates": {"haproxyConfig": "global\n{% for x in %}"}}});
        match configs.patch("test", &PatchParams::default(), &Patch::Merge(&broken)).await {
            Err(kube::Error::Api(status)) if status.message.contains("denied the request") => {}
            other => bail!("a broken configuration was not refused: {other:?}"),
        }

        // haptic down: Ignore admits unjudged; Fail refuses.
        ensure!(controller.terminate(Duration::from_secs(10)).await, "the controller did not stop cleanly");
        ingresses.create(&PostParams::default(), &ingress("unjudged", "banana")?).await?;
        let mut failing = webhooks.get(&name).await?;
        for webhook in failing.webhooks.iter_mut().flatten() {
            webhook.failure_policy = Some("Fail".into());
        }
        webhooks.replace(&name, &PostParams::default(), &failing).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match ingresses.create(&PostParams::default(), &ingress("blocked", "7s")?).await {
                Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => break,
                Ok(_) => {
                    ingresses.delete("blocked", &DeleteParams::default()).await?;
                    ensure!(Instant::now() < deadline, "failurePolicy Fail never took effect");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(other) => bail!("unexpected refusal: {other}"),
            }
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    webhooks.delete(&name, &DeleteParams::default()).await?;
    outcome
}
