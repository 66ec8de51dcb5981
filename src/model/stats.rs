//! PyTorch-compatible allocator statistics and the memory summary table.

use std::collections::BTreeMap;

/// One counter: its current value, its peak, and the totals it rose and fell by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) current: u64,
    pub(crate) peak: u64,
    pub(crate) allocated: u64,
    /// `current` when the totals were last reset: `freed` is derived, not counted.
    base: u64,
}

impl Stat {
    #[inline]
    pub(crate) fn inc(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    #[inline]
    pub(crate) fn dec(&mut self, n: u64) {
        debug_assert!(self.current >= n, "statistic would go negative");
        self.current -= n;
    }

    /// The total decrease: what rose and is no longer there.
    pub(crate) fn freed(&self) -> u64 {
        self.allocated + self.base - self.current
    }

    fn reset_totals(&mut self) {
        self.allocated = 0;
        self.base = self.current;
    }
}

/// One statistic: its value now, its peak, and the totals it rose and fell by since the
/// totals were last reset ([`CachingAllocator::reset_accumulated_stats`](crate::CachingAllocator::reset_accumulated_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Counter {
    /// The value now.
    pub current: u64,
    /// The highest value since the peaks were last reset.
    pub peak: u64,
    /// The total it rose by.
    pub allocated: u64,
    /// The total it fell by.
    pub freed: u64,
}

impl From<&Stat> for Counter {
    fn from(s: &Stat) -> Counter {
        Counter { current: s.current, peak: s.peak, allocated: s.allocated, freed: s.freed() }
    }
}

/// A statistic for both pools together and for each pool (requests of at most 1 MiB go to the
/// small pool, except where one stream holds segments that grow in place: see [`Pool`]), as
/// PyTorch keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PoolCounters {
    /// Both pools.
    pub all: Counter,
    /// Blocks of at most 1 MiB.
    pub small_pool: Counter,
    /// The others.
    pub large_pool: Counter,
}

impl From<&PoolStat> for PoolCounters {
    fn from(s: &PoolStat) -> PoolCounters {
        PoolCounters { all: (&s.all).into(), small_pool: (&s.pools[0]).into(), large_pool: (&s.pools[1]).into() }
    }
}

/// Everything an allocator counts, with the meanings of PyTorch's `torch.cuda.memory_stats()`;
/// [`MemoryStats::to_pytorch_map`] gives PyTorch's flat map with its key names.
///
/// ```
/// use vramscope::{CachingAllocator, backend::HostBackend};
/// let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
/// let x = alloc.alloc::<f32>(alloc.default_stream(), 1000)?;
/// let stats = alloc.stats();
/// assert_eq!(stats.allocation.all.current, 1);
/// assert_eq!(stats.allocated_bytes.all.current, 4096);
/// assert_eq!(stats.to_pytorch_map()["allocated_bytes.all.current"], 4096);
/// # drop(x);
/// # Ok::<(), vramscope::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Blocks handed out to live buffers.
    pub allocation: PoolCounters,
    /// Segments held from the backend.
    pub segment: PoolCounters,
    /// Blocks allocated, or dropped and waiting for other streams before they can be reused.
    pub active: PoolCounters,
    /// Free blocks that are part of a split segment (not releasable).
    pub inactive_split: PoolCounters,
    /// Bytes of the blocks handed out (rounded sizes).
    pub allocated_bytes: PoolCounters,
    /// Bytes held from the backend.
    pub reserved_bytes: PoolCounters,
    /// Bytes of active blocks.
    pub active_bytes: PoolCounters,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: PoolCounters,
    /// Bytes callers asked for, before rounding, of the allocated blocks. (PyTorch's goes on
    /// counting a block freed while another stream uses it until that stream is done, as its
    /// `active_bytes` does; a snapshot's segment `requested_size` counts those blocks too.)
    pub requested_bytes: PoolCounters,
    /// Allocations of at least `max_split_size` bytes.
    pub oversize_allocations: Counter,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: Counter,
    /// Requests that failed once and were retried after releasing the cache.
    pub num_alloc_retries: u64,
    /// Requests that failed for lack of memory.
    pub num_ooms: u64,
    /// Times every stream was synchronized (to release cached memory).
    pub num_sync_all_streams: u64,
    /// Segments reserved from the backend.
    pub num_device_alloc: u64,
    /// Segments returned to the backend.
    pub num_device_free: u64,
    /// Page mappings (vramscope's; not in PyTorch's map).
    pub num_device_map: u64,
    /// Page unmappings (vramscope's).
    pub num_device_unmap: u64,
    /// Idle streams' cached segments handed to another stream instead of a new segment
    /// (vramscope's).
    pub num_segment_adoptions: u64,
    /// Backend calls that failed other than for lack of memory (vramscope's).
    pub num_backend_errors: u64,
    /// Times the fragmentation limit rose because holding to it churned (vramscope's; never
    /// reset).
    pub num_limit_raises: u64,
    /// Times the backend was asked whether a stream's queued work is done (`cuStreamQuery` on
    /// CUDA, about half a microsecond there): to lend one stream's free memory to another, or
    /// to take a loan back (vramscope's; 0 on one stream).
    pub num_stream_queries: u64,
    /// The `max_split_size` in force (`u64::MAX` without one).
    pub max_split_size: u64,
}

impl MemoryStats {
    /// Every figure with its key in PyTorch's flat map (`allocated_bytes.all.current`,
    /// `num_alloc_retries`, ...; vramscope's own counters beside them), in one order: the only
    /// place the names are written. The map, the reading of a map and the sum of two all go
    /// through it.
    fn named_mut(&mut self) -> Vec<(String, &mut u64)> {
        let mut out = Vec::with_capacity(128);
        fn counter<'a>(out: &mut Vec<(String, &'a mut u64)>, name: &str, c: &'a mut Counter) {
            let Counter { current, peak, allocated, freed } = c;
            for (field, v) in [("current", current), ("peak", peak), ("allocated", allocated), ("freed", freed)] {
                out.push((format!("{name}.{field}"), v));
            }
        }
        for (name, s) in [
            ("allocation", &mut self.allocation),
            ("segment", &mut self.segment),
            ("active", &mut self.active),
            ("inactive_split", &mut self.inactive_split),
            ("allocated_bytes", &mut self.allocated_bytes),
            ("reserved_bytes", &mut self.reserved_bytes),
            ("active_bytes", &mut self.active_bytes),
            ("inactive_split_bytes", &mut self.inactive_split_bytes),
            ("requested_bytes", &mut self.requested_bytes),
        ] {
            let PoolCounters { all, small_pool, large_pool } = s;
            for (pool, c) in [("all", all), ("small_pool", small_pool), ("large_pool", large_pool)] {
                counter(&mut out, &format!("{name}.{pool}"), c);
            }
        }
        counter(&mut out, "oversize_allocations", &mut self.oversize_allocations);
        counter(&mut out, "oversize_segments", &mut self.oversize_segments);
        for (k, v) in [
            ("num_alloc_retries", &mut self.num_alloc_retries),
            ("num_ooms", &mut self.num_ooms),
            ("num_sync_all_streams", &mut self.num_sync_all_streams),
            ("num_device_alloc", &mut self.num_device_alloc),
            ("num_device_free", &mut self.num_device_free),
            ("num_device_map", &mut self.num_device_map),
            ("num_device_unmap", &mut self.num_device_unmap),
            ("num_segment_adoptions", &mut self.num_segment_adoptions),
            ("num_backend_errors", &mut self.num_backend_errors),
            ("num_limit_raises", &mut self.num_limit_raises),
            ("num_stream_queries", &mut self.num_stream_queries),
            ("max_split_size", &mut self.max_split_size),
        ] {
            out.push((k.to_string(), v));
        }
        out
    }

    /// Calls to the backend for memory so far: segments reserved and released, pages mapped and
    /// unmapped. A loop that makes none from one step to the next runs on cached memory alone.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::SimBackend};
    /// let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    /// let s = alloc.default_stream();
    /// drop(alloc.alloc::<u8>(&s, 1000).unwrap());
    /// let before = alloc.stats().backend_memory_calls();
    /// drop(alloc.alloc::<u8>(&s, 1000).unwrap()); // the cached block again
    /// assert_eq!(alloc.stats().backend_memory_calls(), before);
    /// ```
    pub fn backend_memory_calls(&self) -> u64 {
        self.num_device_alloc + self.num_device_free + self.num_device_map + self.num_device_unmap
    }

    /// PyTorch's flat map, with its key names (`allocated_bytes.all.current`,
    /// `reserved_bytes.large_pool.peak`, `num_alloc_retries`, ...) and vramscope's own counters
    /// beside them.
    pub fn to_pytorch_map(&self) -> BTreeMap<String, u64> {
        self.clone().named_mut().into_iter().map(|(k, v)| (k, *v)).collect()
    }

    /// The statistics of a flat map with PyTorch's key names, as
    /// [`to_pytorch_map`](Self::to_pytorch_map) writes it; a figure the map lacks is 0, a key
    /// that names no figure is left out.
    pub fn from_pytorch_map(map: &BTreeMap<String, u64>) -> MemoryStats {
        let mut stats = MemoryStats::default();
        for (k, v) in stats.named_mut() {
            if let Some(&x) = map.get(&k) {
                *v = x;
            }
        }
        stats
    }

    /// Adds `other`'s figures to these, saturating (peaks too: the sum of peaks bounds the
    /// peak of the sum).
    pub(crate) fn add(&mut self, other: &MemoryStats) {
        let mut other = other.clone();
        for ((_, a), (_, b)) in self.named_mut().into_iter().zip(other.named_mut()) {
            *a = a.saturating_add(*b);
        }
    }
}

/// `Snapshot::stats` as files hold it: PyTorch's flat map (`allocated_bytes.all.current`: n).
pub(crate) mod flat_map {
    use super::MemoryStats;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub(crate) fn serialize<S: Serializer>(stats: &MemoryStats, s: S) -> Result<S::Ok, S::Error> {
        stats.to_pytorch_map().serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MemoryStats, D::Error> {
        Ok(MemoryStats::from_pytorch_map(&BTreeMap::<String, u64>::deserialize(d)?))
    }
}

/// Which pool a block or segment belongs to: requests of at most 1 MiB go to the small pool
/// (in 2 MiB segments), the others to the large pool. Written `small` and `large`, as
/// PyTorch's `segment_type`. Where segments grow in place (CUDA's virtual segments, the
/// default; the sim) and one stream holds every segment, every request is served from the
/// large pool's growing range (crate docs, "How the allocator works"), so the small pool's
/// counters stay at 0 there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// Blocks of at most 1 MiB.
    Small = 0,
    /// The others.
    Large = 1,
}

impl Pool {
    /// `small` or `large`.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
}

impl std::fmt::Display for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A statistic kept for all pools together and for each pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolStat {
    all: Stat,
    pools: [Stat; 2],
}

impl PoolStat {
    #[inline]
    pub(crate) fn inc(&mut self, pool: Pool, n: u64) {
        self.all.inc(n);
        self.pools[pool as usize].inc(n);
    }

    #[inline]
    pub(crate) fn dec(&mut self, pool: Pool, n: u64) {
        self.all.dec(n);
        self.pools[pool as usize].dec(n);
    }

    pub(crate) fn current(&self) -> u64 {
        self.all.current
    }

    /// Counts `n` that rose and fell again at once (round trips through a thread's parking
    /// slot): the totals move, the current value and the peak do not.
    pub(crate) fn add_round_trips(&mut self, pool: Pool, n: u64) {
        self.all.allocated += n;
        self.pools[pool as usize].allocated += n;
    }

    pub(crate) fn pool_current(&self, pool: Pool) -> u64 {
        self.pools[pool as usize].current
    }

    pub(crate) fn peak(&self) -> u64 {
        self.all.peak
    }

    fn reset_peak(&mut self) {
        self.all.peak = self.all.current;
        for p in &mut self.pools {
            p.peak = p.current;
        }
    }

    /// Sets each peak to the current value of the same statistic in `to`.
    pub(crate) fn set_peaks_to(&mut self, to: &PoolStat) {
        self.all.peak = to.all.current;
        for (p, t) in self.pools.iter_mut().zip(&to.pools) {
            p.peak = t.current;
        }
    }

    /// Raises each peak to at least the current value.
    pub(crate) fn lift_peaks(&mut self) {
        self.all.peak = self.all.peak.max(self.all.current);
        for p in &mut self.pools {
            p.peak = p.peak.max(p.current);
        }
    }

    fn reset_accumulated(&mut self) {
        self.all.reset_totals();
        for p in &mut self.pools {
            p.reset_totals();
        }
    }
}

/// Everything the allocator counts, with PyTorch's meanings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Blocks handed out to live buffers.
    pub(crate) allocation: PoolStat,
    /// Segments held from the backend.
    pub(crate) segment: PoolStat,
    /// Blocks allocated or waiting for other streams before they can be reused.
    pub(crate) active: PoolStat,
    /// Free blocks that are part of a split segment (not releasable).
    pub(crate) inactive_split: PoolStat,
    pub(crate) allocated_bytes: PoolStat,
    /// Bytes mapped from the backend.
    pub(crate) reserved_bytes: PoolStat,
    pub(crate) active_bytes: PoolStat,
    pub(crate) inactive_split_bytes: PoolStat,
    /// Bytes callers asked for, before rounding.
    pub(crate) requested_bytes: PoolStat,
    pub(crate) oversize_allocations: Stat,
    pub(crate) oversize_segments: Stat,
    pub(crate) num_alloc_retries: u64,
    pub(crate) num_ooms: u64,
    pub(crate) num_sync_all_streams: u64,
    pub(crate) num_device_alloc: u64,
    pub(crate) num_device_free: u64,
    pub(crate) num_device_map: u64,
    pub(crate) num_device_unmap: u64,
    /// Cached segments of idle streams handed to another stream instead of a new segment.
    pub(crate) num_segment_adoptions: u64,
    pub(crate) num_backend_errors: u64,
    /// Times the fragmentation limit rose because holding to it churned (never reset).
    pub(crate) num_limit_raises: u64,
    /// Times the backend was asked whether a stream is idle (`Heap::idle`).
    pub(crate) num_stream_queries: u64,
    pub(crate) max_split_size: u64,
}

impl Stats {
    pub(crate) fn reset_peaks(&mut self) {
        for s in self.pool_stats_mut() {
            s.reset_peak();
        }
        self.oversize_allocations.peak = self.oversize_allocations.current;
        self.oversize_segments.peak = self.oversize_segments.current;
    }

    pub(crate) fn reset_accumulated(&mut self) {
        for s in self.pool_stats_mut() {
            s.reset_accumulated();
        }
        self.oversize_allocations.reset_totals();
        self.oversize_segments.reset_totals();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_device_map = 0;
        self.num_device_unmap = 0;
        self.num_segment_adoptions = 0;
        self.num_stream_queries = 0;
    }

    fn pool_stats_mut(&mut self) -> [&mut PoolStat; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// The public, typed copy.
    pub(crate) fn public(&self) -> MemoryStats {
        MemoryStats {
            allocation: (&self.allocation).into(),
            segment: (&self.segment).into(),
            active: (&self.active).into(),
            inactive_split: (&self.inactive_split).into(),
            allocated_bytes: (&self.allocated_bytes).into(),
            reserved_bytes: (&self.reserved_bytes).into(),
            active_bytes: (&self.active_bytes).into(),
            inactive_split_bytes: (&self.inactive_split_bytes).into(),
            requested_bytes: (&self.requested_bytes).into(),
            oversize_allocations: (&self.oversize_allocations).into(),
            oversize_segments: (&self.oversize_segments).into(),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            num_device_map: self.num_device_map,
            num_device_unmap: self.num_device_unmap,
            num_segment_adoptions: self.num_segment_adoptions,
            num_backend_errors: self.num_backend_errors,
            num_limit_raises: self.num_limit_raises,
            num_stream_queries: self.num_stream_queries,
            max_split_size: self.max_split_size,
        }
    }
}

/// PyTorch's `_format_size`: the unit is chosen from `pref`, the figure of the `all` row.
fn format_size(mut sz: u64, mut pref: u64) -> String {
    let prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = prefixes[0];
    for p in &prefixes[1..] {
        if pref < 768 * 1024 {
            break;
        }
        prefix = p;
        sz /= 1024;
        pref /= 1024;
    }
    format!("{sz:6} {prefix}")
}

/// PyTorch's `_format_count`.
fn format_count(mut n: u64, mut pref: u64) -> String {
    let prefixes = [" ", "K", "M"];
    let mut prefix = prefixes[0];
    for p in &prefixes[1..] {
        if pref < 750 * 1000 {
            break;
        }
        prefix = p;
        n /= 1000;
        pref /= 1000;
    }
    format!("{n:7} {prefix} ")
}

/// Renders `memory_stats()` as PyTorch's `torch.cuda.memory_summary()` table.
///
/// `current_only`: only the current figures are known (a PyTorch snapshot, whose figures are
/// worked out from its segments): the peak and total columns print `-`, not a 0 that would
/// contradict the current figure beside it.
pub(crate) fn summary_table(stats: &MemoryStats, backend: &str, device: usize, current_only: bool) -> String {
    let rule = |c: char| c.to_string().repeat(75);
    let mut lines = vec![
        rule('='),
        format!("{:^75}", format!("vramscope memory summary, device ID {device} ({backend})")),
        rule('-'),
        format!(
            "{:^37}|{:^37}",
            format!("OOMs: {}", stats.num_ooms),
            format!("alloc retries: {}", stats.num_alloc_retries)
        ),
        rule('='),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    type Fmt = fn(u64, u64) -> String;
    let metrics: [(&PoolCounters, &str, Fmt); 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_size),
        (&stats.active_bytes, "Active memory", format_size),
        (&stats.requested_bytes, "Requested memory", format_size),
        (&stats.reserved_bytes, "GPU reserved memory", format_size),
        (&stats.inactive_split_bytes, "Non-releasable memory", format_size),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "GPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    let cols = |c: &Counter| [c.current, c.peak, c.allocated, c.freed];
    for (s, name, f) in metrics {
        lines.push(rule('-'));
        let pref = cols(&s.all);
        for (c, label) in
            [(&s.all, name), (&s.large_pool, "      from large pool"), (&s.small_pool, "      from small pool")]
        {
            let cells: Vec<String> = cols(c)
                .iter()
                .zip(&pref)
                .enumerate()
                .map(|(i, (&v, &p))| {
                    let cell = f(v, p);
                    if current_only && i > 0 {
                        format!("{:^w$}", "-", w = cell.chars().count())
                    } else {
                        cell
                    }
                })
                .collect();
            lines.push(format!(" {label:<21} | {} | {} | {} | {} ", cells[0], cells[1], cells[2], cells[3]));
        }
    }
    for (c, name) in
        [(&stats.oversize_allocations, "Oversize allocations"), (&stats.oversize_segments, "Oversize GPU segments")]
    {
        lines.push(rule('-'));
        let cells: Vec<String> = cols(c).iter().map(|&v| format_count(v, v)).collect();
        lines.push(format!(" {name:<21} | {} | {} | {} | {} ", cells[0], cells[1], cells[2], cells[3]));
    }
    lines.push(rule('='));
    let mut out = String::new();
    for l in lines {
        out.push('|');
        out.push_str(&l);
        out.push_str("|\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flat map is the typed statistics' one file form: every figure goes out under its
    /// PyTorch name and comes back; a name that is no figure is left out; sums saturate.
    #[test]
    fn the_flat_map_round_trips() {
        let mut st = MemoryStats::default();
        for (i, (_, v)) in st.named_mut().into_iter().enumerate() {
            *v = i as u64 * 3 + 1;
        }
        let map = st.to_pytorch_map();
        assert_eq!(map.len(), 9 * 3 * 4 + 2 * 4 + 12, "every figure has a distinct name");
        assert_eq!(map["reserved_bytes.large_pool.peak"], st.reserved_bytes.large_pool.peak);
        assert_eq!(MemoryStats::from_pytorch_map(&map), st);
        let mut odd = map.clone();
        odd.insert("not_a_statistic".into(), 7);
        odd.remove("num_ooms");
        let back = MemoryStats::from_pytorch_map(&odd);
        assert_eq!(back.num_ooms, 0);
        assert_eq!(back.to_pytorch_map().get("not_a_statistic"), None);
        let mut sum = st.clone();
        sum.add(&st);
        assert_eq!(sum.allocation.all.current, 2 * st.allocation.all.current);
        sum.max_split_size = u64::MAX;
        sum.add(&st);
        assert_eq!(sum.max_split_size, u64::MAX);
    }

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut st = Stats::default();
        let s = &mut st.allocated_bytes;
        s.inc(Pool::Small, 10);
        s.inc(Pool::Large, 5);
        s.dec(Pool::Small, 10);
        assert_eq!((s.current(), s.peak()), (5, 15));
        let typed = st.public().allocated_bytes;
        assert_eq!(typed.small_pool, Counter { current: 0, peak: 10, allocated: 10, freed: 10 });
        assert_eq!(typed.large_pool, Counter { current: 5, peak: 5, allocated: 5, freed: 0 });
        assert_eq!(typed.all, Counter { current: 5, peak: 15, allocated: 15, freed: 10 });
        let m = st.public().to_pytorch_map();
        assert_eq!(m["allocated_bytes.small_pool.freed"], 10);
        assert_eq!(m["allocated_bytes.large_pool.current"], 5);
        assert_eq!(m["allocated_bytes.all.allocated"], 15);
        st.reset_peaks();
        assert_eq!(st.allocated_bytes.peak(), 5);
        st.reset_accumulated();
        assert_eq!(st.public().allocated_bytes.all, Counter { current: 5, peak: 5, allocated: 0, freed: 0 });
    }

    /// The map has PyTorch's keys (those `torch.cuda.memory_stats()` returns) and vramscope's,
    /// each once: 9 pooled statistics x 3 pools x 4 figures, 2 unpooled x 4, 12 counts.
    #[test]
    fn the_map_has_pytorchs_key_names() {
        let m = Stats::default().public().to_pytorch_map();
        assert_eq!(m.len(), 9 * 3 * 4 + 2 * 4 + 12);
        for key in [
            "allocated_bytes.all.current",
            "reserved_bytes.large_pool.peak",
            "inactive_split_bytes.small_pool.freed",
            "requested_bytes.all.allocated",
            "oversize_segments.current",
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "max_split_size",
        ] {
            assert!(m.contains_key(key), "{key}");
        }
    }

    #[test]
    fn sizes_and_counts_format_like_pytorch() {
        assert_eq!(format_size(512, 512), "   512 B  ");
        // PyTorch moves up a unit only while the reference figure is at least 768 units.
        assert_eq!(format_size(3 << 20, 3 << 20), "  3072 KiB");
        assert_eq!(format_size(1 << 20, 3 << 30), "     1 MiB");
        assert_eq!(format_size(1 << 30, 1 << 30), "  1024 MiB");
        assert_eq!(format_count(12, 12), "     12   ");
        assert_eq!(format_count(2_000_000, 2_000_000), "   2000 K ");
    }

    #[test]
    fn table_rows_are_75_wide() {
        let t = summary_table(&Stats::default().public(), "sim", 0, false);
        for line in t.lines() {
            assert_eq!(line.chars().count(), 77, "{line:?}");
        }
        assert!(t.contains("GPU reserved memory"));
    }
}
