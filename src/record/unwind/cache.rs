//! The per-thread table of steps by address: open addressing, linear probing, two words a
//! slot, no lock and no atomic on a hit.

/// Steps by address ([`Step::encode`](super::rule::Step::encode)d), at most
/// [`RuleCache::MAX_SLOTS`] slots.
#[derive(Debug, Default)]
pub(crate) struct RuleCache {
    /// `[address, step]` pairs; address 0 marks an empty slot.
    slots: Vec<[u64; 2]>,
    len: usize,
}

impl RuleCache {
    /// An empty table (it allocates at its first insert).
    pub(crate) const fn new() -> Self {
        RuleCache { slots: Vec::new(), len: 0 }
    }

    /// Slots a table starts with.
    const FIRST_SLOTS: usize = 1024;
    /// The most slots a thread keeps (16 MiB); a table that would grow past it starts over.
    pub(crate) const MAX_SLOTS: usize = 1 << 20;

    #[inline(always)]
    fn slot_of(addr: u64, mask: usize) -> usize {
        // Fibonacci hashing: return addresses share their low bits' alignment and high bits.
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask
    }

    /// The step cached for `addr` (nonzero), if any.
    #[inline(always)]
    pub(crate) fn get(&self, addr: u64) -> Option<u64> {
        let mask = self.slots.len().wrapping_sub(1);
        if self.slots.is_empty() {
            return None;
        }
        let mut i = Self::slot_of(addr, mask);
        loop {
            let [a, step] = self.slots[i];
            if a == addr {
                return Some(step);
            }
            if a == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Caches `step` for `addr` (both nonzero).
    pub(crate) fn insert(&mut self, addr: u64, step: u64) {
        debug_assert!(addr != 0 && step != 0);
        if (self.len + 1) * 2 > self.slots.len() {
            let slots = if self.slots.is_empty() {
                Self::FIRST_SLOTS
            } else if self.slots.len() < Self::MAX_SLOTS {
                self.slots.len() * 2
            } else {
                // Full at the cap: start over rather than grow without bound.
                self.clear();
                Self::MAX_SLOTS
            };
            let old = std::mem::replace(&mut self.slots, vec![[0, 0]; slots]);
            self.len = 0;
            for [a, s] in old {
                if a != 0 {
                    self.put(a, s);
                }
            }
        }
        self.put(addr, step);
    }

    fn put(&mut self, addr: u64, step: u64) {
        let mask = self.slots.len() - 1;
        let mut i = Self::slot_of(addr, mask);
        while self.slots[i][0] != 0 && self.slots[i][0] != addr {
            i = (i + 1) & mask;
        }
        if self.slots[i][0] == 0 {
            self.len += 1;
        }
        self.slots[i] = [addr, step];
    }

    /// Forgets every step (objects were unloaded: their addresses may hold other code now).
    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = [0, 0]);
        self.len = 0;
    }

    /// Addresses cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_empty_cache_knows_nothing() {
        let c = RuleCache::default();
        assert_eq!(c.get(0x1234), None);
        assert_eq!(c.len(), 0);
    }

    proptest! {
        /// The cache answers as a map does, through growth and clearing.
        #[test]
        fn the_cache_is_a_map(ops in prop::collection::vec((1u64..5000, 1u64..u64::MAX, 0u8..40), 1..3000)) {
            let mut cache = RuleCache::default();
            let mut model = std::collections::HashMap::new();
            for (addr, step, op) in ops {
                // Addresses spaced as return addresses are, and a few far apart.
                let addr = if op == 1 { addr << 40 } else { 0x5555_0000_0000 + addr * 16 };
                if op == 0 {
                    cache.clear();
                    model.clear();
                } else {
                    cache.insert(addr, step);
                    model.insert(addr, step);
                }
                prop_assert_eq!(cache.len(), model.len());
                prop_assert_eq!(cache.get(addr), model.get(&addr).copied());
            }
            for (&a, &s) in &model {
                prop_assert_eq!(cache.get(a), Some(s));
            }
        }
    }
}
