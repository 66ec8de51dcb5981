//! The few CUPTI entry points and structures the observer uses, loaded at run time (CUPTI is
//! optional: without it the observer is an error saying so, never a panic). Layouts are those
//! of `cupti_callbacks.h` and `generated_cuda_meta.h`, unchanged since CUDA 11.

use std::ffi::{c_char, c_void, CStr};

/// `CUpti_CallbackDomain`: driver API calls.
pub(super) const DOMAIN_DRIVER_API: i32 = 1;
/// `CUpti_CallbackDomain`: resources (contexts, modules).
pub(super) const DOMAIN_RESOURCE: i32 = 3;
/// `CUpti_CallbackIdResource`: a context was made.
pub(super) const RESOURCE_CONTEXT_CREATED: u32 = 1;
/// `CUpti_CallbackIdResource`: a module was loaded.
pub(super) const RESOURCE_MODULE_LOADED: u32 = 6;
/// `CUpti_CallbackIdResource`: a module is about to be unloaded.
pub(super) const RESOURCE_MODULE_UNLOAD_STARTING: u32 = 7;
/// `CUpti_ApiCallbackSite`: after the call returned.
pub(super) const API_EXIT: i32 = 1;

/// `CUpti_driver_api_trace_cbid` of the calls observed.
pub(super) mod cbid {
    pub(in crate::observe) const MEM_ALLOC_V2: u32 = 243;
    pub(in crate::observe) const MEM_ALLOC_PITCH_V2: u32 = 244;
    pub(in crate::observe) const MEM_FREE_V2: u32 = 245;
    pub(in crate::observe) const MEM_ALLOC_MANAGED: u32 = 371;
    pub(in crate::observe) const MEM_ALLOC_ASYNC: u32 = 598;
    pub(in crate::observe) const MEM_ALLOC_ASYNC_PTSZ: u32 = 599;
    pub(in crate::observe) const MEM_FREE_ASYNC: u32 = 600;
    pub(in crate::observe) const MEM_FREE_ASYNC_PTSZ: u32 = 601;
    pub(in crate::observe) const MEM_ALLOC_FROM_POOL_ASYNC: u32 = 611;
    pub(in crate::observe) const MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 612;
    pub(in crate::observe) const MEM_MAP: u32 = 551;
    pub(in crate::observe) const MEM_UNMAP: u32 = 552;
    /// Every call observed.
    pub(in crate::observe) const ALL: [u32; 12] = [
        MEM_ALLOC_V2,
        MEM_ALLOC_PITCH_V2,
        MEM_FREE_V2,
        MEM_ALLOC_MANAGED,
        MEM_ALLOC_ASYNC,
        MEM_ALLOC_ASYNC_PTSZ,
        MEM_FREE_ASYNC,
        MEM_FREE_ASYNC_PTSZ,
        MEM_ALLOC_FROM_POOL_ASYNC,
        MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        MEM_MAP,
        MEM_UNMAP,
    ];
}

/// `CUpti_CallbackData`.
#[repr(C)]
pub(super) struct CallbackData {
    pub(super) callback_site: i32,
    pub(super) function_name: *const c_char,
    pub(super) function_params: *const c_void,
    pub(super) function_return_value: *mut c_void,
    pub(super) symbol_name: *const c_char,
    pub(super) context: *mut c_void,
    pub(super) context_uid: u32,
    pub(super) correlation_data: *mut u64,
    pub(super) correlation_id: u32,
}

/// `CUpti_ResourceData`: what a resource callback passes.
#[repr(C)]
pub(super) struct ResourceData {
    pub(super) context: *mut c_void,
    pub(super) resource_handle: *mut c_void,
    pub(super) resource_descriptor: *mut c_void,
}

/// `CUpti_ModuleResourceData`: the descriptor of a module loaded or unloaded.
#[repr(C)]
pub(super) struct ModuleResourceData {
    pub(super) module_id: u32,
    pub(super) cubin_size: usize,
    pub(super) cubin: *const c_char,
}

/// `cuMemAlloc_v2_params` (and `cuMemAllocManaged_params`, which adds flags after these).
#[repr(C)]
pub(super) struct MemAllocParams {
    pub(super) dptr: *mut u64,
    pub(super) bytesize: usize,
}

/// `cuMemAllocPitch_v2_params`.
#[repr(C)]
pub(super) struct MemAllocPitchParams {
    pub(super) dptr: *mut u64,
    pub(super) pitch: *mut usize,
    pub(super) width_in_bytes: usize,
    pub(super) height: usize,
    pub(super) element_size_bytes: u32,
}

/// `cuMemAllocAsync_params` (and its `_ptsz` variant).
#[repr(C)]
pub(super) struct MemAllocAsyncParams {
    pub(super) dptr: *mut u64,
    pub(super) bytesize: usize,
    pub(super) stream: *mut c_void,
}

/// `cuMemAllocFromPoolAsync_params` (and its `_ptsz` variant).
#[repr(C)]
pub(super) struct MemAllocFromPoolAsyncParams {
    pub(super) dptr: *mut u64,
    pub(super) bytesize: usize,
    pub(super) pool: *mut c_void,
    pub(super) stream: *mut c_void,
}

/// `cuMemFree_v2_params`.
#[repr(C)]
pub(super) struct MemFreeParams {
    pub(super) dptr: u64,
}

/// `cuMemFreeAsync_params` (and its `_ptsz` variant).
#[repr(C)]
pub(super) struct MemFreeAsyncParams {
    pub(super) dptr: u64,
    pub(super) stream: *mut c_void,
}

/// `cuMemMap_params`.
#[repr(C)]
pub(super) struct MemMapParams {
    pub(super) ptr: u64,
    pub(super) size: usize,
    pub(super) offset: usize,
    pub(super) handle: u64,
    pub(super) flags: u64,
}

/// `cuMemUnmap_params`.
#[repr(C)]
pub(super) struct MemUnmapParams {
    pub(super) ptr: u64,
    pub(super) size: usize,
}

/// `CUpti_CallbackFunc`.
pub(super) type Callback = unsafe extern "C" fn(*mut c_void, i32, u32, *const CallbackData);

type Subscribe = unsafe extern "C" fn(*mut *mut c_void, Callback, *mut c_void) -> i32;
type EnableCallback = unsafe extern "C" fn(u32, *mut c_void, i32, u32) -> i32;
type GetResultString = unsafe extern "C" fn(i32, *mut *const c_char) -> i32;

/// The library and the entry points used.
pub(super) struct Cupti {
    subscribe: Subscribe,
    enable_callback: EnableCallback,
    get_result_string: GetResultString,
    _lib: libloading::Library,
    /// Where it was loaded from.
    pub(super) path: String,
}

/// Where CUPTI is looked for: `VRAMSCOPE_CUPTI` (a path), then the loader's search path, then
/// the CUDA toolkit's folders (`CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda*`), where CUPTI lives
/// in `extras/CUPTI/lib64` and is not on the loader's path.
fn candidates() -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("VRAMSCOPE_CUPTI") {
        out.push(p.to_string_lossy().into_owned());
    }
    let names = ["libcupti.so", "libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8"];
    out.extend(names.iter().map(|n| n.to_string()));
    let mut roots: Vec<String> = ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(|k| std::env::var(k).ok()).collect();
    if let Ok(dir) = std::fs::read_dir("/usr/local") {
        let mut found: Vec<String> = dir
            .filter_map(|e| e.ok())
            .map(|e| e.path().display().to_string())
            .filter(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("cuda")))
            .collect();
        found.sort();
        found.reverse();
        roots.extend(found);
    }
    for root in roots {
        for sub in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"] {
            out.extend(names.iter().map(|n| format!("{root}/{sub}/{n}")));
        }
    }
    out
}

impl Cupti {
    /// Loads CUPTI, or says where it was looked for.
    pub(super) fn load() -> Result<Cupti, String> {
        let tried = candidates();
        for path in &tried {
            // SAFETY: loading CUPTI runs its initializers, which have no preconditions beyond
            // a CUDA driver, loaded by then.
            let Ok(lib) = (unsafe { libloading::Library::new(path) }) else { continue };
            // SAFETY: the symbols have the C signatures of `cupti_callbacks.h` and
            // `cupti_result.h`, declared above; the library stays loaded in `_lib`.
            let syms = unsafe {
                (|| {
                    Ok::<_, libloading::Error>((
                        *lib.get::<Subscribe>(b"cuptiSubscribe\0")?,
                        *lib.get::<EnableCallback>(b"cuptiEnableCallback\0")?,
                        *lib.get::<GetResultString>(b"cuptiGetResultString\0")?,
                    ))
                })()
            };
            match syms {
                Ok((subscribe, enable_callback, get_result_string)) => {
                    return Ok(Cupti { subscribe, enable_callback, get_result_string, _lib: lib, path: path.clone() })
                }
                Err(_) => continue,
            }
        }
        Err(format!(
            "CUPTI (libcupti.so) was not found: set VRAMSCOPE_CUPTI to its path (in a CUDA toolkit, \
             extras/CUPTI/lib64/libcupti.so); looked for {} and in {} more places",
            tried.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            tried.len().saturating_sub(5)
        ))
    }

    fn describe(&self, code: i32) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `s` is a valid out pointer; CUPTI sets it to a static string or leaves it.
        let r = unsafe { (self.get_result_string)(code, &mut s) };
        if r != 0 || s.is_null() {
            return format!("CUPTI error {code}");
        }
        // SAFETY: a NUL-terminated static string of CUPTI's.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// Subscribes `callback` and enables it for the driver calls `cbids`; returns the
    /// subscriber.
    pub(super) fn subscribe(&self, callback: Callback, cbids: &[u32]) -> Result<*mut c_void, String> {
        let mut subscriber: *mut c_void = std::ptr::null_mut();
        // SAFETY: `subscriber` is a valid out pointer; the callback is a plain function for the
        // life of the process (the subscription is never removed).
        let r = unsafe { (self.subscribe)(&mut subscriber, callback, std::ptr::null_mut()) };
        if r != 0 {
            return Err(format!(
                "cuptiSubscribe: {} (only one CUPTI subscriber is allowed in a process: a profiler \
                 such as Nsight Systems, or PyTorch's profiler, may hold it)",
                self.describe(r)
            ));
        }
        self.enable(subscriber, cbids, true)?;
        Ok(subscriber)
    }

    /// Turns the callbacks of `subscriber` for the driver calls `cbids` on or off.
    pub(super) fn enable(&self, subscriber: *mut c_void, cbids: &[u32], on: bool) -> Result<(), String> {
        self.enable_in(subscriber, DOMAIN_DRIVER_API, cbids, on)
    }

    /// Turns the callbacks of `subscriber` for `cbids` of `domain` on or off.
    pub(super) fn enable_in(
        &self,
        subscriber: *mut c_void,
        domain: i32,
        cbids: &[u32],
        on: bool,
    ) -> Result<(), String> {
        for &id in cbids {
            // SAFETY: `subscriber` came from `cuptiSubscribe`.
            let r = unsafe { (self.enable_callback)(u32::from(on), subscriber, domain, id) };
            if r != 0 {
                return Err(format!("cuptiEnableCallback({id}): {}", self.describe(r)));
            }
        }
        Ok(())
    }
}
