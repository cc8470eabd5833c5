//! The chart's default Ingress library, row by row, with real requests through a real HAProxy:
//! real Ingress, Service and EndpointSlice objects on the real API server, the real controller
//! rendering the chart's configuration from them, and HAProxy 2.8 running exactly those files.
//!
//! The files reach this test's own HAProxy by copy and master-CLI reload, so each row checks the
//! library alone; the deployment path through the Dataplane API is covered by tests/deploy.rs,
//! tests/fleet_live.rs and tests/hostile.rs. EndpointSlices may not hold loopback addresses, so
//! the backends of this test listen on the environment's backend host (a network namespace on
//! 198.18.0.0/15).
//!
//! The table it prints is docs/library-conformance.md.

mod env;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use env::standalone::{
    apply_library_config, backend_host_address, install_render, render_into_haproxy, service_with_endpoints,
    start_backends,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const FRONTEND: &str = "127.1.3.1";
const BACKENDS: usize = 6;
const BACKEND_BASE_PORT: u16 = 18100;

/// The subject of the certificate HAProxy serves for an SNI name.
fn served_subject(server_name: &str) -> Result<String> {
    let script = format!(
        "openssl s_client -connect {FRONTEND}:8443 -servername {server_name} </dev/null 2>/dev/null | openssl x509 -noout -subject"
    );
    let output = Command::new("sh").arg("-c").arg(script).output()?;
    Ok(String::from_utf8(output.stdout)?.trim().trim_start_matches("subject=").to_owned())
}

/// An HTTPS request with curl (`--resolve`, so SNI and Host are the name): status and backend.
fn curl_https(host: &str, path: &str) -> Result<String> {
    let output = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code} %header{x-backend}", "--resolve"])
        .arg(format!("{host}:8443:{FRONTEND}"))
        .arg(format!("https://{host}:8443{path}"))
        .output()
        .context("running curl")?;
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

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

async fn get(http: &reqwest::Client, host: &str, path: &str) -> Result<Answer> {
    let response = http.get(format!("http://{FRONTEND}:8080{path}")).header("Host", host).send().await?;
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (status, backend, location) = (response.status().as_u16(), header("x-backend"), header("location"));
    Ok(Answer { status, backend, location, body: response.text().await? })
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
    http: &reqwest::Client,
    case: &'static str,
    host: &str,
    path: &str,
    expected: &str,
) -> Result<()> {
    let answer = get(http, host, path).await?;
    rows.push(Row { case, request: format!("{host}{path}"), expected: expected.to_owned(), got: outcome(&answer) });
    Ok(())
}

#[tokio::test]
async fn the_default_library_routes_as_the_ingress_spec_says_through_real_haproxy() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    env::chart::apply_chart_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "library").await?;
    let address = backend_host_address()?;
    let work = tempfile::tempdir()?;
    let dir = work.path().to_owned();

    // Backends svc-0..5, each a Service with an EndpointSlice on the environment's backend host.
    let specs: Vec<(String, u16)> = (0..BACKENDS).map(|i| (format!("svc-{i}"), BACKEND_BASE_PORT + i as u16)).collect();
    let backends = start_backends(&dir, &address, &specs)?;
    for (name, port) in &specs {
        service_with_endpoints(&client, &namespace, name, &address, *port).await?;
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    apply_library_config(&client, &namespace, "library", FRONTEND, &dir).await?;

    // TLS: the chart's default certificate Secret and two of the Ingresses'.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut pems = BTreeMap::new();
    for (secret, subject) in [
        ("library-haptic-default-cert", "haptic-default"),
        ("shop-tls", "shop.example.com"),
        ("wild-tls", "*.wild.example.com"),
    ] {
        let (certificate, key) = env::fixtures::self_signed(&dir, subject, &["rsa:2048"])?;
        pems.insert(secret.to_owned(), format!("{certificate}{key}"));
        let object = serde_json::from_value(json!({
            "metadata": {"name": secret}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": certificate, "tls.key": key}
        }))?;
        secrets.create(&PostParams::default(), &object).await?;
    }

    // The rows' Ingresses.
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let none = json!({});
    let created = [
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
        ingress("elsewhere", none.clone(), json!([rule(Some("other-class.example.com"), &[("/", "Prefix", 0)])]))?,
    ];
    for mut ingress in created {
        if ingress.metadata.name.as_deref() == Some("elsewhere") {
            ingress.spec.as_mut().context("spec")?.ingress_class_name = Some("nginx".into());
        }
        ingresses.create(&PostParams::default(), &ingress).await?;
    }

    let (controller, haproxy) =
        render_into_haproxy(env, &namespace, &dir, &pems, FRONTEND, "the library's render", |cfg| {
            // The last Ingress created has a backend of its own (it has settings).
            cfg.contains("backend be_") && cfg.contains("_balanced\n")
        })
        .await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()?;

    let mut rows = Vec::new();
    check(&mut rows, &http, "host match", "shop.example.com", "/", "200 svc-0").await?;
    check(&mut rows, &http, "host match is case-insensitive", "SHOP.example.com", "/", "200 svc-0").await?;
    check(&mut rows, &http, "wildcard host, one label", "a.wild.example.com", "/", "200 svc-1").await?;
    check(&mut rows, &http, "wildcard host, two labels do not match", "b.a.wild.example.com", "/", "404").await?;
    check(&mut rows, &http, "wildcard host, the bare domain does not match", "wild.example.com", "/", "404").await?;
    check(&mut rows, &http, "Exact path", "paths.example.com", "/exact", "200 svc-2").await?;
    check(&mut rows, &http, "Exact path, trailing slash is another path", "paths.example.com", "/exact/", "200 svc-0")
        .await?;
    check(&mut rows, &http, "Prefix /foo matches /foo", "paths.example.com", "/foo", "200 svc-3").await?;
    check(&mut rows, &http, "Prefix /foo matches /foo/", "paths.example.com", "/foo/", "200 svc-3").await?;
    check(&mut rows, &http, "Prefix /foo matches /foo/x", "paths.example.com", "/foo/x", "200 svc-3").await?;
    check(&mut rows, &http, "Prefix /foo does not match /foobar", "paths.example.com", "/foobar", "200 svc-0").await?;
    check(&mut rows, &http, "longest prefix wins", "paths.example.com", "/foo/bar/baz", "200 svc-4").await?;
    check(&mut rows, &http, "ImplementationSpecific (as Prefix)", "paths.example.com", "/impl/x", "200 svc-5").await?;
    check(&mut rows, &http, "rule without host, any host", "anything.example.org", "/anyhost/x", "200 svc-5").await?;
    check(&mut rows, &http, "unknown host", "nowhere.example.com", "/", "404").await?;
    let not_found = get(&http, "nowhere.example.com", "/").await?;
    rows.push(Row {
        case: "404 error page content",
        request: "nowhere.example.com/".into(),
        expected: "No route matches this host and path.".into(),
        got: not_found.body.trim().to_owned(),
    });
    check(&mut rows, &http, "another class's Ingress is not served", "other-class.example.com", "/", "404").await?;
    check(&mut rows, &http, "allow-list denies others", "deny.example.com", "/", "403").await?;
    check(&mut rows, &http, "allow-list admits its networks", "allow.example.com", "/", "200 svc-1").await?;
    check(&mut rows, &http, "ssl-redirect", "secure.example.com", "/x?y=1", "308 https://secure.example.com/x?y=1")
        .await?;
    check(&mut rows, &http, "timeout-server 1s ends a 3 s answer", "slow.example.com", "/slow?seconds=3", "504")
        .await?;
    check(&mut rows, &http, "timeout-server 1s lets a quick answer through", "slow.example.com", "/", "200 svc-3")
        .await?;
    let rendered = controller.file("haproxy.cfg");
    let balanced = rendered
        .split("backend be_")
        .find(|b| b.lines().next().is_some_and(|l| l.ends_with("_balanced")))
        .unwrap_or_default();
    rows.push(Row {
        case: "load-balance leastconn (in the backend)",
        request: "lb.example.com/".into(),
        expected: "balance leastconn".into(),
        got: balanced.lines().find(|l| l.trim().starts_with("balance")).unwrap_or_default().trim().to_owned(),
    });
    check(&mut rows, &http, "load-balance leastconn still routes", "lb.example.com", "/", "200 svc-4").await?;
    for (case, server_name, subject) in [
        ("TLS: SNI selects the Ingress's certificate", "shop.example.com", "CN = shop.example.com"),
        ("TLS: wildcard TLS host by SNI", "a.wild.example.com", "CN = *.wild.example.com"),
        ("TLS: unknown SNI gets the default certificate", "nowhere.example.com", "CN = haptic-default"),
    ] {
        rows.push(Row {
            case,
            request: format!("SNI {server_name}"),
            expected: subject.into(),
            got: served_subject(server_name)?,
        });
    }
    for (case, host, path, expected) in [
        ("TLS: HTTPS request routed like HTTP", "shop.example.com", "/", "200 svc-0"),
        ("TLS: ssl-redirect leaves HTTPS alone", "secure.example.com", "/x", "200 svc-2"),
    ] {
        rows.push(Row {
            case,
            request: format!("https://{host}{path}"),
            expected: expected.into(),
            got: curl_https(host, path)?,
        });
    }

    // A default backend, then a hostile Ingress: refused with an Event, never rendered, the rest served.
    let default: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "fallback"},
        "spec": {"ingressClassName": "haproxy", "defaultBackend": {"service": {"name": "svc-2", "port": {"number": 80}}}}
    }))?;
    ingresses.create(&PostParams::default(), &default).await?;
    let hostile = ingress(
        "hostile",
        none.clone(),
        json!([rule(Some("shop.example.com"), &[("/x be_default", "ImplementationSpecific", 1)])]),
    )?;
    ingresses.create(&PostParams::default(), &hostile).await?;
    controller
        .wait_for_config("the default backend", Duration::from_secs(30), |cfg| cfg.contains("backend be_default"))
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    install_render(&controller, &dir, &namespace, &pems)?;
    haproxy.reload()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(&mut rows, &http, "spec.defaultBackend for an unknown host", "nowhere.example.com", "/", "200 svc-2").await?;
    check(&mut rows, &http, "hostile path: not routed", "shop.example.com", "/x%20be_default", "200 svc-0").await?;
    check(&mut rows, &http, "hostile path: the rest still served", "paths.example.com", "/foo/bar", "200 svc-4")
        .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(15);
    let refusal = loop {
        let found = events.list(&ListParams::default()).await?.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Refused")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("hostile")
        });
        if let Some(found) = found {
            break found;
        }
        if Instant::now() > deadline {
            bail!("no Refused Event on the hostile Ingress\n{}", controller.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    rows.push(Row {
        case: "hostile path: Warning Event on the Ingress",
        request: "Ingress hostile".into(),
        expected: "Refused".into(),
        got: refusal.reason.clone().unwrap_or_default(),
    });
    let maps: BTreeMap<String, String> = std::fs::read_dir(dir.join("maps"))?
        .filter_map(|e| e.ok())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).unwrap_or_default()))
        .collect();
    ensure!(!maps.values().any(|m| m.contains("be_default")), "the hostile path reached a map: {maps:?}");

    // Scaling a Service within its backend's capacity: servers keep their names, so the change
    // is one the Runtime API can make (the planner's verdict), no reload.
    let before = controller.file("haproxy.cfg");
    let extra = serde_json::from_value(json!({
        "metadata": {"name": "svc-0-2", "labels": {"kubernetes.io/service-name": "svc-0"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_BASE_PORT + 6}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]
    }))?;
    slices.create(&PostParams::default(), &extra).await?;
    let second = format!("{address}:{}", BACKEND_BASE_PORT + 6);
    controller.wait_for_config("the scaled Service", Duration::from_secs(30), |cfg| cfg.contains(&second)).await?;
    let after = controller.file("haproxy.cfg");
    // As HAProxy 2.6 needs it: the slots' scale steps move only servers out of traffic.
    let strictest = haptic::plan::AddressChanges::OnlyOutOfTraffic;
    let verdict = match haptic::plan::runtime_difference(&before, &after, strictest) {
        Some(actions) => format!("runtime: {} server changes", actions.len()),
        None => "reload".into(),
    };
    // One change in each backend of svc-0 (one per port its routes name, however many routes
    // share it): its first free slot taken by the new endpoint (a replaced server).
    let backends_of_svc0 = after.lines().filter(|l| l.starts_with(&format!("backend be_{namespace}_svc-0_"))).count();
    ensure!(backends_of_svc0 >= 1, "no backend for svc-0:\n{after}");
    rows.push(Row {
        case: "scaling within capacity: stable server names, a runtime change",
        request: "svc-0 1 → 2 endpoints".into(),
        expected: format!("runtime: {backends_of_svc0} server changes"),
        got: verdict,
    });

    let mut table = String::from("| Case | Request | Expected | Got | |\n|---|---|---|---|---|\n");
    for row in &rows {
        let mark = if row.passed() { "pass" } else { "FAIL" };
        table.push_str(&format!("| {} | `{}` | {} | {} | {mark} |\n", row.case, row.request, row.expected, row.got));
    }
    println!("{table}");
    let _ = std::fs::write(concat!(env!("CARGO_TARGET_TMPDIR"), "/library-conformance.md"), &table);
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.passed()).collect();
    ensure!(
        failed.is_empty(),
        "{} rows failed:\n{table}\n--- haproxy.cfg ---\n{}\n{}",
        failed.len(),
        rendered,
        haproxy.log()
    );
    drop(backends);
    Ok(())
}
