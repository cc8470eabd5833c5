//! `collector()`: a list templates append to in O(1) and read back, sorted or not.

use super::*;

/// `collector()`: a list templates can append to in O(1) (`{% set _ = c.push(x) %}`) and read
/// back with `c.items()`; minijinja's own lists are immutable, and rebuilding one per append
/// would make route tables quadratic in the number of routes.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    /// The name of a shared collector (`shared.collector(name)`), whose pushes and claims a
    /// block records; none for a template's own.
    pub(super) name: Option<Arc<str>>,
    pub(super) items: std::sync::Mutex<CollectorItems>,
    /// A template's own collector's claim.
    pub(super) claimed: std::sync::atomic::AtomicBool,
    /// A shared collector's name's fingerprint and the render's claimed names, where its
    /// claim is made.
    pub(super) claim: Option<(crate::render::memo::Fingerprint, Arc<ClaimedNames>)>,
    /// `sorted(...)` results by (attribute, reverse), so several files can share one sort.
    pub(super) sorted: std::sync::Mutex<std::collections::BTreeMap<(String, bool), Value>>,
    /// A shared collector's link to the sorted views carried between renders.
    pub(super) sorted_views: Option<Arc<SortedCarry>>,
}

/// A collector's items: the last render's, written over in place by this render's pushes. A
/// push of the very object already at its place (a reused block's route, pushed again render
/// after render) leaves it there; anything else replaces it. Pushing a copy of each of 20,000
/// routes, then dropping them all at the end of the render, counted every route up and down
/// on objects far apart in memory: a tenth of a render that reused every block.
#[derive(Debug, Default)]
pub(super) struct CollectorItems {
    values: Vec<Value>,
    /// How many of `values` this render pushed; those past it are the last render's, left.
    pushed: usize,
}

impl CollectorItems {
    /// Items to write over `before`.
    pub(super) fn writing_over(before: Vec<Value>) -> Self {
        Self { values: before, pushed: 0 }
    }

    /// Pushes a value held elsewhere, copying it only when it is not already in its place.
    pub(super) fn push_ref(&mut self, value: &Value) {
        match self.values.get_mut(self.pushed) {
            Some(at) if same_object(at, value) => {}
            Some(at) => *at = value.clone(),
            None => self.values.push(value.clone()),
        }
        self.pushed += 1;
    }

    /// Pushes a value.
    pub(super) fn push(&mut self, value: Value) {
        match self.values.get_mut(self.pushed) {
            Some(at) if same_object(at, &value) => {}
            Some(at) => *at = value,
            None => self.values.push(value),
        }
        self.pushed += 1;
    }

    /// The items pushed so far (the last render's left past them are let go).
    pub(super) fn settled(&mut self) -> &mut Vec<Value> {
        self.values.truncate(self.pushed);
        &mut self.values
    }
}

/// Whether two values are one object (a route or a stored object, by address): only then is
/// the one kept as good as the other. Anything else is replaced, whatever it compares equal to
/// (a string marked safe equals the same text unmarked).
pub(super) fn same_object(kept: &Value, pushed: &Value) -> bool {
    object_address(kept).is_some_and(|kept| object_address(pushed) == Some(kept))
}

/// The address of a route or a stored object (both immutable).
pub(crate) fn object_address(value: &Value) -> Option<*const ()> {
    if let Some(route) = value.downcast_object_ref::<crate::render::library::Route>() {
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
            crate::render::memo::record_uncacheable();
        }
    }

    pub(super) fn push(&self, value: Value) {
        if let Some(name) = &self.name {
            crate::render::memo::record_effect(|| crate::render::memo::Effect::Push {
                collector: name.clone(),
                value: value.clone(),
            });
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
        crate::render::memo::record_effect(|| crate::render::memo::Effect::Claim { name: *name, won });
        won
    }

    /// The items ordered by one attribute (stable, so equal keys keep their push order).
    pub(super) fn sorted(&self, attribute: &Value, reverse: bool) -> Result<Value, Error> {
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
pub(super) fn sort_order(items: &[Value], key: &dyn Fn(usize) -> Value, reverse: bool) -> Vec<u32> {
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
