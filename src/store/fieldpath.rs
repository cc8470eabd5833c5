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
}

impl FieldPath {
    /// Parses a path; the error says where it went wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
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
                    let close = text[i..].find(']').ok_or_else(|| format!("{text:?}: '[' at {i} is never closed"))?;
                    let inner = &text[i + 1..i + close];
                    let segment = if let Some(quoted) = strip_quotes(inner) {
                        Segment::Key(quoted.to_owned())
                    } else {
                        Segment::Index(
                            inner
                                .parse()
                                .map_err(|_| format!("{text:?}: [{inner}] is neither a quoted key nor a list index"))?,
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
                        return Err(format!("{text:?}: empty segment at {i}"));
                    }
                    segments.push(Segment::Key(key.to_owned()));
                    i = end;
                    expect_key = false;
                }
                other => return Err(format!("{text:?}: unexpected {:?} at {i}", other as char)),
            }
        }
        if segments.is_empty() || expect_key {
            return Err(format!("{text:?}: a path needs at least one segment and cannot end with '.'"));
        }
        Ok(Self { text: text.to_owned(), segments })
    }

    /// The value at this path, if every step exists.
    pub fn resolve<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.segments.iter().try_fold(value, |current, segment| match segment {
            Segment::Key(key) => current.get(key),
            Segment::Index(index) => current.get(index),
        })
    }

    /// The container holding this path's last step, and that step (`None` when a step before it
    /// does not exist).
    fn parent_mut<'v>(&self, value: &'v mut Value) -> Option<(&'v mut Value, &Segment)> {
        let (last, parents) = self.segments.split_last()?;
        let parent = parents.iter().try_fold(value, |current, segment| match segment {
            Segment::Key(key) => current.get_mut(key),
            Segment::Index(index) => current.get_mut(index),
        })?;
        Some((parent, last))
    }

    /// Takes the value at this path out of `value` (for [`FieldPath::restore`] to put back).
    pub fn take(&self, value: &mut Value) -> Option<Value> {
        match self.parent_mut(value)? {
            (parent, Segment::Key(key)) => parent.as_object_mut()?.remove(key),
            (parent, Segment::Index(index)) => parent.get_mut(index).map(std::mem::take),
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
            assert!(error.contains(hint), "{path}: {error}");
        }
    }
}
