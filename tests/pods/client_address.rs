//! Issue #48, live: the client's real address behind a load balancer, on every HAProxy pod of
//! the environment, configured by the real controller through the Dataplane API: the PROXY
//! protocol (the chart's `haproxy.clientAddress.proxyProtocol`) names the client, and a trusted
//! proxy's X-Forwarded-For (`trustedProxies`) is believed, another's not. What the pod takes
//! for the client decides an Ingress's allow list and the X-Forwarded-For its server sees.

use crate::annotations::{Row, conformance_table};
use crate::env;

use std::time::Duration;

use anyhow::Result;
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backend_specs,
};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BASE_PORT: u16 = 18600;

/// A raw HTTP/1.1 request to the pod's HTTP port, after `preamble` (a PROXY protocol header,
/// or nothing): the status and the line of the echo starting with `seen` (or the error).
async fn raw(pod: &env::EnvPod, preamble: &str, host: &str, headers: &str, seen: &str) -> String {
    let connected =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect((pod.ip.as_str(), 8080))).await;
    let Ok(Ok(mut stream)) = connected else { return "no connection".into() };
    let request = format!("{preamble}GET / HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return "closed".into();
    }
    let mut answer = Vec::new();
    // A reset (HAProxy refusing the connection) is as much an end as a close.
    if tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await.is_err() {
        return "no answer".into();
    }
    let text = String::from_utf8_lossy(&answer);
    let Some(status) = text.lines().next().and_then(|line| line.split_whitespace().nth(1)) else {
        return "closed without an answer".into();
    };
    match text.lines().find(|line| line.starts_with(seen)) {
        Some(line) if !seen.is_empty() => format!("{status} {line}"),
        _ => status.to_owned(),
    }
}

#[tokio::test]
async fn the_client_address_comes_from_the_proxy_protocol_and_trusted_proxies_only() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "client-address").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backend_specs(work.path(), &[format!("web={address}:{BASE_PORT}")])?;
    service_with_endpoints(&client, &namespace, "web", &address, BASE_PORT).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("echo", "echo.example", "web")?).await?;
    let mut allowed = ingress_to("allowed", "allowed.example", "web")?;
    allowed.metadata.annotations =
        Some([("nginx.ingress.kubernetes.io/whitelist-source-range".to_owned(), "198.51.100.0/24".to_owned())].into());
    ingresses.create(&PostParams::default(), &allowed).await?;

    let values = [
        ("haproxy.clientAddress.proxyProtocol", "true".to_owned()),
        ("haproxy.clientAddress.trustedProxies", "{10.0.0.0/8}".to_owned()),
    ];
    apply_library_config_for_pods_with(&client, &namespace, "client-address", &values).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;

    let proxy = |source: &str| format!("PROXY TCP4 {source} 198.19.0.1 40000 8080\r\n");
    let xff = "X-Forwarded-For: 198.51.100.9\r\n";
    let checks = [
        (
            "PROXY protocol: the server sees the client it names",
            proxy("203.0.113.7"),
            "echo.example",
            "",
            "200 header x-forwarded-for: 203.0.113.7",
        ),
        ("... a connection without it is refused", String::new(), "echo.example", "", "closed without an answer"),
        (
            "... the named client is what an allow list judges (not in it)",
            proxy("203.0.113.7"),
            "allowed.example",
            "",
            "403",
        ),
        ("... a named client in it", proxy("198.51.100.20"), "allowed.example", "", "200"),
        (
            "trusted proxy (10.0.0.0/8): its X-Forwarded-For names the client",
            proxy("10.1.2.3"),
            "allowed.example",
            xff,
            "200",
        ),
        (
            "... an untrusted proxy's X-Forwarded-For is not believed",
            proxy("203.0.113.7"),
            "allowed.example",
            xff,
            "403",
        ),
    ];
    let mut rows = Vec::new();
    for (case, preamble, host, headers, expected) in checks {
        let seen = if expected.contains("x-forwarded-for") { "header x-forwarded-for" } else { "" };
        let got = env::on_every_pod(&env.pods, |pod| raw(pod, &preamble, host, headers, seen)).await;
        rows.push(Row {
            case: case.into(),
            request: format!(
                "GET {host}/ {}",
                if preamble.is_empty() { "(no PROXY header)".to_owned() } else { preamble.trim().to_owned() }
            ),
            expected: expected.into(),
            got,
        });
    }
    conformance_table(&rows, "client-address-conformance.md", &controller)
}
