//! Replaying recorded allocation traces through a [`CachingAllocator`].
//!
//! A replay turns a trace into a sequence of operations on slots, runs it once cold (empty
//! cache) and then several times warm (the cache as the previous pass left it), and reports
//! time per operation of the warm passes, the peak of live (requested) bytes, and the peak of
//! reserved bytes over all passes, the same measurements `torch_replay.py` makes for PyTorch.
//!
//! ```
//! use vramscope::replay::{replay, ReplayOptions, Trace};
//! use vramscope::{CachingAllocator, backend::SimBackend};
//! let trace = Trace::from_bytes(br#"{"events":[["a",1,3000000,0],["a",2,100,0],["f",1,0,0]]}"#, "t")?;
//! let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
//! let report = replay(&alloc, &trace, &ReplayOptions::default())?;
//! assert_eq!(report.ops, 3);
//! assert_eq!(report.peak_live_bytes, 3_000_100);
//! assert!(report.peak_reserved_bytes >= report.peak_live_bytes);
//! # Ok::<(), vramscope::Error>(())
//! ```

mod fit;
mod trace;

pub use fit::{smallest_cap, Fit};
pub use trace::{Trace, TraceEvent, TraceOp};

use crate::alloc::{Buffer, CachingAllocator, MemoryStats, Stream};
use crate::error::Result;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;

/// How to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Warm passes after the cold one; the reported time is their median. Default: 3.
    pub warm_passes: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { warm_passes: 3 }
    }
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The trace's source.
    pub trace: String,
    /// The backend's name.
    pub backend: String,
    /// Operations per pass (allocations plus frees that matched an allocation).
    pub ops: usize,
    /// Allocations per pass.
    pub allocs: usize,
    /// Frees per pass.
    pub frees: usize,
    /// Streams the trace allocates on.
    pub streams: usize,
    /// Events of the trace that were skipped: frees of unknown addresses, allocations at an
    /// address still live.
    pub skipped: usize,
    /// Nanoseconds per operation of the cold pass.
    pub cold_ns_per_op: f64,
    /// Nanoseconds per operation, median of the warm passes.
    pub ns_per_op: f64,
    /// Nanoseconds per operation of each warm pass, in the order they ran (how much the
    /// median hides: a noisy machine shows here).
    pub warm_ns_per_op: Vec<f64>,
    /// Peak of live bytes as requested by the trace.
    pub peak_live_bytes: u64,
    /// Peak of reserved bytes over all passes.
    pub peak_reserved_bytes: u64,
    /// `peak_reserved_bytes / peak_live_bytes`.
    pub fragmentation: f64,
    /// Segments reserved from the backend over all passes.
    pub device_allocs: u64,
    /// Segments reserved from the backend in the last warm pass.
    pub warm_device_allocs: u64,
    /// Page map and unmap calls over all passes.
    pub device_maps: u64,
    /// Page map and unmap calls in the last warm pass.
    pub warm_device_maps: u64,
    /// Backend calls for memory in each warm pass, in the order the passes ran: segments
    /// reserved and released, pages mapped and unmapped. A replay has settled from the first
    /// pass after which every count is 0.
    pub warm_device_calls: Vec<u64>,
    /// Questions to the backend whether a stream's work is done, in each warm pass
    /// ([`MemoryStats::num_stream_queries`]: on CUDA a `cuStreamQuery`, about half a
    /// microsecond, in the pass's time); 0 on one stream.
    pub warm_stream_queries: Vec<u64>,
    /// The fragmentation limit in force at the end (it rises from the configured one when
    /// holding to it churns); `None` without a limit.
    pub fragmentation_limit: Option<f64>,
    /// Allocation retries after releasing the cache.
    pub alloc_retries: u64,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc { slot: u32, size: u64, stream: u32 },
    Free { slot: u32 },
}

struct Encoded {
    ops: Vec<Op>,
    slots: usize,
    streams: Vec<u64>,
    allocs: usize,
    skipped: usize,
    peak_live: u64,
}

/// Turns addresses into slots and stream handles into indices, as `torch_replay.py` does, so
/// that a pass needs no hashing; linear in the events, whatever the number of streams. Live
/// bytes are summed in 128 bits: sizes a hostile trace claims cannot overflow them, and the
/// peak saturates at `u64::MAX`.
fn encode(trace: &Trace) -> Encoded {
    let mut live: HashMap<u64, (u32, u64)> = HashMap::new();
    let mut free_slots: Vec<u32> = Vec::new();
    let mut slots = 0u32;
    let mut streams: Vec<u64> = vec![0];
    let mut stream_index: HashMap<u64, u32> = HashMap::from([(0, 0)]);
    let (mut cur, mut peak, mut skipped, mut allocs) = (0u128, 0u128, 0, 0);
    let mut ops = Vec::with_capacity(trace.events.len());
    for e in &trace.events {
        match e.op {
            TraceOp::Alloc => {
                if live.contains_key(&e.addr) {
                    skipped += 1;
                    continue;
                }
                let slot = free_slots.pop().unwrap_or_else(|| {
                    slots += 1;
                    slots - 1
                });
                let stream = *stream_index.entry(e.stream).or_insert_with(|| {
                    streams.push(e.stream);
                    (streams.len() - 1) as u32
                });
                live.insert(e.addr, (slot, e.size));
                ops.push(Op::Alloc { slot, size: e.size, stream });
                allocs += 1;
                cur += u128::from(e.size);
                peak = peak.max(cur);
            }
            TraceOp::Free => match live.remove(&e.addr) {
                Some((slot, size)) => {
                    free_slots.push(slot);
                    ops.push(Op::Free { slot });
                    cur -= u128::from(size);
                }
                None => skipped += 1,
            },
        }
    }
    let peak_live = u64::try_from(peak).unwrap_or(u64::MAX);
    Encoded { ops, slots: slots as usize, streams, allocs, skipped, peak_live }
}

fn run_pass(alloc: &CachingAllocator, enc: &Encoded, streams: &[Stream]) -> Result<f64> {
    let mut slots: Vec<Option<Buffer<u8>>> = (0..enc.slots).map(|_| None).collect();
    let start = Instant::now();
    for op in &enc.ops {
        match *op {
            Op::Alloc { slot, size, stream } => {
                let buf = alloc.alloc::<u8>(&streams[stream as usize], size as usize)?;
                slots[slot as usize] = Some(buf);
            }
            Op::Free { slot } => slots[slot as usize] = None,
        }
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    drop(slots);
    Ok(elapsed)
}

/// Replays `trace` through `alloc`: one cold pass, then `options.warm_passes` warm ones.
///
/// Fails with the allocator's error if an allocation fails (for example, out of memory on a
/// backend too small for the trace).
pub fn replay(alloc: &CachingAllocator, trace: &Trace, options: &ReplayOptions) -> Result<ReplayReport> {
    let enc = encode(trace);
    let mut streams = vec![alloc.default_stream()];
    for _ in 1..enc.streams.len() {
        streams.push(alloc.new_stream()?);
    }
    let before = alloc.stats();
    alloc.reset_peak_stats();
    let cold = run_pass(alloc, &enc, &streams)?;
    let mut warm = Vec::with_capacity(options.warm_passes);
    let (mut warm_device_allocs, mut warm_device_maps) = (0, 0);
    let mut warm_device_calls = Vec::with_capacity(options.warm_passes);
    let mut warm_stream_queries = Vec::with_capacity(options.warm_passes);
    let maps = |m: &MemoryStats| m.num_device_map + m.num_device_unmap;
    for _ in 0..options.warm_passes {
        let a = alloc.stats();
        warm.push(run_pass(alloc, &enc, &streams)?);
        let b = alloc.stats();
        warm_device_allocs = b.num_device_alloc - a.num_device_alloc;
        warm_device_maps = maps(&b) - maps(&a);
        warm_device_calls.push(b.backend_memory_calls() - a.backend_memory_calls());
        warm_stream_queries.push(b.num_stream_queries - a.num_stream_queries);
    }
    let ops = enc.ops.len().max(1) as f64;
    let warm_ns_per_op: Vec<f64> = warm.iter().map(|w| w / ops).collect();
    warm.sort_by(f64::total_cmp);
    let warm_ns = if warm.is_empty() { cold } else { warm[warm.len() / 2] };
    let after = alloc.stats();
    let peak_reserved = alloc.max_memory_reserved();
    Ok(ReplayReport {
        trace: trace.source.clone(),
        backend: alloc.backend().name().to_string(),
        ops: enc.ops.len(),
        allocs: enc.allocs,
        frees: enc.ops.len() - enc.allocs,
        streams: enc.streams.len(),
        skipped: enc.skipped,
        cold_ns_per_op: cold / ops,
        ns_per_op: warm_ns / ops,
        warm_ns_per_op,
        peak_live_bytes: enc.peak_live,
        peak_reserved_bytes: peak_reserved,
        fragmentation: if enc.peak_live == 0 { 0.0 } else { peak_reserved as f64 / enc.peak_live as f64 },
        device_allocs: after.num_device_alloc - before.num_device_alloc,
        warm_device_allocs,
        device_maps: maps(&after) - maps(&before),
        warm_device_maps,
        warm_device_calls,
        warm_stream_queries,
        fragmentation_limit: alloc.fragmentation_limit(),
        alloc_retries: after.num_alloc_retries - before.num_alloc_retries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{TraceEvent, TraceOp};

    fn event(op: TraceOp, addr: u64, size: u64, stream: u64) -> TraceEvent {
        TraceEvent { op, addr, size, stream }
    }

    /// Two allocations of `u64::MAX` bytes, both freed: no overflow in any profile (this test
    /// runs with overflow checks in the dev profile), the peak saturates, and the replay itself
    /// is an error, not a panic.
    #[test]
    fn huge_sizes_neither_overflow_nor_panic() {
        let events = vec![
            event(TraceOp::Alloc, 0x1000, u64::MAX, 0),
            event(TraceOp::Alloc, 0x2000, u64::MAX, 0),
            event(TraceOp::Free, 0x1000, u64::MAX, 0),
            event(TraceOp::Free, 0x2000, u64::MAX, 0),
        ];
        let trace = Trace { source: "huge".into(), events };
        let enc = encode(&trace);
        assert_eq!((enc.allocs, enc.ops.len(), enc.peak_live), (2, 4, u64::MAX));
        let alloc = CachingAllocator::new(crate::backend::SimBackend::new(1 << 30));
        assert!(replay(&alloc, &trace, &ReplayOptions::default()).is_err());
    }

    /// 150,000 streams of one allocation and free each: every stream gets its own index, in
    /// order of first use, in time linear in the events (a scan of the known streams per event
    /// took 4.35 s here).
    #[test]
    fn many_streams_encode_in_linear_time() {
        let n = 150_000u64;
        let events: Vec<TraceEvent> = (0..n)
            .flat_map(|i| {
                let stream = (i + 1) << 32 | 7;
                [event(TraceOp::Alloc, 0x1000, 512, stream), event(TraceOp::Free, 0x1000, 512, stream)]
            })
            .collect();
        let start = std::time::Instant::now();
        let enc = encode(&Trace { source: "streams".into(), events });
        assert!(start.elapsed().as_secs_f64() < 5.0, "{:?}", start.elapsed());
        assert_eq!(enc.streams.len() as u64, n + 1, "the default stream and one per handle");
        let firsts: Vec<u32> = enc
            .ops
            .iter()
            .filter_map(|op| match *op {
                Op::Alloc { stream, .. } => Some(stream),
                Op::Free { .. } => None,
            })
            .collect();
        assert!(firsts.iter().enumerate().all(|(i, &s)| s as usize == i + 1));
        assert_eq!(enc.peak_live, 512);
    }
}
