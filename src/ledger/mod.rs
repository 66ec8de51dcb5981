//! Every byte this process holds on a device, as the driver counts it, split into what holds
//! it: the answer to "why does `nvidia-smi` show more than my framework allocated?".
//!
//! ```
//! let alloc = vramscope::device(0);
//! let x = alloc.alloc::<u8>(&alloc.default_stream(), 256 << 20)?;
//! let ledger = vramscope::ledger::take(0);
//! print!("{}", ledger.to_text());
//! # drop(x);
//! # Ok::<(), vramscope::Error>(())
//! ```
//!
//! prints, on an H200 with the observer started first (`vramscope::observe::start()`; the
//! whole run, step by step, is `examples/ledger.rs`):
//!
//! ```text
//! Device 0 ledger: 786.00 MiB held by this process (NVML's figure for pid 616)
//!   CUDA context, limits, modules       530.00 MiB  NVML, this process, when CUPTI saw it made
//!   modules loaded since                       0 B  CUPTI module loads (cubin bytes)
//!   allocator cuda #1                   256.00 MiB  256.00 MiB allocated, 0 B cached
//!   the driver's stream-ordered pool           0 B  0 B in use, 0 B held unused
//!   virtual-memory mappings observed           0 B  cuMemMap calls seen by CUPTI
//!   not explained                              0 B  modules loaded lazily, library workspaces, NCCL …
//! ```
//!
//! Each part is read from a counter of its own; none is worked out from the total, and only
//! "not explained" is the difference:
//!
//! - **The total**: NVML's figure for this process, the one `nvidia-smi` prints under
//!   "Processes" (through `nvml-wrapper`, loaded at run time). Where NVML does not list this
//!   process (a container with its own process ids), the device's used memory less a baseline
//!   read before this process made its context, valid only while the process is alone on the
//!   device; the ledger says which it used.
//! - **The CUDA context**, its default limits and the modules loaded with it: the process's
//!   figure read right after the context was made, before anything allocated. vramscope sees
//!   that moment when its CUDA backend makes the context ([`crate::device`]), or when the
//!   observer ([`crate::observe::start`], feature `cupti`) was started before anything else
//!   used CUDA and CUPTI reports the context made. A context made earlier is not measured;
//!   its bytes then show as not explained, and the ledger says so.
//! - **Modules loaded since** (CUDA loads kernels lazily, on first launch: cuBLAS's come with
//!   its first call): the bytes of their cubins, from CUPTI's module-load callbacks.
//! - **vramscope's allocators**: allocated, and cached (reserved but not allocated).
//! - **Observed allocations**, by who made them: each library by the object file that called
//!   the driver (cuBLAS, cuDNN, NCCL, any shared library), and the program's own lines (its
//!   code, cudarc, candle), with the top sites of each.
//! - **The driver's stream-ordered pool**: in use, and held unused (pool attributes); the
//!   observed allocations that came from it are counted there, not twice.
//! - **Virtual-memory mappings observed** (`cuMemMap`).
//! - **Not explained**: the rest, never hidden.
//!
//! Without a GPU, NVML or the observer, the ledger names in one line each what it cannot
//! see, and counts what it can (the host backend's allocators). Snapshots carry it
//! ([`Snapshot::ledger`](crate::Snapshot::ledger), from [`snapshot_with_ledger`]),
//! `vramscope summary` prints it, and a memory test can count the device's bytes
//! ([`Metric::DeviceBytes`](crate::testing::Metric::DeviceBytes)).

mod owners;

use crate::alloc::heap::Made;
use crate::alloc::CachingAllocator;
pub use crate::snapshot::{
    AllocatorPart, ContextPart, DriverReading, Ledger, OwnerPart, PoolPart, SitePart, TotalSource, NOT_EXPLAINED_HINT,
    PROGRAM,
};
use crate::Snapshot;
use std::collections::HashMap;

/// Sites listed per observed owner.
pub const TOP_SITES: usize = 5;

/// The ledger of device `device` now (see the module's documentation).
pub fn take(device: usize) -> Ledger {
    let allocator = seen::allocator(device);
    let observed = match (&allocator, seen::running()) {
        (Some(a), true) => Observed::By(a),
        // Observing, with nothing seen on this device yet: an empty part, not an unseen one.
        (None, true) => Observed::Nothing,
        (_, false) => Observed::Not,
    };
    assemble(device, driver_reading(device), observed)
}

/// The ledger of device `device` from a driver reading given (NVML's answers, or answers
/// recorded on a GPU: how the ledger is tested and benchmarked on machines without one) and
/// the allocator of observed allocations (`vramscope::observe::allocator(device)`, or one
/// made by [`CachingAllocator::external`] with the same kind of records). The rest is read
/// as [`take`] reads it.
pub fn take_from(device: usize, driver: Result<DriverReading, String>, observed: Option<&CachingAllocator>) -> Ledger {
    assemble(device, driver, observed.map_or(Observed::Not, Observed::By))
}

/// What observes the device's allocations outside vramscope's allocators.
enum Observed<'a> {
    /// Nothing: the observer is not running.
    Not,
    /// The observer, which has seen nothing on the device yet.
    Nothing,
    /// The allocator holding what was observed.
    By(&'a CachingAllocator),
}

fn assemble(device: usize, driver: Result<DriverReading, String>, observed: Observed<'_>) -> Ledger {
    let mut unseen = Vec::new();
    let driver = driver.map_err(|why| unseen.push(why)).ok();
    let gpu = driver.is_some();
    let (total, total_source) = match &driver {
        Some(r) => match total_of(r, baseline(device)) {
            Ok((t, s)) => (Some(t), Some(s)),
            Err(why) => {
                unseen.push(why);
                (None, None)
            }
        },
        None => (None, None),
    };
    let context = context(device);
    if gpu && context.is_none() {
        unseen.push(
            "the CUDA context: made before vramscope looked (start vramscope::observe, or open \
             vramscope's device, before any other CUDA call to measure it)"
                .into(),
        );
    }
    let observing = !matches!(observed, Observed::Not);
    let mut allocators = Vec::new();
    for a in CachingAllocator::all() {
        let name = a.backend().name();
        // The observer's allocator is counted by owner below; another allocator that records
        // what passes elsewhere would count the observer's bytes twice.
        let external = a.backend().is_external();
        if a.device() != device || (external && (observing || name == crate::backend::OBSERVED_BACKEND)) {
            continue;
        }
        // On a GPU, only memory of the device counts (the host backend's is the host's).
        if gpu && !name.starts_with("cuda") {
            continue;
        }
        let (allocated, reserved) = (a.memory_allocated(), a.memory_reserved());
        allocators.push(AllocatorPart {
            name: format!("{name} #{}", allocators.len() + 1),
            allocated,
            cached: reserved.saturating_sub(allocated),
        });
    }
    let (observed, mapped) = match observed {
        Observed::By(a) => {
            let (owners, mapped) = observed_by_owner(a);
            (Some(owners), Some(mapped))
        }
        Observed::Nothing => (Some(Vec::new()), Some(0)),
        Observed::Not => {
            unseen.push(
                "allocations outside vramscope's allocators (cudarc, candle, cuBLAS): start \
                 vramscope::observe (feature cupti)"
                    .into(),
            );
            (None, None)
        }
    };
    let pool = if gpu { pool(device) } else { None };
    Ledger {
        device,
        total,
        total_source,
        device_total: driver.as_ref().map(|r| r.device_total),
        context,
        modules: seen::modules(device),
        allocators,
        observed,
        pool,
        mapped,
        unseen,
    }
}

/// A snapshot of `alloc` that carries the ledger of its device.
pub fn snapshot_with_ledger(alloc: &CachingAllocator) -> Snapshot {
    let mut s = alloc.snapshot();
    s.ledger = Some(take(alloc.device()));
    s
}

/// The process's total from a driver reading: NVML's figure for this process where it lists
/// it, else the device's used memory less `baseline` (read before this process made its
/// context). An error says why neither can be had.
pub fn total_of(reading: &DriverReading, baseline: Option<u64>) -> Result<(u64, TotalSource), String> {
    if let Some(b) = reading.own_bytes() {
        return Ok((b, TotalSource::NvmlProcess { pid: reading.pid }));
    }
    match baseline {
        Some(base) => Ok((
            reading.device_used.saturating_sub(base),
            TotalSource::DeviceUsedLessBaseline { baseline: base, others: reading.others() },
        )),
        None => Err(format!(
            "the process's total: NVML does not list pid {} (a container with its own process ids?) \
             and no baseline was read before the context was made",
            reading.pid
        )),
    }
}

/// The observed allocator's live allocations by owner and site, and the bytes of mappings;
/// allocations from the stream-ordered pool are left to the pool's counters.
fn observed_by_owner(alloc: &CachingAllocator) -> (Vec<OwnerPart>, u64) {
    let live = alloc.live_raw();
    let mut mapped = 0u64;
    let mut by_stack: HashMap<Option<u32>, (u64, u64)> = HashMap::new();
    for &(_, size, stack, made) in &live.blocks {
        match made {
            Made::Pooled => {}
            Made::Mapped => mapped = mapped.saturating_add(size),
            Made::Allocated => {
                let e = by_stack.entry(stack).or_default();
                *e = (e.0.saturating_add(size), e.1 + 1);
            }
        }
    }
    // owner -> site -> (bytes, allocations)
    let mut owners: HashMap<String, HashMap<String, (u64, u64)>> = HashMap::new();
    for (stack, (bytes, count)) in by_stack {
        let ips = stack.and_then(|s| live.stacks.get(&s)).map(|b| &b[..]).unwrap_or(&[]);
        let (owner, site) = name_stack(alloc, ips);
        let e = owners.entry(owner).or_default().entry(site).or_default();
        *e = (e.0.saturating_add(bytes), e.1 + count);
    }
    let mut out: Vec<OwnerPart> = owners
        .into_iter()
        .map(|(owner, sites)| {
            let mut sites: Vec<SitePart> =
                sites.into_iter().map(|(site, (bytes, allocations))| SitePart { site, bytes, allocations }).collect();
            sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
            let bytes = sites.iter().map(|s| s.bytes).fold(0u64, u64::saturating_add);
            let allocations = sites.iter().map(|s| s.allocations).sum();
            sites.truncate(TOP_SITES);
            OwnerPart { owner, bytes, allocations, sites }
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.owner.cmp(&b.owner)));
    (out, mapped)
}

/// The owner of a stack and its site: the program's line that allocated or called the
/// library, as every report names it.
fn name_stack(alloc: &CachingAllocator, ips: &[usize]) -> (String, String) {
    let objects: Vec<Option<std::sync::Arc<str>>> = ips.iter().map(|&ip| owners::object_of(ip)).collect();
    let names: Vec<Option<&str>> = objects.iter().map(|o| o.as_deref()).collect();
    let owner = match owners::owner_of(&names) {
        owners::Owner::Library(name) => name,
        owners::Owner::Program => PROGRAM.to_string(),
    };
    if ips.is_empty() {
        return (owner, "<no stack>".into());
    }
    let frames = alloc.frames_of(ips);
    let site = crate::frames::program_frames(frames.iter())
        .next()
        .map_or_else(|| "<no frame of the program's own>".to_string(), |f| f.to_string());
    (owner, site)
}

/// What the observer of CUDA allocations saw, where the build has it (feature `cupti`).
#[cfg(feature = "cupti")]
mod seen {
    pub(super) fn running() -> bool {
        crate::observe::is_running()
    }
    pub(super) fn allocator(device: usize) -> Option<crate::CachingAllocator> {
        crate::observe::allocator(device)
    }
    pub(super) fn modules(device: usize) -> Option<u64> {
        crate::observe::module_bytes(device)
    }
}

/// A build without the observer sees none of it.
#[cfg(not(feature = "cupti"))]
mod seen {
    pub(super) fn running() -> bool {
        false
    }
    pub(super) fn allocator(_device: usize) -> Option<crate::CachingAllocator> {
        None
    }
    pub(super) fn modules(_device: usize) -> Option<u64> {
        None
    }
}

#[cfg(feature = "cuda-backend")]
fn driver_reading(device: usize) -> Result<DriverReading, String> {
    if !crate::backend::cuda::driver_library_present() {
        return Err("the driver's figures: no GPU (no CUDA driver); the parts below are vramscope's own".into());
    }
    // Said as what is missing, then why: the line reads "not seen: the driver's figures: ...".
    let a = crate::backend::cuda::moments::nvml_answer(device).map_err(|why| format!("the driver's figures: {why}"))?;
    Ok(DriverReading::new(a.pid, a.used, a.total, a.processes))
}

#[cfg(not(feature = "cuda-backend"))]
fn driver_reading(_device: usize) -> Result<DriverReading, String> {
    Err("the driver's figures: a build without the CUDA backend (feature cuda)".into())
}

#[cfg(feature = "cuda-backend")]
fn baseline(device: usize) -> Option<u64> {
    crate::backend::cuda::moments::baseline(device)
}

#[cfg(not(feature = "cuda-backend"))]
fn baseline(_device: usize) -> Option<u64> {
    None
}

#[cfg(feature = "cuda-backend")]
fn context(device: usize) -> Option<ContextPart> {
    crate::backend::cuda::moments::context(device).map(|m| ContextPart { bytes: m.bytes, how: m.how, limits: m.limits })
}

#[cfg(not(feature = "cuda-backend"))]
fn context(_device: usize) -> Option<ContextPart> {
    None
}

#[cfg(feature = "cuda-backend")]
fn pool(device: usize) -> Option<PoolPart> {
    if !crate::backend::cuda::moments::has_context(device) {
        return None;
    }
    let mut dev = 0;
    // SAFETY: a valid out pointer; the driver was initialized by `has_context`.
    if unsafe { cudarc::driver::sys::cuDeviceGet(&mut dev, device as i32) }
        != cudarc::driver::sys::CUresult::CUDA_SUCCESS
    {
        return None;
    }
    crate::backend::cuda::default_pool(dev)
        .map(|p| PoolPart { in_use: p.used, held: p.reserved.saturating_sub(p.used) })
}

#[cfg(not(feature = "cuda-backend"))]
fn pool(_device: usize) -> Option<PoolPart> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVML's answers recorded on an H200 (`tools/nvml_probe.py`): before any context, after a
    /// bare primary context, and after each of PyTorch's steps, with PyTorch's own counts.
    const H200: &str = include_str!("../../fixtures/nvml/h200_probe.json");

    struct Step {
        name: String,
        reading: DriverReading,
        reserved: Option<u64>,
        allocated: Option<u64>,
    }

    fn steps() -> Vec<Step> {
        let v: serde_json::Value = serde_json::from_str(H200).unwrap();
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let d = &s["devices"][0];
                let processes = d["processes"]
                    .as_array()
                    .map(|ps| ps.iter().map(|p| (p["pid"].as_u64().unwrap() as u32, p["used"].as_u64())).collect());
                Step {
                    name: s["step"].as_str().unwrap().to_string(),
                    reading: DriverReading::new(
                        s["pid"].as_u64().unwrap() as u32,
                        d["used"].as_u64().unwrap(),
                        d["total"].as_u64().unwrap(),
                        processes,
                    ),
                    reserved: s["reserved"].as_u64(),
                    allocated: s["allocated"].as_u64(),
                }
            })
            .collect()
    }

    /// A ledger of PyTorch's allocator and the context, as recorded.
    fn ledger_of(step: &Step, context: u64, baseline: Option<u64>) -> Ledger {
        let (total, source) = total_of(&step.reading, baseline).unwrap();
        let reserved = step.reserved.unwrap_or(0);
        Ledger {
            device: 0,
            total: Some(total),
            total_source: Some(source),
            device_total: Some(step.reading.device_total),
            context: Some(ContextPart { bytes: context, how: "recorded".into(), limits: None }),
            modules: None,
            allocators: vec![AllocatorPart {
                name: "PyTorch".into(),
                allocated: step.allocated.unwrap_or(0),
                cached: reserved - step.allocated.unwrap_or(0),
            }],
            observed: None,
            pool: None,
            mapped: None,
            unseen: vec![],
        }
    }

    #[test]
    fn recorded_nvml_answers_give_the_process_figure_and_what_nobody_counted() {
        let steps = steps();
        assert_eq!(steps[0].name, "no context");
        // Before any context NVML does not list the process: no total without a baseline.
        assert!(total_of(&steps[0].reading, None).is_err());
        assert_eq!(steps[0].reading.own_bytes(), None);
        let context = steps[1].reading.own_bytes().expect("listed once it has a context");
        let by_name = |n: &str| steps.iter().find(|s| s.name == n).unwrap();
        // PyTorch's 1 GiB is all the process gained: nothing unexplained.
        let l = ledger_of(by_name("torch 1 GiB"), context, None);
        assert_eq!(l.total_source, Some(TotalSource::NvmlProcess { pid: steps[0].reading.pid }));
        assert_eq!(l.not_explained(), Some(0));
        // cuBLAS's first matmul loads its kernels (not through any allocator): 68 MiB nobody
        // counted, and still there after PyTorch freed and emptied its cache.
        for step in ["cublas matmul", "freed", "empty_cache"] {
            assert_eq!(ledger_of(by_name(step), context, None).not_explained(), Some(68 << 20), "{step}");
        }
        // The fallback for a process NVML cannot name: the device's used memory less the
        // baseline, which also counts the driver's own bookkeeping for the process (8.8 MiB here).
        let mut hidden = by_name("torch 1 GiB").reading.clone();
        hidden.processes = Some(vec![]);
        let (total, source) = total_of(&hidden, Some(steps[0].reading.device_used)).unwrap();
        assert_eq!(total, hidden.device_used - steps[0].reading.device_used);
        assert_eq!(
            source,
            TotalSource::DeviceUsedLessBaseline { baseline: steps[0].reading.device_used, others: Some(0) }
        );
        assert_eq!(total - by_name("torch 1 GiB").reading.own_bytes().unwrap(), 9_240_576);
    }

    /// Observed memory from the driver's pool counts under the pool's own counters and a
    /// mapping under mappings: neither is counted again by owner.
    #[test]
    fn pooled_and_mapped_memory_is_not_counted_by_owner() {
        let seen = CachingAllocator::external(7_401, crate::backend::OBSERVED_BACKEND, 1 << 40);
        seen.record_made(0, 0x10_0000, 1 << 20, Made::Allocated).unwrap();
        seen.record_made(7, 0x20_0000, 2 << 20, Made::Pooled).unwrap();
        seen.record_made(0, 0x40_0000, 4 << 20, Made::Mapped).unwrap();
        let l = take_from(7_401, Err("no GPU".into()), Some(&seen));
        let owners = l.observed.as_ref().unwrap();
        assert_eq!(owners.iter().map(|o| o.bytes).sum::<u64>(), 1 << 20, "{owners:?}");
        assert_eq!(l.mapped, Some(4 << 20));
        // Unmapping forgets the mapping; freeing the pooled block changes no owner.
        assert_eq!(seen.forget_external_range(0x40_0000, 4 << 20), 1);
        assert!(seen.forget_external(0x20_0000));
        let l = take_from(7_401, Err("no GPU".into()), Some(&seen));
        assert_eq!((l.mapped, l.explained()), (Some(0), 1 << 20));
    }

    #[test]
    fn the_total_is_nvml_own_figure_else_used_less_baseline() {
        let listed = DriverReading::new(5, 3_000, 10_000, Some(vec![(5, Some(1_200)), (8, Some(900))]));
        assert_eq!(total_of(&listed, Some(100)).unwrap(), (1_200, TotalSource::NvmlProcess { pid: 5 }));
        let hidden = DriverReading::new(5, 3_000, 10_000, Some(vec![]));
        assert_eq!(
            total_of(&hidden, Some(1_000)).unwrap(),
            (2_000, TotalSource::DeviceUsedLessBaseline { baseline: 1_000, others: Some(0) })
        );
        let e = total_of(&hidden, None).unwrap_err();
        assert!(e.contains("pid 5") && e.contains("baseline"), "{e}");
    }

    #[test]
    fn without_a_gpu_the_ledger_says_what_it_cannot_see_and_counts_the_rest() {
        let alloc = CachingAllocator::for_device(
            crate::backend::HostBackend::new(64 << 20),
            7_001,
            crate::config::AllocatorConfig::default(),
        )
        .unwrap();
        let x = alloc.alloc::<u8>(&alloc.default_stream(), 3 << 20).unwrap();
        let l = take(7_001);
        assert_eq!(l.total, None);
        assert_eq!(l.allocators.len(), 1, "{:?}", l.allocators);
        assert_eq!(l.allocators[0].allocated, alloc.memory_allocated());
        assert_eq!(l.allocators[0].allocated + l.allocators[0].cached, alloc.memory_reserved());
        assert_eq!(l.bytes(), alloc.memory_reserved());
        assert!(!l.unseen.is_empty());
        let text = l.to_text();
        assert!(text.contains("not seen: the driver's figures"), "{text}");
        assert!(!text.contains("not explained"), "no total, nothing to subtract from: {text}");
        drop(x);
    }
}
