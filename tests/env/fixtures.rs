//! Objects tests create over and over: the Dataplane credentials Secret, "ghost" pods —
//! Ready in Kubernetes, with an address where no Dataplane API answers — and self-signed
//! certificates.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Creates the Secret `dataplane` (keys `dataplane_username`, `dataplane_password`).
pub async fn dataplane_secret(client: &kube::Client, namespace: &str, username: &str, password: &str) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = serde_json::from_value(json!({
        "metadata": {"name": "dataplane"},
        "stringData": {"dataplane_username": username, "dataplane_password": password}
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    Ok(())
}

/// Creates a Ready pod labelled `haptic.dev/test: <label>` at `ip`, where nothing listens;
/// gives its UID.
pub async fn ghost_pod(client: &kube::Client, namespace: &str, name: &str, ip: &str, label: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"haptic.dev/test": label}},
        "spec": {"containers": [{"name": "haproxy", "image": "haproxytech/haproxy-debian"}]}
    }))?;
    let created = pods.create(&PostParams::default(), &pod).await?;
    let status = json!({"status": {"phase": "Running", "podIP": ip,
                                   "conditions": [{"type": "ContainersReady", "status": "True"},
                                                  {"type": "Ready", "status": "True"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await?;
    created.metadata.uid.context("the API server gave the pod no UID")
}

/// A self-signed certificate for `subject` (also its DNS name), valid two days, with a new key
/// made by `openssl req -newkey <key>` (`rsa:2048`, `ec -pkeyopt ec_paramgen_curve:P-256`...),
/// written in `dir`: the certificate's PEM and the key's PEM.
#[allow(dead_code)]
pub fn self_signed(dir: &Path, subject: &str, key: &[&str]) -> Result<(String, String)> {
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey"])
        .args(key)
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={subject}"))
        .arg("-addext")
        .arg(format!("subjectAltName=DNS:{subject}"))
        .arg("-keyout")
        .arg(&key_file)
        .arg("-out")
        .arg(&cert_file)
        .output()
        .context("running openssl (needed to make test certificates)")?;
    ensure!(made.status.success(), "openssl req failed: {}", String::from_utf8_lossy(&made.stderr));
    Ok((std::fs::read_to_string(cert_file)?, std::fs::read_to_string(key_file)?))
}

/// A self-signed certificate for 127.0.0.1 (the API server checks the webhook's address), as
/// `tls.crt` and `tls.key` in `dir` (the webhook's certificate directory): the certificate's PEM.
#[allow(dead_code)]
pub fn webhook_certificate(dir: &std::path::Path) -> Result<String> {
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

/// Waits up to `within` for a Warning Event `Refused` on the object `name` in `namespace`, and
/// gives its note (which names the refused field).
pub async fn refused_note(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    within: std::time::Duration,
) -> Result<String> {
    use k8s_openapi::api::events::v1::Event;
    let events: kube::Api<Event> = kube::Api::namespaced(client.clone(), namespace);
    let deadline = std::time::Instant::now() + within;
    loop {
        let found = events.list(&Default::default()).await?.items.into_iter().find(|event| {
            event.reason.as_deref() == Some("Refused")
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        });
        if let Some(event) = found {
            return Ok(event.note.unwrap_or_default());
        }
        ensure!(std::time::Instant::now() < deadline, "no Refused Event on {name} within {within:?}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}
