//! Whose an observed allocation is: the library whose code called the CUDA driver, told by
//! the object file each return address lies in (`dladdr`), so that a stripped library with
//! no symbols is still named; or the program, whose line the frames rule names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Who made an allocation, by its stack's object files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A shared library, by the name users know it by (`cuBLAS`, `NCCL`).
    Library(String),
    /// The binary vramscope is linked into (the program, its crates, cudarc, candle).
    Program,
}

/// Objects of the driver and its runtime: the frames of the call being observed, between
/// the observer's callback (innermost) and whoever made the call.
fn is_driver(object: &str) -> bool {
    ["libcuda.so", "libcupti.so", "libcudart.so", "libnvidia-"].iter().any(|p| object.starts_with(p))
}

/// Objects that only pass calls along: the C and C++ runtimes and the loader.
fn is_plumbing(object: &str) -> bool {
    ["libc.so", "libc-", "ld-linux", "libstdc++", "libgcc_s", "libpthread", "libdl.so", "libm.so"]
        .iter()
        .any(|p| object.starts_with(p))
}

/// The owner of a stack whose return addresses lie in `objects`, innermost first (`None`:
/// the binary vramscope is linked into; `Some`: a shared library's file name). The frames
/// outside the driver's innermost run decide: the first one that is not plumbing names a
/// library, or the program.
pub(crate) fn owner_of(objects: &[Option<&str>]) -> Owner {
    let past_driver = objects.iter().rposition(|o| o.is_some_and(is_driver)).map_or(0, |i| i + 1);
    for o in &objects[past_driver..] {
        match o {
            Some(name) if is_plumbing(name) || is_driver(name) => continue,
            Some(name) => return Owner::Library(library_name(name)),
            None => return Owner::Program,
        }
    }
    Owner::Program
}

/// The name users know a library by, from its file name (`libcublasLt.so.13` -> `cuBLASLt`).
pub(crate) fn library_name(file: &str) -> String {
    const KNOWN: [(&str, &str); 13] = [
        ("libcublasLt", "cuBLASLt"),
        ("libcublas", "cuBLAS"),
        ("libcudnn", "cuDNN"),
        ("libnccl", "NCCL"),
        ("libcurand", "cuRAND"),
        ("libcufft", "cuFFT"),
        ("libcusparse", "cuSPARSE"),
        ("libcusolver", "cuSOLVER"),
        ("libnvrtc", "NVRTC"),
        ("libnvjpeg", "nvJPEG"),
        ("libtorch_cuda", "PyTorch (libtorch_cuda)"),
        ("libc10_cuda", "PyTorch (libc10_cuda)"),
        ("libflash", "FlashAttention"),
    ];
    for (prefix, name) in KNOWN {
        if file.starts_with(prefix) {
            return name.to_string();
        }
    }
    file.split(".so").next().unwrap_or(file).to_string()
}

/// The object file of return address `ip` (`None`: the binary vramscope is linked into, or
/// unknown), its file name only; cached per address.
pub(crate) fn object_of(ip: usize) -> Option<Arc<str>> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Option<Arc<str>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(o) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&ip) {
        return o.clone();
    }
    let found = dladdr(ip.saturating_sub(1)).filter(|(base, _)| Some(*base) != own_base()).map(|(_, name)| name);
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(ip, found.clone());
    found
}

/// The load address of the object holding this code.
fn own_base() -> Option<usize> {
    static BASE: OnceLock<Option<usize>> = OnceLock::new();
    *BASE.get_or_init(|| dladdr(own_base as fn() -> Option<usize> as usize).map(|(b, _)| b))
}

/// The object holding address `addr`: its load address and file name.
fn dladdr(addr: usize) -> Option<(usize, Arc<str>)> {
    // SAFETY: `Dl_info` is plain data; `dladdr` only reads the loader's tables and fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about; `info` is a valid out pointer.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string owned by the loader.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let name = path.rsplit('/').next().unwrap_or(&path);
    Some((info.dli_fbase as usize, Arc::from(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_object_outside_the_driver_names_the_owner() {
        // The observer's callback (the program), CUPTI, the driver, then cuBLAS.
        let cublas = [None, Some("libcupti.so.13"), Some("libcuda.so.1"), Some("libcublasLt.so.13"), None];
        assert_eq!(owner_of(&cublas), Owner::Library("cuBLASLt".into()));
        // Through the runtime and the C library: still cuBLAS.
        let via_runtime =
            [None, Some("libcuda.so.1"), Some("libcudart.so.13"), Some("libc.so.6"), Some("libcublas.so.13"), None];
        assert_eq!(owner_of(&via_runtime), Owner::Library("cuBLAS".into()));
        // cudarc in the program's binary called the driver.
        assert_eq!(owner_of(&[None, Some("libcuda.so.1"), None, Some("libc.so.6")]), Owner::Program);
        // The driver's innermost run decides, not a library below the program.
        assert_eq!(owner_of(&[Some("libcuda.so.1"), None, Some("libnccl.so.2")]), Owner::Program);
        // No driver frame captured: the first frame decides.
        assert_eq!(owner_of(&[Some("libnccl.so.2"), None]), Owner::Library("NCCL".into()));
        assert_eq!(owner_of(&[]), Owner::Program);
        assert_eq!(owner_of(&[Some("libcuda.so.1")]), Owner::Program);
    }

    #[test]
    fn libraries_are_named_as_users_know_them() {
        assert_eq!(library_name("libcudnn_ops.so.9"), "cuDNN");
        assert_eq!(library_name("libmylib.so.1.2"), "libmylib");
        assert_eq!(library_name("libtorch_cuda.so"), "PyTorch (libtorch_cuda)");
    }

    #[test]
    fn own_code_lies_in_the_program() {
        let here = the_first_object_outside_the_driver_names_the_owner as fn() as usize;
        assert_eq!(object_of(here + 1), None);
        // `malloc` lies in the C library.
        let malloc = libc::malloc as *const () as usize;
        assert!(object_of(malloc + 1).is_some_and(|o| o.starts_with("libc")), "{:?}", object_of(malloc + 1));
    }
}
