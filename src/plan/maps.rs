//! Map files as entries: what `add map`, `set map` and `del map` must do to a running HAProxy's
//! copy of a map so that it holds what a new file says.
//!
//! HAProxy's exact (`map`) and prefix (`map_beg`) lookups of case-sensitive maps use trees:
//! the answer does not depend on the order of the lines (a prefix lookup takes the longest
//! matching key), so a runtime change only has to get the set of entries right, not their
//! order. Only maps haptic can read without doubt are changed at run time: one key and one
//! value per line, every key once. Anything else is left to a reload.

use std::collections::BTreeMap;

use super::RuntimeAction;

/// The first line of a map file whose order matters (a regex map: the first match wins).
pub const ORDERED: &str = "# haptic: ordered";

/// A map file's entries, key to value, when the file is plain enough to change at run time.
pub fn entries(text: &str) -> Option<BTreeMap<String, String>> {
    // A map whose lookups depend on the order of its lines (`map_reg`) says so on its first
    // line; its changes are left to a reload.
    if text.trim_start().starts_with(ORDERED) {
        return None;
    }
    let mut entries = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            // No value, or a value with spaces: HAProxy's own reading of it is what counts,
            // and a reload is where it reads it.
            return None;
        };
        if entries.insert(key.to_owned(), value.to_owned()).is_some() {
            // Which of two equal keys a lookup finds is HAProxy's business; not ours to patch.
            return None;
        }
    }
    Some(entries)
}

/// The entry changes that turn the map `map` from `old` into `new`: keys added and values set
/// first, keys removed last (a route moving from one key to another is never absent in
/// between). `None` when either file is not plain enough to change at run time.
pub fn difference(map: &str, old: &str, new: &str) -> Option<Vec<RuntimeAction>> {
    let (old, new) = (entries(old)?, entries(new)?);
    let mut actions = Vec::new();
    for (key, value) in &new {
        match old.get(key) {
            None => {
                actions.push(RuntimeAction::AddMapEntry { map: map.to_owned(), key: key.clone(), value: value.clone() })
            }
            Some(was) if was != value => {
                actions.push(RuntimeAction::SetMapEntry {
                    map: map.to_owned(),
                    key: key.clone(),
                    value: value.clone(),
                });
            }
            Some(_) => {}
        }
    }
    for key in old.keys().filter(|key| !new.contains_key(*key)) {
        actions.push(RuntimeAction::DeleteMapEntry { map: map.to_owned(), key: key.clone() });
    }
    Some(actions)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_map_whose_order_matters_is_never_changed_at_run_time() {
        let old = "# haptic: ordered\n(?i)^a/x be_a\n";
        let new = "# haptic: ordered\n(?i)^a/x/y be_b\n(?i)^a/x be_a\n";
        assert!(entries(new).is_none());
        assert!(difference("regex.map", old, new).is_none());
    }

    use super::*;

    #[test]
    fn entries_are_keys_and_single_word_values_each_key_once() {
        let map = entries("# routes\nexample.com/ be_a\n\n  shop.example.com/cart/   be_b  \n").unwrap();
        assert_eq!(map.get("shop.example.com/cart/").map(String::as_str), Some("be_b"));
        assert_eq!(map.len(), 2);
        assert_eq!(entries("a be_a\na be_b\n"), None, "a key twice");
        assert_eq!(entries("a\n"), None, "a key without a value");
        assert_eq!(entries("a two words\n"), None, "a value with spaces");
    }

    #[test]
    fn additions_and_changes_come_before_removals() {
        let actions = difference("host.map", "a/ be_a\nb/ be_b\n", "b/ be_c\nc/ be_a\n").unwrap();
        let kinds: Vec<_> = actions.iter().map(RuntimeAction::kind).collect();
        assert_eq!(kinds, ["map-set", "map-add", "map-delete"]);
        assert_eq!(difference("host.map", "a b\n", "a b\n"), Some(vec![]));
    }
}
