//! What observing CUDA allocations (feature `cupti`) costs a program that allocates through
//! cudarc: `CudaStream::alloc` + drop pairs (`cuMemAllocAsync`, `cuMemFreeAsync`) unobserved,
//! observed with the default recording (a stack per allocation, unwound through CUPTI's and
//! the driver's frames), and observed with recording off (CUPTI's callbacks and the table
//! alone). The benchmarks run in that order (divan runs them by name), the unobserved ones
//! before observing starts. Then the same pairs, at one site and over 1,000 distinct stacks,
//! paused (`observe::pause`) and observed in turn, 31 rounds in one process: the figure for the
//! observer's cost on a host whose speed drifts between separate benchmarks (BENCHMARKS.md,
//! "Observed and paused in turn"). The 1,000-stack benchmark checks that every recorded frame
//! is at its calling line. Without a device or CUPTI it prints why and measures nothing.
//!
//! `cargo bench --features cupti,cuda --bench observe`

use cudarc::driver::{CudaContext, CudaStream};
use divan::{black_box, Bencher};
use std::sync::{Arc, OnceLock};
use vramscope::record::RecordConfig;

static STREAM: OnceLock<Arc<CudaStream>> = OnceLock::new();

fn main() {
    match std::panic::catch_unwind(|| CudaContext::new(0)) {
        Ok(Ok(ctx)) => {
            STREAM.get_or_init(|| ctx.new_stream().unwrap());
            divan::main();
            interleaved();
        }
        Ok(Err(e)) => eprintln!("skipped: no CUDA device: {e}"),
        Err(_) => eprintln!("skipped: no CUDA driver"),
    }
}

/// One 512-byte pair at one site.
fn one_pair(stream: &Arc<CudaStream>) {
    // SAFETY: the memory is never read; it is freed when the slice drops.
    let b = unsafe { stream.alloc::<u8>(black_box(512)) }.unwrap();
    drop(black_box(b));
}

fn pair(bencher: Bencher) {
    let stream = STREAM.get().expect("set in main");
    one_pair(stream);
    bencher.bench_local(|| one_pair(stream));
    stream.synchronize().unwrap();
}

/// 25 allocating functions, each reached through 1 to 40 recursive calls: 1,000 distinct
/// stacks, so that no per-site cache hides the unwind.
/// (Each asks for its own size, so that the compiler cannot merge the 25 into one.)
macro_rules! leaves {
    ($($name:ident $extra:literal)*) => {
        $(
            #[inline(never)]
            fn $name(stream: &Arc<CudaStream>) {
                // SAFETY: never read; freed when dropped.
                let b = unsafe { stream.alloc::<u8>(black_box(512 + $extra)) }.unwrap(); // leaf alloc
                drop(black_box(b));
            }
        )*
        const LEAVES: &[fn(&Arc<CudaStream>)] = &[$($name),*];
    };
}
leaves!(l0 0 l1 1 l2 2 l3 3 l4 4 l5 5 l6 6 l7 7 l8 8 l9 9 l10 10 l11 11 l12 12 l13 13 l14 14 l15 15 l16 16
    l17 17 l18 18 l19 19 l20 20 l21 21 l22 22 l23 23 l24 24);

/// `depth` frames of recursion, then the leaf: a return address per level.
#[inline(never)]
fn down(depth: usize, stream: &Arc<CudaStream>, leaf: fn(&Arc<CudaStream>)) {
    if depth == 0 {
        leaf(stream); // down calls leaf
    } else {
        down(black_box(depth - 1), stream, leaf); // down recurses
    }
    // Neither call is a tail call: each level keeps its frame.
    black_box(depth);
}

/// Pair `i` of the 1,000 stacks (leaf `i % 25`, `1 + i / 25` levels deep); moves `i` on.
fn stack_pair(i: &mut usize, stream: &Arc<CudaStream>) {
    let (leaf, depth) = (LEAVES[*i % LEAVES.len()], 1 + (*i / LEAVES.len()) % 40);
    down(depth, stream, leaf);
    *i = (*i + 1) % 1000;
}

fn pairs_over_1000_stacks(bencher: Bencher) {
    let stream = STREAM.get().expect("set in main");
    let mut i = 0usize;
    bencher.bench_local(|| stack_pair(&mut i, stream));
    stream.synchronize().unwrap();
}

/// The same pairs observed and not, in turn, in one process: 31 rounds, each timing 2,000
/// pairs paused (`observe::pause`: CUPTI calls nothing back) and then 2,000 observed with the
/// default recording, so that both halves of a round meet the same host. Prints the medians
/// and the median of the rounds' ratios (observed over paused), at one site and over the
/// 1,000 stacks. A noisy host moves both halves of a round together; separate benchmarks run
/// seconds apart do not.
fn interleaved() {
    if vramscope::observe::start().is_err() {
        return;
    }
    let stream = STREAM.get().expect("set in main");
    let mut i = 0usize;
    type Pair<'a> = Box<dyn FnMut() + 'a>;
    let mut cases: [(&str, Pair); 2] =
        [("one site", Box::new(|| one_pair(stream))), ("1,000 stacks", Box::new(move || stack_pair(&mut i, stream)))];
    println!("\ninterleaved, {} pairs a half, 31 rounds: median ns a pair (paused, observed), ratio", 2000);
    for (name, pair) in cases.iter_mut() {
        let mut time = |n: usize| {
            let t = std::time::Instant::now();
            for _ in 0..n {
                pair();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        time(2000);
        let (mut off, mut on, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..31 {
            vramscope::observe::pause().unwrap();
            let a = time(2000);
            vramscope::observe::resume().unwrap();
            let b = time(2000);
            off.push(a);
            on.push(b);
            ratio.push(b / a);
        }
        stream.synchronize().unwrap();
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (lo, hi) = (ratio.iter().copied().fold(f64::MAX, f64::min), ratio.iter().copied().fold(0.0, f64::max));
        println!(
            "{name}: paused {:.0} ns, observed {:.0} ns, ratio {:.2}x (rounds {lo:.2}-{hi:.2}x)",
            median(&mut off),
            median(&mut on),
            median(&mut ratio)
        );
    }
}

/// 512-byte pairs before observing starts.
#[divan::bench(sample_count = 100, sample_size = 100)]
fn a_cudarc_pair_unobserved(bencher: Bencher) {
    pair(bencher);
}

/// The same pairs, each from one of 1,000 distinct stacks, before observing starts.
#[divan::bench(sample_count = 100, sample_size = 100)]
fn a_cudarc_pair_unobserved_1000_stacks(bencher: Bencher) {
    pairs_over_1000_stacks(bencher);
}

/// Observed, default recording, each pair from one of 1,000 distinct stacks.
#[divan::bench(sample_count = 100, sample_size = 100)]
fn b_cudarc_pair_observed_1000_stacks(bencher: Bencher) {
    if vramscope::observe::start().is_err() {
        return;
    }
    pairs_over_1000_stacks(bencher);
    // Each allocation was recorded with its own stack, each frame at its own calling line:
    // every frame of `down` at the recursive call (the innermost at the call of the leaf), the
    // leaf at its allocation. Count the distinct (leaf, depth) pairs the snapshot holds (those
    // its history still names).
    if let Some(a) = vramscope::observe::allocator(0) {
        let snap = a.snapshot();
        let line = |marker: &str| {
            1 + include_str!("observe.rs").lines().position(|l| l.ends_with(marker)).expect("marker") as u32
        };
        let (alloc_line, leaf_call, recursion) =
            (line("// leaf alloc"), line("// down calls leaf"), line("// down recurses"));
        let mut seen = std::collections::BTreeSet::new();
        let mut wrong = Vec::new();
        for s in 0..snap.stacks.len() {
            let frames: Vec<_> = snap.stack_frames(vramscope::snapshot::StackId(s as u32)).collect();
            let Some(leaf_at) = frames.iter().position(|f| f.function.starts_with("observe::l")) else { continue };
            let downs: Vec<_> =
                frames[leaf_at + 1..].iter().take_while(|f| f.function.starts_with("observe::down")).collect();
            let expected = std::iter::once(alloc_line)
                .chain(std::iter::once(leaf_call))
                .chain(std::iter::repeat_n(recursion, downs.len().saturating_sub(1)));
            let got = std::iter::once(&frames[leaf_at]).chain(downs.iter().copied()).map(|f| f.line.unwrap_or(0));
            if !got.clone().eq(expected.clone()) || downs.is_empty() {
                wrong.push(format!(
                    "stack {s}: lines {:?}, expected {:?}",
                    got.collect::<Vec<_>>(),
                    expected.collect::<Vec<_>>()
                ));
            }
            seen.insert((frames[leaf_at].function.clone(), downs.len()));
        }
        eprintln!(
            "observed: {} stacks in the snapshot, {} distinct (leaf, depth) pairs, {} with a frame not at its calling line",
            snap.stacks.len(),
            seen.len(),
            wrong.len()
        );
        assert!(wrong.is_empty(), "frames not at their calling lines:\n{}", wrong[..wrong.len().min(5)].join("\n"));
    }
}

/// Observed, default recording (stacks, scopes, history).
#[divan::bench(sample_count = 100, sample_size = 100)]
fn b_cudarc_pair_observed(bencher: Bencher) {
    if let Err(e) = vramscope::observe::start() {
        eprintln!("skipped: {e}");
        return;
    }
    pair(bencher);
}

/// Observed, recording off: CUPTI's callbacks and the table of what is live.
#[divan::bench(sample_count = 100, sample_size = 100)]
fn c_cudarc_pair_observed_recording_off(bencher: Bencher) {
    if vramscope::observe::start().is_err() {
        return;
    }
    // The observed allocator exists once something was allocated under observation.
    let stream = STREAM.get().expect("set in main");
    // SAFETY: never read; freed at once.
    drop(unsafe { stream.alloc::<u8>(512) }.unwrap());
    if let Some(a) = vramscope::observe::allocator(0) {
        a.record_memory_history(RecordConfig::off());
    }
    pair(bencher);
}
