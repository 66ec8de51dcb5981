//! The ledger as plain data: what a process holds on one device as the driver counts it, split
//! into the parts that hold it, each measured by a counter of its own; only "not explained" is
//! a difference. [`vramscope::ledger::take`](crate::ledger::take) fills one in; snapshots carry
//! it ([`Snapshot::ledger`](crate::Snapshot::ledger)) and `vramscope summary` prints it.

use crate::error::{fmt_bytes, fmt_bytes_exact};
use serde::{Deserialize, Serialize};

/// What the driver says about device memory at one moment: NVML's answers, or the same
/// figures recorded (tests replay recorded answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DriverReading {
    /// The process the reading is for (`std::process::id()` when taken live).
    pub pid: u32,
    /// Bytes of the device in use, by every process and the driver itself
    /// (`nvmlDeviceGetMemoryInfo`'s `used`).
    pub device_used: u64,
    /// The device's memory (`nvmlDeviceGetMemoryInfo`'s `total`).
    pub device_total: u64,
    /// The compute processes NVML lists on the device with the bytes each holds
    /// (`nvmlDeviceGetComputeRunningProcesses`): `None` where NVML could not list them, a
    /// process's bytes `None` where NVML does not know them. Inside a container the list may
    /// be empty or carry the host's process ids.
    pub processes: Option<Vec<(u32, Option<u64>)>>,
}

impl DriverReading {
    /// A reading of `device_used` bytes in use on a device of `device_total`, for process
    /// `pid`, with the processes NVML lists.
    pub fn new(pid: u32, device_used: u64, device_total: u64, processes: Option<Vec<(u32, Option<u64>)>>) -> Self {
        DriverReading { pid, device_used, device_total, processes }
    }

    /// This process's bytes as NVML lists them, if it lists them.
    pub fn own_bytes(&self) -> Option<u64> {
        self.processes.as_ref()?.iter().find(|(p, _)| *p == self.pid).and_then(|(_, b)| *b)
    }

    /// How many other processes NVML lists on the device, if it lists any.
    pub fn others(&self) -> Option<usize> {
        Some(self.processes.as_ref()?.iter().filter(|(p, _)| *p != self.pid).count())
    }
}

/// How the ledger's total was counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TotalSource {
    /// NVML's figure for this process (the one `nvidia-smi` prints under "Processes").
    NvmlProcess {
        /// The process id NVML listed.
        pid: u32,
    },
    /// The device's used memory less what was used before this process made its context:
    /// NVML could not name this process (a container with its own process ids). Valid only
    /// while the process is alone on the device.
    DeviceUsedLessBaseline {
        /// The device's used bytes before this process's context.
        baseline: u64,
        /// Other processes NVML listed on the device, where it listed any: any at all makes
        /// the figure someone else's too.
        others: Option<usize>,
    },
}

/// One allocator of vramscope's on the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AllocatorPart {
    /// The allocator's backend (`cuda`, `host`, ...) and its id, as reports name it.
    pub name: String,
    /// Bytes of blocks allocated (rounded sizes).
    pub allocated: u64,
    /// Bytes reserved from the device but not allocated: cached free blocks and rounding.
    pub cached: u64,
}

/// Observed allocations of one owner: the program's own lines, or one library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OwnerPart {
    /// `the program`, or the library by its frames (`cuBLAS`, `cuDNN`, `NCCL`, a crate's name).
    pub owner: String,
    /// Bytes live (as allocated: the driver rounds each to 512 B at least).
    pub bytes: u64,
    /// Allocations live.
    pub allocations: u64,
    /// The top sites with their bytes and allocations, largest first.
    pub sites: Vec<SitePart>,
}

/// One allocation site of an owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SitePart {
    /// `file:line (function)`, or `<no stack>`.
    pub site: String,
    /// Bytes live.
    pub bytes: u64,
    /// Allocations live.
    pub allocations: u64,
}

/// The device's stream-ordered pool as the driver counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolPart {
    /// Bytes in use by allocations (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub in_use: u64,
    /// Bytes the pool holds beyond those in use: freed allocations kept for reuse.
    pub held: u64,
}

/// The CUDA context as measured when it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ContextPart {
    /// The process's bytes right after the context was made, before anything allocated:
    /// the context, its default limits and the modules loaded with it.
    pub bytes: u64,
    /// How it was measured.
    pub how: String,
    /// The context's limits when measured: per-thread stack, `printf` FIFO and device
    /// `malloc` heap bytes (`cuCtxGetLimit`). They sit inside `bytes`; raising them later
    /// adds memory the ledger shows as not explained.
    pub limits: Option<[u64; 3]>,
}

/// Every byte a process holds on one device, as the driver counts it, and what holds it.
///
/// Each part is read from a counter of its own, never worked out from the total; only
/// [`not_explained`](Ledger::not_explained) is a difference. A part that cannot be seen (no
/// GPU, no NVML, no observer) is `None` and named in [`unseen`](Ledger::unseen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Ledger {
    /// The device.
    pub device: usize,
    /// The process's bytes on the device as the driver counts them.
    pub total: Option<u64>,
    /// How [`total`](Ledger::total) was counted.
    pub total_source: Option<TotalSource>,
    /// The device's memory.
    pub device_total: Option<u64>,
    /// The CUDA context, its limits and the modules loaded with it.
    pub context: Option<ContextPart>,
    /// Modules loaded since the context was measured (CUPTI's module-load callbacks): the
    /// bytes of their cubins, less those unloaded. A module's device memory is its code,
    /// constants and globals, close to but not exactly its cubin's size.
    pub modules: Option<u64>,
    /// vramscope's allocators on the device.
    pub allocators: Vec<AllocatorPart>,
    /// Allocations the observer of CUDA allocations saw made outside vramscope's allocators
    /// and outside the stream-ordered pool, by owner, largest first; `None` where nothing
    /// observes.
    pub observed: Option<Vec<OwnerPart>>,
    /// The device's stream-ordered pool.
    pub pool: Option<PoolPart>,
    /// Virtual-memory mappings observed (`cuMemMap`), outside vramscope's allocators.
    pub mapped: Option<u64>,
    /// What the ledger cannot see, one line each.
    pub unseen: Vec<String>,
}

/// A hint of what commonly sits in memory nobody counted, for the line "not explained".
pub const NOT_EXPLAINED_HINT: &str = "modules loaded lazily, library workspaces, NCCL buffers, driver granularity";

impl Ledger {
    /// Bytes every part counts, added up.
    pub fn explained(&self) -> u64 {
        let observed: u64 = self.observed.iter().flatten().map(|o| o.bytes).sum();
        let allocators: u64 = self.allocators.iter().map(|a| a.allocated.saturating_add(a.cached)).sum();
        [
            self.context.as_ref().map_or(0, |c| c.bytes),
            self.modules.unwrap_or(0),
            allocators,
            observed,
            self.pool.map_or(0, |p| p.in_use.saturating_add(p.held)),
            self.mapped.unwrap_or(0),
        ]
        .into_iter()
        .fold(0u64, u64::saturating_add)
    }

    /// The total less every part: memory nobody counted (negative where the parts count more
    /// than the driver: memory counted twice, or freed between two readings). `None` without
    /// a total.
    pub fn not_explained(&self) -> Option<i64> {
        let total = i128::from(self.total?);
        let d = total - i128::from(self.explained());
        Some(d.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
    }

    /// The device's bytes as a memory test counts them: the total where the driver gave one,
    /// else what the parts count.
    pub fn bytes(&self) -> u64 {
        self.total.unwrap_or_else(|| self.explained())
    }

    /// The figures by part name, for comparing two ledgers: every part (each allocator,
    /// each observed owner) with its bytes, and `not explained`.
    pub fn parts(&self) -> Vec<(String, i128)> {
        let mut out = Vec::new();
        if let Some(c) = &self.context {
            out.push(("the CUDA context".to_string(), i128::from(c.bytes)));
        }
        if let Some(m) = self.modules {
            out.push(("modules loaded since".to_string(), i128::from(m)));
        }
        for a in &self.allocators {
            out.push((format!("allocator {}", a.name), i128::from(a.allocated) + i128::from(a.cached)));
        }
        for o in self.observed.iter().flatten() {
            let name = if o.owner == PROGRAM { "observed: the program's lines".to_string() } else { o.owner.clone() };
            out.push((name, i128::from(o.bytes)));
        }
        if let Some(p) = self.pool {
            out.push(("the driver's pool".to_string(), i128::from(p.in_use) + i128::from(p.held)));
        }
        if let Some(m) = self.mapped {
            out.push(("mappings observed".to_string(), i128::from(m)));
        }
        if let Some(n) = self.not_explained() {
            out.push(("not explained".to_string(), i128::from(n)));
        }
        out
    }

    /// The ledger as text within 100 columns: the total and where it comes from, one line
    /// per part with where its figure comes from, the top sites of each observed owner, what
    /// is not explained, and what the ledger cannot see.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let head = match (self.total, &self.total_source) {
            (Some(t), Some(TotalSource::NvmlProcess { pid })) => {
                format!("{} held by this process (NVML's figure for pid {pid})", fmt_bytes(t))
            }
            (Some(t), Some(TotalSource::DeviceUsedLessBaseline { baseline, others })) => format!(
                "{} held by this process (device used less {} before its context; valid only{})",
                fmt_bytes(t),
                fmt_bytes(*baseline),
                match others {
                    Some(n) if *n > 0 => format!(" alone: {n} other process(es) listed"),
                    _ => " while alone on the device".to_string(),
                }
            ),
            _ => "the process's total is not seen".to_string(),
        };
        out.push_str(&format!("Device {} ledger: {head}\n", self.device));
        fn row(out: &mut String, name: &str, bytes: u64, from: &str) {
            out.push_str(&format!("  {:<34} {:>11}  {}\n", clip(name, 34), fmt_bytes(bytes), clip(from, 49)));
        }
        if let Some(c) = &self.context {
            row(&mut out, "CUDA context, limits, modules", c.bytes, &c.how);
            if let Some([stack, fifo, heap]) = c.limits {
                out.push_str(&format!(
                    "    limits then: stack {} per thread, printf FIFO {}, malloc heap {}\n",
                    fmt_bytes(stack),
                    fmt_bytes(fifo),
                    fmt_bytes(heap)
                ));
            }
        }
        if let Some(m) = self.modules {
            row(&mut out, "modules loaded since", m, "CUPTI module loads (cubin bytes)");
        }
        for a in &self.allocators {
            row(
                &mut out,
                &format!("allocator {}", a.name),
                a.allocated.saturating_add(a.cached),
                &format!("{} allocated, {} cached", fmt_bytes(a.allocated), fmt_bytes(a.cached)),
            );
        }
        for o in self.observed.iter().flatten() {
            let name = if o.owner == PROGRAM {
                "observed: the program's lines".to_string()
            } else {
                format!("observed: {}", o.owner)
            };
            row(&mut out, &name, o.bytes, &format!("{} allocation(s) seen by CUPTI", o.allocations));
            for s in &o.sites {
                out.push_str(&format!("    {:<72} {:>11}\n", clip(&plain(&s.site), 72), fmt_bytes(s.bytes)));
            }
        }
        if let Some(p) = self.pool {
            row(
                &mut out,
                "the driver's stream-ordered pool",
                p.in_use.saturating_add(p.held),
                &format!("{} in use, {} held unused", fmt_bytes(p.in_use), fmt_bytes(p.held)),
            );
        }
        if let Some(m) = self.mapped {
            row(&mut out, "virtual-memory mappings observed", m, "cuMemMap calls seen by CUPTI");
        }
        match self.not_explained() {
            Some(n) if n >= 0 => out.push_str(&format!(
                "  {:<34} {:>11}  {}\n",
                "not explained",
                fmt_bytes(n as u64),
                clip(NOT_EXPLAINED_HINT, 49)
            )),
            Some(n) => out.push_str(&format!(
                "  {:<34} {:>11}  parts count more than the driver\n",
                "not explained",
                format!("-{}", fmt_bytes(n.unsigned_abs()))
            )),
            None => {}
        }
        for u in &self.unseen {
            push_unseen(&mut out, u);
        }
        out
    }

    /// One line: the total, and the not-explained bytes exactly.
    pub fn headline(&self) -> String {
        match (self.total, self.not_explained()) {
            (Some(t), Some(n)) => format!("{} held, {} not explained", fmt_bytes_exact(t), signed_exact(n)),
            _ => format!("{} counted by its parts (the driver's total is not seen)", fmt_bytes_exact(self.explained())),
        }
    }
}

/// Appends `  not seen: {what}`, wrapped within 100 columns.
pub(crate) fn push_unseen(out: &mut String, what: &str) {
    let mut line = String::from("  not seen:");
    for word in plain(what).split(' ') {
        if line.chars().count() + 1 + word.chars().count() > 100 && line.len() > 12 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("           ");
        }
        line.push(' ');
        line.push_str(&clip(word, 86));
    }
    out.push_str(&line);
    out.push('\n');
}

/// The owner name of the program's own lines.
pub const PROGRAM: &str = "the program";

fn signed_exact(n: i64) -> String {
    if n < 0 {
        format!("-{}", fmt_bytes_exact(n.unsigned_abs()))
    } else {
        fmt_bytes_exact(n as u64)
    }
}

/// `s` with control characters (a frame name could carry a terminal's escape sequence) shown
/// as `?`.
fn plain(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// `s` cut to `width` characters, with `…` where cut, control characters shown as `?`.
pub(crate) fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return plain(s);
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    plain(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        Ledger {
            device: 0,
            total: Some(1_855_979_520),
            total_source: Some(TotalSource::NvmlProcess { pid: 619 }),
            device_total: Some(150_754_820_096),
            context: Some(ContextPart {
                bytes: 543_162_368,
                how: "NVML when the context was made".into(),
                limits: None,
            }),
            modules: None,
            allocators: vec![AllocatorPart { name: "cuda 0".into(), allocated: 1_241_513_984, cached: 0 }],
            observed: Some(vec![OwnerPart {
                owner: PROGRAM.into(),
                bytes: 2 << 20,
                allocations: 1,
                sites: vec![SitePart { site: "src/main.rs:3 (main)".into(), bytes: 2 << 20, allocations: 1 }],
            }]),
            pool: Some(PoolPart { in_use: 0, held: 2 << 20 }),
            mapped: Some(0),
            unseen: vec![],
        }
    }

    #[test]
    fn not_explained_is_the_total_less_every_part() {
        let l = ledger();
        assert_eq!(l.explained(), 543_162_368 + 1_241_513_984 + (2 << 20) + (2 << 20));
        assert_eq!(l.not_explained(), Some(1_855_979_520 - 543_162_368 - 1_241_513_984 - (4 << 20)));
        let mut over = l.clone();
        over.total = Some(1);
        assert!(over.not_explained().unwrap() < 0);
        assert!(over.to_text().contains("parts count more than the driver"));
        let mut none = l;
        none.total = None;
        assert_eq!(none.not_explained(), None);
        assert_eq!(none.bytes(), none.explained());
    }

    #[test]
    fn every_line_fits_100_columns() {
        let mut l = ledger();
        l.observed.as_mut().unwrap()[0].sites[0].site = "x".repeat(300);
        l.unseen.push("y".repeat(300));
        l.allocators[0].name = "z".repeat(300);
        for line in l.to_text().lines() {
            assert!(line.chars().count() <= 100, "{} columns: {line}", line.chars().count());
        }
    }

    #[test]
    fn the_process_figure_is_nvml_own_pid() {
        let r = DriverReading::new(7, 10, 100, Some(vec![(3, Some(5)), (7, Some(4)), (9, None)]));
        assert_eq!((r.own_bytes(), r.others()), (Some(4), Some(2)));
        let r = DriverReading::new(7, 10, 100, Some(vec![(3, Some(5))]));
        assert_eq!(r.own_bytes(), None);
        let r = DriverReading::new(7, 10, 100, None);
        assert_eq!((r.own_bytes(), r.others()), (None, None));
    }
}
