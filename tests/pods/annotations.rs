//! Issue #15, live: the default library's Ingress annotations, under haptic's own names and the
//! peers' (haproxy-ingress, haproxytech), each a real request through the environment's real
//! HAProxy pods (2.8 and 2.6) running what the real `haptic` binary rendered from real objects
//! on the real API server and pushed through the real Dataplane API.
//!
//! A row passes when every pod gives the expected answer. The table it prints is the
//! annotations part of docs/library-conformance.md.

use crate::env;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, endpoint_slice, library_namespace,
    service_with_endpoints, start_backend_specs,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const BASE_PORT: u16 = 18500;

/// What a row asks: method, path, headers, body, and whether over HTTPS.
#[derive(Clone, Default)]
pub(super) struct Ask {
    pub(super) method: &'static str,
    pub(super) path: &'static str,
    pub(super) headers: Vec<(&'static str, String)>,
    pub(super) body: usize,
    pub(super) https: bool,
}

pub(super) fn get(path: &'static str) -> Ask {
    Ask { method: "GET", path, ..Ask::default() }
}

/// What a row looks at in the answer.
#[derive(Clone, Copy)]
pub(super) enum Look {
    /// `200 <backend>`, a redirect's status and Location, or the status alone.
    Outcome,
    /// The status and the value of a response header.
    Header(&'static str),
    /// The line of the backend's echo that starts with this (what the backend saw).
    Seen(&'static str),
    /// The status and the name of the cookie the answer sets.
    Cookie,
}

pub(super) struct Row {
    pub(super) case: String,
    pub(super) request: String,
    pub(super) expected: String,
    pub(super) got: String,
}

/// Sends `ask` for `host` to `pod` and describes the answer as `look` says.
pub(super) async fn probe(http: &reqwest::Client, pod: &env::EnvPod, host: &str, ask: &Ask, look: Look) -> String {
    let (scheme, port) = if ask.https { ("https", 8443) } else { ("http", 8080) };
    let url = format!("{scheme}://{host}:{port}{}", ask.path);
    let method = reqwest::Method::from_bytes(ask.method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let client = if ask.https { https_to(pod, host) } else { Ok(http.clone()) };
    let Ok(client) = client else { return "no HTTPS client".into() };
    let mut request = client.request(method, &url);
    if !ask.https {
        request = request.header("Host", host);
    }
    for (name, value) in &ask.headers {
        request = request.header(*name, value.as_str());
    }
    if ask.body > 0 {
        request = request.body(vec![b'x'; ask.body]);
    }
    let request = if ask.https {
        request
    } else {
        // Plain HTTP goes to the pod's address, whatever the host.
        match request.build() {
            Ok(mut built) => {
                let _ = built.url_mut().set_host(Some(&pod.ip));
                return describe(client.execute(built).await, look).await;
            }
            Err(error) => return error.to_string(),
        }
    };
    describe(request.send().await, look).await
}

pub(super) fn https_to(pod: &env::EnvPod, host: &str) -> reqwest::Result<reqwest::Client> {
    let address: std::net::SocketAddr = format!("{}:8443", pod.ip).parse().expect("a pod address");
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::none())
        .resolve_to_addrs(host, &[address])
        .timeout(Duration::from_secs(10))
        .build()
}

pub(super) async fn describe(answer: reqwest::Result<reqwest::Response>, look: Look) -> String {
    let response = match answer {
        Ok(response) => response,
        Err(error) => return format!("error: {error}"),
    };
    let status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    match look {
        Look::Outcome => match status {
            200 => format!("200 {}", header("x-backend")),
            301 | 302 | 303 | 307 | 308 => format!("{status} {}", header("location")),
            _ => status.to_string(),
        },
        Look::Header(name) => format!("{status} {}", header(name)),
        Look::Cookie => format!("{status} {}", header("set-cookie").split('=').next().unwrap_or_default()),
        Look::Seen(prefix) => {
            let body = response.text().await.unwrap_or_default();
            let line = body.lines().find(|line| line.starts_with(prefix)).unwrap_or("(none)").to_owned();
            format!("{status} {line}")
        }
    }
}

/// Asks every pod at once; the common answer, or each pod's when they differ.
pub(super) async fn on_every_pod(
    http: &reqwest::Client,
    env: &env::Manifest,
    host: &str,
    ask: &Ask,
    look: Look,
) -> String {
    env::on_every_pod(&env.pods, |pod| probe(http, pod, host, ask, look)).await
}

pub(super) fn ingress(
    name: &str,
    host: &str,
    service: &str,
    annotations: serde_json::Value,
    paths: &[(&str, &str)],
) -> Result<Ingress> {
    let paths: Vec<_> = paths
        .iter()
        .map(|(path, kind)| json!({"path": path, "pathType": kind, "backend": {"service": {"name": service, "port": {"number": 80}}}}))
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": paths}}]}
    }))?)
}

/// One Ingress and its rows: (case, ask, look, expected).
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) host: &'static str,
    pub(super) service: &'static str,
    pub(super) annotations: serde_json::Value,
    pub(super) paths: Vec<(&'static str, &'static str)>,
    pub(super) rows: Vec<(&'static str, Ask, Look, String)>,
    /// Whether its Ingress has a TLS section for its host.
    pub(super) tls: bool,
}

pub(super) fn case(
    name: &'static str,
    service: &'static str,
    annotations: serde_json::Value,
    rows: Vec<(&'static str, Ask, Look, &str)>,
) -> Case {
    let host = Box::leak(format!("{name}.example").into_boxed_str());
    Case {
        name,
        host,
        service,
        annotations,
        paths: vec![("/", "Prefix")],
        rows: rows.into_iter().map(|(c, a, l, e)| (c, a, l, e.to_owned())).collect(),
        tls: false,
    }
}

pub(super) fn with_header(mut ask: Ask, name: &'static str, value: &str) -> Ask {
    ask.headers.push((name, value.to_owned()));
    ask
}

pub(super) fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

pub(super) fn crypt_sha512(password: &str) -> Result<String> {
    let output = std::process::Command::new("openssl").args(["passwd", "-6", password]).output()?;
    ensure!(output.status.success(), "openssl passwd failed");
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

pub(super) async fn secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    kind: &str,
    data: serde_json::Value,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // Opaque Secrets are read only when labelled for haptic (the chart's opaquesecrets watch).
    let labels = if kind == "Opaque" { json!({"haptic.dev/ingress-secret": "true"}) } else { json!({}) };
    let object = serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "type": kind, "stringData": data}),
    )?;
    secrets.create(&PostParams::default(), &object).await?;
    Ok(())
}

pub(super) fn ha(name: &str) -> String {
    format!("haproxy-ingress.github.io/{name}")
}

pub(super) fn ht(name: &str) -> String {
    format!("haproxy.org/{name}")
}

pub(super) fn hd(name: &str) -> String {
    format!("haptic.dev/{name}")
}

pub(super) fn annotations(pairs: &[(String, &str)]) -> serde_json::Value {
    serde_json::Value::Object(pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

#[tokio::test]
async fn annotations_of_haptic_and_its_peers_answer_as_documented_on_every_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "annotations").await?;
    let work = tempfile::tempdir()?;
    let dir = work.path();
    let address = backend_host_address()?;

    // Backends: plain ones, a pair behind one Service (sticky sessions, health checks), a TLS
    // one and an HTTP/2-only (h2c) one.
    let (cert, key) = env::fixtures::self_signed(dir, "secure.backend", &["rsa:2048"])?;
    std::fs::write(dir.join("backend.pem"), format!("{cert}{key}"))?;
    let (other_ca, _) = env::fixtures::self_signed(dir, "someone-else", &["rsa:2048"])?;
    let port = |i: u16| BASE_PORT + i;
    let specs = vec![
        format!("web={address}:{}", port(0)),
        format!("pa={address}:{}", port(1)),
        format!("pb={address}:{}", port(2)),
        format!("ca={address}:{}", port(3)),
        format!("cb={address}:{}", port(4)),
        format!("secure={address}:{}={}", port(5), dir.join("backend.pem").display()),
    ];
    let _backends = start_backend_specs(dir, &specs)?;
    let _h2c = env::h2c::start(dir, "h2c_backends", &[format!("grpc={address}:{}", port(6))])?;
    service_with_endpoints(&client, &namespace, "web", &address, port(0)).await?;
    service_with_endpoints(&client, &namespace, "pair", &address, port(1)).await?;
    service_with_endpoints(&client, &namespace, "checked", &address, port(3)).await?;
    service_with_endpoints(&client, &namespace, "secure", &address, port(5)).await?;
    service_with_endpoints(&client, &namespace, "grpc", &address, port(6)).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    slices.create(&PostParams::default(), &endpoint_slice("pair-2", "pair", &address, port(2))?).await?;
    slices.create(&PostParams::default(), &endpoint_slice("checked-2", "checked", &address, port(4))?).await?;

    // Secrets: the default certificate (HTTPS for the HSTS rows), users, CAs.
    let (default_cert, default_key) = env::fixtures::self_signed(dir, "haptic-default", &["rsa:2048"])?;
    secret(
        &client,
        &namespace,
        "annotations-haptic-default-cert",
        "kubernetes.io/tls",
        json!({"tls.crt": default_cert, "tls.key": default_key}),
    )
    .await?;
    let hash = crypt_sha512("s3cret")?;
    secret(&client, &namespace, "users-htpasswd", "Opaque", json!({"auth": format!("alice:{hash}\n")})).await?;
    secret(&client, &namespace, "users-per-key", "Opaque", json!({"bob": hash})).await?;
    secret(&client, &namespace, "backend-ca", "Opaque", json!({"ca.crt": cert})).await?;
    secret(&client, &namespace, "wrong-ca", "Opaque", json!({"ca.crt": other_ca})).await?;
    // An application's own Opaque Secret, not labelled for haptic: never read, so never served.
    let unlabelled = json!({"metadata": {"name": "app-passwords"}, "type": "Opaque",
                            "stringData": {"auth": format!("alice:{hash}\n")}});
    Api::<Secret>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &serde_json::from_value(unlabelled)?)
        .await?;

    let ok = |b: &str| format!("200 {b}");
    let slow = || get("/slow?seconds=3");
    let preflight = Ask {
        method: "OPTIONS",
        path: "/",
        headers: vec![("origin", "https://app.example".into()), ("access-control-request-method", "PUT".into())],
        ..Ask::default()
    };
    let post = |body: usize| Ask { method: "POST", path: "/upload", body, ..Ask::default() };
    let https = |path: &'static str| Ask { method: "GET", path, https: true, ..Ask::default() };
    let mut cases = vec![
        // SSL redirect and HSTS.
        case(
            "redirect-haptic",
            "web",
            annotations(&[(hd("ssl-redirect"), "true")]),
            vec![(
                "ssl-redirect (haptic.dev): 308",
                get("/x?y=1"),
                Look::Outcome,
                "308 https://redirect-haptic.example/x?y=1",
            )],
        ),
        case(
            "redirect-hi",
            "web",
            annotations(&[(ha("ssl-redirect"), "true")]),
            vec![(
                "ssl-redirect (haproxy-ingress): 302",
                get("/x"),
                Look::Outcome,
                "302 https://redirect-hi.example/x",
            )],
        ),
        case(
            "redirect-ht",
            "web",
            annotations(&[(ht("ssl-redirect"), "true"), (ht("ssl-redirect-code"), "301")]),
            vec![(
                "ssl-redirect + ssl-redirect-code 301 (haproxytech)",
                get("/x"),
                Look::Outcome,
                "301 https://redirect-ht.example/x",
            )],
        ),
        case(
            "hsts",
            "web",
            annotations(&[(ha("hsts"), "true"), (ha("hsts-max-age"), "600"), (ha("hsts-include-subdomains"), "true")]),
            vec![
                (
                    "hsts, hsts-max-age, hsts-include-subdomains (haproxy-ingress), over HTTPS",
                    https("/"),
                    Look::Header("strict-transport-security"),
                    "200 max-age=600; includeSubDomains",
                ),
                ("hsts: not over plain HTTP", get("/"), Look::Header("strict-transport-security"), "200 "),
            ],
        ),
        // Backend protocols.
        case(
            "h2c-haptic",
            "grpc",
            annotations(&[(hd("backend-protocol"), "h2c")]),
            vec![("backend-protocol h2c (haptic.dev) to an HTTP/2-only server", get("/"), Look::Outcome, "200 grpc")],
        ),
        case(
            "h2-hi",
            "grpc",
            annotations(&[(ha("backend-protocol"), "grpc")]),
            vec![("backend-protocol grpc (haproxy-ingress)", get("/echo.Echo/Say"), Look::Outcome, "200 grpc")],
        ),
        case(
            "h2-ht",
            "grpc",
            annotations(&[(ht("server-proto"), "h2")]),
            vec![("server-proto h2 (haproxytech)", get("/"), Look::Outcome, "200 grpc")],
        ),
        case(
            "tls-haptic",
            "secure",
            annotations(&[(hd("server-ssl"), "true"), (hd("server-ca-secret"), "backend-ca")]),
            vec![(
                "server-ssl + server-ca-secret (haptic.dev): TLS verified to a TLS server",
                get("/"),
                Look::Outcome,
                "200 secure",
            )],
        ),
        case(
            "tls-hi",
            "secure",
            annotations(&[(ha("backend-protocol"), "h1-ssl"), (ha("secure-verify-ca-secret"), "backend-ca")]),
            vec![(
                "backend-protocol h1-ssl + secure-verify-ca-secret (haproxy-ingress)",
                get("/"),
                Look::Outcome,
                "200 secure",
            )],
        ),
        case(
            "tls-ht",
            "secure",
            annotations(&[(ht("server-ssl"), "true"), (ht("server-ca"), "wrong-ca")]),
            vec![(
                "server-ssl + server-ca (haproxytech) with a CA that did not sign it: refused",
                get("/"),
                Look::Outcome,
                "503",
            )],
        ),
        case(
            "verify-haptic",
            "secure",
            annotations(&[
                (hd("server-ssl"), "true"),
                (hd("server-ca-secret"), "backend-ca"),
                (hd("server-verify-hostname"), "secure.backend"),
            ]),
            vec![(
                "server-verify-hostname (haptic.dev): the certificate's name",
                get("/"),
                Look::Outcome,
                "200 secure",
            )],
        ),
        case(
            "misnamed-haptic",
            "secure",
            annotations(&[
                (hd("server-ssl"), "true"),
                (hd("server-ca-secret"), "backend-ca"),
                (hd("server-verify-hostname"), "other.backend"),
            ]),
            vec![("server-verify-hostname (haptic.dev): another name refused", get("/"), Look::Outcome, "503")],
        ),
        // Load balancing, timeouts.
        case(
            "balance-hi",
            "pair",
            annotations(&[(ha("balance-algorithm"), "source")]),
            vec![(
                "balance-algorithm source (haproxy-ingress): one client, one server",
                get("/"),
                Look::Outcome,
                "SAME",
            )],
        ),
        case(
            "timeout-haptic",
            "web",
            annotations(&[(hd("timeout-server"), "1s")]),
            vec![("timeout-server 1s (haptic.dev) ends a 3 s answer", slow(), Look::Outcome, "504")],
        ),
        case(
            "timeout-hi",
            "web",
            annotations(&[(ha("timeout-server"), "1s")]),
            vec![("timeout-server 1s (haproxy-ingress)", slow(), Look::Outcome, "504")],
        ),
        case(
            "timeout-ht",
            "web",
            annotations(&[(ht("timeout-server"), "1s"), (ht("timeout-connect"), "2s"), (ht("timeout-queue"), "2s")]),
            vec![
                ("timeout-server 1s, timeout-connect, timeout-queue (haproxytech)", slow(), Look::Outcome, "504"),
                ("... a quick answer still served", get("/"), Look::Outcome, &ok("web")),
            ],
        ),
        // Access control.
        case(
            "deny-haptic",
            "web",
            annotations(&[(hd("deny-list"), "0.0.0.0/0")]),
            vec![("deny-list (haptic.dev) covering the client", get("/"), Look::Outcome, "403")],
        ),
        case(
            "deny-hi",
            "web",
            annotations(&[(ha("denylist-source-range"), "192.0.2.0/24")]),
            vec![(
                "denylist-source-range (haproxy-ingress) not covering the client",
                get("/"),
                Look::Outcome,
                &ok("web"),
            )],
        ),
        case(
            "deny-ht",
            "web",
            annotations(&[(ht("deny-list"), "127.0.0.0/8, 0.0.0.0/0")]),
            vec![("deny-list (haproxytech)", get("/"), Look::Outcome, "403")],
        ),
        case(
            "allow-hi",
            "web",
            annotations(&[(ha("allowlist-source-range"), "192.0.2.0/24")]),
            vec![("allowlist-source-range (haproxy-ingress) without the client", get("/"), Look::Outcome, "403")],
        ),
        case(
            "allow-ht",
            "web",
            annotations(&[(ht("allow-list"), "0.0.0.0/0")]),
            vec![("allow-list (haproxytech) with the client", get("/"), Look::Outcome, &ok("web"))],
        ),
        case(
            "whitelist-ht",
            "web",
            annotations(&[(ht("whitelist"), "192.0.2.1")]),
            vec![("whitelist (haproxytech, deprecated name)", get("/"), Look::Outcome, "403")],
        ),
        // Basic auth.
        case(
            "auth-haptic",
            "web",
            annotations(&[
                (hd("auth-type"), "basic"),
                (hd("auth-secret"), "users-htpasswd"),
                (hd("auth-realm"), "Team"),
            ]),
            vec![
                (
                    "auth-secret (haptic.dev, htpasswd): no credentials",
                    get("/"),
                    Look::Header("www-authenticate"),
                    "401 Basic realm=\"Team\"",
                ),
                (
                    "... wrong password",
                    with_header(get("/"), "authorization", &basic("alice", "nope")),
                    Look::Outcome,
                    "401",
                ),
                (
                    "... right password",
                    with_header(get("/"), "authorization", &basic("alice", "s3cret")),
                    Look::Outcome,
                    &ok("web"),
                ),
            ],
        ),
        case(
            "auth-unlabelled",
            "web",
            annotations(&[(hd("auth-secret"), "app-passwords")]),
            vec![(
                "auth-secret naming an Opaque Secret not labelled haptic.dev/ingress-secret: Ingress refused",
                with_header(get("/"), "authorization", &basic("alice", "s3cret")),
                Look::Outcome,
                "404",
            )],
        ),
        case(
            "auth-hi",
            "web",
            annotations(&[(ha("auth-secret"), "users-htpasswd")]),
            vec![
                ("auth-secret (haproxy-ingress): no credentials", get("/"), Look::Outcome, "401"),
                (
                    "... right password",
                    with_header(get("/"), "authorization", &basic("alice", "s3cret")),
                    Look::Outcome,
                    &ok("web"),
                ),
            ],
        ),
        case(
            "auth-ht",
            "web",
            annotations(&[(ht("auth-type"), "basic-auth"), (ht("auth-secret"), "users-per-key")]),
            vec![
                (
                    "auth-type basic-auth + auth-secret (haproxytech, a key per user): no credentials",
                    get("/"),
                    Look::Outcome,
                    "401",
                ),
                (
                    "... right password",
                    with_header(get("/"), "authorization", &basic("bob", "s3cret")),
                    Look::Outcome,
                    &ok("web"),
                ),
            ],
        ),
        // CORS.
        case(
            "cors-hi",
            "web",
            annotations(&[
                (ha("cors-enable"), "true"),
                (ha("cors-allow-origin"), "https://app.example"),
                (ha("cors-allow-methods"), "GET, PUT"),
            ]),
            vec![
                (
                    "cors-enable + cors-allow-origin (haproxy-ingress): preflight",
                    preflight.clone(),
                    Look::Header("access-control-allow-origin"),
                    "204 https://app.example",
                ),
                (
                    "... preflight methods (cors-allow-methods)",
                    preflight.clone(),
                    Look::Header("access-control-allow-methods"),
                    "204 GET, PUT",
                ),
                (
                    "... a request gets the origin too",
                    get("/"),
                    Look::Header("access-control-allow-origin"),
                    "200 https://app.example",
                ),
            ],
        ),
        case(
            "cors-ht",
            "web",
            annotations(&[(ht("cors-enable"), "true"), (ht("cors-allow-credentials"), "true")]),
            vec![(
                "cors-enable + cors-allow-credentials (haproxytech)",
                get("/"),
                Look::Header("access-control-allow-credentials"),
                "200 true",
            )],
        ),
        // Headers.
        case(
            "headers-haptic",
            "web",
            annotations(&[
                (hd("request-set-header"), "X-Team: blue\nX-Env prod"),
                (hd("response-set-header"), "X-Served-By haptic"),
                (hd("request-del-header"), "x-drop"),
            ]),
            vec![
                (
                    "request-set-header (haptic.dev): what the backend sees",
                    get("/"),
                    Look::Seen("header x-team:"),
                    "200 header x-team: blue",
                ),
                ("response-set-header (haptic.dev)", get("/"), Look::Header("x-served-by"), "200 haptic"),
                (
                    "request-del-header (haptic.dev)",
                    with_header(get("/"), "x-drop", "1"),
                    Look::Seen("header x-drop:"),
                    "200 (none)",
                ),
            ],
        ),
        case(
            "headers-hi",
            "web",
            annotations(&[(ha("headers"), "X-From: haproxy-ingress")]),
            vec![(
                "headers (haproxy-ingress)",
                get("/"),
                Look::Seen("header x-from:"),
                "200 header x-from: haproxy-ingress",
            )],
        ),
        case(
            "headers-ht",
            "web",
            annotations(&[
                (ht("request-set-header"), "X-From haproxytech"),
                (ht("response-set-header"), "Cache-Control no-store"),
                (ht("set-host"), "inner.example"),
            ]),
            vec![
                (
                    "request-set-header (haproxytech)",
                    get("/"),
                    Look::Seen("header x-from:"),
                    "200 header x-from: haproxytech",
                ),
                ("response-set-header (haproxytech)", get("/"), Look::Header("cache-control"), "200 no-store"),
                (
                    "set-host (haproxytech)",
                    get("/"),
                    Look::Seen("backend=web"),
                    "200 backend=web path=/ host=inner.example",
                ),
            ],
        ),
        case(
            "headers-add",
            "web",
            annotations(&[
                (hd("request-add-header"), "X-Added one"),
                (hd("response-add-header"), "X-Answer two"),
                (hd("response-del-header"), "x-backend"),
                (hd("cors-enable"), "true"),
                (hd("cors-expose-headers"), "X-Total, X-Page"),
            ]),
            vec![
                ("request-add-header (haptic.dev)", get("/"), Look::Seen("header x-added:"), "200 header x-added: one"),
                ("response-add-header (haptic.dev)", get("/"), Look::Header("x-answer"), "200 two"),
                ("response-del-header (haptic.dev)", get("/"), Look::Header("x-backend"), "200 "),
                (
                    "cors-enable + cors-expose-headers (haptic.dev)",
                    get("/"),
                    Look::Header("access-control-expose-headers"),
                    "200 X-Total, X-Page",
                ),
            ],
        ),
        // Rewrites and redirects.
        case(
            "redirect-to-hi",
            "web",
            annotations(&[(ha("redirect-to"), "https://new.example/landing")]),
            vec![("redirect-to (haproxy-ingress)", get("/old"), Look::Outcome, "302 https://new.example/landing")],
        ),
        case(
            "redirect-host",
            "web",
            annotations(&[(hd("redirect-host"), "moved.example"), (hd("redirect-code"), "301")]),
            vec![(
                "redirect-host + redirect-code 301 (haptic.dev): path kept",
                get("/a?b=1"),
                Look::Outcome,
                "301 http://moved.example/a?b=1",
            )],
        ),
        case(
            "moved-ht",
            "web",
            annotations(&[(ht("request-redirect"), "moved.example:8081"), (ht("request-redirect-code"), "307")]),
            vec![(
                "request-redirect + request-redirect-code (haproxytech)",
                get("/a"),
                Look::Outcome,
                "307 http://moved.example:8081/a",
            )],
        ),
        case(
            "app-root",
            "web",
            annotations(&[(ha("app-root"), "/app")]),
            vec![
                ("app-root (haproxy-ingress): / goes to the app", get("/"), Look::Outcome, "302 /app"),
                ("... other paths served", get("/app"), Look::Outcome, &ok("web")),
            ],
        ),
        case(
            "path-rewrite-ht",
            "web",
            annotations(&[(ht("path-rewrite"), "^/old/(.*) /new/\\1")]),
            vec![(
                "path-rewrite (haproxytech, regex replacement)",
                get("/old/page"),
                Look::Seen("backend=web"),
                "200 backend=web path=/new/page host=path-rewrite-ht.example",
            )],
        ),
        // Body size, snippets.
        case(
            "body",
            "web",
            annotations(&[(ha("proxy-body-size"), "1k")]),
            vec![
                ("proxy-body-size 1k (haproxy-ingress): 2 KiB refused", post(2048), Look::Outcome, "413"),
                ("... 512 bytes taken", post(512), Look::Outcome, &ok("web")),
            ],
        ),
        case(
            "snippet",
            "web",
            annotations(&[(ht("backend-config-snippet"), "http-response set-header X-Snippet on")]),
            vec![(
                "backend-config-snippet (haproxytech) with snippets off: Ingress refused",
                get("/"),
                Look::Outcome,
                "404",
            )],
        ),
    ];
    let mut rewrite = case(
        "rewrite-hi",
        "web",
        annotations(&[(ha("rewrite-target"), "/v2")]),
        vec![
            (
                "rewrite-target (haproxy-ingress): the matched prefix replaced",
                get("/api/users?x=1"),
                Look::Seen("backend=web"),
                "200 backend=web path=/v2/users host=rewrite-hi.example",
            ),
            (
                "... the longest path of the Ingress wins",
                get("/api/v1/users"),
                Look::Seen("backend=web"),
                "200 backend=web path=/v2/users host=rewrite-hi.example",
            ),
            (
                "... the prefix alone becomes the target",
                get("/api"),
                Look::Seen("backend=web"),
                "200 backend=web path=/v2 host=rewrite-hi.example",
            ),
        ],
    );
    rewrite.paths = vec![("/api", "Prefix"), ("/api/v1", "Prefix")];
    cases.push(rewrite);
    // Whole Ingresses as each peer's documentation writes them: many annotations at once.
    let mut haproxy_ingress_set = case(
        "set-hi",
        "web",
        annotations(&[
            (ha("balance-algorithm"), "roundrobin"),
            (ha("timeout-server"), "30s"),
            (ha("timeout-connect"), "5s"),
            (ha("timeout-queue"), "10s"),
            (ha("timeout-tunnel"), "1h"),
            (ha("hsts"), "true"),
            (ha("hsts-max-age"), "3600"),
            (ha("hsts-include-subdomains"), "true"),
            (ha("hsts-preload"), "true"),
            (ha("allowlist-source-range"), "127.0.0.0/8, 10.0.0.0/8"),
            (ha("cors-enable"), "true"),
            (ha("cors-allow-origin"), "https://app.example"),
            (ha("cors-allow-methods"), "GET, POST"),
            (ha("cors-allow-headers"), "X-Custom"),
            (ha("cors-max-age"), "600"),
            (ha("headers"), "X-Via: haproxy-ingress"),
            (ha("proxy-body-size"), "2k"),
            (ha("limit-rps"), "1000"),
            (ha("health-check-uri"), "/healthz"),
            (ha("health-check-interval"), "2s"),
            (ha("app-root"), "/app"),
            (ha("rewrite-target"), "/"),
            (ha("affinity"), "cookie"),
            (ha("session-cookie-name"), "HI"),
        ]),
        vec![
            ("haproxy-ingress set (24 annotations): app-root", get("/"), Look::Outcome, "302 /app"),
            (
                "... rewrite-target with headers",
                get("/api/users"),
                Look::Seen("backend=web"),
                "200 backend=web path=/users host=set-hi.example",
            ),
            ("... headers", get("/api/users"), Look::Seen("header x-via:"), "200 header x-via: haproxy-ingress"),
            ("... CORS preflight", preflight.clone(), Look::Header("access-control-allow-headers"), "204 X-Custom"),
            ("... proxy-body-size", post(3000), Look::Outcome, "413"),
            (
                "... HSTS over HTTPS",
                Ask { method: "GET", path: "/app", https: true, ..Ask::default() },
                Look::Header("strict-transport-security"),
                "200 max-age=3600; includeSubDomains; preload",
            ),
        ],
    );
    haproxy_ingress_set.paths = vec![("/", "Prefix"), ("/api", "Prefix")];
    cases.push(haproxy_ingress_set);
    cases.push(case(
        "set-ht",
        "web",
        annotations(&[
            (ht("load-balance"), "leastconn"),
            (ht("timeout-server"), "30s"),
            (ht("timeout-connect"), "4s"),
            (ht("timeout-queue"), "5s"),
            (ht("timeout-tunnel"), "2h"),
            (ht("allow-list"), "127.0.0.0/8"),
            (ht("deny-list"), "192.0.2.0/24"),
            (ht("cors-enable"), "true"),
            (ht("cors-allow-origin"), "*"),
            (ht("cors-allow-methods"), "GET"),
            (ht("cors-max-age"), "1m"),
            (ht("request-set-header"), "X-From haproxytech\nX-Env test"),
            (ht("response-set-header"), "X-Frame-Options DENY"),
            (ht("set-host"), "inner.example"),
            (ht("path-rewrite"), "^/v1/(.*) /\\1"),
            (ht("rate-limit-requests"), "1000"),
            (ht("rate-limit-period"), "1s"),
            (ht("check"), "true"),
            (ht("check-http"), "/healthz"),
            (ht("check-interval"), "3s"),
            (ht("cookie-persistence"), "HT"),
        ]),
        vec![
            (
                "haproxytech set (21 annotations): path-rewrite, set-host",
                get("/v1/page"),
                Look::Seen("backend=web"),
                "200 backend=web path=/page host=inner.example",
            ),
            ("... request-set-header", get("/"), Look::Seen("header x-env:"), "200 header x-env: test"),
            ("... response-set-header", get("/"), Look::Header("x-frame-options"), "200 DENY"),
            ("... CORS preflight", preflight.clone(), Look::Header("access-control-max-age"), "204 60"),
        ],
    ));

    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    for case in &cases {
        ingresses
            .create(
                &PostParams::default(),
                &ingress(case.name, case.host, case.service, case.annotations.clone(), &case.paths)?,
            )
            .await?;
    }
    // Sticky sessions and health checks get Ingresses of their own (their rows are made below).
    for (name, pairs) in [
        ("sticky-haptic", vec![(hd("affinity"), "cookie"), (hd("session-cookie-name"), "SRVID")]),
        ("sticky-hi", vec![(ha("affinity"), "cookie")]),
        ("sticky-ht", vec![(ht("cookie-persistence"), "mycookie")]),
    ] {
        ingresses
            .create(
                &PostParams::default(),
                &ingress(name, &format!("{name}.example"), "pair", annotations(&pairs), &[("/", "Prefix")])?,
            )
            .await?;
    }
    let health = annotations(&[
        (ha("health-check-uri"), "/healthz"),
        (ha("health-check-interval"), "500ms"),
        (ha("health-check-rise-count"), "1"),
        (ha("health-check-fall-count"), "1"),
    ]);
    ingresses
        .create(&PostParams::default(), &ingress("health", "health.example", "checked", health, &[("/", "Prefix")])?)
        .await?;
    let limits = [
        ("rate-haptic", annotations(&[(hd("rate-limit-rps"), "5")])),
        ("rate-hi", annotations(&[(ha("limit-rps"), "5")])),
        ("rate-ht", annotations(&[(ht("rate-limit-requests"), "5"), (ht("rate-limit-period"), "10s")])),
        ("conn-hi", annotations(&[(ha("limit-connections"), "2")])),
        ("rate-code", annotations(&[(hd("rate-limit-rps"), "5"), (hd("rate-limit-status-code"), "503")])),
    ];
    for (name, pairs) in &limits {
        ingresses
            .create(
                &PostParams::default(),
                &ingress(name, &format!("{name}.example"), "web", pairs.clone(), &[("/", "Prefix")])?,
            )
            .await?;
    }

    apply_library_config_for_pods_with(&client, &namespace, "annotations", &[]).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &dir.join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    // Every pod serves the last Ingress before the rows start.
    wait_until(&http, env, "conn-hi.example", &get("/"), &ok("web")).await?;

    let mut rows = Vec::new();
    for case in &cases {
        for (name, ask, look, expected) in &case.rows {
            let got = on_every_pod(&http, env, case.host, ask, *look).await;
            let (expected, got) =
                if expected == "SAME" { same_backend(&http, env, case.host).await } else { (expected.clone(), got) };
            rows.push(Row {
                case: (*name).to_owned(),
                request: format!("{} {}{}", ask.method, case.host, ask.path),
                expected,
                got,
            });
        }
    }
    rows.extend(sticky_rows(&http, env).await);
    rows.extend(rate_rows(&http, env).await);
    rows.push(grpc_row(env).await?);
    rows.push(health_row(&http, env, dir).await?);
    rows.push(refusal_row(&client, &namespace, &controller, "snippet").await?);
    // The users' password hashes reach the pods, never the render directory.
    let shown = controller.file("haproxy.cfg");
    rows.push(Row {
        case: "basic-auth password hashes redacted in the render directory".into(),
        request: "haproxy.cfg as the controller writes it for inspection".into(),
        expected: "user alice password <redacted>".into(),
        got: if shown.contains(&hash) {
            "the hash is there".into()
        } else {
            shown.lines().map(str::trim).find(|l| l.starts_with("user alice")).unwrap_or("(no user line)").to_owned()
        },
    });

    rows.extend(every_name(&client, &namespace, &http, env).await?);

    conformance_table(&rows, "annotations-conformance.md", &controller)
}

/// The rows as the Markdown table docs/library-conformance.md holds, printed and written to
/// `CARGO_TARGET_TMPDIR/<file>`; an error naming the rows that failed (with the configuration
/// the controller rendered) unless every one passed.
pub(super) fn conformance_table(rows: &[Row], file: &str, controller: &ControllerProcess) -> Result<()> {
    let mut table = String::from("| Case | Request | Expected | Got | |\n|---|---|---|---|---|\n");
    for row in rows {
        let mark = if row.expected == row.got { "pass" } else { "FAIL" };
        table.push_str(&format!("| {} | `{}` | {} | {} | {mark} |\n", row.case, row.request, row.expected, row.got));
    }
    println!("{table}");
    let _ = std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(file), &table);
    let failed = rows.iter().filter(|row| row.expected != row.got).count();
    ensure!(failed == 0, "{failed} rows failed:\n{table}\n--- haproxy.cfg ---\n{}", controller.file("haproxy.cfg"));
    Ok(())
}

pub(super) async fn wait_until(
    http: &reqwest::Client,
    env: &env::Manifest,
    host: &str,
    ask: &Ask,
    expected: &str,
) -> Result<()> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let got = on_every_pod(http, env, host, ask, Look::Outcome).await;
        if got == expected {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{host} answered {got}, not {expected}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `balance source`: twenty requests from one client reach one server, on every pod.
pub(super) async fn same_backend(http: &reqwest::Client, env: &env::Manifest, host: &str) -> (String, String) {
    same_backend_for(http, env, host, &get("/")).await
}

/// `same_backend`, asking `ask` each time.
pub(super) async fn same_backend_for(
    http: &reqwest::Client,
    env: &env::Manifest,
    host: &str,
    ask: &Ask,
) -> (String, String) {
    let mut seen = std::collections::BTreeSet::new();
    for pod in &env.pods {
        for _ in 0..20 {
            seen.insert(format!("{}:{}", pod.name, probe(http, pod, host, ask, Look::Outcome).await));
        }
    }
    let per_pod = seen.len() == env.pods.len() && seen.iter().all(|s| s.contains("200 p"));
    (
        "one server per pod over 20 requests".into(),
        if per_pod { "one server per pod over 20 requests".into() } else { format!("{seen:?}") },
    )
}

/// Sticky sessions: without the cookie the pair alternates; with it, 100 requests stay on the
/// server the first answer named.
async fn sticky_rows(http: &reqwest::Client, env: &env::Manifest) -> Vec<Row> {
    // 20 requests a pod in `make test`, 100 in `make soak`.
    let tries = env::repetitions(20, 100);
    let mut rows = Vec::new();
    for (name, cookie, annotation) in [
        ("sticky-haptic", "SRVID", "affinity + session-cookie-name (haptic.dev)"),
        ("sticky-hi", "INGRESSCOOKIE", "affinity cookie (haproxy-ingress)"),
        ("sticky-ht", "mycookie", "cookie-persistence (haproxytech)"),
    ] {
        let host = format!("{name}.example");
        let mut verdicts = Vec::new();
        for pod in &env.pods {
            let first = http.get(format!("http://{}:8080/", pod.ip)).header("Host", &host).send().await;
            let Ok(first) = first else {
                verdicts.push("no answer".to_owned());
                continue;
            };
            let server = first.headers().get("x-backend").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            let set = first.headers().get("set-cookie").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            let Some(value) = set.split(';').next().filter(|pair| pair.starts_with(&format!("{cookie}="))) else {
                verdicts.push(format!("no {cookie} cookie (set-cookie: {set})"));
                continue;
            };
            let mut stayed = 0;
            for _ in 0..tries {
                let answer = http
                    .get(format!("http://{}:8080/", pod.ip))
                    .header("Host", &host)
                    .header("cookie", value)
                    .send()
                    .await;
                if answer
                    .ok()
                    .and_then(|a| a.headers().get("x-backend").map(|v| v.to_str().unwrap_or_default() == server))
                    == Some(true)
                {
                    stayed += 1;
                }
            }
            verdicts.push(format!("{stayed}/{tries} on one server"));
        }
        let held = format!("{tries}/{tries} on one server");
        let got = if verdicts.iter().all(|v| *v == held) { held.clone() } else { verdicts.join("; ") };
        rows.push(Row {
            case: format!("{annotation}: the cookie holds a client on one server"),
            request: format!("GET {host}/ ×{tries} with the cookie"),
            expected: held,
            got,
        });
    }
    rows
}

/// `count` requests for `host`, one after another, each to the next pod in turn (a load
/// balancer's round robin): what each was answered. A short pause between them lets the pods'
/// shared rate-limit counters (HAProxy peers) reach the next pod first, as they do between a
/// client's requests; the pauses together stay well within a second.
pub(super) async fn spread_over_pods(
    http: &reqwest::Client,
    env: &env::Manifest,
    host: &str,
    count: usize,
) -> Vec<String> {
    let mut statuses = Vec::new();
    for pod in env.pods.iter().cycle().take(count) {
        statuses.push(probe(http, pod, host, &get("/"), Look::Outcome).await);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    statuses
}

/// Rate limits: five requests a second pass, the next is refused (429 by haptic's and
/// haproxy-ingress's rule, 403 by haproxytech's default), counted by the pods together (the
/// requests go to each in turn); two slow requests at once pass a connection limit of two, a
/// third is refused (connections count on the pod that holds them).
async fn rate_rows(http: &reqwest::Client, env: &env::Manifest) -> Vec<Row> {
    let mut rows = Vec::new();
    for (name, annotation, refused) in [
        ("rate-haptic", "rate-limit-rps 5 (haptic.dev)", "429"),
        ("rate-hi", "limit-rps 5 (haproxy-ingress)", "429"),
        ("rate-ht", "rate-limit-requests 5 + rate-limit-period 10s (haproxytech, its 403)", "403"),
        ("rate-code", "rate-limit-rps 5 + rate-limit-status-code 503 (haptic.dev)", "503"),
    ] {
        let host = format!("{name}.example");
        let statuses = spread_over_pods(http, env, &host, 8).await;
        let passed = statuses.iter().take_while(|s| s.starts_with("200")).count();
        let refused_after = statuses.iter().skip(passed).all(|s| s == refused);
        let got = if (5..=6).contains(&passed) && refused_after {
            format!("{refused} after the rate")
        } else {
            format!("{statuses:?}")
        };
        rows.push(Row {
            case: format!("{annotation}, counted by the pods together"),
            request: format!("GET {host}/ ×8, to each pod in turn"),
            expected: format!("{refused} after the rate"),
            got,
        });
    }
    let mut verdicts = Vec::new();
    for pod in &env.pods {
        let slow_ask = get("/slow?seconds=2");
        let (a, b) = tokio::join!(
            probe(http, pod, "conn-hi.example", &slow_ask, Look::Outcome),
            probe(http, pod, "conn-hi.example", &slow_ask, Look::Outcome)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let held = tokio::spawn({
            let http = http.clone();
            let pod_ip = pod.ip.clone();
            async move {
                let _ = http
                    .get(format!("http://{pod_ip}:8080/slow?seconds=2"))
                    .header("Host", "conn-hi.example")
                    .send()
                    .await;
            }
        });
        let held2 = tokio::spawn({
            let http = http.clone();
            let pod_ip = pod.ip.clone();
            async move {
                let _ = http
                    .get(format!("http://{pod_ip}:8080/slow?seconds=2"))
                    .header("Host", "conn-hi.example")
                    .send()
                    .await;
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let third = probe(http, pod, "conn-hi.example", &get("/"), Look::Outcome).await;
        let _ = (held.await, held2.await);
        verdicts.push(if a == "200 web" && b == "200 web" && third == "429" {
            "two pass, the third 429".to_owned()
        } else {
            format!("{a}, {b}, third {third}")
        });
    }
    let got = if verdicts.iter().all(|v| *v == verdicts[0]) { verdicts[0].clone() } else { verdicts.join("; ") };
    rows.push(Row {
        case: "limit-connections 2 (haproxy-ingress)".into(),
        request: "GET conn-hi.example/slow ×2 held, then one more".into(),
        expected: "two pass, the third 429".into(),
        got,
    });
    rows
}

/// Health checks: with cb's /healthz failing, cb is out of traffic within its interval
/// (500 ms, fall 1), so twenty requests all reach ca; and back once it recovers.
async fn health_row(http: &reqwest::Client, env: &env::Manifest, dir: &std::path::Path) -> Result<Row> {
    let both = |answers: &BTreeMap<String, usize>| answers.contains_key("200 ca") && answers.contains_key("200 cb");
    let tally = |http: &reqwest::Client| {
        let http = http.clone();
        async move {
            let mut answers: BTreeMap<String, usize> = BTreeMap::new();
            for pod in &env.pods {
                for _ in 0..10 {
                    *answers.entry(probe(&http, pod, "health.example", &get("/"), Look::Outcome).await).or_default() +=
                        1;
                }
            }
            answers
        }
    };
    let before = tally(http).await;
    std::fs::write(dir.join("cb.sick"), "")?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = tally(http).await;
    let taken_out = started.elapsed();
    std::fs::remove_file(dir.join("cb.sick")).context("cb.sick")?;
    let expected = "both serve; cb sick → only ca within 1.5 s";
    let got = if both(&before) && after.len() == 1 && after.contains_key("200 ca") {
        expected.to_owned()
    } else {
        format!("before {before:?}, after {after:?} ({taken_out:?})")
    };
    Ok(Row {
        case: "health-check-uri, -interval 500ms, -rise-count, -fall-count 1 (haproxy-ingress): a failing check takes a server out".into(),
        request: "GET health.example/ ×10 per pod".into(),
        expected: expected.into(),
        got,
    })
}

/// The Warning Event a refused Ingress carries.
async fn refusal_row(
    client: &kube::Client,
    namespace: &str,
    controller: &ControllerProcess,
    name: &str,
) -> Result<Row> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(15);
    let note = loop {
        let found = events.list(&ListParams::default()).await?.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Refused") && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        });
        if let Some(found) = found {
            break found.note.unwrap_or_default();
        }
        ensure!(Instant::now() < deadline, "no Refused Event on {name}\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let says = note.contains("haproxy.org/backend-config-snippet") && note.contains("snippets are off");
    Ok(Row {
        case: "snippets off: the Event names the annotation".into(),
        request: format!("Ingress {name}"),
        expected: "Refused, naming haproxy.org/backend-config-snippet".into(),
        got: if says { "Refused, naming haproxy.org/backend-config-snippet".into() } else { note },
    })
}

/// Every name of every setting a request can observe, haptic's, the peers' and their legacy
/// prefixes (`ingress.kubernetes.io/`, `haproxy.com/`): an Ingress each, with that annotation
/// (and, where the setting needs another to act, haptic's name for that one), and a request.
async fn every_name(
    client: &kube::Client,
    namespace: &str,
    http: &reqwest::Client,
    env: &env::Manifest,
) -> Result<Vec<Row>> {
    let https = |path: &'static str| Ask { method: "GET", path, https: true, ..Ask::default() };
    let preflight = Ask {
        method: "OPTIONS",
        path: "/",
        headers: vec![("origin", "https://app.example".into()), ("access-control-request-method", "PUT".into())],
        ..Ask::default()
    };
    let post = Ask { method: "POST", path: "/upload", body: 2048, ..Ask::default() };
    // (setting, value, other annotations it needs, service, ask, look, expected: haptic's name, a peer's).
    type Check = (
        &'static str,
        &'static str,
        Vec<(&'static str, &'static str)>,
        &'static str,
        Ask,
        Look,
        &'static str,
        &'static str,
    );
    let checks: Vec<Check> = vec![
        // Not last: plain HTTP to a passthrough host is a 404, and the wait below needs the last served.
        ("ssl-passthrough", "true", vec![], "web", get("/"), Look::Outcome, "404", "404"),
        (
            "ssl-redirect",
            "true",
            vec![],
            "web",
            get("/x"),
            Look::Outcome,
            "308 https://{host}/x",
            "302 https://{host}/x",
        ),
        (
            "ssl-redirect-code",
            "301",
            vec![("haptic.dev/ssl-redirect", "true")],
            "web",
            get("/x"),
            Look::Outcome,
            "301 https://{host}/x",
            "301 https://{host}/x",
        ),
        (
            "hsts",
            "true",
            vec![],
            "web",
            https("/"),
            Look::Header("strict-transport-security"),
            "200 max-age=15768000",
            "200 max-age=15768000",
        ),
        (
            "hsts-max-age",
            "600",
            vec![("haptic.dev/hsts", "true")],
            "web",
            https("/"),
            Look::Header("strict-transport-security"),
            "200 max-age=600",
            "200 max-age=600",
        ),
        ("backend-protocol", "h2", vec![], "grpc", get("/"), Look::Outcome, "200 grpc", "200 grpc"),
        ("server-proto", "h2", vec![], "grpc", get("/"), Look::Outcome, "200 grpc", "200 grpc"),
        ("server-ssl", "true", vec![], "secure", get("/"), Look::Outcome, "200 secure", "200 secure"),
        (
            "server-ca",
            "wrong-ca",
            vec![("haptic.dev/server-ssl", "true")],
            "secure",
            get("/"),
            Look::Outcome,
            "503",
            "503",
        ),
        ("affinity", "cookie", vec![], "pair", get("/"), Look::Cookie, "200 INGRESSCOOKIE", "200 INGRESSCOOKIE"),
        (
            "session-cookie-name",
            "SWEPT",
            vec![("haptic.dev/affinity", "cookie")],
            "pair",
            get("/"),
            Look::Cookie,
            "200 SWEPT",
            "200 SWEPT",
        ),
        ("timeout-server", "1s", vec![], "web", get("/slow?seconds=3"), Look::Outcome, "504", "504"),
        ("allow-list", "192.0.2.0/24", vec![], "web", get("/"), Look::Outcome, "403", "403"),
        ("deny-list", "0.0.0.0/0", vec![], "web", get("/"), Look::Outcome, "403", "403"),
        ("auth-secret", "users-htpasswd", vec![], "web", get("/"), Look::Outcome, "401", "401"),
        (
            "auth-realm",
            "Swept",
            vec![("haptic.dev/auth-secret", "users-htpasswd")],
            "web",
            get("/"),
            Look::Header("www-authenticate"),
            "401 Basic realm=\"Swept\"",
            "401 Basic realm=\"Swept\"",
        ),
        ("cors-enable", "true", vec![], "web", get("/"), Look::Header("access-control-allow-origin"), "200 *", "200 *"),
        (
            "cors-allow-origin",
            "https://app.example",
            vec![("haptic.dev/cors-enable", "true")],
            "web",
            get("/"),
            Look::Header("access-control-allow-origin"),
            "200 https://app.example",
            "200 https://app.example",
        ),
        (
            "cors-allow-methods",
            "GET, PUT",
            vec![("haptic.dev/cors-enable", "true")],
            "web",
            preflight.clone(),
            Look::Header("access-control-allow-methods"),
            "204 GET, PUT",
            "204 GET, PUT",
        ),
        (
            "cors-allow-headers",
            "X-Swept",
            vec![("haptic.dev/cors-enable", "true")],
            "web",
            preflight.clone(),
            Look::Header("access-control-allow-headers"),
            "204 X-Swept",
            "204 X-Swept",
        ),
        (
            "cors-allow-credentials",
            "true",
            vec![("haptic.dev/cors-enable", "true")],
            "web",
            get("/"),
            Look::Header("access-control-allow-credentials"),
            "200 true",
            "200 true",
        ),
        (
            "cors-max-age",
            "60",
            vec![("haptic.dev/cors-enable", "true")],
            "web",
            preflight.clone(),
            Look::Header("access-control-max-age"),
            "204 60",
            "204 60",
        ),
        (
            "cors-expose-headers",
            "X-Total",
            vec![("haptic.dev/cors-enable", "true")],
            "web",
            get("/"),
            Look::Header("access-control-expose-headers"),
            "200 X-Total",
            "200 X-Total",
        ),
        (
            "request-set-header",
            "X-Swept: yes",
            vec![],
            "web",
            get("/"),
            Look::Seen("header x-swept:"),
            "200 header x-swept: yes",
            "200 header x-swept: yes",
        ),
        ("response-set-header", "X-Swept yes", vec![], "web", get("/"), Look::Header("x-swept"), "200 yes", "200 yes"),
        (
            "set-host",
            "inner.example",
            vec![],
            "web",
            get("/"),
            Look::Seen("backend=web"),
            "200 backend=web path=/ host=inner.example",
            "200 backend=web path=/ host=inner.example",
        ),
        (
            "rewrite-target",
            "/v2",
            vec![],
            "web",
            get("/x"),
            Look::Seen("backend=web"),
            "200 backend=web path=/v2/x host={host}",
            "200 backend=web path=/v2/x host={host}",
        ),
        (
            "path-rewrite",
            "/fixed",
            vec![],
            "web",
            get("/any"),
            Look::Seen("backend=web"),
            "200 backend=web path=/fixed host={host}",
            "200 backend=web path=/fixed host={host}",
        ),
        (
            "redirect-to",
            "https://new.example/landing",
            vec![],
            "web",
            get("/old"),
            Look::Outcome,
            "302 https://new.example/landing",
            "302 https://new.example/landing",
        ),
        (
            "redirect-host",
            "moved.example",
            vec![],
            "web",
            get("/a"),
            Look::Outcome,
            "302 http://moved.example/a",
            "302 http://moved.example/a",
        ),
        (
            "redirect-code",
            "301",
            vec![("haptic.dev/redirect-host", "moved.example")],
            "web",
            get("/a"),
            Look::Outcome,
            "301 http://moved.example/a",
            "301 http://moved.example/a",
        ),
        ("proxy-body-size", "1k", vec![], "web", post, Look::Outcome, "413", "413"),
        ("app-root", "/app", vec![], "web", get("/"), Look::Outcome, "302 /app", "302 /app"),
    ];
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), namespace);
    let mut asked = Vec::new();
    for (setting, value, needs, service, ask, look, haptic_expects, peer_expects) in checks {
        let names = haptic::render::annotation_names(setting);
        ensure!(!names.is_empty(), "no setting {setting}");
        // ingress-nginx's names have rows of their own (tests/pods/nginx.rs): its defaults differ.
        for name in names.into_iter().filter(|name| !name.starts_with("nginx.ingress.kubernetes.io/")) {
            let host = format!("n{}.example", asked.len());
            let mut pairs: Vec<(String, &str)> = needs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
            pairs.push((name.clone(), value));
            let ingress_name = format!("n{}", asked.len());
            ingresses
                .create(
                    &PostParams::default(),
                    &ingress(&ingress_name, &host, service, annotations(&pairs), &[("/", "Prefix")])?,
                )
                .await?;
            let expected = if name.starts_with("haptic.dev/") { haptic_expects } else { peer_expects };
            asked.push((setting, name, host.clone(), ask.clone(), look, expected.replace("{host}", &host)));
        }
    }
    // Every pod serves the last one (a plain request; the settings differ) before the rows.
    let last = asked.last().map(|(_, _, host, ..)| host.clone()).unwrap_or_default();
    let deadline = Instant::now() + WITHIN;
    loop {
        let got = on_every_pod(http, env, &last, &get("/"), Look::Outcome).await;
        if !got.contains("404") && !got.contains("error") {
            break;
        }
        ensure!(Instant::now() < deadline, "{last} is not served: {got}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each name has a host of its own: eight asked at once, the rows kept in order.
    let rows = futures::stream::iter(asked)
        .map(|(setting, name, host, ask, look, expected)| async move {
            let got = on_every_pod(http, env, &host, &ask, look).await;
            Row {
                case: format!("every name: `{name}` ({setting})"),
                request: format!("{} {host}{}", ask.method, ask.path),
                expected,
                got,
            }
        })
        .buffered(8)
        .collect()
        .await;
    Ok(rows)
}

/// A gRPC call (HTTP/2 in clear text from the client, prior knowledge) to an Ingress with
/// `backend-protocol: grpc`, answered by the HTTP/2-only server on every pod.
async fn grpc_row(env: &env::Manifest) -> Result<Row> {
    let mut answers = Vec::new();
    for pod in &env.pods {
        let address: std::net::SocketAddr = format!("{}:8080", pod.ip).parse()?;
        let h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .resolve("h2-hi.example", address)
            .timeout(Duration::from_secs(10))
            .build()?;
        let answer = h2
            .post("http://h2-hi.example:8080/echo.Echo/Say")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(vec![0u8, 0, 0, 0, 0])
            .send()
            .await;
        answers.push(match answer {
            Ok(answer) => {
                let header = |name: &str| {
                    answer.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
                };
                format!("{} {} grpc-status {}", answer.status().as_u16(), header("x-backend"), header("grpc-status"))
            }
            Err(error) => format!("error: {error}"),
        });
    }
    let got = if answers.iter().all(|a| *a == answers[0]) { answers[0].clone() } else { answers.join("; ") };
    Ok(Row {
        case: "backend-protocol grpc (haproxy-ingress): a gRPC call over h2c".into(),
        request: "POST h2-hi.example/echo.Echo/Say (HTTP/2, application/grpc)".into(),
        expected: "200 grpc grpc-status 0".into(),
        got,
    })
}
