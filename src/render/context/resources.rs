//! `resources.<alias>`: each store as templates see it (`list()`, `fetch(keys...)`,
//! `get(keys...)`), listings mended from the last render, and stored objects wrapped so that
//! what a template touched can be traced.

use super::*;

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

    pub(super) fn store(&self, alias: &str) -> Option<&StoreView> {
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
    pub(super) store: Arc<ResourceStore>,
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
    pub(super) generation: u64,
    /// Persistent: the next render mends a copy where objects changed, sharing the rest.
    pub(super) items: imbl::Vector<Value>,
}

/// Listings by alias.
pub(crate) type Listings = std::collections::HashMap<Arc<str>, Listing, foldhash::fast::RandomState>;

/// At most this many changes (and at most one object in eight changed) are mended into the
/// last render's listing; more, and the store is listed anew.
pub(super) const LISTING_MENDED_AT_MOST: usize = 256;

/// The listing of `store`: `before` (the last kept render's) with the objects changed since
/// mended in, or listed anew when the store's history does not reach back to it or too much
/// changed. Listing 10,000 Ingresses anew at every render was a tenth of a render after one
/// change: each object found in the store's tree and its template value read from the object.
pub(super) fn listing(store: &ResourceStore, before: Option<&Listing>) -> imbl::Vector<Value> {
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
pub(super) fn listed_key(item: &Value) -> Option<&crate::store::ObjectKey> {
    item.downcast_object_ref::<TrackedObject>().map(|object| &object.reference.key)
}

/// A listing as templates see it: a sequence.
#[derive(Debug)]
pub(super) struct ListingView(pub(super) imbl::Vector<Value>);

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
pub(super) struct ListingIter {
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
        crate::render::memo::record_read(|| crate::render::memo::Read::Whole {
            alias: self.alias.clone(),
            generation: self.store.generation(),
        });
    }

    /// Notes, for the block being rendered (if any), what a lookup found.
    fn record_lookup(&self, key: &IndexKey, found: &[&Arc<StoredObject>]) {
        crate::render::memo::record_read(|| {
            // The store's own copy of the key, when it has one: the one asked for is dropped
            // with the render, and the store's is shared with the store.
            let key = found.first().and_then(|object| object.index_key.clone()).unwrap_or_else(|| key.clone());
            crate::render::memo::Read::Lookup {
                alias: self.alias.clone(),
                generation: crate::render::memo::AtomicGeneration::new(self.store.generation()),
                digest: crate::store::KeyDigest::of(&key),
                key,
                found: found.iter().map(|object| (object.content, object.ignored)).collect(),
            }
        });
    }

    /// Whether the store holds exactly `found` under `key`.
    pub(super) fn finds(&self, key: &IndexKey, found: &[crate::render::memo::Identity]) -> bool {
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
pub(super) struct TrackedObject {
    pub(super) reference: Arc<ObjectRef>,
    /// Who the object is, content and all (what a block's key holds of it).
    identity: crate::render::memo::Identity,
    pub(super) inner: Value,
}

impl crate::render::memo::Fingerprinted for TrackedObject {
    fn feed(&self, digest: &mut crate::render::memo::Digest) -> bool {
        use std::hash::Hasher;
        digest.write(self.identity.0.as_bytes());
        digest.write_u64(self.identity.1.map_or(0, std::num::NonZeroU64::get));
        true
    }
}

/// The value's own fingerprint, when it is a stored object or a route.
pub(crate) fn fingerprinted(value: &Value) -> Option<&dyn crate::render::memo::Fingerprinted> {
    if let Some(object) = value.downcast_object_ref::<TrackedObject>() {
        return Some(object);
    }
    crate::render::library::route_fingerprinted(value)
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
pub(super) fn touch(object: &Arc<TrackedObject>) {
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

pub(super) fn template_value(object: &StoredObject) -> Value {
    object.template_value(|stored| {
        Value::from_object(TrackedObject {
            reference: Arc::new(stored.reference.clone()),
            identity: (stored.content, stored.ignored),
            inner: stored.value.clone(),
        })
    })
}
