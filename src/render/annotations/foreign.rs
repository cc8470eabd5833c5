//! The annotations of known controllers that haptic does not read, and what it does about each:
//! an Ingress asking for a protection haptic lacks (authentication, client certificates, a
//! firewall, address lists, rate limits), for configuration in another proxy's language, or
//! for routing haptic would get wrong, is refused (not served until the annotation goes);
//! any other is ignored, and the Ingress is served with a Warning naming it.
//!
//! The same verdicts feed the render (refusals), the controller's Events and `haptic
//! migrate-check`, so the three never disagree.

use super::nginx;

/// Why an annotation haptic does not implement refuses its Ingress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protection {
    /// Who may ask: external authentication, OAuth.
    Authentication,
    /// Client certificates (mutual TLS).
    ClientCertificates,
    /// A web application firewall.
    Firewall,
    /// How often a client may ask.
    RateLimit,
    /// Configuration in another proxy's language, which may hold any of the above.
    Snippet,
    /// Routing that serving without would send requests elsewhere than asked (canary, regex).
    Routing,
}

impl Protection {
    /// The group in words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Authentication => "authentication",
            Self::ClientCertificates => "client certificates",
            Self::Firewall => "a web application firewall",
            Self::RateLimit => "rate limits",
            Self::Snippet => "configuration in another proxy's language",
            Self::Routing => "routing",
        }
    }
}

/// What haptic does with one annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A setting the library reads (its key).
    Read(&'static str),
    /// Not implemented, and the Ingress is not served while it asks for it.
    Refused(Protection, &'static str),
    /// Not implemented; the Ingress is served without it.
    Ignored(&'static str),
    /// Under a known controller's prefix, but no annotation haptic knows of.
    Unknown,
    /// Not a controller's annotation (`kubectl.kubernetes.io/...`, `cert-manager.io/...`).
    NotOurs,
}

/// An annotation of a known controller that haptic does not read.
struct Unsupported {
    key: &'static str,
    /// Refuses its Ingress for this reason; `None`: ignored.
    refuses: Option<Protection>,
    /// What it does there, and what haptic does instead.
    note: &'static str,
    /// `true`/`on` turns it on: `false`/`off` asks for nothing, and refuses nothing.
    switch: bool,
}

const fn refused(key: &'static str, protection: Protection, note: &'static str) -> Unsupported {
    Unsupported { key, refuses: Some(protection), note, switch: false }
}

const fn refused_when_on(key: &'static str, protection: Protection, note: &'static str) -> Unsupported {
    Unsupported { key, refuses: Some(protection), note, switch: true }
}

const fn ignored(key: &'static str, note: &'static str) -> Unsupported {
    Unsupported { key, refuses: None, note, switch: false }
}

use Protection::{Authentication, ClientCertificates, Firewall, RateLimit, Routing, Snippet};

const CLIENT_CERTS: &str = "this form of client certificate check is not implemented (auth-tls-secret's are)";
const NGINX_SNIPPET: &str = "nginx configuration haptic cannot read; write it as haptic annotations";

/// ingress-nginx's annotations haptic does not read (`nginx.ingress.kubernetes.io/`).
static NGINX: &[Unsupported] = &[
    ignored("auth-request-redirect", "X-Auth-Request-Redirect is the request's own URL"),
    refused("auth-snippet", Snippet, NGINX_SNIPPET),
    ignored("auth-cache-key", "every request is asked of the auth service (no cache)"),
    ignored("auth-cache-duration", "every request is asked of the auth service (no cache)"),
    ignored("auth-proxy-set-headers", "the auth service gets the request's own headers"),
    ignored("auth-always-set-cookie", "the auth service's cookie is passed on its 2xx answers"),
    ignored("auth-keepalive", "connections to the auth service are HAProxy's"),
    ignored("auth-keepalive-requests", "connections to the auth service are HAProxy's"),
    ignored("auth-keepalive-timeout", "connections to the auth service are HAProxy's"),
    ignored("auth-keepalive-share-vars", "connections to the auth service are HAProxy's"),
    refused_when_on("enable-modsecurity", Firewall, "ModSecurity is not part of haptic"),
    refused_when_on("enable-owasp-core-rules", Firewall, "ModSecurity is not part of haptic"),
    refused("modsecurity-snippet", Firewall, "ModSecurity is not part of haptic"),
    ignored("modsecurity-transaction-id", "ModSecurity is not part of haptic"),
    refused("global-rate-limit", RateLimit, "global rate limits (memcached) are not implemented; use limit-rps"),
    refused("global-rate-limit-window", RateLimit, "global rate limits (memcached) are not implemented"),
    refused("global-rate-limit-key", RateLimit, "global rate limits (memcached) are not implemented"),
    ignored("global-rate-limit-ignored-cidrs", "exemptions from a global rate limit haptic does not set"),
    refused("configuration-snippet", Snippet, NGINX_SNIPPET),
    refused("server-snippet", Snippet, NGINX_SNIPPET),
    refused("stream-snippet", Snippet, NGINX_SNIPPET),
    ignored("satisfy", "haptic asks every check (satisfy all)"),
    ignored("enable-global-auth", "haptic has no global external authentication"),
    ignored("affinity-mode", "HAProxy's cookie keeps a session on its server (persistent)"),
    ignored("affinity-canary-behavior", "a canary's sessions are not kept on it (legacy)"),
    ignored("session-cookie-path", "HAProxy's cookie has the path /"),
    ignored("session-cookie-change-on-failure", "a failed server's sessions go elsewhere (redispatch)"),
    ignored("session-cookie-conditional-samesite-none", "browser sniffing is not done"),
    ignored("client-body-buffer-size", "HAProxy streams bodies"),
    ignored("http2-push-preload", "HTTP/2 push is not done"),
    ignored("preserve-trailing-slash", "the redirect keeps the path as asked"),
    ignored("proxy-cookie-domain", "cookies are not rewritten"),
    ignored("proxy-cookie-path", "cookies are not rewritten"),
    ignored("proxy-next-upstream", "a failed connection is retried on another server"),
    ignored("proxy-next-upstream-timeout", "HAProxy's retries are counted, not timed"),
    ignored("proxy-next-upstream-tries", "HAProxy's retries: haptic.dev/retries"),
    ignored("proxy-request-buffering", "HAProxy streams bodies"),
    ignored("proxy-redirect-from", "Location headers are not rewritten"),
    ignored("proxy-redirect-to", "Location headers are not rewritten"),
    ignored("proxy-http-version", "HAProxy speaks HTTP/1.1 to servers"),
    ignored("proxy-buffering", "HAProxy streams answers"),
    ignored("proxy-buffers-number", "HAProxy streams answers"),
    ignored("proxy-buffer-size", "HAProxy's buffers are global (tune.bufsize)"),
    ignored("proxy-max-temp-file-size", "HAProxy streams answers"),
    ignored("proxy-ssl-ciphers", "the servers' TLS uses HAProxy's defaults"),
    ignored("proxy-ssl-protocols", "the servers' TLS uses HAProxy's defaults"),
    ignored("proxy-ssl-verify-depth", "HAProxy verifies the whole chain"),
    ignored("ssl-ciphers", "HAProxy's TLS settings are global"),
    ignored("ssl-prefer-server-ciphers", "HAProxy's TLS settings are global"),
    ignored("connection-proxy-header", "HAProxy manages connections"),
    ignored("enable-access-log", "access logs are the chart's (accessLog)"),
    ignored("enable-rewrite-log", "no rewrite log"),
    ignored("enable-opentracing", "tracing of requests is not done"),
    ignored("opentracing-trust-incoming-span", "tracing of requests is not done"),
    ignored("enable-opentelemetry", "tracing of requests is not done"),
    ignored("opentelemetry-trust-incoming-span", "tracing of requests is not done"),
    ignored("opentelemetry-operation-name", "tracing of requests is not done"),
    ignored("enable-influxdb", "InfluxDB metrics are not sent"),
    ignored("influxdb-measurement", "InfluxDB metrics are not sent"),
    ignored("influxdb-port", "InfluxDB metrics are not sent"),
    ignored("influxdb-host", "InfluxDB metrics are not sent"),
    ignored("influxdb-server-name", "InfluxDB metrics are not sent"),
    ignored("mirror-target", "request mirroring for Ingresses is not implemented (the Gateway API's is)"),
    ignored("mirror-uri", "request mirroring for Ingresses is not implemented (the Gateway API's is)"),
    ignored("mirror-host", "request mirroring for Ingresses is not implemented (the Gateway API's is)"),
    ignored("mirror-request-body", "request mirroring for Ingresses is not implemented (the Gateway API's is)"),
    ignored("upstream-hash-by-subset", "consistent hashing picks one server, not a subset"),
    ignored("upstream-hash-by-subset-size", "consistent hashing picks one server, not a subset"),
    ignored("limit-rate", "bandwidth limits are not implemented"),
    ignored("limit-rate-after", "bandwidth limits are not implemented"),
    ignored("custom-headers", "response headers from a ConfigMap: use haptic.dev/response-set-header"),
    ignored("server-tokens", "HAProxy sends no Server header"),
    ignored("ssl-redirect-code", "ingress-nginx has no such annotation; haptic.dev/ssl-redirect-code"),
];

/// haproxy-ingress's annotations haptic does not read (`haproxy-ingress.github.io/`, and its
/// legacy `ingress.kubernetes.io/`).
static HAPROXY_INGRESS: &[Unsupported] = &[
    ignored("auth-headers-request", "the auth service gets every request header"),
    ignored("auth-headers-fail", "a refusal is answered by haptic"),
    refused("oauth", Authentication, "OAuth through oauth2-proxy is not implemented yet"),
    refused("oauth-uri-prefix", Authentication, "OAuth through oauth2-proxy is not implemented yet"),
    refused("oauth-headers", Authentication, "OAuth through oauth2-proxy is not implemented yet"),
    refused("auth-tls-cert-header", ClientCertificates, CLIENT_CERTS),
    refused_when_on("auth-tls-strict", ClientCertificates, CLIENT_CERTS),
    refused("waf", Firewall, "a WAF is not part of haptic"),
    refused("waf-mode", Firewall, "a WAF is not part of haptic"),
    refused("modsecurity-endpoints", Firewall, "a WAF is not part of haptic"),
    refused("config-proxy", Snippet, "raw proxy configuration: use haptic.dev/backend-config-snippet"),
    refused("path-type", Routing, "haproxy-ingress's path types (regex, begin) are not implemented"),
    ignored("blue-green-balance", "blue-green deployments by Pod labels are not implemented"),
    ignored("blue-green-cookie", "blue-green deployments by Pod labels are not implemented"),
    ignored("blue-green-deploy", "blue-green deployments by Pod labels are not implemented"),
    ignored("blue-green-header", "blue-green deployments by Pod labels are not implemented"),
    ignored("blue-green-mode", "blue-green deployments by Pod labels are not implemented"),
    ignored("agent-check-port", "agent checks are not done"),
    ignored("agent-check-addr", "agent checks are not done"),
    ignored("agent-check-interval", "agent checks are not done"),
    ignored("agent-check-send", "agent checks are not done"),
    ignored("initial-weight", "servers are weighed alike"),
    ignored("redirect-from", "redirects from other hosts are not implemented"),
    ignored("redirect-from-regex", "redirects from other hosts are not implemented"),
    ignored("session-cookie-keywords", "the cookie's keywords are haptic's"),
    ignored("session-cookie-preserve", "the cookie's keywords are haptic's"),
    ignored("session-cookie-shared", "the cookie's keywords are haptic's"),
    ignored("session-cookie-strategy", "the cookie is inserted"),
    ignored("session-cookie-value-strategy", "the cookie names its server by a hash of its address"),
    ignored("session-cookie-dynamic", "the cookie is always dynamic"),
    ignored("maxconn-server", "servers take connections without a limit"),
    ignored("proxy-protocol", "the servers are not spoken to with the PROXY protocol"),
    ignored("dynamic-scaling", "servers are always added at run time"),
    ignored("slots-min-free", "server slots: the chart's haproxy.serverSlots"),
    ignored("ssl-ciphers", "HAProxy's TLS settings are global"),
    ignored("ssl-cipher-suites", "HAProxy's TLS settings are global"),
    ignored("ssl-options", "HAProxy's TLS settings are global"),
    ignored("ssl-passthrough-http-port", "plain HTTP to a passthrough host is not routed"),
    ignored("bandwidth-limit", "bandwidth limits are not implemented"),
    ignored("use-htx", "HTX is HAProxy's only mode"),
];

/// haproxytech's annotations haptic does not read (`haproxy.org/`, `haproxy.com/`, and its
/// legacy `ingress.kubernetes.io/`).
static HAPROXYTECH: &[Unsupported] = &[
    ignored("send-proxy-protocol", "the servers are not spoken to with the PROXY protocol"),
    ignored("src-ip-header", "the client address comes from the connection (or the PROXY protocol)"),
    ignored("forwarded-for", "X-Forwarded-For is always set"),
    ignored("pod-maxconn", "servers take connections without a limit"),
    ignored("request-capture", "requests are not captured"),
    ignored("request-capture-len", "requests are not captured"),
    ignored("scale-server-slots", "server slots: the chart's haproxy.serverSlots"),
    ignored("standalone-backend", "an Ingress with settings always has backends of its own"),
    ignored("route-acl", "ACL routing is not implemented"),
    ignored("timeout-check", "health checks time out with the server's connect timeout"),
    ignored("rate-limit-size", "the rate limit table holds 100k clients"),
    ignored("cookie-persistence-no-dynamic", "the cookie is always dynamic"),
    ignored("quic-alt-svc-max-age", "QUIC is not served"),
    ignored("client-strict-sni", "the default certificate answers unknown names"),
    ignored("tls-alpn", "ALPN is the chart's"),
];

/// The known controllers' prefixes, each with what it does not read there (haptic's own
/// prefix has no such list: an unknown name under it is a typo).
static PREFIXES: &[(&str, &[&[Unsupported]])] = &[
    (nginx::PREFIX, &[NGINX]),
    ("haproxy-ingress.github.io/", &[HAPROXY_INGRESS]),
    ("ingress.kubernetes.io/", &[HAPROXY_INGRESS, HAPROXYTECH]),
    ("haproxy.org/", &[HAPROXYTECH]),
    ("haproxy.com/", &[HAPROXYTECH]),
    ("haptic.dev/", &[]),
];

/// Whether a value turns a switch off (`false`, `off`, `no`, `0`).
fn is_off(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "false" | "off" | "no" | "0" | "")
}

/// What haptic does with the annotation `name` set to `value`.
pub fn verdict(name: &str, value: &str) -> Verdict {
    if let Some(key) = super::setting_of(name) {
        return Verdict::Read(key);
    }
    let Some((prefix, lists)) = PREFIXES.iter().find(|(prefix, _)| name.starts_with(prefix)) else {
        return Verdict::NotOurs;
    };
    let key = &name[prefix.len()..];
    let Some(found) = lists.iter().flat_map(|list| list.iter()).find(|unsupported| unsupported.key == key) else {
        return Verdict::Unknown;
    };
    match found.refuses {
        Some(_) if found.switch && is_off(value) => Verdict::Ignored("turned off"),
        Some(protection) => Verdict::Refused(protection, found.note),
        None => Verdict::Ignored(found.note),
    }
}

/// Every annotation of known controllers haptic does not read, as a Markdown table
/// (docs/annotations.md holds exactly this).
#[cfg(test)]
pub(super) fn markdown_table() -> String {
    let mut table = String::from("| Annotation | haptic | Why |\n|---|---|---|\n");
    for (prefix, lists) in PREFIXES.iter().filter(|(prefix, _)| *prefix != "ingress.kubernetes.io/") {
        for unsupported in lists.iter().flat_map(|list| list.iter()) {
            let verdict = match unsupported.refuses {
                Some(protection) if unsupported.switch => format!("refused when on ({})", protection.describe()),
                Some(protection) => format!("refused ({})", protection.describe()),
                None => "ignored, with a Warning".to_owned(),
            };
            table.push_str(&format!("| `{prefix}{}` | {verdict} | {} |\n", unsupported.key, unsupported.note));
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_annotations_md_lists_every_annotation_haptic_does_not_read() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/annotations.md"))
            .expect("docs/annotations.md");
        let table = markdown_table();
        assert!(doc.contains(&table), "docs/annotations.md must hold this table (regenerate it):\n{table}");
    }

    #[test]
    fn protections_haptic_lacks_refuse_and_the_rest_are_ignored_or_read() {
        let nginx = |key: &str| format!("{}{key}", nginx::PREFIX);
        assert_eq!(verdict(&nginx("auth-url"), "http://auth"), Verdict::Read("auth-url"));
        assert_eq!(verdict(&nginx("auth-tls-verify-client"), "on"), Verdict::Read("auth-tls-verify-client"));
        let strict = "haproxy-ingress.github.io/auth-tls-strict";
        assert!(matches!(verdict(strict, "true"), Verdict::Refused(ClientCertificates, _)));
        assert!(matches!(verdict(strict, "false"), Verdict::Ignored(_)));
        assert!(matches!(verdict(&nginx("enable-modsecurity"), "true"), Verdict::Refused(Firewall, _)));
        assert!(matches!(verdict(&nginx("enable-modsecurity"), "false"), Verdict::Ignored(_)));
        assert!(matches!(verdict(&nginx("global-rate-limit"), "10"), Verdict::Refused(RateLimit, _)));
        assert!(matches!(verdict(&nginx("configuration-snippet"), "deny all;"), Verdict::Refused(Snippet, _)));
        assert_eq!(verdict(&nginx("canary"), "true"), Verdict::Read("canary"));
        assert_eq!(verdict(&nginx("whitelist-source-range"), "10.0.0.0/8"), Verdict::Read("allow-list"));
        assert_eq!(verdict(&nginx("limit-rps"), "5"), Verdict::Read("rate-limit-rps"));
        assert!(matches!(verdict(&nginx("proxy-buffering"), "on"), Verdict::Ignored(_)));
        assert_eq!(verdict(&nginx("no-such-thing"), "x"), Verdict::Unknown);
        assert_eq!(verdict("haptic.dev/timeout-sever", "1s"), Verdict::Unknown);
        assert!(matches!(
            verdict("haproxy-ingress.github.io/oauth", "oauth2_proxy"),
            Verdict::Refused(Authentication, _)
        ));
        assert!(matches!(verdict("ingress.kubernetes.io/waf", "modsecurity"), Verdict::Refused(Firewall, _)));
        assert_eq!(verdict("haproxy.org/client-ca", "ns/ca"), Verdict::Read("auth-tls-secret"));
        assert!(matches!(
            verdict("haproxy-ingress.github.io/auth-tls-strict", "true"),
            Verdict::Refused(ClientCertificates, _)
        ));
        assert_eq!(verdict("kubectl.kubernetes.io/last-applied-configuration", "{}"), Verdict::NotOurs);
        assert_eq!(verdict("kubernetes.io/ingress.class", "haptic"), Verdict::NotOurs);
    }

    #[test]
    fn no_annotation_is_both_read_and_listed_as_unsupported() {
        for (prefix, lists) in PREFIXES {
            for unsupported in lists.iter().flat_map(|list| list.iter()) {
                let name = format!("{prefix}{}", unsupported.key);
                // `ingress.kubernetes.io/` is both peers' legacy prefix: one's unsupported
                // name may be the other's setting.
                if *prefix != "ingress.kubernetes.io/" {
                    assert!(super::super::setting_of(&name).is_none(), "{name} is read and listed as unsupported");
                }
            }
        }
    }
}
