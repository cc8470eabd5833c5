//! Values haptic's own checks accept and HAProxy refuses (issue #45, defect 2), live on the
//! environment's pods with the chart's library and the environment's validator: a CA bundle
//! whose PEM block holds garbage, a path rewrite whose regular expression Rust reads and HAProxy
//! does not, a certificate whose chain holds garbage. Each arrives in one Ingress among fifty;
//! the other forty-nine and an endpoint change keep being served on every pod, and the hostile
//! Ingress gets a Refused Event naming its field.

use crate::env;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch};
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, endpoint_slice, ingress_to, library_namespace,
    service_with_endpoints, start_backends,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(90);
const GOOD: usize = 49;

#[tokio::test]
async fn one_ingress_haproxy_refuses_among_fifty_is_left_out_and_the_rest_served() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let _validator = env::exclusive_validator().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "hostile-values").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("app".into(), 18600), ("moved".into(), 18601)])?;
    service_with_endpoints(&client, &namespace, "app", &address, 18600).await?;
    hostile_secrets(&client, &namespace, work.path()).await?;
    apply_library_config_for_pods_with(&client, &namespace, "haptic", &[]).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    for index in 0..GOOD {
        ingresses.create(&PostParams::default(), &ingress_to(&format!("good-{index}"), &host(index), "app")?).await?;
    }
    let launch = Launch::validated(env, &[]);
    let controller = ControllerProcess::launch(
        env,
        &namespace,
        "haptic",
        tempfile::tempdir()?,
        &work.path().join("journal"),
        &launch,
    )?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    env::every_pod_answers(env, &host(GOOD - 1), "app", Duration::from_millis(100)).await?;

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    for (round, (name, hostile, field)) in hostile_ingresses()?.into_iter().enumerate() {
        ingresses.create(&PostParams::default(), &hostile).await?;
        let note = env::fixtures::refused_note(&client, &namespace, &name, WITHIN)
            .await
            .with_context(|| format!("{name}: {}", controller.log_tail()))?;
        ensure!(note.contains("HAProxy refuses"), "{name}: the Event does not say HAProxy refused it: {note}");
        ensure!(note.contains(field), "{name}: the Event does not name {field}: {note}");
        // An endpoint change is served although the hostile Ingress is still there.
        let (backend, port) = if round % 2 == 0 { ("moved", 18601) } else { ("app", 18600) };
        let slice = endpoint_slice("app-1", "app", &address, port)?;
        slices.patch("app-1", &PatchParams::apply("hostile-values").force(), &Patch::Apply(&slice)).await?;
        for index in [0, GOOD / 2, GOOD - 1] {
            env::every_pod_answers(env, &host(index), backend, Duration::from_millis(100))
                .await
                .with_context(|| format!("after {name}: {}", controller.log_tail()))?;
        }
        controller.wait_all_in_sync(env.pods.len(), WITHIN).await.with_context(|| format!("after {name}"))?;
    }
    Ok(())
}

fn host(index: usize) -> String {
    format!("app-{index}.hostile.example.com")
}

/// The three hostile Ingresses, with the field each Event must name.
fn hostile_ingresses() -> Result<Vec<(String, Ingress, &'static str)>> {
    let with = |name: &str, annotations: serde_json::Value, tls: Option<&str>| -> Result<Ingress> {
        let host = format!("{name}.hostile.example.com");
        let mut ingress = json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "app", "port": {"number": 80}}}}]}}]}
        });
        if let Some(secret) = tls {
            ingress["spec"]["tls"] = json!([{"hosts": [host], "secretName": secret}]);
        }
        Ok(serde_json::from_value(ingress)?)
    };
    Ok(vec![
        (
            "garbage-ca".into(),
            with(
                "garbage-ca",
                json!({"haptic.dev/server-ssl": "true", "haptic.dev/server-ca-secret": "garbage-ca"}),
                None,
            )?,
            "haptic.dev/server-ca-secret",
        ),
        (
            "pcre-refuses".into(),
            // Rust's regex takes the `u` flag; PCRE knows no such flag.
            with("pcre-refuses", json!({"haproxy.org/path-rewrite": "(?u)^/api/(.*) /\\1"}), None)?,
            "haproxy.org/path-rewrite",
        ),
        ("garbage-chain".into(), with("garbage-chain", json!({}), Some("garbage-chain"))?, "spec.tls"),
    ])
}

/// A CA Secret whose one PEM block is not a certificate, and a TLS Secret whose certificate and
/// key match but whose chain holds a block that is not a certificate.
async fn hostile_secrets(client: &kube::Client, namespace: &str, dir: &std::path::Path) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let garbage = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGUgYXQgYWxs\n-----END CERTIFICATE-----\n";
    let ca: Secret = serde_json::from_value(json!({
        "metadata": {"name": "garbage-ca", "labels": {"haptic.dev/ingress-secret": "true"}}, "type": "Opaque",
        "stringData": {"ca.crt": garbage}
    }))?;
    secrets.create(&PostParams::default(), &ca).await?;
    let (certificate, key) = env::fixtures::self_signed(dir, "garbage-chain.hostile.example.com", &["rsa:2048"])?;
    let chain: Secret = serde_json::from_value(json!({
        "metadata": {"name": "garbage-chain"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": format!("{certificate}{garbage}"), "tls.key": key}
    }))?;
    secrets.create(&PostParams::default(), &chain).await?;
    Ok(())
}
