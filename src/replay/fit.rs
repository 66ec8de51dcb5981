//! The smallest memory a trace fits in: bisection on the most the allocator may reserve
//! ([`AllocatorConfig::per_process_memory_fraction`]), replaying the trace on a sim backend that
//! decides as on CUDA.
//!
//! On an H200 the sim's answer was the GPU's for every fixture trace with both segment kinds:
//! each ran there under the smallest cap that ran on the sim, and ran out of memory under the
//! largest that failed (38 of 38, `BENCHMARKS.md`, "The smallest memory a program fits in").

use super::{replay, ReplayOptions, Trace};
use crate::alloc::{AllocatorConfig, CachingAllocator};
use crate::backend::SimBackend;
use crate::error::{Error, Result};
use serde::Serialize;

/// What [`smallest_cap`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Fit {
    /// The trace's peak of live bytes.
    pub peak_live_bytes: u64,
    /// What the allocator reserved at most without a cap.
    pub unconstrained_reserved_bytes: u64,
    /// The smallest cap tried under which every pass ran.
    pub fits: u64,
    /// The largest cap tried under which a pass ran out of memory (the peak of live bytes
    /// less one where none below `fits` was tried; 0 for a trace that reserves nothing).
    pub fails: u64,
    /// Backend calls for memory in each warm pass under `fits`: the price of fitting that
    /// tight (pages mapped and unmapped, segments reserved and released, pass after pass).
    pub warm_device_calls: Vec<u64>,
}

impl Fit {
    /// `fits` over the peak of live bytes.
    pub fn ratio(&self) -> f64 {
        self.fits as f64 / self.peak_live_bytes.max(1) as f64
    }
}

/// The smallest cap on reserved memory under which `trace` replays (a cold pass and
/// `options.warm_passes` warm ones) with `config`, on a sim backend of `device_bytes` whose
/// segment calls count as costly (as `vramscope replay --backend sim-cuda`), found by
/// bisection to 0.1% of the trace's peak of live bytes (at least 1 MiB), between that peak and
/// what the allocator reserves without a cap. `config`'s own `per_process_memory_fraction` is
/// replaced.
///
/// Fitting is not always monotone in the cap (a different cap can place blocks differently),
/// so `fits` is the smallest cap *tried* that ran and `fails` the largest tried that did not.
///
/// ```
/// use vramscope::replay::{smallest_cap, ReplayOptions, Trace};
/// use vramscope::config::AllocatorConfig;
/// let trace = Trace::from_bytes(br#"{"events":[["a",1,30000000,0],["f",1,0,0],["a",2,40000000,0]]}"#, "t")?;
/// let fit = smallest_cap(&trace, &AllocatorConfig::default(), 1 << 40, &ReplayOptions::default())?;
/// assert!(fit.fits >= fit.peak_live_bytes && fit.fails < fit.fits);
/// # Ok::<(), vramscope::Error>(())
/// ```
///
/// Errors when the trace does not replay even without a cap on `device_bytes`, or with the
/// replay's error other than running out of memory.
pub fn smallest_cap(
    trace: &Trace,
    config: &AllocatorConfig,
    device_bytes: u64,
    options: &ReplayOptions,
) -> Result<Fit> {
    // The cap is a fraction of the device the sim backend has: the same bytes as asked where
    // the sim can have them, its largest capacity otherwise.
    let device_bytes = device_bytes.min(SimBackend::MAX_CAPACITY);
    let attempt = |cap: Option<u64>| -> Result<super::ReplayReport> {
        let mut c = config.clone();
        c.per_process_memory_fraction = cap.map(|cap| cap as f64 / device_bytes as f64);
        let alloc = CachingAllocator::with_config(SimBackend::new(device_bytes).with_costly_segments(true), c)?;
        replay(&alloc, trace, options)
    };
    // Ran (`Some`), ran out of memory (`None`), or another error.
    let run = |cap: u64| match attempt(Some(cap)) {
        Ok(r) => Ok(Some(r)),
        Err(Error::OutOfMemory(_)) => Ok(None),
        Err(e) => Err(e),
    };
    let free = attempt(None)?;
    let live = free.peak_live_bytes;
    if free.peak_reserved_bytes == 0 {
        // Nothing to fit (no allocation, or only empty ones).
        return Ok(Fit {
            peak_live_bytes: live,
            unconstrained_reserved_bytes: 0,
            fits: 0,
            fails: 0,
            warm_device_calls: free.warm_device_calls,
        });
    }
    let step = (live / 1000).max(1 << 20);
    let (mut lo, mut hi) = (live.saturating_sub(1), free.peak_reserved_bytes);
    // Capped, the allocator may need more than it reserved uncapped (the soft limit cannot
    // rise past the cap): up in steps of 5% until a run, the whole device at most.
    let mut at_hi = loop {
        if hi >= device_bytes {
            hi = device_bytes;
            break free.clone();
        }
        match run(hi)? {
            Some(r) => break r,
            None => {
                lo = hi;
                hi += (hi / 20).max(step);
            }
        }
    };
    while hi - lo > step {
        let mid = lo + (hi - lo) / 2;
        match run(mid)? {
            Some(r) => {
                hi = mid;
                at_hi = r;
            }
            None => lo = mid,
        }
    }
    Ok(Fit {
        peak_live_bytes: live,
        unconstrained_reserved_bytes: free.peak_reserved_bytes,
        fits: hi,
        fails: lo,
        warm_device_calls: at_hi.warm_device_calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer does not depend on how large the device is, up to the largest `u64`: the cap
    /// is a fraction of the device the sim has, so a device past the sim's largest capacity
    /// answers as that capacity does.
    #[test]
    fn the_fit_is_the_same_on_any_large_device() {
        let trace = Trace::from_bytes(
            br#"{"events":[["a",1,30000000,0],["f",1,0,0],["a",2,40000000,0],["a",3,9000000,0],["f",2,0,0]]}"#,
            "t",
        )
        .unwrap();
        let fit =
            |device| smallest_cap(&trace, &AllocatorConfig::default(), device, &ReplayOptions::default()).unwrap();
        let base = fit(1 << 30);
        for device in [1 << 40, 1 << 56, 1 << 63, u64::MAX - 1, u64::MAX] {
            let f = fit(device);
            assert_eq!((f.fits, f.fails), (base.fits, base.fails), "device of {device} bytes");
        }
    }
}
