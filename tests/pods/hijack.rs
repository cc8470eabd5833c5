//! Routes and certificates across namespaces (issue #45, defect 4), live on the environment's
//! pods with the chart's library: an Ingress created later, in a namespace that sorts first
//! (`aaa…` before `zzz…`), takes neither the host and path an older Ingress routes, nor the
//! certificate served for it, nor the default backend; an Ingress whose TLS names a host it does not route is refused
//! with an Event naming the field.

use crate::env;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, library_namespace, service_with_endpoints, start_backends,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const HOST: &str = "victim.hijack.example.com";

#[tokio::test]
async fn a_later_ingress_in_a_namespace_that_sorts_first_takes_neither_host_nor_certificate() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let victim_ns = library_namespace(env, &client, "zzz-hijack").await?;
    let thief_ns = env.fresh_namespace_with(&client, "aaa-hijack", &[]).await?;
    ensure!(thief_ns < victim_ns, "the thief's namespace must sort first: {thief_ns} {victim_ns}");
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("victim".into(), 18560), ("thief".into(), 18561)])?;
    service_with_endpoints(&client, &victim_ns, "victim", &address, 18560).await?;
    service_with_endpoints(&client, &thief_ns, "thief", &address, 18561).await?;
    let victim_cert = tls_secret(&client, &victim_ns, "victim-tls", work.path()).await?;
    let thief_cert = tls_secret(&client, &thief_ns, "thief-tls", work.path()).await?;
    let both = format!("{{{victim_ns},{thief_ns}}}");
    let watched = ["ingresses", "services", "endpoints", "secrets", "opaquesecrets"]
        .map(|kind| (format!("config.watchedResources.{kind}.namespaces"), both.clone()));
    let values: Vec<(&str, String)> = watched.iter().map(|(key, value)| (key.as_str(), value.clone())).collect();
    apply_library_config_for_pods_with(&client, &victim_ns, "hijack", &values).await?;

    let victims: Api<Ingress> = Api::namespaced(client.clone(), &victim_ns);
    victims.create(&PostParams::default(), &tls_ingress("victim", HOST, "victim", HOST, "victim-tls")?).await?;
    let controller = ControllerProcess::launch_library(env, &victim_ns, &work.path().join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    env::every_pod_answers(env, HOST, "victim", Duration::from_millis(100)).await?;
    for pod in &env.pods {
        ensure!(served_certificate(&pod.ip, HOST)? == victim_cert, "{}: not the victim's certificate", pod.name);
    }

    // Creation times are in whole seconds: the thief is a second younger at least.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let thieves: Api<Ingress> = Api::namespaced(client.clone(), &thief_ns);
    thieves.create(&PostParams::default(), &tls_ingress("thief", HOST, "thief", HOST, "thief-tls")?).await?;
    // A TLS host its rules do not route: refused, whatever the rest.
    let sneaky = tls_ingress("sneaky", "sneaky.hijack.example.com", "thief", HOST, "thief-tls")?;
    thieves.create(&PostParams::default(), &sneaky).await?;

    let field =
        env::fixtures::refused_note(&client, &thief_ns, "sneaky", WITHIN).await.context(controller.log_tail())?;
    ensure!(field.contains("spec.tls[0].hosts[0]"), "the Event does not name the TLS host's field: {field}");
    ensure!(!field.contains(HOST), "the Event quotes the value: {field}");
    controller.wait_for_config("the thief's backend", WITHIN, |config| config.contains("_thief_80")).await?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    for pod in &env.pods {
        let answer = get(&pod.http_address, HOST).await?;
        ensure!(answer.contains("backend=victim "), "{}: the later Ingress took the host: {answer}", pod.name);
        let served = served_certificate(&pod.ip, HOST)?;
        ensure!(served != thief_cert, "{}: the later Ingress's certificate is served for {HOST}", pod.name);
        ensure!(served == victim_cert, "{}: not the victim's certificate", pod.name);
        let elsewhere = get(&pod.http_address, "nowhere.hijack.example.com").await?;
        ensure!(
            elsewhere.contains("backend=victim "),
            "{}: the later Ingress took the default backend: {elsewhere}",
            pod.name
        );
        let sneaky = get(&pod.http_address, "sneaky.hijack.example.com").await?;
        ensure!(!sneaky.contains("backend=thief "), "{}: the refused Ingress is served: {sneaky}", pod.name);
    }
    Ok(())
}

fn tls_ingress(name: &str, host: &str, service: &str, tls_host: &str, secret: &str) -> Result<Ingress> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ingressClassName": "haproxy",
                 "defaultBackend": {"service": {"name": service, "port": {"number": 80}}},
                 "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}],
                 "tls": [{"hosts": [tls_host], "secretName": secret}]}
    }))?)
}

/// A Secret with a certificate for `HOST` of its own; its SHA-256 fingerprint.
async fn tls_secret(client: &kube::Client, namespace: &str, name: &str, dir: &std::path::Path) -> Result<String> {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir)?;
    let (certificate, key) = env::fixtures::self_signed(&dir, HOST, &["rsa:2048"])?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": certificate, "tls.key": key}
    }))?;
    Api::<Secret>::namespaced(client.clone(), namespace).create(&PostParams::default(), &secret).await?;
    fingerprint(certificate.as_bytes())
}

fn fingerprint(pem: &[u8]) -> Result<String> {
    let mut child = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running openssl x509")?;
    child.stdin.take().context("openssl's stdin")?.write_all(pem)?;
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "openssl x509: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// The fingerprint of the certificate a pod's HTTPS port serves for `sni`.
fn served_certificate(ip: &str, sni: &str) -> Result<String> {
    let output = Command::new("openssl")
        .args(["s_client", "-connect", &format!("{ip}:8443"), "-servername", sni])
        .stdin(Stdio::null())
        .output()
        .context("running openssl s_client")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----").context("no certificate served")?;
    let end = text.find("-----END CERTIFICATE-----").context("no certificate served")? + 25;
    fingerprint(text[begin..end].as_bytes())
}

async fn get(address: &str, host: &str) -> Result<String> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    Ok(http.get(format!("http://{address}/hello")).header("Host", host).send().await?.text().await?)
}
