//! Filters that keep values from resources inside HAProxy's syntax: a value that cannot be
//! written safely is refused (and its object blamed), never emitted.

use minijinja::{Error, ErrorKind};

use super::context::blame_last_object;

fn refuse(message: String) -> Error {
    blame_last_object();
    Error::new(ErrorKind::InvalidOperation, message)
}

/// The first character that can never appear in a line of `haproxy.cfg` or a map file.
pub(crate) fn forbidden_char(text: &str) -> Option<char> {
    text.chars().find(|c| c.is_control())
}

/// Describes a forbidden character for an error message.
pub(crate) fn describe(c: char) -> String {
    match c {
        '\n' => "a newline".into(),
        '\r' => "a carriage return".into(),
        '\t' => "a tab".into(),
        '\0' => "a NUL byte".into(),
        other => format!("the control character U+{:04X}", other as u32),
    }
}

/// `value | haproxy_quote`: one HAProxy word holding exactly `value`.
///
/// Single quotes are HAProxy's strong quoting (no escapes, no `${VAR}` expansion); a single
/// quote inside is written as `'\''`, which HAProxy joins into the same word.
pub(crate) fn haproxy_quote(value: &str) -> Result<String, Error> {
    if let Some(c) = forbidden_char(value) {
        return Err(refuse(format!("haproxy_quote: {value:?} holds {}, which no HAProxy word can", describe(c))));
    }
    Ok(format!("'{}'", value.replace('\'', r"'\''")))
}

/// `value | socket_path`: a unix socket path written bare, for `stats socket`: the Dataplane
/// API reads that address from `haproxy.cfg` without unquoting it and dials it as it stands,
/// so a quoted path is one HAProxy binds and the API never finds. Only absolute paths of
/// letters, digits and `/._-` are taken; anything else is refused.
pub(crate) fn socket_path(value: &str) -> Result<String, Error> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-');
    if value.starts_with('/') && value.len() > 1 && value.chars().all(safe) {
        Ok(value.to_owned())
    } else if let Some(c) = forbidden_char(value) {
        Err(refuse(format!("socket_path: {value:?} holds {}, so it is not a socket path", describe(c))))
    } else {
        Err(refuse(format!(
            "socket_path: {value:?} is not an absolute path of letters, digits and /._- (the Dataplane API \
             could not dial it)"
        )))
    }
}

/// `value | hostname`: the value if it is a DNS name (RFC 1123, lowercase) or a wildcard
/// `*.example.com`, else an error naming it.
pub(crate) fn hostname(value: &str) -> Result<String, Error> {
    let name = value.strip_prefix("*.").unwrap_or(value);
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if value.len() <= 253 && name.split('.').all(label_ok) {
        Ok(value.to_owned())
    } else if let Some(c) = forbidden_char(value) {
        Err(refuse(format!("hostname: {value:?} holds {}, so it is not a valid host name", describe(c))))
    } else {
        Err(refuse(format!("hostname: {value:?} is not a valid host name")))
    }
}

/// `value | map_key`: the value if it can be a key in a map file (no whitespace, no control
/// characters, not empty), else an error naming it.
pub(crate) fn map_key(value: &str) -> Result<String, Error> {
    if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Err(refuse(format!("map_key: {value:?} cannot be a map key (empty, or holds whitespace)")))
    } else {
        Ok(value.to_owned())
    }
}

/// `value | haproxy_duration`: a HAProxy time (digits, optionally `us`, `ms`, `s`, `m`, `h` or `d`).
pub(crate) fn haproxy_duration(value: &str) -> Result<String, Error> {
    let value = value.trim();
    let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &value[digits.len()..];
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && ["", "us", "ms", "s", "m", "h", "d"].contains(&unit)
    {
        Ok(value.to_owned())
    } else {
        Err(refuse(format!("haproxy_duration: {value:?} is not a HAProxy time such as 30s or 500ms")))
    }
}

/// `value | one_of("a", "b")`: `value` if it is one of the allowed words.
pub(crate) fn one_of(value: &str, allowed: &[String]) -> Result<String, Error> {
    if allowed.iter().any(|word| word == value) {
        Ok(value.to_owned())
    } else {
        Err(refuse(format!("one_of: {value:?} is not one of {}", allowed.join(", "))))
    }
}

/// `value | cidr`: an IPv4 or IPv6 address or network (`10.0.0.0/8`), as HAProxy's `src` takes it.
pub(crate) fn cidr(value: &str) -> Result<String, Error> {
    let value = value.trim();
    let (address, bits) = value.split_once('/').map_or((value, None), |(a, b)| (a, Some(b)));
    let max_bits = match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => 32,
        Ok(std::net::IpAddr::V6(_)) => 128,
        Err(_) => return Err(refuse(format!("cidr: {value:?} is not an IP address or network"))),
    };
    match bits.map(str::parse::<u8>) {
        None => Ok(value.to_owned()),
        Some(Ok(bits)) if bits <= max_bits => Ok(value.to_owned()),
        Some(_) => Err(refuse(format!("cidr: {value:?} has a prefix length outside 0..={max_bits}"))),
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
        for good in ["30s", "500ms", "5", "2m", "1h"] {
            assert_eq!(haproxy_duration(good).unwrap(), good);
        }
        for bad in ["", "s", "30 s", "30x", "1e3", "30s\n    option x", "-1s"] {
            assert!(haproxy_duration(bad).is_err(), "{bad:?} should be refused");
        }
        let allowed = ["roundrobin".to_owned(), "leastconn".to_owned()];
        assert_eq!(one_of("leastconn", &allowed).unwrap(), "leastconn");
        assert!(
            one_of("leastconn\nuse_backend x", &allowed).unwrap_err().to_string().contains("roundrobin, leastconn")
        );
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
    fn map_keys_refuse_whitespace() {
        assert_eq!(map_key("/api").unwrap(), "/api");
        assert!(map_key("/a b").is_err());
        assert!(map_key("").is_err());
    }
}
