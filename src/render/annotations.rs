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

use super::filters;

/// What a setting's value must be.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// `true`/`false` (also `yes`/`no`, `on`/`off`, `1`/`0`).
    Bool,
    /// A HAProxy time (`30s`, `500ms`).
    Duration,
    /// A time in whole seconds (`86400`, or `1m`, `1h`), given as a number of seconds.
    Seconds,
    /// A whole number from 1 to the bound.
    Count(u64),
    /// One of these HTTP statuses.
    Status(&'static [u16]),
    /// One of these words (compared without case).
    OneOf(&'static [&'static str]),
    /// Comma-separated IP addresses and networks.
    Cidrs,
    /// A name of a Secret in the Ingress's namespace (`name`, or `namespace/name` naming it).
    SecretName,
    /// A cookie name (token characters).
    Token,
    /// A URL path.
    Path,
    /// An absolute http(s) URL.
    Url,
    /// A host name, optionally with `:port`.
    HostPort,
    /// Printable text (a realm, a CORS origin), quoted.
    Text,
    /// A comma-separated list of header names or methods (or `*`), quoted.
    TokenList,
    /// Header lines, `Name value` or `Name: value`, one per line.
    Headers,
    /// Header names, comma-separated or one per line.
    HeaderNames,
    /// A size in bytes with an optional `k`, `m` or `g` suffix (`unlimited` for none).
    Size,
    /// `replacement` or `regex replacement` (haproxytech's path-rewrite).
    Rewrite,
    /// Raw HAProxy lines for the Ingress's backend (only when the configuration allows them).
    Snippet,
}

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
    setting("server-verify-hostname", Kind::HostPort, Some("server-verify-hostname"), &["secure-verify-hostname"], &[]),
    setting(
        "load-balance",
        Kind::OneOf(&["roundrobin", "leastconn", "source", "first", "random", "static-rr"]),
        Some("load-balance"),
        &["balance-algorithm"],
        &["load-balance"],
    ),
    setting("affinity", Kind::OneOf(&["cookie"]), Some("affinity"), &["affinity"], &[]),
    setting(
        "session-cookie-name",
        Kind::Token,
        Some("session-cookie-name"),
        &["session-cookie-name"],
        &["cookie-persistence"],
    ),
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
        "allow-list",
        Kind::Cidrs,
        Some("allow-list"),
        &["allowlist-source-range", "whitelist-source-range"],
        &["allow-list", "whitelist"],
    ),
    setting("deny-list", Kind::Cidrs, Some("deny-list"), &["denylist-source-range"], &["deny-list", "blacklist"]),
    setting("auth-type", Kind::OneOf(&["basic", "basic-auth"]), Some("auth-type"), &["auth-type"], &["auth-type"]),
    setting("auth-secret", Kind::SecretName, Some("auth-secret"), &["auth-secret"], &["auth-secret"]),
    setting("auth-realm", Kind::Text, Some("auth-realm"), &["auth-realm"], &["auth-realm"]),
    setting("cors-enable", Kind::Bool, Some("cors-enable"), &["cors-enable"], &["cors-enable"]),
    setting("cors-allow-origin", Kind::Text, Some("cors-allow-origin"), &["cors-allow-origin"], &["cors-allow-origin"]),
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
    setting("rewrite-target", Kind::Path, Some("rewrite-target"), &["rewrite-target"], &[]),
    setting("path-rewrite", Kind::Rewrite, Some("path-rewrite"), &[], &["path-rewrite"]),
    setting("redirect-to", Kind::Url, Some("redirect-to"), &["redirect-to"], &[]),
    setting("redirect-host", Kind::HostPort, Some("redirect-host"), &[], &["request-redirect"]),
    setting("redirect-code", Kind::Status(REDIRECT_CODES), Some("redirect-code"), &[], &["request-redirect-code"]),
    setting("proxy-body-size", Kind::Size, Some("proxy-body-size"), &["proxy-body-size"], &[]),
    setting("app-root", Kind::Path, Some("app-root"), &["app-root"], &[]),
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
            if is_known(name)
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

/// Peers' annotations haptic does not support whose absence would leave an Ingress less protected
/// (or served other than asked) than its author meant: an Ingress carrying one is refused rather
/// than served without it.
const REFUSED_PEER_KEYS: &[&str] = &["auth-url", "oauth", "auth-tls-secret", "auth-tls-verify-client", "waf"];

/// The names of the ssl-passthrough setting, which decides where an Ingress's routes go (the TLS
/// frontend, not the HTTP maps) and so is read with the routes.
pub(crate) static PASSTHROUGH_NAMES: LazyLock<Vec<String>> = LazyLock::new(|| names_of("ssl-passthrough"));

/// The peers' prefixes, haproxy-ingress's then haproxytech's (`ingress.kubernetes.io/` is both's
/// legacy one).
const PEER_PREFIXES: [&str; 4] =
    ["haproxy-ingress.github.io/", "ingress.kubernetes.io/", "haproxy.org/", "haproxy.com/"];

/// Whether `name` is one of the peers' annotations that refuse an Ingress (see [`REFUSED_PEER_KEYS`]).
fn is_refused(name: &str) -> bool {
    PEER_PREFIXES.iter().filter_map(|prefix| name.strip_prefix(prefix)).any(|key| REFUSED_PEER_KEYS.contains(&key))
}

/// Each setting's annotation names, in precedence order (index as in [`SETTINGS`]).
static SETTING_NAMES: LazyLock<Vec<Vec<String>>> = LazyLock::new(|| SETTINGS.iter().map(annotation_names).collect());

/// Every setting's annotation names at once, for the per-annotation test on the routes' path.
static ALL_SETTING_NAMES: LazyLock<std::collections::HashSet<&'static str>> =
    LazyLock::new(|| SETTING_NAMES.iter().flatten().map(String::as_str).collect());

/// The settings of an Ingress that sets none: every Ingress without the library's annotations
/// (most of them) shares this one value instead of building its own.
static NO_SETTINGS: LazyLock<Value> = LazyLock::new(|| Settings::default().into_value());

/// The annotation names of the setting `key`, in precedence order (none for an unknown key).
pub(crate) fn names_of(key: &str) -> Vec<String> {
    SETTINGS.iter().position(|setting| setting.key == key).map(|index| SETTING_NAMES[index].clone()).unwrap_or_default()
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
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    names
}

/// Whether an annotation name is one the library reads (so its Ingress needs backends of its own).
pub(crate) fn is_setting(name: &str) -> bool {
    ALL_SETTING_NAMES.contains(name)
}

/// Whether `name` is an annotation the library reads at all (a setting's or a refused one).
fn is_known(name: &str) -> bool {
    is_setting(name) || is_refused(name)
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
            Kind::Status(codes) => codes.iter().map(u16::to_string).collect::<Vec<_>>().join(", "),
            Kind::OneOf(words) => words.join(", "),
            Kind::Cidrs => "addresses and networks, comma-separated".into(),
            Kind::SecretName => "a Secret of the Ingress's namespace".into(),
            Kind::Token => "a cookie name".into(),
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
        }
    }
}

/// The settings as a Markdown table (docs/annotations.md holds exactly this).
#[cfg(test)]
fn markdown_table() -> String {
    let mut table = String::from(
        "| Setting | Value | haptic.dev/ | haproxy-ingress (`haproxy-ingress.github.io/`, `ingress.kubernetes.io/`) | haproxytech (`haproxy.org/`, `haproxy.com/`, `ingress.kubernetes.io/`) |\n|---|---|---|---|---|\n",
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
            "| {} | {} | {} | {} | {} |\n",
            setting.key,
            setting.kind.describe(),
            names(setting.haptic.as_slice()),
            names(setting.haproxy_ingress),
            names(setting.haproxytech),
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
    if let Some(name) = annotations.keys().find(|name| is_refused(name)) {
        return Err(AnnotationError {
            name: name.clone(),
            why:
                "haptic does not support this annotation, and serving the Ingress without it would not be what it asks"
                    .into(),
        });
    }
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
        let checked = check(setting.kind, &value).map_err(|why| AnnotationError { name: name.clone(), why })?;
        if let Some(checked) = checked {
            settings.values.insert(setting.key, checked);
            settings.sources.insert(setting.key, name);
        }
    }
    Ok(settings)
}

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

fn safe(text: String) -> Value {
    Value::from_safe_string(text)
}

fn text_error(error: Error) -> String {
    error.detail().unwrap_or("the value does not fit").to_owned()
}

/// Checks one value of a kind; `None` when the value means "not set" (`unlimited`, say).
fn check(kind: Kind, raw: &str) -> Result<Option<Value>, String> {
    let value = raw.trim();
    if let Some(c) =
        filters::forbidden_char(value).filter(|_| !matches!(kind, Kind::Headers | Kind::HeaderNames | Kind::Snippet))
    {
        return Err(format!("the value holds {}", filters::describe(c)));
    }
    Ok(Some(match kind {
        Kind::Bool => Value::from(match value.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => true,
            "false" | "no" | "off" | "0" => false,
            _ => return Err("the value is not true or false".into()),
        }),
        Kind::Duration => safe(filters::haproxy_duration(value).map_err(text_error)?),
        Kind::Seconds => {
            Value::from(seconds(value).ok_or("the value is not a number of seconds or a time such as 1h")?)
        }
        Kind::Count(bound) => Value::from(
            value
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=bound).contains(n))
                .ok_or(format!("the value is not a whole number from 1 to {bound}"))?,
        ),
        Kind::Status(allowed) => {
            Value::from(value.parse::<u16>().ok().filter(|code| allowed.contains(code)).ok_or_else(|| {
                format!("the value is not one of {}", allowed.iter().map(u16::to_string).collect::<Vec<_>>().join(", "))
            })?)
        }
        Kind::OneOf(allowed) => {
            let lower = value.to_ascii_lowercase();
            let found = allowed
                .iter()
                .find(|word| **word == lower)
                .ok_or_else(|| format!("the value is not one of {}", allowed.join(", ")))?;
            safe((*found).to_owned())
        }
        Kind::Cidrs => check_cidrs(value)?,
        Kind::SecretName => check_secret_name(value)?,
        Kind::Token => check_token(value)?,
        // Printed where HAProxy reads log-format text too (set-path, redirect location), where
        // a % would start an expression: paths in annotations are taken without any.
        Kind::Path if value.contains('%') => return Err("the value holds a %, which paths here may not".into()),
        Kind::Path => safe(filters::url_path(value).map_err(text_error)?),
        Kind::Url => check_url(value)?,
        Kind::HostPort => safe(host_port(value)?),
        Kind::Text => {
            // Printed both as a plain word (a realm) and as log-format text (a header): with no
            // % either reads the same.
            if value.is_empty() || value.len() > 1024 || value.contains('%') {
                return Err("the value is empty, longer than 1024 bytes, or holds a %".into());
            }
            safe(filters::haproxy_quote(value).map_err(text_error)?)
        }
        Kind::TokenList => check_token_list(value)?,
        Kind::Headers => check_headers(value)?,
        Kind::HeaderNames => check_header_names(value)?,
        Kind::Size => {
            if value.eq_ignore_ascii_case("unlimited") || value == "0" {
                return Ok(None);
            }
            Value::from(size(value).ok_or("the value is not a size such as 10m, 512k or 1g")?)
        }
        Kind::Rewrite => check_rewrite(value)?,
        Kind::Snippet => check_snippet(raw)?,
    }))
}

/// Addresses and networks, separated by commas, spaces or lines.
fn check_cidrs(value: &str) -> Result<Value, String> {
    let networks = value
        .split([',', ' ', '\n'])
        .filter(|item| !item.trim().is_empty())
        .map(|item| filters::cidr(item).map(safe).map_err(text_error))
        .collect::<Result<Vec<_>, _>>()?;
    if networks.is_empty() {
        return Err("the value names no address or network".into());
    }
    Ok(Value::from(networks))
}

/// A Secret name, `name` or `namespace/name`.
fn check_secret_name(value: &str) -> Result<Value, String> {
    let name = value.rsplit('/').next().unwrap_or_default();
    let dns_label = |part: &str| {
        !part.is_empty()
            && part.len() <= 253
            && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !dns_label(name) || value.split('/').count() > 2 || !value.split('/').all(dns_label) {
        return Err("the value is not a Secret name (name or namespace/name)".into());
    }
    Ok(Value::from(value))
}

/// A cookie name.
fn check_token(value: &str) -> Result<Value, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$&'*+-.^_`|~".contains(c);
    if value.is_empty() || value.len() > 64 || !value.chars().all(token) || value.contains('\'') {
        return Err("the value is not a cookie name (letters, digits, !#$&*+-.^_`|~; 64 at most)".into());
    }
    Ok(safe(value.to_owned()))
}

/// An http:// or https:// URL.
fn check_url(value: &str) -> Result<Value, String> {
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"))
        .ok_or("the value is not an http:// or https:// URL")?;
    let (authority, path) = rest.find('/').map_or((rest, "/"), |at| (&rest[..at], &rest[at..]));
    host_port(authority)?;
    let (path_only, query) = path.split_once('?').unwrap_or((path, ""));
    filters::url_path(path_only).map_err(text_error)?;
    if query.chars().any(|c| c.is_whitespace() || c == '#' || c == '\'') {
        return Err("the value's query holds characters a URL does not".into());
    }
    Ok(safe(filters::log_text(value).map_err(text_error)?))
}

/// A comma-separated list of names (or `*`).
fn check_token_list(value: &str) -> Result<Value, String> {
    let items: Vec<&str> = value.split(',').map(str::trim).filter(|item| !item.is_empty()).collect();
    let token = |item: &&str| *item == "*" || item.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if items.is_empty() || !items.iter().all(token) {
        return Err("the value is not a comma-separated list of names".into());
    }
    Ok(safe(filters::log_text(&items.join(", ")).map_err(text_error)?))
}

/// Header lines, `Name: value` or `Name value`.
fn check_headers(value: &str) -> Result<Value, String> {
    let mut headers = Vec::new();
    for line in value.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let (name, rest) = line
            .split_once(':')
            .filter(|(name, _)| !name.contains(' '))
            .or_else(|| line.split_once(' '))
            .ok_or("a line is not a header name and value")?;
        let (name, rest) = (name.trim(), rest.trim());
        header_name(name)?;
        if let Some(c) = filters::forbidden_char(rest) {
            return Err(format!("a header value holds {}", filters::describe(c)));
        }
        headers.push(Value::from(vec![
            safe(name.to_ascii_lowercase()),
            safe(filters::log_text(rest).map_err(text_error)?),
        ]));
    }
    if headers.is_empty() {
        return Err("the value holds no header".into());
    }
    Ok(Value::from(headers))
}

/// Header names, separated by commas or lines.
fn check_header_names(value: &str) -> Result<Value, String> {
    let names = value
        .split([',', '\n'])
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| header_name(name).map(|()| safe(name.to_ascii_lowercase())))
        .collect::<Result<Vec<_>, _>>()?;
    if names.is_empty() {
        return Err("the value holds no header name".into());
    }
    Ok(Value::from(names))
}

/// `replacement` or `regex replacement`.
fn check_rewrite(value: &str) -> Result<Value, String> {
    let parts: Vec<&str> = value.split_whitespace().collect();
    let (pattern, replacement) = match parts.as_slice() {
        [replacement] => ("(.*)", *replacement),
        [pattern, replacement] => (*pattern, *replacement),
        _ => return Err("the value is not `replacement` or `regex replacement`".into()),
    };
    regex::Regex::new(pattern).map_err(|_| "the pattern is not a regular expression")?;
    Ok(Value::from(vec![
        safe(filters::haproxy_quote(pattern).map_err(text_error)?),
        safe(filters::log_text(replacement).map_err(text_error)?),
    ]))
}

/// Lines for a backend, none starting a section.
fn check_snippet(raw: &str) -> Result<Value, String> {
    let mut lines = Vec::new();
    for line in raw.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if let Some(c) = filters::forbidden_char(line) {
            return Err(format!("a line holds {}", filters::describe(c)));
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        if crate::plan::config::SECTION_KEYWORDS.contains(&first) {
            return Err(format!("a line starts a section ({first}); a snippet stays in its backend"));
        }
        lines.push(safe(line.to_owned()));
    }
    Ok(Value::from(lines))
}

fn header_name(name: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$&*+-.^_`|~".contains(c);
    if name.is_empty() || name.len() > 128 || !name.chars().all(token) {
        return Err("a header name is not a token".into());
    }
    Ok(())
}

fn host_port(value: &str) -> Result<String, String> {
    let (host, port) = match value.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (value, None),
    };
    filters::hostname(host).map_err(text_error)?;
    if let Some(port) = port
        && port.parse::<u16>().ok().filter(|p| *p > 0).is_none()
    {
        return Err("the value's port is not a port number".into());
    }
    Ok(value.to_ascii_lowercase())
}

fn seconds(value: &str) -> Option<u64> {
    if let Ok(n) = value.parse::<u64>() {
        return Some(n);
    }
    let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().ok()?;
    let unit = match &value[digits.len()..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    n.checked_mul(unit)
}

fn size(value: &str) -> Option<u64> {
    let lower = value.to_ascii_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().ok()?;
    let unit: u64 = match &lower[digits.len()..] {
        "" | "b" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        "g" | "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit).filter(|bytes| *bytes > 0)
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
    fn a_peer_protection_haptic_lacks_refuses_the_ingress() {
        for name in ["haproxy-ingress.github.io/auth-url", "ingress.kubernetes.io/oauth", "haproxy.org/ssl-passthrough"]
        {
            let error = read(&annotations(&[(name, "x")]), &BTreeMap::new(), false).expect_err(name);
            assert_eq!(error.name, name);
        }
        assert!(
            read(&annotations(&[("haproxy-ingress.github.io/maxconn-server", "10")]), &BTreeMap::new(), false).is_ok()
        );
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
    fn the_passthrough_names_are_the_settings_names() {
        let setting = SETTINGS.iter().find(|s| s.key == "ssl-passthrough").expect("ssl-passthrough");
        assert_eq!(annotation_names(setting), *PASSTHROUGH_NAMES);
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
