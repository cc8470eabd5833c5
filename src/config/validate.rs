//! Checks of a configuration that its OpenAPI schema cannot express. Template compilation is
//! checked by the renderer when it compiles them (`Renderer::compile`).

use std::fmt;

use super::HAProxyTemplateConfigSpec;
use crate::store::FieldPath;

/// One problem, located by the field it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The field, as a path from `spec` (`watchedResources.ingresses.indexBy[1]`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{}: {}", self.field, self.message)
    }
}

/// Every problem the schema does not catch; empty when the configuration is usable.
pub fn problems(spec: &HAProxyTemplateConfigSpec) -> Vec<ConfigProblem> {
    let mut found = Vec::new();
    for (alias, watched) in &spec.watched_resources {
        if !alias.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            || !alias.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            found.push(ConfigProblem {
                field: format!("watchedResources.{alias}"),
                message: "aliases start with a lowercase letter and hold only letters, digits and '_'".into(),
            });
        }
        if watched.index_by.is_empty() {
            found.push(ConfigProblem {
                field: format!("watchedResources.{alias}.indexBy"),
                message: "needs at least one field path".into(),
            });
        }
        // `[*]` names many values: an index key or an ignored value is one.
        let one_value = |path: &str| match FieldPath::parse(path) {
            Ok(parsed) if parsed.names_many() => {
                Err(format!("{path:?}: [*] names every item of a list; this path names one value"))
            }
            Ok(parsed) => Ok(parsed),
            Err(error) => Err(error.to_string()),
        };
        for (i, path) in watched.index_by.iter().enumerate() {
            if let Err(message) = one_value(path) {
                found.push(ConfigProblem { field: format!("watchedResources.{alias}.indexBy[{i}]"), message });
            }
        }
        for (i, path) in watched.ignore_fields.iter().enumerate() {
            if let Err(message) = one_value(path) {
                found.push(ConfigProblem { field: format!("watchedResources.{alias}.ignoreFields[{i}]"), message });
            }
        }
        for (i, path) in watched.fields.iter().enumerate() {
            let kept = FieldPath::parse(path).and_then(|parsed| crate::store::Projection::new([&parsed]));
            if let Err(error) = kept {
                let field = format!("watchedResources.{alias}.fields[{i}]");
                found.push(ConfigProblem { field, message: error.to_string() });
            }
        }
    }
    if spec.pod_selector.match_labels.is_empty() {
        found.push(ConfigProblem {
            field: "podSelector.matchLabels".into(),
            message: "needs at least one label, or every pod would be managed".into(),
        });
    }
    let debounce = &spec.dataplane.debounce;
    if debounce.window > debounce.max_delay {
        found.push(ConfigProblem {
            field: "dataplane.debounce".into(),
            message: format!("window {} is longer than maxDelay {}", debounce.window, debounce.max_delay),
        });
    }
    let mut test_names = std::collections::BTreeSet::new();
    for (t, test) in spec.validation_tests.iter().enumerate() {
        let at = format!("validationTests[{t}]");
        if !test_names.insert(test.name.as_str()) {
            found
                .push(ConfigProblem { field: format!("{at}.name"), message: format!("{:?} is used twice", test.name) });
        }
        for (a, assertion) in test.assertions.iter().enumerate() {
            let at = format!("{at}.assertions[{a}]");
            if let Err(message) = assertion_shape(assertion) {
                found.push(ConfigProblem { field: at, message });
            }
        }
    }
    if spec.dataplane.deployment_timeout.get() < std::time::Duration::from_secs(1) {
        found.push(ConfigProblem {
            field: "dataplane.deploymentTimeout".into(),
            message: format!("{} is shorter than a second: no push would finish", spec.dataplane.deployment_timeout),
        });
    }
    if let Some(election) = &spec.leader_election {
        let (duration, grace) = (election.lease_duration.get(), election.lease_grace.get());
        if grace.as_secs() == 0 || grace >= duration {
            found.push(ConfigProblem {
                field: "leaderElection".into(),
                message: format!(
                    "leaseGrace {} must be at least a second and shorter than leaseDuration {}",
                    election.lease_grace, election.lease_duration
                ),
            });
        }
    }
    if let Some(level) = &spec.log_level
        && let Err(why) = crate::telemetry::check_log_filter(level)
    {
        found.push(ConfigProblem { field: "logLevel".into(), message: format!("is not a log filter: {why}") });
    }
    if let Some(minimum) = &spec.dataplane.minimum_haproxy_version
        && super::HaproxyVersion::parse(minimum).is_none()
    {
        found.push(ConfigProblem {
            field: "dataplane.minimumHAProxyVersion".into(),
            message: "is a version such as 2.8 or 2.8.5".into(),
        });
    }
    found
}

/// An assertion has exactly one kind, a readable regular expression and an answer to expect.
fn assertion_shape(assertion: &super::Assertion) -> Result<(), String> {
    let kinds = [
        assertion.contains.is_some(),
        assertion.not_contains.is_some(),
        assertion.matches.is_some(),
        assertion.map_entry.is_some(),
        assertion.request.is_some(),
    ];
    if kinds.iter().filter(|set| **set).count() != 1 {
        return Err("sets exactly one of contains, notContains, matches, mapEntry and request".into());
    }
    if assertion.file.is_some() && (assertion.map_entry.is_some() || assertion.request.is_some()) {
        return Err("file goes with contains, notContains or matches only".into());
    }
    if let Some(pattern) = &assertion.matches {
        regex::Regex::new(pattern).map_err(|error| format!("matches is no regular expression: {error}"))?;
    }
    if let Some(request) = &assertion.request {
        let expect = &request.expect;
        if expect.backend.is_none() && expect.status.is_none() && expect.headers.is_empty() {
            return Err("request.expect names a backend, a status or headers".into());
        }
        if request
            .method
            .as_deref()
            .is_some_and(|m| !(1..=16).contains(&m.len()) || !m.bytes().all(|b| b.is_ascii_uppercase()))
        {
            return Err("request.method is an HTTP method in capitals (GET, POST...)".into());
        }
        if request.path.as_deref().is_some_and(|path| !path.starts_with('/')) {
            return Err("request.path starts with '/'".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(index_by: &str) -> HAProxyTemplateConfigSpec {
        serde_json::from_value(serde_json::json!({
            "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                                "indexBy": ["metadata.namespace", index_by]}},
            "podSelector": {"matchLabels": {"app": "haproxy"}},
            "dataplane": {"debounce": {"window": "10s", "maxDelay": "1s"}},
            "templates": {"haproxyConfig": "global\n"}
        }))
        .unwrap()
    }

    #[test]
    fn bad_index_path_and_inverted_debounce_are_located() {
        let found: Vec<_> = problems(&spec("metadata.labels['x'")).iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("spec.watchedResources.ingresses.indexBy[1]: "), "{found:?}");
        assert!(found[0].contains("never closed"));
        assert_eq!(found[1], "spec.dataplane.debounce: window 10s is longer than maxDelay 1s");
    }

    #[test]
    fn kept_fields_step_into_lists_by_each_item_and_only_they_may() {
        let mut spec = spec("metadata.name");
        spec.dataplane.debounce = Default::default();
        let ingresses = spec.watched_resources.get_mut("ingresses").unwrap();
        ingresses.fields = vec!["spec.rules[*].host".into(), "spec.tls".into()];
        assert_eq!(problems(&spec), []);
        let ingresses = spec.watched_resources.get_mut("ingresses").unwrap();
        ingresses.fields = vec!["spec.rules[0]".into()];
        ingresses.ignore_fields = vec!["status.loadBalancer.ingress[*]".into()];
        let found: Vec<_> = problems(&spec).iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("spec.watchedResources.ingresses.ignoreFields[0]: ") && found[0].contains("one value"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("spec.watchedResources.ingresses.fields[0]: ") && found[1].contains("[*]"),
            "{found:?}"
        );
    }

    #[test]
    fn a_minimum_haproxy_version_that_is_no_version_is_located() {
        let mut spec = spec("metadata.name");
        spec.dataplane.debounce = Default::default();
        spec.dataplane.minimum_haproxy_version = Some("2.8".into());
        assert_eq!(problems(&spec), []);
        spec.dataplane.minimum_haproxy_version = Some("latest".into());
        let found: Vec<_> = problems(&spec).iter().map(ToString::to_string).collect();
        assert_eq!(found, ["spec.dataplane.minimumHAProxyVersion: is a version such as 2.8 or 2.8.5"]);
    }

    #[test]
    fn validation_tests_are_named_once_and_each_assertion_has_one_kind() {
        let mut spec = spec("metadata.name");
        spec.dataplane.debounce = Default::default();
        spec.validation_tests = serde_json::from_value(serde_json::json!([
            {"name": "a", "assertions": [{"contains": "backend"}, {"request": {"host": "x", "expect": {"status": 200}}}]},
            {"name": "a", "assertions": [
                {"contains": "x", "notContains": "y"},
                {"matches": "(unclosed"},
                {"request": {"host": "x", "expect": {}}},
                {"file": "haproxy.cfg", "mapEntry": {"map": "host.map", "key": "k"}}
            ]}
        ]))
        .unwrap();
        let found: Vec<_> = problems(&spec).iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 5, "{found:#?}");
        assert_eq!(found[0], "spec.validationTests[1].name: \"a\" is used twice");
        assert!(found[1].starts_with("spec.validationTests[1].assertions[0]: sets exactly one"), "{found:?}");
        assert!(found[2].contains("matches is no regular expression"), "{found:?}");
        assert!(found[3].contains("request.expect names"), "{found:?}");
        assert!(found[4].contains("file goes with"), "{found:?}");
    }

    #[test]
    fn leader_election_timings_that_cannot_work_are_located() {
        let mut spec = spec("metadata.name");
        spec.dataplane.debounce = Default::default();
        spec.leader_election =
            Some(serde_json::from_value(serde_json::json!({"leaseDuration": "10s", "leaseGrace": "10s"})).unwrap());
        let found: Vec<_> = problems(&spec).iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            ["spec.leaderElection: leaseGrace 10s must be at least a second and shorter than leaseDuration 10s"]
        );
    }
}
