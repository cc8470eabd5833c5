//! The Ingress annotations the default library understands, read under haptic's own name and
//! under the names the peers give the same setting, each checked for its kind before any
//! template sees it (`ingress_settings(ingress)`).
//!
//! Precedence, when several names of one setting are set on an Ingress: `haptic.dev/` first,
//! then haproxy-ingress's (`haproxy-ingress.github.io/`, then its legacy
//! `ingress.kubernetes.io/`), then haproxytech's (`haproxy.org/`, `haproxy.com/`, then its
//! legacy `ingress.kubernetes.io/`). Within one controller's set, names are tried in the order
//! the table gives them. The first name set wins; the others are not read.
//!
//! A value that does not fit its kind refuses the Ingress (the render leaves it out and the
//! controller says which annotation, without quoting the value). Values come back ready to
//! print: words and numbers bare, text quoted for HAProxy with every `%` doubled.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

pub mod foreign;
pub mod nginx;
mod values;

use super::filters;
pub(crate) use values::Kind;
use values::check;

/// One setting: its name in templates, its kind, and its annotation names by controller.
#[derive(Debug)]
pub(crate) struct Setting {
    /// The key templates read (`settings["timeout-server"]`).
    pub(crate) key: &'static str,
    /// What its value must be.
    pub(crate) kind: Kind,
    /// Its name under `haptic.dev/`, when haptic has one.
    pub(crate) haptic: Option<&'static str>,
    /// Its names in haproxy-ingress (`haproxy-ingress.github.io/` or `ingress.kubernetes.io/`).
    pub(crate) haproxy_ingress: &'static [&'static str],
    /// Its names in haproxytech's controller (`haproxy.org/`, `haproxy.com/`, `ingress.kubernetes.io/`).
    pub(crate) haproxytech: &'static [&'static str],
}

const fn setting(
    key: &'static str,
    kind: Kind,
    haptic: Option<&'static str>,
    haproxy_ingress: &'static [&'static str],
    haproxytech: &'static [&'static str],
) -> Setting {
    Setting { key, kind, haptic, haproxy_ingress, haproxytech }
}

const REDIRECT_CODES: &[u16] = &[301, 302, 303, 307, 308];
const ERROR_CODES: &[u16] = &[400, 403, 404, 405, 408, 410, 429, 500, 502, 503, 504];

/// Every setting the default library reads, in the order its documentation lists them.
pub(crate) static SETTINGS: &[Setting] = &[
    setting("ssl-passthrough", Kind::Bool, Some("ssl-passthrough"), &["ssl-passthrough"], &["ssl-passthrough"]),
    setting("ssl-redirect", Kind::Bool, Some("ssl-redirect"), &["ssl-redirect"], &["ssl-redirect"]),
    setting("force-ssl-redirect", Kind::Bool, Some("force-ssl-redirect"), &[], &[]),
    setting(
        "ssl-redirect-code",
        Kind::Status(REDIRECT_CODES),
        Some("ssl-redirect-code"),
        &["ssl-redirect-code"],
        &["ssl-redirect-code"],
    ),
    setting("hsts", Kind::Bool, Some("hsts"), &["hsts"], &[]),
    setting("hsts-max-age", Kind::Count(1 << 31), Some("hsts-max-age"), &["hsts-max-age"], &[]),
    setting("hsts-include-subdomains", Kind::Bool, Some("hsts-include-subdomains"), &["hsts-include-subdomains"], &[]),
    setting("hsts-preload", Kind::Bool, Some("hsts-preload"), &["hsts-preload"], &[]),
    setting(
        "backend-protocol",
        Kind::OneOf(&["h1", "h2", "h2c", "h1-ssl", "h2-ssl", "grpc", "grpcs"]),
        Some("backend-protocol"),
        &["backend-protocol"],
        &[],
    ),
    setting("server-ssl", Kind::Bool, Some("server-ssl"), &["secure-backends"], &["server-ssl"]),
    setting("server-proto", Kind::OneOf(&["h2"]), None, &[], &["server-proto"]),
    setting("server-ca", Kind::SecretName, Some("server-ca-secret"), &["secure-verify-ca-secret"], &["server-ca"]),
    setting("server-crt", Kind::SecretName, Some("server-crt-secret"), &["secure-crt-secret"], &["server-crt"]),
    setting("server-verify", Kind::Bool, Some("server-verify"), &[], &[]),
    setting("server-verify-hostname", Kind::HostPort, Some("server-verify-hostname"), &["secure-verify-hostname"], &[]),
    setting("server-sni", Kind::Bool, Some("server-sni"), &[], &[]),
    setting(
        "load-balance",
        Kind::OneOf(&["roundrobin", "leastconn", "source", "first", "random", "static-rr"]),
        Some("load-balance"),
        &["balance-algorithm"],
        &["load-balance"],
    ),
    setting("hash-by", Kind::HashBy, Some("hash-by"), &[], &[]),
    setting("affinity", Kind::OneOf(&["cookie"]), Some("affinity"), &["affinity"], &[]),
    setting(
        "session-cookie-name",
        Kind::Token,
        Some("session-cookie-name"),
        &["session-cookie-name"],
        &["cookie-persistence"],
    ),
    setting("session-cookie-max-age", Kind::Seconds, Some("session-cookie-max-age"), &[], &[]),
    setting(
        "session-cookie-samesite",
        Kind::OneOf(&["none", "lax", "strict"]),
        Some("session-cookie-samesite"),
        &["session-cookie-samesite"],
        &[],
    ),
    setting("session-cookie-secure", Kind::Bool, Some("session-cookie-secure"), &[], &[]),
    setting("session-cookie-domain", Kind::HostPort, Some("session-cookie-domain"), &["session-cookie-domain"], &[]),
    setting("timeout-connect", Kind::Duration, Some("timeout-connect"), &["timeout-connect"], &["timeout-connect"]),
    setting("timeout-server", Kind::Duration, Some("timeout-server"), &["timeout-server"], &["timeout-server"]),
    setting("timeout-tunnel", Kind::Duration, Some("timeout-tunnel"), &["timeout-tunnel"], &["timeout-tunnel"]),
    setting("timeout-queue", Kind::Duration, Some("timeout-queue"), &["timeout-queue"], &["timeout-queue"]),
    setting("health-check", Kind::Bool, Some("health-check"), &[], &["check"]),
    setting("health-check-uri", Kind::Path, Some("health-check-uri"), &["health-check-uri"], &["check-http"]),
    setting(
        "health-check-interval",
        Kind::Duration,
        Some("health-check-interval"),
        &["health-check-interval", "backend-check-interval"],
        &["check-interval"],
    ),
    setting("health-check-rise", Kind::Count(100), Some("health-check-rise-count"), &["health-check-rise-count"], &[]),
    setting("health-check-fall", Kind::Count(100), Some("health-check-fall-count"), &["health-check-fall-count"], &[]),
    setting("retries", Kind::Count(100), Some("retries"), &[], &[]),
    setting("rate-limit-rps", Kind::Count(1_000_000), Some("rate-limit-rps"), &["limit-rps"], &["rate-limit-requests"]),
    setting("rate-limit-rpm", Kind::Count(60_000_000), Some("rate-limit-rpm"), &[], &[]),
    setting("rate-limit-burst", Kind::Count(100), Some("rate-limit-burst-multiplier"), &[], &[]),
    setting("rate-limit-period", Kind::Duration, Some("rate-limit-period"), &[], &["rate-limit-period"]),
    setting(
        "rate-limit-status-code",
        Kind::Status(ERROR_CODES),
        Some("rate-limit-status-code"),
        &[],
        &["rate-limit-status-code"],
    ),
    setting(
        "rate-limit-connections",
        Kind::Count(1_000_000),
        Some("rate-limit-connections"),
        &["limit-connections"],
        &[],
    ),
    setting(
        "rate-limit-exempt",
        Kind::Cidrs,
        Some("rate-limit-exempt"),
        &["limit-whitelist"],
        &["rate-limit-whitelist"],
    ),
    setting(
        "allow-list",
        Kind::Cidrs,
        Some("allow-list"),
        &["allowlist-source-range", "whitelist-source-range"],
        &["allow-list", "whitelist"],
    ),
    setting("deny-list", Kind::Cidrs, Some("deny-list"), &["denylist-source-range"], &["deny-list", "blacklist"]),
    setting("auth-url", Kind::RequestUrl, Some("auth-url"), &["auth-url"], &[]),
    setting(
        "auth-method",
        Kind::OneOf(&["get", "post", "head", "put", "delete"]),
        Some("auth-method"),
        &["auth-method"],
        &[],
    ),
    setting("auth-signin", Kind::RequestUrl, Some("auth-signin"), &["auth-signin"], &[]),
    setting("auth-signin-redirect-param", Kind::Token, Some("auth-signin-redirect-param"), &[], &[]),
    setting("auth-response-headers", Kind::HeaderNames, Some("auth-response-headers"), &["auth-headers-succeed"], &[]),
    setting("auth-tls-secret", Kind::SecretName, Some("auth-tls-secret"), &["auth-tls-secret"], &["client-ca"]),
    setting(
        "auth-tls-verify-client",
        Kind::OneOf(&["on", "off", "optional", "optional_no_ca"]),
        Some("auth-tls-verify-client"),
        &["auth-tls-verify-client"],
        &[HAPROXYTECH_CLIENT_OPTIONAL],
    ),
    setting("auth-tls-verify-depth", Kind::Count(16), Some("auth-tls-verify-depth"), &[], &[]),
    setting("auth-tls-pass-certificate", Kind::Bool, Some("auth-tls-pass-certificate-to-upstream"), &[], &[]),
    setting("auth-tls-error-page", Kind::Url, Some("auth-tls-error-page"), &["auth-tls-error-page"], &[]),
    setting("auth-tls-match-cn", Kind::Regex, Some("auth-tls-match-cn"), &[], &[]),
    setting("auth-type", Kind::OneOf(&["basic", "basic-auth"]), Some("auth-type"), &["auth-type"], &["auth-type"]),
    setting("auth-secret", Kind::SecretName, Some("auth-secret"), &["auth-secret"], &["auth-secret"]),
    setting("auth-secret-type", Kind::OneOf(&["auth-file", "auth-map"]), Some("auth-secret-type"), &[], &[]),
    setting("auth-realm", Kind::Text, Some("auth-realm"), &["auth-realm"], &["auth-realm"]),
    setting("cors-enable", Kind::Bool, Some("cors-enable"), &["cors-enable"], &["cors-enable"]),
    setting(
        "cors-allow-origin",
        Kind::Origins,
        Some("cors-allow-origin"),
        &["cors-allow-origin"],
        &["cors-allow-origin"],
    ),
    setting(
        "cors-allow-methods",
        Kind::TokenList,
        Some("cors-allow-methods"),
        &["cors-allow-methods"],
        &["cors-allow-methods"],
    ),
    setting(
        "cors-allow-headers",
        Kind::TokenList,
        Some("cors-allow-headers"),
        &["cors-allow-headers"],
        &["cors-allow-headers"],
    ),
    setting(
        "cors-allow-credentials",
        Kind::Bool,
        Some("cors-allow-credentials"),
        &["cors-allow-credentials"],
        &["cors-allow-credentials"],
    ),
    setting("cors-max-age", Kind::Seconds, Some("cors-max-age"), &["cors-max-age"], &["cors-max-age"]),
    setting("cors-expose-headers", Kind::TokenList, Some("cors-expose-headers"), &["cors-expose-headers"], &[]),
    setting("request-set-header", Kind::Headers, Some("request-set-header"), &["headers"], &["request-set-header"]),
    setting("request-add-header", Kind::Headers, Some("request-add-header"), &[], &[]),
    setting("request-del-header", Kind::HeaderNames, Some("request-del-header"), &[], &[]),
    setting("response-set-header", Kind::Headers, Some("response-set-header"), &[], &["response-set-header"]),
    setting("response-add-header", Kind::Headers, Some("response-add-header"), &[], &[]),
    setting("response-del-header", Kind::HeaderNames, Some("response-del-header"), &[], &[]),
    setting("set-host", Kind::HostPort, Some("upstream-host"), &[], &["set-host"]),
    setting("x-forwarded-prefix", Kind::Path, Some("x-forwarded-prefix"), &[], &[]),
    setting("rewrite-target", Kind::Path, Some("rewrite-target"), &["rewrite-target"], &[]),
    setting("use-regex", Kind::Bool, Some("use-regex"), &[], &[]),
    setting("regex-rewrite-target", Kind::RegexTarget, Some("regex-rewrite-target"), &[], &[]),
    setting("path-rewrite", Kind::Rewrite, Some("path-rewrite"), &[], &["path-rewrite"]),
    setting("redirect-to", Kind::Url, Some("redirect-to"), &["redirect-to"], &[]),
    setting("redirect-host", Kind::HostPort, Some("redirect-host"), &[], &["request-redirect"]),
    setting("redirect-code", Kind::Status(REDIRECT_CODES), Some("redirect-code"), &[], &["request-redirect-code"]),
    setting("proxy-body-size", Kind::Size, Some("proxy-body-size"), &["proxy-body-size"], &[]),
    setting("app-root", Kind::Path, Some("app-root"), &["app-root"], &[]),
    setting("default-backend", Kind::ServiceName, Some("default-backend"), &[], &[]),
    setting("custom-http-errors", Kind::Statuses, Some("custom-http-errors"), &[], &[]),
    setting("canary", Kind::Bool, Some("canary"), &[], &[]),
    setting("canary-by-header", Kind::Token, Some("canary-by-header"), &[], &[]),
    setting("canary-by-header-value", Kind::Text, Some("canary-by-header-value"), &[], &[]),
    setting("canary-by-header-pattern", Kind::Regex, Some("canary-by-header-pattern"), &[], &[]),
    setting("canary-by-cookie", Kind::Token, Some("canary-by-cookie"), &[], &[]),
    setting("canary-weight", Kind::Weight(1_000_000), Some("canary-weight"), &[], &[]),
    setting("canary-weight-total", Kind::Count(1_000_000), Some("canary-weight-total"), &[], &[]),
    setting("from-to-www-redirect", Kind::Bool, Some("from-to-www-redirect"), &[], &[]),
    setting("server-alias", Kind::Hosts, Some("server-alias"), &["server-alias"], &[]),
    setting("service-upstream", Kind::Bool, Some("service-upstream"), &[], &[]),
    setting(
        "backend-snippet",
        Kind::Snippet,
        Some("backend-config-snippet"),
        &["config-backend"],
        &["backend-config-snippet"],
    ),
];

/// `ingress_settings(ingress, allow_snippets, class_parameters)`: the Ingress's settings, checked
/// (see [`read`]), with defaults from its class's parameters (a ConfigMap whose keys are the
/// settings' names without a prefix); every setting unset for `none` (a backend no Ingress owns).
pub(crate) fn ingress_settings(ingress: &Value, snippets: bool, class_parameters: &Value) -> Result<Value, Error> {
    if ingress.is_undefined() || ingress.is_none() {
        return Ok(NO_SETTINGS.clone());
    }
    let mut defaults = BTreeMap::new();
    if let Ok(data) = class_parameters.get_attr("data")
        && !data.is_undefined()
        && !data.is_none()
    {
        for key in data.try_iter().into_iter().flatten() {
            if let (Some(name), Ok(value)) = (key.as_str(), data.get_item(&key))
                && let Some(value) = value.as_str()
            {
                defaults.insert(name.to_owned(), value.to_owned());
            }
        }
    }
    let annotations = ingress
        .get_attr("metadata")
        .and_then(|metadata| metadata.get_attr("annotations"))
        .ok()
        .filter(|annotations| !annotations.is_undefined() && !annotations.is_none());
    let mut found = BTreeMap::new();
    if let Some(annotations) = annotations {
        for key in annotations.try_iter().into_iter().flatten() {
            let Some(name) = key.as_str() else { continue };
            if is_setting(name)
                && let Ok(value) = annotations.get_item(&key)
            {
                found.insert(name.to_owned(), value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string()));
            }
        }
    }
    if found.is_empty() && defaults.is_empty() {
        return Ok(NO_SETTINGS.clone());
    }
    read(&found, &defaults, snippets).map(Settings::into_value).map_err(AnnotationError::into_render_error)
}

/// Each setting's annotation names, in precedence order (index as in [`SETTINGS`]).
static SETTING_NAMES: LazyLock<Vec<Vec<String>>> = LazyLock::new(|| SETTINGS.iter().map(annotation_names).collect());

/// Every setting's annotation names at once, each with its setting's key, for the
/// per-annotation test on the routes' path.
static ALL_SETTING_NAMES: LazyLock<std::collections::HashMap<&'static str, &'static str>> = LazyLock::new(|| {
    SETTING_NAMES
        .iter()
        .zip(SETTINGS)
        .flat_map(|(names, setting)| names.iter().map(move |name| (name.as_str(), setting.key)))
        .collect()
});

/// The settings of an Ingress that sets none: every Ingress without the library's annotations
/// (most of them) shares this one value instead of building its own.
static NO_SETTINGS: LazyLock<Value> = LazyLock::new(|| Settings::default().into_value());

/// The annotation names of the setting `key`, in precedence order (none for an unknown key).
pub(crate) fn names_of(key: &str) -> &'static [String] {
    SETTINGS
        .iter()
        .position(|setting| setting.key == key)
        .map(|index| SETTING_NAMES[index].as_slice())
        .unwrap_or_default()
}

/// The annotation names of one setting, in precedence order.
pub(crate) fn annotation_names(setting: &Setting) -> Vec<String> {
    let mut names: Vec<String> = setting.haptic.iter().map(|key| format!("haptic.dev/{key}")).collect();
    for key in setting.haproxy_ingress {
        names.push(format!("haproxy-ingress.github.io/{key}"));
        names.push(format!("ingress.kubernetes.io/{key}"));
    }
    for key in setting.haproxytech {
        names.push(format!("haproxy.org/{key}"));
        names.push(format!("haproxy.com/{key}"));
        names.push(format!("ingress.kubernetes.io/{key}"));
    }
    for key in nginx::names(setting.key) {
        names.push(format!("{}{key}", nginx::PREFIX));
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    names
}

/// Whether an annotation name is one the library reads (so its Ingress needs backends of its own).
pub(crate) fn is_setting(name: &str) -> bool {
    ALL_SETTING_NAMES.contains_key(name)
}

/// The key of the setting the annotation `name` sets, if it is one.
pub(crate) fn setting_of(name: &str) -> Option<&'static str> {
    ALL_SETTING_NAMES.get(name).copied()
}

/// What haptic makes of one annotation, for people deciding a move (`haptic migrate-check`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Judgement {
    /// The verdict.
    pub outcome: Outcome,
    /// The setting it sets, when it is read.
    pub setting: Option<&'static str>,
    /// Why, or what differs.
    pub detail: String,
}

/// The verdict on one annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Read, and served as its controller serves it.
    Same,
    /// Read, and served close to how its controller serves it (`detail` says what differs).
    Converted,
    /// Not an annotation: a default of the other controller's that haptic does not share
    /// (`detail` says which annotation keeps it).
    Differs,
    /// Not implemented; the Ingress is served without it, with a Warning.
    Ignored,
    /// Under a known controller's prefix, but unknown; served without it, with a Warning.
    Unknown,
    /// The Ingress is not served while it carries this annotation (or this value).
    Refused,
}

/// What haptic makes of the annotation `name` set to `value` (none for another prefix's);
/// `snippets` says whether the configuration allows raw snippets.
pub fn judge(name: &str, value: &str, snippets: bool) -> Option<Judgement> {
    let judgement = |outcome, setting, detail: String| Some(Judgement { outcome, setting, detail });
    match foreign::verdict(name, value) {
        foreign::Verdict::NotOurs => None,
        foreign::Verdict::Read(key) => {
            let one = BTreeMap::from([(name.to_owned(), value.to_owned())]);
            if let Err(error) = read(&one, &BTreeMap::new(), snippets) {
                return judgement(Outcome::Refused, Some(key), error.why);
            }
            match name.strip_prefix(nginx::PREFIX).and_then(|nginx_key| nginx::conversion_note(nginx_key, value)) {
                Some(note) => judgement(Outcome::Converted, Some(key), note.to_owned()),
                None => judgement(Outcome::Same, Some(key), String::new()),
            }
        }
        foreign::Verdict::Refused(protection, note) => {
            judgement(Outcome::Refused, None, format!("{}: {note}", protection.describe()))
        }
        foreign::Verdict::Ignored(note) => judgement(Outcome::Ignored, None, note.to_owned()),
        foreign::Verdict::Unknown => judgement(Outcome::Unknown, None, "no controller haptic knows has it".into()),
    }
}

/// The Ingress's annotations (a template value) as name and text.
fn each_annotation(annotations: &Value) -> impl Iterator<Item = (String, String)> + '_ {
    annotations.try_iter().into_iter().flatten().filter_map(|key| {
        let name = key.as_str()?.to_owned();
        let value = annotations.get_item(&key).ok()?;
        Some((name, value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string())))
    })
}

/// Refuses an Ingress whose annotations ask for something haptic does not do and must not
/// serve without (`foreign::Verdict::Refused`): the first such annotation, and why.
pub(crate) fn refuse_unsupported(annotations: &Value) -> Result<(), AnnotationError> {
    for (name, value) in each_annotation(annotations) {
        if let foreign::Verdict::Refused(protection, note) = foreign::verdict(&name, &value) {
            return Err(AnnotationError {
                why: format!(
                    "haptic does not implement it ({note}), and will not serve the Ingress without {}",
                    protection.describe()
                ),
                name,
            });
        }
    }
    Ok(())
}

/// The annotations of known controllers the Ingress is served without, each with why (for a
/// Warning): those haptic ignores, and names under a controller's prefix it does not know.
pub(crate) fn ignored_annotations(annotations: &Value) -> Vec<(String, String)> {
    each_annotation(annotations)
        .filter_map(|(name, value)| match foreign::verdict(&name, &value) {
            foreign::Verdict::Ignored(note) => Some((name, format!("not implemented: {note}"))),
            foreign::Verdict::Unknown => Some((name, "not an annotation haptic knows (a typo?)".to_owned())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
impl Kind {
    /// The kind in words, for the documentation.
    fn describe(self) -> String {
        match self {
            Kind::Bool => "true / false".into(),
            Kind::Duration => "HAProxy time (`30s`, `500ms`)".into(),
            Kind::Seconds => "seconds, or a time (`1h`)".into(),
            Kind::Count(bound) => format!("1 to {bound}"),
            Kind::Weight(bound) => format!("0 to {bound}"),
            Kind::Regex => "a regular expression".into(),
            Kind::RegexTarget => "a URL path; `$1`..`$9` are the path's groups".into(),
            Kind::Status(codes) => codes.iter().map(u16::to_string).collect::<Vec<_>>().join(", "),
            Kind::OneOf(words) => words.join(", "),
            Kind::Cidrs => "addresses and networks, comma-separated".into(),
            Kind::SecretName => "a Secret of the Ingress's namespace".into(),
            Kind::Token => "a cookie name".into(),
            Kind::ServiceName => "a Service of the Ingress's namespace".into(),
            Kind::Statuses => "HTTP statuses 400 to 599, comma-separated".into(),
            Kind::Path => "a URL path (no `%`)".into(),
            Kind::Url => "an http(s) URL".into(),
            Kind::HostPort => "host[:port]".into(),
            Kind::Text => "text (no `%`)".into(),
            Kind::TokenList => "names, comma-separated, or `*`".into(),
            Kind::Headers => "`Name: value` or `Name value` lines".into(),
            Kind::HeaderNames => "header names, comma-separated".into(),
            Kind::Size => "bytes, `k`/`m`/`g` suffix, or `unlimited`".into(),
            Kind::Rewrite => "`replacement` or `regex replacement`".into(),
            Kind::Snippet => "HAProxy lines for the backend (only with `allowSnippets`)".into(),
            Kind::HashBy => {
                "nginx variables (`$request_uri`, `$remote_addr`, `$http_<name>`, `$cookie_<name>`, `$arg_<name>`)"
                    .into()
            }
            Kind::Hosts => "host names, comma-separated".into(),
            Kind::RequestUrl => {
                "an http(s) URL; `$host`, `$scheme`, `$request_uri`, `$escaped_request_uri` name the request's".into()
            }
            Kind::Origins => "`*`, or origins (`https://app.example`, `https://*.example.com`), comma-separated".into(),
        }
    }
}

/// The settings as a Markdown table (docs/annotations.md holds exactly this).
#[cfg(test)]
fn markdown_table() -> String {
    let mut table = String::from(
        "| Setting | Value | haptic.dev/ | haproxy-ingress (`haproxy-ingress.github.io/`, `ingress.kubernetes.io/`) | haproxytech (`haproxy.org/`, `haproxy.com/`, `ingress.kubernetes.io/`) | ingress-nginx (`nginx.ingress.kubernetes.io/`) |\n|---|---|---|---|---|---|\n",
    );
    let names = |keys: &[&str]| {
        if keys.is_empty() {
            "—".to_owned()
        } else {
            keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        }
    };
    for setting in SETTINGS {
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            setting.key,
            setting.kind.describe(),
            names(setting.haptic.as_slice()),
            names(setting.haproxy_ingress),
            names(setting.haproxytech),
            names(nginx::names(setting.key)),
        ));
    }
    table
}

/// What `ingress_settings` found: every setting set, checked, by key, and the annotation each
/// was read from.
#[derive(Debug, Default)]
pub(crate) struct Settings {
    values: BTreeMap<&'static str, Value>,
    sources: BTreeMap<&'static str, String>,
}

impl Settings {
    /// The template's view: a map of setting keys to values, with `sources` (key → annotation).
    pub(crate) fn into_value(self) -> Value {
        let any = !self.values.is_empty();
        // Every setting is a key, none when unset, so templates may compare and test any.
        let mut map: BTreeMap<String, Value> =
            SETTINGS.iter().map(|setting| (setting.key.to_owned(), Value::from(()))).collect();
        map.extend(self.values.into_iter().map(|(key, value)| (key.to_owned(), value)));
        let mut sources: BTreeMap<String, Value> =
            SETTINGS.iter().map(|setting| (setting.key.to_owned(), Value::from_safe_string(String::new()))).collect();
        sources.extend(self.sources.into_iter().map(|(key, name)| (key.to_owned(), Value::from_safe_string(name))));
        map.insert("sources".into(), Value::from(sources));
        // Whether anything is set: a backend without settings skips their template altogether.
        map.insert("any".into(), Value::from(any));
        Value::from(map)
    }
}

/// Reads every setting from `annotations` (name → value), first name in precedence order, else
/// from the class's `defaults` (the same names without a prefix, haptic's first).
/// `snippets` says whether the configuration allows raw snippets.
pub(crate) fn read(
    annotations: &BTreeMap<String, String>,
    defaults: &BTreeMap<String, String>,
    snippets: bool,
) -> Result<Settings, AnnotationError> {
    let mut settings = Settings::default();
    for (setting, names) in SETTINGS.iter().zip(SETTING_NAMES.iter()) {
        let annotated = names.iter().find_map(|name| annotations.get(name).map(|value| (name.clone(), value.clone())));
        let from_class = || {
            setting
                .haptic
                .iter()
                .chain(setting.haproxy_ingress)
                .chain(setting.haproxytech)
                .find_map(|key| defaults.get(*key).map(|value| (format!("{CLASS_PARAMETER}{key}"), value.clone())))
        };
        let Some((name, value)) = annotated.or_else(from_class) else {
            continue;
        };
        if matches!(setting.kind, Kind::Snippet) && !snippets {
            return Err(AnnotationError {
                name,
                why: "raw configuration snippets are off in this configuration (extraContext.allowSnippets)".into(),
            });
        }
        let refused = |why| AnnotationError { name: name.clone(), why };
        let value = match name.strip_prefix(nginx::PREFIX) {
            Some(_) => nginx::convert(setting.key, &value).map_err(refused)?.into_owned(),
            None if name.ends_with(HAPROXYTECH_CLIENT_OPTIONAL) => {
                client_certificate_optional(&value).map_err(refused)?
            }
            None => value,
        };
        let checked = check(setting.kind, &value).map_err(|why| AnnotationError { name: name.clone(), why })?;
        if let Some(checked) = checked {
            settings.values.insert(setting.key, checked);
            settings.sources.insert(setting.key, name);
        }
    }
    Ok(settings)
}

/// haptic's client-certificate modes from haproxytech's switch `client-crt-optional`.
fn client_certificate_optional(value: &str) -> Result<String, String> {
    match check(Kind::Bool, value)? {
        Some(optional) if optional.is_true() => Ok("optional".into()),
        _ => Ok("on".into()),
    }
}

/// haproxytech's name for a client certificate that may be missing (a switch, not a mode).
const HAPROXYTECH_CLIENT_OPTIONAL: &str = "client-crt-optional";

/// How a setting read from the class's parameters is named (in errors and `sources`).
const CLASS_PARAMETER: &str = "IngressClass parameter ";

/// An annotation whose value does not fit its setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {name}: {why}")]
pub(crate) struct AnnotationError {
    /// The annotation's name.
    pub(crate) name: String,
    /// What is wrong with its value (never the value itself).
    pub(crate) why: String,
}

impl AnnotationError {
    /// The render error for this refusal, blaming the annotation's field of the Ingress.
    pub(crate) fn into_render_error(self) -> Error {
        // A class parameter is the operator's and every Ingress of the class reads it: the
        // render fails (the pods keep the last good configuration) rather than leave them all out.
        if !self.name.starts_with(CLASS_PARAMETER) {
            super::context::blame_field(&format!("metadata.annotations[{:?}]", self.name));
        }
        Error::new(ErrorKind::InvalidOperation, self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn get(settings: &Settings, key: &str) -> Option<String> {
        settings.values.get(key).map(|v| v.to_string())
    }

    /// A list setting as plain strings, nested lists joined by `|`.
    fn strings(settings: &Settings, key: &str) -> Vec<String> {
        let value = &settings.values[key];
        value
            .try_iter()
            .expect("a list")
            .map(|item| match item.as_str() {
                Some(text) => text.to_owned(),
                None => item.try_iter().expect("a list").map(|part| part.to_string()).collect::<Vec<_>>().join("|"),
            })
            .collect()
    }

    #[test]
    fn haptics_own_name_wins_then_haproxy_ingress_then_haproxytech() {
        let read = |pairs| read(&annotations(pairs), &BTreeMap::new(), false).expect("valid");
        let all = read(&[
            ("haproxy.org/load-balance", "source"),
            ("haproxy-ingress.github.io/balance-algorithm", "leastconn"),
            ("haptic.dev/load-balance", "first"),
        ]);
        assert_eq!(get(&all, "load-balance").as_deref(), Some("first"));
        assert_eq!(all.sources["load-balance"], "haptic.dev/load-balance");
        let peers =
            read(&[("haproxy.org/load-balance", "source"), ("ingress.kubernetes.io/balance-algorithm", "leastconn")]);
        assert_eq!(get(&peers, "load-balance").as_deref(), Some("leastconn"));
        let haproxytech = read(&[("haproxy.com/load-balance", "Source")]);
        assert_eq!(get(&haproxytech, "load-balance").as_deref(), Some("source"));
    }

    #[test]
    fn a_value_that_does_not_fit_names_its_annotation_never_the_value() {
        for (name, value) in [
            ("haproxy.org/timeout-server", "30 s"),
            ("haptic.dev/allow-list", "10.0.0.0/8, evil"),
            ("haptic.dev/request-set-header", "X-A ok\nX-B\tbad%"),
            ("haproxy-ingress.github.io/rewrite-target", "/a b"),
            ("haptic.dev/redirect-to", "javascript:alert(1)"),
            ("haptic.dev/session-cookie-name", "a;b"),
            ("haptic.dev/ssl-redirect-code", "200"),
            ("haptic.dev/proxy-body-size", "ten"),
            ("haptic.dev/auth-secret", "../etc"),
        ] {
            let error = read(&annotations(&[(name, value)]), &BTreeMap::new(), false).expect_err(name);
            assert_eq!(error.name, name);
            assert!(!error.to_string().contains(value), "{error}");
        }
    }

    #[test]
    fn values_come_back_ready_to_print() {
        let settings = read(
            &annotations(&[
                ("haptic.dev/request-set-header", "X-Team: a'b %[src]\nX-Env prod"),
                ("haproxy.org/path-rewrite", "^/api/(.*) /\\1"),
                ("haptic.dev/proxy-body-size", "1m"),
                ("haproxy-ingress.github.io/cors-max-age", "1h"),
                ("haproxy-ingress.github.io/allowlist-source-range", "10.0.0.0/8, 192.0.2.1"),
                ("haptic.dev/redirect-to", "https://example.com/new?x=1"),
            ]),
            &BTreeMap::new(),
            false,
        )
        .expect("valid");
        assert_eq!(strings(&settings, "request-set-header"), [r"x-team|'a'\''b %%[src]'", "x-env|'prod'"]);
        assert_eq!(strings(&settings, "path-rewrite"), ["'^/api/(.*)'", r"'/\1'"]);
        assert_eq!(get(&settings, "proxy-body-size").as_deref(), Some("1048576"));
        assert_eq!(get(&settings, "cors-max-age").as_deref(), Some("3600"));
        assert_eq!(strings(&settings, "allow-list"), ["10.0.0.0/8", "192.0.2.1"]);
        assert_eq!(get(&settings, "redirect-to").as_deref(), Some("'https://example.com/new?x=1'"));
    }

    #[test]
    fn snippets_are_refused_unless_the_configuration_allows_them_and_never_open_a_section() {
        let snippet = annotations(&[("haproxy.org/backend-config-snippet", "http-request set-header X-A b\n")]);
        assert!(read(&snippet, &BTreeMap::new(), false).expect_err("off").why.contains("off"));
        assert!(read(&snippet, &BTreeMap::new(), true).is_ok());
        let escape =
            annotations(&[("haptic.dev/backend-config-snippet", "http-request deny\nfrontend evil\n  bind :1")]);
        assert!(read(&escape, &BTreeMap::new(), true).expect_err("section").why.contains("section"));
    }

    #[test]
    fn a_protection_haptic_lacks_refuses_the_ingress_and_the_rest_are_named() {
        let annotations = |pairs: &[(&str, &str)]| {
            Value::from(
                pairs.iter().map(|(name, value)| ((*name).to_owned(), Value::from(*value))).collect::<BTreeMap<_, _>>(),
            )
        };
        for name in [
            "haproxy-ingress.github.io/waf",
            "ingress.kubernetes.io/oauth",
            "nginx.ingress.kubernetes.io/enable-owasp-core-rules",
        ] {
            let error = refuse_unsupported(&annotations(&[("a/b", "c"), (name, "x")])).expect_err(name);
            assert_eq!(error.name, name);
        }
        let served = annotations(&[
            ("haproxy-ingress.github.io/maxconn-server", "10"),
            ("nginx.ingress.kubernetes.io/proxy-buffering", "on"),
            ("nginx.ingress.kubernetes.io/enable-modsecurity", "false"),
            ("nginx.ingress.kubernetes.io/limit-rps", "5"),
            ("haptic.dev/tiemout-server", "5s"),
            ("cert-manager.io/cluster-issuer", "letsencrypt"),
        ]);
        assert!(refuse_unsupported(&served).is_ok());
        let ignored: Vec<String> = ignored_annotations(&served).into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            ignored,
            [
                "haproxy-ingress.github.io/maxconn-server",
                "haptic.dev/tiemout-server",
                "nginx.ingress.kubernetes.io/enable-modsecurity",
                "nginx.ingress.kubernetes.io/proxy-buffering"
            ]
        );
    }

    #[test]
    fn error_pages_and_haproxytechs_client_certificates_read_as_the_peers_write_them() {
        let settings = read(
            &annotations(&[
                ("nginx.ingress.kubernetes.io/custom-http-errors", "503, 404,404"),
                ("nginx.ingress.kubernetes.io/default-backend", "error-pages"),
                ("haproxy.org/client-ca", "shop/client-ca"),
                ("haproxy.org/client-crt-optional", "true"),
            ]),
            &BTreeMap::new(),
            false,
        )
        .expect("valid");
        assert_eq!(get(&settings, "custom-http-errors").as_deref(), Some("[404, 503]"));
        assert_eq!(get(&settings, "default-backend").as_deref(), Some("error-pages"));
        assert_eq!(get(&settings, "auth-tls-secret").as_deref(), Some("shop/client-ca"));
        assert_eq!(get(&settings, "auth-tls-verify-client").as_deref(), Some("optional"));
        let strict = read(&annotations(&[("haproxy.org/client-crt-optional", "false")]), &BTreeMap::new(), false);
        assert_eq!(get(&strict.expect("valid"), "auth-tls-verify-client").as_deref(), Some("on"));
        for (name, value) in [
            ("nginx.ingress.kubernetes.io/custom-http-errors", "302"),
            ("nginx.ingress.kubernetes.io/custom-http-errors", "404;"),
            ("nginx.ingress.kubernetes.io/default-backend", "other/errors"),
            ("nginx.ingress.kubernetes.io/default-backend", "Errors"),
            ("haproxy.org/client-crt-optional", "maybe"),
        ] {
            let refused = read(&annotations(&[(name, value)]), &BTreeMap::new(), false).expect_err(value);
            assert_eq!(refused.name, name);
        }
    }

    #[test]
    fn class_parameters_are_defaults_and_an_ingress_annotation_wins() {
        let defaults = annotations(&[("balance-algorithm", "leastconn"), ("timeout-server", "30s")]);
        let own = read(&annotations(&[("haproxy.org/timeout-server", "5s")]), &defaults, false).expect("valid");
        assert_eq!(get(&own, "load-balance").as_deref(), Some("leastconn"));
        assert_eq!(own.sources["load-balance"], "IngressClass parameter balance-algorithm");
        assert_eq!(get(&own, "timeout-server").as_deref(), Some("5s"));
        let bad = read(&BTreeMap::new(), &annotations(&[("timeout-server", "soon")]), false).expect_err("bad default");
        assert_eq!(bad.name, "IngressClass parameter timeout-server");
    }

    #[test]
    fn unlimited_body_size_is_no_setting() {
        let settings =
            read(&annotations(&[("haproxy-ingress.github.io/proxy-body-size", "unlimited")]), &BTreeMap::new(), false)
                .expect("valid");
        assert!(get(&settings, "proxy-body-size").is_none());
    }

    #[test]
    fn docs_annotations_md_lists_every_setting_as_the_code_reads_it() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/annotations.md"))
            .expect("docs/annotations.md");
        let table = markdown_table();
        assert!(doc.contains(&table), "docs/annotations.md must hold this table (regenerate it):\n{table}");
    }

    #[test]
    fn every_annotation_name_belongs_to_one_setting() {
        let mut seen = std::collections::HashMap::new();
        for (index, name) in
            SETTING_NAMES.iter().enumerate().flat_map(|(index, names)| names.iter().map(move |name| (index, name)))
        {
            if let Some(other) = seen.insert(name.clone(), index) {
                panic!("{name} names both {} and {}", SETTINGS[other].key, SETTINGS[index].key);
            }
        }
        assert!(is_setting("haproxy.org/server-ssl") && !is_setting("haproxy.org/unknown"));
    }
}
