//! What templates see: `resources.<alias>` with `list()`, `fetch(keys...)` and `get(keys...)`,
//! and every stored object wrapped so a refused value can be traced to the object it came from.

use std::cell::RefCell;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, ErrorKind, State};

use crate::store::{IndexKey, ObjectRef, ResourceStore, StoredObject, Stores};

thread_local! {
    /// The stored object a template touched last, named in render errors. Renders are
    /// synchronous on one thread, so a thread-local follows exactly one render.
    static LAST_OBJECT: RefCell<Option<Arc<TrackedObject>>> = const { RefCell::new(None) };
    /// The object whose value was refused, and the field that held it, so the controller can
    /// leave the object out and retry, and say where the value was without quoting it.
    static OFFENDER: RefCell<Option<Offender>> = const { RefCell::new(None) };
}

/// An object blamed for a refused value.
#[derive(Clone, Debug)]
pub(crate) struct Offender {
    /// The object.
    pub(crate) object: ObjectRef,
    /// The field holding the value (`spec.rules[0].host`), when the value is one of the
    /// object's own rather than computed from them.
    pub(crate) field: Option<String>,
}

/// Forgets what the previous render touched.
pub(crate) fn reset_tracking() {
    LAST_OBJECT.with(|last| last.borrow_mut().take());
    OFFENDER.with(|offender| offender.borrow_mut().take());
}

/// The object a template touched last.
pub(crate) fn last_object() -> Option<ObjectRef> {
    LAST_OBJECT.with(|last| last.borrow().as_ref().map(|tracked| tracked.reference.as_ref().clone()))
}

/// Blames the object touched last for a refused value, naming the field that holds it.
pub(crate) fn blame_value(value: &str) {
    let Some(last) = LAST_OBJECT.with(|last| last.borrow().clone()) else { return };
    let field = field_holding(&last.inner, value);
    let offender = Offender { object: last.reference.as_ref().clone(), field };
    OFFENDER.with(|blamed| *blamed.borrow_mut() = Some(offender));
}

/// Blames the object touched last for a refused value in a field known by name (a value
/// that is not a string, such as a Secret's data).
pub(crate) fn blame_field(field: &str) {
    let Some(object) = last_object() else { return };
    let offender = Offender { object, field: Some(field.to_owned()) };
    OFFENDER.with(|blamed| *blamed.borrow_mut() = Some(offender));
}

/// `refuse(object, field, message)`: refuses `object` (its `field` blamed) with the library's
/// own message, for what no filter sees: a Secret an annotation names that does not exist.
pub(crate) fn refuse(object: &Value, field: &str, message: &str) -> Error {
    // Touching the object makes it the one blamed.
    let _ = object.get_attr("metadata");
    blame_field(field);
    let message: String = message.chars().filter(|c| !c.is_control()).collect();
    Error::new(ErrorKind::InvalidOperation, message)
}

/// The object blamed for a refused value during this render.
pub(crate) fn offender() -> Option<Offender> {
    OFFENDER.with(|offender| offender.borrow().clone())
}

/// The path of the field of `object` that holds `needle` (or, failing that, that holds it as
/// part of its text, or is part of it), e.g. `spec.rules[0].host`, `metadata.annotations
/// ["haptic.dev/timeout-server"]`. Searched only when a value is refused.
fn field_holding(object: &Value, needle: &str) -> Option<String> {
    let exact = |leaf: &str| leaf == needle;
    let partial = |leaf: &str| leaf.len() >= 3 && (leaf.contains(needle) || needle.contains(leaf));
    let mut path = String::new();
    if walk(object, &exact, &mut path, 0) || (!needle.is_empty() && walk(object, &partial, &mut path, 0)) {
        Some(path)
    } else {
        None
    }
}

/// The path of the field of `object`'s `spec` or annotations holding one of `needles` (tried
/// in order, each exactly before any in part), for a value HAProxy quoted in a refusal. Names
/// and namespaces are left out of the search: a file named after them is no field of theirs.
pub(crate) fn field_holding_any(object: &Value, needles: &[String]) -> Option<String> {
    let roots = [("spec", vec!["spec"]), ("metadata.annotations", vec!["metadata", "annotations"])];
    let roots: Vec<(&str, Value)> = roots
        .iter()
        .filter_map(|(name, path)| {
            let mut value = object.clone();
            for key in path {
                value = value.get_attr(key).ok().filter(|v| !v.is_undefined() && !v.is_none())?;
            }
            Some((*name, value))
        })
        .collect();
    for exact in [true, false] {
        for needle in needles.iter().filter(|n| !n.is_empty()) {
            let matches = |leaf: &str| {
                // In part: the field holds the quoted value among more (a rewrite's regex and
                // its replacement), never the other way round (a short field inside a long message).
                if exact { leaf == needle } else { leaf.contains(needle.as_str()) }
            };
            for (name, root) in &roots {
                let mut path = String::new();
                if walk(root, &matches, &mut path, 0) {
                    let separator = if path.starts_with('[') { "" } else { "." };
                    return Some(format!("{name}{separator}{path}"));
                }
            }
        }
    }
    None
}

fn walk(value: &Value, matches: &dyn Fn(&str) -> bool, path: &mut String, depth: usize) -> bool {
    use minijinja::value::ValueKind;
    if depth > 32 {
        return false;
    }
    let before = path.len();
    match value.kind() {
        ValueKind::String => value.as_str().is_some_and(matches),
        ValueKind::Seq => {
            let Ok(items) = value.try_iter() else { return false };
            for (index, item) in items.enumerate() {
                path.push_str(&format!("[{index}]"));
                if walk(&item, matches, path, depth + 1) {
                    return true;
                }
                path.truncate(before);
            }
            false
        }
        ValueKind::Map => {
            let Ok(keys) = value.try_iter() else { return false };
            for key in keys {
                let Ok(item) = value.get_item(&key) else { continue };
                let name = key.as_str().unwrap_or("?");
                // Keys are the cluster's too (the API server restricts them): written as they
                // stand only when plainly inert.
                let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let inert = name.chars().all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
                match (plain, inert) {
                    (true, _) if before == 0 => path.push_str(name),
                    (true, _) => {
                        path.push('.');
                        path.push_str(name);
                    }
                    (false, true) => path.push_str(&format!("[{name:?}]")),
                    (false, false) => path.push_str("[?]"),
                }
                if walk(&item, matches, path, depth + 1) {
                    return true;
                }
                path.truncate(before);
            }
            false
        }
        _ => false,
    }
}

/// `resources`: one [`StoreView`] per alias, made once per render (templates look them up
/// for every route).
#[derive(Debug)]
pub(crate) struct Resources {
    views: std::collections::BTreeMap<String, Value>,
}

impl Resources {
    pub(crate) fn new(stores: &Stores, listed_before: &Listings) -> Self {
        let views = stores
            .iter()
            .map(|(alias, store)| {
                let view = StoreView {
                    alias: alias.as_str().into(),
                    store: store.clone(),
                    listed_before: listed_before.get(alias.as_str()).cloned(),
                    listing: std::sync::OnceLock::new(),
                    all: std::sync::OnceLock::new(),
                };
                (alias.clone(), Value::from_object(view))
            })
            .collect();
        Self { views }
    }

    /// The stores this render listed, to be mended by the next render instead of listed again.
    pub(crate) fn listings(&self) -> Listings {
        self.views
            .values()
            .filter_map(|view| view.downcast_object_ref::<StoreView>())
            .filter_map(|view| {
                let items = view.listing.get()?.clone();
                Some((view.alias.clone(), Listing { generation: view.store.generation(), items }))
            })
            .collect()
    }

    fn store(&self, alias: &str) -> Option<&StoreView> {
        self.views.get(alias)?.downcast_object_ref::<StoreView>()
    }
}

impl Object for Resources {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get_value_by_str(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.views.get(key).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.views.keys().map(|alias| Value::from(alias.as_str())).collect())
    }
}

/// `resources.<alias>`: the objects of one watched resource type.
#[derive(Debug)]
pub(crate) struct StoreView {
    alias: Arc<str>,
    store: Arc<ResourceStore>,
    /// The store as the last kept render listed it, if it did.
    listed_before: Option<Listing>,
    /// Every object as a template value, in order, made on first use in this render.
    listing: std::sync::OnceLock<imbl::Vector<Value>>,
    /// The listing as templates see it.
    all: std::sync::OnceLock<Value>,
}

/// A store's objects as template values, in the store's order, at one of its generations.
#[derive(Clone, Debug)]
pub(crate) struct Listing {
    generation: u64,
    /// Persistent: the next render mends a copy where objects changed, sharing the rest.
    items: imbl::Vector<Value>,
}

/// Listings by alias.
pub(crate) type Listings = std::collections::HashMap<Arc<str>, Listing, foldhash::fast::RandomState>;

/// At most this many changes (and at most one object in eight changed) are mended into the
/// last render's listing; more, and the store is listed anew.
const LISTING_MENDED_AT_MOST: usize = 256;

/// The listing of `store`: `before` (the last kept render's) with the objects changed since
/// mended in, or listed anew when the store's history does not reach back to it or too much
/// changed. Listing 10,000 Ingresses anew at every render was a tenth of a render after one
/// change: each object found in the store's tree and its template value read from the object.
fn listing(store: &ResourceStore, before: Option<&Listing>) -> imbl::Vector<Value> {
    let afresh = || store.iter().map(|object| template_value(object)).collect();
    let Some(before) = before else { return afresh() };
    let Some(mut changed) = store.objects_changed_since(before.generation) else { return afresh() };
    if changed.len() > LISTING_MENDED_AT_MOST || changed.len() > before.items.len() / 8 + 1 {
        return afresh();
    }
    changed.sort_unstable();
    changed.dedup();
    let mut items = before.items.clone();
    for key in changed {
        let place = items.binary_search_by(|item| listed_key(item).cmp(&Some(key)));
        match (place, store.by_key(key)) {
            (Ok(at), Some(object)) => {
                items.set(at, template_value(object));
            }
            (Ok(at), None) => {
                items.remove(at);
            }
            (Err(at), Some(object)) => items.insert(at, template_value(object)),
            (Err(_), None) => {}
        }
    }
    items
}

/// The key of a listed object (every listed item is one).
fn listed_key(item: &Value) -> Option<&crate::store::ObjectKey> {
    item.downcast_object_ref::<TrackedObject>().map(|object| &object.reference.key)
}

/// A listing as templates see it: a sequence.
#[derive(Debug)]
struct ListingView(imbl::Vector<Value>);

/// The items of a list (minijinja's `Value::from(Vec<Value>)`), read in place.
pub(crate) fn list_items(value: &Value) -> Option<&[Value]> {
    value.downcast_object_ref::<Vec<Value>>().map(Vec::as_slice)
}

/// The items of a listing or of a store (`resources.<alias>`, its read of the whole store
/// recorded as iterating it does), read in place (`None`: the value is neither).
pub(crate) fn listed_items(value: &Value) -> Option<&imbl::Vector<Value>> {
    if let Some(store) = value.downcast_object_ref::<StoreView>() {
        store.record_whole();
        return Some(store.listing());
    }
    value.downcast_object_ref::<ListingView>().map(|view| &view.0)
}

impl Object for ListingView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_usize()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Iter(Box::new(ListingIter { items: self.0.clone(), at: 0 }))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A listing's items in order, read in place. The vector's own consuming iterator takes
/// items off its front, and the listing is shared with the store view and the next render:
/// each chunk would be copied before it was taken apart.
struct ListingIter {
    items: imbl::Vector<Value>,
    at: usize,
}

impl Iterator for ListingIter {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        let item = self.items.get(self.at)?.clone();
        self.at += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.items.len().saturating_sub(self.at);
        (left, Some(left))
    }
}

impl StoreView {
    /// Notes, for the block being rendered (if any), that it read the whole store.
    fn record_whole(&self) {
        super::memo::record_read(|| super::memo::Read::Whole {
            alias: self.alias.clone(),
            generation: self.store.generation(),
        });
    }

    /// Notes, for the block being rendered (if any), what a lookup found.
    fn record_lookup(&self, key: &IndexKey, found: &[&Arc<StoredObject>]) {
        super::memo::record_read(|| {
            // The store's own copy of the key, when it has one: the one asked for is dropped
            // with the render, and the store's is shared with the store.
            let key = found.first().and_then(|object| object.index_key.clone()).unwrap_or_else(|| key.clone());
            super::memo::Read::Lookup {
                alias: self.alias.clone(),
                generation: super::memo::AtomicGeneration::new(self.store.generation()),
                digest: crate::store::KeyDigest::of(&key),
                key,
                found: found.iter().map(|object| (object.content, object.ignored)).collect(),
            }
        });
    }

    /// Whether the store holds exactly `found` under `key`.
    fn finds(&self, key: &IndexKey, found: &[super::memo::Identity]) -> bool {
        let mut now = self.store.lookup(key);
        found.iter().all(|identity| now.next().is_some_and(|object| (object.content, object.ignored) == *identity))
            && now.next().is_none()
    }

    fn all(&self) -> Value {
        self.record_whole();
        self.all.get_or_init(|| Value::from_object(ListingView(self.listing().clone()))).clone()
    }

    fn listing(&self) -> &imbl::Vector<Value> {
        self.listing.get_or_init(|| listing(&self.store, self.listed_before.as_ref()))
    }

    fn index_key(&self, method: &str, args: &[Value]) -> Result<IndexKey, Error> {
        let paths = self.store.index_by();
        if args.len() != paths.len() {
            let names: Vec<_> = paths.iter().map(ToString::to_string).collect();
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "resources.{}.{method} takes {} index keys ({}), got {}",
                    self.alias,
                    paths.len(),
                    names.join(", "),
                    args.len()
                ),
            ));
        }
        let values = args
            .iter()
            .map(|arg| match arg.as_str() {
                Some(text) => Ok(std::borrow::Cow::Borrowed(text)),
                None if arg.is_number() || arg.kind() == minijinja::value::ValueKind::Bool => {
                    Ok(std::borrow::Cow::Owned(arg.to_string()))
                }
                None => Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("resources.{}.{method}: index keys are strings or numbers, got {arg:?}", self.alias),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IndexKey::new(values))
    }
}

impl Object for StoreView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.record_whole();
        Enumerator::Iter(Box::new(ListingIter { items: self.listing().clone(), at: 0 }))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        self.record_whole();
        Some(self.store.len())
    }

    fn call_method(self: &Arc<Self>, _: &mut State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        match method {
            "list" => Ok(self.all()),
            "fetch" => {
                let key = self.index_key(method, args)?;
                let found: Vec<_> = self.store.lookup(&key).collect();
                self.record_lookup(&key, &found);
                Ok(Value::from(found.into_iter().map(|object| template_value(object)).collect::<Vec<_>>()))
            }
            "get" => {
                // One lookup serves the answer and the block's record of it (a render makes
                // one per Ingress and per backend).
                let key = self.index_key(method, args)?;
                let found: Vec<_> = self.store.lookup(&key).collect();
                self.record_lookup(&key, &found);
                if let [first, second, ..] = found.as_slice() {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "resources.{}.get({}) matches more than one object ({}, {}, ...); use fetch",
                            self.alias,
                            key.values().collect::<Vec<_>>().join(", "),
                            first.reference,
                            second.reference
                        ),
                    ));
                }
                Ok(found.first().map(|object| template_value(object)).unwrap_or(Value::from(())))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("resources.{} has no method {method}; use list(), fetch(keys...) or get(keys...)", self.alias),
            )),
        }
    }
}

/// A stored object as templates see it: a map that records itself as "last touched".
#[derive(Debug)]
struct TrackedObject {
    reference: Arc<ObjectRef>,
    /// Who the object is, content and all (what a block's key holds of it).
    identity: super::memo::Identity,
    inner: Value,
}

impl super::memo::Fingerprinted for TrackedObject {
    fn feed(&self, digest: &mut super::memo::Digest) -> bool {
        use std::hash::Hasher;
        digest.write(self.identity.0.as_bytes());
        digest.write_u64(self.identity.1.map_or(0, std::num::NonZeroU64::get));
        true
    }
}

/// The value's own fingerprint, when it is a stored object or a route.
pub(crate) fn fingerprinted(value: &Value) -> Option<&dyn super::memo::Fingerprinted> {
    if let Some(object) = value.downcast_object_ref::<TrackedObject>() {
        return Some(object);
    }
    super::library::route_fingerprinted(value)
}

/// Whether the value is one of the render's live objects (the stores, the shared state, a
/// collector), which have no content of their own to fingerprint.
pub(crate) fn is_live(value: &Value) -> bool {
    value.downcast_object_ref::<Resources>().is_some()
        || value.downcast_object_ref::<StoreView>().is_some()
        || value.downcast_object_ref::<Shared>().is_some()
        || value.downcast_object_ref::<Collector>().is_some()
}

impl Object for TrackedObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        touch(self);
        self.inner.get_item(key).ok().filter(|value| !value.is_undefined())
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        touch(self);
        self.inner.get_attr(key).ok().filter(|value| !value.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.inner.try_iter() {
            Ok(keys) => Enumerator::Values(keys.collect()),
            Err(_) => Enumerator::Empty,
        }
    }
}

/// The members of the stored object `value` is (a `resources` lookup's answer), touching it as
/// attribute access does (a value refused later blames it); none for any other value.
pub(crate) fn stored_members(value: &Value) -> Option<&[(Arc<str>, crate::store::compact::Node)]> {
    let tracked = value.downcast_object_ref::<TrackedObject>()?;
    let members = crate::store::compact::map_members(&tracked.inner)?;
    if let Some(object) = value.downcast_object::<TrackedObject>() {
        touch(&object);
    }
    Some(members)
}

/// Makes `object` the one touched last (what a refused value blames).
fn touch(object: &Arc<TrackedObject>) {
    LAST_OBJECT.with(|last| {
        // Attribute access is the hottest path of a render: compare pointers, not names.
        let mut last = last.borrow_mut();
        if !last.as_ref().is_some_and(|known| Arc::ptr_eq(&known.reference, &object.reference)) {
            *last = Some(object.clone());
        }
    });
}

/// A stored object as a `resources` lookup hands it to templates (for tests of functions that
/// read stored objects).
#[cfg(test)]
pub(crate) fn tracked_value(object: &StoredObject) -> Value {
    template_value(object)
}

fn template_value(object: &StoredObject) -> Value {
    object.template_value(|stored| {
        Value::from_object(TrackedObject {
            reference: Arc::new(stored.reference.clone()),
            identity: (stored.content, stored.ignored),
            inner: stored.value.clone(),
        })
    })
}

/// A shared collector's items ordered by an attribute: (collector, attribute, reverse).
type SortedKey = (Arc<str>, String, bool);

/// A sorted view and the order that made it: the places, among the items it was made from, of
/// its items in turn. The items themselves are the view's, read through the order: a copy of
/// them beside the view, 10,000 routes counted up and later down again, was most of what
/// mending a view cost. They are a persistent vector (a listing, to templates), so a view
/// mended for a few changed items shares all but the nodes around them with the view before:
/// built as a list anew, each of the 10,000 routes was counted up for the new view and down
/// again when the old one went, a sixth of a render after one change.
#[derive(Debug)]
pub(crate) struct SortedView {
    order: Vec<u32>,
    /// For each place among the items, where that item is in the view.
    in_view: Vec<u32>,
    sorted: imbl::Vector<Value>,
}

impl SortedView {
    /// The view of `sorted`, made in `order`.
    fn new(order: Vec<u32>, sorted: imbl::Vector<Value>) -> Self {
        let mut in_view = vec![0; order.len()];
        for (at, place) in order.iter().enumerate() {
            if let Some(slot) = in_view.get_mut(*place as usize) {
                *slot = u32::try_from(at).unwrap_or(u32::MAX);
            }
        }
        Self { order, in_view, sorted }
    }

    /// The view of `items` in `order`, each item taken from `items`.
    fn taking(order: Vec<u32>, items: &[Value]) -> Self {
        let sorted = order.iter().filter_map(|at| items.get(*at as usize).cloned()).collect();
        Self::new(order, sorted)
    }

    /// The view's items, in its order.
    fn sorted_items(&self) -> &imbl::Vector<Value> {
        &self.sorted
    }

    /// The view as templates see it: a listing (sharing the vector).
    fn as_listing(&self) -> Value {
        Value::from_object(ListingView(self.sorted.clone()))
    }

    /// How many items the view was made from.
    fn len(&self) -> usize {
        self.in_view.len()
    }

    /// Whether the view was made from exactly these items (walked in the view's order: the
    /// vector read in turn, the items' list at random).
    fn made_from(&self, items: &[Value]) -> bool {
        let sorted = self.sorted_items();
        self.len() == items.len()
            && sorted.len() == items.len()
            && sorted
                .iter()
                .zip(&self.order)
                .all(|(was, place)| items.get(*place as usize).is_some_and(|now| same_item(was, now)))
    }

    /// The view of `items` in `mended`'s order: this view's vector with the items gone taken
    /// out and the new ones put in, when every item kept is the very object this view holds
    /// (else each item is taken from `items`, as equal is not the same: a vetted text and an
    /// unvetted one compare equal).
    fn mended(&self, mended: Mended, items: &[Value]) -> Self {
        if !mended.kept_the_same_objects {
            return Self::taking(mended.order, items);
        }
        let mut sorted = self.sorted_items().clone();
        let mut gone: Vec<usize> =
            mended.gone.iter().filter_map(|place| self.in_view.get(*place)).map(|at| *at as usize).collect();
        gone.sort_unstable_by(|a, b| b.cmp(a));
        for at in gone {
            if at < sorted.len() {
                sorted.remove(at);
            }
        }
        let mut new = vec![false; items.len()];
        for place in &mended.added {
            if let Some(slot) = new.get_mut(*place as usize) {
                *slot = true;
            }
        }
        // In the order's turn, so each goes in behind everything that comes before it.
        for (at, place) in mended.order.iter().enumerate() {
            if new.get(*place as usize).copied().unwrap_or(false)
                && let Some(item) = items.get(*place as usize)
            {
                sorted.insert(at.min(sorted.len()), item.clone());
            }
        }
        Self::new(mended.order, sorted)
    }
}

/// A view's order mended for the items now (see [`mended_order`]), and how.
#[derive(Debug)]
struct Mended {
    order: Vec<u32>,
    /// The places, among the view's items, of those gone.
    gone: Vec<usize>,
    /// The places, among the items now, of those put in.
    added: Vec<u32>,
    /// Whether every item kept is the same object as the view's (not only an equal value).
    kept_the_same_objects: bool,
}

/// Sorted views of shared collectors by what they sort.
pub(crate) type SortedViews = std::collections::HashMap<SortedKey, Arc<SortedView>, foldhash::quality::RandomState>;

/// The last kept render's sorted views, and this render's. A view whose collector holds the
/// same items as last time (the same objects: a reused block pushes the very values it pushed
/// before, so comparing them is a pointer compare each) is not sorted again: sorting 10,000
/// routes by backend and by path length was a tenth of a render that reused every block.
#[derive(Debug, Default)]
pub(crate) struct SortedCarry {
    before: Arc<SortedViews>,
    now: std::sync::Mutex<SortedViews>,
}

/// Whether two items are the same. Routes and stored objects compare by address first:
/// minijinja's own equality of two objects tries them as numbers first (an error formatted
/// for each), which cost more than the sort it spares.
fn same_item(before: &Value, now: &Value) -> bool {
    match (object_address(before), object_address(now)) {
        (Some(before), Some(now)) if before == now => true,
        _ => before == now,
    }
}

/// How many items may differ from a sorted view's for the view to be mended rather than made
/// anew: each costs a binary search and a move of the order behind it.
const MENDED_AT_MOST: usize = 64;

/// How far ahead an item missing at its place is looked for in the other list (items added or
/// removed there) before it counts as changed.
const MEND_LOOKAHEAD: usize = 8;

/// The order `items` sort in, mended from `view` (made from a few items fewer, more or other):
/// the items `view` had keep their order among themselves, and each other one is put in by a
/// binary search. `None` when too many differ. Sorting 10,000 routes again for one changed
/// Ingress was a fifth of a render after one change.
fn mended_order(view: &SortedView, items: &[Value], key: &dyn Fn(usize) -> Value, reverse: bool) -> Option<Mended> {
    let before_len = view.len();
    // The view's items by their places among the items it was made from (read in turn: the
    // vector looked up at random would be a search each).
    let mut by_place: Vec<Option<&Value>> = vec![None; before_len];
    for (item, place) in view.sorted_items().iter().zip(&view.order) {
        if let Some(slot) = by_place.get_mut(*place as usize) {
            *slot = Some(item);
        }
    }
    let before = |place: usize| by_place.get(place).copied().flatten();
    // Where each item of the view's is now, walking both lists side by side.
    let mut moved_to: Vec<Option<u32>> = vec![None; before_len];
    let mut new_items = Vec::new();
    let mut kept_the_same_objects = true;
    let (mut old, mut now) = (0, 0);
    while old < before_len || now < items.len() {
        if let (Some(was), Some(is)) = (before(old), items.get(now))
            && same_item(was, is)
        {
            kept_the_same_objects &= object_address(was).is_some_and(|was| object_address(is) == Some(was));
            moved_to[old] = Some(u32::try_from(now).ok()?);
            old += 1;
            now += 1;
            continue;
        }
        // The view's item further on in `items` (items added before it), or this item further
        // on in the view (the view's items before it removed).
        let added = before(old).and_then(|wanted| {
            (1..=MEND_LOOKAHEAD).find(|ahead| items.get(now + ahead).is_some_and(|item| same_item(wanted, item)))
        });
        let removed = items.get(now).and_then(|wanted| {
            (1..=MEND_LOOKAHEAD).find(|ahead| before(old + ahead).is_some_and(|item| same_item(item, wanted)))
        });
        match (added, removed) {
            (Some(count), _) => {
                new_items.extend(now..now + count);
                now += count;
            }
            (None, Some(count)) => old += count,
            (None, None) => {
                if now < items.len() {
                    new_items.push(now);
                }
                old += 1;
                now += 1;
            }
        }
        if new_items.len() > MENDED_AT_MOST {
            return None;
        }
    }
    let mut order: Vec<u32> =
        view.order.iter().filter_map(|place| moved_to.get(*place as usize).copied().flatten()).collect();
    let mut added = Vec::with_capacity(new_items.len());
    for place in new_items {
        let wanted = key(place);
        let at = order.partition_point(|other| {
            directed(compare_keys(&key(*other as usize), &wanted), reverse).then((*other as usize).cmp(&place)).is_lt()
        });
        let place = u32::try_from(place).ok()?;
        order.insert(at, place);
        added.push(place);
    }
    let gone = moved_to.iter().enumerate().filter(|(_, to)| to.is_none()).map(|(place, _)| place).collect();
    Some(Mended { order, gone, added, kept_the_same_objects })
}

/// A key comparison in the direction asked.
fn directed(ordering: std::cmp::Ordering, reverse: bool) -> std::cmp::Ordering {
    if reverse { ordering.reverse() } else { ordering }
}

/// Two sort keys in the order `Collector::sorted` sorts them: integers as integers (the same
/// order as minijinja's comparison of them, without its dispatch), anything else as minijinja
/// compares values.
fn compare_keys(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a.is_integer().then(|| a.as_i64()).flatten(), b.is_integer().then(|| b.as_i64()).flatten()) {
        (Some(a), Some(b)) => a.cmp(&b),
        _ => a.cmp(b),
    }
}

/// What a successful kept render hands the next: its server slots, its blocks, the sorted
/// views of its shared collectors, and how many names it made. A dry or failed render hands
/// nothing on.
#[derive(Clone, Debug, Default)]
pub(crate) struct Carried {
    /// Server slots of every backend: `server_slots(...)` keeps each endpoint's server name
    /// from one render to the next (see `plan::slots`); seeded from the journal at a start.
    pub(crate) slots: Arc<crate::plan::slots::Slots>,
    /// The backends whose slots the render that left `slots` and `blocks` assigned anew: a
    /// block of that render whose backend is not among them left the table `slots` holds.
    /// `None` when the slots came from elsewhere (the journal), and every block's are checked.
    pub(crate) slots_moved: Option<Arc<BackendNames>>,
    /// The blocks of `render_each`, reused where nothing they read changed.
    pub(crate) blocks: Arc<super::memo::Blocks>,
    /// Sorted views of shared collectors, reused where a collector holds the same items.
    sorted_views: Arc<SortedViews>,
    /// How many shared names the render made, to size the next one's maps.
    name_counts: NameCounts,
    /// The stores the render listed, as it listed them.
    pub(crate) listings: Arc<Listings>,
    /// The items of the render's shared collectors, which the next render's collectors write
    /// over (see `CollectorItems`); taken by the render that uses them.
    collector_items: Arc<std::sync::Mutex<Names<Vec<Value>>>>,
}

/// How many collectors and claimed names a render made.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NameCounts {
    collectors: usize,
    claimed_names: usize,
}

/// Backends by name.
pub(crate) type BackendNames = std::collections::HashSet<String, foldhash::fast::RandomState>;

/// The names a render claimed, by fingerprint.
type ClaimedNames = std::sync::Mutex<super::memo::FingerprintSet>;

/// Maps by name that templates fill by the tens of thousands per render.
type Names<V> = std::collections::HashMap<Arc<str>, V, foldhash::quality::RandomState>;

/// `shared`: state that lives for one render and is seen by every template of it, so work
/// done for one file (a route table, say) is not redone for the next.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    collectors: std::sync::Mutex<Names<Arc<Collector>>>,
    /// Every name claimed (shared collectors' and `distinct`'s), by fingerprint: a claim is
    /// only a name, and a collector object made for each of a render's ~20,000 claims was a
    /// tenth of a render that reused every block. Shared collectors claim here too.
    claimed_names: Arc<ClaimedNames>,
    /// Certificates registered by `tls_certificate(...)`, by file name.
    certs: std::sync::Mutex<std::collections::BTreeMap<String, crate::files::RenderedFile>>,
    /// General files registered by functions (`ca_file(...)`), by file name.
    files: std::sync::Mutex<std::collections::BTreeMap<String, crate::files::RenderedFile>>,
    /// Server slots of every backend as the last kept render left them: shared, not copied
    /// (10,000 backends' names copied at every render was 3% of a render that reused all).
    slots_before: Arc<crate::plan::slots::Slots>,
    /// The backends the render that left `slots_before` assigned anew (see `Carried`).
    slots_moved_before: Option<Arc<BackendNames>>,
    /// Sorted views of shared collectors, the last kept render's and this one's.
    sorted_views: Arc<SortedCarry>,
    /// The backends whose slots this render assigned anew, over `slots_before`.
    slots_assigned: std::sync::Mutex<crate::plan::slots::Slots>,
    /// The blocks of `render_each` this render may reuse, and those it uses.
    blocks: super::memo::RenderBlocks,
    /// The last render's shared collectors' items, each taken by this render's collector of
    /// the same name when it is made.
    collector_items_before: Arc<std::sync::Mutex<Names<Vec<Value>>>>,
}

impl Shared {
    /// Shared state for a render that starts from what the last kept render handed on.
    pub(crate) fn starting_from(carried: Carried) -> Self {
        // As many names as the last render had: sized once, not grown by rehashing.
        let expected = carried.name_counts;
        Self {
            collectors: std::sync::Mutex::new(Names::with_capacity_and_hasher(expected.collectors, Default::default())),
            claimed_names: Arc::new(std::sync::Mutex::new(super::memo::FingerprintSet::with_capacity_and_hasher(
                expected.claimed_names,
                Default::default(),
            ))),
            slots_before: carried.slots,
            slots_moved_before: carried.slots_moved,
            sorted_views: Arc::new(SortedCarry { before: carried.sorted_views, now: Default::default() }),
            blocks: super::memo::RenderBlocks::reusing(carried.blocks),
            collector_items_before: carried.collector_items,
            ..Self::default()
        }
    }

    /// How many blocks this render reused and rendered.
    pub(crate) fn block_counts(&self) -> super::memo::BlockCounts {
        self.blocks.counts()
    }

    /// What this render hands the next, taken (the render is over), with the stores it listed.
    pub(crate) fn take_carried(&self, listings: Listings) -> Carried {
        let (slots, moved) = self.take_slots();
        Carried {
            slots,
            slots_moved: Some(Arc::new(moved)),
            blocks: Arc::new(self.blocks.take_used()),
            sorted_views: Arc::new(
                self.sorted_views.now.lock().map(|mut now| std::mem::take(&mut *now)).unwrap_or_default(),
            ),
            name_counts: NameCounts {
                collectors: self.collectors.lock().map(|collectors| collectors.len()).unwrap_or_default(),
                claimed_names: self.claimed_names.lock().map(|claims| claims.len()).unwrap_or_default(),
            },
            listings: Arc::new(listings),
            collector_items: Arc::new(std::sync::Mutex::new(self.take_collector_items())),
        }
    }

    /// The shared collectors' items, taken (the render is over), for the next render's.
    fn take_collector_items(&self) -> Names<Vec<Value>> {
        let Ok(collectors) = self.collectors.lock() else { return Names::default() };
        collectors
            .iter()
            .filter_map(|(name, collector)| {
                let mut items = collector.items.lock().ok()?;
                let values = std::mem::take(items.settled());
                (!values.is_empty()).then(|| (name.clone(), values))
            })
            .collect()
    }

    /// Assigns a backend's endpoints to its slots (once per render: a backend rendered twice,
    /// in two files, gets the same answer) and hands the table to `read`. The table is read in
    /// place: at 10,000 backends, copying each one in and out was a tenth of a render.
    pub(crate) fn with_slots<R>(
        &self,
        backend: &str,
        endpoints: &[crate::plan::slots::EndpointKey],
        block: usize,
        read: impl FnOnce(&crate::plan::slots::SlotTable) -> R,
    ) -> R {
        use crate::plan::slots::{SlotTable, assign};
        let table = {
            let Ok(mut assigned) = self.slots_assigned.lock() else {
                return read(&assign(&SlotTable::default(), endpoints, block));
            };
            match self.table_in(&assigned, backend) {
                Some(table) if table.holds_exactly(endpoints) => table.clone(),
                current => {
                    let table =
                        Arc::new(assign(current.map_or(&SlotTable::default(), |table| table), endpoints, block));
                    assigned.insert(backend.to_owned(), table.clone());
                    table
                }
            }
        };
        super::memo::record_effect(|| super::memo::Effect::Slots { backend: backend.into(), table: table.clone() });
        read(&table)
    }

    /// A backend's slots now: as this render assigned them, else as they were.
    fn table_in<'a>(
        &'a self,
        assigned: &'a crate::plan::slots::Slots,
        backend: &str,
    ) -> Option<&'a Arc<crate::plan::slots::SlotTable>> {
        assigned.get(backend).or_else(|| self.slots_before.get(backend))
    }

    /// The server slots after this render (the render is over: nothing assigns more), and the
    /// backends it assigned anew. The same tables as before, not a copy, when no backend's
    /// endpoints moved.
    fn take_slots(&self) -> (Arc<crate::plan::slots::Slots>, BackendNames) {
        let assigned =
            self.slots_assigned.lock().map(|mut assigned| std::mem::take(&mut *assigned)).unwrap_or_default();
        if assigned.is_empty() {
            return (self.slots_before.clone(), BackendNames::default());
        }
        let moved = assigned.keys().cloned().collect();
        let mut slots = crate::plan::slots::Slots::clone(&self.slots_before);
        slots.extend(assigned);
        (Arc::new(slots), moved)
    }

    /// Registers a certificate file of this render (the same name twice keeps one).
    pub(crate) fn add_cert(&self, name: String, pem: String) {
        self.add_cert_file(name, crate::files::RenderedFile::sensitive(pem));
    }

    fn add_cert_file(&self, name: String, file: crate::files::RenderedFile) {
        super::memo::record_effect(|| super::memo::Effect::Cert { name: name.clone(), file: Box::new(file.clone()) });
        self.keep_cert_file(name, file);
    }

    fn keep_cert_file(&self, name: String, file: crate::files::RenderedFile) {
        if let Ok(mut certs) = self.certs.lock() {
            certs.entry(name).or_insert(file);
        }
    }

    /// Registers a general file of this render (the same name twice keeps one).
    pub(crate) fn add_file(&self, name: String, content: String) {
        self.add_general_file(name, crate::files::RenderedFile::new(content));
    }

    fn add_general_file(&self, name: String, file: crate::files::RenderedFile) {
        super::memo::record_effect(|| super::memo::Effect::File { name: name.clone(), file: Box::new(file.clone()) });
        self.keep_general_file(name, file);
    }

    fn keep_general_file(&self, name: String, file: crate::files::RenderedFile) {
        if let Ok(mut files) = self.files.lock() {
            files.entry(name).or_insert(file);
        }
    }

    /// The general files registered so far.
    pub(crate) fn files(&self) -> std::collections::BTreeMap<String, crate::files::RenderedFile> {
        self.files.lock().map(|files| files.clone()).unwrap_or_default()
    }

    /// The certificates registered so far.
    pub(crate) fn certs(&self) -> std::collections::BTreeMap<String, crate::files::RenderedFile> {
        self.certs.lock().map(|certs| certs.clone()).unwrap_or_default()
    }

    /// The shared collector of this name, made on first use.
    fn collector(&self, name: &str) -> Result<Arc<Collector>, Error> {
        self.collector_named(name, || name.into())
    }

    /// The shared collector of this name, made on first use under the name `owned` gives.
    fn collector_named(&self, name: &str, owned: impl FnOnce() -> Arc<str>) -> Result<Arc<Collector>, Error> {
        // Templates ask for tens of thousands of names (a claim per backend and map key):
        // hashed, and a name's copy made only when it is new.
        let mut collectors = self.collectors.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
        if let Some(collector) = collectors.get(name) {
            return Ok(collector.clone());
        }
        let name = owned();
        let before = self.collector_items_before.lock().ok().and_then(|mut before| before.remove(&name));
        let collector = Arc::new(Collector {
            items: std::sync::Mutex::new(CollectorItems::writing_over(before.unwrap_or_default())),
            claim: Some((super::memo::name_fingerprint(&name), self.claimed_names.clone())),
            name: Some(name.clone()),
            sorted_views: Some(self.sorted_views.clone()),
            ..Collector::default()
        });
        collectors.insert(name, collector.clone());
        Ok(collector)
    }

    /// `distinct(collector, attribute, claim_prefix)`: the collector's items ordered by one
    /// attribute, the first of each value only, and only those whose `claim_prefix ~ value`
    /// collector this call claims (a backend rendered once whichever loop reaches it first).
    fn distinct(&self, collector: &str, attribute: &Value, claim_prefix: &str) -> Result<Value, Error> {
        let sorted = self.collector(collector)?.sorted(attribute, false)?;
        let attribute = attribute.as_str().unwrap_or_default();
        let mut chosen = Vec::new();
        let mut last: Option<Value> = None;
        let mut name = String::from(claim_prefix);
        // Routes by backend (the library's backends) are read, and their names fingerprinted,
        // in the route itself: once per route, not once per render.
        let routes_by_backend = attribute == "backend";
        let prefix_fingerprint = super::memo::name_fingerprint(claim_prefix);
        // One lock for the call's thousands of claims (nothing below claims by another way).
        let mut claims = self.claimed_names.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
        // Read in place (see `memo::render_each`), and answered as places in the sorted view:
        // the items chosen are not copied out of it either.
        // (`Collector::sorted` always answers with a listing.)
        let items = listed_items(&sorted).ok_or_else(|| Error::from(ErrorKind::InvalidOperation))?;
        for (place, item) in items.iter().enumerate() {
            let route = super::library::as_route(item).filter(|_| routes_by_backend);
            let value = match route {
                Some(route) => route.backend().clone(),
                None => item.get_attr(attribute).unwrap_or_default(),
            };
            if last.as_ref() == Some(&value) {
                continue;
            }
            let claimed = match route {
                Some(route) => route.backend_claim(claim_prefix, prefix_fingerprint),
                None => {
                    name.truncate(claim_prefix.len());
                    name.push_str(value.as_str().unwrap_or_default());
                    super::memo::name_fingerprint(&name)
                }
            };
            let won = claims.insert(claimed);
            super::memo::record_effect(|| super::memo::Effect::Claim { name: claimed, won });
            if won {
                chosen.push(u32::try_from(place).map_err(|_| Error::from(ErrorKind::InvalidOperation))?);
            }
            last = Some(value);
        }
        drop(claims);
        Ok(Value::from_object(Picked { from: sorted, places: chosen }))
    }
}

/// `distinct`'s answer: the items it chose, as places in the sorted view they came from (a
/// sequence to templates). Copied out, the 10,000 routes chosen were each counted up, and down
/// again when the render was over.
#[derive(Debug)]
struct Picked {
    /// A listing (a sorted view's).
    from: Value,
    /// Ascending: `distinct` walks the view in turn.
    places: Vec<u32>,
}

impl Picked {
    fn source(&self) -> Option<&imbl::Vector<Value>> {
        listed_items(&self.from)
    }
}

impl Object for Picked {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let place = *self.places.get(key.as_usize()?)?;
        self.source()?.get(place as usize).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.places.len())
    }
}

/// The items `distinct` chose, read in place, the view walked in turn (`None`: the value is
/// not its answer).
pub(crate) fn picked_items(value: &Value) -> Option<impl Iterator<Item = &Value>> {
    let picked = value.downcast_object_ref::<Picked>()?;
    let mut places = picked.places.iter().map(|place| *place as usize).peekable();
    let items = picked.source()?.iter().enumerate();
    Some(items.filter_map(move |(at, item)| places.next_if_eq(&at).map(|_| item)))
}

/// The render as blocks being checked and replayed see it.
pub(crate) struct RenderNow<'a> {
    resources: &'a Resources,
    shared: &'a Shared,
    /// The collectors pushes were last replayed into: a call's blocks push into the same few
    /// (every Ingress into `routes` and one of `routes/<hosts>/<match>`), and looking each
    /// push's collector up by name was a tenth of a render that reused every block.
    recent_collectors: AtHand<Arc<Collector>>,
    /// The stores reads were last checked against: a block's reads name their store, and
    /// finding it by name for each of a render's tens of thousands of reads compared strings
    /// in the map of aliases every time.
    recent_stores: AtHand<&'a StoreView>,
}

/// The last few things found by name, kept at hand: names are shared copies, so most are
/// recognised by address.
struct AtHand<T>(std::cell::RefCell<[Option<Named<T>>; 4]>);

/// A thing and the name it was found by.
type Named<T> = (Arc<str>, T);

impl<T: Clone> AtHand<T> {
    fn new() -> Self {
        Self(std::cell::RefCell::new([const { None }; 4]))
    }

    /// The thing of this name: at hand, or found by `find` and kept at hand.
    fn get(&self, name: &Arc<str>, find: impl FnOnce() -> Option<T>) -> Option<T> {
        self.with(name, find, T::clone)
    }

    /// `with` given the thing of this name (see `get`), lent rather than copied: a copy of a
    /// shared collector counted it up and down for each of a render's tens of thousands of
    /// replayed pushes.
    fn with<R>(&self, name: &Arc<str>, find: impl FnOnce() -> Option<T>, with: impl FnOnce(&T) -> R) -> Option<R> {
        let mut recent = self.0.borrow_mut();
        let at_hand = recent.iter().flatten().find(|(known, _)| Arc::ptr_eq(known, name) || **known == **name);
        if let Some((_, thing)) = at_hand {
            return Some(with(thing));
        }
        let thing = find()?;
        recent.rotate_right(1);
        let (_, thing) = recent[0].insert((name.clone(), thing));
        Some(with(thing))
    }
}

impl<'a> RenderNow<'a> {
    fn new(resources: &'a Resources, shared: &'a Shared) -> Self {
        Self { resources, shared, recent_collectors: AtHand::new(), recent_stores: AtHand::new() }
    }

    /// `with` given the shared collector of this name.
    fn with_collector<R>(&self, name: &Arc<str>, with: impl FnOnce(&Collector) -> R) -> Option<R> {
        self.recent_collectors.with(
            name,
            || self.shared.collector_named(name, || name.clone()).ok(),
            |collector| with(collector),
        )
    }

    /// The store of this alias.
    fn view(&self, alias: &Arc<str>) -> Option<&'a StoreView> {
        self.recent_stores.get(alias, || self.resources.store(alias))
    }
}

impl super::memo::RenderState for RenderNow<'_> {
    fn generation(&self, alias: &Arc<str>) -> Option<u64> {
        Some(self.view(alias)?.store.generation())
    }

    fn untouched_since(
        &self,
        alias: &Arc<str>,
        generation: u64,
        key: &crate::store::IndexKey,
        digest: crate::store::KeyDigest,
    ) -> Option<bool> {
        self.view(alias)?.store.untouched_since(generation, key, digest)
    }

    fn finds(&self, alias: &Arc<str>, key: &crate::store::IndexKey, found: &[super::memo::Identity]) -> bool {
        self.view(alias).is_some_and(|view| view.finds(key, found))
    }

    fn claim_as_before(&self, effects: &[super::memo::Effect]) -> bool {
        let mut claims = super::memo::claims(effects).peekable();
        if claims.peek().is_none() {
            return true;
        }
        let Ok(mut claimed) = self.shared.claimed_names.lock() else { return false };
        let made = claims.position(|(name, won)| !(if won { claimed.insert(name) } else { claimed.contains(&name) }));
        let Some(failed) = made else { return true };
        // Taken back: the block is rendered instead, and claims again as it goes.
        for (name, won) in super::memo::claims(effects).take(failed) {
            if won {
                claimed.remove(&name);
            }
        }
        false
    }

    fn slots_are(&self, backend: &str, table: &Arc<crate::plan::slots::SlotTable>) -> bool {
        let Ok(assigned) = self.shared.slots_assigned.lock() else { return false };
        // Blocks checked here are the last kept render's. A backend neither that render nor
        // this one assigned anew still has the table each of its blocks left (a block rendered
        // found it in place, a block reused was checked against it), so there is no need to
        // look it up: looking up every reused block's backend was a tenth of a render after one
        // change.
        let untouched = (assigned.is_empty() || !assigned.contains_key(backend))
            && self
                .shared
                .slots_moved_before
                .as_ref()
                .is_some_and(|moved| moved.is_empty() || !moved.contains(backend));
        // `Arc`'s equality of `Eq` contents answers at once for the same table.
        untouched || self.shared.table_in(&assigned, backend) == Some(table)
    }

    fn replay(&self, effect: &super::memo::Effect) {
        use super::memo::Effect;
        match effect {
            // Replayed without recording: the block's effects reach an enclosing block, if any,
            // as the block's own (`memo::render_each` hands them on), not a second time here.
            Effect::Push { collector, value } => {
                self.with_collector(collector, |collector| {
                    if let Ok(mut items) = collector.items.lock() {
                        items.push_ref(value);
                    }
                });
            }
            // Made by the check (`claim_as_before`).
            Effect::Claim { .. } => {}
            // A block is reused only when the backend's slots are already what it left them
            // (`slots_are`): nothing to write.
            Effect::Slots { .. } => {}
            Effect::File { name, file } => self.shared.keep_general_file(name.clone(), (**file).clone()),
            Effect::Cert { name, file } => self.shared.keep_cert_file(name.clone(), (**file).clone()),
        }
    }
}

impl Object for Shared {
    fn call_method(self: &Arc<Self>, state: &mut State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        match (method, args) {
            ("collector", [name]) => self.collector(name.as_str().unwrap_or_default()).map(Value::from_dyn_object),
            ("distinct", [collector, attribute, claim_prefix]) => self.distinct(
                collector.as_str().unwrap_or_default(),
                attribute,
                claim_prefix.as_str().unwrap_or_default(),
            ),
            ("render_each", [template, items, name, rest @ ..]) if rest.len() <= 1 => {
                let resources = state.lookup("resources");
                let resources =
                    resources.as_ref().and_then(|r| r.downcast_object_ref::<Resources>()).ok_or_else(|| {
                        Error::new(ErrorKind::InvalidOperation, "render_each needs the render's resources")
                    })?;
                let now = RenderNow::new(resources, self);
                let template = template.as_str().unwrap_or_default();
                let name = name.as_str().unwrap_or("item");
                let lines = super::memo::render_each(state, &self.blocks, &now, template, items, name, rest.first())?;
                Ok(Value::from_object(lines))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!(
                    "shared has collector(name), distinct(collector, attribute, claim_prefix) and render_each(template, items, name, with); {method} with {} arguments is not one",
                    args.len()
                ),
            )),
        }
    }
}

/// `collector()`: a list templates can append to in O(1) (`{% set _ = c.push(x) %}`) and read
/// back with `c.items()`; minijinja's own lists are immutable, and rebuilding one per append
/// would make route tables quadratic in the number of routes.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    /// The name of a shared collector (`shared.collector(name)`), whose pushes and claims a
    /// block records; none for a template's own.
    name: Option<Arc<str>>,
    items: std::sync::Mutex<CollectorItems>,
    /// A template's own collector's claim.
    claimed: std::sync::atomic::AtomicBool,
    /// A shared collector's name's fingerprint and the render's claimed names, where its
    /// claim is made.
    claim: Option<(super::memo::Fingerprint, Arc<ClaimedNames>)>,
    /// `sorted(...)` results by (attribute, reverse), so several files can share one sort.
    sorted: std::sync::Mutex<std::collections::BTreeMap<(String, bool), Value>>,
    /// A shared collector's link to the sorted views carried between renders.
    sorted_views: Option<Arc<SortedCarry>>,
}

/// A collector's items: the last render's, written over in place by this render's pushes. A
/// push of the very object already at its place (a reused block's route, pushed again render
/// after render) leaves it there; anything else replaces it. Pushing a copy of each of 20,000
/// routes, then dropping them all at the end of the render, counted every route up and down
/// on objects far apart in memory: a tenth of a render that reused every block.
#[derive(Debug, Default)]
struct CollectorItems {
    values: Vec<Value>,
    /// How many of `values` this render pushed; those past it are the last render's, left.
    pushed: usize,
}

impl CollectorItems {
    /// Items to write over `before`.
    fn writing_over(before: Vec<Value>) -> Self {
        Self { values: before, pushed: 0 }
    }

    /// Pushes a value held elsewhere, copying it only when it is not already in its place.
    fn push_ref(&mut self, value: &Value) {
        match self.values.get_mut(self.pushed) {
            Some(at) if same_object(at, value) => {}
            Some(at) => *at = value.clone(),
            None => self.values.push(value.clone()),
        }
        self.pushed += 1;
    }

    /// Pushes a value.
    fn push(&mut self, value: Value) {
        match self.values.get_mut(self.pushed) {
            Some(at) if same_object(at, &value) => {}
            Some(at) => *at = value,
            None => self.values.push(value),
        }
        self.pushed += 1;
    }

    /// The items pushed so far (the last render's left past them are let go).
    fn settled(&mut self) -> &mut Vec<Value> {
        self.values.truncate(self.pushed);
        &mut self.values
    }
}

/// Whether two values are one object (a route or a stored object, by address): only then is
/// the one kept as good as the other. Anything else is replaced, whatever it compares equal to
/// (a string marked safe equals the same text unmarked).
fn same_object(kept: &Value, pushed: &Value) -> bool {
    object_address(kept).is_some_and(|kept| object_address(pushed) == Some(kept))
}

/// The address of a route or a stored object (both immutable).
pub(crate) fn object_address(value: &Value) -> Option<*const ()> {
    if let Some(route) = value.downcast_object_ref::<super::library::Route>() {
        return Some(std::ptr::from_ref(route).cast());
    }
    value.downcast_object_ref::<TrackedObject>().map(|object| std::ptr::from_ref(object).cast())
}

impl Collector {
    fn items(&self) -> Vec<Value> {
        self.read_by_block();
        self.items.lock().map(|mut items| items.settled().clone()).unwrap_or_default()
    }

    /// A block that reads a shared collector's items depends on every push before it, which a
    /// reused block cannot check: such a block is rendered every time.
    fn read_by_block(&self) {
        if self.name.is_some() {
            super::memo::record_uncacheable();
        }
    }

    fn push(&self, value: Value) {
        if let Some(name) = &self.name {
            super::memo::record_effect(|| super::memo::Effect::Push { collector: name.clone(), value: value.clone() });
        }
        if let Ok(mut items) = self.items.lock() {
            items.push(value);
        }
    }

    /// True for the first caller only.
    fn claim(&self) -> bool {
        let Some((name, claimed)) = &self.claim else {
            return !self.claimed.swap(true, std::sync::atomic::Ordering::Relaxed);
        };
        let won = claimed.lock().is_ok_and(|mut claims| claims.insert(*name));
        super::memo::record_effect(|| super::memo::Effect::Claim { name: *name, won });
        won
    }

    /// The items ordered by one attribute (stable, so equal keys keep their push order).
    fn sorted(&self, attribute: &Value, reverse: bool) -> Result<Value, Error> {
        self.read_by_block();
        let attribute = attribute
            .as_str()
            .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "sorted(attribute) takes an attribute name"))?
            .to_owned();
        let mut cache = self.sorted.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
        if let Some(done) = cache.get(&(attribute.clone(), reverse)) {
            return Ok(done.clone());
        }
        // A shared collector's view may be the one the last render made from the same items.
        let carry = self
            .name
            .as_ref()
            .zip(self.sorted_views.as_ref())
            .map(|(name, views)| (views, (name.clone(), attribute.clone(), reverse)));
        let before = carry.as_ref().and_then(|(views, key)| views.before.get(key));
        // The same items as the view's: the view itself is carried on, its items not copied
        // (a copy of 10,000 routes, and dropping it, counted each one up and down again).
        let unchanged =
            before.filter(|view| self.items.lock().is_ok_and(|mut items| view.made_from(items.settled()))).cloned();
        let view = match unchanged {
            Some(view) => view,
            None => {
                // Read under the lock, not copied (reading a route's key takes no lock).
                let mut items = self.items.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
                let items = items.settled();
                let key_of = |place: usize| items[place].get_attr(&attribute).unwrap_or_default();
                let mended = before.and_then(|view| Some((view, mended_order(view, items, &key_of, reverse)?)));
                Arc::new(match mended {
                    Some((view, mended)) => view.mended(mended, items),
                    None => SortedView::taking(sort_order(items, &key_of, reverse), items),
                })
            }
        };
        let sorted = view.as_listing();
        if let Some((views, key)) = carry
            && let Ok(mut now) = views.now.lock()
        {
            now.insert(key, view);
        }
        cache.insert((attribute, reverse), sorted.clone());
        Ok(sorted)
    }
}

/// The order `items` sort in by their keys (places in `items`): stable, so equal keys keep
/// their push order, also reversed.
fn sort_order(items: &[Value], key: &dyn Fn(usize) -> Value, reverse: bool) -> Vec<u32> {
    let keys: Vec<Value> = (0..items.len()).map(key).collect();
    let mut order: Vec<u32> = (0..u32::try_from(items.len()).unwrap_or(u32::MAX)).collect();
    // Integer keys (a route's path length) compare as integers: the same order as minijinja's
    // comparison of them, without its dispatch on every comparison (see `compare_keys`).
    let integers: Option<Vec<i64>> = keys.iter().map(|key| key.is_integer().then(|| key.as_i64()).flatten()).collect();
    // A stable sort with the comparison reversed keeps equal keys in push order.
    match integers {
        Some(integers) => order.sort_by(|a, b| directed(integers[*a as usize].cmp(&integers[*b as usize]), reverse)),
        None => order.sort_by(|a, b| directed(keys[*a as usize].cmp(&keys[*b as usize]), reverse)),
    }
    order
}

impl Object for Collector {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.items())
    }

    fn call_method(self: &Arc<Self>, _: &mut State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        match (method, args) {
            ("push", [value]) => {
                self.push(value.clone());
                Ok(Value::from(()))
            }
            ("extend", [values]) => {
                let values =
                    values.try_iter().map_err(|_| Error::new(ErrorKind::InvalidOperation, "extend takes a list"))?;
                for value in values {
                    self.push(value);
                }
                Ok(Value::from(()))
            }
            ("items", []) => Ok(Value::from(self.items())),
            ("sorted", [attribute]) => self.sorted(attribute, false),
            ("sorted", [attribute, reverse]) => self.sorted(attribute, reverse.is_true()),
            // True for the first caller only: `{% if c.claim() %}fill it{% endif %}`.
            ("claim", []) => Ok(Value::from(self.claim())),
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!(
                    "a collector has push(value), extend(list), items(), sorted(attribute, reverse) and claim(); {method} with {} arguments is not one",
                    args.len()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::AtHand;

    /// A store's listing mended from the last one, after any changes (added, edited, left as
    /// they were, removed, a whole namespace re-listed), is the listing made anew: the same
    /// objects in the same order, as the same template values.
    mod listings {
        use proptest::prelude::*;
        use serde_json::json;

        use super::super::{Listing, listed_key, listing};
        use crate::store::{ObjectKey, ResourceStore};

        /// A change: (kind, namespace, name, content).
        fn apply(store: &mut ResourceStore, (kind, namespace, name, content): (u8, u8, u8, u8)) {
            let object = |name: u8| json!({"metadata": {"namespace": format!("ns{namespace}"), "name": format!("o{name:02}")}, "spec": {"v": content}});
            match kind {
                0..=5 => {
                    store.apply(object(name)).unwrap();
                }
                6..=7 => {
                    store.delete(&ObjectKey {
                        namespace: format!("ns{namespace}").into(),
                        name: format!("o{name:02}").into(),
                    });
                }
                _ => {
                    let relisted: Vec<_> = (0..name % 4).map(|at| object(at * 7)).collect();
                    store.replace_scope(Some(&format!("ns{namespace}")), relisted).unwrap();
                }
            }
        }

        fn described(items: &imbl::Vector<minijinja::Value>) -> Vec<(ObjectKey, String)> {
            items.iter().map(|item| (listed_key(item).unwrap().clone(), format!("{item:?}"))).collect()
        }

        proptest! {
            #[test]
            fn a_mended_listing_is_the_listing_made_anew(
                renders in proptest::collection::vec(proptest::collection::vec((0u8..9, 0u8..3, 0u8..40, 0u8..3), 0..30), 1..8),
            ) {
                let mut store = ResourceStore::new("Thing", vec![]);
                let mut before: Option<Listing> = None;
                for changes in renders {
                    for change in changes {
                        apply(&mut store, change);
                    }
                    let mended = listing(&store, before.as_ref());
                    let afresh = listing(&store, None);
                    prop_assert_eq!(described(&mended), described(&afresh));
                    before = Some(Listing { generation: store.generation(), items: mended });
                }
            }
        }
    }

    /// A name is recognised at hand by its text as well as by its address, and what is at hand
    /// is not looked for again; the oldest goes when a fifth comes.
    #[test]
    fn things_at_hand_are_found_by_name_without_looking_again() {
        let at_hand = AtHand::new();
        let looked = std::cell::Cell::new(0);
        let find = |thing: usize| {
            looked.set(looked.get() + 1);
            Some(thing)
        };
        let routes: Arc<str> = "routes".into();
        assert_eq!(at_hand.get(&routes, || find(1)), Some(1));
        assert_eq!(at_hand.get(&"routes".into(), || find(2)), Some(1), "the same text, another copy");
        assert_eq!(looked.get(), 1);
        for (at, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert_eq!(at_hand.get(&name.into(), || find(10 + at)), Some(10 + at));
        }
        assert_eq!(at_hand.get(&routes, || find(3)), Some(3), "the oldest was let go");
        assert_eq!(at_hand.get(&"missing".into(), || None::<usize>), None);
    }

    /// `distinct`'s answer (places in the sorted list, not copies) is a list to templates: its
    /// length, its items by index and in a loop, the first of each value in sorted order.
    #[test]
    fn distincts_answer_is_a_list_of_the_first_of_each_value() {
        let mut env = minijinja::Environment::new();
        env.add_global("shared", minijinja::Value::from_object(super::Shared::default()));
        let template = r#"{% set c = shared.collector("things") %}
{%- for n, v in [("b1", "b"), ("a1", "a"), ("b2", "b"), ("c1", "c"), ("a2", "a")] %}{% set _ = c.push({"n": n, "v": v}) %}{% endfor %}
{%- set d = shared.distinct("things", "v", "thing/") -%}
{{ d | length }} {{ d[0].n }} {{ d[2].n }} {{ d | map(attribute="n") | join(",") }} {% for t in d %}{{ t.v }}{% endfor %}"#;
        let rendered = env.render_str(template, ()).unwrap();
        assert_eq!(rendered, "3 a1 c1 a1,b1,c1 abc");
    }

    /// A reused block's claims are made all or none: one that would come out otherwise takes
    /// back those made before it (the block is rendered instead, and claims again).
    #[test]
    fn a_blocks_claims_are_made_as_before_or_not_at_all() {
        use super::super::memo::{Effect, RenderState, name_fingerprint};
        use super::{Carried, RenderNow, Resources, Shared};

        let resources = Resources::new(&Default::default(), &Default::default());
        let shared = Shared::starting_from(Carried::default());
        let now = RenderNow::new(&resources, &shared);
        let (mine, taken) = (name_fingerprint("backend/mine"), name_fingerprint("backend/taken"));
        shared.claimed_names.lock().unwrap().insert(taken);
        let claimed = |name| shared.claimed_names.lock().unwrap().contains(&name);

        let won_both = [Effect::Claim { name: mine, won: true }, Effect::Claim { name: taken, won: true }];
        assert!(!now.claim_as_before(&won_both), "a name won before is taken now");
        assert!(!claimed(mine), "the claim made before the one that failed is taken back");

        let lost_the_second = [Effect::Claim { name: mine, won: true }, Effect::Claim { name: taken, won: false }];
        assert!(now.claim_as_before(&lost_the_second));
        assert!(claimed(mine));

        let lost_a_free_name = [Effect::Claim { name: name_fingerprint("backend/free"), won: false }];
        assert!(!now.claim_as_before(&lost_a_free_name), "a name lost before is free now");
        assert!(now.claim_as_before(&[]), "a block that claims nothing");
    }

    mod collector_items {
        use minijinja::Value;
        use proptest::prelude::*;

        use super::super::{CollectorItems, object_address};
        use crate::render::context::template_value;
        use crate::store::ResourceStore;

        /// Stored objects to push (compared by address) and text, plain or marked safe.
        fn values() -> Vec<Value> {
            let mut store = ResourceStore::new("Thing", vec![]);
            for name in 0..4 {
                store.apply(serde_json::json!({"metadata": {"namespace": "ns", "name": format!("o{name}")}})).unwrap();
            }
            let mut values: Vec<Value> = store.iter().map(|object| template_value(object)).collect();
            values.push(Value::from("text"));
            values.push(Value::from_safe_string("text".into()));
            values
        }

        fn described(value: &Value) -> (Option<*const ()>, String, bool) {
            (object_address(value), format!("{value:?}"), value.is_safe())
        }

        proptest! {
            /// A collector written over the last render's items holds exactly what this render pushed,
            /// in order, whatever it started from; an object already in its place is kept (not
            /// copied), anything else is what was pushed, even text equal to what was there.
            #[test]
            fn a_collector_holds_what_this_render_pushed(
                before in proptest::collection::vec(0usize..6, 0..12),
                pushes in proptest::collection::vec((0usize..6, any::<bool>()), 0..12),
            ) {
                let values = values();
                let mut items = CollectorItems::writing_over(before.iter().map(|at| values[*at].clone()).collect());
                for (at, by_reference) in &pushes {
                    if *by_reference { items.push_ref(&values[*at]) } else { items.push(values[*at].clone()) }
                }
                let held: Vec<_> = items.settled().iter().map(described).collect();
                let pushed: Vec<_> = pushes.iter().map(|(at, _)| described(&values[*at])).collect();
                prop_assert_eq!(held, pushed);
            }
        }
    }

    /// A sorted view mended after items were changed, added or removed gives the order a full
    /// sort gives, ties in push order, either direction, integer or other keys.
    mod mended {
        use minijinja::Value;
        use proptest::prelude::*;

        use super::super::{SortedView, mended_order, object_address, sort_order};

        /// An item: its sort key and a serial number that tells it from every other.
        fn item(key: i64, serial: usize, as_text: bool) -> Value {
            let key = if as_text { Value::from(format!("k{key}")) } else { Value::from(key) };
            Value::from_iter([("key", key), ("serial", Value::from(serial))])
        }

        proptest! {
            #[test]
            fn a_mended_order_is_the_full_sort(
                keys in proptest::collection::vec(0i64..6, 0..80),
                edits in proptest::collection::vec((0usize..100, 0u8..3, 0i64..6), 0..12),
                reverse in any::<bool>(),
                as_text in any::<bool>(),
            ) {
                let before: Vec<Value> = keys.iter().enumerate().map(|(serial, key)| item(*key, serial, as_text)).collect();
                let key_of = |items: &[Value], place: usize| items[place].get_attr("key").unwrap_or_default();
                let order = sort_order(&before, &|place| key_of(&before, place), reverse);
                let view = SortedView::taking(order, &before);
                let now = edited(&before, &edits, |key, serial| item(key, serial, as_text));
                let full = sort_order(&now, &|place| key_of(&now, place), reverse);
                if let Some(mended) = mended_order(&view, &now, &|place| key_of(&now, place), reverse) {
                    prop_assert_eq!(&mended.order, &full);
                    let mended = view.mended(mended, &now);
                    let items: Vec<Value> = mended.sorted_items().iter().cloned().collect();
                    let expected: Vec<Value> = full.iter().map(|place| now[*place as usize].clone()).collect();
                    prop_assert_eq!(items, expected);
                } else {
                    prop_assert!(!edits.is_empty(), "an unchanged list is always mended");
                }
            }

            /// Routes and stored objects: the mended view is the old one with the items gone
            /// taken out and the new ones put in, holding the very objects a full sort holds.
            #[test]
            fn a_mended_view_of_objects_holds_the_objects_of_the_full_sort(
                keys in proptest::collection::vec(0i64..6, 0..80),
                edits in proptest::collection::vec((0usize..100, 0u8..3, 0i64..6), 0..12),
                reverse in any::<bool>(),
            ) {
                let before: Vec<Value> = keys.iter().enumerate().map(|(serial, key)| stored(*key, serial)).collect();
                let key_of = |items: &[Value], place: usize| items[place].get_attr("key").unwrap_or_default();
                let view = SortedView::taking(sort_order(&before, &|place| key_of(&before, place), reverse), &before);
                let now = edited(&before, &edits, stored);
                let full = sort_order(&now, &|place| key_of(&now, place), reverse);
                if let Some(mended) = mended_order(&view, &now, &|place| key_of(&now, place), reverse) {
                    prop_assert!(mended.kept_the_same_objects);
                    let mended = view.mended(mended, &now);
                    let held: Vec<_> = mended.sorted_items().iter().map(object_address).collect();
                    let expected: Vec<_> = full.iter().map(|place| object_address(&now[*place as usize])).collect();
                    prop_assert_eq!(held, expected);
                    prop_assert!(mended.made_from(&now));
                }
            }
        }

        /// `before` after `edits`, each: where, what (0: change the item there, 2: remove it,
        /// else: add one before it), and the key of an item changed or added (made by `fresh`
        /// from its key and a serial number).
        fn edited(before: &[Value], edits: &[(usize, u8, i64)], fresh: impl Fn(i64, usize) -> Value) -> Vec<Value> {
            let mut now = before.to_vec();
            for (serial, (at, what, key)) in edits.iter().copied().enumerate() {
                let fresh = fresh(key, 1000 + serial);
                match what {
                    0 if !now.is_empty() => {
                        let at = at % now.len();
                        now[at] = fresh;
                    }
                    2 if !now.is_empty() => {
                        now.remove(at % now.len());
                    }
                    _ => {
                        let at = at % (now.len() + 1);
                        now.insert(at, fresh);
                    }
                }
            }
            now
        }

        /// A stored object with a sort key, told from every other by its name.
        fn stored(key: i64, serial: usize) -> Value {
            let store = crate::store::ResourceStore::new("Thing", Vec::new());
            let object = store
                .prepare(serde_json::json!({"metadata": {"namespace": "ns", "name": format!("o{serial}")}, "key": key}))
                .unwrap();
            super::super::template_value(&object)
        }
    }
}
