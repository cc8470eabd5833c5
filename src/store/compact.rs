//! The compact form a stored object keeps: one immutable tree per object, handed to templates
//! as minijinja values without copying.
//!
//! Why not minijinja's own maps: a map built from JSON is an index map (its own allocation, a
//! hash table and a vector of 56-byte entries, each key a string of its own), about 300 bytes
//! for a two-entry map; a Kubernetes object is dozens of small maps, so at 10,000 Ingresses
//! (with their Services and EndpointSlices) the stores held 11 KiB per Ingress. Here a map is
//! one sorted slice of (key, node) pairs, keys are interned (every object shares one `metadata`),
//! and strings of up to 22 bytes live inside their node. Templates see the same values: maps
//! (keys in sorted order, as serde_json gave them before), sequences, strings, numbers.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr, Value};
use serde_json::Value as Json;

/// The longest string kept inside its node (minijinja keeps the same ones inline too).
const INLINE: usize = 22;

/// A string of at most [`INLINE`] bytes, kept in place.
#[derive(Clone, Copy)]
pub struct InlineStr {
    len: u8,
    bytes: [u8; INLINE],
}

impl InlineStr {
    fn new(text: &str) -> Option<Self> {
        let len = text.len();
        (len <= INLINE).then(|| {
            let mut bytes = [0; INLINE];
            bytes[..len].copy_from_slice(text.as_bytes());
            Self { len: len as u8, bytes }
        })
    }

    fn as_str(&self) -> &str {
        // Only ever filled from a whole `&str` of `len` bytes.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for InlineStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// One node of a stored object.
#[derive(Clone, Debug)]
pub enum Node {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A non-negative integer.
    Unsigned(u64),
    /// A negative integer.
    Signed(i64),
    /// A number with a fraction.
    Float(f64),
    /// A short string, in place.
    Short(InlineStr),
    /// A longer string.
    Long(Arc<str>),
    /// An array's items.
    List(Arc<[Node]>),
    /// An object's members, sorted by key.
    Map(Arc<[(Arc<str>, Node)]>),
}

/// An array as templates see it (made when a template reaches it, sharing the items).
#[derive(Debug)]
struct ListView(Arc<[Node]>);

/// An object as templates see it (made when a template reaches it, sharing the members).
#[derive(Debug)]
struct MapView(Arc<[(Arc<str>, Node)]>);

impl MapView {
    fn get(&self, key: &str) -> Option<&Node> {
        member(&self.0, key)
    }
}

/// The member `key` of a map's members.
pub fn member<'a>(members: &'a [(Arc<str>, Node)], key: &str) -> Option<&'a Node> {
    members.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|at| &members[at].1)
}

/// The members of the stored map `value` is (as [`Node::to_value`] made it), for Rust code that
/// reads a stored object without making a template value of each part.
pub fn map_members(value: &Value) -> Option<&[(Arc<str>, Node)]> {
    value.downcast_object_ref::<MapView>().map(|view| &*view.0)
}

impl Node {
    /// The member `key`, when this is a map that has it and it is not null (as a template's
    /// attribute test sees it).
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Self::Map(members) => member(members, key).filter(|node| !matches!(node, Self::Null)),
            _ => None,
        }
    }

    /// The items, when this is a list; none otherwise.
    pub fn items(&self) -> &[Node] {
        match self {
            Self::List(items) => items,
            _ => &[],
        }
    }

    /// The text, when this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Short(s) => Some(s.as_str()),
            Self::Long(s) => Some(s),
            _ => None,
        }
    }

    /// The compact form of `json`, its keys interned.
    pub fn from_json(json: Json) -> Self {
        match json {
            Json::Null => Self::Null,
            Json::Bool(b) => Self::Bool(b),
            Json::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Self::Unsigned(u),
                (None, Some(i)) => Self::Signed(i),
                (None, None) => Self::Float(n.as_f64().unwrap_or_default()),
            },
            Json::String(s) => match InlineStr::new(&s) {
                Some(short) => Self::Short(short),
                None => Self::Long(Arc::from(s)),
            },
            Json::Array(items) => Self::List(items.into_iter().map(Self::from_json).collect()),
            Json::Object(members) => {
                let mut entries: Vec<(Arc<str>, Node)> =
                    members.into_iter().map(|(key, value)| (intern(&key), Self::from_json(value))).collect();
                // serde_json sorts keys unless a dependency turns on its `preserve_order`.
                entries.sort_by(|(a, _), (b, _)| a.cmp(b));
                Self::Map(entries.into())
            }
        }
    }

    /// The node as templates see it; maps, lists and long strings are shared, not copied. (A
    /// map or list costs one small allocation each time it is reached: kept in the node, that
    /// allocation would cost every stored map 48 bytes, 1.7 KiB per Ingress with its Service
    /// and EndpointSlice.)
    pub fn to_value(&self) -> Value {
        match self {
            Self::Null => Value::from(()),
            Self::Bool(b) => Value::from(*b),
            Self::Unsigned(u) => Value::from(*u),
            Self::Signed(i) => Value::from(*i),
            Self::Float(f) => Value::from(*f),
            Self::Short(s) => Value::from(s.as_str()),
            Self::Long(s) => Value::from(s.clone()),
            Self::List(items) => Value::from_object(ListView(items.clone())),
            Self::Map(members) => Value::from_object(MapView(members.clone())),
        }
    }
}

impl Object for MapView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get(key.as_str()?).map(Node::to_value)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.0.iter().map(|(key, _)| Value::from(key.clone()))))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

impl Object for ListView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_usize()?).map(Node::to_value)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.len())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Keys seen in stored objects, each kept once. Entries no object uses any more are dropped
/// when the set has doubled since the last sweep, so keys of deleted objects do not pile up.
struct Interner {
    keys: HashSet<Arc<str>>,
    sweep_at: usize,
}

/// The interned copy of `key` (object keys; the stores' namespaces and kinds too).
pub(crate) fn intern(key: &str) -> Arc<str> {
    static KEYS: OnceLock<Mutex<Interner>> = OnceLock::new();
    let keys = KEYS.get_or_init(|| Mutex::new(Interner { keys: HashSet::new(), sweep_at: 4096 }));
    // A poisoned lock still holds a usable set: interning is only an economy.
    let mut interner = keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = interner.keys.get(key) {
        return known.clone();
    }
    if interner.keys.len() >= interner.sweep_at {
        interner.keys.retain(|k| Arc::strong_count(k) > 1);
        interner.sweep_at = (interner.keys.len() * 2).max(4096);
    }
    let key: Arc<str> = Arc::from(key);
    interner.keys.insert(key.clone());
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(json: Json) -> Value {
        Node::from_json(json).to_value()
    }

    #[test]
    fn a_node_is_three_words() {
        assert_eq!(std::mem::size_of::<Node>(), 24);
    }

    #[test]
    fn templates_see_the_same_values_as_from_json() {
        let object = json!({
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                         "annotations": {"a.very.long.annotation.name/with-a-path": "a value longer than twenty-two bytes"}},
            "spec": {"rules": [{"host": "web.example.com", "http": {"paths": [{"path": "/", "port": 80}]}}],
                     "weight": -3, "ratio": 0.5, "on": true, "nothing": null, "empty": {}, "none": []}
        });
        let env = minijinja::Environment::new();
        let template = "{{ o.metadata.name }} {{ o.metadata.annotations['a.very.long.annotation.name/with-a-path'] }} \
            {{ o.spec.rules[0].host }} {{ o.spec.rules[-1].http.paths[0].port + 1 }} {{ o.spec.weight }} {{ o.spec.ratio }} \
            {{ o.spec.on }} {{ o.spec.nothing is none }} {{ o.spec.empty | length }} {{ not o.spec.none }} \
            {{ o.metadata | list }} {% for k, v in o.metadata.labels | items %}{{ k }}={{ v }}{% endfor %} \
            {{ o.spec.missing is undefined }} {{ o.metadata.labels == {'app': 'web'} }} {{ o | tojson }}";
        let compact = env.render_str(template, minijinja::context! { o => value(object.clone()) }).unwrap();
        let direct = env
            .render_str(template, minijinja::context! { o => Value::from(minijinja::value::Serde(&object)) })
            .unwrap();
        assert_eq!(compact, direct);
        assert!(
            compact.starts_with("web a value longer than twenty-two bytes web.example.com 81 -3 0.5 True True 0 True"),
            "{compact}"
        );
    }

    #[test]
    fn typed_objects_deserialize_from_the_compact_form() {
        #[derive(serde::Deserialize, PartialEq, Debug)]
        struct Port {
            name: String,
            port: u16,
        }
        let ports: Vec<Port> = serde::Deserialize::deserialize(value(
            json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        ))
        .unwrap();
        assert_eq!(ports, [Port { name: "http".into(), port: 80 }, Port { name: "https".into(), port: 443 }]);
    }

    #[test]
    fn equal_keys_share_one_string() {
        let (Node::Map(a), Node::Map(b)) =
            (Node::from_json(json!({"metadata": 1})), Node::from_json(json!({"metadata": 2})))
        else {
            panic!("maps")
        };
        assert!(Arc::ptr_eq(&a[0].0, &b[0].0));
    }
}
