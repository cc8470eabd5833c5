//! Index keys and the groups of objects a store's index holds under each.
//!
//! Why one allocation per key: a render at 10,000 Ingresses looks up tens of thousands of keys,
//! and comparing a key found in the index with the one asked for read the key's list, then each
//! of its strings, each a separate allocation and so, in a render that reads every object once,
//! a separate cache miss. Here the whole key is one run of bytes, and a group of one object
//! (most groups: an index by namespace and name) holds it in place, without a vector.

use std::fmt;
use std::sync::Arc;

use super::StoredObject;

/// Ends each value of a key: a byte UTF-8 text never holds, so two different lists of values
/// never give the same bytes.
const END_OF_VALUE: u8 = 0xFF;

/// The values at a store's `indexBy` paths for one object (or asked for by a lookup), in order.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexKey(Arc<[u8]>);

impl IndexKey {
    /// The key of these values, in order.
    pub fn new<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Self {
        let mut bytes = Vec::new();
        for value in values {
            bytes.extend_from_slice(value.as_ref().as_bytes());
            bytes.push(END_OF_VALUE);
        }
        Self(bytes.into())
    }

    /// The values, in order.
    pub fn values(&self) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
        self.0
            .split_inclusive(|byte| *byte == END_OF_VALUE)
            .map(|value| String::from_utf8_lossy(value.strip_suffix(&[END_OF_VALUE]).unwrap_or(value)))
    }
}

impl fmt::Debug for IndexKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.values()).finish()
    }
}

/// The objects under one index key, in (namespace, name) order.
#[derive(Clone, Debug)]
pub(crate) enum Group {
    /// One object: most groups (an index by namespace and name).
    One(Arc<StoredObject>),
    /// Two or more.
    Many(Vec<Arc<StoredObject>>),
}

impl Group {
    /// The objects, in order.
    pub(crate) fn objects(&self) -> &[Arc<StoredObject>] {
        match self {
            Self::One(object) => std::slice::from_ref(object),
            Self::Many(objects) => objects,
        }
    }

    /// Adds `stored`, whose key no object of the group has, in its place.
    pub(crate) fn insert(&mut self, stored: Arc<StoredObject>) {
        let mut objects = std::mem::replace(self, Self::Many(Vec::new())).into_objects();
        let at = objects.partition_point(|other| other.reference.key < stored.reference.key);
        objects.insert(at, stored);
        *self = Self::Many(objects);
    }

    /// Takes out the object of `key`; none when the group is left empty.
    pub(crate) fn without(self, key: &super::ObjectKey) -> Option<Self> {
        let mut objects = self.into_objects();
        objects.retain(|other| other.reference.key != *key);
        match objects.len() {
            0 => None,
            1 => objects.pop().map(Self::One),
            _ => Some(Self::Many(objects)),
        }
    }

    /// The objects, in order, as a vector.
    fn into_objects(self) -> Vec<Arc<StoredObject>> {
        match self {
            Self::One(object) => vec![object],
            Self::Many(objects) => objects,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IndexKey;
    use proptest::prelude::*;

    /// A key gives back its values, and two keys are equal exactly when their values are.
    #[test]
    fn keys_are_equal_exactly_when_their_values_are() {
        let key = IndexKey::new(["default", "web"]);
        assert_eq!(key.values().collect::<Vec<_>>(), ["default", "web"]);
        assert_eq!(key, IndexKey::new(["default".to_owned(), "web".to_owned()]));
        assert_ne!(key, IndexKey::new(["defaultweb"]));
        assert_ne!(key, IndexKey::new(["default", "web", ""]));
        assert_ne!(IndexKey::new([""]), IndexKey::new::<&str>([]));
        assert_eq!(IndexKey::new::<&str>([]).values().count(), 0);
        assert_eq!(IndexKey::new([""]).values().collect::<Vec<_>>(), [""]);
        assert_eq!(format!("{key:?}"), r#"["default", "web"]"#);
    }

    proptest! {
        #[test]
        fn values_come_back_and_only_equal_values_give_equal_keys(
            left in proptest::collection::vec(".{0,6}", 0..4),
            right in proptest::collection::vec(".{0,6}", 0..4),
        ) {
            let (left_key, right_key) = (IndexKey::new(&left), IndexKey::new(&right));
            prop_assert_eq!(left_key.values().collect::<Vec<_>>(), left.clone());
            prop_assert_eq!(left_key == right_key, left == right);
        }
    }
}
