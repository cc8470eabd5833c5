//! Server slots with stable names: how a backend's endpoints become a fixed set of servers so
//! that scaling changes only addresses and states (runtime-patchable), not the server list
//! (which needs a reload).
//!
//! A backend has a capacity, a multiple of the block size; slot `i` is server `srv<i+1>`. An
//! endpoint keeps its slot for as long as it exists; new endpoints take the lowest slots that
//! were free before the change (in endpoint order, so every controller and every pod agrees),
//! never one the same change freed; free slots are rendered as disabled servers. Capacity grows by whole blocks only when free slots run out, and never
//! shrinks on its own: shrinking renames nothing but would need a reload for nothing.

use std::collections::BTreeSet;

/// An endpoint's identity within a backend: its address and port.
pub type EndpointKey = (String, u16);

/// The slots of one backend.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SlotTable {
    /// Slot `i` holds the endpoint served as `srv<i+1>`, or nothing.
    pub slots: Vec<Option<EndpointKey>>,
}

impl SlotTable {
    /// The server name of slot `index`.
    pub fn server_name(index: usize) -> String {
        format!("srv{}", index + 1)
    }

    /// Whether the slots hold `endpoints` and nothing else, so [`assign`] would change nothing
    /// (the common case of a render: a backend whose endpoints did not move).
    pub fn holds_exactly(&self, endpoints: &[EndpointKey]) -> bool {
        let occupied = self.slots.iter().filter(|slot| slot.is_some()).count();
        occupied == endpoints.len()
            && endpoints.iter().enumerate().all(|(at, endpoint)| {
                // A repeated endpoint holds one slot: the counts could not match.
                !endpoints[..at].contains(endpoint) && self.slot_of(endpoint).is_some()
            })
    }

    /// The slot of an endpoint.
    pub fn slot_of(&self, endpoint: &EndpointKey) -> Option<usize> {
        self.slots.iter().position(|slot| slot.as_ref() == Some(endpoint))
    }
}

/// Assigns `endpoints` to slots, starting from `previous`. `block` is at least 1.
pub fn assign(previous: &SlotTable, endpoints: &[EndpointKey], block: usize) -> SlotTable {
    let block = block.max(1);
    let wanted: BTreeSet<&EndpointKey> = endpoints.iter().collect();
    // Keep every endpoint that is still there where it was; free the others' slots.
    let mut slots: Vec<Option<EndpointKey>> =
        previous.slots.iter().map(|slot| slot.clone().filter(|endpoint| wanted.contains(endpoint))).collect();
    let placed: BTreeSet<EndpointKey> = slots.iter().flatten().cloned().collect();
    let newcomers: Vec<&EndpointKey> = wanted.into_iter().filter(|endpoint| !placed.contains(*endpoint)).collect();
    // Newcomers take slots that were free already; a slot freed by this very change is not
    // reused by it: its server would move from one address to another while in traffic, which
    // HAProxy 2.6 cannot do at run time (AddressChanges) and which needs its departed
    // endpoint's connections gone. The capacity grows instead (by whole blocks).
    let was_free = |at: usize| previous.slots.get(at).is_none_or(Option::is_none);
    let free = (0..slots.len()).filter(|at| was_free(*at)).count();
    if newcomers.len() > free {
        let needed = slots.len() - free + newcomers.len();
        let capacity = needed.div_ceil(block) * block;
        slots.resize(capacity, None);
    }
    let mut newcomers = newcomers.into_iter();
    for (at, slot) in slots.iter_mut().enumerate() {
        if slot.is_some() || !was_free(at) {
            continue;
        }
        match newcomers.next() {
            Some(endpoint) => *slot = Some(endpoint.clone()),
            None => break,
        }
    }
    SlotTable { slots }
}

/// Slot tables of every backend, by backend name. Tables are shared, and so is the map (a
/// persistent hash map): a render starts from the last one's slots and changes a few, and every
/// reused backend block checks its table by name. At 10,000 backends a `BTreeMap` copied whole
/// whenever one table changed, and each lookup compared the name with some thirty others.
pub type Slots = imbl::GenericHashMap<
    String,
    std::sync::Arc<SlotTable>,
    foldhash::fast::RandomState,
    imbl::shared_ptr::DefaultSharedPtr,
>;

/// What changed from `previous` to `current`: each backend whose table differs, with its new
/// table, or `None` for a backend gone; in backend order. What the journal writes after a
/// render, so a render that moved one endpoint writes one backend.
pub fn changes(previous: &Slots, current: &Slots) -> Vec<(String, Option<SlotTable>)> {
    let changed = current
        .iter()
        // `Arc`'s equality of `Eq` contents answers at once for the same table.
        .filter(|(backend, table)| previous.get(*backend) != Some(*table))
        .map(|(backend, table)| (backend.clone(), Some(SlotTable::clone(table))));
    let gone = previous.keys().filter(|backend| !current.contains_key(*backend)).map(|backend| (backend.clone(), None));
    let mut all: Vec<_> = changed.chain(gone).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::*;

    #[test]
    fn changes_name_the_backends_that_differ_and_those_gone() {
        let table =
            |address: &str| std::sync::Arc::new(SlotTable { slots: vec![Some((address.to_owned(), 80)), None] });
        let previous: Slots = [
            ("a".to_owned(), table("10.0.0.1")),
            ("b".to_owned(), table("10.0.0.2")),
            ("c".to_owned(), table("10.0.0.3")),
        ]
        .into_iter()
        .collect();
        let current: Slots = [
            ("a".to_owned(), table("10.0.0.1")),
            ("b".to_owned(), table("10.0.0.9")),
            ("d".to_owned(), table("10.0.0.4")),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            changes(&previous, &current),
            [
                ("b".to_owned(), Some(SlotTable::clone(&table("10.0.0.9")))),
                ("c".to_owned(), None),
                ("d".to_owned(), Some(SlotTable::clone(&table("10.0.0.4"))))
            ]
        );
        assert!(changes(&current, &current).is_empty());
    }

    fn endpoint(n: u8) -> EndpointKey {
        (format!("10.0.0.{n}"), 8080)
    }

    #[test]
    fn scaling_within_capacity_keeps_names_and_fills_the_lowest_free_slots() {
        let first = assign(&SlotTable::default(), &[endpoint(1), endpoint(2), endpoint(3)], 4);
        assert_eq!(first.slots.len(), 4);
        assert_eq!(first.slot_of(&endpoint(2)), Some(1));
        let scaled_down = assign(&first, &[endpoint(1), endpoint(3)], 4);
        assert_eq!(scaled_down.slots, [Some(endpoint(1)), None, Some(endpoint(3)), None]);
        let scaled_up = assign(&scaled_down, &[endpoint(1), endpoint(3), endpoint(7), endpoint(8)], 4);
        assert_eq!(scaled_up.slots, [Some(endpoint(1)), Some(endpoint(7)), Some(endpoint(3)), Some(endpoint(8))]);
    }

    #[test]
    fn capacity_grows_by_whole_blocks_only_when_slots_run_out() {
        let full = assign(&SlotTable::default(), &(1..=4).map(endpoint).collect::<Vec<_>>(), 4);
        assert_eq!(full.slots.len(), 4);
        let grown = assign(&full, &(1..=5).map(endpoint).collect::<Vec<_>>(), 4);
        assert_eq!(grown.slots.len(), 8);
        assert_eq!(grown.slot_of(&endpoint(5)), Some(4));
        let back = assign(&grown, &[endpoint(1)], 4);
        assert_eq!(back.slots.len(), 8, "capacity never shrinks on its own");
        assert_eq!(SlotTable::server_name(4), "srv5");
    }

    fn endpoints() -> impl Strategy<Value = Vec<EndpointKey>> {
        proptest::collection::btree_set(1u8..40, 0..20).prop_map(|set| set.into_iter().map(endpoint).collect())
    }

    proptest! {
    #![proptest_config(ProptestConfig {
        // Regressions live beside the source, not in a directory at the top of the project.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(256)
    })]

        /// Over any sequence of scaling steps: every endpoint has exactly one slot, an endpoint
        /// that stays keeps its slot, a slot a step frees is not taken by that step, capacity is
        /// whole blocks and grows only when the slots free before run out, and the order
        /// endpoints are listed in does not matter.
        #[test]
        fn slots_are_stable_exclusive_and_grow_only_by_blocks(
            steps in proptest::collection::vec(endpoints(), 1..12),
            block in 1usize..6,
        ) {
            let mut table = SlotTable::default();
            for step in steps {
                let next = assign(&table, &step, block);
                if table.holds_exactly(&step) {
                    prop_assert_eq!(&next, &table, "holds_exactly, yet assign moved something");
                }
                prop_assert!(next.holds_exactly(&step), "assign's answer holds exactly the endpoints");
                let mut reversed = step.clone();
                reversed.reverse();
                prop_assert_eq!(&assign(&table, &reversed, block), &next, "endpoint order matters");
                prop_assert_eq!(next.slots.len() % block, 0);
                prop_assert!(next.slots.len() >= step.len());
                let newcomers = step.iter().filter(|e| table.slot_of(e).is_none()).count();
                let were_free = table.slots.iter().filter(|slot| slot.is_none()).count();
                if newcomers <= were_free {
                    prop_assert_eq!(next.slots.len(), table.slots.len(), "grew without need");
                }
                for (at, slot) in table.slots.iter().enumerate() {
                    if slot.as_ref().is_some_and(|endpoint| !step.contains(endpoint)) {
                        prop_assert_eq!(&next.slots[at], &None, "a slot this step freed was taken by it");
                    }
                }
                for endpoint in &step {
                    prop_assert_eq!(next.slots.iter().filter(|s| s.as_ref() == Some(endpoint)).count(), 1);
                    if let Some(before) = table.slot_of(endpoint) {
                        prop_assert_eq!(next.slot_of(endpoint), Some(before), "a staying endpoint moved");
                    }
                }
                prop_assert_eq!(next.slots.iter().flatten().count(), step.len(), "a gone endpoint kept a slot");
                table = next;
            }
        }
    }
}
