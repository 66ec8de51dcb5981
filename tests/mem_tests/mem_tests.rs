//! The memory-test harness: leaky bodies fail naming the allocating line, clean ones pass, and
//! tests running at the same time get their own verdicts.

use vramscope::testing::{MemTest, Metric};
use vramscope::Buffer;

fn alloc() -> vramscope::CachingAllocator {
    vramscope::device(0)
}

#[test]
fn a_leaky_body_fails_and_names_its_line() {
    let mut kept: Vec<Buffer<f32>> = Vec::new();
    let dir = std::env::temp_dir().join(format!("vramscope-evidence-{}", std::process::id()));
    let line = line!() + 4;
    let v = MemTest::new("mem_tests::leaky").iters(3).warmup(1).evidence_dir(&dir).check(|| {
        let a = alloc();
        let s = a.default_stream();
        kept.push(a.alloc::<f32>(&s, 4096).unwrap().with_shape(&[64, 64]).unwrap());
        let _tmp = a.alloc::<f32>(&s, 100_000).unwrap();
    });
    assert!(!v.passed);
    assert_eq!(v.growth, 3 * 16384);
    assert_eq!(v.per_iteration, [16384, 32768, 49152, 65536]);
    let site = format!("tests/mem_tests/mem_tests.rs:{line} (mem_tests::..::a_leaky_body_fail");
    assert!(v.report.contains(&site), "{site} not in\n{}", v.report);
    assert!(v.report.contains("float32[64, 64]"), "{}", v.report);
    assert!(v.report.contains("1 block, 16,384 B (16.00 KiB) per iteration, float32[64, 64]"), "{}", v.report);
    assert!(!v.report.contains(&format!(":{}", line + 1)), "the freed temporary is not named:\n{}", v.report);
    let mut files = vec!["report.txt", "snapshot.json", "live.folded", "growth.folded", "timeline.svg"];
    if cfg!(feature = "flamegraph") {
        files.extend(["live.svg", "growth.svg"]);
    }
    for f in files {
        let p = dir.join("mem_tests__leaky").join(f);
        assert!(p.exists(), "{} missing", p.display());
        assert!(v.report.contains(&p.display().to_string()), "the report names {}", p.display());
    }
    // The evidence's history keeps the frees of the test's blocks: its timeline ends with what
    // the test kept (four blocks, one a warm-up's), the temporary risen and fallen.
    let snap = vramscope::Snapshot::load(dir.join("mem_tests__leaky/snapshot.json")).unwrap();
    let t = vramscope::report::timeline(&snap);
    let end: u64 = t.bands.iter().map(|b| *b.bytes.last().unwrap()).sum();
    assert_eq!(end, 4 * 16384, "{t:?}");
    let peak: u64 = (0..t.points.len()).map(|k| t.bands.iter().map(|b| b.bytes[k]).sum::<u64>()).max().unwrap();
    assert!(peak >= 4 * 16384 + 400_000 - 16384, "the temporary shows: {t:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_clean_body_passes() {
    let v = MemTest::new("mem_tests::clean").iters(5).check(|| {
        let a = alloc();
        let x = a.alloc::<u8>(&a.default_stream(), 1 << 20).unwrap();
        drop(x);
    });
    assert!(v.passed, "{}", v.report);
    assert_eq!(v.growth, 0);
}

#[test]
fn tolerance_and_block_metric() {
    let mut kept = Vec::new();
    let v = MemTest::new("mem_tests::tolerated").iters(2).tolerance(2048).check(|| {
        let a = alloc();
        kept.push(a.alloc::<u8>(&a.default_stream(), 1000).unwrap());
    });
    assert!(v.passed, "2 x 1024 B of growth is within 2048 B: {}", v.report);
    let v = MemTest::new("mem_tests::blocks").iters(2).metric(Metric::LiveBlocks).check(|| {
        let a = alloc();
        kept.push(a.alloc::<u8>(&a.default_stream(), 10).unwrap());
    });
    assert!(!v.passed);
    assert_eq!(v.growth, 2);
}

/// The tolerance is compared with what the report prints: bytes asked for, not the 512-byte
/// blocks they round up to (100 B an iteration is 1,000 B in 10, not 5,120 B).
#[test]
fn tolerance_is_compared_with_the_bytes_asked_for() {
    let mut kept = Vec::new();
    let mut leak = || {
        let a = alloc();
        kept.push(a.alloc::<u8>(&a.default_stream(), 100).unwrap());
    };
    let v = MemTest::new("mem_tests::asked_within").iters(10).tolerance(1024).check(&mut leak);
    assert!(v.passed, "1,000 B asked for is within 1 KiB: {}", v.report);
    assert_eq!(v.growth, 1000);
    let v = MemTest::new("mem_tests::asked_beyond").iters(10).tolerance(999).check(&mut leak);
    assert!(!v.passed);
    assert_eq!(v.growth, 1000);
    assert!(v.report.contains("1 block, 100 B per iteration (a block of 512 B)"), "{}", v.report);
    assert!(
        v.report.contains(
            "live bytes of the test's blocks (bytes asked for, all allocators):\n  \
             grew 1,000 B in 10 iterations, over the tolerance of 999 B\n  at the end of each iteration:"
        ),
        "{}",
        v.report
    );
    assert!(v.report.lines().all(|l| l.len() <= 100), "{}", v.report);
}

#[test]
fn results_stop_the_loop_and_are_returned() {
    let mut n = 0;
    let (v, out) = MemTest::new("mem_tests::result")
        .run(|| -> Result<(), String> {
            n += 1;
            if n == 2 {
                Err("boom".into())
            } else {
                Ok(())
            }
        })
        .unwrap();
    assert_eq!(out, Err("boom".to_string()));
    assert_eq!(v.per_iteration.len(), 2);
}

#[test]
fn spawned_threads_count_when_they_enter_the_tests_scope() {
    let v = MemTest::new("mem_tests::threads").iters(2).check(|| {
        let here = vramscope::current_scope();
        std::thread::spawn(move || {
            let _g = here.enter();
            let a = alloc();
            std::mem::forget(a.alloc::<u8>(&a.default_stream(), 512).unwrap());
        })
        .join()
        .unwrap();
    });
    assert!(!v.passed);
    assert_eq!(v.growth, 1024);
}

/// A leaky and a clean test running at the same time in one process keep their verdicts,
/// run after run.
#[test]
fn parallel_tests_never_change_each_others_verdicts() {
    for round in 0..20 {
        let barrier = std::sync::Barrier::new(2);
        let (leaky, clean) = std::thread::scope(|s| {
            let leaky = s.spawn(|| {
                barrier.wait();
                let mut kept = Vec::new();
                MemTest::new(format!("parallel::leaky{round}"))
                    .iters(3)
                    .evidence_dir(std::env::temp_dir().join("vramscope-par"))
                    .check(|| {
                        let a = alloc();
                        kept.push(a.alloc::<u8>(&a.default_stream(), 4096).unwrap());
                    })
            });
            let clean = s.spawn(|| {
                barrier.wait();
                // Allocates a lot while the leaky test measures, and frees it all.
                MemTest::new(format!("parallel::clean{round}")).iters(3).check(|| {
                    let a = alloc();
                    let bufs: Vec<_> =
                        (0..50).map(|i| a.alloc::<u8>(&a.default_stream(), 1000 * (i + 1)).unwrap()).collect();
                    drop(bufs);
                })
            });
            (leaky.join().unwrap(), clean.join().unwrap())
        });
        assert!(!leaky.passed, "round {round}: the leaky test must fail");
        assert_eq!(leaky.growth, 3 * 4096, "round {round}");
        assert!(clean.passed, "round {round}: {}", clean.report);
    }
    std::fs::remove_dir_all(std::env::temp_dir().join("vramscope-par")).ok();
}

#[test]
#[ignore = "prints a failure report to look at: cargo test --test mem_tests -- --ignored --nocapture"]
fn show_a_report() {
    let mut kept = Vec::new();
    let _model = vramscope::scope("model");
    let v = MemTest::new("mem_tests::show").iters(3).check(|| {
        let a = alloc();
        let _fwd = vramscope::scope("forward");
        kept.push(a.alloc::<f32>(&a.default_stream(), 4096).unwrap().with_shape(&[64, 64]).unwrap());
    });
    println!("{}", v.report);
}

/// A body that allocates nothing a vramscope allocator sees fails with a message saying so,
/// rather than passing while measuring nothing.
#[test]
fn a_body_that_allocates_nothing_fails_and_says_why() {
    let mut plain = Vec::new();
    let v = MemTest::new("mem_tests::nothing").iters(2).check(|| plain.push(vec![0u8; 1024]));
    assert!(!v.passed);
    assert_eq!(v.allocations, 0);
    assert!(v.report.contains("the body allocated nothing inside the test's scope"), "{}", v.report);
    assert!(
        v.report.contains("memory allocated through cudarc or\n  a framework directly is not seen"),
        "{}",
        v.report
    );
    assert!(!v.report.contains("at the end of each iteration"), "no table of nothing:\n{}", v.report);
}

/// Allocators the body builds count like `device(0)`: a leak through a private allocator fails
/// and names its line; the private allocator's own blocks outside the test do not count.
#[test]
fn a_private_allocator_counts() {
    let private = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    let outside = private.alloc::<u8>(&private.default_stream(), 1 << 20).unwrap();
    let mut kept = Vec::new();
    let line = line!() + 2;
    let v = MemTest::new("mem_tests::private").iters(3).check(|| {
        kept.push(private.alloc::<u16>(&private.default_stream(), 500).unwrap());
    });
    assert!(!v.passed);
    assert_eq!(v.growth, 3 * 1000, "three 1,000-byte requests (in 1,024-byte blocks)");
    let site = format!("tests/mem_tests/mem_tests.rs:{line} (mem_tests::mem_tests::a_private_allocator_counts");
    assert!(v.report.contains(&site), "{site} not in\n{}", v.report);
    assert!(v.report.contains("1 block, 1,000 B per iteration (a block of 1,024 B)"), "{}", v.report);
    drop(outside);
}

/// A pin of a memory test (`assert_mem_snapshot!(test)` in a custom harness) shows the test's
/// blocks in every allocator and nothing of its neighbours'.
#[test]
fn a_pin_of_a_test_shows_only_its_blocks() {
    let a = alloc();
    let neighbour = a.alloc::<u8>(&a.default_stream(), 4096).unwrap();
    let private = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    let mut kept = Vec::new();
    let test = MemTest::new("mem_tests::pinned").iters(1).warmup(1);
    let v = test.check(|| {
        if kept.is_empty() {
            kept.push(private.alloc::<f32>(&private.default_stream(), 64).unwrap().with_shape(&[8, 8]).unwrap());
            kept.push(a.alloc::<f32>(&a.default_stream(), 256).unwrap().with_shape(&[16, 16]).unwrap());
        }
    });
    assert!(v.passed, "{}", v.report);
    let report = vramscope::testing::snapshot_report(&test);
    assert!(report.starts_with("1.50 KiB live in 2 blocks from 2 sites\n"), "{report}");
    assert!(report.contains("float32[8, 8]") && report.contains("float32[16, 16]"), "{report}");
    assert!(!report.contains("4.00 KiB"), "the neighbour's block is not pinned:\n{report}");
    drop(neighbour);
}

/// An allocator that records no scopes cannot attribute its blocks: a body that allocates only
/// there fails as having allocated nothing visible, and the report says which allocators
/// could not be counted.
#[test]
fn allocators_without_scopes_are_named_in_the_report() {
    let blind = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    blind.record_memory_history(vramscope::record::RecordConfig::off());
    let mut kept = Vec::new();
    let v = MemTest::new("mem_tests::blind").iters(2).check(|| {
        kept.push(blind.alloc::<u8>(&blind.default_stream(), 4096).unwrap());
    });
    assert!(!v.passed);
    assert!(v.report.contains("the body allocated nothing inside the test's scope"), "{}", v.report);
    assert!(v.report.contains("records no scopes (RecordConfig::scopes is off)"), "{}", v.report);
}

/// Edge values: the largest tolerance passes a leak-free body (no wrap), and more iterations
/// than the bound is an error naming the bound, not an abort of the test binary.
#[test]
fn edge_values_are_checked() {
    let v = MemTest::new("mem_tests::huge_tolerance").iters(2).tolerance(u64::MAX).check(|| {
        let a = alloc();
        drop(a.alloc::<u8>(&a.default_stream(), 100).unwrap());
    });
    assert!(v.passed, "{}", v.report);
    let mut runs = 0;
    let v = MemTest::new("mem_tests::too_many").iters(1_000_000_000_000).check(|| runs += 1);
    assert!(!v.passed);
    assert_eq!(runs, 0, "nothing ran");
    assert!(v.report.contains("at most 1000000 in all"), "{}", v.report);
}

/// A tolerance one byte under the growth is printed exactly, never rounded to look equal to it,
/// and the line fits 100 columns.
#[test]
fn a_tolerance_just_under_the_growth_reads_as_less() {
    let mut kept = Vec::new();
    let v = MemTest::new("mem_tests::edge_of_tolerance").iters(5).tolerance(4999).check(|| {
        let a = alloc();
        kept.push(a.alloc::<u8>(&a.default_stream(), 1000).unwrap());
    });
    assert!(!v.passed);
    assert!(
        v.report.contains("grew 5,000 B (4.88 KiB) in 5 iterations, over the tolerance of 4,999 B\n"),
        "{}",
        v.report
    );
    assert!(v.report.lines().all(|l| l.chars().count() <= 100), "{}", v.report);
}

/// A pool that fills on first use grew once: the report says in which iteration, shows that
/// iteration's change from the start, and counts one iteration of growth, not every one.
#[test]
fn growth_made_once_reads_as_made_once() {
    let pool: std::cell::RefCell<Vec<Buffer<u8>>> = Default::default();
    let line = line!() + 5;
    let v = MemTest::new("mem_tests::pool_on_first_use").iters(6).warmup(0).check(|| {
        let a = alloc();
        let mut p = pool.borrow_mut();
        while p.len() < 4 {
            p.push(a.alloc::<u8>(&a.default_stream(), 64 << 10).unwrap());
        }
    });
    assert!(!v.passed);
    assert_eq!(v.growth, 262_144);
    assert!(
        v.report.starts_with("mem_tests::pool_on_first_use: live bytes grew in 1 of 6 iterations (iteration 1)\n"),
        "{}",
        v.report
    );
    assert!(v.report.contains("kept alive since the baseline, by the line that allocated it:\n"), "{}", v.report);
    assert!(v.report.contains(&format!("tests/mem_tests/mem_tests.rs:{line}")), "{}", v.report);
    assert!(v.report.contains("4 blocks, 262,144 B (256.00 KiB), all in iteration 1"), "{}", v.report);
    assert!(!v.report.contains("per iteration"), "{}", v.report);
    // The table's first row shows its change from the start.
    assert!(v.report.contains("    1       262,144 B (256.00 KiB)  +262,144 B (256.00 KiB)\n"), "{}", v.report);
    drop(pool);
}

/// State made in the second step, after one warm-up iteration: growth in iteration 2 only.
#[test]
fn state_made_in_the_second_step_reads_as_such() {
    let mut calls = 0;
    let mut memo: Option<Buffer<u8>> = None;
    let v = MemTest::new("mem_tests::memo_in_second_step").iters(4).warmup(1).check(|| {
        calls += 1;
        if calls == 2 {
            let a = alloc();
            memo = Some(a.alloc::<u8>(&a.default_stream(), 16 << 10).unwrap());
        }
    });
    assert!(!v.passed);
    assert!(v.report.contains("live bytes grew in 1 of 4 iterations (iteration 2)"), "{}", v.report);
    assert!(v.report.contains("1 block, 16,384 B (16.00 KiB), all in iteration 2"), "{}", v.report);
    drop(memo);
}

/// With two warm-up iterations the baseline is the end of the second: a cache filled there is
/// warm-up, not growth.
#[test]
fn the_baseline_is_the_last_warm_up_iteration() {
    let mut calls = 0;
    let mut cache: Vec<Buffer<u8>> = Vec::new();
    let v = MemTest::new("mem_tests::cache_in_second_warm_up").iters(3).warmup(2).check(|| {
        calls += 1;
        let a = alloc();
        // Something every iteration, so that the body is seen allocating.
        drop(a.alloc::<u8>(&a.default_stream(), 256).unwrap());
        if calls == 2 {
            cache.push(a.alloc::<u8>(&a.default_stream(), 8192).unwrap());
        }
    });
    assert!(v.passed, "{}", v.report);
    assert_eq!(v.growth, 0);
    assert_eq!(v.per_iteration, [0, 8192, 8192, 8192, 8192]);
    drop(cache);
}

/// Evidence that cannot be written (a file where its folder should be) is said so in the
/// report, with the path and the reason, and the verdict stands.
#[test]
fn evidence_that_cannot_be_written_is_reported() {
    let file = std::env::temp_dir().join(format!("vramscope-not-a-dir-{}", std::process::id()));
    std::fs::write(&file, b"a file").unwrap();
    let mut kept = Vec::new();
    let v = MemTest::new("mem_tests::unwritable").iters(2).evidence_dir(&file).check(|| {
        let a = alloc();
        kept.push(a.alloc::<u8>(&a.default_stream(), 4096).unwrap());
    });
    assert!(!v.passed);
    assert!(v.evidence.is_empty());
    assert!(v.report.contains("evidence not written: "), "{}", v.report);
    assert!(v.report.contains("mem_tests__unwritable"), "{}", v.report);
    std::fs::remove_file(&file).unwrap();
}

/// The allocations counted are those of this run: a test run again under the same name whose
/// body allocates nothing says so, whatever the first run allocated.
#[test]
fn a_second_run_that_allocates_nothing_says_so() {
    let v = MemTest::new("mem_tests::run_twice").iters(2).check(|| {
        let a = alloc();
        drop(a.alloc::<u8>(&a.default_stream(), 512).unwrap());
    });
    assert!(v.passed, "{}", v.report);
    let v = MemTest::new("mem_tests::run_twice").iters(2).check(|| {});
    assert!(!v.passed);
    assert!(v.report.contains("allocated nothing"), "{}", v.report);
}

/// A body that fails during a long warm-up ends the loop with its error: the verdict is the
/// body's, and no figure is read past the iterations that ran.
#[test]
fn a_body_failing_in_its_warm_up_returns_its_error() {
    let (v, out) = MemTest::new("mem_tests::fails_in_warm_up")
        .iters(2)
        .warmup(3)
        .run(|| -> Result<(), String> { Err("the body's error".into()) })
        .unwrap();
    assert_eq!(out, Err("the body's error".to_string()));
    assert!(v.passed, "the body's own error decides: {}", v.report);
    assert_eq!(v.per_iteration.len(), 1);
}

/// The device's bytes (the ledger's total; on the host backend, what its parts count): a body
/// that keeps what it allocates fails naming the allocator that grew; its clean twin passes.
#[test]
fn device_bytes_fail_naming_the_part_that_grew() {
    use vramscope::{backend::HostBackend, config::AllocatorConfig, CachingAllocator};
    let device = 7_201;
    let a = CachingAllocator::for_device(HostBackend::new(256 << 20), device, AllocatorConfig::default()).unwrap();
    let s = a.default_stream();
    let mut kept = Vec::new();
    let dir = std::env::temp_dir().join(format!("vramscope-device-bytes-{}", std::process::id()));
    let v = MemTest::new("mem_tests::device_bytes_leak")
        .iters(3)
        .warmup(1)
        .device(device)
        .metric(Metric::DeviceBytes)
        .evidence_dir(&dir)
        .check(|| kept.push(a.alloc::<u8>(&s, 4 << 20).unwrap()));
    assert!(!v.passed, "{}", v.report);
    let snap = vramscope::Snapshot::load(dir.join("mem_tests__device_bytes_leak/snapshot.json")).unwrap();
    assert_eq!(snap.ledger.as_ref().map(|l| l.device), Some(device), "the evidence carries the ledger");
    assert!(vramscope::report::summary(&snap).contains("Device 7201 ledger"));
    // What the allocator holds is the figure: 4 MiB more each iteration.
    assert_eq!(v.per_iteration, [4 << 20, 8 << 20, 12 << 20, 16 << 20]);
    assert_eq!(v.growth, 12 << 20);
    for line in v.report.lines() {
        assert!(line.chars().count() <= 100 || line.contains(&dir.display().to_string()), "{line}");
    }
    assert!(v.report.contains("the device's bytes grew"), "{}", v.report);
    assert!(v.report.contains("what grew, by the device's ledger"), "{}", v.report);
    assert!(v.report.contains("allocator host #1"), "{}", v.report);
    assert!(v.report.contains("not seen: the driver's figures"), "{}", v.report);
    drop(kept);
    a.empty_cache();
    let clean = MemTest::new("mem_tests::device_bytes_clean")
        .iters(3)
        .warmup(1)
        .device(device)
        .metric(Metric::DeviceBytes)
        .check(|| drop(a.alloc::<u8>(&s, 4 << 20).unwrap()));
    assert!(clean.passed, "{}", clean.report);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The evidence snapshot of a test whose blocks lie in several allocators lists their segments
/// in address order, so that `vramscope` and every reader load it.
#[test]
fn evidence_over_several_allocators_loads() {
    use vramscope::{backend::HostBackend, CachingAllocator};
    let dir = std::env::temp_dir().join(format!("vramscope-evidence-several-{}", std::process::id()));
    let allocators: Vec<CachingAllocator> = (0..4).map(|_| CachingAllocator::new(HostBackend::new(64 << 20))).collect();
    let mut kept = Vec::new();
    let v = MemTest::new("mem_tests::several_allocators").iters(2).warmup(1).evidence_dir(&dir).check(|| {
        for a in &allocators {
            kept.push(a.alloc::<u8>(&a.default_stream(), 3 << 20).unwrap());
        }
    });
    assert!(!v.passed, "{}", v.report);
    let snap = vramscope::Snapshot::load(dir.join("mem_tests__several_allocators/snapshot.json")).unwrap();
    assert!(snap.segments.len() >= allocators.len(), "{} segments", snap.segments.len());
    assert!(snap.segments.windows(2).all(|w| w[0].address < w[1].address));
    let _ = std::fs::remove_dir_all(&dir);
}
