//! The chart's Gateway API library, case by case, with real requests through every HAProxy pod
//! of the environment (one of each HAProxy version it runs): real Gateway API objects (the CRDs
//! of sigs.k8s.io/gateway-api v1.6.3, installed by the environment) on the real API server, the
//! real controller rendering the chart's configuration, deploying it to the pods through their
//! Dataplane APIs and writing the objects' status. A row passes when every pod answers as
//! expected.
//!
//! The cases follow the Gateway API conformance suite's HTTPRoute, TLSRoute and TCPRoute tests
//! that need no kubelet; which Gateway API changes reload is tests/pods/gateway_deploy.rs. The table
//! printed is the one in docs/gateway-api.md.

use crate::env;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use env::EnvPod;
use env::controller::{ControllerProcess, every_pod_runs, rendered};
use env::gateway::{GROUP, create, gateway_class, prefix, route, status_of, to};
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backend_specs,
};
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::{Value as Json, json};

const WITHIN: Duration = Duration::from_secs(60);
const BACKEND_BASE_PORT: u16 = 18200;
const GRPC_BASE_PORT: u16 = 18220;
/// Listener ports (the chart keeps 8080, 8443 and 8404 for Ingress and health).
const HTTP: u16 = 18080;
const HTTP_ALL: u16 = 18081;
const HTTP_SELECTOR: u16 = 18082;
const HTTPS: u16 = 18443;
const PASSTHROUGH: u16 = 18444;
const TCP: u16 = 18500;

/// One answer: status, which backend (`X-Backend`), Location, the body, one response header.
#[derive(Debug, Default, Clone, PartialEq)]
struct Answer {
    status: u16,
    backend: String,
    location: String,
    body: String,
    headers: BTreeMap<String, String>,
}

/// A request to one pod.
async fn request_to(
    http: &reqwest::Client,
    pod: &EnvPod,
    method: &str,
    port: u16,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer> {
    let mut builder = http.request(method.parse()?, format!("http://{}:{port}{path}", pod.ip)).header("Host", host);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = builder.send().await?;
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (status, backend, location) = (response.status().as_u16(), header("x-backend"), header("location"));
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
        .collect();
    Ok(Answer { status, backend, location, body: response.text().await?, headers })
}

/// The same request to every pod at once, described by `describe`: the common description, or
/// each pod's (by its HAProxy version) when they differ.
#[allow(clippy::too_many_arguments)]
async fn on_every_pod(
    (http, pods): (&reqwest::Client, &[EnvPod]),
    method: &str,
    port: u16,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    describe: impl Fn(&Answer) -> String,
) -> String {
    let describe = &describe;
    env::on_every_pod(pods, |pod| async move {
        match request_to(http, pod, method, port, host, path, headers).await {
            Ok(answer) => describe(&answer),
            Err(error) => format!("error: {error}"),
        }
    })
    .await
}

fn outcome(answer: &Answer) -> String {
    match answer.status {
        200 => format!("200 {}", answer.backend),
        301..=308 => format!("{} {}", answer.status, answer.location),
        status => format!("{status}"),
    }
}

/// A line of the backend's answer: `path=...`, `host=...` or `header <name>: ...`.
fn seen(answer: &Answer, what: &str) -> String {
    let first = answer.body.lines().next().unwrap_or_default();
    match what {
        "path" | "host" => first
            .split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{what}=")))
            .unwrap_or("(none)")
            .to_owned(),
        header => answer
            .body
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("header {header}: ")))
            .collect::<Vec<_>>()
            .join(",")
            .chars()
            .take(80)
            .collect::<String>(),
    }
}

/// A request case: name, method, port, host, path, headers, expected outcome.
type Case =
    (&'static str, &'static str, u16, &'static str, &'static str, Vec<(&'static str, &'static str)>, &'static str);

/// A conformance row.
struct Row {
    case: String,
    request: String,
    expected: String,
    got: String,
}

struct Table {
    rows: Vec<Row>,
}

impl Table {
    fn push(&mut self, case: &str, request: impl Into<String>, expected: impl Into<String>, got: impl Into<String>) {
        self.rows.push(Row { case: case.into(), request: request.into(), expected: expected.into(), got: got.into() });
    }
}

/// An HTTPS request with curl to every pod (`--resolve`, so SNI and Host are the name): status and backend.
async fn curl_https(pods: &[EnvPod], host: &str, port: u16, path: &str) -> String {
    env::on_every_pod(pods, |pod| async move { env::curl_https(pod, host, port, path) }).await
}

/// The subject of the certificate every pod serves on `port` for an SNI name.
async fn served_subject(pods: &[EnvPod], port: u16, server_name: &str) -> String {
    env::on_every_pod(pods, |pod| async move { env::served_subject(pod, port, server_name) }).await
}

/// `type=status reason` of a condition in a list of conditions.
fn condition(conditions: &Json, kind: &str) -> String {
    conditions
        .as_array()
        .and_then(|list| list.iter().find(|c| c["type"] == kind))
        .map(|c| format!("{}={} {}", kind, c["status"].as_str().unwrap_or("?"), c["reason"].as_str().unwrap_or("?")))
        .unwrap_or_else(|| format!("{kind} missing"))
}

#[tokio::test]
async fn the_gateway_api_library_serves_the_conformance_cases_on_every_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let pods = env.pods.as_slice();
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "gateway").await?;
    let other = format!("{namespace}-other");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other, "labels": {"haptic-test": "allowed"}}}))?,
        )
        .await?;
    let address = backend_host_address()?;
    let work = tempfile::tempdir()?;
    let dir = work.path().to_owned();

    // Backends: svc-0..5 here, svc-x and svc-granted in the other namespace, and svc-tls, which
    // serves HTTPS with its own certificate (for passthrough).
    let (tls_certificate, tls_key) = env::fixtures::self_signed(&dir, "pass.example.com", &["rsa:2048"])?;
    let tls_pem = dir.join("pass.pem");
    std::fs::write(&tls_pem, format!("{tls_certificate}{tls_key}"))?;
    let mut specs = Vec::new();
    let mut services = Vec::new();
    let names = (0..6).map(|i| (namespace.clone(), format!("svc-{i}"))).chain([
        (other.clone(), "svc-x".to_owned()),
        (other.clone(), "svc-granted".to_owned()),
        (namespace.clone(), "svc-tls".to_owned()),
    ]);
    for (port, (ns, name)) in (BACKEND_BASE_PORT..).zip(names) {
        let suffix = if name == "svc-tls" { format!("={}", tls_pem.display()) } else { String::new() };
        specs.push(format!("{name}={address}:{port}{suffix}"));
        services.push((ns, name, port));
    }
    let _backends = start_backend_specs(&dir, &specs)?;
    // gRPC backends: HTTP/2 only, in clear text.
    let grpc_specs: Vec<String> = (0..4).map(|i| format!("g-{i}={address}:{}", GRPC_BASE_PORT + i)).collect();
    let _grpc_backends = env::h2c::start(&dir, "h2c_backends", &grpc_specs)?;
    for i in 0..4 {
        services.push((namespace.clone(), format!("g-{i}"), GRPC_BASE_PORT + i));
    }
    for (ns, name, port) in &services {
        service_with_endpoints(&client, ns, name, &address, *port).await?;
    }

    // The configuration: the chart's, with the Gateway API on for this test's controller name.
    let controller_name = format!("haptic.dev/{namespace}");
    let both = format!("{{{namespace},{other}}}");
    apply_library_config_for_pods_with(
        &client,
        &namespace,
        "gateway",
        &[
            ("gatewayAPI.enabled", "true".into()),
            ("gatewayAPI.controllerName", controller_name.clone()),
            ("gatewayAPI.gatewayClass.create", "false".into()),
            ("gatewayAPI.addresses", "{192.0.2.10}".into()),
            ("gatewayAPI.namespaces", both.clone()),
            ("config.watchedResources.services.namespaces", both.clone()),
            ("config.watchedResources.endpoints.namespaces", both.clone()),
            ("config.watchedResources.secrets.namespaces", both),
        ],
    )
    .await?;

    // Certificates: the chart's default one and the HTTPS listener's.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for (secret, subject) in [("gateway-haptic-default-cert", "haptic-default"), ("secure-tls", "secure.example.com")] {
        let (certificate, key) = env::fixtures::self_signed(&dir, subject, &["rsa:2048"])?;
        let object = serde_json::from_value(json!({
            "metadata": {"name": secret}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": certificate, "tls.key": key}
        }))?;
        secrets.create(&PostParams::default(), &object).await?;
    }

    // A certificate in the other namespace, which the Gateway may use only with a ReferenceGrant.
    let other_secrets: Api<Secret> = Api::namespaced(client.clone(), &other);
    for secret in ["cross-tls", "cross-denied-tls"] {
        let host = if secret == "cross-tls" { "cross.example.com" } else { "denied.example.com" };
        let (certificate, key) = env::fixtures::self_signed(&dir, host, &["rsa:2048"])?;
        let object = serde_json::from_value(json!({
            "metadata": {"name": secret}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": certificate, "tls.key": key}
        }))?;
        other_secrets.create(&PostParams::default(), &object).await?;
    }

    // The class, the Gateways and their listeners.
    let class = gateway_class(&client, &namespace, &controller_name).await?;
    let ns = Some(namespace.as_str());
    let listener = |name: &str, port: u16, protocol: &str, extra: Json| {
        let mut l = json!({"name": name, "port": port, "protocol": protocol});
        if let (Some(l), Some(extra)) = (l.as_object_mut(), extra.as_object()) {
            l.extend(extra.clone());
        }
        l
    };
    create(
        &client,
        "Gateway",
        ns,
        json!({"metadata": {"name": "main"}, "spec": {"gatewayClassName": class, "listeners": [
            listener("http", HTTP, "HTTP", json!({})),
            listener("foo", HTTP, "HTTP", json!({"hostname": "foo.example.com"})),
            listener("wild", HTTP, "HTTP", json!({"hostname": "*.wild.example.com"})),
            listener("all", HTTP_ALL, "HTTP", json!({"allowedRoutes": {"namespaces": {"from": "All"}}})),
            listener("selected", HTTP_SELECTOR, "HTTP", json!({"allowedRoutes": {"namespaces": {"from": "Selector",
                "selector": {"matchLabels": {"haptic-test": "allowed"}}}}})),
            listener("https", HTTPS, "HTTPS", json!({"hostname": "secure.example.com",
                "tls": {"mode": "Terminate", "certificateRefs": [{"name": "secure-tls"}]}})),
            listener("https-bad", 18445, "HTTPS", json!({"tls": {"certificateRefs": [{"name": "no-such-secret"}]}})),
            listener("https-cross", 18446, "HTTPS", json!({"hostname": "cross.example.com",
                "tls": {"certificateRefs": [{"name": "cross-tls", "namespace": other}]}})),
            listener("https-cross-denied", 18447, "HTTPS", json!({"hostname": "denied.example.com",
                "tls": {"certificateRefs": [{"name": "cross-denied-tls", "namespace": other}]}})),
            listener("passthrough", PASSTHROUGH, "TLS", json!({"tls": {"mode": "Passthrough"}})),
            listener("tcp", TCP, "TCP", json!({})),
            listener("udp", 18600, "UDP", json!({})),
            listener("reserved", 8443, "HTTP", json!({})),
            listener("on-ingress-port", 8080, "HTTP", json!({"hostname": "merged.example.com"})),
            listener("grpc-only", 18083, "HTTP", json!({"allowedRoutes": {"kinds": [{"kind": "GRPCRoute"}]}})),
            listener("bad-kinds", 18084, "HTTP", json!({"allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}})),
        ]}}),
    )
    .await?;
    create(
        &client,
        "Gateway",
        ns,
        json!({"metadata": {"name": "second"}, "spec": {"gatewayClassName": class, "listeners": [
            listener("same-port", HTTP, "HTTP", json!({})),
            listener("other-protocol", PASSTHROUGH, "HTTP", json!({})),
        ]}}),
    )
    .await?;

    // The routes.
    let main = |section: &str| json!({"name": "main", "sectionName": section});
    let header = |name: &str, value: &str| json!({"name": name, "value": value});
    let routes = [
        route(
            "matching",
            main("http"),
            &["match.example.com"],
            json!([
                {"matches": [prefix("/")], "backendRefs": to("svc-5")},
                {"matches": [{"path": {"type": "Exact", "value": "/exact"}}], "backendRefs": to("svc-0")},
                {"matches": [prefix("/prefix")], "backendRefs": to("svc-1")},
                {"matches": [prefix("/prefix/longer")], "backendRefs": to("svc-2")},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/prefix"}, "headers": [header("x-env", "canary")]}], "backendRefs": to("svc-3")},
                {"matches": [{"method": "POST"}], "backendRefs": to("svc-4")},
                {"matches": [prefix("/q")], "backendRefs": to("svc-0")},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/q"}, "queryParams": [{"name": "ver", "value": "2"}]}], "backendRefs": to("svc-3")},
                {"matches": [{"path": {"type": "RegularExpression", "value": "/re/[0-9]+"}}], "backendRefs": to("svc-1")},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/hre"}, "headers": [{"type": "RegularExpression", "name": "x-re", "value": "^v[0-9]$"}]}], "backendRefs": to("svc-2")},
                {"matches": [{"headers": [header("x-a", "1"), header("x-b", "2")]}], "backendRefs": to("svc-0")},
                {"matches": [{"headers": [header("x-a", "1")]}], "backendRefs": to("svc-1")},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/quoted"}, "headers": [header("x-q", "it's } || { always")]}], "backendRefs": to("svc-4")},
            ]),
        ),
        route("catchall", main("http"), &[], json!([{"matches": [prefix("/iso")], "backendRefs": to("svc-3")}])),
        route("foo-route", main("foo"), &[], json!([{"backendRefs": to("svc-0")}])),
        route("wild-route", main("wild"), &["a.wild.example.com", "other.com"], json!([{"backendRefs": to("svc-1")}])),
        route("wild-any", main("wild"), &[], json!([{"backendRefs": to("svc-2")}])),
        route("nomatch", main("foo"), &["bar.com"], json!([{"backendRefs": to("svc-0")}])),
        route(
            "xns-denied",
            main("http"),
            &["xns.example.com"],
            json!([{"backendRefs": [{"name": "svc-x", "namespace": other, "port": 80}]}]),
        ),
        route(
            "xns-granted",
            main("http"),
            &["xgrant.example.com"],
            json!([{"backendRefs": [{"name": "svc-granted", "namespace": other, "port": 80}]}]),
        ),
        route(
            "filters",
            main("http"),
            &["filters.example.com"],
            json!([
                {"matches": [prefix("/reqhdr")], "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                    "set": [header("x-set", "set-value")], "add": [header("x-add", "added 100%")], "remove": ["x-remove"]}}], "backendRefs": to("svc-0")},
                {"matches": [prefix("/resphdr")], "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
                    "set": [header("x-resp", "yes")], "add": [header("x-resp-add", "also")], "remove": ["content-type"]}}], "backendRefs": to("svc-0")},
                {"matches": [prefix("/redirect-https")], "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "statusCode": 301}}]},
                {"matches": [prefix("/redirect-host")], "filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "elsewhere.example.com"}}]},
                {"matches": [prefix("/redirect-full")], "filters": [{"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/new"}}}]},
                {"matches": [prefix("/redirect-prefix")], "filters": [{"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/p2"}}}]},
                {"matches": [prefix("/redirect-port")], "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "port": 8443, "statusCode": 308}}]},
                {"matches": [prefix("/rewrite-full")], "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/rewritten"}}}], "backendRefs": to("svc-1")},
                {"matches": [prefix("/rewrite-prefix")], "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}], "backendRefs": to("svc-1")},
                {"matches": [prefix("/rewrite-root")], "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}], "backendRefs": to("svc-1")},
                {"matches": [prefix("/rewrite-host")], "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "rewritten.example.com"}}], "backendRefs": to("svc-1")},
                {"matches": [prefix("/slow")], "timeouts": {"backendRequest": "1s"}, "backendRefs": to("svc-2")},
                {"matches": [prefix("/weights")], "backendRefs": [{"name": "svc-0", "port": 80, "weight": 80}, {"name": "svc-1", "port": 80, "weight": 20}]},
                {"matches": [prefix("/zero")], "backendRefs": [{"name": "svc-0", "port": 80, "weight": 0}]},
                {"matches": [prefix("/nobackend")]},
            ]),
        ),
        route("missing", main("http"), &["missing.example.com"], json!([{"backendRefs": to("svc-nonexistent")}])),
        route(
            "badkind",
            main("http"),
            &["badkind.example.com"],
            json!([{"backendRefs": [{"group": "", "kind": "ConfigMap", "name": "svc-0", "port": 80}]}]),
        ),
        route(
            "mirror",
            main("http"),
            &["mirror.example.com"],
            json!([{"filters": [{"type": "RequestMirror",
            "requestMirror": {"backendRef": {"name": "svc-1", "port": 80}}}], "backendRefs": to("svc-0")}]),
        ),
        route(
            "unsupported",
            main("http"),
            &["unsupported.example.com"],
            json!([{"filters": [{"type": "ExtensionRef", "extensionRef": {"group": "example.com", "kind": "Thing", "name": "x"}}],
                    "backendRefs": to("svc-0")}]),
        ),
        route("selector-denied", main("selected"), &[], json!([{"backendRefs": to("svc-0")}])),
        route("grpc-only-denied", main("grpc-only"), &[], json!([{"backendRefs": to("svc-0")}])),
        route("secure-route", main("https"), &[], json!([{"backendRefs": to("svc-4")}])),
        route(
            "merged",
            main("on-ingress-port"),
            &[],
            json!([{"matches": [prefix("/gw")], "backendRefs": to("svc-1")}]),
        ),
    ];
    for object in routes {
        create(&client, "HTTPRoute", ns, object).await?;
    }
    let elsewhere = Some(other.as_str());
    let cross = json!({"name": "main", "namespace": namespace, "sectionName": "all"});
    create(&client, "HTTPRoute", elsewhere, route("from-other", cross, &[], json!([{"backendRefs": to("svc-x")}])))
        .await?;
    let selected = json!({"name": "main", "namespace": namespace, "sectionName": "selected"});
    create(
        &client,
        "HTTPRoute",
        elsewhere,
        route("selected", selected, &[], json!([{"backendRefs": to("svc-granted")}])),
    )
    .await?;
    create(
        &client,
        "ReferenceGrant",
        elsewhere,
        json!({"metadata": {"name": "grant"}, "spec": {
        "from": [{"group": GROUP, "kind": "HTTPRoute", "namespace": namespace}],
        "to": [{"group": "", "kind": "Service", "name": "svc-granted"}]}}),
    )
    .await?;
    create(
        &client,
        "ReferenceGrant",
        elsewhere,
        json!({"metadata": {"name": "certificate"}, "spec": {
        "from": [{"group": GROUP, "kind": "Gateway", "namespace": namespace}],
        "to": [{"group": "", "kind": "Secret", "name": "cross-tls"}]}}),
    )
    .await?;
    create(
        &client,
        "HTTPRoute",
        ns,
        route("cross-tls", main("https-cross"), &[], json!([{"backendRefs": to("svc-3")}])),
    )
    .await?;
    let method = |service: Option<&str>, name: Option<&str>| json!({"method": {"service": service, "method": name}});
    let grpc_rules = json!([
        {"matches": [method(Some("echo.Echo"), Some("Say"))], "backendRefs": to("g-0")},
        {"matches": [method(Some("echo.Echo"), None)], "backendRefs": to("g-1")},
        {"matches": [{"method": {"type": "RegularExpression", "service": "reg\\..*", "method": "Do.*"}}], "backendRefs": to("g-2")},
        {"matches": [{"method": {"service": "echo.Echo", "method": "Say"}, "headers": [{"name": "x-grpc", "value": "yes"}]}], "backendRefs": to("g-3")},
    ]);
    create(&client, "GRPCRoute", ns, route("grpc", main("http"), &["grpc.example.com"], grpc_rules)).await?;
    create(
        &client,
        "TLSRoute",
        ns,
        route(
            "pass",
            main("passthrough"),
            &["pass.example.com"],
            json!([{"backendRefs": [{"name": "svc-tls", "port": 80}]}]),
        ),
    )
    .await?;
    create(
        &client,
        "TCPRoute",
        ns,
        json!({"metadata": {"name": "tcp"}, "spec": {"parentRefs": [main("tcp")],
        "rules": [{"backendRefs": to("svc-2")}]}}),
    )
    .await?;

    // An Ingress beside the Gateway API, served by the same HAProxy.
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("beside", "ingress.example.com", "svc-5")?).await?;

    let controller = ControllerProcess::launch_library(env, &namespace, &dir.join("journal"))?;
    controller
        .wait_for_config("the Gateway API render", WITHIN, |cfg| {
            cfg.contains("frontend gw_18500") && cfg.contains("default_backend be_tcp_")
        })
        .await?;
    every_pod_runs(&controller, pods.len(), &rendered(&controller)?, WITHIN).await?;
    let on = (&http_client()?, pods);

    let mut table = Table { rows: Vec::new() };
    let cases: Vec<Case> = vec![
        ("Exact path", "GET", HTTP, "match.example.com", "/exact", vec![], "200 svc-0"),
        ("Exact path does not match below it", "GET", HTTP, "match.example.com", "/exact/x", vec![], "200 svc-5"),
        ("PathPrefix matches its own path", "GET", HTTP, "match.example.com", "/prefix", vec![], "200 svc-1"),
        ("PathPrefix matches below it", "GET", HTTP, "match.example.com", "/prefix/x", vec![], "200 svc-1"),
        ("PathPrefix is element-wise", "GET", HTTP, "match.example.com", "/prefixx", vec![], "200 svc-5"),
        ("longest PathPrefix wins", "GET", HTTP, "match.example.com", "/prefix/longer/x", vec![], "200 svc-2"),
        (
            "a header match beats the same prefix",
            "GET",
            HTTP,
            "match.example.com",
            "/prefix/x",
            vec![("x-env", "canary")],
            "200 svc-3",
        ),
        (
            "a longer prefix beats a header match",
            "GET",
            HTTP,
            "match.example.com",
            "/prefix/longer/x",
            vec![("x-env", "canary")],
            "200 svc-2",
        ),
        ("method match", "POST", HTTP, "match.example.com", "/", vec![], "200 svc-4"),
        ("Exact path beats a method match", "POST", HTTP, "match.example.com", "/exact", vec![], "200 svc-0"),
        ("query parameter match", "GET", HTTP, "match.example.com", "/q?ver=2", vec![], "200 svc-3"),
        ("query parameter that differs", "GET", HTTP, "match.example.com", "/q?ver=3", vec![], "200 svc-0"),
        ("RegularExpression path", "GET", HTTP, "match.example.com", "/re/123", vec![], "200 svc-1"),
        ("RegularExpression path, no match", "GET", HTTP, "match.example.com", "/re/abc", vec![], "200 svc-5"),
        ("RegularExpression header", "GET", HTTP, "match.example.com", "/hre", vec![("x-re", "v1")], "200 svc-2"),
        (
            "RegularExpression header, no match",
            "GET",
            HTTP,
            "match.example.com",
            "/hre",
            vec![("x-re", "vx")],
            "200 svc-5",
        ),
        (
            "more header matches win",
            "GET",
            HTTP,
            "match.example.com",
            "/",
            vec![("x-a", "1"), ("x-b", "2")],
            "200 svc-0",
        ),
        ("fewer header matches", "GET", HTTP, "match.example.com", "/", vec![("x-a", "1")], "200 svc-1"),
        (
            "a header value with quotes and braces matches literally",
            "GET",
            HTTP,
            "match.example.com",
            "/quoted",
            vec![("x-q", "it's } || { always")],
            "200 svc-4",
        ),
        ("... and nothing else", "GET", HTTP, "match.example.com", "/quoted", vec![("x-q", "it")], "200 svc-5"),
        ("listener hostname, route without hostnames", "GET", HTTP, "foo.example.com", "/", vec![], "200 svc-0"),
        (
            "hostname intersection: exact within wildcard listener",
            "GET",
            HTTP,
            "a.wild.example.com",
            "/",
            vec![],
            "200 svc-1",
        ),
        ("wildcard listener, another label", "GET", HTTP, "b.wild.example.com", "/", vec![], "200 svc-2"),
        ("wildcard listener, two labels", "GET", HTTP, "x.y.wild.example.com", "/", vec![], "200 svc-2"),
        ("wildcard listener does not take its bare domain", "GET", HTTP, "wild.example.com", "/", vec![], "404"),
        (
            "listener isolation: a host's listener keeps its requests",
            "GET",
            HTTP,
            "foo.example.com",
            "/iso",
            vec![],
            "200 svc-0",
        ),
        ("listener without hostname takes other hosts", "GET", HTTP, "any.example.org", "/iso", vec![], "200 svc-3"),
        ("non-intersecting route hostname is not served", "GET", HTTP, "other.com", "/", vec![], "404"),
        ("cross-namespace backend without ReferenceGrant", "GET", HTTP, "xns.example.com", "/", vec![], "500"),
        (
            "cross-namespace backend with ReferenceGrant",
            "GET",
            HTTP,
            "xgrant.example.com",
            "/",
            vec![],
            "200 svc-granted",
        ),
        (
            "route from another namespace, listener allows All",
            "GET",
            HTTP_ALL,
            "any.example.com",
            "/",
            vec![],
            "200 svc-x",
        ),
        (
            "listener selects namespaces by label",
            "GET",
            HTTP_SELECTOR,
            "any.example.com",
            "/",
            vec![],
            "200 svc-granted",
        ),
        (
            "RequestRedirect scheme, 301, no port",
            "GET",
            HTTP,
            "filters.example.com",
            "/redirect-https/x",
            vec![],
            "301 https://filters.example.com/redirect-https/x",
        ),
        (
            "RequestRedirect hostname keeps the listener port",
            "GET",
            HTTP,
            "filters.example.com",
            "/redirect-host",
            vec![],
            "302 http://elsewhere.example.com:18080/redirect-host",
        ),
        (
            "RequestRedirect ReplaceFullPath",
            "GET",
            HTTP,
            "filters.example.com",
            "/redirect-full/x",
            vec![],
            "302 http://filters.example.com:18080/new",
        ),
        (
            "RequestRedirect ReplacePrefixMatch",
            "GET",
            HTTP,
            "filters.example.com",
            "/redirect-prefix/x",
            vec![],
            "302 http://filters.example.com:18080/p2/x",
        ),
        (
            "RequestRedirect scheme and port, 308",
            "GET",
            HTTP,
            "filters.example.com",
            "/redirect-port",
            vec![],
            "308 https://filters.example.com:8443/redirect-port",
        ),
        ("backend Service missing", "GET", HTTP, "missing.example.com", "/", vec![], "500"),
        ("backendRef of an invalid kind", "GET", HTTP, "badkind.example.com", "/", vec![], "500"),
        ("all weights zero", "GET", HTTP, "filters.example.com", "/zero", vec![], "500"),
        ("rule without backendRefs", "GET", HTTP, "filters.example.com", "/nobackend", vec![], "500"),
        (
            "refused route (an ExtensionRef filter) is not served",
            "GET",
            HTTP,
            "unsupported.example.com",
            "/",
            vec![],
            "404",
        ),
        (
            "RequestMirror: the route's own backend answers",
            "GET",
            HTTP,
            "mirror.example.com",
            "/mirror-probe",
            vec![],
            "200 svc-0",
        ),
        ("route of a kind the listener does not take", "GET", 18083, "any.example.com", "/", vec![], "404"),
        ("TCPRoute", "GET", TCP, "any.example.com", "/", vec![], "200 svc-2"),
        ("an Ingress served beside the Gateway API", "GET", 8080, "ingress.example.com", "/", vec![], "200 svc-5"),
        (
            "an HTTP listener on the Ingress port, its route",
            "GET",
            8080,
            "merged.example.com",
            "/gw/x",
            vec![],
            "200 svc-1",
        ),
        (
            "an HTTP listener on the Ingress port leaves the rest to Ingress routing",
            "GET",
            8080,
            "merged.example.com",
            "/other",
            vec![],
            "404",
        ),
    ];
    for (case, method, port, host, path, headers, expected) in cases {
        let got = on_every_pod(on, method, port, host, path, &headers, outcome).await;
        let shown: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let shown = if shown.is_empty() { String::new() } else { format!(" [{}]", shown.join(", ")) };
        table.push(case, format!("{method} :{port} {host}{path}{shown}"), expected, got);
    }

    // The mirror: each pod sends svc-1 a copy of /mirror-probe itself (its log shows it). Copies
    // are best effort (docs/gateway-api.md), so a pod gets five tries, each request marked with
    // the pod's name.
    let mut missing = Vec::new();
    for pod in pods {
        if !mirrored_from(on.0, pod, &dir.join("backends.log")).await {
            missing.push(pod.haproxy_version.clone());
        }
    }
    table.push(
        "RequestMirror: the mirror backend gets a copy from every pod",
        "GET mirror.example.com/mirror-probe?from=<pod>",
        "a copy from every pod",
        if missing.is_empty() {
            "a copy from every pod".to_owned()
        } else {
            format!("none from {}", missing.join(", "))
        },
    );

    // gRPC: HTTP/2 in clear text from the client (prior knowledge) and to the backends.
    // (Over HTTP/2 the host is the URL's authority, so the name resolves to the frontend.)
    for (case, path, headers, expected) in [
        ("GRPCRoute exact service and method", "/echo.Echo/Say", vec![], "200 g-0"),
        ("GRPCRoute service only", "/echo.Echo/Other", vec![], "200 g-1"),
        ("GRPCRoute RegularExpression service and method", "/reg.x/DoIt", vec![], "200 g-2"),
        ("GRPCRoute header match beats the same method", "/echo.Echo/Say", vec![("x-grpc", "yes")], "200 g-3"),
        ("GRPCRoute unknown service", "/other.Svc/Say", vec![], "404"),
    ] {
        let got = env::on_every_pod(pods, |pod| grpc_call(pod, path, &headers)).await;
        let shown = headers.iter().map(|(k, v)| format!(" [{k}: {v}]")).collect::<String>();
        table.push(case, format!("gRPC (h2c) grpc.example.com{path}{shown}"), expected, got);
    }

    // What the backend saw, and what the client got back, for the filters.
    let sent = [("x-set", "old"), ("x-remove", "gone")];
    for (case, request, header, expected) in [
        ("RequestHeaderModifier set", "GET /reqhdr [x-set: old]", "x-set", "set-value"),
        ("RequestHeaderModifier add (a % kept as is)", "GET /reqhdr", "x-add", "added 100%"),
        ("RequestHeaderModifier remove", "GET /reqhdr [x-remove: gone]", "x-remove", ""),
    ] {
        let got = on_every_pod(on, "GET", HTTP, "filters.example.com", "/reqhdr", &sent, |a| seen(a, header)).await;
        table.push(case, request, expected, got);
    }
    for (case, header, expected) in [
        ("ResponseHeaderModifier set", "x-resp", "yes"),
        ("ResponseHeaderModifier add", "x-resp-add", "also"),
        ("ResponseHeaderModifier remove", "content-type", ""),
    ] {
        let got = on_every_pod(on, "GET", HTTP, "filters.example.com", "/resphdr", &[], |answer| {
            answer.headers.get(header).cloned().unwrap_or_default()
        })
        .await;
        table.push(case, "GET /resphdr", expected, got);
    }
    for (case, path, what, expected) in [
        ("URLRewrite ReplaceFullPath", "/rewrite-full/x", "path", "/rewritten"),
        ("URLRewrite ReplacePrefixMatch", "/rewrite-prefix/x", "path", "/new/x"),
        ("URLRewrite ReplacePrefixMatch to /", "/rewrite-root/x", "path", "/x"),
        ("URLRewrite ReplacePrefixMatch to /, the prefix itself", "/rewrite-root", "path", "/"),
        ("URLRewrite hostname", "/rewrite-host", "host", "rewritten.example.com"),
    ] {
        let got = on_every_pod(on, "GET", HTTP, "filters.example.com", path, &[], |answer| seen(answer, what)).await;
        table.push(case, format!("GET {path}"), expected, got);
    }
    let got = on_every_pod(on, "GET", HTTP, "filters.example.com", "/slow?seconds=3", &[], outcome).await;
    table.push("timeouts.backendRequest 1s ends a 3 s answer", "GET /slow?seconds=3", "504", got);

    // Weights: 80/20 over 1,000 requests to each pod, within ±10% of each share.
    let got = env::on_every_pod(pods, |pod| weighted_shares(on.0, pod)).await;
    table.push("weighted backendRefs 80/20 over 1,000 requests (±10%)", "GET /weights ×1000", "within", got);

    // TLS.
    table.push(
        "HTTPS listener terminates with its certificate",
        "SNI secure.example.com",
        "CN = secure.example.com",
        served_subject(pods, HTTPS, "secure.example.com").await,
    );
    table.push(
        "HTTPS listener routes",
        "https://secure.example.com:18443/",
        "200 svc-4",
        curl_https(pods, "secure.example.com", HTTPS, "/").await,
    );
    table.push(
        "HTTPS certificate from another namespace, with ReferenceGrant",
        "SNI cross.example.com :18446",
        "CN = cross.example.com",
        served_subject(pods, 18446, "cross.example.com").await,
    );
    table.push(
        "HTTPS listener with a granted certificate routes",
        "https://cross.example.com:18446/",
        "200 svc-3",
        curl_https(pods, "cross.example.com", 18446, "/").await,
    );
    table.push(
        "TLS passthrough: the backend's own certificate",
        "SNI pass.example.com",
        "CN = pass.example.com",
        served_subject(pods, PASSTHROUGH, "pass.example.com").await,
    );
    table.push(
        "TLSRoute by SNI",
        "https://pass.example.com:18444/",
        "200 svc-tls",
        curl_https(pods, "pass.example.com", PASSTHROUGH, "/").await,
    );

    // Status, as written on the API server.
    let deadline = Instant::now() + Duration::from_secs(30);
    let gateway = loop {
        let status = status_of(&client, "Gateway", ns, "main").await?;
        if status["listeners"].as_array().is_some_and(|l| !l.is_empty()) {
            break status;
        }
        ensure!(Instant::now() < deadline, "no Gateway status within 30s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let listener_status = |name: &str| {
        gateway["listeners"].as_array().and_then(|l| l.iter().find(|l| l["name"] == name).cloned()).unwrap_or_default()
    };
    let class_status = status_of(&client, "GatewayClass", None, &class).await?;
    table.push(
        "GatewayClass Accepted",
        format!("GatewayClass {class}"),
        "Accepted=True Accepted",
        condition(&class_status["conditions"], "Accepted"),
    );
    table.push(
        "Gateway Accepted, some listeners invalid",
        "Gateway main",
        "Accepted=True ListenersNotValid",
        condition(&gateway["conditions"], "Accepted"),
    );
    table.push(
        "Gateway Programmed",
        "Gateway main",
        "Programmed=True Programmed",
        condition(&gateway["conditions"], "Programmed"),
    );
    table.push(
        "Gateway addresses (configured)",
        "Gateway main",
        "192.0.2.10",
        gateway["addresses"][0]["value"].as_str().unwrap_or("none"),
    );
    for (case, name, kind, expected) in [
        ("listener Accepted", "http", "Accepted", "Accepted=True Accepted"),
        ("listener Programmed", "http", "Programmed", "Programmed=True Programmed"),
        ("listener ResolvedRefs", "https", "ResolvedRefs", "ResolvedRefs=True ResolvedRefs"),
        ("listener with an unsupported protocol", "udp", "Accepted", "Accepted=False UnsupportedProtocol"),
        ("listener on a port the configuration keeps", "reserved", "Accepted", "Accepted=False PortUnavailable"),
        (
            "listener with a missing certificate",
            "https-bad",
            "ResolvedRefs",
            "ResolvedRefs=False InvalidCertificateRef",
        ),
        (
            "listener with a missing certificate is not programmed",
            "https-bad",
            "Programmed",
            "Programmed=False Invalid",
        ),
        (
            "listener allowing a kind its protocol cannot take",
            "bad-kinds",
            "ResolvedRefs",
            "ResolvedRefs=False InvalidRouteKinds",
        ),
    ] {
        table.push(
            case,
            format!("Gateway main, listener {name}"),
            expected,
            condition(&listener_status(name)["conditions"], kind),
        );
    }
    let attached = listener_status("http")["attachedRoutes"].as_i64().unwrap_or(-1);
    // matching, catchall, xns-denied, xns-granted, filters, missing, badkind, grpc, mirror
    // (unsupported is refused).
    table.push(
        "listener attachedRoutes (accepted routes only)",
        "Gateway main, listener http",
        "9",
        attached.to_string(),
    );
    let second = status_of(&client, "Gateway", ns, "second").await?;
    let second_listener = |name: &str| {
        second["listeners"].as_array().and_then(|l| l.iter().find(|l| l["name"] == name).cloned()).unwrap_or_default()
    };
    table.push(
        "listener on a taken port and hostname",
        "Gateway second, listener same-port",
        "Conflicted=True HostnameConflict",
        condition(&second_listener("same-port")["conditions"], "Conflicted"),
    );
    table.push(
        "listener on a port of another protocol",
        "Gateway second, listener other-protocol",
        "Conflicted=True ProtocolConflict",
        condition(&second_listener("other-protocol")["conditions"], "Conflicted"),
    );
    for (case, kind, namespace, name, condition_kind, expected) in [
        ("route Accepted", "HTTPRoute", namespace.as_str(), "matching", "Accepted", "Accepted=True Accepted"),
        ("route ResolvedRefs", "HTTPRoute", &namespace, "matching", "ResolvedRefs", "ResolvedRefs=True ResolvedRefs"),
        (
            "route hostname outside the listener's",
            "HTTPRoute",
            &namespace,
            "nomatch",
            "Accepted",
            "Accepted=False NoMatchingListenerHostname",
        ),
        (
            "cross-namespace backend without ReferenceGrant",
            "HTTPRoute",
            &namespace,
            "xns-denied",
            "ResolvedRefs",
            "ResolvedRefs=False RefNotPermitted",
        ),
        (
            "cross-namespace backend with ReferenceGrant",
            "HTTPRoute",
            &namespace,
            "xns-granted",
            "ResolvedRefs",
            "ResolvedRefs=True ResolvedRefs",
        ),
        (
            "backend Service missing",
            "HTTPRoute",
            &namespace,
            "missing",
            "ResolvedRefs",
            "ResolvedRefs=False BackendNotFound",
        ),
        (
            "backend of another kind",
            "HTTPRoute",
            &namespace,
            "badkind",
            "ResolvedRefs",
            "ResolvedRefs=False InvalidKind",
        ),
        (
            "route with an unsupported filter is refused",
            "HTTPRoute",
            &namespace,
            "unsupported",
            "Accepted",
            "Accepted=False UnsupportedValue",
        ),
        (
            "namespace not selected by the listener",
            "HTTPRoute",
            &namespace,
            "selector-denied",
            "Accepted",
            "Accepted=False NotAllowedByListeners",
        ),
        (
            "kind not allowed by the listener",
            "HTTPRoute",
            &namespace,
            "grpc-only-denied",
            "Accepted",
            "Accepted=False NotAllowedByListeners",
        ),
        (
            "route from another namespace, allowed",
            "HTTPRoute",
            &other,
            "from-other",
            "Accepted",
            "Accepted=True Accepted",
        ),
        ("TLSRoute Accepted", "TLSRoute", &namespace, "pass", "Accepted", "Accepted=True Accepted"),
        ("TCPRoute Accepted", "TCPRoute", &namespace, "tcp", "Accepted", "Accepted=True Accepted"),
        ("GRPCRoute Accepted", "GRPCRoute", &namespace, "grpc", "Accepted", "Accepted=True Accepted"),
    ] {
        let status = status_of(&client, kind, Some(namespace), name).await?;
        let parent = status["parents"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["controllerName"] == controller_name.as_str()).cloned())
            .unwrap_or_default();
        table.push(case, format!("{kind} {name}"), expected, condition(&parent["conditions"], condition_kind));
    }

    // Status is written only when it changes: a render that changes nothing for the Gateway API
    // (a Service nothing routes to) leaves every object's resourceVersion as it was.
    let version = |object: &kube::api::DynamicObject| object.metadata.resource_version.clone().unwrap_or_default();
    let watched = [("Gateway", "main"), ("HTTPRoute", "matching"), ("HTTPRoute", "filters"), ("TLSRoute", "pass")];
    let mut before = Vec::new();
    for (kind, name) in watched {
        before.push(version(&env::gateway::api(&client, kind, ns).get(name).await?));
    }
    let renders = controller.renders().len();
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "unrelated"},
            "spec": {"ports": [{"port": 80}]}}))?,
        )
        .await?;
    // The render is the same one (nothing routes to the Service): the next render's record says it ran.
    let deadline = Instant::now() + WITHIN;
    while controller.renders().len() == renders {
        ensure!(Instant::now() < deadline, "no render after a Service was added\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unchanged = env::holds_throughout(Duration::from_secs(2), "no status rewritten", || async {
        let mut after = Vec::new();
        for (kind, name) in watched {
            after.push(version(&env::gateway::api(&client, kind, ns).get(name).await?));
        }
        Ok(after == before)
    })
    .await;
    table.push(
        "status not rewritten by a render that does not change it",
        "resourceVersion of Gateway main, HTTPRoutes matching and filters, TLSRoute pass",
        "unchanged",
        match unchanged {
            Ok(()) => "unchanged".to_owned(),
            Err(error) => error.to_string(),
        },
    );

    println!("\n| Case | Request | Expected | Got |\n|---|---|---|---|");
    for row in &table.rows {
        let mark = if row.expected == row.got { "" } else { " **FAILED**" };
        println!("| {} | `{}` | {} | {}{mark} |", row.case, row.request, row.expected, row.got);
    }
    let failed: Vec<&Row> = table.rows.iter().filter(|r| r.expected != r.got).collect();
    ensure!(table.rows.len() >= 40, "only {} rows", table.rows.len());
    if !failed.is_empty() {
        let lines: Vec<String> = failed
            .iter()
            .map(|r| format!("{}: {} expected {:?}, got {:?}", r.case, r.request, r.expected, r.got))
            .collect();
        bail!(
            "{} of {} cases failed:\n{}\nHAProxy log:\n{}",
            failed.len(),
            table.rows.len(),
            lines.join("\n"),
            controller.log_tail()
        );
    }
    Ok(())
}

/// Whether `pod` mirrors a request to svc-1 within five tries of two seconds each.
async fn mirrored_from(http: &reqwest::Client, pod: &EnvPod, log: &std::path::Path) -> bool {
    for attempt in 0..5 {
        let path = format!("/mirror-probe?from={}&try={attempt}", pod.name);
        let _ = request_to(http, pod, "GET", HTTP, "mirror.example.com", &path, &[]).await;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.lines().any(|l| l.starts_with("svc-1: ") && l.contains(&format!("GET {path} "))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    false
}

/// A client that follows no redirect (the rows look at them).
fn http_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// A gRPC call to one pod: HTTP/2 in clear text from the client (prior knowledge) and to the
/// backends. (Over HTTP/2 the host is the URL's authority, so the name resolves to the pod.)
async fn grpc_call(pod: &EnvPod, path: &str, headers: &[(&str, &str)]) -> String {
    let call = async {
        let h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .resolve("grpc.example.com", format!("{}:{HTTP}", pod.ip).parse()?)
            .timeout(Duration::from_secs(10))
            .build()?;
        let mut builder = h2
            .post(format!("http://grpc.example.com:{HTTP}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let response = builder.body(vec![0u8, 0, 0, 0, 0]).send().await?;
        anyhow::Ok(match response.status().as_u16() {
            200 => {
                format!("200 {}", response.headers().get("x-backend").and_then(|v| v.to_str().ok()).unwrap_or_default())
            }
            status => status.to_string(),
        })
    };
    call.await.unwrap_or_else(|error| format!("error: {error}"))
}

/// 1,000 requests to a route weighted 80/20: "within" when each share is within ±10% of its weight.
async fn weighted_shares(http: &reqwest::Client, pod: &EnvPod) -> String {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..1000 {
        let backend = match request_to(http, pod, "GET", HTTP, "filters.example.com", "/weights", &[]).await {
            Ok(answer) => answer.backend,
            Err(error) => format!("error: {error}"),
        };
        *counts.entry(backend).or_default() += 1;
    }
    let (a, b) = (counts.get("svc-0").copied().unwrap_or(0), counts.get("svc-1").copied().unwrap_or(0));
    if (720..=880).contains(&a) && (180..=220).contains(&b) && a + b == 1000 {
        "within".to_owned()
    } else {
        format!("svc-0 {a}, svc-1 {b}, others {}", 1000 - a - b)
    }
}
