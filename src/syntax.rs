//! What a host name, a URL path or a line of HAProxy's files can hold: plain checks shared by
//! the render's filters (which refuse and blame) and the Gateway API model (which judges
//! routes before any template sees them). Nothing here quotes a value: messages say what is
//! wrong with it.

/// The first character that can never appear in a line of `haproxy.cfg` or a map file.
pub fn forbidden_char(text: &str) -> Option<char> {
    text.chars().find(|c| c.is_control())
}

/// Describes a forbidden character for an error message.
pub fn describe(c: char) -> String {
    match c {
        '\n' => "a newline".into(),
        '\r' => "a carriage return".into(),
        '\t' => "a tab".into(),
        '\0' => "a NUL byte".into(),
        ' ' => "a space".into(),
        other if other.is_whitespace() && !other.is_control() => format!("the space character U+{:04X}", other as u32),
        other => format!("the control character U+{:04X}", other as u32),
    }
}

/// Whether `value` is a lowercase DNS name (RFC 1123 labels, at most 253 bytes), or `*.`
/// and one.
pub fn is_hostname(value: &str) -> bool {
    let name = value.strip_prefix("*.").unwrap_or(value);
    value.len() <= 253 && name.split('.').all(is_dns_label)
}

/// Whether `part` is one RFC 1123 label: 1 to 63 lowercase letters, digits and inner hyphens
/// (a namespace's or a Service's name).
pub fn is_dns_label(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 63
        && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !part.starts_with('-')
        && !part.ends_with('-')
}

/// Longest map key taken: HAProxy reads map files a buffer at a time, and no host and path of
/// a route comes near this.
pub const MAP_KEY_LIMIT: usize = 2048;

/// What keeps `value` from being a URL path, if anything.
pub fn url_path_flaw(value: &str) -> Option<String> {
    if !value.starts_with('/') {
        return Some("it does not start with /".into());
    }
    let bytes = value.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' if bytes.get(index + 1..index + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) => {
                index += 3;
                continue;
            }
            b'%' => return Some("it holds a % not followed by two hex digits".into()),
            b if b.is_ascii_alphanumeric() || b"-._~!$&()*+,;=:@/".contains(&b) => {}
            _ => {
                let c = value[index..].chars().next().unwrap_or('?');
                return Some(match c {
                    c if c.is_control() => format!("it holds {}", describe(c)),
                    ' ' => "it holds a space".into(),
                    c if c.is_ascii() => format!("it holds {c:?}, which no URL path has"),
                    c => format!("it holds the character U+{:04X}, which a URL path has only %-encoded", c as u32),
                });
            }
        }
        index += 1;
    }
    (value.len() > MAP_KEY_LIMIT).then(|| format!("it is {} bytes long", value.len()))
}
