//! The one interner: a table of items, each given the index of its first appearance, found by a
//! key. Snapshots keep frames, stacks, scopes and threads in such tables (blocks and events name
//! them by index), and reports give small ids to sites and scope paths the same way.

use std::hash::Hash;

/// A hash map for keys that come from a file or a trace (addresses, sizes, stacks of frame ids)
/// and are looked up once or more per event: keyed per process, so a hostile file cannot choose
/// keys that collide, at a fraction of the cost per lookup of std's SipHash, which was a tenth
/// of a leak finder's pass over millions of events.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// A set of such keys, hashed as [`Map`]'s.
pub(crate) type Set<K> = std::collections::HashSet<K, ahash::RandomState>;

/// Items in order of first appearance, found by key. The key is the item itself
/// ([`Interner::intern`]) or something it is made from ([`Interner::id`]: a raw stack id for
/// its symbolized frames, a scope path's text for its names).
#[derive(Debug, Clone)]
pub(crate) struct Interner<K, T = K> {
    ids: Map<K, u32>,
    items: Vec<T>,
}

impl<K, T> Default for Interner<K, T> {
    fn default() -> Self {
        Interner { ids: Map::default(), items: Vec::new() }
    }
}

impl<K: Hash + Eq, T> Interner<K, T> {
    /// The index of `key`'s item, made by `make` and appended when the key is new.
    pub(crate) fn id(&mut self, key: K, make: impl FnOnce(&K) -> T) -> u32 {
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = u32::try_from(self.items.len()).expect("fewer than 2^32 distinct items");
        self.items.push(make(&key));
        self.ids.insert(key, id);
        id
    }

    /// The index of `key`'s item, if it was interned.
    pub(crate) fn get(&self, key: &K) -> Option<u32> {
        self.ids.get(key).copied()
    }

    /// How many distinct items it holds.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// The item at `id`.
    pub(crate) fn item(&self, id: u32) -> &T {
        &self.items[id as usize]
    }

    /// The items, in order of first appearance.
    pub(crate) fn into_items(self) -> Vec<T> {
        self.items
    }

    /// The items, in order of first appearance, and the table that found them (to be dropped
    /// elsewhere: a table of millions of keys takes a while to free).
    pub(crate) fn into_parts(self) -> (Vec<T>, Map<K, u32>) {
        (self.items, self.ids)
    }
}

impl<T: Hash + Eq + Clone> Interner<T, T> {
    /// A table holding `items` already (a snapshot's), the first of equal items found first.
    pub(crate) fn from_items(items: Vec<T>) -> Self {
        let mut ids = Map::with_capacity_and_hasher(items.len(), Default::default());
        for (i, x) in items.iter().enumerate() {
            ids.entry(x.clone()).or_insert(i as u32);
        }
        Interner { ids, items }
    }

    /// The index of `value`, appended when new.
    pub(crate) fn intern(&mut self, value: T) -> u32 {
        self.id(value, T::clone)
    }

    /// The index of the value `value` borrows, cloned in only when new.
    pub(crate) fn intern_ref<Q>(&mut self, value: &Q) -> u32
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = T> + ?Sized,
    {
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        self.intern(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_appearance_wins() {
        let mut t = Interner::from_items(vec!["a".to_string(), "b".into(), "a".into()]);
        assert_eq!(t.get(&"a".to_string()), Some(0));
        assert_eq!(t.intern_ref("b"), 1);
        assert_eq!(t.intern("c".into()), 3);
        assert_eq!(t.intern_ref("c"), 3);
        let mut made = 0;
        let mut s: Interner<u32, String> = Interner::default();
        for k in [7, 9, 7] {
            s.id(k, |k| {
                made += 1;
                k.to_string()
            });
        }
        assert_eq!((made, s.item(1).as_str()), (2, "9"));
        assert_eq!(t.into_items(), ["a", "b", "a", "c"]);
    }
}
