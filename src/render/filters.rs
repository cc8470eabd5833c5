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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_uses_strong_quotes_and_splices_single_quotes() {
        assert_eq!(haproxy_quote("plain").unwrap(), "'plain'");
        assert_eq!(haproxy_quote("${HOME} \"x\"").unwrap(), "'${HOME} \"x\"'");
        assert_eq!(haproxy_quote("it's").unwrap(), r"'it'\''s'");
        assert!(haproxy_quote("a\nb").unwrap_err().to_string().contains("a newline"));
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
