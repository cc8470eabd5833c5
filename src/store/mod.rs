//! Store: the in-memory copy of every watched object, one store per alias, indexed by the
//! alias's `indexBy` keys and kept ready for templates.
//!
//! Pure: watchers (and the offline renderer) feed it objects; it strips noise, tells whether
//! anything really changed (so a re-list that changes nothing triggers no render), and keeps
//! objects in a stable order (namespace, name) so renders are deterministic whatever the order
//! of events.

pub mod compact;
pub mod fieldpath;
mod index_key;
pub mod selector;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde_json::Value as Json;
use thiserror::Error;

pub use fieldpath::{FieldPath, Projection};
use index_key::Group;
pub use index_key::IndexKey;

use crate::files::Checksum;

/// Identity of an object within one store. Its strings are shared (a store holds each key
/// three times: in its map, its index, its object) and namespaces are interned.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: Arc<str>,
    /// The name.
    pub name: Arc<str>,
}

/// An object named for people: `Ingress default/web`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// The kind.
    pub kind: Arc<str>,
    /// Namespace and name.
    pub key: ObjectKey,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.key.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.key.namespace, self.key.name)
        }
    }
}

/// One stored object. Only its template form is kept (not the JSON it came from), in the
/// compact form of [`compact`], with a checksum of its content to tell real changes from
/// re-sent copies: at 10,000 Ingresses the stores are the controller's largest memory.
#[derive(Debug)]
pub struct StoredObject {
    /// Who it is.
    pub reference: ObjectRef,
    /// Checksum of its content with noise removed.
    pub content: Checksum,
    /// Its index key, when every `indexBy` path resolved (shared with the store's index).
    pub index_key: Option<IndexKey>,
    /// A fingerprint of the values at the store's `ignoreFields` paths (none without such
    /// paths): only ever compared with the same object's previous one, in this process. (Eight
    /// bytes: every stored object carries the field.)
    pub ignored: Option<std::num::NonZeroU64>,
    /// Its content as a template value.
    pub value: minijinja::Value,
    /// The value wrapped the way the renderer hands it out, built on first use.
    template_value: OnceLock<minijinja::Value>,
}

impl StoredObject {
    /// The object as the renderer hands it to templates, wrapped on first use and then shared.
    pub fn template_value(&self, wrap: impl FnOnce(&Self) -> minijinja::Value) -> minijinja::Value {
        self.template_value.get_or_init(|| wrap(self)).clone()
    }
}

/// Errors about objects fed to a store.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StoreError {
    /// The object has no `metadata.name`.
    #[error("a {kind} object without metadata.name was ignored")]
    Nameless {
        /// The kind it was stored as.
        kind: String,
    },
}

/// The objects of one alias. Cloning shares the objects themselves.
#[derive(Debug, Default, Clone)]
pub struct ResourceStore {
    kind: Arc<str>,
    index_by: Vec<FieldPath>,
    // Paths left out of the content checksum: a change there alone is no change.
    ignore_fields: Vec<FieldPath>,
    // What is kept of each object (`fields`), before the content checksum, so a change only in
    // a dropped part is no change; none: all of it.
    projection: Option<Projection>,
    // Persistent maps (imbl), not std's: a render holds a snapshot of every store while the
    // watches go on changing them, and a std map was copied whole at the first change after
    // each snapshot (at 10,000 objects a store, 19 MiB of copies alive under churn); these
    // share all but the path to what changed.
    objects: imbl::OrdMap<ObjectKey, Arc<StoredObject>>,
    // Holds the objects themselves so a lookup needs no second search, each group sorted by
    // key. A vector, not a map: most groups hold one object (an index by namespace and name),
    // and a B-tree's first node alone would cost each object about 450 bytes.
    // Hashed with foldhash (seeded at random per map), not SipHash: a render looks up tens of
    // thousands of keys.
    index: Index,
    /// Which content this is: a number no other content of any store had, taken anew at every
    /// change, so a renderer can tell "nothing here changed" without looking at the objects.
    generation: u64,
    /// The last changes, newest last: which generation each replaced, which it made, and the
    /// index key it touched, so a reader can tell a key untouched since a generation without
    /// looking it up; each change's generation is the next one's `before`, so the history is a
    /// chain back from the current generation. A clone shares the chain up to its own first
    /// change.
    recent: std::collections::VecDeque<StoreChange>,
}

/// A store's objects by index key.
type Index = imbl::GenericHashMap<IndexKey, Group, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

/// One change of a store's content (see [`ResourceStore::untouched_since`]).
#[derive(Debug, Clone)]
struct StoreChange {
    before: u64,
    /// The object added, replaced or removed.
    object: ObjectKey,
    key: Option<IndexKey>,
    /// The key's digest: most keys checked against a change differ in it.
    digest: KeyDigest,
}

/// A digest of an index key: keys with different digests differ, so a reader comparing many
/// keys with a few (a render checking 10,000 blocks' lookups against one change) reads the
/// keys themselves only when digests match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDigest(u64);

impl KeyDigest {
    /// The digest of `key`.
    pub fn of(key: &IndexKey) -> Self {
        use std::hash::BuildHasher;
        // A fixed seed is enough: equal digests are confirmed by comparing the keys.
        Self(foldhash::fast::FixedState::with_seed(0x6861_7074_6963).hash_one(key))
    }
}

/// How many changes a store remembers.
const RECENT_CHANGES: usize = 256;

/// The last generation given to a store's content (see [`ResourceStore::generation`]).
static LAST_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn next_generation() -> u64 {
    LAST_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

/// Metadata that changes without the object changing for templates. (`generation` is kept: it
/// changes only with the spec, and the Gateway API's status conditions must observe it.)
const NOISE_METADATA: &[&str] = &["managedFields", "resourceVersion", "selfLink"];
const NOISE_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// Kinds of the Gateway API, whose status haptic writes (and so does not store).
const GATEWAY_API_KINDS: &[&str] =
    &["GatewayClass", "Gateway", "HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "ReferenceGrant"];

/// Removes fields that change on every write but mean nothing to templates.
pub fn strip_noise(object: &mut Json) {
    let Some(metadata) = object.get_mut("metadata").and_then(Json::as_object_mut) else { return };
    for field in NOISE_METADATA {
        metadata.remove(*field);
    }
    if let Some(annotations) = metadata.get_mut("annotations").and_then(Json::as_object_mut) {
        for annotation in NOISE_ANNOTATIONS {
            annotations.remove(*annotation);
        }
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
}

/// What applying an object did to its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Its content changed (or it is new): templates may render differently.
    Changed,
    /// Only values at `ignoreFields` paths changed: no render is owed, but readers of those
    /// values (the Ingress status writer) are.
    IgnoredFieldsOnly,
    /// Nothing changed.
    Unchanged,
}

impl ResourceStore {
    /// An empty store for objects of `kind`, indexed by `index_by`.
    pub fn new(kind: impl AsRef<str>, index_by: Vec<FieldPath>) -> Self {
        Self {
            kind: compact::intern(kind.as_ref()),
            index_by,
            ignore_fields: Vec::new(),
            projection: None,
            objects: imbl::OrdMap::new(),
            index: Index::default(),
            generation: next_generation(),
            recent: std::collections::VecDeque::new(),
        }
    }

    /// The empty store of `kind` a watched resource's settings describe (`indexBy`,
    /// `ignoreFields`, `fields`); the error says which path does not parse.
    pub fn shaped(
        kind: &str,
        index_by: &[String],
        ignore_fields: &[String],
        fields: &[String],
    ) -> Result<Self, fieldpath::PathError> {
        let parse = |paths: &[String]| paths.iter().map(|path| FieldPath::parse(path)).collect::<Result<Vec<_>, _>>();
        let index_by = parse(index_by)?;
        let ignore_fields = parse(ignore_fields)?;
        // An object's identity, its age and its index and ignored values are kept whatever
        // `fields` says: the store, the status writer and contested routes (oldest wins) need them.
        let projection = if fields.is_empty() {
            None
        } else {
            let always = ["apiVersion", "kind", "metadata.namespace", "metadata.name", "metadata.creationTimestamp"]
                .map(String::from);
            let kept = parse(&[&always[..], fields].concat())?;
            Some(Projection::new(kept.iter().chain(&index_by).chain(&ignore_fields))?)
        };
        let mut store = Self::new(kind, index_by).with_ignored_fields(ignore_fields);
        store.projection = projection;
        Ok(store)
    }

    /// This store with `paths` whose changes alone are no change (`ignoreFields`): such an
    /// object is still replaced, so templates and the status writer read its latest values.
    pub fn with_ignored_fields(mut self, paths: Vec<FieldPath>) -> Self {
        self.ignore_fields = paths;
        self
    }

    /// The kind of object held.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The `indexBy` paths.
    pub fn index_by(&self) -> &[FieldPath] {
        &self.index_by
    }

    /// How many objects are held.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Every object in (namespace, name) order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<StoredObject>> {
        self.objects.values()
    }

    /// One object by namespace and name.
    pub fn by_key(&self, key: &ObjectKey) -> Option<&Arc<StoredObject>> {
        self.objects.get(key)
    }

    /// The objects whose index key equals `key`, in (namespace, name) order.
    pub fn lookup(&self, key: &IndexKey) -> impl Iterator<Item = &Arc<StoredObject>> {
        self.index.get(key).map(Group::objects).unwrap_or_default().iter()
    }

    /// Adds or replaces an object; true when the store's content changed.
    pub fn apply(&mut self, object: Json) -> Result<bool, StoreError> {
        Ok(self.apply_noting(object)? == Applied::Changed)
    }

    /// Adds or replaces an object, saying whether its content changed, only its ignored fields
    /// did, or nothing did.
    pub fn apply_noting(&mut self, object: Json) -> Result<Applied, StoreError> {
        let stored = self.prepare(object)?;
        let key = stored.reference.key.clone();
        let Some(existing) = self.objects.get(&key).filter(|existing| existing.content == stored.content) else {
            self.insert(key, Arc::new(stored));
            return Ok(Applied::Changed);
        };
        if existing.ignored == stored.ignored {
            return Ok(Applied::Unchanged);
        }
        self.insert(key, Arc::new(stored));
        Ok(Applied::IgnoredFieldsOnly)
    }

    /// The stored form of `object` for this store (noise stripped, compact, indexed), without
    /// storing it: a re-list prepares each object as it arrives and replaces the scope at the end.
    pub fn prepare(&self, mut object: Json) -> Result<StoredObject, StoreError> {
        if let Some(projection) = &self.projection {
            object = projection.apply(object);
        }
        strip_noise(&mut object);
        // Objects listed in a watch may not say their apiVersion: the kind decides too.
        if GATEWAY_API_KINDS.contains(&&*self.kind)
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
        let key = object_key(&object).ok_or_else(|| StoreError::Nameless { kind: self.kind.to_string() })?;
        // serde_json keeps object keys sorted, so equal content serialises to equal bytes.
        let ignored: Vec<Option<Json>> = self.ignore_fields.iter().map(|path| path.take(&mut object)).collect();
        let content = Checksum::of(&serde_json::to_vec(&object).unwrap_or_default());
        let ignored_checksum = (!ignored.is_empty()).then(|| {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            serde_json::to_vec(&ignored).unwrap_or_default().hash(&mut hasher);
            std::num::NonZeroU64::new(hasher.finish()).unwrap_or(std::num::NonZeroU64::MIN)
        });
        for (path, taken) in self.ignore_fields.iter().zip(ignored).rev() {
            if let Some(taken) = taken {
                path.restore(&mut object, taken);
            }
        }
        let index_key =
            self.index_by.iter().map(|path| path.resolve_key(&object)).collect::<Option<Vec<_>>>().map(IndexKey::new);
        Ok(StoredObject {
            reference: ObjectRef { kind: self.kind.clone(), key },
            content,
            index_key,
            ignored: ignored_checksum,
            value: compact::Node::from_json(object).to_value(),
            template_value: OnceLock::new(),
        })
    }

    /// Which content the store holds: equal generations mean equal content (a clone keeps
    /// its original's until either changes); every change takes a new one.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether no change since `generation` (one this store's content had) touched the objects
    /// under the index key `key`: `None` when the store does not remember back that far (or
    /// never had that generation: a clone that went its own way).
    pub fn untouched_since(&self, generation: u64, key: &IndexKey, digest: KeyDigest) -> Option<bool> {
        let mut touched = false;
        self.each_change_since(generation, |change| {
            touched |= change.digest == digest && change.key.as_ref() == Some(key);
        })
        .then_some(!touched)
    }

    /// The objects added, replaced or removed since `generation` (one this store's content
    /// had), newest change first, an object once for each change of it: `None` when the store
    /// does not remember back that far (or never had that generation).
    pub fn objects_changed_since(&self, generation: u64) -> Option<Vec<&ObjectKey>> {
        let mut changed = Vec::new();
        self.each_change_since(generation, |change| changed.push(&change.object)).then_some(changed)
    }

    /// Shows `visit` each change since `generation`, newest first, in one walk back along the
    /// chain of generations: false when the chain does not reach `generation` (what was
    /// visited then says nothing).
    fn each_change_since<'a>(&'a self, generation: u64, mut visit: impl FnMut(&'a StoreChange)) -> bool {
        if generation == self.generation {
            return true;
        }
        for change in self.recent.iter().rev() {
            visit(change);
            if change.before == generation {
                return true;
            }
        }
        false
    }

    /// A change of `object`: a new generation, remembered with the index key it touched.
    fn changed(&mut self, object: &ObjectKey, key: Option<IndexKey>) {
        let before = self.generation;
        self.generation = next_generation();
        if self.recent.len() == RECENT_CHANGES {
            self.recent.pop_front();
        }
        let digest = key.as_ref().map_or(KeyDigest(0), KeyDigest::of);
        self.recent.push_back(StoreChange { before, object: object.clone(), key, digest });
    }

    fn insert(&mut self, key: ObjectKey, stored: Arc<StoredObject>) {
        self.remove(&key);
        self.changed(&key, stored.index_key.clone());
        if let Some(index_key) = &stored.index_key {
            // `remove` above took out any object of this key: the place is free.
            match self.index.get_mut(index_key) {
                Some(group) => group.insert(stored.clone()),
                None => {
                    self.index.insert(index_key.clone(), Group::One(stored.clone()));
                }
            }
        }
        self.objects.insert(key, stored);
    }

    /// Removes an object; true when it was there.
    pub fn delete(&mut self, key: &ObjectKey) -> bool {
        self.remove(key).is_some()
    }

    /// Replaces the whole content (a re-list); true when anything differs from before.
    pub fn replace_all(&mut self, objects: impl IntoIterator<Item = Json>) -> Result<bool, StoreError> {
        self.replace_scope(None, objects)
    }

    /// Replaces the objects of one namespace (or all, for `None`) with a re-list of it, leaving
    /// other namespaces alone; true when anything differs from before.
    pub fn replace_scope(
        &mut self,
        namespace: Option<&str>,
        objects: impl IntoIterator<Item = Json>,
    ) -> Result<bool, StoreError> {
        let prepared = objects.into_iter().map(|object| self.prepare(object)).collect::<Result<Vec<_>, _>>()?;
        Ok(self.replace_scope_prepared(namespace, prepared))
    }

    /// [`ResourceStore::replace_scope`] with objects already [prepared](ResourceStore::prepare).
    pub fn replace_scope_prepared(&mut self, namespace: Option<&str>, objects: Vec<StoredObject>) -> bool {
        let in_scope = |key: &ObjectKey| namespace.is_none_or(|ns| &*key.namespace == ns);
        let fresh: BTreeMap<ObjectKey, StoredObject> =
            objects.into_iter().map(|stored| (stored.reference.key.clone(), stored)).collect();
        let old_count = self.objects.keys().filter(|key| in_scope(key)).count();
        let changed = fresh.len() != old_count
            || fresh.iter().any(|(key, object)| self.objects.get(key).is_none_or(|old| old.content != object.content));
        if changed {
            let stale: Vec<ObjectKey> = self.objects.keys().filter(|key| in_scope(key)).cloned().collect();
            for key in stale {
                self.remove(&key);
            }
            for (key, stored) in fresh {
                self.insert(key, Arc::new(stored));
            }
        }
        changed
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<StoredObject>> {
        let removed = self.objects.remove(key)?;
        self.changed(key, removed.index_key.clone());
        if let Some(index_key) = &removed.index_key
            && let Some(group) = self.index.remove(index_key)
            && let Some(rest) = group.without(key)
        {
            self.index.insert(index_key.clone(), rest);
        }
        Some(removed)
    }
}

/// The namespace and name of a Kubernetes object.
pub fn object_key(object: &Json) -> Option<ObjectKey> {
    let metadata = object.get("metadata")?;
    let name = Arc::from(metadata.get("name")?.as_str()?);
    let namespace = compact::intern(metadata.get("namespace").and_then(Json::as_str).unwrap_or_default());
    Some(ObjectKey { namespace, name })
}

/// Every store of one configuration, by alias.
pub type Stores = BTreeMap<String, Arc<ResourceStore>>;

/// An object as the stores hold it (the first store of its kind that has it).
pub fn find<'a>(stores: &'a Stores, object: &ObjectRef) -> Option<&'a Arc<StoredObject>> {
    stores.values().filter(|store| store.kind() == &*object.kind).find_map(|store| store.by_key(&object.key))
}

/// `stores` without `left_out`, in every store of their kind: what a render that leaves them
/// out renders from. Only the stores that held one are copied.
pub fn without(stores: &Stores, left_out: &[ObjectRef]) -> Stores {
    let mut stores = stores.clone();
    for store in stores.values_mut() {
        let gone: Vec<&ObjectRef> =
            left_out.iter().filter(|o| store.kind() == &*o.kind && store.by_key(&o.key).is_some()).collect();
        if gone.is_empty() {
            continue;
        }
        let mut kept = ResourceStore::clone(store);
        for object in gone {
            kept.delete(&object.key);
        }
        *store = Arc::new(kept);
    }
    stores
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn store() -> ResourceStore {
        let paths = ["metadata.namespace", "metadata.name"].map(|p| FieldPath::parse(p).unwrap()).to_vec();
        ResourceStore::new("Service", paths)
    }

    fn service(namespace: &str, name: &str, port: u16, resource_version: &str) -> Json {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"namespace": namespace, "name": name, "resourceVersion": resource_version,
                            "managedFields": [{"manager": "kubectl"}],
                            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
               "spec": {"ports": [{"port": port}]}})
    }

    #[test]
    fn a_store_says_which_keys_its_recent_changes_touched_and_not_for_another_lineage() {
        let mut store = store();
        store.apply(service("shop", "web", 80, "1")).unwrap();
        let before = store.generation();
        let web = IndexKey::new(["shop", "web"]);
        let api = IndexKey::new(["shop", "api"]);
        store.apply(service("shop", "api", 80, "1")).unwrap();
        store.apply(service("shop", "api", 81, "2")).unwrap();
        assert_ne!(store.generation(), before);
        assert_eq!(store.untouched_since(before, &web, KeyDigest::of(&web)), Some(true));
        assert_eq!(store.untouched_since(before, &api, KeyDigest::of(&api)), Some(false));
        assert_eq!(store.untouched_since(store.generation(), &api, KeyDigest::of(&api)), Some(true));
        // Nothing changed: the generation stays.
        let now = store.generation();
        store.apply(service("shop", "api", 81, "3")).unwrap();
        assert_eq!(store.generation(), now);
        // A clone that went its own way: its generations are not this store's.
        let mut other = store.clone();
        other.apply(service("shop", "web", 90, "4")).unwrap();
        store.delete(&ObjectKey { namespace: "shop".into(), name: "api".into() });
        assert_eq!(store.untouched_since(other.generation(), &web, KeyDigest::of(&web)), None);
        assert_eq!(other.untouched_since(now, &web, KeyDigest::of(&web)), Some(false));
        assert_eq!(store.untouched_since(now, &web, KeyDigest::of(&web)), Some(true));
        assert_eq!(store.untouched_since(now, &api, KeyDigest::of(&api)), Some(false));
    }

    #[test]
    fn a_clone_keeps_its_objects_and_index_while_the_original_changes() {
        let mut store = store();
        store.apply(service("a", "web", 80, "1")).unwrap();
        store.apply(service("a", "api", 81, "1")).unwrap();
        let snapshot = store.clone();
        let web = ObjectKey { namespace: "a".into(), name: "web".into() };
        let api = ObjectKey { namespace: "a".into(), name: "api".into() };
        let web_before = snapshot.by_key(&web).unwrap().content;
        store.apply(service("a", "web", 90, "2")).unwrap();
        store.delete(&api);
        store.apply(service("b", "new", 80, "1")).unwrap();
        assert_eq!(snapshot.len(), 2);
        assert_eq!(snapshot.by_key(&web).unwrap().content, web_before);
        assert_eq!(snapshot.lookup(&IndexKey::new(["a", "api"])).count(), 1);
        assert_eq!(snapshot.lookup(&IndexKey::new(["b", "new"])).count(), 0);
        assert_ne!(store.by_key(&web).unwrap().content, web_before);
        assert_eq!(store.lookup(&IndexKey::new(["a", "api"])).count(), 0);
        let order: Vec<_> = store.iter().map(|o| o.reference.to_string()).collect();
        assert_eq!(order.len(), 2);
        assert!(order[0].ends_with("a/web") && order[1].ends_with("b/new"), "{order:?}");
    }

    #[test]
    fn noise_is_stripped_and_a_new_resource_version_alone_changes_nothing() {
        let mut store = store();
        assert!(store.apply(service("a", "web", 80, "1")).unwrap());
        let stored = store.by_key(&ObjectKey { namespace: "a".into(), name: "web".into() }).unwrap();
        let metadata = stored.value.get_attr("metadata").unwrap();
        assert!(metadata.get_attr("managedFields").unwrap().is_undefined());
        assert!(metadata.get_attr("annotations").unwrap().is_undefined());
        assert!(!store.apply(service("a", "web", 80, "2")).unwrap());
        assert!(store.apply(service("a", "web", 81, "3")).unwrap());
    }

    #[test]
    fn a_change_only_in_an_ignored_field_is_no_change_but_is_kept() {
        let ingress = |host: &str, address: &str| {
            json!({"metadata": {"namespace": "a", "name": "web"}, "spec": {"rules": [{"host": host}]},
                   "status": {"loadBalancer": {"ingress": [{"ip": address}]}}})
        };
        let ignored = vec![FieldPath::parse("status").unwrap()];
        let mut store = ResourceStore::new("Ingress", vec![]).with_ignored_fields(ignored);
        assert!(store.apply(ingress("web.example.com", "192.0.2.1")).unwrap());
        assert_eq!(store.apply_noting(ingress("web.example.com", "192.0.2.1")).unwrap(), Applied::Unchanged);
        assert_eq!(
            store.apply_noting(ingress("web.example.com", "192.0.2.2")).unwrap(),
            Applied::IgnoredFieldsOnly,
            "the status alone changed"
        );
        let stored = store.by_key(&ObjectKey { namespace: "a".into(), name: "web".into() }).unwrap();
        let address = ["status", "loadBalancer", "ingress"]
            .iter()
            .try_fold(stored.value.clone(), |value, key| value.get_attr(key))
            .and_then(|list| list.get_item(&0.into()))
            .and_then(|first| first.get_attr("ip"));
        assert_eq!(
            address.map(|ip| ip.to_string()).ok().as_deref(),
            Some("192.0.2.2"),
            "templates read the latest status"
        );
        assert!(store.apply(ingress("shop.example.com", "192.0.2.2")).unwrap(), "the spec changed");
        assert!(!store.replace_all([ingress("shop.example.com", "192.0.2.3")]).unwrap());
    }

    #[test]
    fn a_store_keeps_only_its_fields_and_a_change_elsewhere_is_no_change() {
        let paths = |paths: &[&str]| paths.iter().map(|path| (*path).to_owned()).collect::<Vec<_>>();
        let mut store = ResourceStore::shaped(
            "EndpointSlice",
            &paths(&["metadata.namespace", "metadata.labels['kubernetes.io/service-name']"]),
            &paths(&["metadata.annotations['note']"]),
            &paths(&["ports", "endpoints[*].addresses"]),
        )
        .unwrap();
        let slice = |address: &str, node: &str| {
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"namespace": "a", "name": "web-x", "uid": "1f", "generation": 3,
                                "labels": {"kubernetes.io/service-name": "web", "other": "x"},
                                "annotations": {"note": "kept", "trigger-time": node}},
                   "ports": [{"port": 80}],
                   "endpoints": [{"addresses": [address], "nodeName": node}]})
        };
        assert!(store.apply(slice("10.0.0.1", "n1")).unwrap());
        assert_eq!(
            store.apply_noting(slice("10.0.0.1", "n2")).unwrap(),
            Applied::Unchanged,
            "only dropped fields moved"
        );
        assert!(store.apply(slice("10.0.0.2", "n2")).unwrap(), "a kept field changed");
        let key = IndexKey::new(["a", "web"]);
        let stored = store.lookup(&key).next().expect("found by its index key");
        let kept: Json = serde_json::to_value(&stored.value).unwrap();
        assert_eq!(
            kept,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                                "metadata": {"namespace": "a", "name": "web-x",
                                             "labels": {"kubernetes.io/service-name": "web"},
                                             "annotations": {"note": "kept"}},
                                "ports": [{"port": 80}], "endpoints": [{"addresses": ["10.0.0.2"]}]})
        );
    }

    #[test]
    fn lookup_by_index_key_and_order_by_namespace_then_name() {
        let mut store = store();
        for (ns, name) in [("b", "x"), ("a", "y"), ("a", "x")] {
            store.apply(service(ns, name, 80, "1")).unwrap();
        }
        let order: Vec<_> = store.iter().map(|o| o.reference.to_string()).collect();
        assert_eq!(order, ["Service a/x", "Service a/y", "Service b/x"]);
        let found: Vec<_> = store.lookup(&IndexKey::new(["a", "y"])).map(|o| o.reference.to_string()).collect();
        assert_eq!(found, ["Service a/y"]);
        assert!(store.delete(&ObjectKey { namespace: "a".into(), name: "y".into() }));
        assert_eq!(store.lookup(&IndexKey::new(["a", "y"])).count(), 0);
    }

    proptest::proptest! {
        /// Whatever objects come and go (many under one index key, one, or none), a lookup finds
        /// exactly those of the store under its key, in (namespace, name) order.
        #[test]
        fn a_lookup_finds_the_objects_under_its_key_in_order(
            changes in proptest::collection::vec((0..3usize, 0..4usize, 0..3usize, proptest::bool::ANY), 0..40),
        ) {
            let paths = vec![FieldPath::parse("metadata.labels.app").unwrap()];
            let mut store = ResourceStore::new("Service", paths);
            let apps = ["web", "api", "db"];
            for (namespace, name, app, keep) in changes {
                let (namespace, name) = (["a", "b", "c"][namespace], format!("s{name}"));
                if keep {
                    store.apply(json!({"metadata": {"namespace": namespace, "name": name, "labels": {"app": apps[app]}}})).unwrap();
                } else {
                    store.delete(&ObjectKey { namespace: namespace.into(), name: name.as_str().into() });
                }
                for app in apps {
                    let found: Vec<_> = store.lookup(&IndexKey::new([app])).map(|o| o.reference.key.clone()).collect();
                    let wanted: Vec<_> = store
                        .iter()
                        .filter(|o| o.index_key == Some(IndexKey::new([app])))
                        .map(|o| o.reference.key.clone())
                        .collect();
                    proptest::prop_assert_eq!(found, wanted);
                }
            }
        }
    }

    #[test]
    fn relist_with_the_same_content_is_no_change() {
        let mut store = store();
        store.apply(service("a", "web", 80, "1")).unwrap();
        assert!(!store.replace_all([service("a", "web", 80, "7")]).unwrap());
        assert!(store.replace_all([service("a", "web", 80, "7"), service("a", "api", 80, "8")]).unwrap());
        assert!(store.replace_all([service("a", "api", 80, "8")]).unwrap());
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn relisting_one_namespace_leaves_the_others_alone() {
        let mut store = store();
        store.apply(service("a", "web", 80, "1")).unwrap();
        store.apply(service("b", "web", 80, "1")).unwrap();
        assert!(!store.replace_scope(Some("a"), [service("a", "web", 80, "9")]).unwrap());
        assert!(store.replace_scope(Some("a"), []).unwrap());
        let left: Vec<_> = store.iter().map(|o| o.reference.to_string()).collect();
        assert_eq!(left, ["Service b/web"]);
    }

    #[test]
    fn nameless_objects_are_refused() {
        let error = store().apply(json!({"metadata": {}})).unwrap_err();
        assert_eq!(error.to_string(), "a Service object without metadata.name was ignored");
    }
}
