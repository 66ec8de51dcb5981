//! Trace replay: the fixture traces and synthetic workloads the allocator was not tuned on.

use vramscope::replay::{replay, ReplayOptions, Trace, TraceEvent, TraceOp};
use vramscope::{backend::HostBackend, backend::SimBackend, config::AllocatorConfig, CachingAllocator};

fn fixture(name: &str) -> String {
    format!("{}/fixtures/torch/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A gzipped JSON file (a fixture trace as committed), read whole.
fn gzipped_json(path: impl AsRef<std::path::Path>) -> serde_json::Value {
    serde_json::from_reader(flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())).unwrap()
}

fn run(trace: &Trace, config: &str) -> vramscope::replay::ReplayReport {
    let alloc =
        CachingAllocator::with_config(SimBackend::new(1 << 40), AllocatorConfig::parse(config).unwrap()).unwrap();
    let mut opts = ReplayOptions::default();
    opts.warm_passes = 2;
    let r = replay(&alloc, trace, &opts).unwrap();
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.memory_allocated(), 0, "every buffer was dropped");
    r
}

/// Replays `trace` with `config` and `warm_passes` warm passes on a sim whose segment calls
/// are costly (as CUDA's: the fragmentation limit rises on churn), invariants checked after.
fn run_costly(trace: &Trace, config: &str, warm_passes: usize) -> vramscope::replay::ReplayReport {
    let backend = SimBackend::new(1 << 40).with_costly_segments(true);
    let alloc = CachingAllocator::with_config(backend, AllocatorConfig::parse(config).unwrap()).unwrap();
    let mut opts = ReplayOptions::default();
    opts.warm_passes = warm_passes;
    let r = replay(&alloc, trace, &opts).unwrap();
    alloc.check_invariants().unwrap();
    r
}

/// The fragmentation targets of the fixtures: at most the better of PyTorch's caching allocator
/// and the cudaMallocAsync pool (fixtures/torch/README.md).
#[test]
fn fixture_traces_meet_the_fragmentation_targets() {
    for (name, target) in [("resnet_train", 1.12), ("leaky_train", 1.08)] {
        let json = Trace::from_file(fixture(&format!("{name}.trace.json.gz"))).unwrap();
        let pickle = Trace::from_file(fixture(&format!("{name}.snapshot.pickle"))).unwrap();
        assert_eq!(json.events, pickle.events, "{name}: the pickle's device_traces and the JSON trace agree");
        let r = run(&json, "");
        assert_eq!(r.skipped, 0);
        assert!(r.fragmentation <= target, "{name}: peak reserved / peak live = {:.3} > {target}", r.fragmentation);
    }
}

/// With the fragmentation limit off and segments that do not grow (PyTorch's defaults), the
/// allocator reserves exactly what PyTorch's did on the recorded run (fixtures/torch/README.md:
/// 3.62 GB and 151 MB).
#[test]
fn pytorch_like_configuration_reproduces_pytorch_peaks() {
    let pytorch = "fragmentation_limit:off,expandable_segments:False,share_idle_streams:False";
    let r = run(&Trace::from_file(fixture("resnet_train.trace.json.gz")).unwrap(), pytorch);
    assert_eq!(r.peak_reserved_bytes, 3_617_587_200);
    let r = run(&Trace::from_file(fixture("leaky_train.trace.json.gz")).unwrap(), pytorch);
    assert_eq!(r.peak_reserved_bytes, 150_994_944);
    assert_eq!(r.warm_device_allocs, 0, "a PyTorch-like cache needs no new segment when warm");
}

/// On a backend whose segment calls are costly (CUDA: tens of microseconds each, and
/// `cuMemFree` synchronizes the device), the default configuration lets the fragmentation limit
/// rise on churn until warm passes call the backend no more, and still reserves no more than
/// PyTorch's caching allocator or CUDA's pool did on the recorded runs (the allocator's memory target:
/// resnet_train 1.209x and 1.121x, leaky_train 1.082x and 1.684x), but on one row: with
/// segments that grow in place, `leaky_train` reserves 1.1125 times its peak, not 1.082, since
/// the free end of a growing range is taken last (`Heap::is_wilderness`): its first small
/// tensors (one of them kept to the end of the run) now lie in a 2 MiB hole that its 1 MiB
/// requests then found split, where best fit had put them in the range's nearly used-up free end
/// (BENCHMARKS.md, "The free end last"). That row is held here to what it reserves now.
#[test]
fn costly_segments_settle_without_warm_backend_calls() {
    for (name, pytorch, pool) in [("resnet_train", 1.209, 1.121), ("leaky_train", 1.082, 1.684)] {
        let trace = Trace::from_file(fixture(&format!("{name}.trace.json.gz"))).unwrap();
        for pages in [false, true] {
            let r = run_costly(&trace, &format!("release_pages:{pages}"), ReplayOptions::default().warm_passes);
            let limit = r.fragmentation_limit.unwrap();
            // Segments that grow in place (pages) may need no rise at all.
            let rose = limit > 1.05 || pages;
            assert!(rose && limit <= vramscope::config::LimitMax::AUTO_CEILING, "{name}: limit {limit}");
            assert_eq!((r.warm_device_allocs, r.warm_device_maps), (0, 0), "{name}, pages {pages}: {r:?}");
            let best = if pages && name == "leaky_train" { 1.1125 } else { f64::min(pytorch, pool) };
            assert!(r.fragmentation <= best + 0.0005, "{name}, pages {pages}: {:.4} > {best}", r.fragmentation);
        }
        // On the sim backend (cheap calls) the limit holds.
        let r = run(&trace, "");
        assert_eq!(r.fragmentation_limit, Some(1.05));
    }
}

/// The six traces (two of them held out of tuning: `llm_generate_kv`,
/// `unet_diffusion`), with both segment kinds, on a backend whose segment calls are costly: the
/// limit settles within the first warm pass, so the second calls the backend no more, and peak
/// reserved stays at most PyTorch's caching allocator's on the same trace (`torch_replay.py` on
/// an H100, peak reserved over peak live, BENCHMARKS.md). `pipeline_streams` is
/// left out of the peak comparison: PyTorch's replay runs it on one stream.
///
/// With segments that grow in place (pages), peak reserved is also at most the pool's
/// (`cudaMallocAsync`, same run) on every single-stream trace. `llm_generate_kv`, held out, met
/// the pool's 1.006 only once small requests were served from the growing range too (1.003;
/// 1.043 before, with 2 MiB small segments beside it).
#[test]
fn every_new_trace_settles_within_one_warm_pass_where_segments_are_costly() {
    for (name, pytorch, pool) in [
        ("transformer_varlen", 1.501, 1.099),
        ("llm_generate_kv", 1.065, 1.006),
        ("amp_grad_scaler", 1.293, 1.412),
        ("grad_accum_checkpoint", 1.077, 1.654),
        ("pipeline_streams", f64::INFINITY, f64::INFINITY),
        ("unet_diffusion", 1.226, 1.248),
    ] {
        let trace = Trace::from_file(fixture(&format!("{name}.trace.json.gz"))).unwrap();
        for pages in [false, true] {
            let r = run_costly(&trace, &format!("release_pages:{pages}"), 2);
            assert_eq!((r.warm_device_allocs, r.warm_device_maps), (0, 0), "{name}, pages {pages}: {r:?}");
            assert!(r.fragmentation <= pytorch, "{name}, pages {pages}: {:.3} > PyTorch's {pytorch}", r.fragmentation);
            if pages {
                assert!(r.fragmentation <= pool, "{name}, growing: {:.3} > the pool's {pool}", r.fragmentation);
            }
        }
    }
}

/// Replays each fixture trace `(name, PyTorch's peak, the pool's peak)` with both segment kinds
/// on a costly sim, three warm passes: the third calls the backend for no memory, and with
/// segments that grow in place the peak is at most the better of PyTorch's and the pool's.
fn settle_by_the_third_warm_pass(traces: &[(&str, f64, f64)]) {
    for &(name, pytorch, pool) in traces {
        let trace = Trace::from_file(fixture(&format!("{name}.trace.json.gz"))).unwrap();
        for pages in [false, true] {
            let r = run_costly(&trace, &format!("release_pages:{pages}"), 3);
            assert_eq!((r.warm_device_allocs, r.warm_device_maps), (0, 0), "{name}, pages {pages}: {r:?}");
            if pages {
                assert!(r.fragmentation <= pytorch.min(pool), "{name}, growing: {:.3}", r.fragmentation);
            }
        }
    }
}

/// The five traces recorded later (`gpt2_generate`, `gan_train` and
/// `encoder_serving` held out of tuning), with both segment kinds on a backend whose segment
/// calls are costly: none calls the backend in its third warm pass. Segments that grow in
/// place reserve at most PyTorch's caching allocator's peak on each (`torch_replay.py` on an
/// H100, peak reserved over peak live, in the same command as the recording:
/// `docs/lab/runs/h100-workloads-later.log`), and at most the pool's (same
/// log) but on `gnn_random_graphs` and `encoder_serving`, where they miss it (BENCHMARKS.md).
#[test]
fn later_traces_settle_by_the_third_warm_pass() {
    settle_by_the_third_warm_pass(&[
        ("gpt2_train", 1.105, 1.021),
        ("gnn_random_graphs", 1.873, f64::INFINITY),
        ("gpt2_generate", 1.258, 1.057),
        ("gan_train", 1.322, 1.743),
        ("encoder_serving", 2.302, f64::INFINITY),
    ]);
}

/// Six traces of workloads nobody here had seen (replayed once on an
/// H200 with the code that preceded them; all six held out of tuning, fixtures/torch/README.md):
/// with both segment kinds on a backend whose segment calls are costly, none calls the backend
/// in its third warm pass (on the GPU, with that code, none called after its first). Segments
/// that grow in place reserve at most PyTorch's peak on each (`torch_replay.py` in the same
/// command, peak reserved over peak live: `docs/lab/runs/h200-unseen.log`),
/// and at most the pool's (on `lstm_packed` since the free end of a growing range is taken
/// last: 1.112 against the pool's 1.130, which maps memory in every warm pass, its warm passes'
/// allocations lying in 1.47 times the pages it holds, same log; 1.249 before; on
/// `prefetch_side_stream` since one range grows beside other streams' segments (1.049 against
/// the pool's 1.0975 on its streams, `...-h200-run-sh-5.log`; 1.108 before, BENCHMARKS.md, "One
/// range grows beside other streams").
#[test]
fn unseen_traces_settle_by_the_third_warm_pass() {
    settle_by_the_third_warm_pass(&[
        ("moe_train", 1.127, 1.081),
        ("beam_search", 1.167, 1.031),
        ("multiscale_train", 1.914, 1.101),
        ("lstm_packed", 2.320, 1.1301),
        ("speculative_decode", 1.073, 1.006),
        ("prefetch_side_stream", 1.928, 1.0975),
    ]);
}

/// Seven more workloads nobody here had seen (written, recorded and replayed once on an H200 on
/// against the code of e7f3968; all seven held out of tuning,
/// fixtures/torch/README.md): with both segment kinds on a backend whose segment calls are
/// costly, none calls the backend after its second warm pass (on the GPU none called after its
/// second, as the sim had said, call for call). Against the better of PyTorch's caching
/// allocator and the pool (`torch_replay.py` in the same command, peak reserved over peak live,
/// rounded up; `grad_buckets_streams` on its two streams, `torch_streams.py`; log
/// `docs/lab/runs/h200-fresh.log`), `cuMemAlloc` segments reserve at most 1%
/// more (the allocator's target for the kind that is not the default) and segments that grow in
/// place at most as much, but on two traces, which the GPU measured missing it and which are
/// held here to no more than it measured: `activation_offload` (1.0225 against PyTorch's
/// 1.0162; 1.0263 since the free end of a growing range is taken last, BENCHMARKS.md, "The free
/// end last") and `grad_buckets_streams` (1.0720 against PyTorch's 1.0606 on its streams;
/// 1.0658 since no hole is unmapped on several streams, measured on the H200 too:
/// `...-h200-no-hole-streams.log`; 1.0729 since one range grows beside other streams'
/// segments, BENCHMARKS.md, "One range grows beside other streams").
#[test]
fn fresh_traces_settle_by_the_third_warm_pass() {
    settle_against_the_better_peak(&[
        ("activation_offload", 1.0162, Some(1.0263), None),
        ("clip_contrastive", 1.1662, None, None),
        ("grad_buckets_streams", 1.0606, Some(1.0729), None),
        ("lora_finetune", 1.1496, None, None),
        ("paged_kv_serving", 1.1662, None, None),
        ("recsys_sparse", 1.0244, None, None),
        ("vit_varres", 1.1226, None, None),
    ]);
}

/// Replays each trace `(name, better of PyTorch's and the pool's peak, what virtual and what
/// `cuMemAlloc` segments reserved where they missed it)` with both segment kinds on a costly
/// sim, three warm passes: the third calls the backend for no memory, and each kind reserves
/// at most what it missed by, or else the better peak (virtual) or 1% more (`cuMemAlloc`,
/// the allocator's target for the kind that is not the default).
fn settle_against_the_better_peak(traces: &[(&str, f64, Option<f64>, Option<f64>)]) {
    let traces: Vec<SettleRow> =
        traces.iter().map(|&(name, best, grown, malloc)| (name, best, grown, malloc, 2)).collect();
    settle_by_against_the_better_peak(&traces, 3);
}

/// A row of [`settle_by_against_the_better_peak`]: name, the better of PyTorch's and the pool's
/// peak, what virtual and what `cuMemAlloc` segments reserved where they missed it, and the warm
/// passes before `cuMemAlloc` segments call the backend no more.
type SettleRow<'a> = (&'a str, f64, Option<f64>, Option<f64>, usize);

/// [`settle_against_the_better_peak`] with `warm` warm passes, where `cuMemAlloc` segments may
/// call the backend up to the warm pass given last in each row (and must in it, where that is
/// later than the second: a miss pinned, which the row is to be updated from once mended).
fn settle_by_against_the_better_peak(traces: &[SettleRow], warm: usize) {
    for &(name, best, grown, malloc, malloc_last) in traces {
        let trace = Trace::from_file(fixture(&format!("{name}.trace.json.gz"))).unwrap();
        for pages in [false, true] {
            let r = run_costly(&trace, &format!("release_pages:{pages}"), warm);
            let last = if pages { 2 } else { malloc_last };
            assert!(r.warm_device_calls[last..].iter().all(|&c| c == 0), "{name}, pages {pages}: {r:?}");
            if last > 2 {
                assert!(r.warm_device_calls[last - 1] > 0, "{name}, pages {pages}: settles earlier now: {r:?}");
            }
            let bound = if pages { grown.unwrap_or(best) } else { malloc.unwrap_or(best * 1.01) };
            assert!(r.fragmentation <= bound, "{name}, pages {pages}: {:.4} > {bound:.4}", r.fragmentation);
        }
    }
}

/// Six workloads written after the free end of a growing range was made the last choice
/// (`NEWEST` in fixtures/torch/workloads.py; recorded and replayed once on an H200;
/// all six held out): with both segment kinds on a backend
/// whose segment calls are costly, none calls the backend after its second warm pass (on the
/// GPU none called in any warm pass but one `cuMemAlloc` in the first of `chunked_prefill`,
/// as the sim said, 24 of 24 runs byte for byte). Against the better of PyTorch's caching
/// allocator and the pool (`torch_replay.py` in the same command, peak reserved over peak live,
/// rounded up; `ema_side_stream` on its two streams, `torch_streams.py`; log
/// `docs/lab/runs/h200-run-sh-5.log`), each kind is held to the target where
/// the GPU met it and to what the GPU measured where it missed: virtual segments on
/// `progressive_unfreeze` (1.0460 against PyTorch's 1.0349) and `ema_side_stream` (1.1951
/// against the pool's 1.0378), `cuMemAlloc` ones on four.
#[test]
fn newest_traces_settle_by_the_third_warm_pass() {
    settle_against_the_better_peak(&[
        ("chunked_prefill", 1.0838, None, Some(1.2053)),
        ("detection_boxes", 1.0592, None, Some(1.0972)),
        ("dit_cfg_sampling", 1.3172, None, None),
        ("ema_side_stream", 1.0378, Some(1.1951), Some(1.3415)),
        ("progressive_unfreeze", 1.0349, Some(1.0460), None),
        ("seq2seq_speech", 1.2248, None, Some(1.4250)),
    ]);
}

/// Nine workloads nobody here had seen (`DECEMBER` in fixtures/torch/workloads.py: written on
/// to judge a placement rule set before they were recorded,
/// then recorded and replayed once on an H200 against the code of c02a72f; all nine held out,
/// fixtures/torch/README.md). Against the better of PyTorch's caching allocator and the pool
/// (`torch_replay.py` in the same command, peak reserved over peak live, rounded up; log
/// `docs/lab/runs/h200-december.log`, whose vramscope rows the sim gives byte
/// for byte and call for call), each kind is held to the target where the GPU met it
/// (virtual segments at most the better peak, `cuMemAlloc` ones at most 1% more: the
/// targets) and to what the GPU measured where it missed: both kinds on `dqn_replay_growing`,
/// `nerf_rays` and `wavenet_varlen`, where the pool maps memory in every warm pass (its warm
/// allocations lie in 1.13 to 1.57 times the pages it holds: `...-december-pool-pages.log`).
/// Every replay makes no backend call after its second warm pass but one: with `cuMemAlloc`
/// segments `nerf_rays` calls in its third and fourth (10 and 4 calls: each step's largest
/// blocks are of a new size, larger than the cached segment a reclaim gives back for them; a
/// miss of the allocator's settling target, BENCHMARKS.md), and none from its fifth.
#[test]
fn december_traces_settle_against_the_better_peak() {
    settle_by_against_the_better_peak(
        &[
            ("causal_lm_sft", 1.1597, None, None, 2),
            ("ctc_speech_varlen", 1.2081, None, None, 2),
            ("detr_varres", 1.2721, None, None, 2),
            ("dqn_replay_growing", 1.0561, Some(1.3167), Some(1.1813), 2),
            ("multicrop_ssl", 1.2305, None, None, 2),
            ("nerf_rays", 1.0106, Some(1.0209), Some(1.1014), 4),
            ("seq2seq_greedy_serving", 1.2326, None, None, 2),
            ("unet3d_crops", 1.4740, None, None, 2),
            ("wavenet_varlen", 1.1815, Some(1.2190), Some(1.3403), 2),
        ],
        5,
    );
}

/// The least height of a fixed layout of `blocks` (size, first event, event that frees it): each
/// block at one address for its whole lifetime, no two live at once overlapping. Exhaustive:
/// blocks are placed in order of address, each at 0 or on top of one placed before it and live
/// with it (every layout pushed down takes that form without rising).
fn least_fixed_height(blocks: &[(u64, usize, usize)]) -> u64 {
    fn place(blocks: &[(u64, usize, usize)], at: &mut [Option<u64>], lowest: u64, top: u64, best: &mut u64) {
        if top >= *best {
            return;
        }
        if at.iter().all(Option::is_some) {
            *best = top;
            return;
        }
        let meets = |i: usize, j: usize| blocks[i].1 < blocks[j].2 && blocks[j].1 < blocks[i].2;
        for i in 0..blocks.len() {
            if at[i].is_some() {
                continue;
            }
            let mut candidates: Vec<u64> = std::iter::once(0)
                .chain(
                    (0..blocks.len()).filter(|&j| j != i && meets(i, j)).filter_map(|j| at[j].map(|a| a + blocks[j].0)),
                )
                .filter(|&c| c >= lowest)
                .collect();
            candidates.sort_unstable();
            candidates.dedup();
            for c in candidates {
                let clash = (0..blocks.len()).any(|j| {
                    j != i && meets(i, j) && at[j].is_some_and(|a| c < a + blocks[j].0 && a < c + blocks[i].0)
                });
                if !clash {
                    at[i] = Some(c);
                    place(blocks, at, c, top.max(c + blocks[i].0), best);
                    at[i] = None;
                }
            }
        }
    }
    let mut best = blocks.iter().map(|b| b.0).sum();
    place(blocks, &mut vec![None; blocks.len()], 0, 0, &mut best);
    best
}

/// `staggered_buffers` (fixtures/torch/workloads.py, recorded on an H200): three 256 MiB buffers
/// with staggered lifetimes and a scratch tensor per stage filling 1 GiB. No fixed layout holds
/// one step in less than 1.25 GiB (searched here, independently of the allocator), so an
/// allocator that makes no backend call in a pass and maps each page at one address reserves at
/// least 1.25 times live once it settles; the `cudaMallocAsync` pool, mapping in every pass,
/// reserved exactly the live peak on the GPU and PyTorch's allocator 2.25 times it
/// (`docs/lab/runs/h200-staggered.log`). The allocator's peak target (at most the
/// better of the two, with no warm driver call after the second warm pass) cannot be met here
/// by either segment kind as built: both settle at 1.5 (as on the GPU), above the bound.
#[test]
fn staggered_buffers_fit_no_fixed_layout_in_their_live_peak() {
    let path = fixture("staggered_buffers.trace.json.gz");
    let json = gzipped_json(&path);
    let events = json["events"].as_array().unwrap();
    let step = &events[..16];
    let mut open = std::collections::HashMap::new();
    let mut blocks = Vec::new();
    for (t, e) in step.iter().enumerate() {
        let (op, addr, size) = (e[0].as_str().unwrap(), e[1].as_u64().unwrap(), e[2].as_u64().unwrap());
        if op == "a" {
            open.insert(addr, (size, t));
        } else {
            let (size, start) = open.remove(&addr).unwrap();
            blocks.push((size, start, t));
        }
    }
    assert!(open.is_empty() && blocks.len() == 8, "one step: 8 blocks allocated and freed");
    let live = (0..step.len()).map(|t| blocks.iter().filter(|b| b.1 <= t && t < b.2).map(|b| b.0).sum::<u64>()).max();
    assert_eq!(live, Some(1 << 30));
    let bound = least_fixed_height(&blocks);
    assert_eq!(bound, 5 << 28, "no fixed layout of one step fits in less than 1.25 GiB");
    assert_eq!(
        least_fixed_height(&blocks[..7]),
        1 << 30,
        "without the third buffer (the last block freed) one step fits in 1 GiB"
    );

    let trace = Trace::from_file(&path).unwrap();
    for conf in ["release_pages:false", "release_pages:true,alias_pages:false"] {
        let r = run_costly(&trace, conf, 4);
        assert_eq!(r.peak_live_bytes, 1 << 30);
        assert!(r.warm_device_calls[2..].iter().all(|&c| c == 0), "{conf}: {r:?}");
        assert!(r.peak_reserved_bytes >= bound, "{conf}: settled below the bound: {r:?}");
        assert_eq!(r.peak_reserved_bytes, 3 << 29, "{conf}: as on the GPU: {r:?}");
    }
    // Views of the range's free pages (the default) are no fixed layout: a buffer lies at its
    // view's addresses, its memory wherever the range had free pages. The peak is the live one.
    let r = run_costly(&trace, "", 4);
    assert_eq!(r.peak_reserved_bytes, 1 << 30, "views: {r:?}");
    assert!(r.warm_device_calls.iter().all(|&c| c == 0), "views: {r:?}");
}

/// Six workloads written to judge a model of aliasing on growth on data nobody had seen
/// (`ALIASING` in fixtures/torch/workloads.py: written
/// with the rule that judged the model set before they were recorded; recorded and replayed
/// once on an H200; held out, fixtures/torch/README.md). Against the better of PyTorch's caching
/// allocator and the pool (`torch_replay.py` in the same command, rounded up;
/// `tests/gpu/targets-aliasing-6.json`; log `docs/lab/runs/h200-aliasing-six.log`,
/// whose vramscope rows the sim gives to the fourth decimal, call for call), virtual segments
/// meet the target on all six and `cuMemAlloc` ones are within 1% of it on five, held to what
/// the GPU measured on `beam_fork_serving` (1.2290 against the pool's 1.1483). No replay calls
/// the backend after its second warm pass.
#[test]
fn aliasing_traces_settle_against_the_better_peak() {
    settle_by_against_the_better_peak(
        &[
            ("beam_fork_serving", 1.1483, None, Some(1.2290), 2),
            ("gru_tbptt", 1.3090, None, None, 2),
            ("sage_sampled", 1.5719, None, None, 2),
            ("segmentation_varres", 1.3456, None, None, 2),
            ("token_drop_vit", 1.2349, None, None, 2),
            ("vqvae_varbatch", 1.6315, None, None, 2),
        ],
        4,
    );
}

/// Six workloads nobody here had seen (`WINTER` in fixtures/torch/workloads.py: written on
/// the rule that judged them set before they were recorded,
/// then recorded and replayed once on an H200 with the code of 0fb08d9; all six held out,
/// fixtures/torch/README.md). Against the better of PyTorch's caching allocator and the pool
/// (`torch_replay.py` in the same command, rounded up; `three_stream_serving` against both on its
/// own four streams, `torch_streams.py`; log `docs/lab/runs/h200-winter.log`,
/// whose vramscope rows the sim gives byte for byte, call for call), virtual segments meet the
/// target on all six and `cuMemAlloc` ones within 1% on three, held to what the GPU measured on
/// the other three. No replay calls the backend after its second warm pass.
#[test]
fn winter_traces_settle_against_the_better_peak() {
    settle_by_against_the_better_peak(
        &[
            ("linear_attn_varlen", 1.2679, None, None, 2),
            ("moco_queue", 1.2078, None, None, 2),
            ("three_stream_serving", 1.2583, None, Some(1.4943), 2),
            ("train_eval_interleaved", 1.2834, None, None, 2),
            ("tts_autoregressive", 1.1269, None, Some(1.1621), 2),
            ("vae_decode_varres", 1.1095, None, Some(1.1691), 2),
        ],
        4,
    );
}

/// Six more workloads nobody here had seen (`ADVENT` in fixtures/torch/workloads.py: written on
/// the rule that judged them set before they were recorded, then
/// recorded and replayed once on an H200 with the code of 18eb736; all six held out,
/// fixtures/torch/README.md). Against the better of PyTorch's caching allocator and the pool
/// (`torch_replay.py` in the same command, rounded up; `fsdp_layer_gather` against both on its
/// own two streams, `torch_streams.py`; logs `docs/lab/runs/h200-advent*.log`,
/// whose vramscope rows the sim gives byte for byte, call for call), virtual segments meet the
/// target on all six and `cuMemAlloc` ones within 1% on four, held to what the GPU measured on
/// the other two. `fsdp_layer_gather` calls the backend twice in its second warm pass with
/// either kind (pages mapped; a segment given back and one reserved), none after; the others
/// none after the first.
#[test]
fn advent_traces_settle_against_the_better_peak() {
    settle_by_against_the_better_peak(
        &[
            ("chunked_vocab_loss", 1.0129, None, Some(1.0977), 2),
            ("fsdp_layer_gather", 1.2223, None, None, 2),
            ("lbfgs_fit", 1.2983, None, None, 2),
            ("quant_dequant_serving", 1.1943, None, Some(1.2853), 2),
            ("ssm_scan_varlen", 1.2340, None, None, 2),
            ("swin_window_varres", 1.2280, None, None, 2),
        ],
        4,
    );
}

/// Six more workloads nobody here had seen (`SNOW` in fixtures/torch/workloads.py: written on
/// the rule that judged them set before they were recorded,
/// then recorded and replayed once on an H200 with the code of 4c86a07; all six held out,
/// fixtures/torch/README.md). Against the better of PyTorch's caching allocator and the pool
/// (`torch_replay.py` in the same command, rounded up; `optimizer_offload` against both on its
/// own two streams, `torch_streams.py`; logs `docs/lab/runs/h200-snow*.log`,
/// whose vramscope rows the sim gives byte for byte, call for call), virtual segments meet the
/// target on all six and `cuMemAlloc` ones within 1% on five, held to what the GPU measured on
/// `rnnt_joint` (1.392 against the pool's 1.261), which calls the backend in its second warm
/// pass (three segments), none after; the others none after the first.
#[test]
fn snow_traces_settle_against_the_better_peak() {
    settle_by_against_the_better_peak(
        &[
            ("continuous_batching_kv", 1.3467, None, None, 2),
            ("growing_outputs", 1.3722, None, None, 2),
            ("optimizer_offload", 1.0908, None, None, 2),
            ("packed_documents", 1.2968, None, None, 2),
            ("rnnt_joint", 1.2612, None, Some(1.3920), 2),
            ("swap_preempt_serving", 1.2708, None, None, 2),
        ],
        4,
    );
}

/// PyTorch's `max_split_size_mb:128` (blocks of at least 128 MiB are not split, and serve only
/// requests within 20 MiB of their size), on every single-stream fixture trace, with both
/// segment kinds on a backend whose segment calls are costly: none calls the backend in its
/// third warm pass; segments that grow in place (the default) reserve at most what PyTorch's
/// caching allocator reserves with the same setting (but on `leaky_train`, where they reserve
/// what they do without it, 1.1125 since the free end of a growing range is taken last: see
/// `costly_segments_settle_without_warm_backend_calls`), and `cuMemAlloc` segments at most 15%
/// more than without it (the most measured: 10.2%, `gnn_random_graphs`). The figures are
/// PyTorch's peak reserved over peak live with the setting (rounded up), on an H200
/// (`docs/lab/runs/h200-max-split.log`, `tests/gpu/torch_conf.py`).
///
/// Before the rules gave way in segments that grow and over the soft limit (`Heap::keeps_oversize`),
/// the same replays on that GPU reserved up to 158 times the peak live bytes with virtual
/// segments and 6.8 times with `cuMemAlloc` ones, calling the driver in every pass.
#[test]
fn max_split_size_settles_and_reserves_at_most_pytorchs_with_it() {
    let setting = "max_split_size_mb:128";
    for (name, pytorch) in [
        ("amp_grad_scaler", 1.2928),
        ("beam_search", 1.1668),
        ("encoder_serving", 9.4186),
        ("gan_train", 1.3222),
        ("gnn_random_graphs", 4.9435),
        ("gpt2_generate", 1.2582),
        ("gpt2_train", 1.1581),
        ("grad_accum_checkpoint", 1.1016),
        ("leaky_train", 1.0824),
        ("llm_generate_kv", 1.0655),
        ("lstm_packed", 3.3650),
        ("moe_train", 1.1277),
        ("multiscale_train", 4.2708),
        ("resnet_train", 1.2430),
        ("speculative_decode", 1.0729),
        ("transformer_varlen", 3.0030),
        ("unet_diffusion", 1.4816),
    ] {
        let trace = Trace::from_file(fixture(&format!("{name}.trace.json.gz"))).unwrap();
        for pages in [false, true] {
            let r = run_costly(&trace, &format!("release_pages:{pages},{setting}"), 3);
            assert_eq!(r.warm_device_calls[2], 0, "{name}, pages {pages}: {r:?}");
            if pages {
                let bound = if name == "leaky_train" { 1.1125 } else { pytorch };
                assert!(r.fragmentation <= bound, "{name}, growing: {:.3} > {bound}", r.fragmentation);
            } else {
                let without = run_costly(&trace, "release_pages:false", 3).fragmentation;
                assert!(r.fragmentation <= without * 1.15, "{name}: {:.3} against {without:.3}", r.fragmentation);
            }
        }
    }
}

#[test]
fn smallest_cap_lies_between_the_live_peak_and_the_device() {
    let trace = Trace::from_file(fixture("leaky_train.trace.json.gz")).unwrap();
    let opts = ReplayOptions::default();
    for pages in [false, true] {
        let config = AllocatorConfig::parse(&format!("release_pages:{pages}")).unwrap();
        let fit = vramscope::replay::smallest_cap(&trace, &config, 1 << 30, &opts).unwrap();
        assert!(fit.peak_live_bytes <= fit.fits && fit.fits <= fit.unconstrained_reserved_bytes, "{fit:?}");
        assert!(fit.fails < fit.fits && fit.ratio() < 1.1, "{fit:?}");
        assert_eq!(fit.warm_device_calls.len(), opts.warm_passes);
        // A device smaller than the trace's live peak: the replay's own error, not a panic.
        let e = vramscope::replay::smallest_cap(&trace, &config, 64 << 20, &opts).unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
        // A trace that reserves nothing fits in nothing.
        let empty = Trace::from_bytes(br#"{"events":[]}"#, "empty").unwrap();
        let fit = vramscope::replay::smallest_cap(&empty, &config, 1 << 30, &opts).unwrap();
        assert_eq!((fit.fits, fit.fails, fit.unconstrained_reserved_bytes), (0, 0, 0));
    }
}

#[test]
fn replay_on_the_host_backend() {
    let trace = Trace::from_file(fixture("leaky_train.trace.json.gz")).unwrap();
    let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    let r = replay(&alloc, &trace, &ReplayOptions::default()).unwrap();
    assert_eq!(r.backend, "host");
    assert_eq!(r.ops, 1140);
    assert_eq!(r.peak_live_bytes, 139_501_684);
}

#[test]
fn replay_too_large_for_the_device_is_an_oom_error() {
    let trace = Trace::from_file(fixture("resnet_train.trace.json.gz")).unwrap();
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    let e = replay(&alloc, &trace, &ReplayOptions::default()).unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.memory_allocated(), 0);
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Builds traces from alloc/free calls on made-up addresses.
#[derive(Default)]
struct Builder {
    events: Vec<TraceEvent>,
    next: u64,
}
impl Builder {
    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let (addr, size, _) = self.alloc_on(size, 0);
        (addr, size)
    }
    fn free(&mut self, (addr, size): (u64, u64)) {
        self.free_on((addr, size, 0));
    }
    /// An allocation on `stream`: `(addr, size, stream)`.
    fn alloc_on(&mut self, size: u64, stream: u64) -> (u64, u64, u64) {
        self.next += 1;
        self.events.push(TraceEvent { op: TraceOp::Alloc, addr: self.next, size, stream });
        (self.next, size, stream)
    }
    fn free_on(&mut self, (addr, size, stream): (u64, u64, u64)) {
        self.events.push(TraceEvent { op: TraceOp::Free, addr, size, stream });
    }
    fn trace(self, name: &str) -> Trace {
        Trace { source: name.into(), events: self.events }
    }
}

const MIB: u64 = 1 << 20;

/// Autoregressive decoding: per layer, a KV cache that grows by concatenation every step.
fn kv_cache_decode() -> Trace {
    let mut b = Builder::default();
    let weights: Vec<_> = (0..24).map(|_| b.alloc(48 * MIB)).collect();
    let layers = 24;
    let mut kv: Vec<Option<(u64, u64)>> = vec![None; layers];
    for step in 1..=160u64 {
        for slot in kv.iter_mut() {
            let x = b.alloc(step * 64 * 1024 + 4096);
            let scores = b.alloc(step * 32 * 1024 + 512);
            let new = b.alloc(step * 256 * 1024);
            if let Some(old) = slot.replace(new) {
                b.free(old);
            }
            b.free(scores);
            b.free(x);
        }
    }
    for s in kv.into_iter().flatten() {
        b.free(s);
    }
    weights.into_iter().for_each(|w| b.free(w));
    b.trace("kv_cache_decode")
}

/// Training with a batch size that changes every step (dynamic shapes).
fn dynamic_batch_training() -> Trace {
    let mut r = Rng(0x51ed_270b_1234_5678);
    let mut b = Builder::default();
    let layer_sizes = [3 * MIB, 9 * MIB, 9 * MIB, 27 * MIB, 27 * MIB, 4 * MIB];
    let params: Vec<_> = layer_sizes.iter().map(|&s| b.alloc(s)).collect();
    let moments: Vec<_> = layer_sizes.iter().flat_map(|&s| [s, s]).map(|s| b.alloc(s)).collect();
    for _ in 0..60 {
        let batch = 8 + r.below(56);
        let mut acts = Vec::new();
        for (i, _) in layer_sizes.iter().enumerate() {
            acts.push(b.alloc(batch * (96 << 10) * (i as u64 % 3 + 1)));
            let tmp = b.alloc(batch * (24 << 10) + 1000);
            b.free(tmp);
        }
        let grads: Vec<_> = layer_sizes.iter().rev().map(|&s| b.alloc(s)).collect();
        while let Some(a) = acts.pop() {
            let g = b.alloc(a.1);
            b.free(a);
            b.free(g);
        }
        for g in grads {
            b.free(g);
        }
    }
    params.into_iter().chain(moments).for_each(|p| b.free(p));
    b.trace("dynamic_batch_training")
}

/// Log-uniform sizes from 512 bytes to 256 MiB with random lifetimes and a bounded live set.
fn random_lifetimes() -> Trace {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    let mut b = Builder::default();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut total = 0;
    for _ in 0..6000 {
        if !live.is_empty() && (total > 3 << 30 || r.below(100) < 48) {
            let i = r.below(live.len() as u64) as usize;
            let x = live.swap_remove(i);
            total -= x.1;
            b.free(x);
        } else {
            let e = 9 + r.below(20);
            let size = (1 << e) + r.below(1 << e);
            total += size;
            live.push(b.alloc(size));
        }
    }
    live.into_iter().for_each(|x| b.free(x));
    b.trace("random_lifetimes")
}

/// Long-lived small blocks interleaved with large transient ones: the classic fragmenter.
fn interleaved_lifetimes() -> Trace {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut b = Builder::default();
    let mut keep = Vec::new();
    for round in 0..200u64 {
        let big: Vec<_> = (0..4).map(|_| b.alloc((2 + r.below(30)) * MIB)).collect();
        keep.push(b.alloc((1 + round % 5) * 1536 * 1024));
        for x in big {
            b.free(x);
        }
        if keep.len() > 40 {
            let x = keep.remove(r.below(keep.len() as u64) as usize);
            b.free(x);
        }
    }
    keep.into_iter().for_each(|x| b.free(x));
    b.trace("interleaved_lifetimes")
}

/// An encoder served without gradients at a random batch size (1 to 64) and length (16 to
/// 512) per request: six layers of d 512, attention scores of `b * 8 * n * n` floats.
fn encoder_serving_like(seed: u64) -> Trace {
    let mut r = Rng(seed);
    let mut b = Builder::default();
    let weights: Vec<_> = (0..24).map(|i| b.alloc(if i % 4 == 0 { 3 * MIB } else { 4 * MIB })).collect();
    for _ in 0..48 {
        let (batch, n) = (1 + r.below(64), 16 + r.below(497));
        let x = batch * n * 512 * 4;
        let mut h = b.alloc(x);
        for _ in 0..6 {
            let qkv = b.alloc(3 * x);
            let scores = b.alloc(batch * 8 * n * n * 4);
            let att = b.alloc(x);
            b.free(scores);
            b.free(qkv);
            let o = b.alloc(x);
            b.free(att);
            let h2 = b.alloc(x);
            b.free(o);
            b.free(h);
            let ff = b.alloc(4 * x);
            let ff2 = b.alloc(x);
            b.free(ff);
            h = b.alloc(x);
            b.free(ff2);
            b.free(h2);
        }
        b.free(h);
    }
    weights.into_iter().for_each(|w| b.free(w));
    b.trace("encoder_serving_like")
}

/// A serving loop of random shapes on one stream, `cuMemAlloc`-like segments on a costly sim,
/// the limit held at its ceiling: the loop settles, because a request over the limit gives back
/// no cached segment far larger than what it lacks (`RELEASE_SPAN`). Before that rule, this
/// trace (the first of twelve seeds to do so) released a large cached segment to make room for
/// a 2 MiB one and reserved it again later in the step, in every warm pass.
#[test]
fn a_serving_loop_on_one_stream_settles_under_a_fixed_ceiling() {
    let trace = encoder_serving_like(10);
    let r = run_costly(&trace, "release_pages:false,fragmentation_limit_max:1.25", 3);
    assert_eq!(r.warm_device_calls, [0, 0, 0], "{r:?}");
    assert!(r.fragmentation_limit.unwrap() <= 1.25, "{r:?}");
    assert!(r.fragmentation < 1.15, "{r:?}");
}

/// Where holding to the limit's ceiling would make a loop's steps call the backend for ever,
/// the automatic ceiling gives way: the same request churning twice at the ceiling raises the
/// limit past it. Shown on random shapes on four streams (`cuMemAlloc`-like segments on a
/// costly sim; the seed, outside those of `random_shapes_on_several_streams_settle`, is one
/// whose warm passes all call at a ceiling of 1.25): with the ceiling fixed at 1.25 its third
/// warm pass still calls the backend, with the automatic one it calls none. Seed 80, used until
/// settles at 1.25 since a large request keeps the small pool's segments on several
/// streams too; of the seeds from 36 on whose three warm passes all call at 1.25 (four streams),
/// 142 is the first that the automatic ceiling settles within three warm passes: on the five
/// before it (52, 100, 102, 117, 125) no size had churned twice at the ceiling yet.
#[test]
fn the_automatic_ceiling_gives_way_to_churn_that_repeats() {
    let trace = streams_of_random_shapes(142, 4);
    // Streams kept apart: sharing an idle stream's memory settles this seed at the fixed
    // ceiling too (the churn this test needs comes from each stream caching its own).
    let third_warm_pass = |max: &str| {
        run_costly(&trace, &format!("release_pages:false,share_idle_streams:false,fragmentation_limit_max:{max}"), 3)
    };
    let fixed = third_warm_pass("1.25");
    // Each churn releases what it reserves: every warm pass calls.
    assert_eq!(fixed.warm_device_calls.len(), 3);
    assert!(fixed.warm_device_calls.iter().all(|&c| c > 0), "{fixed:?}");
    assert_eq!(fixed.fragmentation_limit, Some(1.25));
    let auto = third_warm_pass("auto");
    assert_eq!(auto.warm_device_allocs, 0, "{auto:?}");
    assert_eq!(auto.warm_device_calls.last(), Some(&0), "{auto:?}");
    assert!(auto.fragmentation_limit.unwrap() > 1.25, "{auto:?}");
}

/// Steps of random shapes on several streams: each step scales its sizes by a random factor,
/// each allocation goes to a random stream and some are freed at once, the rest at the step's
/// end (a few kept to the end of the pass). No recorded trace has this shape; PyTorch's
/// streams mostly allocate on one stream with a few side streams.
fn streams_of_random_shapes(seed: u64, streams: u64) -> Trace {
    const SIZES: [u64; 8] = [512, 4096, 65536, MIB, 3 * MIB, 16 * MIB, 50 * MIB, 200 * MIB];
    let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut b = Builder::default();
    let mut kept = Vec::new();
    for _ in 0..12 {
        let scale = [3, 6, 10, 15, 25][r.below(5) as usize];
        let mut step = Vec::new();
        for _ in 0..30 + r.below(170) {
            let size = (SIZES[r.below(8) as usize] * scale / 10 * (50 + r.below(101)) / 100).max(1);
            let stream = r.below(streams);
            step.push(b.alloc_on(size, stream));
            if r.below(10) < 4 {
                let block = step.swap_remove(r.below(step.len() as u64) as usize);
                b.free_on(block);
            }
        }
        for block in step {
            if r.below(50) == 0 {
                kept.push(block);
            } else {
                b.free_on(block);
            }
        }
    }
    for block in kept {
        b.free_on(block);
    }
    b.trace(&format!("streams_of_random_shapes({seed}, {streams})"))
}

/// Random shapes on two to four streams, where segments are costly: each stream's requests
/// differ in size from step to step, so a stream seldom finds a cached block of its own that
/// fits. Lending free blocks of other streams' segments (which stay their owners') and the
/// limit's doubling steps let all 72 rows (36 traces, both segment kinds) settle by the sixth
/// warm pass, below what the same allocator caching as PyTorch reserves. Taking whole segments
/// over instead, left 38 rows calling after the second warm pass and the
/// last until the tenth (BENCHMARKS.md, "Lending instead of taking over"). The target is
/// no call after the second warm pass: missed on 1 of the 72 rows since streams share an idle
/// stream's memory (`share_idle_streams`, both segment kinds; none after the
/// third), on 12 before, 4 of them after the third (16 and 4 before no hole was unmapped on several streams; 25
/// and 13 before a large request kept the small pool's segments and a hole gave up only what
/// the request lacked on several streams too; 18 and 5 before mapping again the
/// pages of a hole that merged counted as churn). Prints the figures (`--nocapture`).
#[test]
fn random_shapes_on_several_streams_settle() {
    const PASSES: usize = 12;
    let (mut rows, mut late, mut later) = (0, 0, 0);
    for seed in 0..36 {
        let trace = streams_of_random_shapes(seed, 2 + seed % 3);
        let pytorch = run(&trace, "fragmentation_limit:off,release_pages:false,share_idle_streams:false");
        for pages in [true, false] {
            let r = run_costly(&trace, &format!("release_pages:{pages}"), PASSES);
            let calls = &r.warm_device_calls;
            eprintln!(
                "{} pages {pages}: backend calls for memory in warm passes 1 to {PASSES}: {calls:?}; \
                 {:.3}x (pytorch-like {:.3}x)",
                trace.source, r.fragmentation, pytorch.fragmentation
            );
            assert_eq!(calls.len(), PASSES);
            assert!(calls[6..].iter().all(|&c| c == 0), "{}, pages {pages}: {calls:?}", trace.source);
            assert!(r.peak_reserved_bytes <= pytorch.peak_reserved_bytes, "{}: {r:?}", trace.source);
            rows += 1;
            late += usize::from(calls[2..].iter().any(|&c| c > 0));
            later += usize::from(calls[3..].iter().any(|&c| c > 0));
        }
    }
    eprintln!("{rows} rows: {late} call after the second warm pass, {later} after the third");
    // 1 and 0 of 72 now (12 and 4 before streams shared an idle stream's memory).
    assert!(late <= 1 && later == 0, "{late} and {later} of {rows} rows call late");
}

/// On workloads nobody tuned for, vramscope never reserves more at peak than the same
/// allocator caching as PyTorch does. Prints the figures (`--nocapture`) for BENCHMARKS.md.
#[test]
fn unseen_workloads_fragment_no_more_than_pytorch_caching() {
    for trace in [kv_cache_decode(), dynamic_batch_training(), random_lifetimes(), interleaved_lifetimes()] {
        let ours = run(&trace, "");
        let pytorch = run(&trace, "fragmentation_limit:off,release_pages:false,share_idle_streams:false");
        eprintln!(
            "{:<24} ops {:>6}  peak live {:>6.0} MiB  vramscope {:.3}x  pytorch-like {:.3}x  warm segments {} vs {}",
            trace.source,
            ours.ops,
            ours.peak_live_bytes as f64 / MIB as f64,
            ours.fragmentation,
            pytorch.fragmentation,
            ours.warm_device_allocs,
            pytorch.warm_device_allocs,
        );
        assert!(
            ours.peak_reserved_bytes <= pytorch.peak_reserved_bytes,
            "{}: vramscope reserved {} at peak, PyTorch-like caching {}",
            trace.source,
            ours.peak_reserved_bytes,
            pytorch.peak_reserved_bytes
        );
    }
}

/// Every trace of the fixtures (66, the held-out ones included) replays on the
/// sim backend with the allocator's invariants intact, nothing
/// skipped and every buffer given back, and its peak of live bytes is the one worked out here
/// from the JSON itself, independently of the replay's reader.
#[test]
fn every_fixture_trace_replays_with_its_true_peak() {
    let mut seen = 0;
    for entry in std::fs::read_dir(fixture("")).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).filter(|n| n.ends_with(".trace.json.gz")) else {
            continue;
        };
        let json = gzipped_json(&path);
        let (mut live, mut now, mut peak) = (std::collections::HashMap::new(), 0u64, 0u64);
        for e in json["events"].as_array().unwrap() {
            let (op, addr, size) = (e[0].as_str().unwrap(), e[1].as_u64().unwrap(), e[2].as_u64().unwrap());
            if op == "a" {
                assert!(live.insert(addr, size).is_none(), "{name}: {addr:#x} allocated twice");
                now += size;
                peak = peak.max(now);
            } else if let Some(size) = live.remove(&addr) {
                now -= size;
            }
        }
        let r = run(&Trace::from_file(&path).unwrap(), "");
        assert_eq!(r.skipped, 0, "{name}");
        assert_eq!(r.peak_live_bytes, peak, "{name}: the replay's peak of live bytes");
        assert!(r.peak_reserved_bytes >= peak, "{name}");
        seen += 1;
    }
    assert!(seen >= 66, "the fixtures hold 66 traces, found {seen}");
}

/// Parking (the recording off: a thread's dropped block waits in its own slot, taken back
/// without the lock) hands a request the very block the heap would: every fixture trace,
/// replayed with the default recording (no parking) and with the recording off, on segments
/// that cost nothing and on costly ones, leaves every statistic equal: peaks, segments
/// reserved, splits, totals.
#[test]
fn parking_changes_no_decision_of_the_heap() {
    let mut seen = 0;
    for entry in std::fs::read_dir(fixture("")).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_str().unwrap().ends_with(".trace.json.gz") {
            continue;
        }
        let trace = Trace::from_file(&path).unwrap();
        for costly in [false, true] {
            let stats = |record: vramscope::record::RecordConfig| {
                let alloc = CachingAllocator::new(SimBackend::new(1 << 40).with_costly_segments(costly));
                let parks = record == vramscope::record::RecordConfig::off();
                alloc.record_memory_history(record);
                if parks {
                    alloc.park_always();
                }
                let mut opts = ReplayOptions::default();
                opts.warm_passes = 2;
                let r = replay(&alloc, &trace, &opts).unwrap();
                alloc.check_invariants().unwrap();
                (r.peak_reserved_bytes, r.device_allocs, r.device_maps, alloc.memory_stats())
            };
            let recorded = stats(vramscope::record::RecordConfig::default());
            let parked = stats(vramscope::record::RecordConfig::off());
            assert_eq!(parked, recorded, "{}, costly segments {costly}", path.display());
        }
        seen += 1;
    }
    assert!(seen >= 66, "the fixtures hold 66 traces, found {seen}");
}

/// Random shapes on one stream with virtual segments (the default kind), where segments are
/// costly: every row settles by the second warm pass, with few calls before. Over the limit, a
/// request alone on its heap unmaps only what it lacks of a mapped hole (`Heap::reclaim`): the
/// whole hole, was often most of the range, which the same step mapped
/// again. The first 24 of these rows then made 76 backend calls in their warm passes, 28
/// after (at the same peaks); on the sim's replays of 48 traces from
/// `tests/gpu/random_streams.py`, 428 against 106, and one row that called until the third warm
/// pass no longer does (BENCHMARKS.md, "Unmapping what a request lacks"). A churn raises the
/// limit to what the reclaims since the peak wanted where that is more than its own growth
/// (`Heap::note_regrowth`); before, only where its own growth fitted under the limit,
/// and two requests that took turns mapping pages the other's reclaim had unmapped churned
/// again after each raise: of these 300 rows, seeds 154 and 166 called in the third warm pass,
/// and the warm passes made 199 calls (now 0 rows and 109 calls; BENCHMARKS.md, "What the
/// reclaim wanted"). Those figures are without views of the range's free pages
/// (`alias_pages:false`). With views (the default) the peaks fall (geometric mean 1.0463 to
/// 1.0072; 1.0044 while the range mapped every page alone, before views mapped whole mappings)
/// and the first warm pass makes views for the holes the cold pass's growth left (687 of 701
/// calls; 591 of 596 then): seed 166 alone calls in the third warm pass and again in the
/// sixth. Why: the
/// block freed last at the end of a pass is handed to the next pass's first request of its
/// size where it lies (`Heap::settle`), so that a pass can start from a layout other than the
/// last one's, and a view is kept for the pages it maps; a new one is made until every layout
/// the loop comes back to has its own (BENCHMARKS.md, "Views of the range's free pages").
/// Prints the figures (`--nocapture`).
#[test]
fn random_shapes_on_one_stream_settle_by_the_second_warm_pass() {
    for (conf, most_calls, late_seeds, most_mean) in
        [("release_pages:true,alias_pages:false", 120, &[][..], 1.047), ("release_pages:true", 720, &[166][..], 1.008)]
    {
        let (mut calls, mut late, mut logs) = (0, Vec::new(), 0.0);
        for seed in 100..400 {
            let trace = streams_of_random_shapes(seed, 1);
            let r = run_costly(&trace, conf, 4);
            eprintln!("{conf} {}: warm calls {:?}, {:.3}x", trace.source, r.warm_device_calls, r.fragmentation);
            calls += r.warm_device_calls.iter().sum::<u64>();
            logs += r.fragmentation.ln();
            if r.warm_device_calls[2..].iter().any(|&c| c > 0) {
                late.push(seed);
            }
        }
        let mean = (logs / 300.0).exp();
        eprintln!("{conf}: 300 rows, {calls} warm calls, late {late:?}, geometric mean {mean:.4}");
        assert_eq!(late, late_seeds, "{conf}");
        assert!(calls <= most_calls, "{conf}: {calls} warm calls");
        assert!(mean <= most_mean, "{conf}: geometric mean {mean:.4}");
    }
}

/// Every fixture trace replayed on `sim` and `sim-cuda` (costly segment calls), two warm passes:
/// the peaks, the backend's memory calls cold and in each warm pass, the stream queries of each
/// pass, retries and the fragmentation limit at the end, pinned byte for byte. A change to the
/// allocator that moves any of them shows here (and is then either a regression to fix or a
/// change to explain and re-pin with `cargo insta review`).
#[test]
fn every_fixture_trace_replays_as_pinned() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".trace.json.gz").map(str::to_string))
        .collect();
    names.sort();
    assert!(names.len() >= 70, "{} traces", names.len());
    let mut out = String::new();
    for name in &names {
        let trace = Trace::from_file(dir.join(format!("{name}.trace.json.gz"))).unwrap();
        for costly in [false, true] {
            let backend = SimBackend::new(1 << 40).with_costly_segments(costly);
            let alloc = CachingAllocator::new(backend);
            let mut opts = ReplayOptions::default();
            opts.warm_passes = 2;
            let r = replay(&alloc, &trace, &opts).unwrap();
            alloc.check_invariants().unwrap();
            out.push_str(&format!(
                "{name} {}: peak reserved {} live {}; cold allocs {} maps {}; warm calls {:?} queries {:?}; \
                 retries {}; limit {:?}\n",
                if costly { "sim-cuda" } else { "sim" },
                r.peak_reserved_bytes,
                r.peak_live_bytes,
                r.device_allocs,
                r.device_maps,
                r.warm_device_calls,
                r.warm_stream_queries,
                r.alloc_retries,
                r.fragmentation_limit,
            ));
        }
    }
    insta::assert_snapshot!("every_fixture_trace", out);
}
