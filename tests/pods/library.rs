//! The chart's default Ingress library, row by row, with real requests through every HAProxy
//! pod of the environment (one of each HAProxy version it runs): real Ingress, Service and
//! EndpointSlice objects on the real API server, the real controller rendering the chart's
//! configuration from them and deploying it to the pods through their Dataplane APIs. A row
//! passes when every pod answers as expected. EndpointSlices may not hold loopback addresses,
//! so the backends of this test listen on the environment's backend host (a network namespace
//! on 198.18.0.0/15).
//!
//! The table it prints is docs/library-conformance.md.

use crate::env;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use env::EnvPod;
use env::controller::{ControllerProcess, every_pod_runs, rendered};
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, library_namespace, service_with_endpoints, start_backends,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const BACKENDS: usize = 6;
const BACKEND_BASE_PORT: u16 = 18100;

fn tls_ingress(name: &str, rules: serde_json::Value, tls: serde_json::Value) -> Result<Ingress> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ingressClassName": "haproxy", "rules": rules, "tls": tls}
    }))?)
}

/// One answer: status, which backend (from `X-Backend`), Location, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    backend: String,
    location: String,
    body: String,
}

async fn get(http: &reqwest::Client, pod: &EnvPod, host: &str, path: &str) -> Result<Answer> {
    let response = http.get(format!("http://{}:8080{path}", pod.ip)).header("Host", host).send().await?;
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (status, backend, location) = (response.status().as_u16(), header("x-backend"), header("location"));
    Ok(Answer { status, backend, location, body: response.text().await? })
}

/// What every pod answers, as `describe` puts it (each pod's answer when they differ).
async fn on_every_pod(
    http: &reqwest::Client,
    pods: &[EnvPod],
    host: &str,
    path: &str,
    describe: fn(&Answer) -> String,
) -> String {
    env::on_every_pod(pods, |pod| async move {
        match get(http, pod, host, path).await {
            Ok(answer) => describe(&answer),
            Err(error) => format!("error: {error}"),
        }
    })
    .await
}

fn ingress(name: &str, annotations: serde_json::Value, rules: serde_json::Value) -> Result<Ingress> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ingressClassName": "haproxy", "rules": rules}
    }))?)
}

fn rule(host: Option<&str>, paths: &[(&str, &str, usize)]) -> serde_json::Value {
    let paths: Vec<_> = paths
        .iter()
        .map(|(path, kind, backend)| {
            json!({"path": path, "pathType": kind,
                   "backend": {"service": {"name": format!("svc-{backend}"), "port": {"number": 80}}}})
        })
        .collect();
    match host {
        Some(host) => json!({"host": host, "http": {"paths": paths}}),
        None => json!({"http": {"paths": paths}}),
    }
}

/// A conformance row: what was asked, what was expected, what came.
struct Row {
    case: &'static str,
    request: String,
    expected: String,
    got: String,
}

impl Row {
    fn passed(&self) -> bool {
        self.expected == self.got
    }
}

fn outcome(answer: &Answer) -> String {
    match answer.status {
        200 => format!("200 {}", answer.backend),
        301 | 302 | 307 | 308 => format!("{} {}", answer.status, answer.location),
        status => format!("{status}"),
    }
}

async fn check(
    rows: &mut Vec<Row>,
    (http, pods): (&reqwest::Client, &[EnvPod]),
    case: &'static str,
    host: &str,
    path: &str,
    expected: &str,
) {
    let got = on_every_pod(http, pods, host, path, outcome).await;
    rows.push(Row { case, request: format!("{host}{path}"), expected: expected.to_owned(), got });
}

/// The Secrets of the TLS rows: the chart's default certificate and two of the Ingresses'.
async fn tls_secrets(client: &kube::Client, namespace: &str, dir: &std::path::Path) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for (secret, subject) in [
        ("library-haptic-default-cert", "haptic-default"),
        ("shop-tls", "shop.example.com"),
        ("wild-tls", "*.wild.example.com"),
    ] {
        let (certificate, key) = env::fixtures::self_signed(dir, subject, &["rsa:2048"])?;
        let object = serde_json::from_value(json!({
            "metadata": {"name": secret}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": certificate, "tls.key": key}
        }))?;
        secrets.create(&PostParams::default(), &object).await?;
    }
    Ok(())
}

/// The rows' Ingresses, one of them of another class.
fn rows_ingresses() -> Result<Vec<Ingress>> {
    let none = json!({});
    let mut created = vec![
        tls_ingress(
            "hosts",
            json!([
                rule(Some("shop.example.com"), &[("/", "Prefix", 0)]),
                rule(Some("*.wild.example.com"), &[("/", "Prefix", 1)])
            ]),
            json!([{"hosts": ["shop.example.com"], "secretName": "shop-tls"},
                           {"hosts": ["*.wild.example.com"], "secretName": "wild-tls"}]),
        )?,
        ingress(
            "paths",
            none.clone(),
            json!([rule(
                Some("paths.example.com"),
                &[
                    ("/", "Prefix", 0),
                    ("/exact", "Exact", 2),
                    ("/foo", "Prefix", 3),
                    ("/foo/bar", "Prefix", 4),
                    ("/impl", "ImplementationSpecific", 5)
                ]
            )]),
        )?,
        ingress("hostless", none.clone(), json!([rule(None, &[("/anyhost", "Prefix", 5)])]))?,
        ingress(
            "denied",
            json!({"haptic.dev/allow-list": "10.0.0.0/8"}),
            json!([rule(Some("deny.example.com"), &[("/", "Prefix", 0)])]),
        )?,
        ingress(
            "allowed",
            json!({"haptic.dev/allow-list": "127.0.0.0/8, 192.0.2.0/24, 10.0.0.0/8"}),
            json!([rule(Some("allow.example.com"), &[("/", "Prefix", 1)])]),
        )?,
        ingress(
            "secure",
            json!({"haptic.dev/ssl-redirect": "true"}),
            json!([rule(Some("secure.example.com"), &[("/", "Prefix", 2)])]),
        )?,
        ingress(
            "slow",
            json!({"haptic.dev/timeout-server": "1s"}),
            json!([rule(Some("slow.example.com"), &[("/", "Prefix", 3)])]),
        )?,
        ingress(
            "balanced",
            json!({"haptic.dev/load-balance": "leastconn"}),
            json!([rule(Some("lb.example.com"), &[("/", "Prefix", 4)])]),
        )?,
        ingress("elsewhere", none, json!([rule(Some("other-class.example.com"), &[("/", "Prefix", 0)])]))?,
    ];
    if let Some(elsewhere) = created.last_mut() {
        elsewhere.spec.as_mut().context("spec")?.ingress_class_name = Some("nginx".into());
    }
    Ok(created)
}

/// Waits for the controller's render to satisfy `done`, then for every pod to run it.
async fn every_pod_runs_render(
    controller: &ControllerProcess,
    pods: &[EnvPod],
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<()> {
    controller.wait_for_config(what, WITHIN, done).await?;
    every_pod_runs(controller, pods.len(), &rendered(controller)?, WITHIN).await
}

/// The routing rows: hosts, paths, classes, allow-lists, redirects, timeouts, balancing.
async fn routing_rows(rows: &mut Vec<Row>, http: &reqwest::Client, pods: &[EnvPod]) {
    let on = (http, pods);
    check(rows, on, "host match", "shop.example.com", "/", "200 svc-0").await;
    check(rows, on, "host match is case-insensitive", "SHOP.example.com", "/", "200 svc-0").await;
    check(rows, on, "wildcard host, one label", "a.wild.example.com", "/", "200 svc-1").await;
    check(rows, on, "wildcard host, two labels do not match", "b.a.wild.example.com", "/", "404").await;
    check(rows, on, "wildcard host, the bare domain does not match", "wild.example.com", "/", "404").await;
    check(rows, on, "Exact path", "paths.example.com", "/exact", "200 svc-2").await;
    check(rows, on, "Exact path, trailing slash is another path", "paths.example.com", "/exact/", "200 svc-0").await;
    check(rows, on, "Prefix /foo matches /foo", "paths.example.com", "/foo", "200 svc-3").await;
    check(rows, on, "Prefix /foo matches /foo/", "paths.example.com", "/foo/", "200 svc-3").await;
    check(rows, on, "Prefix /foo matches /foo/x", "paths.example.com", "/foo/x", "200 svc-3").await;
    check(rows, on, "Prefix /foo does not match /foobar", "paths.example.com", "/foobar", "200 svc-0").await;
    check(rows, on, "longest prefix wins", "paths.example.com", "/foo/bar/baz", "200 svc-4").await;
    check(rows, on, "ImplementationSpecific (as Prefix)", "paths.example.com", "/impl/x", "200 svc-5").await;
    check(rows, on, "rule without host, any host", "anything.example.org", "/anyhost/x", "200 svc-5").await;
    check(rows, on, "unknown host", "nowhere.example.com", "/", "404").await;
    rows.push(Row {
        case: "404 error page content",
        request: "nowhere.example.com/".into(),
        expected: "No route matches this host and path.".into(),
        got: on_every_pod(http, pods, "nowhere.example.com", "/", |answer| answer.body.trim().to_owned()).await,
    });
    check(rows, on, "another class's Ingress is not served", "other-class.example.com", "/", "404").await;
    check(rows, on, "allow-list denies others", "deny.example.com", "/", "403").await;
    check(rows, on, "allow-list admits its networks", "allow.example.com", "/", "200 svc-1").await;
    check(rows, on, "ssl-redirect", "secure.example.com", "/x?y=1", "308 https://secure.example.com/x?y=1").await;
    check(rows, on, "timeout-server 1s ends a 3 s answer", "slow.example.com", "/slow?seconds=3", "504").await;
    check(rows, on, "timeout-server 1s lets a quick answer through", "slow.example.com", "/", "200 svc-3").await;
    // The balance line of the pod's own configuration, as its Dataplane API wrote it.
    let balance = env::on_every_pod(pods, |pod| async move {
        let config = std::fs::read_to_string(&pod.config_file).unwrap_or_default();
        let backend = config
            .split("backend be_")
            .find(|b| b.lines().next().is_some_and(|l| l.ends_with("_balanced")))
            .unwrap_or_default();
        backend.lines().find(|l| l.trim().starts_with("balance")).unwrap_or_default().trim().to_owned()
    })
    .await;
    rows.push(Row {
        case: "load-balance leastconn (in the backend)",
        request: "lb.example.com/".into(),
        expected: "balance leastconn".into(),
        got: balance,
    });
    check(rows, on, "load-balance leastconn still routes", "lb.example.com", "/", "200 svc-4").await;
}

/// The TLS rows: the certificate each SNI name gets, and HTTPS routed like HTTP.
async fn tls_rows(rows: &mut Vec<Row>, pods: &[EnvPod]) {
    for (case, server_name, subject) in [
        ("TLS: SNI selects the Ingress's certificate", "shop.example.com", "CN = shop.example.com"),
        ("TLS: wildcard TLS host by SNI", "a.wild.example.com", "CN = *.wild.example.com"),
        ("TLS: unknown SNI gets the default certificate", "nowhere.example.com", "CN = haptic-default"),
    ] {
        let got = env::on_every_pod(pods, |pod| async move { env::served_subject(pod, 8443, server_name) }).await;
        rows.push(Row { case, request: format!("SNI {server_name}"), expected: subject.into(), got });
    }
    for (case, host, path, expected) in [
        ("TLS: HTTPS request routed like HTTP", "shop.example.com", "/", "200 svc-0"),
        ("TLS: ssl-redirect leaves HTTPS alone", "secure.example.com", "/x", "200 svc-2"),
    ] {
        let got = env::on_every_pod(pods, |pod| async move { env::curl_https(pod, host, 8443, path) }).await;
        rows.push(Row { case, request: format!("https://{host}{path}"), expected: expected.into(), got });
    }
}

/// Waits for the Warning Event `Refused` on the Ingress `name`.
async fn refusal_of(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    controller: &ControllerProcess,
) -> Result<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let found = events.list(&ListParams::default()).await?.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Refused") && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        });
        if let Some(found) = found {
            return Ok(found);
        }
        if Instant::now() > deadline {
            bail!("no Refused Event on the Ingress {name}\n{}", controller.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A second endpoint for svc-0 (the backend `svc-0b`): within its backends' slots, so every
/// pod takes it at run time. The row checks what a pod does, not what the planner says: no
/// HAProxy master reloads, and the new server answers.
async fn scaling_row(
    (http, pods): (&reqwest::Client, &[EnvPod]),
    controller: &ControllerProcess,
    slices: &Api<EndpointSlice>,
    address: &str,
) -> Result<Row> {
    let reloads_before: Vec<u64> = pods.iter().map(EnvPod::reloads).collect::<Result<_>>()?;
    let extra = serde_json::from_value(json!({
        "metadata": {"name": "svc-0-2", "labels": {"kubernetes.io/service-name": "svc-0"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_BASE_PORT + BACKENDS as u16}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]
    }))?;
    slices.create(&PostParams::default(), &extra).await?;
    let second = format!("{address}:{}", BACKEND_BASE_PORT + BACKENDS as u16);
    every_pod_runs_render(controller, pods, "the scaled Service", |cfg| cfg.contains(&second)).await?;
    let got = env::on_every_pod(pods, |pod| {
        let before = pods.iter().position(|p| p.name == pod.name).map(|i| reloads_before[i]);
        async move {
            let reloads = pod.reloads().ok().zip(before).map(|(after, before)| after.saturating_sub(before));
            // Round robin over two servers: both answer within a few requests.
            let mut seen = BTreeSet::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while seen.len() < 2 && Instant::now() < deadline {
                if let Ok(answer) = get(http, pod, "shop.example.com", "/").await {
                    seen.insert(answer.backend);
                }
            }
            let seen: Vec<String> = seen.into_iter().collect();
            format!("reloads: {}; answered by {}", reloads.map_or("?".into(), |n| n.to_string()), seen.join(", "))
        }
    })
    .await;
    Ok(Row {
        case: "scaling within capacity: the new endpoint serves, no reload",
        request: "svc-0 1 → 2 endpoints".into(),
        expected: "reloads: 0; answered by svc-0, svc-0b".into(),
        got,
    })
}

#[tokio::test]
async fn the_default_library_routes_as_the_ingress_spec_says_on_every_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let pods = env.pods.as_slice();
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "library").await?;
    let address = backend_host_address()?;
    let work = tempfile::tempdir()?;

    // Backends svc-0..5, each a Service with an EndpointSlice on the environment's backend
    // host, and svc-0b, the second endpoint the scaling row gives svc-0.
    let mut specs: Vec<(String, u16)> =
        (0..BACKENDS).map(|i| (format!("svc-{i}"), BACKEND_BASE_PORT + i as u16)).collect();
    for (name, port) in &specs {
        service_with_endpoints(&client, &namespace, name, &address, *port).await?;
    }
    specs.push(("svc-0b".into(), BACKEND_BASE_PORT + BACKENDS as u16));
    let backends = start_backends(work.path(), &address, &specs)?;
    apply_library_config_for_pods(&client, &namespace, "library").await?;
    tls_secrets(&client, &namespace, work.path()).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    for ingress in rows_ingresses()? {
        ingresses.create(&PostParams::default(), &ingress).await?;
    }

    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    // The last Ingress of the class has a backend of its own (it has settings).
    every_pod_runs_render(&controller, pods, "the library's render", |cfg| {
        cfg.contains("backend be_") && cfg.contains("_balanced\n")
    })
    .await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut rows = Vec::new();
    routing_rows(&mut rows, &http, pods).await;
    tls_rows(&mut rows, pods).await;

    // A default backend, then a hostile Ingress: refused with an Event, never rendered, the rest served.
    let default: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "fallback"},
        "spec": {"ingressClassName": "haproxy", "defaultBackend": {"service": {"name": "svc-2", "port": {"number": 80}}}}
    }))?;
    ingresses.create(&PostParams::default(), &default).await?;
    let hostile = ingress(
        "hostile",
        json!({}),
        json!([rule(Some("shop.example.com"), &[("/x be_default", "ImplementationSpecific", 1)])]),
    )?;
    ingresses.create(&PostParams::default(), &hostile).await?;
    let refusal = refusal_of(&client, &namespace, "hostile", &controller).await?;
    every_pod_runs_render(&controller, pods, "the default backend", |cfg| cfg.contains("backend be_default")).await?;
    let on = (&http, pods);
    check(&mut rows, on, "spec.defaultBackend for an unknown host", "nowhere.example.com", "/", "200 svc-2").await;
    check(&mut rows, on, "hostile path: not routed", "shop.example.com", "/x%20be_default", "200 svc-0").await;
    check(&mut rows, on, "hostile path: the rest still served", "paths.example.com", "/foo/bar", "200 svc-4").await;
    rows.push(Row {
        case: "hostile path: Warning Event on the Ingress",
        request: "Ingress hostile".into(),
        expected: "Refused".into(),
        got: refusal.reason.clone().unwrap_or_default(),
    });
    for pod in pods {
        for entry in std::fs::read_dir(pod.dir.join("maps"))? {
            let path = entry?.path();
            let map = std::fs::read_to_string(&path).unwrap_or_default();
            ensure!(!map.contains("be_default"), "{}: the hostile path reached {}", pod.name, path.display());
        }
    }

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    rows.push(scaling_row(on, &controller, &slices, &address).await?);

    let mut table = String::from("| Case | Request | Expected | Got | |\n|---|---|---|---|---|\n");
    for row in &rows {
        let mark = if row.passed() { "pass" } else { "FAIL" };
        table.push_str(&format!("| {} | `{}` | {} | {} | {mark} |\n", row.case, row.request, row.expected, row.got));
    }
    println!("{table}");
    let _ = std::fs::write(concat!(env!("CARGO_TARGET_TMPDIR"), "/library-conformance.md"), &table);
    let failed = rows.iter().filter(|r| !r.passed()).count();
    ensure!(failed == 0, "{failed} rows failed:\n{table}\n{}", controller.log_tail());
    drop(backends);
    Ok(())
}
