//! Filters that keep values from resources inside HAProxy's syntax: a value that cannot be
//! written safely is refused (and its object and field blamed), never emitted. What a filter
//! gives back is the only kind of string the formatter prints (see `Renderer::compile`).
//!
//! Refusals never quote the value: it is the cluster's, hostile perhaps, and the message goes to
//! logs, conditions and Events. They say what is wrong with it; the render error names the
//! object and field it came from.

use minijinja::{Error, ErrorKind};

pub(crate) use crate::syntax::{MAP_KEY_LIMIT, describe, forbidden_char};
use crate::syntax::{is_hostname, url_path_flaw};

use super::context::blame_value;

/// Lines of configuration haptic's own template functions wrote from vetted parts (server
/// lines, a block's output): the formatter prints them as they are, where a string holding a
/// newline would be refused.
#[derive(Debug)]
pub(crate) struct VettedLines(pub(crate) String);

impl minijinja::value::Object for VettedLines {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Plain
    }
}

fn refuse(value: &str, message: String) -> Error {
    blame_value(value);
    Error::new(ErrorKind::InvalidOperation, message)
}

/// What is wrong with a refused value, in words that never quote it.
fn flaw(value: &str) -> String {
    match forbidden_char(value) {
        Some(c) => format!("it holds {}", describe(c)),
        None if value.is_empty() => "it is empty".into(),
        None if value.len() > 253 => format!("it is {} bytes long", value.len()),
        None => match value.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '/' | '_'))) {
            Some(c) if c.is_ascii_graphic() || c == ' ' => format!("it holds {c:?}"),
            Some(c) => format!("it holds the character U+{:04X}", c as u32),
            None => "it does not have the expected form".into(),
        },
    }
}

/// `value | haproxy_quote`: one HAProxy word holding exactly `value`.
///
/// Single quotes are HAProxy's strong quoting (no escapes, no `${VAR}` expansion); a single
/// quote inside is written as `'\''`, which HAProxy joins into the same word.
pub(crate) fn haproxy_quote(value: &str) -> Result<String, Error> {
    if let Some(c) = forbidden_char(value) {
        return Err(refuse(
            value,
            format!("haproxy_quote: the value holds {}, which no HAProxy word can", describe(c)),
        ));
    }
    Ok(format!("'{}'", value.replace('\'', r"'\''")))
}

/// `value | log_text`: one HAProxy word holding `value` as literal text of a log-format
/// string (`set-header`, `redirect location`, `replace-path`'s replacement): `haproxy_quote`,
/// with every `%` doubled so none starts a sample expression.
pub(crate) fn log_text(value: &str) -> Result<String, Error> {
    haproxy_quote(&value.replace('%', "%%"))
}

/// `value | socket_path`: a unix socket path written bare, for `stats socket`: the Dataplane
/// API reads that address from `haproxy.cfg` without unquoting it and dials it as it stands,
/// so a quoted path is one HAProxy binds and the API never finds. Only absolute paths of
/// letters, digits and `/._-` are taken; anything else is refused.
pub(crate) fn socket_path(value: &str) -> Result<String, Error> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-');
    if value.starts_with('/') && value.len() > 1 && value.chars().all(safe) {
        Ok(value.to_owned())
    } else {
        Err(refuse(
            value,
            format!(
                "socket_path: the value is not an absolute path of letters, digits and /._- (the Dataplane API \
                 could not dial it): {}",
                flaw(value)
            ),
        ))
    }
}

/// `value | hostname`: the value if it is a DNS name (RFC 1123, lowercase) or a wildcard
/// `*.example.com`, else an error naming it.
pub(crate) fn hostname(value: &str) -> Result<String, Error> {
    if is_hostname(value) {
        Ok(value.to_owned())
    } else {
        Err(refuse(value, format!("hostname: the value is not a valid host name: {}", flaw(value))))
    }
}

/// `value | map_key`: the value if it can be a key in a map file (no whitespace, no control
/// characters, not empty, at most [`MAP_KEY_LIMIT`] bytes), else an error.
pub(crate) fn map_key(value: &str) -> Result<String, Error> {
    if let Some(c) = value.chars().find(|c| c.is_whitespace() || c.is_control()) {
        Err(refuse(value, format!("map_key: the value cannot be a map key: it holds {}", describe(c))))
    } else if value.is_empty() || value.len() > MAP_KEY_LIMIT {
        Err(refuse(value, format!("map_key: the value cannot be a map key: it is {} bytes long", value.len())))
    } else {
        Ok(value.to_owned())
    }
}

/// `value | url_path`: an HTTP request path as RFC 3986 writes one: `/` then unreserved
/// characters, sub-delimiters but `'`, `:`, `@`, `/` and `%` followed by two hex digits, at
/// most [`MAP_KEY_LIMIT`] bytes. No client request can match a path outside that (a `#` starts
/// a fragment, a space ends the request line), so an Ingress path with one is refused rather
/// than written into a map. A `'` is refused too, though a URL may hold one bare: in
/// `haproxy.cfg` it would open a quote (found by the fuzz target); `%27` is the same path.
pub(crate) fn url_path(value: &str) -> Result<String, Error> {
    match url_path_flaw(value) {
        None => Ok(value.to_owned()),
        Some(why) => Err(refuse(value, format!("url_path: the value is not a URL path: {why}"))),
    }
}

/// `value | bare_word`: the value written as it stands, when it is one HAProxy word that no
/// quoting, comment, sample fetch, variable or ACL block could hide in: letters, digits and
/// `._:/@+=~[]-`, at most 253 bytes (names, ids, addresses). Anything else is refused.
pub(crate) fn bare_word(value: &str) -> Result<String, Error> {
    let inert = |c: char| c.is_ascii_alphanumeric() || "._:/@+=~[]-".contains(c);
    if !value.is_empty() && value.len() <= 253 && value.chars().all(inert) {
        Ok(value.to_owned())
    } else {
        Err(refuse(
            value,
            format!("bare_word: the value is not a word of letters, digits and ._:/@+=~[]-: {}", flaw(value)),
        ))
    }
}

/// `value | haproxy_duration`: a HAProxy time (digits, optionally `us`, `ms`, `s`, `m`, `h` or `d`).
pub(crate) fn haproxy_duration(value: &str) -> Result<String, Error> {
    let original = value;
    let value = value.trim();
    let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &value[digits.len()..];
    // HAProxy refuses a time beyond 2^31-1 milliseconds ("timer overflow"): that would fail the
    // whole configuration, so it is this value's object that is refused instead.
    let microseconds_per_unit: u128 = match unit {
        "us" => 1,
        "" | "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => 0,
    };
    let well_formed = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && microseconds_per_unit > 0;
    let fits = digits.len() <= 20
        && digits.parse::<u128>().is_ok_and(|n| n * microseconds_per_unit <= i32::MAX as u128 * 1_000);
    if well_formed && fits {
        Ok(value.to_owned())
    } else if well_formed {
        Err(refuse(original, "haproxy_duration: the value is longer than HAProxy's longest time (24 days)".into()))
    } else {
        Err(refuse(
            original,
            format!("haproxy_duration: the value is not a HAProxy time such as 30s or 500ms: {}", flaw(original)),
        ))
    }
}

/// `value | one_of("a", "b")`: `value` if it is one of the allowed words.
pub(crate) fn one_of(value: &str, allowed: &[String]) -> Result<String, Error> {
    if allowed.iter().any(|word| word == value) {
        Ok(value.to_owned())
    } else {
        Err(refuse(value, format!("one_of: the value is not one of {}", allowed.join(", "))))
    }
}

/// `value | cidr`: an IPv4 or IPv6 address or network (`10.0.0.0/8`), as HAProxy's `src` takes it.
pub(crate) fn cidr(value: &str) -> Result<String, Error> {
    let original = value;
    let value = value.trim();
    let (address, bits) = value.split_once('/').map_or((value, None), |(a, b)| (a, Some(b)));
    let max_bits = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => 32,
        Ok(std::net::IpAddr::V6(_)) => 128,
        Err(_) => {
            return Err(refuse(
                original,
                format!("cidr: the value is not an IP address or network: {}", flaw(original)),
            ));
        }
    };
    match bits.map(str::parse::<u8>) {
        None => Ok(value.to_owned()),
        Some(Ok(bits)) if bits <= max_bits => Ok(value.to_owned()),
        Some(_) => Err(refuse(original, format!("cidr: the value has a prefix length outside 0..={max_bits}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_are_written_bare_and_only_when_safe() {
        assert_eq!(socket_path("/var/run/haproxy/runtime.sock").unwrap(), "/var/run/haproxy/runtime.sock");
        for refused in ["runtime.sock", "unix@haproxy.sock", "/", "/run/a b.sock", "/run/'x'.sock", "/run/${X}", "/a\n"]
        {
            assert!(socket_path(refused).is_err(), "{refused:?} was taken");
        }
    }

    #[test]
    fn quote_uses_strong_quotes_and_splices_single_quotes() {
        assert_eq!(haproxy_quote("plain").unwrap(), "'plain'");
        assert_eq!(haproxy_quote("${HOME} \"x\"").unwrap(), "'${HOME} \"x\"'");
        assert_eq!(haproxy_quote("it's").unwrap(), r"'it'\''s'");
        assert!(haproxy_quote("a\nb").unwrap_err().to_string().contains("a newline"));
    }

    #[test]
    fn durations_words_and_networks_are_checked() {
        for good in ["30s", "500ms", "5", "2m", "1h", "24d", "2147483647"] {
            assert_eq!(haproxy_duration(good).unwrap(), good);
        }
        for bad in ["", "s", "30 s", "30x", "1e3", "30s\n    option x", "-1s", "25d", "2147484s", &"5".repeat(10240)] {
            assert!(haproxy_duration(bad).is_err(), "{bad:?} should be refused");
        }
        let allowed = ["roundrobin".to_owned(), "leastconn".to_owned()];
        assert_eq!(one_of("leastconn", &allowed).unwrap(), "leastconn");
        let refused = one_of("leastconn\nuse_backend x", &allowed).unwrap_err().to_string();
        assert!(refused.contains("roundrobin, leastconn") && !refused.contains("use_backend"), "{refused}");
        for good in ["10.0.0.0/8", "192.168.1.1", "::1", "2001:db8::/32"] {
            assert_eq!(cidr(good).unwrap(), good);
        }
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.1 }", "", "::/129"] {
            assert!(cidr(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn hostnames_are_checked() {
        for good in ["example.com", "*.example.com", "a-b.c0", "localhost"] {
            assert_eq!(hostname(good).unwrap(), good);
        }
        for bad in ["Example.com", "a b.com", "evil.com\"", "x.com\nbackend y", "-a.com", "a..com", "", "*."] {
            assert!(hostname(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn map_keys_refuse_whitespace_and_size() {
        assert_eq!(map_key("/api").unwrap(), "/api");
        assert!(map_key("/a b").is_err());
        assert!(map_key("").is_err());
        assert!(map_key(&"/a".repeat(MAP_KEY_LIMIT)).is_err());
    }

    #[test]
    fn url_paths_are_rfc_3986_paths() {
        for good in ["/", "/a/b.c", "/caf%C3%A9", "/it%27s", "/a;b=c", "/~user/@x:1", "/(a)!$&*+,"] {
            assert_eq!(url_path(good).unwrap(), good);
        }
        for bad in ["", "a", "/a b", "/a#b", "/a\"b", "/a\\b", "/%[src]", "/%4", "/a\nb", "/é", "/{x}", "/a|b", "/'"] {
            assert!(url_path(bad).is_err(), "{bad:?} was taken");
        }
        assert!(url_path(&format!("/{}", "a".repeat(MAP_KEY_LIMIT))).is_err());
    }

    #[test]
    fn bare_words_take_names_and_addresses_only() {
        for good in ["web_shop_1_2", "10.0.0.1", "[fd00::1]", "srv-3", "a.b/c"] {
            assert_eq!(bare_word(good).unwrap(), good);
        }
        for bad in ["", "a b", "a#b", "%[src]", "${X}", "'x'", "a\nb", "{", "a,b", &"a".repeat(254)] {
            assert!(bare_word(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn refusals_never_quote_the_value() {
        let hostile = "evil\nbackend x #%[src]";
        let errors = [
            haproxy_quote(hostile),
            hostname(hostile),
            map_key(hostile),
            bare_word(hostile),
            url_path(hostile),
            socket_path(hostile),
            haproxy_duration(hostile),
            cidr(hostile),
            one_of(hostile, &["a".to_owned()]),
        ];
        for error in errors {
            let message = error.unwrap_err().to_string();
            assert!(!message.contains("evil") && !message.contains("backend x"), "{message}");
        }
    }
}
