//! Where a process's GPU memory goes, step by step: the ledger after each action, so that
//! each action shows which part it moves.
//!
//! ```sh
//! cargo run --example ledger                              # host backend: no GPU parts
//! cargo run --release --example ledger --features cuda,cupti   # on a GPU
//! ```
//!
//! On a GPU it starts the observer of CUDA allocations first (so that it sees the context
//! made), then allocates through vramscope, through the driver directly (as cudarc's
//! `malloc_sync` does), from the driver's stream-ordered pool (cudarc's `alloc_zeros`), makes a
//! cuBLAS handle, frees, and empties vramscope's cache. Without a GPU the vramscope steps run
//! on the host backend and the ledger says what it cannot see.

fn show(step: &str) {
    let started = std::time::Instant::now();
    let ledger = vramscope::ledger::take(0);
    let took = started.elapsed();
    println!("== {step}: {} (taken in {} µs)", ledger.headline(), took.as_micros());
    print!("{}", ledger.to_text());
    println!();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "cupti")]
    if let Err(e) = vramscope::observe::start() {
        println!("(observer not started: {e})");
    }
    let alloc = vramscope::device(0);
    show("vramscope's device opened");
    let stream = alloc.default_stream();
    let big = alloc.alloc::<u8>(&stream, 256 << 20)?;
    show("vramscope: 256 MiB allocated");
    gpu::steps(show)?;
    drop(big);
    show("vramscope: 256 MiB freed (cached by its allocator)");
    alloc.empty_cache();
    show("vramscope: empty_cache()");
    Ok(())
}

#[cfg(all(feature = "cuda", feature = "cupti"))]
#[path = "../tests/common/cublas.rs"]
mod cublas;

#[cfg(all(feature = "cuda", feature = "cupti"))]
mod gpu {
    use cudarc::driver::{result, CudaContext};

    use super::cublas;

    pub(super) fn steps(show: fn(&str)) -> Result<(), Box<dyn std::error::Error>> {
        let Ok(ctx) = CudaContext::new(0) else {
            println!("(no CUDA device: the driver, pool and cuBLAS steps are skipped)\n");
            return Ok(());
        };
        ctx.bind_to_thread()?;
        // SAFETY: a plain device allocation, freed below with `free_sync`.
        let direct = unsafe { result::malloc_sync(64 << 20)? };
        show("driver: cuMemAlloc of 64 MiB (cudarc's malloc_sync)");
        let stream = ctx.default_stream();
        let pooled = stream.alloc_zeros::<u8>(32 << 20)?;
        stream.synchronize()?;
        show("pool: 32 MiB from the stream-ordered pool (cudarc's alloc_zeros)");
        let handle = cublas::load().map(|(lib, create, destroy)| {
            let mut h = std::ptr::null_mut();
            // SAFETY: `h` is a valid out pointer.
            let status = unsafe { create(&mut h) };
            (lib, destroy, h, status)
        });
        match &handle {
            Some((.., 0)) => show("cuBLAS: a handle made (cublasCreate)"),
            Some((.., status)) => println!("(cublasCreate returned {status})\n"),
            None => println!("(cuBLAS not found: its step is skipped)\n"),
        }
        drop(pooled);
        stream.synchronize()?;
        show("pool: 32 MiB freed");
        // SAFETY: allocated above by `malloc_sync`, not used since.
        unsafe { result::free_sync(direct)? };
        show("driver: 64 MiB freed");
        if let Some((_lib, destroy, h, 0)) = handle {
            // SAFETY: made above by `cublasCreate_v2`.
            unsafe { destroy(h) };
            show("cuBLAS: handle destroyed");
        }
        Ok(())
    }
}

#[cfg(not(all(feature = "cuda", feature = "cupti")))]
mod gpu {
    pub(super) fn steps(_show: fn(&str)) -> Result<(), Box<dyn std::error::Error>> {
        println!("(a build without features cuda and cupti: the driver, pool and cuBLAS steps are skipped)\n");
        Ok(())
    }
}
