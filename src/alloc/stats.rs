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

/// Which pool a block belongs to: requests of at most 1 MiB go to the small pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Pool {
    Small = 0,
    Large = 1,
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

    fn reset_accumulated(&mut self) {
        self.all.reset_totals();
        for p in &mut self.pools {
            p.reset_totals();
        }
    }

    fn export(&self, name: &str, out: &mut BTreeMap<String, u64>) {
        for (pool, s) in [("all", &self.all), ("small_pool", &self.pools[0]), ("large_pool", &self.pools[1])] {
            out.insert(format!("{name}.{pool}.current"), s.current);
            out.insert(format!("{name}.{pool}.peak"), s.peak);
            out.insert(format!("{name}.{pool}.allocated"), s.allocated);
            out.insert(format!("{name}.{pool}.freed"), s.freed());
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

    /// The flat map of PyTorch's `torch.cuda.memory_stats()`, with the same key names.
    pub(crate) fn to_map(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (name, s) in [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ] {
            s.export(name, &mut m);
        }
        for (name, s) in
            [("oversize_allocations", &self.oversize_allocations), ("oversize_segments", &self.oversize_segments)]
        {
            m.insert(format!("{name}.current"), s.current);
            m.insert(format!("{name}.peak"), s.peak);
            m.insert(format!("{name}.allocated"), s.allocated);
            m.insert(format!("{name}.freed"), s.freed());
        }
        for (k, v) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_device_map", self.num_device_map),
            ("num_device_unmap", self.num_device_unmap),
            ("num_segment_adoptions", self.num_segment_adoptions),
            ("num_backend_errors", self.num_backend_errors),
            ("num_limit_raises", self.num_limit_raises),
            ("max_split_size", self.max_split_size),
        ] {
            m.insert(k.to_string(), v);
        }
        m
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
pub(crate) fn summary_table(stats: &BTreeMap<String, u64>, backend: &str, device: usize) -> String {
    let get = |k: &str| stats.get(k).copied().unwrap_or(0);
    let rule = |c: char| c.to_string().repeat(75);
    let mut lines = vec![
        rule('='),
        format!("{:^75}", format!("vramscope memory summary, device ID {device} ({backend})")),
        rule('-'),
        format!(
            "{:^37}|{:^37}",
            format!("OOMs: {}", get("num_ooms")),
            format!("alloc retries: {}", get("num_alloc_retries"))
        ),
        rule('='),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    type Fmt = fn(u64, u64) -> String;
    let metrics: [(&str, &str, Fmt); 9] = [
        ("allocated_bytes", "Allocated memory", format_size),
        ("active_bytes", "Active memory", format_size),
        ("requested_bytes", "Requested memory", format_size),
        ("reserved_bytes", "GPU reserved memory", format_size),
        ("inactive_split_bytes", "Non-releasable memory", format_size),
        ("allocation", "Allocations", format_count),
        ("active", "Active allocs", format_count),
        ("segment", "GPU reserved segments", format_count),
        ("inactive_split", "Non-releasable allocs", format_count),
    ];
    let cols = ["current", "peak", "allocated", "freed"];
    for (key, name, f) in metrics {
        lines.push(rule('-'));
        let pref: Vec<u64> = cols.iter().map(|c| get(&format!("{key}.all.{c}"))).collect();
        for (pool, label) in
            [("all", name), ("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        {
            let cells: Vec<String> =
                cols.iter().zip(&pref).map(|(c, &p)| f(get(&format!("{key}.{pool}.{c}")), p)).collect();
            lines.push(format!(" {label:<21} | {} | {} | {} | {} ", cells[0], cells[1], cells[2], cells[3]));
        }
    }
    for (key, name) in
        [("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize GPU segments")]
    {
        lines.push(rule('-'));
        let cells: Vec<String> = cols
            .iter()
            .map(|c| {
                let v = get(&format!("{key}.{c}"));
                format_count(v, v)
            })
            .collect();
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

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = PoolStat::default();
        s.inc(Pool::Small, 10);
        s.inc(Pool::Large, 5);
        s.dec(Pool::Small, 10);
        assert_eq!((s.current(), s.peak()), (5, 15));
        let mut m = BTreeMap::new();
        s.export("x", &mut m);
        assert_eq!(m["x.small_pool.freed"], 10);
        assert_eq!(m["x.large_pool.current"], 5);
        assert_eq!(m["x.all.allocated"], 15);
        s.reset_peak();
        assert_eq!(s.peak(), 5);
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
        let t = summary_table(&Stats::default().to_map(), "sim", 0);
        for line in t.lines() {
            assert_eq!(line.chars().count(), 77, "{line:?}");
        }
        assert!(t.contains("GPU reserved memory"));
    }
}
