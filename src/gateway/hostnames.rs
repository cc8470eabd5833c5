//! Hostnames as the Gateway API matches them: exact names, and `*.` wildcards that match one
//! or more labels in front of their suffix (`*.example.com` matches `a.example.com` and
//! `a.b.example.com`, never `example.com`).

/// Whether `host` (exact) is matched by `pattern` (exact or wildcard).
pub fn matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        None => pattern == host,
    }
}

/// Whether a name is a wildcard.
pub fn is_wildcard(name: &str) -> bool {
    name.starts_with("*.")
}

/// The hostnames a route serves on a listener: the intersection of its own (none means any)
/// with the listener's (none means any). `None` in the result stands for "any host"; an empty
/// result means the two do not intersect.
pub fn intersect(listener: Option<&str>, route: &[String]) -> Vec<Option<String>> {
    if route.is_empty() {
        return vec![listener.map(str::to_owned)];
    }
    let mut out: Vec<Option<String>> = Vec::new();
    for name in route {
        let name = name.to_ascii_lowercase();
        let found = match listener {
            None => Some(name),
            Some(listener) => {
                let listener = listener.to_ascii_lowercase();
                if name == listener {
                    Some(name)
                } else if !is_wildcard(&name) {
                    matches(&listener, &name).then_some(name)
                } else if !is_wildcard(&listener) {
                    matches(&name, &listener).then_some(listener)
                } else if name.len() >= listener.len() && matches(&listener, &name[2..]) {
                    // Both wildcards: the narrower one is the intersection.
                    Some(name)
                } else if matches(&name, &listener[2..]) {
                    Some(listener)
                } else {
                    None
                }
            }
        };
        if let Some(found) = found.map(Some)
            && !out.contains(&found)
        {
            out.push(found);
        }
    }
    out
}

/// How specific a host pattern is, for precedence: an exact name beats any wildcard, a longer
/// name a shorter one, and any name beats none.
pub fn specificity(host: Option<&str>) -> u64 {
    match host {
        None => 0,
        Some(name) if is_wildcard(name) => 1 + name.len() as u64,
        Some(name) => 1024 + name.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn wildcards_match_one_or_more_labels_but_not_their_suffix() {
        assert!(matches("*.example.com", "a.example.com"));
        assert!(matches("*.example.com", "a.b.example.com"));
        assert!(!matches("*.example.com", "example.com"));
        assert!(!matches("*.example.com", "aexample.com"));
        assert!(matches("a.example.com", "a.example.com"));
    }

    #[test]
    fn intersection_follows_the_gateway_api_table() {
        // The cases of the Gateway API's hostname intersection documentation.
        assert_eq!(intersect(None, &[]), vec![None]);
        assert_eq!(intersect(Some("foo.com"), &[]), vec![Some("foo.com".into())]);
        assert_eq!(intersect(None, &names(&["foo.com"])), vec![Some("foo.com".into())]);
        assert_eq!(
            intersect(Some("*.example.com"), &names(&["foo.example.com"])),
            vec![Some("foo.example.com".into())]
        );
        assert_eq!(
            intersect(Some("foo.example.com"), &names(&["*.example.com"])),
            vec![Some("foo.example.com".into())]
        );
        assert_eq!(
            intersect(Some("*.example.com"), &names(&["*.foo.example.com"])),
            vec![Some("*.foo.example.com".into())]
        );
        assert_eq!(
            intersect(Some("*.foo.example.com"), &names(&["*.example.com"])),
            vec![Some("*.foo.example.com".into())]
        );
        assert!(intersect(Some("foo.com"), &names(&["bar.com"])).is_empty());
        assert!(intersect(Some("*.example.com"), &names(&["example.com", "*.other.com"])).is_empty());
    }

    #[test]
    fn precedence_ranks_exact_over_wildcard_over_none() {
        assert!(specificity(Some("a.b")) > specificity(Some("*.very.long.example.com")));
        assert!(specificity(Some("*.b.example.com")) > specificity(Some("*.example.com")));
        assert!(specificity(Some("*.example.com")) > specificity(None));
    }

    proptest! {
        /// Every name in an intersection is served by both sides: a host matched by the result
        /// is matched by the listener and by one of the route's names.
        #[test]
        fn an_intersection_is_inside_both(
            listener in proptest::option::of("(\\*\\.)?[ab]\\.(a\\.)?com"),
            route in proptest::collection::vec("(\\*\\.)?[ab]\\.(a\\.)?com", 0..3),
            host in "[ab]\\.(a\\.|b\\.)?(a\\.)?com",
        ) {
            let serves = |pattern: Option<&str>, host: &str| pattern.is_none_or(|p| matches(p, host));
            for name in intersect(listener.as_deref(), &route) {
                if serves(name.as_deref(), &host) {
                    prop_assert!(serves(listener.as_deref(), &host));
                    prop_assert!(route.is_empty() || route.iter().any(|r| matches(r, &host)));
                }
            }
        }
    }
}
