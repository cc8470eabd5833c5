//! Field paths into Kubernetes objects: `metadata.name`, `spec.ports[0].port`,
//! `metadata.labels['kubernetes.io/service-name']`.

use std::fmt;

use serde_json::Value;

/// A parsed field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
    /// `[*]`: every item of a list (only what a store keeps, `fields`, may say it).
    Each,
}

impl FieldPath {
    /// Parses a path; the error says where it went wrong.
    pub fn parse(text: &str) -> Result<Self, PathError> {
        let mut segments = Vec::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        let mut expect_key = true;
        while i < bytes.len() {
            match bytes[i] {
                b'.' if !expect_key => {
                    i += 1;
                    expect_key = true;
                }
                b'[' => {
                    let close =
                        text[i..].find(']').ok_or_else(|| PathError::Unclosed { text: text.to_owned(), at: i })?;
                    let inner = &text[i + 1..i + close];
                    let segment = if let Some(quoted) = strip_quotes(inner) {
                        Segment::Key(quoted.to_owned())
                    } else if inner == "*" {
                        Segment::Each
                    } else {
                        Segment::Index(
                            inner
                                .parse()
                                .map_err(|_| PathError::Bracket { text: text.to_owned(), inner: inner.to_owned() })?,
                        )
                    };
                    segments.push(segment);
                    i += close + 1;
                    expect_key = false;
                }
                _ if expect_key => {
                    let end = text[i..].find(['.', '[']).map_or(bytes.len(), |e| i + e);
                    let key = &text[i..end];
                    if key.is_empty() {
                        return Err(PathError::EmptySegment { text: text.to_owned(), at: i });
                    }
                    segments.push(Segment::Key(key.to_owned()));
                    i = end;
                    expect_key = false;
                }
                other => return Err(PathError::Unexpected { text: text.to_owned(), found: other as char, at: i }),
            }
        }
        if segments.is_empty() || expect_key {
            return Err(PathError::Incomplete(text.to_owned()));
        }
        Ok(Self { text: text.to_owned(), segments })
    }

    /// The value at this path, if every step exists.
    pub fn resolve<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.segments.iter().try_fold(value, |current, segment| match segment {
            Segment::Key(key) => current.get(key),
            Segment::Index(index) => current.get(index),
            Segment::Each => None,
        })
    }

    /// Whether the path says `[*]` somewhere, which names many values, not one: only a store's
    /// `fields` may.
    pub fn names_many(&self) -> bool {
        self.segments.contains(&Segment::Each)
    }

    /// The container holding this path's last step, and that step (`None` when a step before it
    /// does not exist).
    fn parent_mut<'v>(&self, value: &'v mut Value) -> Option<(&'v mut Value, &Segment)> {
        let (last, parents) = self.segments.split_last()?;
        let parent = parents.iter().try_fold(value, |current, segment| match segment {
            Segment::Key(key) => current.get_mut(key),
            Segment::Index(index) => current.get_mut(index),
            Segment::Each => None,
        })?;
        Some((parent, last))
    }

    /// Takes the value at this path out of `value` (for [`FieldPath::restore`] to put back).
    pub fn take(&self, value: &mut Value) -> Option<Value> {
        match self.parent_mut(value)? {
            (parent, Segment::Key(key)) => parent.as_object_mut()?.remove(key),
            (parent, Segment::Index(index)) => parent.get_mut(index).map(std::mem::take),
            (_, Segment::Each) => None,
        }
    }

    /// Puts back what [`FieldPath::take`] took from `value`.
    pub fn restore(&self, value: &mut Value, taken: Value) {
        match self.parent_mut(value) {
            Some((Value::Object(map), Segment::Key(key))) => {
                map.insert(key.clone(), taken);
            }
            Some((parent, Segment::Index(index))) => {
                if let Some(item) = parent.get_mut(index) {
                    *item = taken;
                }
            }
            _ => {}
        }
    }

    /// The value at this path as an index key: strings as they are, numbers and booleans as text.
    pub fn resolve_key(&self, value: &Value) -> Option<String> {
        match self.resolve(value)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }
}

/// What a store keeps of each object (a watched resource's `fields`): the values at a set of
/// paths, everything else dropped as the object arrives. A path keeps its whole value; `[*]`
/// keeps that part of every item of a list (the items stay, in order, so positions still mean
/// the same); a map that keeps nothing is left out.
#[derive(Clone, Debug)]
pub struct Projection {
    root: Kept,
}

/// One level of a projection: kept whole, or some of its keys, or a part of each item.
#[derive(Clone, Debug, Default)]
struct Kept {
    whole: bool,
    keys: std::collections::BTreeMap<String, Kept>,
    each: Option<Box<Kept>>,
}

/// Why a field path does not parse, or cannot be kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A `[` without its `]`.
    #[error("{text:?}: '[' at {at} is never closed")]
    Unclosed {
        /// The path.
        text: String,
        /// Where the `[` is.
        at: usize,
    },
    /// Brackets around something else than a quoted key, an index or `*`.
    #[error("{text:?}: [{inner}] is neither a quoted key, a list index nor [*]")]
    Bracket {
        /// The path.
        text: String,
        /// What the brackets hold.
        inner: String,
    },
    /// Two dots in a row, or a dot before a bracket.
    #[error("{text:?}: empty segment at {at}")]
    EmptySegment {
        /// The path.
        text: String,
        /// Where.
        at: usize,
    },
    /// A character out of place.
    #[error("{text:?}: unexpected {found:?} at {at}")]
    Unexpected {
        /// The path.
        text: String,
        /// The character.
        found: char,
        /// Where.
        at: usize,
    },
    /// No segment, or a trailing dot.
    #[error("{0:?}: a path needs at least one segment and cannot end with '.'")]
    Incomplete(String),
    /// A kept field that steps into a list by position.
    #[error("{0}: a list item is kept by [*] (every item), not by its position")]
    KeptByPosition(String),
}

impl Projection {
    /// The projection keeping `paths`; refused when a path steps into a list by position (an
    /// item kept alone would move to the front of its list).
    pub fn new<'p>(paths: impl IntoIterator<Item = &'p FieldPath>) -> Result<Self, PathError> {
        let mut root = Kept::default();
        for path in paths {
            let mut level = &mut root;
            for segment in &path.segments {
                level = match segment {
                    Segment::Key(key) => level.keys.entry(key.clone()).or_default(),
                    Segment::Each => level.each.get_or_insert_with(Box::default),
                    Segment::Index(_) => {
                        return Err(PathError::KeptByPosition(path.to_string()));
                    }
                };
            }
            level.whole = true;
        }
        Ok(Self { root })
    }

    /// What is kept of `object`.
    pub fn apply(&self, object: Value) -> Value {
        keep(&self.root, object).unwrap_or_else(|| Value::Object(serde_json::Map::new()))
    }
}

/// What `kept` keeps of `value`: none when nothing.
fn keep(kept: &Kept, value: Value) -> Option<Value> {
    if kept.whole {
        return Some(value);
    }
    match value {
        Value::Object(mut map) if !kept.keys.is_empty() => {
            let mut out = serde_json::Map::new();
            for (key, below) in &kept.keys {
                if let Some(value) = map.remove(key).and_then(|value| keep(below, value)) {
                    out.insert(key.clone(), value);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Value::Array(items) => {
            let each = kept.each.as_deref()?;
            Some(Value::Array(items.into_iter().map(|item| keep(each, item).unwrap_or(Value::Null)).collect()))
        }
        _ => None,
    }
}

fn strip_quotes(inner: &str) -> Option<&str> {
    let quoted = |q: char| inner.len() >= 2 && inner.starts_with(q) && inner.ends_with(q);
    (quoted('\'') || quoted('"')).then(|| &inner[1..inner.len() - 1])
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn take_and_restore_leave_the_object_as_it_was() {
        let original = json!({"metadata": {"name": "web", "labels": {"a/b": "c"}}, "spec": {"ports": [{"port": 80}, {"port": 81}]}});
        for path in ["metadata.labels['a/b']", "spec.ports[1]", "spec", "metadata.missing", "spec.ports[7]"] {
            let path = FieldPath::parse(path).unwrap();
            let mut object = original.clone();
            let taken = path.take(&mut object);
            assert!(path.resolve(&object).is_none_or(Value::is_null), "{path} is gone");
            if let Some(taken) = taken {
                path.restore(&mut object, taken);
            }
            assert_eq!(object, original, "{path}");
        }
    }

    #[test]
    fn resolves_dotted_bracketed_and_indexed_paths() {
        let object = json!({"metadata": {"name": "web", "labels": {"kubernetes.io/service-name": "svc"}},
                            "spec": {"ports": [{"port": 80}]}});
        let resolve = |p: &str| FieldPath::parse(p).unwrap().resolve_key(&object);
        assert_eq!(resolve("metadata.name").as_deref(), Some("web"));
        assert_eq!(resolve("metadata.labels['kubernetes.io/service-name']").as_deref(), Some("svc"));
        assert_eq!(resolve("metadata.labels[\"kubernetes.io/service-name\"]").as_deref(), Some("svc"));
        assert_eq!(resolve("spec.ports[0].port").as_deref(), Some("80"));
        assert_eq!(resolve("spec.ports[1].port"), None);
        assert_eq!(resolve("metadata.namespace"), None);
    }

    fn projection(paths: &[&str]) -> Projection {
        let paths: Vec<FieldPath> = paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect();
        Projection::new(&paths).unwrap()
    }

    #[test]
    fn a_projection_keeps_the_paths_and_drops_the_rest() {
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "web", "name": "shop-x", "uid": "0d1e", "generation": 4,
                         "labels": {"kubernetes.io/service-name": "shop", "endpointslice.kubernetes.io/managed-by": "c"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-04T10:00:00Z"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "n1",
                 "targetRef": {"kind": "Pod", "name": "shop-1", "uid": "aa"}},
                "not a map",
                {"addresses": ["10.0.0.2"], "zone": "z"}
            ]
        });
        let kept = projection(&[
            "metadata.namespace",
            "metadata.name",
            "metadata.labels['kubernetes.io/service-name']",
            "addressType",
            "ports",
            "endpoints[*].addresses",
            "endpoints[*].conditions",
            "spec.absent",
        ])
        .apply(slice);
        assert_eq!(
            kept,
            json!({
                "metadata": {"namespace": "web", "name": "shop-x", "labels": {"kubernetes.io/service-name": "shop"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}],
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}, null, {"addresses": ["10.0.0.2"]}]
            })
        );
    }

    #[test]
    fn a_whole_value_wins_over_a_part_of_it_and_empty_maps_are_left_out() {
        let object = json!({"metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}, "spec": {"type": "ClusterIP"}});
        assert_eq!(
            projection(&["metadata.labels['x']", "metadata", "spec.ports"]).apply(object.clone()),
            json!({"metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}})
        );
        assert_eq!(projection(&["status"]).apply(object), json!({}));
    }

    #[test]
    fn a_projection_refuses_a_list_position_and_other_paths_refuse_each() {
        let error = Projection::new(&[FieldPath::parse("spec.ports[0]").unwrap()]).unwrap_err();
        assert!(error.to_string().contains("[*]"), "{error}");
        let each = FieldPath::parse("endpoints[*].addresses").unwrap();
        assert!(each.names_many());
        assert_eq!(each.resolve(&json!({"endpoints": [{"addresses": ["a"]}]})), None);
    }

    #[test]
    fn malformed_paths_say_where() {
        for (path, hint) in [
            ("", "at least one segment"),
            ("metadata.", "cannot end"),
            ("metadata..name", "empty segment"),
            ("metadata.labels['x'", "never closed"),
            ("spec.ports[x]", "neither a quoted key"),
        ] {
            let error = FieldPath::parse(path).unwrap_err();
            assert!(error.to_string().contains(hint), "{path}: {error}");
        }
    }
}
