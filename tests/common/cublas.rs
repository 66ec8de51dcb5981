//! cuBLAS's handle calls, loaded at run time: a library that allocates device memory on its
//! own, for the ledger's example and its GPU test (`#[path]`-included by both).

/// `cublasCreate_v2`.
pub type Create = unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> i32;
/// `cublasDestroy_v2`.
pub type Destroy = unsafe extern "C" fn(*mut std::ffi::c_void) -> i32;

/// `cublasCreate_v2` and `cublasDestroy_v2`, from the cuBLAS found on the loader's path, with
/// the library that must stay loaded while they are called.
pub fn load() -> Option<(libloading::Library, Create, Destroy)> {
    for name in ["libcublas.so", "libcublas.so.13", "libcublas.so.12"] {
        // SAFETY: loading cuBLAS runs its initializers, which need only the driver.
        let Ok(lib) = (unsafe { libloading::Library::new(name) }) else { continue };
        // SAFETY: the signatures of `cublas_api.h`; the library is returned with them.
        let create: Create = unsafe { *lib.get::<Create>(b"cublasCreate_v2\0").ok()? };
        // SAFETY: as above.
        let destroy: Destroy = unsafe { *lib.get::<Destroy>(b"cublasDestroy_v2\0").ok()? };
        return Some((lib, create, destroy));
    }
    None
}
