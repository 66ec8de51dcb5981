//! The views a backend has made ([`Backend::alias`](super::Backend::alias)) and the mappings
//! each maps again, for the backends that make them (the sim, CUDA's virtual-memory segments):
//! one book, so that both refuse alike to unmap a mapping a view still maps.

use crate::error::BackendError;
use std::collections::BTreeMap;

/// Views by address, and how many views map each mapping.
#[derive(Debug, Default)]
pub(crate) struct ViewTable {
    /// Each view's length and the starts of the mappings it maps, by the view's address.
    views: BTreeMap<u64, (u64, Vec<u64>)>,
    /// How many views map each mapping, by the mapping's start.
    aliased: BTreeMap<u64, u32>,
}

impl ViewTable {
    /// How many views there are.
    pub(crate) fn len(&self) -> usize {
        self.views.len()
    }

    /// Records the view at `addr`, `len` bytes long, of the mappings starting at `maps`.
    pub(crate) fn insert(&mut self, addr: u64, len: u64, maps: &[u64]) {
        for &p in maps {
            *self.aliased.entry(p).or_default() += 1;
        }
        self.views.insert(addr, (len, maps.to_vec()));
    }

    /// Whether a view of `len` bytes lies at `addr`: an error naming it if not.
    pub(crate) fn check(&self, addr: u64, len: u64) -> Result<(), BackendError> {
        match self.views.get(&addr) {
            Some(&(l, _)) if l == len => Ok(()),
            _ => Err(BackendError::Other(format!("no view of {len} bytes at {addr:#x}"))),
        }
    }

    /// Forgets the view at `addr`.
    pub(crate) fn remove(&mut self, addr: u64) {
        for p in self.views.remove(&addr).map(|(_, maps)| maps).unwrap_or_default() {
            if let std::collections::btree_map::Entry::Occupied(mut e) = self.aliased.entry(p) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    /// Refuses, naming the mapping, where a view maps a mapping that starts in `[addr, end)`
    /// (the backends unmap whole mappings only): unmapped or released, its physical memory
    /// would live on behind the view, uncounted.
    pub(crate) fn refuse_aliased(&self, addr: u64, end: u64) -> Result<(), BackendError> {
        match self.aliased.range(addr..end.max(addr)).next() {
            Some((&p, _)) => {
                Err(BackendError::Other(format!("the mapping at {p:#x} is mapped by a view: unalias it first")))
            }
            None => Ok(()),
        }
    }
}
