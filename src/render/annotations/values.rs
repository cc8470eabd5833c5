//! What each kind of setting value must be, and each value checked and made ready to print.

use minijinja::Error;
use minijinja::value::Value;

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
    /// A whole number from 0 to the bound.
    Weight(u64),
    /// A regular expression (quoted for HAProxy).
    Regex,
    /// A path naming a regex path's groups as `$1`..`$9` (ingress-nginx's rewrite-target): as
    /// HAProxy's replacement (`\1`), a log-format word.
    RegexTarget,
    /// One of these HTTP statuses.
    Status(&'static [u16]),
    /// One of these words (compared without case).
    OneOf(&'static [&'static str]),
    /// Comma-separated IP addresses and networks.
    Cidrs,
    /// A name of a Secret in the Ingress's namespace (`name`, or `namespace/name` naming it).
    SecretName,
    /// A name of a Service in the Ingress's namespace (a DNS label).
    ServiceName,
    /// Comma-separated HTTP error statuses (400 to 599), as a list of numbers.
    Statuses,
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
    /// What requests hash on, in nginx variables (`$request_uri`, `$http_x_user`, `$cookie_id`).
    HashBy,
    /// Host names, comma- or space-separated.
    Hosts,
    /// `*`, or origins (`https://app.example`, `https://*.example.com:8443`), comma-separated.
    Origins,
    /// An http(s) URL that may name parts of the request as nginx variables (`$host`,
    /// `$scheme`, `$request_uri`, `$escaped_request_uri`): `[as written, as log-format]`.
    RequestUrl,
}

fn safe(text: String) -> Value {
    Value::from_safe_string(text)
}

fn text_error(error: Error) -> String {
    error.detail().unwrap_or("the value does not fit").to_owned()
}

/// Checks one value of a kind; `None` when the value means "not set" (`unlimited`, say).
pub(super) fn check(kind: Kind, raw: &str) -> Result<Option<Value>, String> {
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
        Kind::Weight(bound) => Value::from(
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= bound)
                .ok_or(format!("the value is not a whole number from 0 to {bound}"))?,
        ),
        Kind::RegexTarget => {
            if value.contains(['\\', '%']) {
                return Err("the value holds a backslash or a %, which a rewrite target here may not".into());
            }
            let path = value.replace('$', "");
            filters::url_path(&path).map_err(text_error)?;
            let mut target = String::new();
            let mut chars = value.chars().peekable();
            while let Some(c) = chars.next() {
                match (c, chars.peek()) {
                    ('$', Some(digit)) if digit.is_ascii_digit() => target.push('\\'),
                    ('$', _) => return Err("a $ in the value is not followed by a group's number".into()),
                    _ => target.push(c),
                }
            }
            safe(filters::haproxy_quote(&target).map_err(text_error)?)
        }
        Kind::Regex => {
            regex::Regex::new(value).map_err(|_| "the value is not a regular expression")?;
            safe(filters::haproxy_quote(value).map_err(text_error)?)
        }
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
        Kind::ServiceName => check_service_name(value)?,
        Kind::Statuses => check_statuses(value)?,
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
        Kind::HashBy => check_hash_by(value)?,
        Kind::Hosts => check_hosts(value)?,
        Kind::Origins => check_origins(value)?,
        Kind::RequestUrl => check_request_url(value)?,
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

/// A Service name: a DNS label (RFC 1035), as Kubernetes names Services.
fn check_service_name(value: &str) -> Result<Value, String> {
    let label = !value.is_empty()
        && value.len() <= 63
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && value.starts_with(|c: char| c.is_ascii_lowercase())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !label {
        return Err("the value is not a Service name (lower-case letters, digits and -, 63 at most)".into());
    }
    Ok(safe(value.to_owned()))
}

/// HTTP error statuses, comma-separated (ingress-nginx's custom-http-errors): each once, ascending.
fn check_statuses(value: &str) -> Result<Value, String> {
    let mut statuses = Vec::new();
    for item in value.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let status = item
            .parse::<u16>()
            .ok()
            .filter(|status| (400..=599).contains(status))
            .ok_or_else(|| format!("{item:?} is not an HTTP error status (400 to 599)"))?;
        if !statuses.contains(&status) {
            statuses.push(status);
        }
    }
    if statuses.is_empty() {
        return Err("the value names no HTTP status".into());
    }
    statuses.sort_unstable();
    Ok(Value::from(statuses))
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

/// nginx variables (and text, which hashes alike for every request and so is dropped) as the
/// sample HAProxy hashes: `[sample, format]`, the format (for `set-var-fmt`) empty unless
/// several variables make the key.
fn check_hash_by(value: &str) -> Result<Value, String> {
    let mut samples = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let (name, after) = match rest.strip_prefix('{') {
            Some(braced) => braced.split_once('}').ok_or("a ${ has no closing }")?,
            None => {
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        samples.push(hash_sample(name)?);
        rest = after;
    }
    let Some(first) = samples.first() else {
        return Err(
            "the value names no variable ($request_uri, $remote_addr, $http_<header>, $cookie_<name>...)".into()
        );
    };
    let (sample, format) = if samples.len() == 1 {
        (first.clone(), String::new())
    } else {
        let parts: Vec<String> = samples.iter().map(|sample| format!("%[{sample}]")).collect();
        ("var(txn.haptic_hash)".to_owned(), format!("\"{}\"", parts.join("|")))
    };
    Ok(Value::from(vec![safe(sample), safe(format)]))
}

/// The HAProxy sample of one nginx variable.
fn hash_sample(name: &str) -> Result<String, String> {
    let token = |text: &str| {
        !text.is_empty() && text.len() <= 64 && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    let sample = match name {
        "request_uri" => "pathq".to_owned(),
        "uri" | "document_uri" => "path".to_owned(),
        "remote_addr" | "binary_remote_addr" => "src".to_owned(),
        "host" | "http_host" | "server_name" => "req.hdr(host),lower".to_owned(),
        "args" | "query_string" => "query".to_owned(),
        _ => match name.split_once('_') {
            Some(("http", header)) if token(header) => format!("req.hdr({})", header.replace('_', "-")),
            Some(("cookie", cookie)) if token(cookie) => format!("req.cook({cookie})"),
            Some(("arg", argument)) if token(argument) => format!("url_param({argument})"),
            _ => return Err(format!("the value uses ${name}, which haptic cannot hash on")),
        },
    };
    Ok(sample)
}

/// Host names, separated by commas or spaces.
fn check_hosts(value: &str) -> Result<Value, String> {
    let hosts = value
        .split([',', ' ', '\n'])
        .filter(|host| !host.trim().is_empty())
        .map(|host| filters::hostname(host.trim()).map(|host| safe(host.to_ascii_lowercase())).map_err(text_error))
        .collect::<Result<Vec<_>, _>>()?;
    if hosts.is_empty() {
        return Err("the value names no host".into());
    }
    Ok(Value::from(hosts))
}

/// `*`, or origins: `{single, exact, patterns}`, `single` the one value to send when it does not
/// depend on the request (`*`, or a lone origin), `exact` the origins quoted, `patterns` a regex
/// (quoted) per `scheme://*.domain[:port]`.
fn check_origins(value: &str) -> Result<Value, String> {
    let items: Vec<&str> = value.split([',', ' ']).map(str::trim).filter(|item| !item.is_empty()).collect();
    let refused = || "the value is not * or origins such as https://app.example, https://*.example.com:8443".to_owned();
    if items.is_empty() {
        return Err(refused());
    }
    if items == ["*"] {
        return Ok(Value::from(std::collections::BTreeMap::from([("single", safe("'*'".into()))])));
    }
    let (mut exact, mut patterns) = (Vec::new(), Vec::new());
    for item in items {
        let (scheme, authority) =
            item.split_once("://").filter(|(s, _)| *s == "http" || *s == "https").ok_or_else(refused)?;
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok_and(|p| p > 0) => (host, Some(port)),
            _ => (authority, None),
        };
        let port_suffix = port.map(|p| format!(":{p}")).unwrap_or_default();
        match host.strip_prefix("*.") {
            Some(domain) => {
                filters::hostname(domain).map_err(|_| refused())?;
                let escaped = domain.to_ascii_lowercase().replace('.', "\\.");
                let pattern = format!("^{scheme}://[a-z0-9-]+\\.{escaped}{port_suffix}$");
                patterns.push(safe(filters::haproxy_quote(&pattern).map_err(text_error)?));
            }
            None => {
                filters::hostname(host).map_err(|_| refused())?;
                let origin = format!("{scheme}://{}{port_suffix}", host.to_ascii_lowercase());
                exact.push(safe(filters::haproxy_quote(&origin).map_err(text_error)?));
            }
        }
    }
    let single = (exact.len() == 1 && patterns.is_empty()).then(|| exact[0].clone());
    Ok(Value::from(std::collections::BTreeMap::from([
        ("single", single.unwrap_or_else(|| Value::from(()))),
        ("exact", Value::from(exact)),
        ("patterns", Value::from(patterns)),
    ])))
}

/// The nginx variables a request URL may name, and the HAProxy expression of each.
const URL_VARIABLES: &[(&str, &str)] = &[
    ("escaped_request_uri", "%[pathq,url_enc]"),
    ("request_uri", "%[pathq]"),
    ("best_http_host", "%[req.hdr(host)]"),
    ("http_host", "%[req.hdr(host)]"),
    ("host", "%[req.hdr(host),field(1,:)]"),
    ("pass_access_scheme", "%[ssl_fc,iif(https,http)]"),
    ("scheme", "%[ssl_fc,iif(https,http)]"),
];

/// An http(s) URL naming parts of the request as nginx variables: `[the URL quoted as one
/// word (external auth's Lua fills the variables in), the URL as a quoted log-format string,
/// the same unquoted (for a template to add to, inside its own double quotes)]`.
/// Its host, when an address, may not be the pod's own (loopback, link-local, unspecified).
fn check_request_url(value: &str) -> Result<Value, String> {
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"))
        .ok_or("the value is not an http:// or https:// URL")?;
    if value.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\' | '%' | '#')) {
        return Err("the value holds a space, a quote, a backslash, a % or a #, which a URL here may not".into());
    }
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host).trim_matches(['[', ']']);
    if let Ok(ip) = host.parse::<std::net::IpAddr>()
        && (ip.is_loopback() || ip.is_unspecified() || matches!(ip, std::net::IpAddr::V4(v4) if v4.is_link_local()))
    {
        return Err("the value names the pod itself or a link-local address".into());
    }
    let mut format = String::new();
    let mut text = value;
    while let Some(at) = text.find('$') {
        format.push_str(&text[..at]);
        let after = &text[at + 1..];
        let (name, expression) = URL_VARIABLES
            .iter()
            .find(|(name, _)| after.starts_with(name))
            .ok_or("the value names an nginx variable haptic does not know ($host, $scheme, $request_uri, $escaped_request_uri)")?;
        format.push_str(expression);
        text = &after[name.len()..];
    }
    format.push_str(text);
    Ok(Value::from(vec![
        safe(filters::haproxy_quote(value).map_err(text_error)?),
        safe(format!("\"{format}\"")),
        safe(format),
    ]))
}
