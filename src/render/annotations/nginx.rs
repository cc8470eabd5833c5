//! ingress-nginx's names for the library's settings (`nginx.ingress.kubernetes.io/<name>`), and
//! its value formats turned into the library's own before the value is checked: a timeout of
//! `60` is sixty seconds there (HAProxy would read milliseconds), `HTTPS` is a backend protocol,
//! `round_robin` a balance algorithm.

use std::borrow::Cow;

/// ingress-nginx's annotation prefix.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// Each setting's names under [`PREFIX`], in precedence order (the first set wins).
pub(super) static NAMES: &[(&str, &[&str])] = &[
    ("ssl-passthrough", &["ssl-passthrough"]),
    ("ssl-redirect", &["ssl-redirect"]),
    ("force-ssl-redirect", &["force-ssl-redirect"]),
    ("backend-protocol", &["backend-protocol"]),
    ("server-ca", &["proxy-ssl-secret"]),
    ("server-verify", &["proxy-ssl-verify"]),
    ("server-verify-hostname", &["proxy-ssl-name"]),
    ("server-sni", &["proxy-ssl-server-name"]),
    ("load-balance", &["load-balance"]),
    ("hash-by", &["upstream-hash-by"]),
    ("affinity", &["affinity"]),
    ("session-cookie-name", &["session-cookie-name"]),
    ("session-cookie-max-age", &["session-cookie-max-age", "session-cookie-expires"]),
    ("session-cookie-samesite", &["session-cookie-samesite"]),
    ("session-cookie-secure", &["session-cookie-secure"]),
    ("session-cookie-domain", &["session-cookie-domain"]),
    ("timeout-connect", &["proxy-connect-timeout"]),
    ("timeout-server", &["proxy-read-timeout", "proxy-send-timeout"]),
    ("rate-limit-rps", &["limit-rps"]),
    ("rate-limit-rpm", &["limit-rpm"]),
    ("rate-limit-burst", &["limit-burst-multiplier"]),
    ("rate-limit-connections", &["limit-connections"]),
    ("rate-limit-exempt", &["limit-allowlist", "limit-whitelist"]),
    ("allow-list", &["whitelist-source-range", "allowlist-source-range"]),
    ("deny-list", &["denylist-source-range"]),
    ("auth-url", &["auth-url"]),
    ("auth-method", &["auth-method"]),
    ("auth-signin", &["auth-signin"]),
    ("auth-signin-redirect-param", &["auth-signin-redirect-param"]),
    ("auth-response-headers", &["auth-response-headers"]),
    ("auth-tls-secret", &["auth-tls-secret"]),
    ("auth-tls-verify-client", &["auth-tls-verify-client"]),
    ("auth-tls-verify-depth", &["auth-tls-verify-depth"]),
    ("auth-tls-pass-certificate", &["auth-tls-pass-certificate-to-upstream"]),
    ("auth-tls-error-page", &["auth-tls-error-page"]),
    ("auth-tls-match-cn", &["auth-tls-match-cn"]),
    ("auth-type", &["auth-type"]),
    ("auth-secret", &["auth-secret"]),
    ("auth-secret-type", &["auth-secret-type"]),
    ("auth-realm", &["auth-realm"]),
    ("cors-enable", &["enable-cors"]),
    ("cors-allow-origin", &["cors-allow-origin"]),
    ("cors-allow-methods", &["cors-allow-methods"]),
    ("cors-allow-headers", &["cors-allow-headers"]),
    ("cors-allow-credentials", &["cors-allow-credentials"]),
    ("cors-max-age", &["cors-max-age"]),
    ("cors-expose-headers", &["cors-expose-headers"]),
    ("set-host", &["upstream-vhost"]),
    ("x-forwarded-prefix", &["x-forwarded-prefix"]),
    ("redirect-to", &["permanent-redirect", "temporal-redirect"]),
    ("redirect-code", &["permanent-redirect-code", "temporal-redirect-code"]),
    ("proxy-body-size", &["proxy-body-size"]),
    ("app-root", &["app-root"]),
    ("default-backend", &["default-backend"]),
    ("custom-http-errors", &["custom-http-errors"]),
    ("canary", &["canary"]),
    ("canary-by-header", &["canary-by-header"]),
    ("canary-by-header-value", &["canary-by-header-value"]),
    ("canary-by-header-pattern", &["canary-by-header-pattern"]),
    ("canary-by-cookie", &["canary-by-cookie"]),
    ("canary-weight", &["canary-weight"]),
    ("canary-weight-total", &["canary-weight-total"]),
    ("use-regex", &["use-regex"]),
    ("regex-rewrite-target", &["rewrite-target"]),
    ("from-to-www-redirect", &["from-to-www-redirect"]),
    ("server-alias", &["server-alias"]),
    ("service-upstream", &["service-upstream"]),
];

/// The names of the setting `key` under [`PREFIX`].
pub(super) fn names(key: &str) -> &'static [&'static str] {
    NAMES.iter().find(|(setting, _)| *setting == key).map(|(_, names)| *names).unwrap_or_default()
}

/// `value`, as ingress-nginx writes it for the setting `key`, in the library's own format; an
/// error (naming what ingress-nginx allows haptic does not) for a value haptic cannot serve.
pub(super) fn convert<'a>(key: &str, value: &'a str) -> Result<Cow<'a, str>, String> {
    let trimmed = value.trim();
    Ok(match key {
        // Unitless timeouts are seconds in ingress-nginx.
        "timeout-connect" | "timeout-server" if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) => {
            Cow::Owned(format!("{trimmed}s"))
        }
        "backend-protocol" => Cow::Borrowed(match trimmed.to_ascii_uppercase().as_str() {
            "HTTP" | "AUTO_HTTP" => "h1",
            "HTTPS" => "h1-ssl",
            "GRPC" => "grpc",
            "GRPCS" => "grpcs",
            "H2C" => "h2c",
            "AJP" | "FCGI" => {
                return Err(format!(
                    "backend protocol {trimmed} is not one haptic speaks (HTTP, HTTPS, GRPC, GRPCS, H2C)"
                ));
            }
            _ => return Err("the value is not one of HTTP, HTTPS, GRPC, GRPCS, H2C".into()),
        }),
        "load-balance" => Cow::Borrowed(match trimmed.to_ascii_lowercase().as_str() {
            "round_robin" => "roundrobin",
            // The fewest requests in flight is what EWMA's lowest latency approximates.
            "ewma" => "leastconn",
            _ => return Err("the value is not round_robin or ewma".into()),
        }),
        "auth-type" if trimmed.eq_ignore_ascii_case("digest") => {
            return Err("digest authentication is not supported (only basic)".into());
        }
        _ => Cow::Borrowed(value),
    })
}

/// Where haptic serves an ingress-nginx annotation close to, but not exactly as, ingress-nginx
/// does: what differs (`key` is the name without the prefix).
pub(super) fn conversion_note(key: &str, value: &str) -> Option<&'static str> {
    Some(match key {
        "load-balance" if value.trim().eq_ignore_ascii_case("ewma") => {
            "EWMA is served as leastconn (fewest requests in flight)"
        }
        "limit-rps" | "limit-rpm" => {
            "a window of burst-multiplier seconds (minutes) admitting that many times the rate, counted by the HAProxy pods together (ingress-nginx counts per pod)"
        }
        "limit-connections" => "counted per pod",
        "proxy-send-timeout" => "HAProxy's one server timeout covers reading and sending",
        "session-cookie-expires" => "served as the cookie's Max-Age",
        "upstream-hash-by" => "HAProxy's consistent hash of the same request parts",
        "cors-allow-origin" if value.contains('*') && value.trim() != "*" => "a wildcard origin matches one label",
        "auth-tls-verify-depth" => "HAProxy verifies the whole chain to the CA",
        "auth-tls-pass-certificate-to-upstream" => "the PEM's base64 on one line",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingress_nginx_formats_become_the_librarys() {
        assert_eq!(convert("timeout-server", "60").unwrap(), "60s");
        assert_eq!(convert("timeout-server", "2m").unwrap(), "2m");
        assert_eq!(convert("backend-protocol", "HTTPS").unwrap(), "h1-ssl");
        assert_eq!(convert("backend-protocol", "grpc").unwrap(), "grpc");
        assert!(convert("backend-protocol", "FCGI").unwrap_err().contains("FCGI"));
        assert_eq!(convert("load-balance", "ewma").unwrap(), "leastconn");
        assert!(convert("auth-type", "digest").unwrap_err().contains("digest"));
        assert_eq!(convert("auth-type", "basic").unwrap(), "basic");
    }

    #[test]
    fn every_name_is_a_setting() {
        for (key, _) in NAMES {
            assert!(super::super::SETTINGS.iter().any(|setting| setting.key == *key), "{key}");
        }
    }
}
