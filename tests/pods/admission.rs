//! The validating admission webhook (#16), live: the real API server calls the real binary
//! over TLS before storing an Ingress. An Ingress with a hostile value and one whose render
//! HAProxy refuses are refused with the webhook's message; a valid one is admitted; a broken
//! version of the configuration is refused; with haptic down, admission follows failurePolicy.

use crate::env;

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

/// The webhook at `address` for Ingresses and configurations of `namespace` only: the API
/// server is shared with other tests.
fn webhook_configuration(
    name: &str,
    namespace: &str,
    address: &str,
    ca: &str,
    policy: &str,
) -> Result<ValidatingWebhookConfiguration> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "validate.haptic.dev",
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": policy, "timeoutSeconds": 5,
            "clientConfig": {"url": format!("https://{address}/validate"),
                             "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "rules": [
                {"apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["ingresses"]},
                {"apiGroups": ["haptic.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["haproxytemplateconfigs"]}]
        }]
    }))?)
}

/// Registers the webhook at `address` for `namespace` (failurePolicy Ignore): the API and the
/// configuration's name, to change or delete it.
async fn register_webhook(
    client: &kube::Client,
    namespace: &str,
    address: &str,
    ca: &str,
) -> Result<(Api<ValidatingWebhookConfiguration>, String)> {
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = format!("haptic-test-{namespace}");
    webhooks.create(&PostParams::default(), &webhook_configuration(&name, namespace, address, ca, "Ignore")?).await?;
    Ok((webhooks, name))
}

/// Creates `object` until it is refused (the API server takes a moment to call a webhook it was
/// just given), and gives the refusal's message.
async fn first_refusal(ingresses: &Api<Ingress>, object: &Ingress) -> Result<String> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match ingresses.create(&PostParams::default(), object).await {
            Err(kube::Error::Api(status)) => return Ok(status.message),
            Ok(_) => {
                ingresses.delete(&name, &DeleteParams::default()).await?;
                ensure!(Instant::now() < deadline, "the webhook never judged {name}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(other) => return Err(other.into()),
        }
    }
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
    let ca = env::fixtures::webhook_certificate(work.path())?;
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

    let (webhooks, name) = register_webhook(&client, &namespace, &address, &ca).await?;
    let outcome = async {
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
        let message = first_refusal(&ingresses, &ingress("hostile", "5s\n    http-request deny")?).await?;
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

/// The chart's way inside a cluster, where the controller's image has no HAProxy: renders go to
/// the validator's Dataplane API (beside the controller, serving no traffic), its storage given
/// the render's maps and certificates, and `only_validate` asks its HAProxy.
const STORED_TEMPLATE: &str = "global\n    maxconn 100\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
frontend http\n    bind 127.0.0.1:1\n\
{% for i in resources.ingresses.list() %}{% for t in i.spec.tls or [] %}    bind 127.0.0.1:2 ssl crt {{ tls_certificate(resources.secrets.get(i.metadata.namespace, t.secretName)) }}\n{% endfor %}{% endfor %}\
    use_backend %[src,map_ip({{ map_path(\"sources.map\") }})]\n    use_backend %[req.hdr(host),map({{ map_path(\"hosts.map\") }})]\n    default_backend none\nbackend none\n\
{% for i in resources.ingresses.list() %}backend ingress_{{ i.metadata.name | bare_word }}\n    timeout server {{ (i.metadata.annotations or {})[\"test/timeout\"] | default(\"5s\") | bare_word }}\n{% endfor %}";
const HOSTS_MAP: &str = "{% for i in resources.ingresses.list() %}{% for r in i.spec.rules or [] %}{{ r.host | map_key }} ingress_{{ i.metadata.name | bare_word }}\n{% endfor %}{% endfor %}";
/// Each Ingress's clients by address (`map_ip`: HAProxy refuses an entry that is no address).
const SOURCES_MAP: &str = "{% for i in resources.ingresses.list() %}{{ (i.metadata.annotations or {})[\"test/source\"] | default(\"10.0.0.0/8\") | map_key }} ingress_{{ i.metadata.name | bare_word }}\n{% endfor %}";

fn stored_ingress(name: &str, annotations: serde_json::Value, tls: bool) -> Result<Ingress> {
    let host = format!("{name}.example");
    let mut spec = json!({"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
        "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]});
    if tls {
        spec["tls"] = json!([{"hosts": [host], "secretName": format!("{name}-tls")}]);
    }
    Ok(serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec}))?)
}

/// Every file of the pods' storage and configuration, by path: what a review must not change.
fn pod_files(env: &env::Manifest) -> Result<std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>> {
    let mut files = std::collections::BTreeMap::new();
    for pod in &env.pods {
        let dir = std::path::Path::new(&pod.dir);
        files.insert(dir.join("haproxy.cfg"), std::fs::read(dir.join("haproxy.cfg"))?);
        for storage in ["maps", "general", "ssl"] {
            for entry in std::fs::read_dir(dir.join(storage))? {
                let path = entry?.path();
                files.insert(path.clone(), std::fs::read(&path)?);
            }
        }
    }
    Ok(files)
}

#[tokio::test]
async fn the_webhook_checks_renders_through_the_validators_dataplane_api_and_writes_to_no_pod() -> Result<()> {
    let env = env::environment();
    // No other test may write to the pods while this one checks that nothing does.
    let _pods = env::exclusive_pods().await;
    let _validator = env::exclusive_validator().await;
    let spec = json!({
        "templates": {"haproxyConfig": STORED_TEMPLATE, "maps": {"hosts.map": HOSTS_MAP, "sources.map": SOURCES_MAP}},
        "dataplane": {"mapsDir": "/var/run/haproxy/maps", "certsDir": "/var/run/haproxy/ssl",
                      "generalDir": "/var/run/haproxy/general"}
    });
    let (client, namespace, configs) = env::controller::ingress_test_namespace(env, "admission-stored", spec).await?;
    let secrets = json!({"apiVersion": "v1", "kind": "Secret", "namespaces": [namespace]});
    configs
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"watchedResources": {"secrets": secrets}}})),
        )
        .await?;
    let work = tempfile::tempdir()?;
    let ca = env::fixtures::webhook_certificate(work.path())?;
    let certificates = work.path().display().to_string();
    let webhook = ["--render-only", "--webhook-address", "127.0.0.1:0", "--webhook-cert-dir", certificates.as_str()];
    let launch = Launch::validated(env, &webhook);
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let mut controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch)?;
    let address = controller.listening_address("admission webhook listening").await?;
    controller.wait_for_config("the first render", Duration::from_secs(30), |c| c.contains("backend none")).await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &namespace);
    let (certificate_pem, key_pem) = env::fixtures::self_signed(work.path(), "valid.example", &["rsa:2048"])?;
    let encode = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "valid-tls"}, "type": "kubernetes.io/tls",
                "data": {"tls.crt": encode(&certificate_pem), "tls.key": encode(&key_pem)}}))?,
        )
        .await?;

    let (webhooks, name) = register_webhook(&client, &namespace, &address, &ca).await?;
    let outcome = async {
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
        let before = pod_files(env)?;
        // HAProxy reads the map the render would have: an entry that is no address.
        let message =
            first_refusal(&ingresses, &stored_ingress("source", json!({"test/source": "banana"}), false)?).await?;
        println!("bad map entry: {message}");
        ensure!(message.contains("HAProxy refuses the render"), "{message}");
        ensure!(message.contains("sources.map") && message.contains("haproxy.cfg:"), "{message}");
        ensure!(!message.contains("/tmp/onlyvalidate"), "the API's scratch file is named as the render: {message}");
        let invalid =
            refused(&ingresses, &stored_ingress("invalid", json!({"test/timeout": "banana"}), false)?).await?;
        println!("invalid: {invalid}");
        ensure!(invalid.contains("HAProxy refuses the render") && invalid.contains("haproxy.cfg:"), "{invalid}");
        // A certificate no pod has yet, and a new host: admitted (the validator has them now).
        ingresses
            .create(&PostParams::default(), &stored_ingress("valid", json!({"test/timeout": "7s"}), true)?)
            .await?;
        controller
            .wait_for_config("the valid Ingress served", Duration::from_secs(30), |c| {
                c.contains("backend ingress_valid")
            })
            .await?;
        let stored = std::path::Path::new(&env.validator.dir);
        // Each review rewrites the validator's storage (a status write reviews the Ingress
        // again): read it once the last review's files stand, within a few seconds.
        let settled = std::time::Instant::now() + Duration::from_secs(10);
        let read_stored = |file: std::path::PathBuf| async move {
            loop {
                match std::fs::read_to_string(&file) {
                    Ok(text) => return Ok(text),
                    Err(error) if std::time::Instant::now() > settled => return Err(error),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        };
        let certificate = read_stored(stored.join("ssl").join(format!("{namespace}_valid-tls.pem")))
            .await
            .context("the certificate in the validator's storage")?;
        ensure!(certificate.contains(certificate_pem.trim()), "the validator holds the Secret's certificate");
        let hosts = read_stored(stored.join("maps/hosts.map")).await?;
        ensure!(hosts.contains("valid.example ingress_valid"), "the validator's map is the render's: {hosts}");
        ensure!(pod_files(env)? == before, "a review wrote to a pod");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    webhooks.delete(&name, &DeleteParams::default()).await?;
    ensure!(controller.terminate(Duration::from_secs(10)).await, "the controller did not stop cleanly");
    outcome
}
