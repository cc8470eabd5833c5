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

use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
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

/// The most members a map has for its members to be looked through in turn rather than by
/// binary search (most of a Kubernetes object's maps have fewer).
const SCANNED_MEMBERS: usize = 16;

/// The member `key` of a map's members.
pub fn member<'a>(members: &'a [(Arc<str>, Node)], key: &str) -> Option<&'a Node> {
    // A key's length is in the entry itself and text equality compares lengths first, so a
    // scan reads no other key's text unless the lengths match: a binary search compared the
    // text of about log2(n) keys, each a call to `memcmp`, and member lookups were a tenth of a
    // full render at 10,000 Ingresses.
    if members.len() <= SCANNED_MEMBERS {
        return members.iter().find(|(k, _)| **k == *key).map(|(_, node)| node);
    }
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

    /// The compact form of `json`, its keys interned and its small parts shared with equal
    /// parts of other stored objects ([`Parts`]).
    pub fn from_json(json: Json) -> Self {
        Self::from_json_sharing(json, &mut shared_parts())
    }

    /// [`Node::from_json`] with the pool of shared parts given.
    fn from_json_sharing(json: Json, parts: &mut Parts) -> Self {
        Self::build(json, None, parts)
    }

    /// Builds `json`, found at `place` (its member key, and whether it is an item of the list
    /// there; none for a whole object).
    fn build(json: Json, place: Option<Place>, parts: &mut Parts) -> Self {
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
            Json::Array(items) => {
                let item_place = place.as_ref().map(|place| Place { key: place.key.clone(), item: true });
                let items: Vec<Node> =
                    items.into_iter().map(|item| Self::build(item, item_place.clone(), parts)).collect();
                parts.list(place, items)
            }
            Json::Object(members) => {
                let mut entries: Vec<(Arc<str>, Node)> = members
                    .into_iter()
                    .map(|(key, value)| {
                        let key = intern(&key);
                        let node = Self::build(value, Some(Place { key: key.clone(), item: false }), parts);
                        (key, node)
                    })
                    .collect();
                // serde_json sorts keys unless a dependency turns on its `preserve_order`.
                entries.sort_by(|(a, _), (b, _)| a.cmp(b));
                parts.map(place, entries)
            }
        }
    }

    /// Feeds what [`Node::same_as`] compares: scalars by value, strings by content, maps and
    /// lists by address (their parts are shared already when they can be).
    fn feed_shallow(&self, hasher: &mut dyn Hasher) {
        match self {
            Self::Null => hasher.write_u8(0),
            Self::Bool(b) => hasher.write_u8(if *b { 2 } else { 1 }),
            Self::Unsigned(u) => {
                hasher.write_u8(3);
                hasher.write_u64(*u);
            }
            Self::Signed(i) => {
                hasher.write_u8(4);
                hasher.write_i64(*i);
            }
            Self::Float(f) => {
                hasher.write_u8(5);
                hasher.write_u64(f.to_bits());
            }
            Self::Short(_) | Self::Long(_) => {
                hasher.write_u8(6);
                let text = self.as_str().unwrap_or_default();
                hasher.write_usize(text.len());
                hasher.write(text.as_bytes());
            }
            Self::List(items) => {
                hasher.write_u8(7);
                hasher.write_usize(items.as_ptr() as usize);
            }
            Self::Map(members) => {
                hasher.write_u8(8);
                hasher.write_usize(members.as_ptr() as usize);
            }
        }
    }

    /// Equal as [`Node::feed_shallow`] hashes: a map or list only to the very same one.
    fn same_as(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Null, Self::Null) => true,
            (Self::Bool(a), Self::Bool(b)) => a == b,
            (Self::Unsigned(a), Self::Unsigned(b)) => a == b,
            (Self::Signed(a), Self::Signed(b)) => a == b,
            (Self::Float(a), Self::Float(b)) => a.to_bits() == b.to_bits(),
            (Self::List(a), Self::List(b)) => Arc::ptr_eq(a, b),
            (Self::Map(a), Self::Map(b)) => Arc::ptr_eq(a, b),
            (a, b) => match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
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
        self.get_value_by_str(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.get(key).map(Node::to_value)
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

/// Where a part of an object is: the member key it is under, and whether it is an item of the
/// list there.
#[derive(Clone)]
struct Place {
    key: Arc<str>,
    item: bool,
}

/// The most entries a map or list may have to be shared: the parts that repeat from object to
/// object are small (a port, an endpoint's conditions, a status everyone is given).
const SHARED_AT_MOST: usize = 8;

/// How many parts found at one member key are kept for sharing before the odds decide.
const LEARNING: u32 = 64;

/// One part kept for sharing.
#[derive(Clone)]
enum Part {
    Map(Arc<[(Arc<str>, Node)]>),
    List(Arc<[Node]>),
}

impl Part {
    fn holders(&self) -> usize {
        match self {
            Self::Map(members) => Arc::strong_count(members),
            Self::List(items) => Arc::strong_count(items),
        }
    }
}

/// What the pool has for a part.
enum Found {
    /// Not looked for: too large, or where sharing has not paid.
    NotLooked,
    /// An equal part, kept.
    Kept(Part),
    /// None yet: the part is kept under this hash.
    New(u64),
}

/// How often parts found at one member key were equal to one kept.
#[derive(Default)]
struct Odds {
    seen: u32,
    tried: u32,
    shared: u32,
}

impl Odds {
    /// Whether to look this part up: always while learning, then when at least one in four
    /// was shared, and one in [`LEARNING`] otherwise so the odds can change (names and
    /// addresses are unique to their objects, and a pool of them would only cost memory).
    fn worth_trying(&mut self) -> bool {
        self.seen = self.seen.wrapping_add(1);
        self.tried < LEARNING || self.shared.saturating_mul(4) >= self.tried || self.seen.is_multiple_of(LEARNING)
    }

    fn record(&mut self, shared: bool) {
        // Halved when large, so the odds follow what objects look like now.
        if self.tried >= 1 << 16 {
            self.tried /= 2;
            self.shared /= 2;
        }
        self.tried += 1;
        self.shared += u32::from(shared);
    }
}

/// Small maps and lists of stored objects kept once however many objects hold an equal one:
/// at 10,000 Ingresses each EndpointSlice repeats its ports and each endpoint's conditions,
/// each Service its ports, and each Ingress the status every served one is given (about a
/// kilobyte of every Ingress with its Service and slice). Parts are shared bottom up, so a
/// map is compared by its entries' keys and values with its own maps and lists by address.
/// Only places where sharing pays are looked up ([`Odds`]); parts no object holds any more
/// are dropped when the pool has doubled since the last sweep, and so are the odds of keys
/// no object has any more when they have doubled (keys can be data: a ConfigMap's).
struct Parts {
    kept: HashMap<u64, Part, foldhash::fast::RandomState>,
    odds: HashMap<(Arc<str>, bool), Odds, foldhash::fast::RandomState>,
    hasher: foldhash::fast::RandomState,
    sweep_at: usize,
    odds_sweep_at: usize,
}

/// How many keys' odds are kept before the first sweep of them.
const ODDS_KEPT_AT_FIRST: usize = 1024;

impl Parts {
    fn new() -> Self {
        Self {
            kept: HashMap::default(),
            odds: HashMap::default(),
            hasher: Default::default(),
            sweep_at: 4096,
            odds_sweep_at: ODDS_KEPT_AT_FIRST,
        }
    }

    /// The list `items` at `place`, shared when an equal one is kept.
    fn list(&mut self, place: Option<Place>, items: Vec<Node>) -> Node {
        let found = self.find(
            place,
            items.len(),
            |hasher| {
                hasher.write_u8(1);
                for item in &items {
                    item.feed_shallow(hasher);
                }
            },
            |part| {
                matches!(part, Part::List(kept)
                    if kept.len() == items.len() && kept.iter().zip(&items).all(|(a, b)| a.same_as(b)))
            },
        );
        Node::List(match found {
            Found::Kept(Part::List(kept)) => kept,
            Found::New(hash) => {
                let items: Arc<[Node]> = items.into();
                self.keep(hash, Part::List(items.clone()));
                items
            }
            _ => items.into(),
        })
    }

    /// The map of `members` at `place`, shared when an equal one is kept.
    fn map(&mut self, place: Option<Place>, members: Vec<(Arc<str>, Node)>) -> Node {
        let found = self.find(
            place,
            members.len(),
            |hasher| {
                hasher.write_u8(2);
                for (key, value) in &members {
                    hasher.write_usize(key.as_ptr() as usize);
                    value.feed_shallow(hasher);
                }
            },
            |part| {
                matches!(part, Part::Map(kept)
                    if kept.len() == members.len()
                        && kept.iter().zip(&members).all(|((ka, a), (kb, b))| Arc::ptr_eq(ka, kb) && a.same_as(b)))
            },
        );
        Node::Map(match found {
            Found::Kept(Part::Map(kept)) => kept,
            Found::New(hash) => {
                let members: Arc<[(Arc<str>, Node)]> = members.into();
                self.keep(hash, Part::Map(members.clone()));
                members
            }
            _ => members.into(),
        })
    }

    /// Looks a part of `len` entries up at `place`, when it is small and found where sharing
    /// has paid: `feed` hashes it, `equal` compares it with a kept one. Its key's odds are
    /// read and counted in one lookup.
    fn find(
        &mut self,
        place: Option<Place>,
        len: usize,
        feed: impl FnOnce(&mut dyn Hasher),
        equal: impl FnOnce(&Part) -> bool,
    ) -> Found {
        use std::hash::BuildHasher;
        let Some(place) = place.filter(|_| len <= SHARED_AT_MOST) else { return Found::NotLooked };
        if self.odds.len() >= self.odds_sweep_at {
            // A key held only here and by the key interner is no object's any more.
            self.odds.retain(|(key, _), _| Arc::strong_count(key) > 2);
            self.odds_sweep_at = (self.odds.len() * 2).max(ODDS_KEPT_AT_FIRST);
        }
        let odds = self.odds.entry((place.key, place.item)).or_default();
        if !odds.worth_trying() {
            return Found::NotLooked;
        }
        let mut hasher = self.hasher.build_hasher();
        feed(&mut hasher);
        let hash = hasher.finish();
        let kept = self.kept.get(&hash).filter(|part| equal(part)).cloned();
        odds.record(kept.is_some());
        kept.map_or(Found::New(hash), Found::Kept)
    }

    /// Keeps a part for sharing (a different part with the same hash keeps its place).
    fn keep(&mut self, hash: u64, part: Part) {
        if self.kept.len() >= self.sweep_at {
            self.sweep();
        }
        self.kept.entry(hash).or_insert(part);
    }

    /// Drops the parts no object holds any more: again until none goes, since a part held
    /// only by a dropped part is free only once that one is gone.
    fn sweep(&mut self) {
        loop {
            let before = self.kept.len();
            self.kept.retain(|_, part| part.holders() > 1);
            if self.kept.len() == before {
                break;
            }
        }
        self.sweep_at = (self.kept.len() * 2).max(4096);
    }
}

/// The process's pool of shared parts.
fn shared_parts() -> std::sync::MutexGuard<'static, Parts> {
    static PARTS: OnceLock<Mutex<Parts>> = OnceLock::new();
    let parts = PARTS.get_or_init(|| Mutex::new(Parts::new()));
    // A poisoned lock still holds a usable pool: sharing is only an economy.
    parts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Drops the shared parts no stored object holds now, rather than at the pool's next sweep
/// (a benchmark measuring stores starts from a pool that holds nothing of earlier ones).
pub fn sweep_shared_parts() {
    shared_parts().sweep();
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

    proptest::proptest! {
        /// A map's members are found by key whether it is scanned (few members) or searched
        /// (many), and a key it lacks is found in neither, however keys share lengths.
        #[test]
        fn a_member_is_found_by_its_key_in_maps_of_any_size(
            keys in proptest::collection::btree_set("[a-c]{0,3}", 0..40),
            absent in "[a-c]{0,3}",
        ) {
            let members: Vec<(Arc<str>, Node)> =
                keys.iter().enumerate().map(|(at, key)| (Arc::from(key.as_str()), Node::Unsigned(at as u64))).collect();
            for (at, key) in keys.iter().enumerate() {
                proptest::prop_assert!(matches!(member(&members, key), Some(Node::Unsigned(n)) if *n == at as u64));
            }
            proptest::prop_assert_eq!(member(&members, &absent).is_some(), keys.contains(&absent));
        }
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

    fn map_at<'a>(node: &'a Node, path: &[&str]) -> &'a Arc<[(Arc<str>, Node)]> {
        let mut node = node;
        for key in path {
            node = match key.parse::<usize>() {
                Ok(index) => &node.items()[index],
                Err(_) => node.get(key).expect("the path"),
            };
        }
        match node {
            Node::Map(members) => members,
            _ => panic!("a map at {path:?}"),
        }
    }

    fn slice(address: &str, ready: bool) -> Json {
        json!({"metadata": {"name": address}, "ports": [{"name": "http", "port": 80}],
               "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}]})
    }

    #[test]
    fn equal_small_parts_of_different_objects_are_kept_once() {
        let mut parts = Parts::new();
        let a = Node::from_json_sharing(slice("198.18.0.1", true), &mut parts);
        let b = Node::from_json_sharing(slice("198.18.0.2", true), &mut parts);
        let c = Node::from_json_sharing(slice("198.18.0.3", false), &mut parts);
        let conditions = ["endpoints", "0", "conditions"];
        assert!(Arc::ptr_eq(map_at(&a, &conditions), map_at(&b, &conditions)), "equal conditions are one");
        assert!(!Arc::ptr_eq(map_at(&a, &conditions), map_at(&c, &conditions)), "different ones are not");
        let (Some(Node::List(ports_a)), Some(Node::List(ports_c))) = (a.get("ports"), c.get("ports")) else {
            panic!("ports")
        };
        assert!(Arc::ptr_eq(ports_a, ports_c), "equal lists of equal maps are one");
        assert!(!Arc::ptr_eq(map_at(&a, &["endpoints", "0"]), map_at(&b, &["endpoints", "0"])));
        // Whole objects are never pooled.
        let again = Node::from_json_sharing(slice("198.18.0.1", true), &mut parts);
        let (Node::Map(first), Node::Map(second)) = (&a, &again) else { panic!("maps") };
        assert!(!Arc::ptr_eq(first, second));
    }

    #[test]
    fn parts_unique_to_their_objects_stop_being_kept() {
        let mut parts = Parts::new();
        let objects: Vec<Node> = (0..2000)
            .map(|n| Node::from_json_sharing(slice(&format!("198.18.{}.{}", n / 250, n % 250), true), &mut parts))
            .collect();
        // Learning keeps a few unique endpoints and address lists, the odds then stop it; the
        // shared conditions and ports are one part each.
        let kept = parts.kept.len();
        assert!(kept < 4 * LEARNING as usize + 2000 * 4 / LEARNING as usize, "{kept} parts kept");
        let conditions = ["endpoints", "0", "conditions"];
        assert!(objects.iter().all(|o| Arc::ptr_eq(map_at(o, &conditions), map_at(&objects[0], &conditions))));
    }

    #[test]
    fn parts_no_object_holds_are_dropped_at_a_sweep() {
        let mut parts = Parts::new();
        let gone = Node::from_json_sharing(slice("198.18.0.1", false), &mut parts);
        let kept_before = parts.kept.len();
        drop(gone);
        parts.sweep_at = 0;
        let live = Node::from_json_sharing(slice("198.18.0.2", true), &mut parts);
        assert!(parts.kept.values().all(|part| part.holders() > 1), "only parts an object holds are left");
        assert!(parts.kept.len() <= kept_before, "{} parts after the sweep, {kept_before} before", parts.kept.len());
        drop(live);
    }

    #[test]
    fn the_odds_of_keys_no_object_has_are_forgotten() {
        let mut parts = Parts::new();
        for n in 0..3 * ODDS_KEPT_AT_FIRST {
            // Keys that are data, each object's own, gone with it.
            drop(Node::from_json_sharing(json!({"data": {format!("key-{n}"): {"x": 1}}}), &mut parts));
        }
        assert!(parts.odds.len() <= ODDS_KEPT_AT_FIRST + 1, "{} keys' odds kept", parts.odds.len());
        // A key some object still has keeps its odds.
        let live = Node::from_json_sharing(json!({"data": {"kept": {"x": 1}}}), &mut parts);
        parts.odds_sweep_at = 0;
        drop(Node::from_json_sharing(json!({"data": {"other": {"x": 1}}}), &mut parts));
        assert!(parts.odds.keys().any(|(key, _)| &**key == "kept"));
        drop(live);
    }

    proptest::proptest! {
        #[test]
        fn shared_parts_read_as_what_was_stored(objects in proptest::collection::vec(json_value(), 1..12)) {
            let mut parts = Parts::new();
            let built: Vec<Node> =
                objects.iter().map(|json| Node::from_json_sharing(json!({"o": json.clone()}), &mut parts)).collect();
            for (json, node) in objects.iter().zip(&built) {
                let read: Json = serde_json::to_value(node.to_value()).expect("serializable");
                proptest::prop_assert_eq!(&read, &json!({"o": json.clone()}));
            }
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Json> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::from),
            (0u64..4).prop_map(Json::from),
            (-2i64..0).prop_map(Json::from),
            prop::sample::select(vec!["a", "b", "a string longer than twenty-two bytes"]).prop_map(Json::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Json::from),
                prop::collection::btree_map(prop::sample::select(vec!["x", "y", "z"]), inner, 0..3)
                    .prop_map(|map| Json::Object(map.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        })
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
