//! The fragmentation limit: how far reserved memory may rise above the peak of allocated bytes
//! before the heap gives cached memory back, how it rises when holding to it makes a loop
//! churn, and the cap (`per_process_memory_fraction`) that no reservation passes.
//!
//! [`Limit`] holds the state these rules read and write, and nothing else: the heap tells it of
//! each new figure (allocated, released, wanted) and asks it for the limit in force. What a
//! raise adds to the statistics is the heap's accounting's to write ([`super::accounting`]).

use crate::backend::Backend;
use crate::config::{AllocatorConfig, LimitMax};
use crate::error::BackendError;

/// How many sizes [`Limit::churned_at_ceiling`] remembers.
const CEILING_CHURNS: usize = 64;

/// The fragmentation limit's state.
#[derive(Debug)]
pub(super) struct Limit {
    /// Peak of allocated bytes since creation (never reset by the public resets).
    peak: u64,
    /// The limit in force, times `peak`: starts at the configured one and rises on churn.
    factor: Option<f64>,
    /// How far `factor` may rise; `None`: it stays.
    max: Option<f64>,
    /// Whether `max` is the automatic ceiling, which gives way to a loop that churns at it
    /// twice; one the user set holds.
    auto_ceiling: bool,
    /// The most the heap may reserve (`per_process_memory_fraction` of the device), if less
    /// than the device: see [`Limit::within_cap`].
    cap: Option<u64>,
    /// The granularity sizes are compared in by [`Limit::churned_at_ceiling`].
    page: u64,
    /// The sizes (in pages) of requests that churned with the limit at its ceiling.
    ceiling_churns: Vec<u64>,
    /// The largest free piece given back to the backend by the limit since the last new peak
    /// of allocated bytes.
    released_since_peak: u64,
    /// What the reclaims that gave memory back since the last peak of allocated bytes wanted
    /// reserved, at most, where their requests' needs were exact (see
    /// [`Limit::note_regrowth`]).
    released_wanted: u64,
    /// Raises since the last new peak of allocated bytes: each rise without a new peak doubles
    /// the least step of the next.
    raises_since_peak: u32,
}

impl Limit {
    /// The limit `config` sets on `backend`, comparing sizes in `page`s.
    pub(super) fn new(config: &AllocatorConfig, backend: &dyn Backend, page: u64) -> Limit {
        Limit {
            peak: 0,
            factor: config.fragmentation_limit,
            max: config.fragmentation_limit_max.resolve(backend.costly_segments()),
            auto_ceiling: config.fragmentation_limit_max == LimitMax::Auto,
            cap: config.per_process_memory_fraction.map(|f| (backend.total_memory() as f64 * f).round() as u64),
            page,
            ceiling_churns: Vec::new(),
            released_since_peak: 0,
            released_wanted: 0,
            raises_since_peak: 0,
        }
    }

    /// The most the heap may reserve, if less than the device.
    pub(super) fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// The fragmentation limit in force.
    pub(super) fn factor(&self) -> Option<f64> {
        self.factor
    }

    /// Sets the limit in force (tests: a setup that reserves without a limit).
    #[cfg(test)]
    pub(super) fn set_factor(&mut self, factor: Option<f64>) -> Option<f64> {
        std::mem::replace(&mut self.factor, factor)
    }

    /// Notes allocated bytes after an allocation: a new peak starts the churn records afresh.
    #[inline]
    pub(super) fn note_allocated(&mut self, allocated: u64) {
        if allocated > self.peak {
            self.peak = allocated;
            self.released_since_peak = 0;
            self.raises_since_peak = 0;
            self.released_wanted = 0;
        }
    }

    /// Notes that the limit gave back a free piece of `size` bytes.
    pub(super) fn note_released(&mut self, size: u64) {
        self.released_since_peak = self.released_since_peak.max(size);
    }

    /// Notes that a reclaim with an exact need gave memory back where reserved would have had
    /// to reach `wanted` to give nothing back.
    pub(super) fn note_wanted(&mut self, wanted: u64) {
        self.released_wanted = self.released_wanted.max(wanted);
    }

    /// Reserved bytes above which the heap reclaims before growing, for a request of `size`
    /// bytes with `allocated` bytes allocated: never above the cap, so that reclaiming gives
    /// back what the cap would refuse before the cap refuses it. `threshold` is
    /// `garbage_collection_threshold`, a share of the cap or of `total`, the device's memory.
    pub(super) fn soft(&self, allocated: u64, size: u64, threshold: Option<f64>, total: impl FnOnce() -> u64) -> u64 {
        let mut limit = self.cap.unwrap_or(u64::MAX);
        if let Some(f) = self.factor {
            // `f` times the peak of allocated bytes, the request counted.
            let peak = self.peak.max(allocated + size);
            limit = limit.min((peak as f64 * f) as u64);
        }
        if let Some(t) = threshold {
            let allowed = self.cap.unwrap_or_else(total);
            limit = limit.min((allowed as f64 * t) as u64);
        }
        limit
    }

    /// Refuses, as the backend refuses a request when the device is full, `more` bytes that
    /// would take `reserved` past the cap.
    pub(super) fn within_cap(&self, reserved: u64, more: u64) -> Result<(), BackendError> {
        match self.cap {
            Some(cap) if reserved.saturating_add(more) > cap => Err(BackendError::OutOfMemory {
                requested: more,
                message: format!(
                    "{} more would pass what the allocator may reserve, {} (per_process_memory_fraction, \
                     or the capacity set on CUDA), with {} reserved",
                    crate::error::fmt_bytes(more),
                    crate::error::fmt_bytes(cap),
                    crate::error::fmt_bytes(reserved),
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The rule of [`super::Heap::note_regrowth`]: before asking the backend for `need` bytes
    /// for a request of `size` bytes, with `allocated` allocated and `reserved` reserved, raises
    /// the limit if holding to it made the request churn. Returns whether it rose.
    pub(super) fn note_regrowth(&mut self, size: u64, need: u64, allocated: u64, reserved: u64) -> bool {
        if size > self.released_since_peak || allocated + size > self.peak {
            return false;
        }
        self.released_since_peak = 0;
        let spared = std::mem::take(&mut self.released_wanted);
        let (Some(f), Some(max)) = (self.factor, self.max) else { return false };
        // What growing now without giving anything back takes, in steps of 0.5%, or what the
        // reclaims that gave memory back since the peak wanted, if more (known where their
        // need was exact): that limit would have spared this request's growth and the
        // give-back that made it churn.
        let wanted = (reserved + need).max(spared);
        let wanted = wanted as f64 / self.peak.max(1) as f64;
        let step = 0.005 * f64::from(1u32 << self.raises_since_peak.min(6));
        let next = (f + step).max((wanted * 200.0).ceil() / 200.0);
        let next = (next * 1000.0).round() / 1000.0;
        if f < max {
            self.factor = Some(next.min(max));
        } else if self.auto_ceiling && self.churned_at_ceiling(size) {
            // Only the automatic ceiling gives way; one the user set holds.
            self.factor = Some(next);
        } else {
            return false;
        }
        self.raises_since_peak += 1;
        true
    }

    /// Notes that a request of `size` bytes churned with the limit at its ceiling; true if a
    /// request of that size (in pages) churned there before. Once is what a workload's
    /// first passes may cost; twice, at the same size, is a loop's steady state, which holding
    /// to the ceiling would make call the backend on every step from then on.
    fn churned_at_ceiling(&mut self, size: u64) -> bool {
        let key = size.next_multiple_of(self.page);
        if self.ceiling_churns.contains(&key) {
            return true;
        }
        if self.ceiling_churns.len() == CEILING_CHURNS {
            self.ceiling_churns.remove(0);
        }
        self.ceiling_churns.push(key);
        false
    }
}
