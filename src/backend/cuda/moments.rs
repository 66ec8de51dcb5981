//! What the driver counted at the moments the ledger needs and cannot see later: the device's
//! used memory before this process made a context there (the baseline), and the process's
//! memory right after it made one (the context, its default limits and the modules loaded
//! with it). NVML is read through `nvml-wrapper`, loaded at run time: without it (no NVIDIA
//! driver, or a machine that hides it) nothing is recorded and the ledger says so.

use cudarc::driver::sys;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// What NVML answered about one device, for this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NvmlAnswer {
    pub(crate) pid: u32,
    pub(crate) used: u64,
    pub(crate) total: u64,
    /// The compute processes listed, with their bytes where known; `None` where NVML could
    /// not list them.
    pub(crate) processes: Option<Vec<(u32, Option<u64>)>>,
}

impl NvmlAnswer {
    /// This process's bytes, if NVML lists this process.
    pub(crate) fn own(&self) -> Option<u64> {
        self.processes.as_ref()?.iter().find(|(p, _)| *p == self.pid).and_then(|(_, b)| *b)
    }
}

/// The context of a device as measured right after it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContextMoment {
    pub(crate) bytes: u64,
    pub(crate) how: String,
    /// Stack bytes per thread, `printf` FIFO bytes, device `malloc` heap bytes.
    pub(crate) limits: Option<[u64; 3]>,
}

fn nvml() -> Result<&'static Nvml, String> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| {
        // A machine with only the driver has the versioned name; a toolkit adds the plain one.
        Nvml::builder()
            .lib_path("libnvidia-ml.so.1".as_ref())
            .init()
            .or_else(|_| Nvml::init())
            .map_err(|e| format!("NVML (libnvidia-ml.so.1) could not be used: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The PCI bus id of CUDA device `ordinal`, which names the same device to NVML whatever
/// `CUDA_VISIBLE_DEVICES` renumbered.
fn pci_bus_id(ordinal: usize) -> Result<String, String> {
    let mut dev = 0;
    // SAFETY: `cuInit` has no preconditions; `dev` is a valid out pointer.
    let r = unsafe {
        sys::cuInit(0);
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("CUDA device {ordinal}: cuDeviceGet returned {r:?}"));
    }
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated string.
    let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("CUDA device {ordinal}: cuDeviceGetPCIBusId returned {r:?}"));
    }
    // SAFETY: NUL-terminated within the buffer (written by the driver above).
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// NVML's figures for CUDA device `ordinal` and this process.
pub(crate) fn nvml_answer(ordinal: usize) -> Result<NvmlAnswer, String> {
    let nvml = nvml()?;
    let bus = pci_bus_id(ordinal)?;
    let device = nvml.device_by_pci_bus_id(bus.as_str()).map_err(|e| format!("NVML, device {bus}: {e}"))?;
    let memory = device.memory_info().map_err(|e| format!("NVML, memory of device {bus}: {e}"))?;
    let processes = device.running_compute_processes().ok().map(|ps| {
        ps.into_iter()
            .map(|p| {
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                (p.pid, bytes)
            })
            .collect()
    });
    Ok(NvmlAnswer { pid: std::process::id(), used: memory.used, total: memory.total, processes })
}

fn baselines() -> &'static Mutex<HashMap<usize, u64>> {
    static B: OnceLock<Mutex<HashMap<usize, u64>>> = OnceLock::new();
    B.get_or_init(Mutex::default)
}

fn contexts() -> &'static Mutex<HashMap<usize, ContextMoment>> {
    static C: OnceLock<Mutex<HashMap<usize, ContextMoment>>> = OnceLock::new();
    C.get_or_init(Mutex::default)
}

/// Whether this process has a context on device `ordinal`: its primary context is active, or
/// a context is current on the calling thread (contexts made with `cuCtxCreate` on other
/// threads are not seen).
pub(crate) fn has_context(ordinal: usize) -> bool {
    let (mut dev, mut flags, mut active, mut current) = (0, 0u32, 0i32, std::ptr::null_mut());
    // SAFETY: valid out pointers; `cuInit` has no preconditions.
    unsafe {
        if sys::cuInit(0) != sys::CUresult::CUDA_SUCCESS
            || sys::cuDeviceGet(&mut dev, ordinal as i32) != sys::CUresult::CUDA_SUCCESS
        {
            return false;
        }
        let _ = sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active);
        let _ = sys::cuCtxGetCurrent(&mut current);
    }
    active != 0 || !current.is_null()
}

/// Records the device's used memory as the baseline for device `ordinal`, once, if this
/// process has no context there yet. Returns whether a baseline is recorded now.
pub(crate) fn before_context(ordinal: usize) -> bool {
    if baselines().lock().unwrap_or_else(|e| e.into_inner()).contains_key(&ordinal) {
        return true;
    }
    if has_context(ordinal) {
        return false;
    }
    match nvml_answer(ordinal) {
        Ok(a) => {
            baselines().lock().unwrap_or_else(|e| e.into_inner()).entry(ordinal).or_insert(a.used);
            true
        }
        Err(_) => false,
    }
}

/// The baseline of device `ordinal`, if one was recorded.
pub(crate) fn baseline(ordinal: usize) -> Option<u64> {
    baselines().lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal).copied()
}

/// Records the process's memory on device `ordinal` as its context's, once: call right after
/// a context was made there, before anything allocates. `how` says who saw it made.
pub(crate) fn context_made(ordinal: usize, how: &str) {
    if contexts().lock().unwrap_or_else(|e| e.into_inner()).contains_key(&ordinal) {
        return;
    }
    let Ok(a) = nvml_answer(ordinal) else { return };
    let (bytes, source) = match (a.own(), baseline(ordinal)) {
        (Some(b), _) => (b, "NVML, this process"),
        (None, Some(base)) => (a.used.saturating_sub(base), "NVML, device used less baseline"),
        (None, None) => return,
    };
    let moment = ContextMoment { bytes, how: format!("{source}, {how}"), limits: current_limits() };
    contexts().lock().unwrap_or_else(|e| e.into_inner()).entry(ordinal).or_insert(moment);
}

/// The context of device `ordinal` as measured when it was made, if it was.
pub(crate) fn context(ordinal: usize) -> Option<ContextMoment> {
    contexts().lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal).cloned()
}

/// The current context's stack (per thread), `printf` FIFO and `malloc` heap limits.
fn current_limits() -> Option<[u64; 3]> {
    use sys::CUlimit as L;
    let read = |l: L| {
        let mut v = 0usize;
        // SAFETY: a valid out pointer; an error (no current context) leaves it unread.
        (unsafe { sys::cuCtxGetLimit(&mut v, l) } == sys::CUresult::CUDA_SUCCESS).then_some(v as u64)
    };
    Some([read(L::CU_LIMIT_STACK_SIZE)?, read(L::CU_LIMIT_PRINTF_FIFO_SIZE)?, read(L::CU_LIMIT_MALLOC_HEAP_SIZE)?])
}
