//! What templates see: `resources.<alias>` with `list()`, `fetch(keys...)` and `get(keys...)`,
//! and every stored object wrapped so a refused value can be traced to the object it came from.

use std::cell::RefCell;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, ErrorKind, State};

use crate::store::{ObjectRef, ResourceStore, StoredObject, Stores};

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
    pub(crate) fn new(stores: &Stores) -> Self {
        let views = stores
            .iter()
            .map(|(alias, store)| {
                let view = StoreView { alias: alias.clone(), store: store.clone(), all: std::sync::OnceLock::new() };
                (alias.clone(), Value::from_object(view))
            })
            .collect();
        Self { views }
    }
}

impl Object for Resources {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.views.get(key.as_str()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.views.keys().map(|alias| Value::from(alias.as_str())).collect())
    }
}

/// `resources.<alias>`: the objects of one watched resource type.
#[derive(Debug)]
pub(crate) struct StoreView {
    alias: String,
    store: Arc<ResourceStore>,
    /// Every object, in order, built on first use in this render.
    all: std::sync::OnceLock<Value>,
}

impl StoreView {
    fn all(&self) -> Value {
        self.all
            .get_or_init(|| Value::from(self.store.iter().map(|object| template_value(object)).collect::<Vec<_>>()))
            .clone()
    }

    fn index_key(&self, method: &str, args: &[Value]) -> Result<Vec<String>, Error> {
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
        args.iter()
            .map(|arg| match arg.as_str() {
                Some(text) => Ok(text.to_owned()),
                None if arg.is_number() || arg.kind() == minijinja::value::ValueKind::Bool => Ok(arg.to_string()),
                None => Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("resources.{}.{method}: index keys are strings or numbers, got {arg:?}", self.alias),
                )),
            })
            .collect()
    }
}

impl Object for StoreView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.all().try_iter() {
            Ok(items) => Enumerator::Values(items.collect()),
            Err(_) => Enumerator::Empty,
        }
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.store.len())
    }

    fn call_method(self: &Arc<Self>, _: &mut State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        match method {
            "list" => Ok(self.all()),
            "fetch" => {
                let key = self.index_key(method, args)?;
                Ok(Value::from(self.store.lookup(&key).map(|object| template_value(object)).collect::<Vec<_>>()))
            }
            "get" => {
                let key = self.index_key(method, args)?;
                let mut found = self.store.lookup(&key);
                let first = found.next();
                if let Some(second) = found.next() {
                    let first = first.map(|o| o.reference.to_string()).unwrap_or_default();
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "resources.{}.get({}) matches more than one object ({first}, {}, ...); use fetch",
                            self.alias,
                            key.join(", "),
                            second.reference
                        ),
                    ));
                }
                Ok(first.map(|object| template_value(object)).unwrap_or(Value::from(())))
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
    inner: Value,
}

impl Object for TrackedObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        touch(self);
        self.inner.get_item(key).ok().filter(|value| !value.is_undefined())
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
        Value::from_object(TrackedObject { reference: Arc::new(stored.reference.clone()), inner: stored.value.clone() })
    })
}

/// `shared`: state that lives for one render and is seen by every template of it, so work
/// done for one file (a route table, say) is not redone for the next.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    collectors: std::sync::Mutex<std::collections::HashMap<String, Value>>,
    /// Certificates registered by `tls_certificate(...)`, by file name.
    certs: std::sync::Mutex<std::collections::BTreeMap<String, crate::files::RenderedFile>>,
    /// General files registered by functions (`ca_file(...)`), by file name.
    files: std::sync::Mutex<std::collections::BTreeMap<String, crate::files::RenderedFile>>,
    /// Server slots of every backend, as this render assigns them.
    slots: std::sync::Mutex<crate::plan::slots::Slots>,
}

impl Shared {
    /// Shared state for a render that starts from these server slots.
    pub(crate) fn starting_from(slots: crate::plan::slots::Slots) -> Self {
        Self { slots: std::sync::Mutex::new(slots), ..Self::default() }
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
        let Ok(mut slots) = self.slots.lock() else { return read(&assign(&SlotTable::default(), endpoints, block)) };
        match slots.get_mut(backend) {
            Some(table) => {
                if !table.holds_exactly(endpoints) {
                    *table = assign(table, endpoints, block);
                }
                read(table)
            }
            None => {
                let table = assign(&SlotTable::default(), endpoints, block);
                let answer = read(&table);
                slots.insert(backend.to_owned(), table);
                answer
            }
        }
    }

    /// The server slots after this render.
    pub(crate) fn slots(&self) -> crate::plan::slots::Slots {
        self.slots.lock().map(|slots| slots.clone()).unwrap_or_default()
    }

    /// Registers a certificate file of this render (the same name twice keeps one).
    pub(crate) fn add_cert(&self, name: String, pem: String) {
        if let Ok(mut certs) = self.certs.lock() {
            certs.entry(name).or_insert_with(|| crate::files::RenderedFile::sensitive(pem));
        }
    }

    /// Registers a general file of this render (the same name twice keeps one).
    pub(crate) fn add_file(&self, name: String, content: String) {
        if let Ok(mut files) = self.files.lock() {
            files.entry(name).or_insert_with(|| crate::files::RenderedFile::new(content));
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
}

impl Object for Shared {
    fn call_method(self: &Arc<Self>, _: &mut State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        match (method, args) {
            ("collector", [name]) => {
                // Templates ask for tens of thousands of names (a claim per backend and map key):
                // hashed, and a name's copy made only when it is new.
                let name = name.as_str().unwrap_or_default();
                let mut collectors = self.collectors.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
                if let Some(collector) = collectors.get(name) {
                    return Ok(collector.clone());
                }
                let collector = Value::from_object(Collector::default());
                collectors.insert(name.to_owned(), collector.clone());
                Ok(collector)
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("shared has collector(name); {method} with {} arguments is not one", args.len()),
            )),
        }
    }
}

/// `collector()`: a list templates can append to in O(1) (`{% set _ = c.push(x) %}`) and read
/// back with `c.items()`; minijinja's own lists are immutable, and rebuilding one per append
/// would make route tables quadratic in the number of routes.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    items: std::sync::Mutex<Vec<Value>>,
    claimed: std::sync::atomic::AtomicBool,
    /// `sorted(...)` results by (attribute, reverse), so several files can share one sort.
    sorted: std::sync::Mutex<std::collections::BTreeMap<(String, bool), Value>>,
}

impl Collector {
    fn items(&self) -> Vec<Value> {
        self.items.lock().map(|items| items.clone()).unwrap_or_default()
    }

    /// The items ordered by one attribute (stable, so equal keys keep their push order).
    fn sorted(&self, attribute: &Value, reverse: bool) -> Result<Value, Error> {
        let attribute = attribute
            .as_str()
            .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "sorted(attribute) takes an attribute name"))?
            .to_owned();
        let mut cache = self.sorted.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
        if let Some(done) = cache.get(&(attribute.clone(), reverse)) {
            return Ok(done.clone());
        }
        let mut keyed: Vec<(Value, Value)> =
            self.items().into_iter().map(|item| (item.get_attr(&attribute).unwrap_or_default(), item)).collect();
        keyed.sort_by(|(a, _), (b, _)| if reverse { b.cmp(a) } else { a.cmp(b) });
        let sorted = Value::from(keyed.into_iter().map(|(_, item)| item).collect::<Vec<_>>());
        cache.insert((attribute, reverse), sorted.clone());
        Ok(sorted)
    }
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
                if let Ok(mut items) = self.items.lock() {
                    items.push(value.clone());
                }
                Ok(Value::from(()))
            }
            ("extend", [values]) => {
                let values =
                    values.try_iter().map_err(|_| Error::new(ErrorKind::InvalidOperation, "extend takes a list"))?;
                if let Ok(mut items) = self.items.lock() {
                    items.extend(values);
                }
                Ok(Value::from(()))
            }
            ("items", []) => Ok(Value::from(self.items())),
            ("sorted", [attribute]) => self.sorted(attribute, false),
            ("sorted", [attribute, reverse]) => self.sorted(attribute, reverse.is_true()),
            // True for the first caller only: `{% if c.claim() %}fill it{% endif %}`.
            ("claim", []) => Ok(Value::from(!self.claimed.swap(true, std::sync::atomic::Ordering::Relaxed))),
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
