//! Issue #48, live: Ingresses written for ingress-nginx (`nginx.ingress.kubernetes.io/`), each
//! row a real request through every HAProxy pod of the environment, running what the real
//! `haptic` binary rendered and pushed through the Dataplane API; and an Ingress asking for a
//! protection haptic lacks, of every kind, left out with a Warning Event that says why.
//!
//! The table it prints is the ingress-nginx part of docs/library-conformance.md.

use crate::annotations::{
    Ask, Case, Look, Row, annotations, basic, case, conformance_table, crypt_sha512, get, on_every_pod, probe,
    same_backend_for, secret, spread_over_pods, wait_until, with_header,
};
use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, endpoint_slice, library_namespace,
    service_with_endpoints, start_auth_server, start_backend_specs,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const BASE_PORT: u16 = 18540;

fn nx(name: &str) -> String {
    format!("nginx.ingress.kubernetes.io/{name}")
}

/// `case` with a TLS section naming its host (the Secret need not exist for what is asked).
fn with_tls(mut case: Case) -> Case {
    case.tls = true;
    case
}

/// The Ingress of a case, with its TLS section when asked.
fn case_ingress(case: &Case) -> Result<Ingress> {
    let paths: Vec<_> = case
        .paths
        .iter()
        .map(|(path, kind)| json!({"path": path, "pathType": kind, "backend": {"service": {"name": case.service, "port": {"number": 80}}}}))
        .collect();
    let mut spec = json!({"ingressClassName": "haproxy", "rules": [{"host": case.host, "http": {"paths": paths}}]});
    if case.tls {
        spec["tls"] = json!([{"hosts": [case.host], "secretName": "nginx-haptic-default-cert"}]);
    }
    Ok(serde_json::from_value(json!({"metadata": {"name": case.name, "annotations": case.annotations}, "spec": spec}))?)
}

/// External authentication against the auth server at `auth` (`address:port`), oauth2-proxy's
/// protocol; `closed` a port nothing listens on.
fn auth_cases(auth: &str, closed: &str) -> Vec<Case> {
    let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
    let url = leak(format!("http://{auth}/oauth2/auth"));
    let post_only = leak(format!("http://{auth}/post-only/auth"));
    let down = leak(format!("http://{closed}/oauth2/auth"));
    let cookie = |user: &str| with_header(get("/"), "cookie", &format!("_oauth2_proxy={user}"));
    let headers = "X-Auth-Request-User, X-Auth-Request-Email";
    vec![
        case(
            "nx-ext-auth",
            "web",
            annotations(&[(nx("auth-url"), url), (nx("auth-response-headers"), headers)]),
            vec![
                ("auth-url: no session, 401", get("/"), Look::Outcome, "401"),
                ("... a session: served", cookie("alice"), Look::Outcome, "200 web"),
                (
                    "... auth-response-headers reach the server",
                    cookie("alice"),
                    Look::Seen("header x-auth-request-user"),
                    "200 header x-auth-request-user: alice",
                ),
                (
                    "... a client's own X-Auth-Request-User is dropped",
                    with_header(cookie("alice"), "x-auth-request-user", "mallory"),
                    Look::Seen("header x-auth-request-user"),
                    "200 header x-auth-request-user: alice",
                ),
                ("... the service's 403: 403", cookie("banned"), Look::Outcome, "403"),
                (
                    "... the service's Set-Cookie reaches the client",
                    cookie("alice"),
                    Look::Header("set-cookie"),
                    "200 _oauth2_proxy=alice; Path=/; HttpOnly",
                ),
            ],
        ),
        case(
            "nx-ext-signin",
            "web",
            annotations(&[
                (nx("auth-url"), url),
                (nx("auth-signin"), "https://$host/oauth2/start?rd=$escaped_request_uri"),
            ]),
            vec![(
                "auth-signin with $host and $escaped_request_uri: no session, sent to sign in",
                get("/p?q=1"),
                Look::Outcome,
                "302 https://nx-ext-signin.example/oauth2/start?rd=%2Fp%3Fq%3D1",
            )],
        ),
        case(
            "nx-ext-rd",
            "web",
            annotations(&[(nx("auth-url"), url), (nx("auth-signin"), "https://login.example/start")]),
            vec![(
                "auth-signin without rd: the original URL added as rd",
                get("/p?q=1"),
                Look::Outcome,
                "302 https://login.example/start?rd=http://nx-ext-rd.example%2Fp%3Fq%3D1",
            )],
        ),
        case(
            "nx-ext-saw",
            "web",
            annotations(&[(nx("auth-url"), url), (nx("auth-response-headers"), "X-Auth-Saw")]),
            vec![(
                "the service is told the original URL, method, host and URI",
                Ask { path: "/p?q=1", ..cookie("alice") },
                Look::Seen("header x-auth-saw"),
                "200 header x-auth-saw: X-Original-URL=http://nx-ext-saw.example/p?q=1 X-Original-Method=GET X-Forwarded-Host=nx-ext-saw.example X-Forwarded-Uri=/p?q=1",
            )],
        ),
        case(
            "nx-ext-post",
            "web",
            annotations(&[(nx("auth-url"), post_only), (nx("auth-method"), "POST")]),
            vec![("auth-method POST: the service asked with POST", cookie("alice"), Look::Outcome, "200 web")],
        ),
        case(
            "nx-ext-get",
            "web",
            annotations(&[(nx("auth-url"), post_only)]),
            vec![("... asked with GET, the service's 405: 500", cookie("alice"), Look::Outcome, "500")],
        ),
        case(
            "nx-ext-down",
            "web",
            annotations(&[(nx("auth-url"), down)]),
            vec![("auth-url unreachable: 500, never served", cookie("alice"), Look::Outcome, "500")],
        ),
        case(
            "ha-ext-auth",
            "web",
            annotations(&[("haproxy-ingress.github.io/auth-url".into(), url)]),
            vec![
                ("auth-url (haproxy-ingress): no session, 401", get("/"), Look::Outcome, "401"),
                ("... a session: served", cookie("alice"), Look::Outcome, "200 web"),
            ],
        ),
    ]
}

/// Canary pairs: a main Ingress to `web` and a canary Ingress of the same host and path to
/// `canary`, each host one pair (the canary's rows are asked by `canary_rows`).
fn canary_pairs() -> Vec<(Case, Case)> {
    let pair = |host: &'static str, pairs: &[(String, &'static str)]| {
        let main = case(host, "web", annotations(&[]), Vec::new());
        let mut with_canary = vec![(nx("canary"), "true")];
        with_canary.extend(pairs.iter().cloned());
        let mut canary =
            case(Box::leak(format!("{host}-canary").into_boxed_str()), "canary", annotations(&with_canary), Vec::new());
        canary.host = main.host;
        (main, canary)
    };
    vec![
        pair(
            "nx-canary",
            &[(nx("canary-by-header"), "X-Canary"), (nx("canary-by-cookie"), "canary"), (nx("canary-weight"), "30")],
        ),
        pair(
            "nx-canary-value",
            &[(nx("canary-by-header"), "X-Version"), (nx("canary-by-header-value"), "v2"), (nx("canary-weight"), "0")],
        ),
        pair(
            "nx-canary-pattern",
            &[(nx("canary-by-header"), "X-Version"), (nx("canary-by-header-pattern"), "^v[2-9]$")],
        ),
        pair("nx-canary-all", &[(nx("canary-weight"), "5"), (nx("canary-weight-total"), "5")]),
    ]
}

/// Which backend each pod's `count` answers came from, as `<canary share>%` per pod.
async fn canary_share(http: &reqwest::Client, env: &env::Manifest, host: &str, ask: &Ask, count: usize) -> Vec<f64> {
    let mut shares = Vec::new();
    for pod in &env.pods {
        let mut canary = 0;
        for _ in 0..count {
            if probe(http, pod, host, ask, Look::Outcome).await == "200 canary" {
                canary += 1;
            }
        }
        shares.push(100.0 * canary as f64 / count as f64);
    }
    shares
}

/// The canaries, asked.
async fn canary_rows(http: &reqwest::Client, env: &env::Manifest) -> Vec<Row> {
    let header = |name: &'static str, value: &str| with_header(get("/"), name, value);
    let mut rows = Vec::new();
    for (case, host, ask, expected) in [
        ("canary-by-header always: the canary", "nx-canary.example", header("x-canary", "always"), "200 canary"),
        (
            "canary-by-header never: the main Ingress, whatever the cookie says",
            "nx-canary.example",
            with_header(header("x-canary", "never"), "cookie", "canary=always"),
            "200 web",
        ),
        ("canary-by-cookie always: the canary", "nx-canary.example", header("cookie", "canary=always"), "200 canary"),
        ("canary-by-header-value v2: the canary", "nx-canary-value.example", header("x-version", "v2"), "200 canary"),
        (
            "... another value, and weight 0: the main Ingress",
            "nx-canary-value.example",
            header("x-version", "v1"),
            "200 web",
        ),
        (
            "canary-by-header-pattern ^v[2-9]$: v3 to the canary",
            "nx-canary-pattern.example",
            header("x-version", "v3"),
            "200 canary",
        ),
        ("... v1 to the main Ingress", "nx-canary-pattern.example", header("x-version", "v1"), "200 web"),
    ] {
        let got = on_every_pod(http, env, host, &ask, Look::Outcome).await;
        rows.push(Row { case: case.into(), request: format!("GET {host}/"), expected: expected.into(), got });
    }
    let shares = canary_share(http, env, "nx-canary.example", &header("cookie", "canary=never"), 50).await;
    rows.push(Row {
        case: "canary-by-cookie never: never the canary, whatever the weight".into(),
        request: "GET nx-canary.example/ ×50 per pod".into(),
        expected: "0% to the canary".into(),
        got: if shares.iter().all(|s| *s == 0.0) { "0% to the canary".into() } else { format!("{shares:?}") },
    });
    let shares = canary_share(http, env, "nx-canary.example", &get("/"), 1000).await;
    let within = shares.iter().all(|s| (27.0..=33.0).contains(s));
    let shown: Vec<String> = shares.iter().map(|s| format!("{s:.1}%")).collect();
    rows.push(Row {
        case: "canary-weight 30: the share of 1,000 requests per pod, within ±3%".into(),
        request: "GET nx-canary.example/ ×1000 per pod".into(),
        expected: "27% to 33% on every pod".into(),
        got: if within { "27% to 33% on every pod".into() } else { shown.join(", ") },
    });
    println!("canary-weight 30 over 1,000 requests, per pod: {}", shown.join(", "));
    let shares = canary_share(http, env, "nx-canary-all.example", &get("/"), 50).await;
    rows.push(Row {
        case: "canary-weight 5 of canary-weight-total 5: every request".into(),
        request: "GET nx-canary-all.example/ ×50 per pod".into(),
        expected: "100% to the canary".into(),
        got: if shares.iter().all(|s| *s == 100.0) { "100% to the canary".into() } else { format!("{shares:?}") },
    });
    let got = on_every_pod(http, env, "nx-lone-canary.example", &get("/"), Look::Outcome).await;
    rows.push(Row {
        case: "a canary without a main Ingress of its host and path: not served".into(),
        request: "GET nx-lone-canary.example/".into(),
        expected: "404".into(),
        got,
    });
    rows
}

/// Client certificates: a certificate of `subject` signed by the CA `ca` (certificate, key),
/// as one PEM of certificate and key.
fn client_certificate(dir: &std::path::Path, ca: &(String, String), subject: &str) -> Result<String> {
    let run = |args: &[&str]| -> Result<()> {
        let done = std::process::Command::new("openssl").args(args).current_dir(dir).output()?;
        ensure!(done.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&done.stderr));
        Ok(())
    };
    std::fs::write(dir.join("signing-ca.crt"), &ca.0)?;
    std::fs::write(dir.join("signing-ca.key"), &ca.1)?;
    run(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        &format!("/CN={subject}"),
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
    ])?;
    // Extensions make it a version 3 certificate, which rustls insists on.
    std::fs::write(dir.join("client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")?;
    run(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "signing-ca.crt",
        "-CAkey",
        "signing-ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "client.ext",
        "-out",
        "client.crt",
    ])?;
    Ok(format!(
        "{}{}",
        std::fs::read_to_string(dir.join("client.crt"))?,
        std::fs::read_to_string(dir.join("client.key"))?
    ))
}

/// The Ingresses asking for client certificates (the CA in the Secret `client-ca`).
fn mtls_cases(namespace: &str) -> Vec<Case> {
    let ca = Box::leak(format!("{namespace}/client-ca").into_boxed_str()) as &'static str;
    let mtls = |name: &'static str, more: &[(String, &'static str)]| {
        let mut pairs = vec![(nx("auth-tls-secret"), ca)];
        pairs.extend(more.iter().cloned());
        with_tls(case(name, "web", annotations(&pairs), Vec::new()))
    };
    vec![
        mtls(
            "nx-mtls-on",
            &[(nx("auth-tls-verify-client"), "on"), (nx("auth-tls-pass-certificate-to-upstream"), "true")],
        ),
        mtls("nx-mtls-optional", &[(nx("auth-tls-verify-client"), "optional")]),
        mtls("nx-mtls-noca", &[(nx("auth-tls-verify-client"), "optional_no_ca")]),
        mtls("nx-mtls-cn", &[(nx("auth-tls-match-cn"), "CN=client-a")]),
        mtls("nx-mtls-page", &[(nx("auth-tls-error-page"), "https://errors.example/certificate")]),
        // haproxytech's names for the same check.
        with_tls(case("hx-mtls", "web", annotations(&[("haproxy.org/client-ca".to_owned(), ca)]), Vec::new())),
        with_tls(case(
            "hx-mtls-optional",
            "web",
            annotations(&[
                ("haproxy.org/client-ca".to_owned(), ca),
                ("haproxy.org/client-crt-optional".to_owned(), "true"),
            ]),
            Vec::new(),
        )),
    ]
}

/// An HTTPS request to `host` on every pod, with the client certificate `identity` (PEM) or
/// none: the status, or a redirect's Location, or the line of the echo starting with `seen`.
async fn with_certificate(env: &env::Manifest, host: &str, identity: Option<&str>, seen: Option<&str>) -> String {
    env::on_every_pod(&env.pods, |pod| async move {
        let address: std::net::SocketAddr = match format!("{}:8443", pod.ip).parse() {
            Ok(address) => address,
            Err(error) => return error.to_string(),
        };
        let mut builder = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .redirect(reqwest::redirect::Policy::none())
            .resolve_to_addrs(host, &[address])
            .timeout(Duration::from_secs(10));
        if let Some(pem) = identity {
            match reqwest::Identity::from_pem(pem.as_bytes()) {
                Ok(identity) => builder = builder.identity(identity),
                Err(error) => return format!("identity: {error}"),
            }
        }
        let client = match builder.build() {
            Ok(client) => client,
            Err(error) => return format!("no client: {error:?}"),
        };
        let request = client.get(format!("https://{host}:8443/")).header("ssl-client-verify", "forged");
        match request.send().await {
            Err(error) => format!("error: {error}"),
            Ok(answer) => {
                let status = answer.status().as_u16();
                let location =
                    answer.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                let body = answer.text().await.unwrap_or_default();
                match seen {
                    Some(prefix) => {
                        format!("{status} {}", body.lines().find(|l| l.starts_with(prefix)).unwrap_or("(none)"))
                    }
                    None if location.is_empty() => status.to_string(),
                    None => format!("{status} {location}"),
                }
            }
        }
    })
    .await
}

/// The client certificate rows: a valid one, none, one of another CA, per verify mode.
async fn mtls_rows(env: &env::Manifest, good: &str, other: &str, stranger: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    // (case, host, client certificate, echo line looked at, expected).
    type Check<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>, &'a str);
    let checks: Vec<Check> = vec![
        ("auth-tls-verify-client on: the CA's certificate accepted", "nx-mtls-on.example", Some(good), None, "200"),
        (
            "... the server is told SUCCESS (a client's own header dropped)",
            "nx-mtls-on.example",
            Some(good),
            Some("header ssl-client-verify"),
            "200 header ssl-client-verify: SUCCESS",
        ),
        (
            "... and the subject",
            "nx-mtls-on.example",
            Some(good),
            Some("header ssl-client-subject-dn"),
            "200 header ssl-client-subject-dn: CN=client-a",
        ),
        (
            "... auth-tls-pass-certificate-to-upstream: the certificate",
            "nx-mtls-on.example",
            Some(good),
            Some("header ssl-client-cert: -----BEGIN%20CERTIFICATE-----%0AMII"),
            "200 CERT",
        ),
        ("... no certificate: refused 400", "nx-mtls-on.example", None, None, "400"),
        ("... another CA's certificate: refused 400", "nx-mtls-on.example", Some(stranger), None, "400"),
        (
            "auth-tls-verify-client optional: no certificate accepted, NONE",
            "nx-mtls-optional.example",
            None,
            Some("header ssl-client-verify"),
            "200 header ssl-client-verify: NONE",
        ),
        ("... another CA's certificate: refused 400", "nx-mtls-optional.example", Some(stranger), None, "400"),
        (
            "auth-tls-verify-client optional_no_ca: another CA's accepted, FAILED told",
            "nx-mtls-noca.example",
            Some(stranger),
            Some("header ssl-client-verify: FAILED"),
            "200 FAILED",
        ),
        ("auth-tls-match-cn CN=client-a: client-a accepted", "nx-mtls-cn.example", Some(good), None, "200"),
        ("... client-b (the same CA) refused 403", "nx-mtls-cn.example", Some(other), None, "403"),
        (
            "auth-tls-error-page: a refused certificate sent to the page",
            "nx-mtls-page.example",
            Some(stranger),
            None,
            "302 https://errors.example/certificate",
        ),
        ("haproxytech's client-ca: the CA's certificate accepted", "hx-mtls.example", Some(good), None, "200"),
        ("... no certificate: refused 400", "hx-mtls.example", None, None, "400"),
        (
            "haproxytech's client-crt-optional true: no certificate accepted",
            "hx-mtls-optional.example",
            None,
            None,
            "200",
        ),
        ("... another CA's certificate: refused 400", "hx-mtls-optional.example", Some(stranger), None, "400"),
    ];
    for (case, host, identity, seen, expected) in checks {
        let mut got = with_certificate(env, host, identity, seen).await;
        // Only the start of a certificate or a failure's code is compared.
        if expected == "200 CERT" && got.starts_with("200 header ssl-client-cert: -----BEGIN%20CERTIFICATE-----%0AMII")
        {
            got = "200 CERT".into();
        }
        if expected == "200 FAILED" && got.starts_with("200 header ssl-client-verify: FAILED:") {
            got = "200 FAILED".into();
        }
        rows.push(Row { case: case.into(), request: format!("GET https://{host}/"), expected: expected.into(), got });
    }
    rows
}

/// Regex paths and ingress-nginx's rewrite-target: Ingresses with paths of their own.
fn regex_cases() -> Vec<Case> {
    let seen = |host: &str, path: &str| format!("200 backend=web path={path} host={host}.example");
    let mut api = case(
        "nx-regex-api",
        "web",
        annotations(&[(nx("use-regex"), "true"), (nx("rewrite-target"), "/$2")]),
        vec![
            (
                "use-regex + rewrite-target /$2: the second group becomes the path",
                get("/api/users?x=1"),
                Look::Seen("backend=web"),
                "",
            ),
            ("... matched without case", get("/API/Users"), Look::Seen("backend=web"), ""),
            ("... /api alone: the empty group", get("/api"), Look::Seen("backend=web"), ""),
            ("... /apix matches no path: 404", get("/apix"), Look::Outcome, "404"),
        ],
    );
    api.paths = vec![("/api(/|$)(.*)", "ImplementationSpecific")];
    let expected =
        [seen("nx-regex-api", "/users"), seen("nx-regex-api", "/Users"), seen("nx-regex-api", "/"), "404".to_owned()];
    for (row, expected) in api.rows.iter_mut().zip(expected) {
        row.3 = expected;
    }
    let mut plain = case(
        "nx-rewrite-plain",
        "web",
        annotations(&[(nx("rewrite-target"), "/")]),
        vec![(
            "rewrite-target / without groups: the whole path becomes /",
            get("/app/x"),
            Look::Seen("backend=web"),
            "",
        )],
    );
    plain.paths = vec![("/app", "Prefix")];
    plain.rows[0].3 = seen("nx-rewrite-plain", "/");
    let mut versions = case(
        "nx-regex-versions",
        "web",
        annotations(&[(nx("use-regex"), "true")]),
        vec![
            (
                "use-regex, no rewrite: a path of the pattern served as asked",
                get("/v2/items/5"),
                Look::Seen("backend=web"),
                "",
            ),
            ("... a path outside it: 404", get("/v/items"), Look::Outcome, "404"),
        ],
    );
    versions.paths = vec![("/v[0-9]+/items", "Prefix")];
    versions.rows[0].3 = seen("nx-regex-versions", "/v2/items/5");
    vec![api, plain, versions]
}

/// custom-http-errors and default-backend: the Service `errors` answers with the status its
/// X-Code asks; `empty` has no endpoints.
fn error_page_cases() -> Vec<Case> {
    let from_errors = [(nx("custom-http-errors"), "404,503"), (nx("default-backend"), "errors")];
    vec![
        case(
            "nx-errors",
            "web",
            annotations(&from_errors),
            vec![
                (
                    "custom-http-errors + default-backend: a listed status answered by the default backend",
                    get("/status/404"),
                    Look::Header("x-backend"),
                    "404 errors",
                ),
                ("... asked with X-Code", get("/status/404"), Look::Seen("header x-code"), "404 header x-code: 404"),
                (
                    "... and X-Original-URI",
                    get("/status/404?q=1"),
                    Look::Seen("header x-original-uri"),
                    "404 header x-original-uri: /status/404?q=1",
                ),
                (
                    "... and X-Ingress-Name",
                    get("/status/404"),
                    Look::Seen("header x-ingress-name"),
                    "404 header x-ingress-name: nx-errors",
                ),
                (
                    "... and X-Service-Name",
                    get("/status/404"),
                    Look::Seen("header x-service-name"),
                    "404 header x-service-name: web",
                ),
                (
                    "... and X-Format (the request's Accept)",
                    with_header(get("/status/404"), "accept", "application/json"),
                    Look::Seen("header x-format"),
                    "404 header x-format: application/json",
                ),
                (
                    "... a status not listed: the application's answer",
                    get("/status/500"),
                    Look::Header("x-backend"),
                    "500 web",
                ),
                ("... a success: the application's", get("/"), Look::Outcome, "200 web"),
            ],
        ),
        case(
            "nx-errors-own",
            "web",
            annotations(&[(nx("custom-http-errors"), "404,415")]),
            vec![
                (
                    "custom-http-errors without default-backend: haptic's error page",
                    get("/status/404"),
                    Look::Header("x-backend"),
                    "404 ",
                ),
                (
                    "... a status HAProxy has no page for: the status, no application body",
                    get("/status/415"),
                    Look::Header("x-backend"),
                    "415 ",
                ),
                (
                    "... a status not listed: the application's",
                    get("/status/403"),
                    Look::Header("x-backend"),
                    "403 web",
                ),
            ],
        ),
        case(
            "nx-fallback",
            "empty",
            annotations(&[(nx("default-backend"), "errors")]),
            vec![(
                "default-backend, the Service without endpoints: the default backend answers",
                get("/x"),
                Look::Outcome,
                "200 errors",
            )],
        ),
        case(
            "nx-no-fallback",
            "empty",
            annotations(&[]),
            vec![("no default-backend, the Service without endpoints: 503", get("/x"), Look::Outcome, "503")],
        ),
        case(
            "nx-fallback-idle",
            "web",
            annotations(&[(nx("default-backend"), "errors")]),
            vec![(
                "default-backend, the Service with endpoints: the Service answers",
                get("/x"),
                Look::Outcome,
                "200 web",
            )],
        ),
        case(
            "nx-fallback-missing",
            "web",
            annotations(&[(nx("default-backend"), "no-such-service")]),
            vec![("default-backend naming no Service: served as without it", get("/x"), Look::Outcome, "200 web")],
        ),
    ]
}

/// The rows of the plain cases: one Ingress each, asked as the row says.
fn cases(namespace: &str) -> Vec<Case> {
    let ok = |b: &str| format!("200 {b}");
    let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
    let ca = leak(format!("{namespace}/backend-ca"));
    let wrong_ca = leak(format!("{namespace}/wrong-ca"));
    let slow = || get("/slow?seconds=3");
    let post = |body: usize| Ask { method: "POST", path: "/upload", body, ..Ask::default() };
    let preflight = |origin: &str| Ask {
        method: "OPTIONS",
        path: "/",
        headers: vec![("origin", origin.to_owned()), ("access-control-request-method", "PUT".into())],
        ..Ask::default()
    };
    let origin = |origin: &str| with_header(get("/"), "origin", origin);
    vec![
        with_tls(case(
            "nx-redirect",
            "web",
            annotations(&[(nx("ssl-redirect"), "true")]),
            vec![(
                "ssl-redirect, an Ingress with TLS: 308",
                get("/x?y=1"),
                Look::Outcome,
                "308 https://nx-redirect.example/x?y=1",
            )],
        )),
        case(
            "nx-redirect-plain",
            "web",
            annotations(&[(nx("ssl-redirect"), "true")]),
            vec![("ssl-redirect, an Ingress without TLS: served", get("/x"), Look::Outcome, &ok("web"))],
        ),
        case(
            "nx-force",
            "web",
            annotations(&[(nx("force-ssl-redirect"), "true")]),
            vec![("force-ssl-redirect without TLS: 308", get("/x"), Look::Outcome, "308 https://nx-force.example/x")],
        ),
        with_tls(case(
            "nx-no-redirect",
            "web",
            annotations(&[(nx("ssl-redirect"), "false")]),
            vec![("ssl-redirect false, with TLS: served", get("/x"), Look::Outcome, &ok("web"))],
        )),
        case(
            "nx-https",
            "secure",
            annotations(&[(nx("backend-protocol"), "HTTPS")]),
            vec![("backend-protocol HTTPS: TLS to the server, not verified", get("/"), Look::Outcome, &ok("secure"))],
        ),
        case(
            "nx-unverified",
            "secure",
            annotations(&[(nx("backend-protocol"), "HTTPS"), (nx("proxy-ssl-secret"), wrong_ca)]),
            vec![("proxy-ssl-secret without proxy-ssl-verify: not verified", get("/"), Look::Outcome, &ok("secure"))],
        ),
        case(
            "nx-verified",
            "secure",
            annotations(&[
                (nx("backend-protocol"), "HTTPS"),
                (nx("proxy-ssl-secret"), ca),
                (nx("proxy-ssl-verify"), "on"),
                (nx("proxy-ssl-name"), "secure.backend"),
                (nx("proxy-ssl-server-name"), "on"),
            ]),
            vec![(
                "proxy-ssl-secret + proxy-ssl-verify on + proxy-ssl-name: verified",
                get("/"),
                Look::Outcome,
                &ok("secure"),
            )],
        ),
        case(
            "nx-wrong-ca",
            "secure",
            annotations(&[
                (nx("backend-protocol"), "HTTPS"),
                (nx("proxy-ssl-secret"), wrong_ca),
                (nx("proxy-ssl-verify"), "on"),
            ]),
            vec![("proxy-ssl-verify on with a CA that did not sign it: refused", get("/"), Look::Outcome, "503")],
        ),
        case(
            "nx-wrong-name",
            "secure",
            annotations(&[
                (nx("backend-protocol"), "HTTPS"),
                (nx("proxy-ssl-secret"), ca),
                (nx("proxy-ssl-verify"), "on"),
                (nx("proxy-ssl-name"), "other.backend"),
            ]),
            vec![("proxy-ssl-name another name than the certificate's: refused", get("/"), Look::Outcome, "503")],
        ),
        case(
            "nx-grpc",
            "grpc",
            annotations(&[(nx("backend-protocol"), "GRPC")]),
            vec![("backend-protocol GRPC: HTTP/2 to an HTTP/2-only server", get("/"), Look::Outcome, &ok("grpc"))],
        ),
        case(
            "nx-h2c",
            "grpc",
            annotations(&[(nx("backend-protocol"), "H2C")]),
            vec![("backend-protocol H2C", get("/"), Look::Outcome, &ok("grpc"))],
        ),
        case(
            "nx-timeout",
            "web",
            annotations(&[(nx("proxy-read-timeout"), "1"), (nx("proxy-connect-timeout"), "2")]),
            vec![
                ("proxy-read-timeout 1 (seconds) ends a 3 s answer", slow(), Look::Outcome, "504"),
                ("... a quick answer still served", get("/"), Look::Outcome, &ok("web")),
            ],
        ),
        case(
            "nx-send-timeout",
            "web",
            annotations(&[(nx("proxy-send-timeout"), "1")]),
            vec![("proxy-send-timeout 1 (the server timeout)", slow(), Look::Outcome, "504")],
        ),
        case(
            "nx-body",
            "web",
            annotations(&[(nx("proxy-body-size"), "1k")]),
            vec![
                ("proxy-body-size 1k: a 2 KiB body refused", post(2048), Look::Outcome, "413"),
                ("... a 512 B body served", post(512), Look::Outcome, &ok("web")),
            ],
        ),
        case(
            "nx-sticky",
            "pair",
            annotations(&[
                (nx("affinity"), "cookie"),
                (nx("session-cookie-name"), "route"),
                (nx("session-cookie-samesite"), "Lax"),
                (nx("session-cookie-secure"), "true"),
                (nx("session-cookie-max-age"), "3600"),
            ]),
            vec![
                ("affinity cookie + session-cookie-name", get("/"), Look::Cookie, "200 route"),
                (
                    "session-cookie-samesite, -secure, -max-age: the cookie's attributes",
                    get("/"),
                    Look::Header("set-cookie-attributes"),
                    "200 HttpOnly; Max-Age=3600; SameSite=Lax; Secure; path=/",
                ),
            ],
        ),
        case(
            "nx-hash",
            "pair",
            annotations(&[(nx("upstream-hash-by"), "$request_uri")]),
            vec![("upstream-hash-by $request_uri: one URI, one server", get("/"), Look::Outcome, "SAME")],
        ),
        case(
            "nx-hash-header",
            "pair",
            annotations(&[(nx("upstream-hash-by"), "$http_x_user")]),
            vec![(
                "upstream-hash-by $http_x_user: one user, one server",
                with_header(get("/"), "x-user", "ann"),
                Look::Outcome,
                "SAME",
            )],
        ),
        case(
            "nx-ewma",
            "web",
            annotations(&[(nx("load-balance"), "ewma")]),
            vec![("load-balance ewma (as leastconn): served", get("/"), Look::Outcome, &ok("web"))],
        ),
        case(
            "nx-allow",
            "web",
            annotations(&[(nx("whitelist-source-range"), "192.0.2.0/24, 2001:db8::/32")]),
            vec![("whitelist-source-range without the client", get("/"), Look::Outcome, "403")],
        ),
        case(
            "nx-allow-client",
            "web",
            annotations(&[(nx("whitelist-source-range"), "0.0.0.0/0")]),
            vec![("whitelist-source-range with the client", get("/"), Look::Outcome, &ok("web"))],
        ),
        case(
            "nx-deny",
            "web",
            annotations(&[(nx("denylist-source-range"), "0.0.0.0/0")]),
            vec![("denylist-source-range covering the client", get("/"), Look::Outcome, "403")],
        ),
        case(
            "nx-permanent",
            "web",
            annotations(&[(nx("permanent-redirect"), "https://new.example/landing")]),
            vec![("permanent-redirect: 301", get("/old"), Look::Outcome, "301 https://new.example/landing")],
        ),
        case(
            "nx-permanent-code",
            "web",
            annotations(&[(nx("permanent-redirect"), "https://new.example/"), (nx("permanent-redirect-code"), "308")]),
            vec![(
                "permanent-redirect + permanent-redirect-code 308",
                get("/"),
                Look::Outcome,
                "308 https://new.example/",
            )],
        ),
        case(
            "nx-temporal",
            "web",
            annotations(&[(nx("temporal-redirect"), "https://status.example/")]),
            vec![("temporal-redirect: 302", get("/"), Look::Outcome, "302 https://status.example/")],
        ),
        case(
            "nx-app-root",
            "web",
            annotations(&[(nx("app-root"), "/app")]),
            vec![
                ("app-root: / redirected", get("/"), Look::Outcome, "302 /app"),
                ("... other paths served", get("/app"), Look::Outcome, &ok("web")),
            ],
        ),
        case(
            "nx-cors",
            "web",
            annotations(&[(nx("enable-cors"), "true")]),
            vec![
                (
                    "enable-cors: preflight answered, credentials allowed (ingress-nginx's default)",
                    preflight("https://app.example"),
                    Look::Header("access-control-allow-credentials"),
                    "204 true",
                ),
                (
                    "... max age 1728000 (ingress-nginx's default)",
                    preflight("https://app.example"),
                    Look::Header("access-control-max-age"),
                    "204 1728000",
                ),
                ("... any origin", origin("https://app.example"), Look::Header("access-control-allow-origin"), "200 *"),
            ],
        ),
        case(
            "nx-cors-list",
            "web",
            annotations(&[
                (nx("enable-cors"), "true"),
                (nx("cors-allow-origin"), "https://a.example, https://b.example:8443, https://*.apps.example"),
            ]),
            vec![
                (
                    "cors-allow-origin list: the second origin echoed",
                    origin("https://b.example:8443"),
                    Look::Header("access-control-allow-origin"),
                    "200 https://b.example:8443",
                ),
                (
                    "... a wildcard origin, one label",
                    origin("https://x.apps.example"),
                    Look::Header("access-control-allow-origin"),
                    "200 https://x.apps.example",
                ),
                (
                    "... another origin gets none",
                    origin("https://evil.example"),
                    Look::Header("access-control-allow-origin"),
                    "200 ",
                ),
                (
                    "... preflight from a listed origin",
                    preflight("https://a.example"),
                    Look::Header("access-control-allow-origin"),
                    "204 https://a.example",
                ),
            ],
        ),
        case(
            "nx-auth",
            "web",
            annotations(&[
                (nx("auth-type"), "basic"),
                (nx("auth-secret"), "users-htpasswd"),
                (nx("auth-realm"), "Staging"),
            ]),
            vec![
                (
                    "auth-type basic + auth-secret (auth-file): no credentials",
                    get("/"),
                    Look::Header("www-authenticate"),
                    "401 Basic realm=\"Staging\"",
                ),
                (
                    "... right password",
                    with_header(get("/"), "authorization", &basic("alice", "s3cret")),
                    Look::Outcome,
                    &ok("web"),
                ),
                (
                    "... wrong password",
                    with_header(get("/"), "authorization", &basic("alice", "guess")),
                    Look::Outcome,
                    "401",
                ),
            ],
        ),
        case(
            "nx-auth-sha",
            "web",
            annotations(&[(nx("auth-type"), "basic"), (nx("auth-secret"), "users-sha")]),
            vec![
                ("auth-secret with a {SHA} hash (htpasswd -s): no credentials", get("/"), Look::Outcome, "401"),
                (
                    "... right password",
                    with_header(get("/"), "authorization", &basic("carol", "s3cret")),
                    Look::Outcome,
                    &ok("web"),
                ),
                (
                    "... wrong password",
                    with_header(get("/"), "authorization", &basic("carol", "guess")),
                    Look::Outcome,
                    "401",
                ),
                (
                    "... a crypt user of the same Secret",
                    with_header(get("/"), "authorization", &basic("alice", "s3cret")),
                    Look::Outcome,
                    &ok("web"),
                ),
            ],
        ),
        case(
            "nx-auth-map",
            "web",
            annotations(&[
                (nx("auth-type"), "basic"),
                (nx("auth-secret"), "users-per-key"),
                (nx("auth-secret-type"), "auth-map"),
            ]),
            vec![(
                "auth-secret-type auth-map: right password",
                with_header(get("/"), "authorization", &basic("bob", "s3cret")),
                Look::Outcome,
                &ok("web"),
            )],
        ),
        case(
            "nx-vhost",
            "web",
            annotations(&[(nx("upstream-vhost"), "inner.example"), (nx("x-forwarded-prefix"), "/shop")]),
            vec![
                (
                    "upstream-vhost: the Host the server sees",
                    get("/"),
                    Look::Seen("backend=web"),
                    "200 backend=web path=/ host=inner.example",
                ),
                (
                    "x-forwarded-prefix",
                    get("/"),
                    Look::Seen("header x-forwarded-prefix"),
                    "200 header x-forwarded-prefix: /shop",
                ),
            ],
        ),
        case(
            "nx-alias",
            "web",
            annotations(&[(nx("server-alias"), "alias-one.example, alias-two.example")]),
            vec![("server-alias: the rule's own host", get("/"), Look::Outcome, &ok("web"))],
        ),
        case(
            "www.nx-www",
            "web",
            annotations(&[(nx("from-to-www-redirect"), "true")]),
            vec![("from-to-www-redirect: the www host served", get("/x"), Look::Outcome, &ok("web"))],
        ),
        case(
            "nx-ignored",
            "web",
            annotations(&[(nx("proxy-buffering"), "on"), (nx("enable-access-log"), "false")]),
            vec![("proxy-buffering, enable-access-log (ignored): served", get("/"), Look::Outcome, &ok("web"))],
        ),
        // Last: every pod serves it before the rows start.
        case(
            "nx-last",
            "web",
            annotations(&[(nx("proxy-connect-timeout"), "5")]),
            vec![("proxy-connect-timeout 5: served", get("/"), Look::Outcome, &ok("web"))],
        ),
    ]
}

/// Ingresses asking for a protection haptic does not have, one per kind (and one whose value
/// haptic cannot serve): each left out, every pod answering 404, with a `Refused` Event that
/// names the annotation. Each routes to the Service every other Ingress shares.
fn refused_cases() -> Vec<(&'static str, &'static str, String, &'static str)> {
    vec![
        ("nx-ext-snippet", "authentication (an nginx auth snippet)", nx("auth-snippet"), "proxy_set_header X 1;"),
        (
            "nx-oauth",
            "authentication (haproxy-ingress's oauth)",
            "haproxy-ingress.github.io/oauth".into(),
            "oauth2_proxy",
        ),
        ("nx-mtls-elsewhere", "client certificates (a CA of another namespace)", nx("auth-tls-secret"), "default/ca"),
        (
            "nx-mtls-strict",
            "client certificates (haproxy-ingress's strict mode)",
            "haproxy-ingress.github.io/auth-tls-strict".into(),
            "true",
        ),
        ("nx-waf", "a web application firewall", nx("enable-modsecurity"), "true"),
        ("nx-global-limit", "rate limits (global, memcached)", nx("global-rate-limit"), "100"),
        ("nx-snippet", "configuration in nginx's language", nx("configuration-snippet"), "deny all;"),
        (
            "nx-path-type",
            "routing (haproxy-ingress's path types)",
            "haproxy-ingress.github.io/path-type".into(),
            "regex",
        ),
        ("nx-digest", "authentication (digest, a value haptic cannot serve)", nx("auth-type"), "digest"),
        ("nx-apr1", "authentication (an $apr1$ htpasswd, which HAProxy cannot check)", nx("auth-secret"), "users-apr1"),
        (
            "nx-patterns",
            "client address lists (haproxytech's pattern file)",
            "haproxy.org/allow-list".into(),
            "patterns/ips",
        ),
    ]
}

/// The note of the Event `reason` on the Ingress `name`, waited for.
async fn event_note(client: &kube::Client, namespace: &str, name: &str, reason: &str) -> Option<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = events.list(&ListParams::default()).await.ok()?.items.into_iter().find(|e| {
            e.reason.as_deref() == Some(reason) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        });
        if let Some(found) = found {
            return found.note;
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `Look::Header("set-cookie-attributes")` is answered by the plain header: its attributes
/// sorted, the cookie's own value left out.
async fn cookie_attributes(http: &reqwest::Client, env: &env::Manifest, host: &str) -> String {
    env::on_every_pod(&env.pods, |pod| async move {
        let got = probe(http, pod, host, &get("/"), Look::Header("set-cookie")).await;
        let (status, cookie) = got.split_once(' ').unwrap_or((&got, ""));
        let mut attributes: Vec<&str> = cookie.split(';').skip(1).map(str::trim).filter(|a| !a.is_empty()).collect();
        attributes.sort_unstable();
        format!("{status} {}", attributes.join("; "))
    })
    .await
}

/// How each pod answers `count` requests in a row: `<code> after <n>` when the first `n` pass
/// and the rest get `code`.
async fn limit_row(
    http: &reqwest::Client,
    env: &env::Manifest,
    host: &str,
    count: usize,
    case: &str,
    expected: &str,
) -> Row {
    let statuses = spread_over_pods(http, env, host, count).await;
    let passed = statuses.iter().take_while(|s| s.starts_with("200")).count();
    let rest: std::collections::BTreeSet<&String> = statuses.iter().skip(passed).collect();
    let got = match (rest.len(), rest.into_iter().next()) {
        (0, _) => format!("all {count} served"),
        (1, Some(code)) => format!("{code} after {passed}"),
        _ => format!("{statuses:?}"),
    };
    Row {
        case: format!("{case}, counted by the pods together"),
        request: format!("GET {host}/ ×{count}, to each pod in turn"),
        expected: expected.into(),
        got,
    }
}

#[tokio::test]
async fn ingress_nginx_annotations_answer_as_ingress_nginx_does_on_every_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "nginx").await?;
    let work = tempfile::tempdir()?;
    let dir = work.path();
    let address = backend_host_address()?;

    let (cert, key) = env::fixtures::self_signed(dir, "secure.backend", &["rsa:2048"])?;
    std::fs::write(dir.join("backend.pem"), format!("{cert}{key}"))?;
    let (other_ca, _) = env::fixtures::self_signed(dir, "someone-else", &["rsa:2048"])?;
    let port = |i: u16| BASE_PORT + i;
    let specs = vec![
        format!("web={address}:{}", port(0)),
        format!("pa={address}:{}", port(1)),
        format!("pb={address}:{}", port(2)),
        format!("secure={address}:{}={}", port(5), dir.join("backend.pem").display()),
        format!("canary={address}:{}", port(9)),
        format!("errors={address}:{}", port(10)),
    ];
    let _backends = start_backend_specs(dir, &specs)?;
    let _h2c = env::h2c::start(dir, "h2c_backends", &[format!("grpc={address}:{}", port(6))])?;
    let _auth = start_auth_server(dir, &address, port(7))?;
    service_with_endpoints(&client, &namespace, "web", &address, port(0)).await?;
    service_with_endpoints(&client, &namespace, "pair", &address, port(1)).await?;
    service_with_endpoints(&client, &namespace, "secure", &address, port(5)).await?;
    service_with_endpoints(&client, &namespace, "grpc", &address, port(6)).await?;
    service_with_endpoints(&client, &namespace, "canary", &address, port(9)).await?;
    service_with_endpoints(&client, &namespace, "errors", &address, port(10)).await?;
    let empty = json!({"metadata": {"name": "empty"}, "spec": {"ports": [{"name": "http", "port": 80}]}});
    Api::<Service>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &serde_json::from_value(empty)?)
        .await?;
    Api::<EndpointSlice>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &endpoint_slice("pair-2", "pair", &address, port(2))?)
        .await?;

    let (default_cert, default_key) = env::fixtures::self_signed(dir, "haptic-default", &["rsa:2048"])?;
    let tls = json!({"tls.crt": default_cert, "tls.key": default_key});
    secret(&client, &namespace, "nginx-haptic-default-cert", "kubernetes.io/tls", tls).await?;
    let hash = crypt_sha512("s3cret")?;
    secret(&client, &namespace, "users-htpasswd", "Opaque", json!({"auth": format!("alice:{hash}\n")})).await?;
    secret(&client, &namespace, "users-per-key", "Opaque", json!({"bob": hash})).await?;
    let sha = std::process::Command::new("sh")
        .args(["-c", "printf s3cret | openssl dgst -sha1 -binary | base64"])
        .output()?;
    let sha = String::from_utf8(sha.stdout)?.trim().to_owned();
    secret(&client, &namespace, "users-sha", "Opaque", json!({"auth": format!("carol:{{SHA}}{sha}\nalice:{hash}\n")}))
        .await?;
    secret(
        &client,
        &namespace,
        "users-apr1",
        "Opaque",
        json!({"auth": "dave:$apr1$abcdefgh$0123456789abcdefghijkl\n"}),
    )
    .await?;
    secret(&client, &namespace, "backend-ca", "Opaque", json!({"ca.crt": cert})).await?;
    secret(&client, &namespace, "wrong-ca", "Opaque", json!({"ca.crt": other_ca})).await?;

    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let client_ca = env::fixtures::self_signed(dir, "client-ca", &["rsa:2048"])?;
    let stranger_ca = env::fixtures::self_signed(dir, "stranger-ca", &["rsa:2048"])?;
    let good = client_certificate(dir, &client_ca, "client-a")?;
    let other = client_certificate(dir, &client_ca, "client-b")?;
    let stranger = client_certificate(dir, &stranger_ca, "client-a")?;
    secret(&client, &namespace, "client-ca", "Opaque", json!({"ca.crt": client_ca.0})).await?;
    let mut cases = auth_cases(&format!("{address}:{}", port(7)), &format!("{address}:{}", port(8)));
    cases.extend(mtls_cases(&namespace));
    cases.extend(regex_cases());
    cases.extend(error_page_cases());
    cases.extend(self::cases(&namespace));
    // Rate limits and service-upstream: asked below, not by the plain rows.
    let limits = [
        ("nx-rps", vec![(nx("limit-rps"), "3"), (nx("limit-burst-multiplier"), "1")]),
        ("nx-rps-burst", vec![(nx("limit-rps"), "2")]),
        (
            "nx-rps-exempt",
            vec![(nx("limit-rps"), "1"), (nx("limit-burst-multiplier"), "1"), (nx("limit-whitelist"), "0.0.0.0/0")],
        ),
        ("nx-rpm", vec![(nx("limit-rpm"), "2"), (nx("limit-burst-multiplier"), "1")]),
        ("nx-upstream", vec![(nx("service-upstream"), "true")]),
    ];
    for (name, pairs) in &limits {
        cases.insert(0, case(name, "web", annotations(pairs), Vec::new()));
    }
    for case in &cases {
        ingresses.create(&PostParams::default(), &case_ingress(case)?).await?;
    }
    for (main, canary) in canary_pairs() {
        ingresses.create(&PostParams::default(), &case_ingress(&main)?).await?;
        ingresses.create(&PostParams::default(), &case_ingress(&canary)?).await?;
    }
    let lone = case(
        "nx-lone-canary",
        "canary",
        annotations(&[(nx("canary"), "true"), (nx("canary-weight"), "100")]),
        Vec::new(),
    );
    ingresses.create(&PostParams::default(), &case_ingress(&lone)?).await?;
    for (name, _, annotation, value) in refused_cases() {
        let refused = case(name, "web", annotations(&[(annotation, value)]), Vec::new());
        ingresses.create(&PostParams::default(), &case_ingress(&refused)?).await?;
    }
    // Another class's Ingress: ingress-nginx's to serve, not haptic's to judge.
    let mut theirs =
        case_ingress(&case("nx-theirs", "web", annotations(&[(nx("auth-url"), "http://a/")]), Vec::new()))?;
    if let Some(spec) = theirs.spec.as_mut() {
        spec.ingress_class_name = Some("nginx".into());
    }
    ingresses.create(&PostParams::default(), &theirs).await?;

    apply_library_config_for_pods_with(&client, &namespace, "nginx", &[]).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &dir.join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?;
    wait_until(&http, env, "nx-last.example", &get("/"), "200 web").await?;

    let mut rows = Vec::new();
    for case in &cases {
        for (name, ask, look, expected) in &case.rows {
            let (expected, got) = match (expected.as_str(), look) {
                ("SAME", _) => same_backend_for(&http, env, case.host, ask).await,
                (_, Look::Header("set-cookie-attributes")) => {
                    (expected.clone(), cookie_attributes(&http, env, case.host).await)
                }
                _ => (expected.clone(), on_every_pod(&http, env, case.host, ask, *look).await),
            };
            rows.push(Row {
                case: (*name).to_owned(),
                request: format!("{} {}{}", ask.method, case.host, ask.path),
                expected,
                got,
            });
        }
    }
    rows.extend(routing_rows(&http, env).await);
    rows.extend(canary_rows(&http, env).await);
    rows.extend(mtls_rows(env, &good, &other, &stranger).await);
    rows.push(
        limit_row(
            &http,
            env,
            "nx-rps.example",
            8,
            "limit-rps 3 + limit-burst-multiplier 1: 503 after 3",
            "503 after 3",
        )
        .await,
    );
    rows.push(
        limit_row(
            &http,
            env,
            "nx-rps-burst.example",
            14,
            "limit-rps 2 (burst ×5, ingress-nginx's default): 10 in 5 s, then 503",
            "503 after 10",
        )
        .await,
    );
    rows.push(
        limit_row(
            &http,
            env,
            "nx-rps-exempt.example",
            6,
            "limit-rps 1 + limit-whitelist covering the client: never limited",
            "all 6 served",
        )
        .await,
    );
    rows.push(
        limit_row(
            &http,
            env,
            "nx-rpm.example",
            4,
            "limit-rpm 2 + limit-burst-multiplier 1: 503 after 2",
            "503 after 2",
        )
        .await,
    );
    rows.push(service_upstream_row(&client, &namespace, env).await?);
    rows.extend(refusal_rows(&client, &namespace, &http, env).await);
    rows.extend(warning_rows(&client, &namespace).await);

    conformance_table(&rows, "nginx-conformance.md", &controller)
}

/// Hosts an Ingress's annotations add: a server alias, and the www twin that redirects.
async fn routing_rows(http: &reqwest::Client, env: &env::Manifest) -> Vec<Row> {
    let mut rows = Vec::new();
    for (case, host, path, expected) in [
        ("server-alias: the first alias served as the rule", "alias-one.example", "/", "200 web"),
        ("server-alias: the second alias", "alias-two.example", "/", "200 web"),
        (
            "from-to-www-redirect: the bare host sent to www",
            "nx-www.example",
            "/x?y=1",
            "308 http://www.nx-www.example/x?y=1",
        ),
    ] {
        let got = on_every_pod(http, env, host, &get(path), Look::Outcome).await;
        rows.push(Row { case: case.into(), request: format!("GET {host}{path}"), expected: expected.into(), got });
    }
    rows
}

/// service-upstream: the backend's one server is the Service's cluster IP, as every pod runs it
/// (read back through its Dataplane API): kube-proxy, not HAProxy, picks the endpoint.
async fn service_upstream_row(client: &kube::Client, namespace: &str, env: &env::Manifest) -> Result<Row> {
    let service = Api::<Service>::namespaced(client.clone(), namespace).get("web").await?;
    let ip = service.spec.and_then(|spec| spec.cluster_ip).unwrap_or_default();
    let wanted = format!("{ip}:80");
    let backend = format!("backend be_{namespace}_web_80_nx-upstream");
    let mut answers = Vec::new();
    for pod in &env.pods {
        let config = env.dataplane(pod).raw_configuration().await?.text;
        let servers: Vec<String> = config
            .split("\nbackend ")
            .find(|section| format!("backend {section}").starts_with(&backend))
            .map(|section| {
                section
                    .lines()
                    .filter(|l| l.trim_start().starts_with("server "))
                    .filter(|l| !l.contains(" disabled"))
                    .map(|l| l.split_whitespace().nth(2).unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        answers.push(servers.join(", "));
    }
    answers.dedup();
    Ok(Row {
        case: "service-upstream: the one server is the Service's cluster IP".into(),
        request: "each pod's configuration, through its Dataplane API".into(),
        expected: wanted,
        got: answers.join(" / "),
    })
}

/// Every kind of protection haptic lacks: not served, and the Event says which and why.
async fn refusal_rows(client: &kube::Client, namespace: &str, http: &reqwest::Client, env: &env::Manifest) -> Vec<Row> {
    let mut rows = Vec::new();
    for (name, kind, annotation, _) in refused_cases() {
        let host = format!("{name}.example");
        let answer = on_every_pod(http, env, &host, &get("/"), Look::Outcome).await;
        let note = event_note(client, namespace, name, "Refused").await.unwrap_or_else(|| "no Refused Event".into());
        let says = note.contains(annotation.as_str()) || (name == "nx-apr1" && note.contains("$apr1$ hash"));
        rows.push(Row {
            case: format!(
                "{kind}: not served, a Refused Event names {}",
                if name == "nx-apr1" { "the $apr1$ hash" } else { annotation.as_str() }
            ),
            request: format!("GET {host}/"),
            expected: "404; Refused".into(),
            got: if says { format!("{answer}; Refused") } else { format!("{answer}; {note}") },
        });
    }
    rows
}

/// An ignored annotation is named in a Warning Event; another class's Ingress gets none.
async fn warning_rows(client: &kube::Client, namespace: &str) -> Vec<Row> {
    let note = event_note(client, namespace, "nx-ignored", "UnsupportedAnnotations").await.unwrap_or_default();
    let named = note.contains(&nx("proxy-buffering")) && note.contains(&nx("enable-access-log"));
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let about_theirs = events
        .list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nx-theirs"))
                .count()
        })
        .unwrap_or(usize::MAX);
    vec![
        Row {
            case: "ignored annotations: a Warning Event UnsupportedAnnotations names each".into(),
            request: "Ingress nx-ignored".into(),
            expected: "UnsupportedAnnotations naming both".into(),
            got: if named { "UnsupportedAnnotations naming both".into() } else { format!("{note:?}") },
        },
        Row {
            case: "another class's Ingress (ingress-nginx's) gets no Event from haptic".into(),
            request: "Ingress nx-theirs, class nginx, with auth-url".into(),
            expected: "0 Events".into(),
            got: format!("{about_theirs} Events"),
        },
    ]
}
