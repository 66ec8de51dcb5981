//! Writes vramscope snapshots, as PyTorch pickles, that hold every kind of event PyTorch's
//! memory viewer draws: allocations in scopes and described as tensors, frees that wait for
//! another stream (`free_requested` long before `free_completed`), segments created and given
//! back by `empty_cache`, pages mapped and unmapped under a segment, and an out-of-memory
//! error. `tools/memoryviz/check.py` loads them in PyTorch's own `MemoryViz.js`.
//!
//! `cargo run --example viewer_samples -- DIR` (default `target/vramscope/viewer_samples`)

use vramscope::{
    backend::EventMode, backend::SimBackend, config::AllocatorConfig, record::RecordConfig, Buffer, CachingAllocator,
};

fn main() -> vramscope::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/vramscope/viewer_samples"));
    std::fs::create_dir_all(&dir).map_err(|error| vramscope::Error::Io { path: dir.display().to_string(), error })?;
    for (name, conf) in [("whole_segments", "expandable_segments:False"), ("mapped_pages", "expandable_segments:True")]
    {
        let config = AllocatorConfig::parse(conf)?;
        let backend = SimBackend::with_events(8 << 30, EventMode::Manual);
        let alloc = CachingAllocator::with_config(backend, config)?;
        alloc.record_memory_history(RecordConfig::default());
        let live = workload(&alloc)?;
        let path = dir.join(format!("{name}.pickle"));
        std::fs::write(&path, alloc.snapshot().to_pytorch_pickle())
            .map_err(|error| vramscope::Error::Io { path: path.display().to_string(), error })?;
        println!("{}", path.display());
        drop(live);
    }
    Ok(())
}

/// Three steps of a model on two streams, a cache emptied with a segment in use (its free pages
/// are unmapped where pages can be), pages mapped again, then a request too large to serve.
/// Returns what is still live.
fn workload(alloc: &CachingAllocator) -> vramscope::Result<(Buffer<f32>, Vec<Buffer<u8>>)> {
    let main = alloc.default_stream();
    let copy = alloc.new_stream()?;
    let weights = {
        let _s = vramscope::scope("init");
        alloc.alloc_shaped::<f32>(main, &[1024, 1024])?
    };
    let mut kept = Vec::new();
    for step in 0..3u64 {
        vramscope::step(step);
        let _s = vramscope::scope("step");
        let x = alloc.alloc_shaped::<f32>(main, &[64, 1024])?;
        let big = alloc.alloc::<u8>(main, (24 + 8 * step as usize) << 20)?;
        let small: Vec<_> = (0..8).map(|k| alloc.alloc::<u16>(main, 100 + 300 * k)).collect::<Result<_, _>>()?;
        // Used on the copy stream too: its free waits for that stream's work.
        let staged = alloc.alloc_shaped::<f32>(main, &[256, 1024])?;
        alloc.record_stream(&staged, copy)?;
        drop(staged);
        drop((x, big, small));
        kept.push(alloc.alloc::<u8>(main, 1 << 20)?);
        alloc.synchronize(copy)?;
    }
    drop(kept.drain(..2));
    // Three blocks of 3 MiB share a segment; the middle one's pages go back to the device.
    let mut thirds: Vec<_> = (0..3).map(|_| alloc.alloc::<u8>(main, 3 << 20)).collect::<Result<_, _>>()?;
    drop(thirds.remove(1));
    alloc.empty_cache();
    kept.extend(thirds);
    kept.push(alloc.alloc::<u8>(main, 3 << 20)?);
    let _ = alloc.alloc::<u8>(main, 16 << 30).expect_err("more than the device holds");
    Ok((weights, kept))
}
