//! Index keys and the groups of objects a store's index holds under each.
//!
//! Why one allocation per key: a render at 10,000 Ingresses looks up tens of thousands of keys,
//! and comparing a key found in the index with the one asked for read the key's list, then each
//! of its strings, each a separate allocation and so, in a render that reads every object once,
//! a separate cache miss. Here the whole key is one run of bytes, and a group of one object
//! (most groups: an index by namespace and name) holds it in place, without a vector. A key of
//! up to [`INLINE`] bytes (`namespace` and `name` of most objects) is kept inside the index's
//! own entry: comparing the key found with the one asked for then reads no other memory, and
//! the key costs no allocation of its own.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::StoredObject;

/// Ends each value of a key: a byte UTF-8 text never holds, so two different lists of values
/// never give the same bytes.
const END_OF_VALUE: u8 = 0xFF;

/// The most bytes a key keeps in place (with its length, 23 of the 24 bytes a key takes).
const INLINE: usize = 22;

/// The values at a store's `indexBy` paths for one object (or asked for by a lookup), in order.
/// Keys compare, order and hash by their bytes, wherever those are kept.
#[derive(Clone)]
pub struct IndexKey(Bytes);

/// Where a key's bytes are.
#[derive(Clone)]
enum Bytes {
    /// In place: the first `len` bytes.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// In an allocation of their own (a key longer than [`INLINE`] bytes).
    Shared(Arc<[u8]>),
}

impl IndexKey {
    /// The key of these values, in order.
    pub fn new<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Self {
        let mut inline = [0u8; INLINE];
        let mut len = 0;
        let mut spilled: Option<Vec<u8>> = None;
        for value in values {
            for part in [value.as_ref().as_bytes(), &[END_OF_VALUE]] {
                match &mut spilled {
                    Some(bytes) => bytes.extend_from_slice(part),
                    None if len + part.len() <= INLINE => {
                        inline[len..len + part.len()].copy_from_slice(part);
                        len += part.len();
                    }
                    None => {
                        let mut bytes = Vec::with_capacity(len + part.len() + INLINE);
                        bytes.extend_from_slice(&inline[..len]);
                        bytes.extend_from_slice(part);
                        spilled = Some(bytes);
                    }
                }
            }
        }
        Self(match spilled {
            Some(bytes) => Bytes::Shared(bytes.into()),
            // At most INLINE (22) bytes were written.
            None => Bytes::Inline { len: len as u8, bytes: inline },
        })
    }

    /// The key's bytes: each value's, each ended by [`END_OF_VALUE`].
    fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Bytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Bytes::Shared(bytes) => bytes,
        }
    }

    /// The values, in order.
    pub fn values(&self) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
        self.as_bytes()
            .split_inclusive(|byte| *byte == END_OF_VALUE)
            .map(|value| String::from_utf8_lossy(value.strip_suffix(&[END_OF_VALUE]).unwrap_or(value)))
    }
}

impl PartialEq for IndexKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for IndexKey {}

impl PartialOrd for IndexKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for IndexKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for IndexKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
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

    /// A key of namespace and name (most keys) is kept in place, in the 24 bytes a key takes.
    #[test]
    fn short_keys_are_kept_in_place_and_long_ones_apart() {
        assert_eq!(std::mem::size_of::<IndexKey>(), 24);
        assert!(matches!(IndexKey::new(["team-16", "app-9999"]).0, super::Bytes::Inline { .. }));
        let long = IndexKey::new(["a-namespace-of-some-length", "and-a-name"]);
        assert!(matches!(long.0, super::Bytes::Shared(_)));
        assert_eq!(long.values().collect::<Vec<_>>(), ["a-namespace-of-some-length", "and-a-name"]);
    }

    fn hash_of(key: &IndexKey) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault};
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(key)
    }

    proptest! {
        /// Across the length where keys stop being kept in place, equal values give equal keys
        /// (equal hashes too) and keys order as their bytes do.
        #[test]
        fn values_come_back_and_only_equal_values_give_equal_keys(
            left in proptest::collection::vec(".{0,14}", 0..4),
            right in proptest::collection::vec(".{0,14}", 0..4),
        ) {
            let (left_key, right_key) = (IndexKey::new(&left), IndexKey::new(&right));
            prop_assert_eq!(left_key.values().collect::<Vec<_>>(), left.clone());
            prop_assert_eq!(left_key == right_key, left == right);
            if left == right {
                prop_assert_eq!(hash_of(&left_key), hash_of(&right_key));
            }
            prop_assert_eq!(left_key.cmp(&right_key), left_key.as_bytes().cmp(right_key.as_bytes()));
        }
    }
}
