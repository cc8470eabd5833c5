//! Issue #15, live: TCP services (the chart's tcpServices ConfigMap, in the peers' form) and SSL
//! passthrough (an Ingress annotation) through every environment pod (HAProxy 2.8 and 2.6),
//! deployed through the real Dataplane API by the real `haptic` binary. The passthrough host's
//! certificate is the backend's own; other TLS hosts are still terminated by HAProxy, with the
//! client's address kept.

use crate::env;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backend_specs,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const BASE_PORT: u16 = 18540;
/// The port the TCP service listens on, on every pod.
const TCP_PORT: u16 = 18545;

/// The subject of the certificate a pod's HTTPS port presents for `server_name`.
fn served_subject(pod: &env::EnvPod, server_name: &str) -> Result<String> {
    let script = format!(
        "openssl s_client -connect {}:8443 -servername {server_name} </dev/null 2>/dev/null | openssl x509 -noout -subject",
        pod.ip
    );
    let output = Command::new("sh").arg("-c").arg(script).output()?;
    Ok(String::from_utf8(output.stdout)?.trim().trim_start_matches("subject=").to_owned())
}

/// An HTTPS request to a pod for `host` (SNI and Host): status, X-Backend and X-Forwarded-For
/// as the backend saw it.
fn https(pod: &env::EnvPod, host: &str) -> Result<String> {
    let output = Command::new("curl")
        .args(["-sk", "--max-time", "5", "--resolve"])
        .arg(format!("{host}:8443:{}", pod.ip))
        .arg(format!("https://{host}:8443/"))
        .args(["-w", "\n%{http_code} %header{x-backend}"])
        .output()
        .context("running curl")?;
    let text = String::from_utf8(output.stdout)?;
    let status = text.lines().last().unwrap_or_default().trim().to_owned();
    let forwarded = text
        .lines()
        .find_map(|line| line.strip_prefix("header x-forwarded-for: "))
        .map(|value| format!(" (forwarded for {value})"))
        .unwrap_or_default();
    Ok(format!("{status}{forwarded}"))
}

/// The same answer from every pod, or each pod's.
fn on_every_pod(env: &env::Manifest, ask: impl Fn(&env::EnvPod) -> Result<String>) -> Result<String> {
    let answers: Vec<(String, String)> =
        env.pods.iter().map(|pod| Ok((pod.haproxy_version.clone(), ask(pod)?))).collect::<Result<_>>()?;
    Ok(if answers.iter().all(|(_, a)| *a == answers[0].1) {
        answers[0].1.clone()
    } else {
        answers.iter().map(|(v, a)| format!("{v}: {a}")).collect::<Vec<_>>().join("; ")
    })
}

#[tokio::test]
async fn a_tcp_service_and_a_passthrough_host_answer_through_every_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "tcp").await?;
    let work = tempfile::tempdir()?;
    let dir = work.path();
    let address = backend_host_address()?;

    // The passthrough backend serves TLS with its own certificate; the others plain HTTP.
    let (cert, key) = env::fixtures::self_signed(dir, "pass.example", &["rsa:2048"])?;
    std::fs::write(dir.join("pass.pem"), format!("{cert}{key}"))?;
    let specs = vec![
        format!("tcpecho={address}:{}", BASE_PORT),
        format!("passtls={address}:{}={}", BASE_PORT + 1, dir.join("pass.pem").display()),
        format!("web={address}:{}", BASE_PORT + 2),
    ];
    let _backends = start_backend_specs(dir, &specs)?;
    for (i, service) in ["tcpecho", "passtls", "web"].iter().enumerate() {
        service_with_endpoints(&client, &namespace, service, &address, BASE_PORT + i as u16).await?;
    }
    // The ConfigMap the chart writes from tcpServices (release "tcp": tcp-haptic-tcp-services).
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let tcp_services = serde_json::from_value(json!({
        "metadata": {"name": "tcp-haptic-tcp-services"},
        "data": {TCP_PORT.to_string(): format!("{namespace}/tcpecho:80")}
    }))?;
    configmaps.create(&PostParams::default(), &tcp_services).await?;
    let (default_cert, default_key) = env::fixtures::self_signed(dir, "haptic-default", &["rsa:2048"])?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let default = serde_json::from_value(json!({
        "metadata": {"name": "tcp-haptic-default-cert"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": default_cert, "tls.key": default_key}
    }))?;
    secrets.create(&PostParams::default(), &default).await?;

    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("terminated", "terminated.example", "web")?).await?;
    for (name, host, annotation) in [
        ("pass", "pass.example", "haptic.dev/ssl-passthrough"),
        ("pass-ht", "pass-ht.example", "haproxy.org/ssl-passthrough"),
    ] {
        let mut ingress = ingress_to(name, host, "passtls")?;
        ingress.metadata.annotations = Some([(annotation.to_owned(), "true".to_owned())].into());
        ingresses.create(&PostParams::default(), &ingress).await?;
    }

    apply_library_config_for_pods(&client, &namespace, "tcp").await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &dir.join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    // Every pod listens on the TCP service's port once it runs the render.
    for pod in &env.pods {
        let deadline = Instant::now() + WITHIN;
        while http.get(format!("http://{}:{TCP_PORT}/", pod.ip)).send().await.is_err() {
            ensure!(Instant::now() < deadline, "{} does not listen on {TCP_PORT}", pod.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let mut rows: Vec<(&str, String, &str, String)> = Vec::new();
    let mut tcp_answers = Vec::new();
    for pod in &env.pods {
        let answer = http.get(format!("http://{}:{TCP_PORT}/through-tcp", pod.ip)).send().await?;
        let body = answer.text().await?;
        tcp_answers.push(body.lines().next().unwrap_or_default().split(" host=").next().unwrap_or_default().to_owned());
    }
    let tcp =
        if tcp_answers.iter().all(|a| *a == tcp_answers[0]) { tcp_answers[0].clone() } else { tcp_answers.join("; ") };
    rows.push((
        "TCP service (tcpServices ConfigMap)",
        format!("TCP :{TCP_PORT}, an HTTP request inside"),
        "backend=tcpecho path=/through-tcp",
        tcp,
    ));
    rows.push((
        "SSL passthrough (haptic.dev/ssl-passthrough): the backend's own certificate",
        "SNI pass.example".into(),
        "CN = pass.example",
        on_every_pod(env, |pod| served_subject(pod, "pass.example"))?,
    ));
    rows.push((
        "SSL passthrough: the backend answers over its own TLS",
        "https://pass.example/".into(),
        "200 passtls",
        on_every_pod(env, |pod| https(pod, "pass.example"))?,
    ));
    rows.push((
        "SSL passthrough (haproxy.org/ssl-passthrough)",
        "SNI pass-ht.example".into(),
        "CN = pass.example",
        on_every_pod(env, |pod| served_subject(pod, "pass-ht.example"))?,
    ));
    rows.push((
        "beside passthrough, other hosts' TLS is terminated by HAProxy",
        "SNI terminated.example".into(),
        "CN = haptic-default",
        on_every_pod(env, |pod| served_subject(pod, "terminated.example"))?,
    ));
    rows.push((
        "... and routed, the client's address kept (PROXY protocol)",
        "https://terminated.example/".into(),
        "200 web (forwarded for 127.0.0.1)",
        on_every_pod(env, |pod| https(pod, "terminated.example"))?,
    ));

    let mut table = String::from("| Case | Request | Expected | Got | |\n|---|---|---|---|---|\n");
    for (case, request, expected, got) in &rows {
        let mark = if expected == got { "pass" } else { "FAIL" };
        table.push_str(&format!("| {case} | `{request}` | {expected} | {got} | {mark} |\n"));
    }
    println!("{table}");
    let _ = std::fs::write(concat!(env!("CARGO_TARGET_TMPDIR"), "/tcp-passthrough-conformance.md"), &table);
    ensure!(
        rows.iter().all(|(_, _, expected, got)| expected == got),
        "rows failed:\n{table}\n--- haproxy.cfg ---\n{}",
        controller.file("haproxy.cfg")
    );
    Ok(())
}
