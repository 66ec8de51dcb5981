//! # vramscope
//!
//! GPU memory you can see and test. vramscope is an instrumented, stream-aware caching
//! allocator for device memory with PyTorch-compatible statistics, running on a CUDA device or,
//! without one, on host memory or a simulated device.
//!
//! ## Leak tests
//!
//! Most users meet vramscope as a dev-dependency and this attribute:
//!
//! ```
//! #[vramscope::gpu_mem_test(iters = 5, warmup = 1, tolerance = "0 B")]
//! fn training_step_does_not_leak() {
//!     let alloc = vramscope::device(0);
//!     let stream = alloc.default_stream();
//!     let x = alloc.alloc::<f32>(&stream, 1 << 20).unwrap();
//!     drop(x);
//! }
//! # fn main() {}
//! ```
//!
//! It runs the body for the warm-up and measured iterations inside a scope named after the
//! test, measures what the body left alive at the end of each iteration, and fails when that
//! grows beyond the tolerance. The panic (located at your test) names each line that kept
//! memory first, with exact figures per iteration:
//!
//! ```text
//! leaks::a_forgotten_buffer: live bytes grew in 4 iterations
//! kept alive per iteration, by the line that allocated it:
//!   tests/leaks.rs:22 (leaks::a_forgotten_buffer::{{closure}})
//!       1 block, 16,384 B (16.00 KiB) per iteration, float32[64, 64]
//! live bytes of the test's blocks (bytes asked for, all allocators):
//!   grew 65,536 B (64.00 KiB) in 4 iterations (tolerance 0 B); at the end of each iteration:
//!     1        16,384 B (16.00 KiB)   warm-up
//!     2        32,768 B (32.00 KiB)   +16,384 B (16.00 KiB)
//! ...
//! ```
//!
//! Bytes per site are what the code asked for (the 512-byte-rounded block sizes stand beside
//! them where they differ), and so is the figure `tolerance` is compared with. Every line fits
//! 100 columns where its file's path allows: a site too wide loses its function's module path,
//! then the middle of its name (its file and line stay whole), and what follows a site's
//! figures (block sizes, a buffer replaced by a larger one, dtype and shape, scope) goes on
//! lines of its own where it would not fit, the figures always first. Before it fails it writes
//! its evidence under
//! `target/vramscope/<test>/` and names the paths: `growth.folded` (the folded stacks of only
//! what grew) and `live.folded`, drawn as `growth.svg` (with the metric per iteration) and
//! `live.svg` with the cargo feature `flamegraph`, `snapshot.json` (the test's blocks) and
//! `report.txt`.
//!
//! What counts is the test's scope, in every allocator alive in the process
//! ([`CachingAllocator::all`]): `device(n)` and the allocators the body builds. So tests running
//! in parallel under `cargo test` keep their own verdicts. Threads the body spawns count once
//! they enter the test's scope (`let s = vramscope::current_scope();`, then `let _g = s.enter();`
//! in the thread); async tasks count when wrapped (`tokio::spawn(s.wrap(task))`, see
//! [`Scope::wrap`]). The test also fails, saying why, when the body allocated nothing any
//! vramscope allocator saw (it measured nothing: memory from cudarc or a framework directly is
//! seen only with `source = "cuda"`, below), and when it ran alone (no other memory test overlapped it) while memory outside
//! its scope grew at every measured iteration (a thread that never entered the scope; with
//! neighbours running, such growth could be theirs, and is not judged). That report names the
//! lines outside the scope that grew, with their figures, and how to carry the scope.
//!
//! Stacks name your code as you build it, without frame pointers or other flags: `file:line
//! (function)` in the dev profile and in release with `debug = "line-tables-only"` (there debug
//! info names inlined code without its path: the test's body reads `the memory test's body`,
//! a closure inside it `{closure#0}`), function names in release without debug info (a body
//! inlined into the harness is named after the test).
//!
//! Keys: `iters` (5), `warmup` (1), `tolerance` (`"0 B"`; bytes with a unit, or blocks),
//! `metric` (`"live_bytes"`, `"live_blocks"`, or `"reserved_bytes"`, which counts whole
//! allocators and so is best used alone), `device` (0: the device `backend` checks), `backend`
//! (`"any"`, `"host"`, `"cuda"`: skipped with a printed reason where missing; `"cuda"` runs
//! with the `cuda` feature on a machine with a device), `snapshot` (`false`; `true` pins what
//! the test keeps alive, and nothing of its neighbours', with insta after the loop, naming
//! sites by `file:line` so that the pin reads the same in every profile), `source`
//! (`"vramscope"`; `"cuda"` counts every CUDA allocation the test's scope makes, through
//! cudarc, candle, cuBLAS or the driver directly, by observing them with CUPTI: cargo feature
//! `cupti`, skipped with a printed reason where CUPTI or a device is missing; see the `observe` module).
//! Other attributes (`#[should_panic]`, `#[ignore]`) are kept
//! and `Result` return types work. With an async runtime, put its test attribute first:
//! `#[tokio::test]` above `#[gpu_mem_test]`, so the runtime's expansion is what repeats.
//!
//! [`testing::MemTest`] is the same machinery for custom harnesses, and
//! [`assert_mem_snapshot!`] pins a deterministic live-tensor report (sites, scopes, dtypes,
//! shapes, counts; no addresses, timestamps or thread ids) beside the calling test: of a
//! `MemTest` (its blocks only, stable beside parallel tests), or of a whole allocator (every
//! block it holds, whoever allocated it: pin a private allocator, not `device(0)`, which tests
//! running beside yours share).
//!
//! ## Allocating
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
//! [`device`] gives the process-wide allocator of a device, for code that does not want to pass
//! an allocator around.
//!
//! Streams are passed by value or by reference; [`CachingAllocator::alloc_shaped`] allocates a
//! tensor of a shape in one call (reports then show its dtype and shape);
//! [`Buffer::allocator`] gives back the allocator a buffer came from (to grow a KV cache on
//! the buffer's [`stream`](Buffer::stream) without carrying the allocator). Element types are
//! the primitive integers and floats, and `half::f16`/`half::bf16` with feature `half`.
//!
//! ## How the allocator works
//!
//! Memory comes from a [`Backend`] in *segments*; the allocator splits them into *blocks*,
//! rounds requests to 512 bytes, keeps requests of at most 1 MiB in a small pool of 2 MiB
//! segments and larger ones in a large pool, reuses the best-fitting free block, and merges free
//! neighbours, as PyTorch's caching allocator does. Among free blocks of one size it takes the
//! one in the segment reserved first, then at the lowest offset, where PyTorch takes the lowest
//! address: no decision depends on where the driver put a segment. `cuMemAlloc` reuses freed
//! addresses and the sim backend does not, and address order had made the same trace's peak
//! differ between them by up to 5%; in reservation order, the sim replayed every trace
//! measured as an H200 did, byte for byte and driver call for call (38 of 38 fixture rows and
//! 240 of 240 rows of random shapes on two to four streams; `BENCHMARKS.md`, "Decisions no
//! address makes"). Beyond that it differs from PyTorch's where that lowers peak memory:
//! reserved memory grows freely only while it stays within
//! [`AllocatorConfig::fragmentation_limit`] (1.05 by default) times the peak of allocated bytes;
//! beyond that it first gives cached segments back (and, on backends that can unmap pages, the
//! pages under free holes) and sizes the new segment to the request. Where segment calls are
//! costly (CUDA), each time holding to the limit churns — memory given back then asked for
//! again — the limit rises at once to what that request needed (or, where more, to what the
//! reclaims that gave memory back since the last peak needed: the limit that would have
//! spared them), up to
//! [`AllocatorConfig::fragmentation_limit_max`] (1.25), so that a training loop settles within
//! one or two steps to steps that never call the driver. Where the limit must rise again
//! before the allocated bytes set a new peak (steps that churn again: dynamic shapes, whose
//! holes each raise leaves too few), each such raise is at least twice the last (0.5%, 1%, 2%,
//! ...): the steps that still churn are then as many as the doublings to the headroom the loop
//! needs, not that headroom over 0.5%, overshooting it by less than the last step. That
//! ceiling gives way where holding to it would churn for ever: a request of a size that
//! already churned once at the ceiling raises the limit past it ([`LimitMax::Auto`]). One churn
//! at the ceiling may be a warm-up; the same size churning again is a loop's steady state (a
//! server's requests of random shapes kept reserving and freeing segments in every pass at
//! 1.25; `BENCHMARKS.md`).
//!
//! What a reclaim gives back is in proportion to what the request lacks. A request larger
//! than a small segment releases none of the small pool's 2 MiB segments (2 MiB each against
//! its hundreds, which the next step's small tensors reserve again); of a free hole, only as
//! many pages as the request lacks under the limit are unmapped, from the hole's end, the rest
//! staying mapped for the step's next requests, and only while the request's stream holds
//! every segment (see below); and while one stream holds every segment, no
//! whole cached segment larger than 8 times the request's new segment is released for it: the
//! request grows past the limit by its segment instead. Smallest first, the only whole free
//! segment is often one of the loop's large ones, cached because the loop uses it: released to
//! make room for 2 MiB of small tensors, it was reserved again when its own request came back
//! later in the step, pass after pass (the churn rule above did not see it: the small
//! request's raise had used up the record of the release). Likewise the largest hole of a range
//! that grows in place is often most of the range (a step's memory, free between steps):
//! unmapped whole for a request a few hundred megabytes over the limit, it was mapped again by
//! the same step. Growing instead overshoots the limit by memory the loop then reuses. On an
//! H200, with `cuMemAlloc` segments, 48 single-stream random traces (24 generated after the
//! segment clauses were fixed) went from 8 rows calling the driver after two warm passes to 3
//! and from 519 warm calls to 126; with virtual segments (the default) 108 single-stream traces
//! (60 generated after the page clause was fixed) from 606 warm calls to 193 at the same
//! peaks, the one row still calling in its third warm pass (1,411 ns an operation there,
//! PyTorch 626) settling in the first (170 ns); on 60 traces of random shapes on two to four
//! streams, generated after the clauses were extended to several streams, rows calling late
//! fell from 13 to 5 (`cuMemAlloc`) and 14 to 12 (virtual), warm calls by 50–65% and peaks by
//! 1–2%; every single-stream random row as the sim predicted, and 111 of the 122 multi-stream
//! ones (ties between free blocks then went by address, which the device and the sim hand
//! out differently; since they no longer do, every row of a later set matches: see above). The
//! clause on whole
//! segments is kept to one stream: on several, releasing a segment is how memory passes
//! between streams, and it left more rows calling late there (`BENCHMARKS.md`, "Reclaim in
//! proportion" and "Unmapping what a request lacks").
//!
//! Where other streams hold segments too, a reclaim unmaps no hole at all. Memory passes
//! between streams as lent blocks and whole segments; a hole unmapped for one stream's request
//! lies in a segment whose own stream fills it again within the loop, mapping its pages back
//! (and, over the limit, unmapping another hole for them), where kept mapped it could have been
//! lent. On 480 traces of random shapes on two to four streams replayed as on CUDA (the 120 of
//! one set never replayed before), virtual segments then made half the warm passes' driver
//! calls (2,296 against 4,938), 47 rows called after two warm passes instead of 89, and the
//! geometric mean of the peaks fell on each set of 120. On an H200 the held-out set's 120 rows
//! and the fixtures' three multi-stream traces replayed byte for byte and call for call as the
//! sim had said (`BENCHMARKS.md`, "No hole unmapped on several streams"). Pages under holes
//! still go back at `empty_cache` and before an out-of-memory error.
//!
//! Where the backend maps pages (CUDA's virtual-memory segments, the sim), segments also *grow
//! in place*, as PyTorch's expandable segments, one stream's at a time: a large
//! segment reserves addresses for as much memory as the device has, and a request that no free
//! block fits maps, at the end of the segment whose free end is largest, only what that free
//! end lacks. A stream's working set then lies in one range whose holes merge whatever sizes
//! the next step asks for, instead of a new segment per size beside free ends that stay
//! reserved: on the H100 the peak reserved over the peak allocated of a Transformer trained
//! on random sequence lengths fell from 1.143 to 1.029 (the driver's pool: 1.099), and below
//! the pool's on every single-stream trace but one (`BENCHMARKS.md`). While one stream holds a
//! segment reserved to grow, other streams' segments are reserved without room, and memory
//! moves to them as whole segments (which a grown segment seldom is) or lent blocks. Until
//! 2026-11-27 the range stopped growing as soon as another stream held any large segment: a
//! side stream's few tensors (an average of the weights, a bucket of gradients, a prefetched
//! batch) sent the main stream back to a segment per size. Growing on beside them, 480 traces
//! of random shapes on two to four streams replayed as on CUDA made 31% fewer warm driver
//! calls and a lower geometric mean of peaks on each set of 120, and `prefetch_side_stream`
//! reserves 1.049 times its peak instead of 1.108, under the pool's 1.097 on its streams; on
//! an H200, 248 of 248 replays of 124 traces on several streams as the sim said
//! (`BENCHMARKS.md`, "One range grows beside other streams").
//!
//! Since 2026-11-28 the other streams' large requests use that range too, while the stream that
//! holds it is idle (no work queued: `cuStreamQuery`): a large request that none of its stream's
//! own free blocks fits is served as a request of the range's stream (its best fit, else the range
//! grown by what its free end lacks) and the block lent to the requesting stream. Freed while the
//! borrower is idle, the block is back in the range at once; freed while the borrower's work runs,
//! it waits for an event on the borrower, as after `record_stream`, so the range's stream never
//! waits for another's work. While the range's stream has work queued, the request goes its own way
//! as before (a segment of its stream, or a block lent over the limit), so no stream is made to
//! wait for work it did not ask to follow; the `cudaMallocAsync` pool reuses another stream's
//! memory on the same condition (its free complete). Since 2026-12-02 a free block of the range's
//! stream is lent without asking where no memory joined its free blocks since the stream was last
//! seen idle (the work that used them was all queued before then, so none of it still runs): half
//! the stream queries on `ensemble_streams`, no decision changed (`BENCHMARKS.md`, "Fewer stream
//! queries"). And a loan comes back without asking whether its borrower is idle where the borrower
//! was idle when last asked: one question, before another stream's request takes memory a loan lies
//! in or a reserve, release or unmap could reach it, covers every loan the stream gave back since
//! (the borrower's own requests need none: its later work runs after its earlier), and so does any
//! "idle" answer about it. Where that question finds the borrower busy after all, the owners'
//! streams are ordered after it then, the one case where a stream waits for another's work it did
//! not ask to follow; a stream that was busy when last asked keeps the event above. Replayed, 94%
//! fewer stream queries on `ensemble_streams`, no decision changed (`BENCHMARKS.md`, "Loans given
//! back unasked"); asked only where the block a request takes overlaps such a loan (not at every
//! request of another stream), 22% fewer again over the 132 fixture rows, `fsdp_layer_gather` 945
//! to 672 a pass, no decision changed ("Asked only where a request takes a loan"). Small requests
//! keep their stream's small segments (a thread's parking slot reuses those without the lock). Why:
//! memory freed on one stream had served another only as a lent block over the limit, and the
//! streams' large blocks lay in segments whose holes never merged. On 240 traces of random shapes
//! on two to four streams that no rule had been tried on, replayed as on CUDA, the geometric mean
//! of peak over live fell from 1.179 and 1.200 to 1.046 and 1.054, lower on every one of the 240;
//! warm driver calls fell from 861 to 75, and no replay called the driver after its second warm
//! pass (15 had). On an H200, on 24 traces generated for the run, virtual segments reserved at most
//! the better of PyTorch's and the pool's on the traces' streams on 9 of the 12 on several streams
//! (the run before, on 24 others: 1 of 12), every replay as the sim said (`BENCHMARKS.md`, "Several
//! streams in one range"). Each idle check is a driver call (`cuStreamQuery`, no wait;
//! [`MemoryStats::num_stream_queries`](crate::alloc::MemoryStats::num_stream_queries) counts them);
//! on the H200 the four fixtures on several streams replayed about as fast as before, within the
//! host's noise (`pipeline_streams`, three streams, recording off: 221 ns per operation before; 495
//! in the run, 229 in a rerun minutes later).
//!
//! With `cuMemAlloc` segments, which do not grow, the same rule takes the stream holding the
//! most large segments as the one whose cache serves the others while it is idle (the home
//! stream; a segment reserved for another stream's request is reserved for it, so the home
//! stays put). On the same 240 traces: 1.206 and 1.210 to 1.127 and 1.137, lower on 223 and
//! higher on 16, warm driver calls 1,125 to 574, 19 replays calling after the second warm
//! pass as before (8 and 11 instead of 12 and 7); on the H200, 32 of 32 replays as the sim
//! said, and within 1% of the better of PyTorch's and the pool's peak on 4 of the 12 new
//! traces on several streams instead of none. `share_idle_streams:false` in the configuration
//! keeps each stream's memory to itself, as PyTorch's allocator does (the tests' PyTorch-like
//! reference sets it).
//!
//! In such a range best fit takes the free end last, only where no other free block fits (the
//! "wilderness preservation" of Korn and Vo, which dlmalloc keeps too). The free end is the one
//! block that serves any request, growing by what it lacks; a hole serves only what fits it. A
//! request that took the end because the end was the smaller fit left the hole idle, and the
//! next request larger than the hole grew the range by what the end no longer had. The rule
//! is about where blocks lie in one range, not about any workload. On 120 single-stream traces
//! of random shapes that nobody had replayed before, replayed as on CUDA, it lowered the peak
//! on 59 and raised it on 9, and halved the warm passes' driver calls; on the 23 single-stream
//! fixture traces it lowered the peak on 9 (`lstm_packed` from 1.249 to 1.112 times its peak
//! allocated bytes, under the pool's 1.130) and raised it on 3 (`encoder_serving` 1.137 to
//! 1.208, `leaky_train` 1.082 to 1.112, `activation_offload` 1.022 to 1.026), the geometric
//! mean falling from 1.055 to 1.047. Six programs written after the rule, replayed once on an
//! H200 as the sim said, reserved on none more than the code before it does on the sim
//! (`detection_boxes` 1.085 to 1.010, under the pool's 1.059; `BENCHMARKS.md`, "The free end
//! last").
//!
//! While one stream holds every segment there, small requests are served from the growing
//! range too (split off down to 512 bytes, where a large block keeps a remainder under 1 MiB
//! in PyTorch's rules), instead of 2 MiB small segments beside it: a program's small requests
//! often peak when its large ones do not (a language model's prompt against its decoding
//! steps), and the small segments kept for them stay reserved at the large peak, memory the
//! range cannot use; in one range the same pages serve both in turn. On the H100 this took
//! GPT-2 generation from 1.106 to 1.004 times its peak allocated bytes and a KV-cache decoder
//! from 1.043 to 1.003, under the driver's pool (1.057, 1.006), both traces held out of
//! tuning. Once another stream holds a segment, small requests go to the small pool again
//! (PyTorch's pools move between streams as whole segments); its counters in
//! [`CachingAllocator::stats`] stay at 0 until then. The cost: small tensors allocated in the
//! middle of a step and kept (an optimizer's momentum made at its first step) lie where a hole
//! was free then, and can split the range a later, larger step needs whole (`ema_side_stream`
//! reserves 1.195 times its peak for that, 1.023 with them in small segments). Small segments
//! up to 0.25% of the peak fixed that trace and lost on nine programs nobody had seen, which
//! judged the rule (BENCHMARKS.md, "Nine workloads nobody had seen, and a rule judged on
//! them"); not built.
//!
//! What no policy of this kind can reach with one address per page: once it makes no driver call in
//! a pass, every block of the pass lies at one address in memory that does not change, a fixed
//! layout, and some passes fit no fixed layout in their peak of live bytes. `staggered_buffers`
//! (three 256 MiB buffers of staggered lifetimes, and scratch tensors filling what they leave of 1
//! GiB) needs 1.25 GiB in any, searched exhaustively; the `cudaMallocAsync` pool holds 1 GiB by
//! mapping memory in every pass. So where the range would grow for a request over 1 MiB that none
//! of its holes fits, it serves the request instead from its wholly free mappings (a 2 MiB page
//! each for growths under 128 MiB, coarser for larger ones), wherever they lie, mapped once more in
//! order at addresses of their own (a *view*), if that maps fewer new bytes than growing would
//! ([`AllocatorConfig::alias_pages`], on by default). While the buffer lives the memory it uses is
//! held out of the range's holes (of the view's last mapping, only what it needs); freed, it goes
//! back, and the view is kept for the next request of its size in pages whose memory is all free
//! again, which takes it with no driver call. Why it settles: a pass that repeats the last from the
//! same layout finds at each request the holes it found before and the view made for it then. A
//! view reserves nothing (reserved memory counts the range's memory once), and a snapshot shows it
//! as a segment of its own at the buffer's address, its memory left out of the range. On an H200,
//! against PyTorch's allocator and the pool measured in the same session, the default segments
//! reserved at most the better of their peaks on all 54 fixture traces (15 missed it without views;
//! the five on several streams judged against both replaying them on the same streams),
//! `staggered_buffers` 1.000 times its live peak instead of 1.500, and none called the driver after
//! its second warm pass (one, `gru_tbptt`, in its second); in the median of three rounds, warm time
//! with recording off was under half of PyTorch's on 48 and 47 of 49 one-stream traces in two runs
//! (the one or two over it, 0.53 to 0.57, a different few in each run), and with the default
//! recording under PyTorch's on all 49. The cost is in the cold pass (small growths mapped a page
//! at a time, views mapping each of their mappings again): 3.8 times the time per operation of
//! PyTorch's expandable segments, which map 20 MiB at a time, since views map whole mappings (4.8
//! times when the range mapped every page alone; `BENCHMARKS.md`, "Views of whole mappings", "The
//! whole table with 54 traces, views on" and "Views of the range's free pages"). Six workloads
//! written later and replayed once, unseen, met every target with the default segments, peaks 0.81
//! to 0.91 of the better of PyTorch's and the pool's (`BENCHMARKS.md`, "Six workloads nobody had
//! seen, on the code as it stands"), six more the next day, peaks 0.78 to 0.997
//! (`BENCHMARKS.md`, "Six more nobody had seen"), and six more after that, peaks 0.77 to
//! 0.92 ("Six more nobody had seen, forty-second session"); over all 66 fixture traces on the
//! H200 since, every target on 65 and then 64: the misses time on several streams with the
//! recording off, `pipeline_streams` 0.61 of PyTorch's on its three streams, then
//! `ensemble_streams` 0.62 and `three_stream_serving` 0.52 with those rounds paired, whose
//! rounds spanned 0.56–0.76 and 0.26–0.72 ("The whole table with 66 traces", "The whole table
//! with several streams paired"), then 65 again, `pipeline_streams` 0.55 (rounds 0.27, 0.65,
//! 0.55; "The whole table, PyTorch pass by pass on every trace"). The host's speed changes 2x in
//! phases; compared by each side's fastest tenth of passes, six of the seven take 0.29–0.44 of
//! PyTorch's time and `pipeline_streams` 0.50, at the target's edge ("The host's two speeds are
//! phases"), and in the latest run 63 of the 66 take at most half. Where a pass starts from
//! another layout than the last (the block freed last at its end is handed to the next pass's
//! first request of its size where it lies), a view may be made again: 1 of 300 synthetic traces
//! of random shapes called the driver in its third warm pass that way.
//!
//! PyTorch's `max_split_size_mb` ([`AllocatorConfig::max_split_size`]) keeps blocks of at
//! least that size whole for requests of about their size (within 20 MiB), as in PyTorch,
//! with two exceptions. In a segment that grows in place the rules do not apply: the range's
//! free end grows to whatever a step needs, and kept from small requests it made each of them
//! grow the range further. Over the fragmentation limit they give way to the best fit rather
//! than release cached memory and reserve more: PyTorch frees oversize blocks only when the
//! device is out of memory, and at a soft limit the same rules churned in every pass. With
//! `max_split_size_mb:128`, on an H200, fixture traces had reserved up to 158 times their peak
//! of allocated bytes (virtual segments) and 6.8 times (`cuMemAlloc`), calling the driver in
//! every pass. Now the single-stream ones reserve with virtual segments exactly what they
//! reserve without the setting, and every trace at most 10.2% more than without it otherwise;
//! none calls the driver after its second warm pass. In geometric mean over the 19 traces that
//! is 1.067 times the peak (virtual) and 1.156 (`cuMemAlloc`), where PyTorch's allocator with
//! the same setting reserves 1.800 (1.360 without it: `BENCHMARKS.md`, "PyTorch's
//! `max_split_size`").
//!
//! Streams: a freed block is reused at once on the stream it was allocated on. A block used on
//! another stream ([`CachingAllocator::record_stream`]) is reused only after an event recorded on
//! that stream at free time has completed, or the stream has done that work by other signs:
//! [`CachingAllocator::synchronize`] of the stream completes the frees that waited on it, and
//! an event still called "not ready" on its 4th, 8th, 16th... query is checked against its
//! stream (an idle stream has done everything queued before the event). On an H200
//! `cuEventQuery` said "not ready" after `cuStreamSynchronize` of the event's stream, the work
//! visibly done, in about one run in ten of the CUDA suite (`BENCHMARKS.md`, "An event query
//! that lags").
//! Over the fragmentation limit, where the request's stream has no free block that fits and
//! reclaiming would otherwise release cached memory to reserve a new segment, a free *block*
//! of another stream's segment is lent instead (the best fit over the other streams, whole
//! segments included), the request's stream ordered after the owner's (on CUDA the borrower
//! waits for an event recorded on the owner; the host does not block; copies run on their
//! buffer's stream): the block stays in its owner's segment, and at its free goes back to the
//! owner's free blocks at once: with nothing to order where the borrower has no work queued
//! (since 2026-11-28), else the owner's stream ordered after the borrower's (or, where the
//! backend cannot order them, once an event recorded on the borrower at free time has
//! completed, as after `record_stream`). The cudaMallocAsync pool shares freed memory between
//! streams much the same way; PyTorch's allocator does not, and on the same streams reserves
//! more (`BENCHMARKS.md`, "Several streams, like for like"). A stream that holds no small
//! segment borrows a small block once; needing to borrow again, it reserves a 2 MiB segment of
//! its own: a stream that keeps allocating, lent every block, would order two streams under
//! the lock at each allocation and free, and threads each allocating on a stream of their own
//! made 1 M pairs a second at 16 threads instead of 34 M (`BENCHMARKS.md`, "Threads on their
//! own streams again"). A stream made for one request still borrows.
//!
//! Lent, not given: a stream that still works and gave a cached segment away needs memory
//! again later in its loop and takes another stream's, so segments taken over wander from
//! stream to stream and the allocator keeps calling the driver pass after pass; a lent block
//! is back with its owner at its free, so each stream's cache drifts less from one pass to
//! the next and a loop settles sooner. On synthetic traces of dynamic shapes over two to four
//! streams replayed as on CUDA (two generators, 72 rows each, neither tuned on), handing whole
//! segments over left 30 and 38 rows calling the driver after two warm passes, the last until
//! the fourteenth and the tenth warm pass; lending leaves 11 and 25, the last settled by the
//! fifth and the sixth, at a lower peak. Not every row settles by the third pass, as issue 22
//! asks (`BENCHMARKS.md`, "Lending instead of taking over"; the test
//! `random_shapes_on_several_streams_settle`). Since then, on 1,536 traces of that generator
//! (half on several streams), 1 row with virtual segments and 84 with `cuMemAlloc` ones call
//! the driver after the second warm pass, 57 of those for the last time in the third
//! (`BENCHMARKS.md`, "What the reclaim wanted").
//!
//! A whole cached segment changes stream in two cases, the new stream's work ordered after the
//! old stream's as for a loan: when its stream is idle (it has not allocated during the last
//! 64 requests that needed a new segment; idle streams' whole segments nobody takes are
//! released at the next sweep, so that a program creating streams without end keeps a bounded
//! cache), and, over the limit, when it holds only a temporary that another stream freed just
//! now, of exactly the request's size: a stream per request, where the segment follows the
//! temporary from stream to stream (lending it would order the first stream after every later
//! one). Each stream with a live small block holds a small segment of its own (2 MiB), as in
//! PyTorch; its large blocks may lie in another stream's memory, lent.
//!
//! Reading changes nothing. A free keeps the block it frees aside, unmerged, for a next
//! request of its exact size on its stream (the alloc-free-alloc of a temporary then costs no
//! split, merge or lookup); any other change to the heap merges it first. Reads do not:
//! [`CachingAllocator::stats`], snapshots, [`CachingAllocator::memory_allocated`],
//! [`CachingAllocator::largest_free_block`], scope usage and the other reads show the heap as
//! merging would leave it, computed beside it, and leave the block where it is. Until
//! 2026-11-28 reads merged it, and the next request of its size then got the best fit instead
//! (among equal free blocks over 1 MiB the lowest in reservation order, which the block kept
//! aside need not be): a program that read its statistics between a free and an allocation
//! got other blocks than one that did not. Replayed with the statistics read after every
//! operation, `fno_varres` peaked at 4,004 MiB instead of 4,744 with `cuMemAlloc` segments,
//! `pointnet_varpoints` at 5,726 instead of 6,216 with virtual ones; now each peaks the same
//! read or not (`tests/reads.rs`). [`CachingAllocator::reset_peak_stats`] does not merge it
//! either: it sets the peaks to what merging would leave. Resetting the accumulated totals,
//! emptying the cache, synchronizing, `record_stream` and new streams merge it first. (Blocks
//! that threads parked, below, are pulled back by reads too, as the paragraph says.)
//!
//! Threads: one lock guards an allocator's heap. Once threads have contended for it, a
//! dropped buffer's block is *parked* in its thread's own slot instead (up to 4 per thread),
//! and that thread's next request takes back the block it freed last without the lock, where
//! the heap would have handed out that very block (the same size and stream): threads that
//! each allocate and free in a loop no longer queue on one another. Nothing a user reads
//! changes: every operation that takes the lock (statistics, snapshots, any allocation the slot
//! cannot serve, the last handle's drop) first pulls every parked block back into the heap, in
//! the order it was parked, and counts the round trips made meanwhile, so statistics, peaks,
//! snapshots and the blocks each request gets are what they would be without parking. While
//! recording, a thread logs the history events of what it parks and takes back, with the time
//! each happened and, for a block taken back, its new context (only from the place the thread
//! last allocated from through the lock, whose interned site it keeps); the pull merges the
//! logs into the history in time order, so each event is recorded once, each block carries
//! its allocation's context, and one thread's history is the one it would record without
//! parking. Buffers with a tensor description or used on another stream, and every buffer
//! while the history keeps context on frees ([`ContextLevel::All`](record::ContextLevel::All)),
//! are freed through the lock as before; an allocator one thread uses at a time never parks.
//!
//! Out of memory: when the backend refuses, the allocator releases its whole cache and retries
//! once, then returns [`Error::OutOfMemory`] with the request, the device's capacity and free
//! memory, what is allocated, what is reserved but unused, and the largest free block.
//!
//! ## Recording: who made each allocation
//!
//! Every allocation remembers its stack, its scope path, its thread and the step marker;
//! a bounded ring buffer keeps the allocator's events (PyTorch's actions: `alloc`,
//! `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `oom`, `snapshot`, plus
//! `segment_map`/`segment_unmap`). [`CachingAllocator::snapshot`] returns all of it as plain
//! serde data, symbolized.
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
//! let block = snap.live_blocks().next().unwrap();
//! let ctx = block.context.unwrap();
//! assert_eq!(snap.scope(ctx.scope).unwrap(), ["epoch", "forward"]); // ids are typed: StackId, ScopeId...
//! assert_eq!(ctx.step, 7);
//! for frame in snap.stack_frames(ctx.stack.unwrap()) {
//!     println!("  {frame}"); // file:line (function) of your code; vramscope's and std's frames trimmed
//! }
//! # drop(x);
//! # Ok::<(), vramscope::Error>(())
//! ```
//!
//! What is recorded is a [`RecordConfig`], changed at run time with
//! [`CachingAllocator::record_memory_history`] (like `torch.cuda.memory._record_memory_history`):
//! stacks [`StackMode::Fast`] (the default), [`StackMode::Full`] or off, a depth limit, scopes,
//! the history's size and which events carry context ([`ContextLevel`]).
//!
//! Stacks are return addresses captured at one `#[inline(never)]` site, each distinct stack
//! stored once per allocator, and resolved to file, line and function only when a snapshot is
//! taken, each address once. They need no build flags. On x86-64 Linux the fast mode
//! ([`fast_unwinder`] says which unwinder a process uses) reads the unwind tables that every
//! object carries for panics and C++ exceptions (`.eh_frame`), found through
//! `dl_iterate_phdr`, so it is exact without frame pointers and through C and C++ libraries
//! (libcuda, libcupti) that have none; the rule at each return address is read once per thread
//! and cached, and an allocation from a place the thread allocated from before only checks
//! that the stack slots the last walk read still hold the same values (the frame pointer
//! register and the slots it was saved to only where some frame's rule used them: without
//! frame pointers it is an ordinary register, holding anything). In a release build
//! without frame pointers a recorded pair costs about twice an unrecorded one, where the
//! `backtrace` crate's unwinder ([`StackMode::Full`]) costs 60 times (BENCHMARKS.md, "Stacks
//! as users build"). Libraries loaded later (`dlopen`) are found at their first frame; frames
//! the cached unwinder does not model (signal handlers, code generated at run time) are taken
//! by the `backtrace` crate's unwinder, counted by [`fast_fallbacks`]. Every read is checked
//! against the thread's stack bounds. A snapshot records which unwinder took its stacks
//! ([`Snapshot::stack_capture`]). Elsewhere (aarch64, macOS, Windows) the fast mode walks
//! frame pointers where a once-per-process check ([`frame_pointers_available`]) finds them
//! complete, and uses the `backtrace` crate's unwinder otherwise.
//!
//! Scopes are per thread: [`scope`] guards nest, [`current_scope`] and [`Scope::enter`] carry a
//! scope into a thread you spawn, [`Scope::wrap`] into an async task (a guard is tied to its
//! thread and cannot be held across an `.await` in a `Send` future), and with the cargo
//! feature `tracing`, `ScopeLayer` turns entered `tracing` spans into scopes, restoring them
//! by span when spans exit out of order.
//!
//! ## Reports
//!
//! [`report`] turns a [`Snapshot`] (from [`CachingAllocator::snapshot`], from JSON, or from a
//! PyTorch pickle, either of them gzipped or not, with [`Snapshot::load`]) into what a person
//! reads: [`report::live`], [`report::leaks`], [`report::diff`], [`report::segments`],
//! [`report::summary`], and [`report::folded`] stacks for `report::flamegraph` SVGs drawn by
//! `inferno` (cargo feature `flamegraph`, off by default: a test suite does not need it).
//! [`Snapshot::to_pytorch_pickle`] writes PyTorch's format for its own viewers. A report reads
//! one device: [`report::summary`] makes a table per device of a snapshot of several, and for
//! the others [`Snapshot::by_devices`] splits it (the command line does so for every report).
//! The site a report names is the program's own innermost line: in PyTorch's default
//! recordings, whose stacks hold its C++ frames around the Python ones, a Python line. What is
//! a library's and what is the program's can be said ([`report::FramePolicy`], the variables
//! `VRAMSCOPE_LIBRARY` and `VRAMSCOPE_USER_CODE`, the command line's `--library` and
//! `--user-code`): vendored crates, a helper every caller goes through.
//!
//! An empty list of leak candidates means "no leak" only where the history could show one:
//! [`report::leak_limits`] says where it could not (no history: PyTorch's
//! `enabled="state"`; no stacks: `context=None`; a history that starts mid-run: a full ring,
//! PyTorch's `max_entries`), and [`report::LeakCandidate::render_with_limits`] prints that
//! instead of "no leak candidates" (`fixtures/torch/variants`: one program recorded each way);
//! [`report::leaks_with_limits`] gives both from one replay of the history.
//!
//! ```
//! use vramscope::{report, Snapshot};
//! let snap = Snapshot::load(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch/leaky_train.snapshot.pickle"))?;
//! let leaks = report::leaks(&snap);
//! assert_eq!(leaks[0].site, "scripts/train_loops.py:76 (leaky_train)");
//! let limits = report::leak_limits(&snap);
//! assert_eq!(limits.frees_unseen, 0, "the history covers the whole run");
//! print!("{}", report::LeakCandidate::render_with_limits(&leaks, &limits));
//! # #[cfg(feature = "flamegraph")] {
//! let svg = report::flamegraph(&report::folded(&snap, report::FoldedKind::Live), "live memory")?;
//! # let _ = svg;
//! # }
//! # Ok::<(), vramscope::Error>(())
//! ```
//!
//! ## Backends
//!
//! - `CudaBackend` (cargo feature `cuda`): a CUDA device through `cudarc`, the driver loaded at
//!   run time (a missing driver or device is an error); virtual-memory segments whose free pages
//!   can be given back and which grow in place (the default) or `cuMemAlloc` ones
//!   (`CudaSegments`, `VRAMSCOPE_CUDA_SEGMENTS`), cudarc
//!   streams, reuse across streams gated by CUDA events, copies in order on the buffer's stream,
//!   blocks lent and segments taken over by another stream ordered after the owner by an event
//!   (the host does not wait). [`device`] picks it when a device is
//!   present. Its segment calls are costly, so the fragmentation limit rises on churn there
//!   ([`LimitMax::Auto`]). With `cuMemAlloc` segments, which cannot map a page twice, the peak
//!   is at most 1% over PyTorch's allocator's (`cuMemAlloc` segments too) on 61 of the 66
//!   fixture traces but over the better of PyTorch's and the pool's on 26: a warm pass without
//!   driver calls then lies in a fixed layout, and some passes fit none in their live peak (see
//!   "What no policy of this kind can reach" above; `BENCHMARKS.md`, "The whole table, PyTorch
//!   pass by pass on every trace").
//!
//!   Feature `cuda` builds on its own: it asks cudarc for CUDA 12.8 bindings and, unless
//!   something else asks for a linking mode, loads the driver at run time. Beside candle, burn
//!   or mistral.rs, which choose cudarc's CUDA version and linking mode themselves (candle:
//!   `dynamic-linking` and the toolkit's version), use feature `cuda-backend` instead: the same
//!   backend, choosing neither, so that cargo's union of features stays one that cudarc
//!   accepts.
//! - [`HostBackend`]: host memory with a capacity limit; buffers hold real data. The default
//!   without a GPU.
//! - [`SimBackend`]: address space only, any capacity, for replaying traces of any size.
//!   Made with [`with_costly_segments`](backend::SimBackend::with_costly_segments), it decides
//!   as on CUDA and names itself `sim-cuda` in reports and snapshots (`sim` otherwise; until
//!   2026-11-29 `sim` either way).
//! - [`FaultyBackend`]: fails chosen memory requests and stream waits of another backend, for
//!   testing OOM handling and streams that cannot be waited for.
//! - [`ExternalBackend`]: serves nothing; the backend of [`CachingAllocator::external`], which
//!   records memory the program allocated itself (`record_external`, `forget_external`) so
//!   that tests, snapshots and reports see it. The observer of CUDA allocations (cargo feature
//!   `cupti`, module `observe`) feeds one per device from CUPTI's callbacks.
//!
//! Implementing [`Backend`] yourself: `copy_to_device` and `copy_from_device` take the stream to
//! copy on, and `order_after` (by default a blocking `synchronize`) orders one stream after
//! another; the trait's `# Safety` section says what each promises. Since 2026-11-28 it also
//! asks that `stream_idle` answer as an event recorded at that moment would, and that the work
//! a stream was ordered after count as its own for its events and idleness (as on CUDA): the
//! allocator hands an idle stream's free memory to other streams.
//!
//! ## Configuration
//!
//! [`AllocatorConfig`] is a struct with documented defaults, also parsed from the
//! `VRAMSCOPE_ALLOC_CONF` environment variable in PyTorch's `key:value,key:value` form.
//! `VRAMSCOPE_BACKEND` (`cuda`, `host`, `sim`) and `VRAMSCOPE_CAPACITY` (e.g. `8GiB`) choose the
//! default device's backend; `VRAMSCOPE_OOM_SNAPSHOT` names where to write a snapshot when an
//! allocation runs out of memory.
//!
//! A smaller GPU, seen from a larger one: on CUDA, `VRAMSCOPE_CAPACITY` (and
//! [`AllocatorConfig::per_process_memory_fraction`], PyTorch's
//! `set_per_process_memory_fraction`) caps what the allocator may reserve. A request that would
//! pass the cap takes the road of one the device refuses: the cache is given back and the
//! request retried, then [`Error::OutOfMemory`] says what was allowed. The soft limit stays
//! under the cap. On an H200 the smallest cap each of the 17 single-stream fixture traces ran
//! under was 1.002–1.056 times its peak of allocated bytes with the default segments (1.013 in
//! geometric mean), where PyTorch's allocator needed 1.024–1.496 (1.127) and 1.009–1.149
//! (1.044) with expandable segments; the sim predicted every one of the 38 rows (`BENCHMARKS.md`,
//! "The smallest memory a program fits in"). That tight, most traces map and unmap pages in
//! every step: fitting costs driver calls that plentiful memory spares.
//!
//! ## Replaying traces
//!
//! [`replay`] replays a PyTorch snapshot's or a compact trace's allocations through the
//! allocator and measures time per operation and peak memory; the `vramscope replay` command
//! does the same from the command line. [`replay::smallest_cap`] (and `vramscope fit`) finds
//! the smallest memory they fit in.
//!
//! ## Where things are
//!
//! At the root: the allocator ([`CachingAllocator`], [`Buffer`], [`Stream`], [`Pod`]),
//! [`device`], scopes ([`scope`], [`step`], [`Scope`]), the [`Snapshot`], [`Error`], and the
//! macros. Then one module each for [`backend`]s, [`config`]uration, [`record`]ing, the
//! [`snapshot`] model, [`report`]s, [`stats`], [`replay`] and memory [`testing`].
//!
//! [`Backend`]: backend::Backend
//! [`HostBackend`]: backend::HostBackend
//! [`SimBackend`]: backend::SimBackend
//! [`FaultyBackend`]: backend::FaultyBackend
//! [`ExternalBackend`]: backend::ExternalBackend
//! [`AllocatorConfig`]: config::AllocatorConfig
//! [`AllocatorConfig::fragmentation_limit`]: config::AllocatorConfig::fragmentation_limit
//! [`AllocatorConfig::fragmentation_limit_max`]: config::AllocatorConfig::fragmentation_limit_max
//! [`AllocatorConfig::max_split_size`]: config::AllocatorConfig::max_split_size
//! [`AllocatorConfig::alias_pages`]: config::AllocatorConfig::alias_pages
//! [`AllocatorConfig::per_process_memory_fraction`]: config::AllocatorConfig::per_process_memory_fraction
//! [`LimitMax::Auto`]: config::LimitMax::Auto
//! [`RecordConfig`]: record::RecordConfig
//! [`StackMode::Fast`]: record::StackMode::Fast
//! [`StackMode::Full`]: record::StackMode::Full
//! [`ContextLevel`]: record::ContextLevel
//! [`frame_pointers_available`]: record::frame_pointers_available
//! [`fast_unwinder`]: record::fast_unwinder
//! [`fast_fallbacks`]: record::fast_fallbacks
//! [`Snapshot::stack_capture`]: snapshot::Snapshot::stack_capture

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub)]
#![warn(rustdoc::broken_intra_doc_links, rustdoc::private_intra_doc_links, rustdoc::bare_urls)]

mod alloc;
pub mod backend;
mod device;
pub mod error;
mod frames;
mod intern;
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
