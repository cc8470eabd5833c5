//! Label and field selectors in `kubectl` syntax, evaluated locally (the API server evaluates
//! them for watches; the offline renderer needs the same answer without one).

use serde_json::Value as Json;

use super::FieldPath;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector such as `app=web,tier in (front,back),!canary`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses a selector; the error names the requirement it could not read.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let requirement = if let Some(key) = part.strip_prefix('!') {
                Requirement::DoesNotExist(key.trim().to_owned())
            } else if let Some((key, values)) = split_set(part, " notin ") {
                Requirement::NotIn(key, values?)
            } else if let Some((key, values)) = split_set(part, " in ") {
                Requirement::In(key, values?)
            } else if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if part.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                Requirement::Exists(part.to_owned())
            } else {
                return Err(SelectorError::Unreadable { text: text.to_owned(), part: part.to_owned() });
            };
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, object: &Json) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Json::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn split_set(part: &str, operator: &str) -> Option<(String, Result<Vec<String>, SelectorError>)> {
    let (key, rest) = part.split_once(operator)?;
    let rest = rest.trim();
    let values = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .map(|inner| inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect())
        .ok_or_else(|| SelectorError::NoValueList(part.to_owned()));
    Some((key.trim().to_owned(), values))
}

/// Why a selector does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label requirement that is none of the forms selectors have.
    #[error("label selector {text:?}: cannot read {part:?}")]
    Unreadable {
        /// The selector.
        text: String,
        /// The requirement.
        part: String,
    },
    /// `in` or `notin` without a list.
    #[error("label selector: {0:?} needs a parenthesised list of values")]
    NoValueList(String),
    /// A field term that is not `path=value` or `path!=value`.
    #[error("field selector {text:?}: {part:?} is not path=value or path!=value")]
    NotATerm {
        /// The selector.
        text: String,
        /// The term.
        part: String,
    },
    /// A field term's path.
    #[error(transparent)]
    Path(#[from] super::fieldpath::PathError),
}

/// A parsed field selector such as `metadata.name=web,spec.type!=ExternalName`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FieldSelector(Vec<(FieldPath, bool, String)>);

impl FieldSelector {
    /// Parses a selector of `path=value`, `path==value` and `path!=value` terms.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, equal, value) = if let Some((p, v)) = part.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (p, true, v)
            } else {
                return Err(SelectorError::NotATerm { text: text.to_owned(), part: part.to_owned() });
            };
            terms.push((FieldPath::parse(path.trim())?, equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    /// Whether an object satisfies every term (a missing field reads as an empty string).
    pub fn matches(&self, object: &Json) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let actual = path.resolve_key(object).unwrap_or_default();
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn with_labels(labels: Json) -> Json {
        json!({"metadata": {"name": "x", "labels": labels}})
    }

    #[test]
    fn label_selectors_follow_kubectl_semantics() {
        let object = with_labels(json!({"app": "web", "tier": "front"}));
        for (selector, expected) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("tier in (front, back)", true),
            ("tier notin (front)", false),
            ("canary notin (yes)", true),
            ("app", true),
            ("!canary", true),
            ("!app", false),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(selector).unwrap().matches(&object), expected, "{selector}");
        }
        assert!(LabelSelector::parse("tier in front").is_err());
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn field_selectors_compare_paths() {
        let object = json!({"metadata": {"name": "web", "namespace": "a"}, "spec": {"type": "ClusterIP"}});
        assert!(FieldSelector::parse("metadata.name=web,spec.type!=ExternalName").unwrap().matches(&object));
        assert!(!FieldSelector::parse("metadata.namespace==b").unwrap().matches(&object));
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
