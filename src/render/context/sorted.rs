//! Shared collectors' items sorted by an attribute, and the views mended from the last render
//! where few items changed.

use super::*;

/// A shared collector's items ordered by an attribute: (collector, attribute, reverse).
pub(super) type SortedKey = (Arc<str>, String, bool);

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
    pub(super) fn new(order: Vec<u32>, sorted: imbl::Vector<Value>) -> Self {
        let mut in_view = vec![0; order.len()];
        for (at, place) in order.iter().enumerate() {
            if let Some(slot) = in_view.get_mut(*place as usize) {
                *slot = u32::try_from(at).unwrap_or(u32::MAX);
            }
        }
        Self { order, in_view, sorted }
    }

    /// The view of `items` in `order`, each item taken from `items`.
    pub(super) fn taking(order: Vec<u32>, items: &[Value]) -> Self {
        let sorted = order.iter().filter_map(|at| items.get(*at as usize).cloned()).collect();
        Self::new(order, sorted)
    }

    /// The view's items, in its order.
    pub(super) fn sorted_items(&self) -> &imbl::Vector<Value> {
        &self.sorted
    }

    /// The view as templates see it: a listing (sharing the vector).
    pub(super) fn as_listing(&self) -> Value {
        Value::from_object(ListingView(self.sorted.clone()))
    }

    /// How many items the view was made from.
    fn len(&self) -> usize {
        self.in_view.len()
    }

    /// Whether the view was made from exactly these items (walked in the view's order: the
    /// vector read in turn, the items' list at random).
    pub(super) fn made_from(&self, items: &[Value]) -> bool {
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
    pub(super) fn mended(&self, mended: Mended, items: &[Value]) -> Self {
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
pub(super) struct Mended {
    pub(super) order: Vec<u32>,
    /// The places, among the view's items, of those gone.
    gone: Vec<usize>,
    /// The places, among the items now, of those put in.
    added: Vec<u32>,
    /// Whether every item kept is the same object as the view's (not only an equal value).
    pub(super) kept_the_same_objects: bool,
}

/// Sorted views of shared collectors by what they sort.
pub(crate) type SortedViews = std::collections::HashMap<SortedKey, Arc<SortedView>, foldhash::quality::RandomState>;

/// The last kept render's sorted views, and this render's. A view whose collector holds the
/// same items as last time (the same objects: a reused block pushes the very values it pushed
/// before, so comparing them is a pointer compare each) is not sorted again: sorting 10,000
/// routes by backend and by path length was a tenth of a render that reused every block.
#[derive(Debug, Default)]
pub(crate) struct SortedCarry {
    pub(super) before: Arc<SortedViews>,
    pub(super) now: std::sync::Mutex<SortedViews>,
}

/// Whether two items are the same. Routes and stored objects compare by address first:
/// minijinja's own equality of two objects tries them as numbers first (an error formatted
/// for each), which cost more than the sort it spares.
pub(super) fn same_item(before: &Value, now: &Value) -> bool {
    match (object_address(before), object_address(now)) {
        (Some(before), Some(now)) if before == now => true,
        _ => before == now,
    }
}

/// How many items may differ from a sorted view's for the view to be mended rather than made
/// anew: each costs a binary search and a move of the order behind it.
pub(super) const MENDED_AT_MOST: usize = 64;

/// How far ahead an item missing at its place is looked for in the other list (items added or
/// removed there) before it counts as changed.
pub(super) const MEND_LOOKAHEAD: usize = 8;

/// The order `items` sort in, mended from `view` (made from a few items fewer, more or other):
/// the items `view` had keep their order among themselves, and each other one is put in by a
/// binary search. `None` when too many differ. Sorting 10,000 routes again for one changed
/// Ingress was a fifth of a render after one change.
pub(super) fn mended_order(
    view: &SortedView,
    items: &[Value],
    key: &dyn Fn(usize) -> Value,
    reverse: bool,
) -> Option<Mended> {
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
pub(super) fn directed(ordering: std::cmp::Ordering, reverse: bool) -> std::cmp::Ordering {
    if reverse { ordering.reverse() } else { ordering }
}

/// Two sort keys in the order `Collector::sorted` sorts them: integers as integers (the same
/// order as minijinja's comparison of them, without its dispatch), anything else as minijinja
/// compares values.
pub(super) fn compare_keys(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a.is_integer().then(|| a.as_i64()).flatten(), b.is_integer().then(|| b.as_i64()).flatten()) {
        (Some(a), Some(b)) => a.cmp(&b),
        _ => a.cmp(b),
    }
}
