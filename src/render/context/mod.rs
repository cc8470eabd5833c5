//! What templates see: `resources.<alias>` with `list()`, `fetch(keys...)` and `get(keys...)`,
//! and every stored object wrapped so a refused value can be traced to the object it came from.
//!
//! Each part owns one thing: `blame` (which object a refused value came from), `resources`
//! (the stores as templates read them), `sorted` (collectors' sorted views), `shared` (one
//! render's shared state and what it carries to the next), `collector` (the lists templates
//! append to).

mod blame;
mod collector;
mod resources;
mod shared;
mod sorted;

use std::cell::RefCell;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, ErrorKind, State};

use crate::store::{IndexKey, ObjectRef, ResourceStore, StoredObject, Stores};

pub(crate) use blame::*;
pub(crate) use collector::*;
pub(crate) use resources::*;
pub(crate) use shared::*;
pub(crate) use sorted::*;

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
