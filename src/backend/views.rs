//! The views a backend has made ([`Backend::alias`](super::Backend::alias)) and the pages each
//! maps again, for the backends that make them (the sim, CUDA's virtual-memory segments): one
//! book, so that both refuse alike to unmap a page a view still maps.

use crate::error::BackendError;
use std::collections::BTreeMap;

/// Views by address, and how many views map each page.
#[derive(Debug, Default)]
pub(crate) struct ViewTable {
    /// Each view's pages, by the view's address.
    views: BTreeMap<u64, Vec<u64>>,
    /// How many views map each page, by the page's address.
    aliased: BTreeMap<u64, u32>,
}

impl ViewTable {
    /// How many views there are.
    pub(crate) fn len(&self) -> usize {
        self.views.len()
    }

    /// Records the view at `addr` of `pages`.
    pub(crate) fn insert(&mut self, addr: u64, pages: &[u64]) {
        for &p in pages {
            *self.aliased.entry(p).or_default() += 1;
        }
        self.views.insert(addr, pages.to_vec());
    }

    /// Whether a view of `count` pages lies at `addr`: an error naming it if not.
    pub(crate) fn check(&self, addr: u64, count: u64) -> Result<(), BackendError> {
        match self.views.get(&addr) {
            Some(pages) if pages.len() as u64 == count => Ok(()),
            _ => Err(BackendError::Other(format!("no view of {count} pages at {addr:#x}"))),
        }
    }

    /// Forgets the view at `addr`.
    pub(crate) fn remove(&mut self, addr: u64) {
        for p in self.views.remove(&addr).unwrap_or_default() {
            if let std::collections::btree_map::Entry::Occupied(mut e) = self.aliased.entry(p) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    /// Refuses, naming the page, where a view maps a page of `[addr, end)`: unmapped or
    /// released, its physical memory would live on behind the view, uncounted.
    pub(crate) fn refuse_aliased(&self, addr: u64, end: u64) -> Result<(), BackendError> {
        match self.aliased.range(addr..end.max(addr)).next() {
            Some((&p, _)) => Err(BackendError::Other(format!("page {p:#x} is mapped by a view: unalias it first"))),
            None => Ok(()),
        }
    }
}
