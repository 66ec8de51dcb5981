//! # vramscope
//!
//! GPU memory you can see and test: leak tests for GPU code, readable PyTorch memory
//! snapshots, and a stream-aware caching allocator for CUDA memory with PyTorch's statistics
//! that records every allocation's stack and scope. Without a GPU it runs on host memory or a
//! simulated device, so everything here works in CI.
//!
//! The guides ([`guide`]) go deeper than this page: [leak tests](guide::leak_tests),
//! [observing CUDA](guide::observing_cuda), [snapshots and the command
//! line](guide::snapshots_and_cli), [configuration](guide::configuration), [writing a
//! backend](guide::backends), [the snapshot format](guide::snapshot_format) and [the
//! allocator's design](guide::allocator).
//!
//! ## Test that a step does not leak
//!
//! ```
//! #[vramscope::gpu_mem_test(iters = 5, warmup = 1, tolerance = "0 B")]
//! fn training_step_does_not_leak() {
//!     let alloc = vramscope::device(0); // the GPU with feature `cuda`, else host memory
//!     let stream = alloc.default_stream();
//!     let x = alloc.alloc::<f32>(&stream, 1 << 20).unwrap();
//!     drop(x);
//! }
//! # fn main() {}
//! ```
//!
//! The body runs for one warm-up and five measured iterations inside a scope named after the
//! test. If what it leaves alive grows, the test fails naming each line that kept memory, with
//! the bytes it asked for per iteration, and writes its evidence (folded stacks, flamegraphs
//! with feature `flamegraph`, a JSON snapshot, the report) under `target/vramscope/<test>/`.
//! Only the test's own scope counts, so tests running in parallel keep their own verdicts;
//! threads count once they enter it ([`current_scope`], [`Scope::enter`]), async tasks once
//! wrapped ([`Scope::wrap`]). [`testing::MemTest`] is the same for a harness of your own, and
//! [`assert_mem_snapshot!`] pins what a test keeps alive with insta. The keys and the report
//! are in [the leak-test guide](guide::leak_tests).
//!
//! ## Count what candle, cudarc and cuBLAS allocate
//!
//! With feature `cupti`, `#[gpu_mem_test(source = "cuda")]` counts every CUDA allocation the
//! test's scope makes, observed through CUPTI; `observe::start()` and `observe::allocator(n)`
//! do the same in code. Beside candle, burn or mistral.rs use feature `cuda-backend` instead of
//! `cuda`, so that the framework chooses cudarc's CUDA version. See [observing
//! CUDA](guide::observing_cuda).
//!
//! ## See why `nvidia-smi` shows more than you allocated
//!
//! [`ledger::take(n)`](ledger::take) lines up the process's memory on device `n` as the driver
//! counts it (NVML's figure) with what holds it: the CUDA context and its modules, each
//! allocator's allocated and cached bytes, observed allocations by library and line, the
//! driver's pool, and what nobody counted. `metric = "device_bytes"` makes a memory test count
//! it. See [the ledger guide](guide::ledger).
//!
//! ## Read a snapshot
//!
//! [`Snapshot::load`] reads vramscope's JSON or a PyTorch snapshot pickle, gzipped or not;
//! [`report`] turns it into what a person reads: [`report::live`], [`report::leaks`],
//! [`report::diff`], [`report::segments`], [`report::summary`], and [`report::folded`] stacks
//! for flamegraphs (feature `flamegraph`). The `vramscope` command line (crate
//! `vramscope-cli`) prints the same.
//!
//! ```
//! use vramscope::{report, Snapshot};
//! let snap = Snapshot::load(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch/leaky_train.snapshot.pickle"))?;
//! let leaks = report::leaks(&snap);
//! assert_eq!(leaks[0].site, "scripts/train_loops.py:76 (leaky_train)");
//! let limits = report::leak_limits(&snap);
//! print!("{}", report::LeakCandidate::render_with_limits(&leaks, &limits));
//! # #[cfg(feature = "flamegraph")] {
//! let svg = report::flamegraph(&report::folded(&snap, report::FoldedKind::Live), "live memory")?;
//! # let _ = svg;
//! # }
//! # Ok::<(), vramscope::Error>(())
//! ```
//!
//! An empty list of leak candidates means "no leak" only where the history could show one:
//! [`report::leak_limits`] says where it could not (no history, no stacks, a history that
//! starts mid-run). See [snapshots and the command line](guide::snapshots_and_cli).
//!
//! ## Allocate through vramscope
//!
//! ```
//! use vramscope::{CachingAllocator, backend::HostBackend};
//!
//! let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
//! let stream = alloc.default_stream();
//! let mut x = alloc.alloc::<f32>(&stream, 1 << 20)?;
//! x.copy_from_host(&vec![1.0; 1 << 20])?;
//! assert_eq!(alloc.memory_allocated(), 4 << 20);
//! drop(x);                                   // the block goes back to the cache...
//! assert_eq!(alloc.memory_allocated(), 0);
//! assert!(alloc.memory_reserved() > 0);      // ...and the segment stays reserved
//! println!("{}", alloc.memory_summary());    // PyTorch's table
//! # Ok::<(), vramscope::Error>(())
//! ```
//!
//! [`device`] gives the process-wide allocator of a device. [`CachingAllocator::alloc_shaped`]
//! allocates a tensor of a shape (reports then show its dtype and shape);
//! [`Buffer::allocator`] gives back the allocator a buffer came from. Statistics carry
//! PyTorch's names ([`CachingAllocator::memory_stats`], [`stats`]); `stats().backend_memory_calls()`
//! lets a test assert that a warm loop makes no driver call. [`CachingAllocator::snapshot`]
//! returns everything recorded; [`CachingAllocator::record_memory_history`] changes what is
//! recorded ([`record`] has how stacks are taken). How the allocator places memory is in
//! [the allocator's design](guide::allocator).
//!
//! ## Mark scopes and steps
//!
//! ```
//! use vramscope::{CachingAllocator, backend::HostBackend};
//! let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
//! let _epoch = vramscope::scope("epoch");
//! vramscope::step(7);
//! let x = {
//!     let _fwd = vramscope::scope("forward");
//!     alloc.alloc::<f32>(&alloc.default_stream(), 1024)?
//! };
//! let snap = alloc.snapshot();
//! let ctx = snap.live_blocks().next().unwrap().context.unwrap();
//! assert_eq!(snap.scope(ctx.scope).unwrap(), ["epoch", "forward"]);
//! assert_eq!(ctx.step, 7);
//! # drop(x);
//! # Ok::<(), vramscope::Error>(())
//! ```
//!
//! Scopes are per thread; [`step`] marks the step that the leak finder counts by. With feature
//! `tracing`, `record::ScopeLayer` turns `tracing` spans into scopes.
//!
//! ## Replay a recorded trace
//!
//! [`replay`] runs a PyTorch snapshot's or a compact trace's allocations through the allocator
//! and measures time per operation and peak memory; [`replay::smallest_cap`] finds the smallest
//! memory they fit in (`vramscope replay`, `vramscope fit`).
//!
//! ## Cargo features
//!
//! | feature | adds |
//! |---|---|
//! | `flamegraph` | flamegraph SVGs through `inferno` |
//! | `cuda` | the CUDA backend through cudarc (CUDA 12.8 bindings, driver loaded at run time) |
//! | `cuda-backend` | the same, leaving cudarc's version and linking to the framework beside it |
//! | `cupti` | [observing](guide::observing_cuda) every CUDA allocation of the process |
//! | `tracing` | scopes from `tracing` spans |
//! | `half` | `half::f16` and `half::bf16` element types |
//!
//! ## Where things are
//!
//! At the root: the allocator ([`CachingAllocator`], [`Buffer`], [`Stream`], [`Pod`]),
//! [`device`], scopes ([`scope`], [`step`], [`Scope`]), the [`Snapshot`], [`Error`], the
//! attribute and the macros. Then one module each for [`backend`]s, [`config`]uration,
//! [`record`]ing, the [`snapshot`] model, [`report`]s, [`stats`], [`replay`], the device's
//! [`ledger`] and memory [`testing`]. The environment variables are listed in [the configuration
//! guide](guide::configuration).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub)]
#![warn(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links, rustdoc::bare_urls)]

mod alloc;
pub mod backend;
mod device;
pub mod error;
mod frames;
mod intern;
pub mod ledger;
mod model;
#[cfg(feature = "cupti")]
#[cfg_attr(docsrs, doc(cfg(feature = "cupti")))]
pub mod observe;
pub mod record;
pub mod replay;
pub mod report;
pub mod snapshot;
mod sync;
pub mod testing;
mod units;

/// Guides: longer texts on each task, the same as the `docs/` folder of the repository.
pub mod guide {
    #[doc = include_str!("../docs/leak-tests.md")]
    pub mod leak_tests {}
    #[doc = include_str!("../docs/observing-cuda.md")]
    pub mod observing_cuda {}
    #[doc = include_str!("../docs/snapshots-and-cli.md")]
    pub mod snapshots_and_cli {}
    #[doc = include_str!("../docs/configuration.md")]
    pub mod configuration {}
    #[doc = include_str!("../docs/backends.md")]
    pub mod backends {}
    #[doc = include_str!("../docs/snapshot-format.md")]
    pub mod snapshot_format {}
    #[doc = include_str!("../docs/allocator.md")]
    pub mod allocator {}
    #[doc = include_str!("../docs/ledger.md")]
    pub mod ledger {}
}

/// Typed allocator statistics ([`CachingAllocator::stats`]) and PyTorch's key names for them.
pub mod stats {
    pub use crate::alloc::{Counter, MemoryStats, Pool, PoolCounters};
}

/// How allocators are configured: [`AllocatorConfig`](config::AllocatorConfig) (also read from
/// `VRAMSCOPE_ALLOC_CONF`), the environment variables that choose the default devices and
/// OOM snapshots, and the byte-size parser they all use.
pub mod config {
    pub use crate::alloc::{
        AllocatorConfig, LimitMax, ALLOC_CONF_ENV, MAX_FRAGMENTATION_LIMIT, OOM_SNAPSHOT_ENV, ROUNDUP_INTERVALS,
    };
    pub use crate::device::{parse_bytes, BACKEND_ENV, CAPACITY_ENV, DEFAULT_HOST_CAPACITY, DEFAULT_SIM_CAPACITY};
    pub use crate::snapshot::{default_read_limit, set_read_limit, READ_LIMIT_ENV};
    pub use crate::units::{parse_byte_size, ByteSizeError};
}

pub use alloc::{Buffer, CachingAllocator, Pod, ScopeUsage, Stream, TensorMeta};
pub use device::{device, try_device};
pub use error::{Error, Result};
pub use record::{current_scope, scope, step, Scope, ScopeGuard};
pub use snapshot::Snapshot;
pub use vramscope_macros::gpu_mem_test;

/// What `#[gpu_mem_test]` and `assert_mem_snapshot!` expand to; not an API.
#[doc(hidden)]
pub mod __macro_support {
    pub use crate::testing::checked_iterations;
    pub use crate::units::parse_byte_size;
    pub use insta;
}
