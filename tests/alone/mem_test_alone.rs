//! A memory test that runs alone in its process: growth outside its scope (a thread that never
//! entered it) can be told apart from a neighbour's, and fails the test with the sites that grew.
//! Alone in its own process on purpose: with other memory tests running beside it, that
//! growth could be theirs, and is not judged.

use vramscope::testing::MemTest;

#[test]
fn growth_from_a_thread_outside_the_scope_is_reported_when_alone() {
    if crate::in_child(module_path!(), "growth_from_a_thread_outside_the_scope_is_reported_when_alone") {
        return;
    }
    // A memory test whose body panics (as a `#[should_panic]` test's does) first: it must not
    // stay counted as running, or the test below would never run alone.
    let panicked =
        std::panic::catch_unwind(|| MemTest::new("mem_test_alone::panics").iters(2).check::<()>(|| panic!("boom")));
    assert!(panicked.is_err());
    let line = line!() + 7;
    let v = MemTest::new("mem_test_alone::outside").iters(3).check(|| {
        // Allocates inside the scope too, so that the body is seen allocating.
        let a = vramscope::device(0);
        drop(a.alloc::<u8>(&a.default_stream(), 100).unwrap());
        std::thread::spawn(|| {
            let a = vramscope::device(0);
            std::mem::forget(a.alloc::<u8>(&a.default_stream(), 8192).unwrap());
        })
        .join()
        .unwrap();
    });
    assert!(!v.passed, "{}", v.report);
    assert_eq!(v.growth, 0, "nothing grew inside the scope");
    assert_eq!(v.unattributed_growth, Some(3 * 8192));
    assert!(
        v.report.contains(
            "live bytes outside the test's scope grew\n  by 24,576 B (24.00 KiB) in 3 iterations \
             (tolerance 0 B), while its own blocks did not."
        ),
        "{}",
        v.report
    );
    // One story: the figures below are those outside the scope, not a table of the test's 0 B.
    assert!(
        v.report.contains(
            "live bytes outside the test's scope (bytes asked for, allocators the body used):\n  \
             grew 24,576 B (24.00 KiB) in 3 iterations, over the tolerance of 0 B\n  \
             at the end of each iteration:"
        ),
        "{}",
        v.report
    );
    assert!(v.report.contains("+8,192 B (8.00 KiB)"), "{}", v.report);
    assert!(!v.report.contains("grew 0 B"), "{}", v.report);
    // Every line fits 100 columns: the site's function (a closure in a closure of a long test
    // name) loses the middle of its name, not its file and line.
    assert!(v.report.lines().all(|l| l.len() <= 100), "{}", v.report);
    let site = format!("tests/alone/mem_test_alone.rs:{line}");
    assert!(v.report.contains(&site), "{site} not in\n{}", v.report);
    assert!(v.report.contains("1 block, 8,192 B (8.00 KiB) per iteration"), "{}", v.report);
    // The table: the warm-up's row and one per measured iteration.
    let is_row = |l: &str| {
        let mut words = l.split_whitespace();
        let number = |w: Option<&str>| w.is_some_and(|w| w.replace(',', "").parse::<u64>().is_ok());
        number(words.next()) && number(words.next())
    };
    let rows = v.report.lines().filter(|l| is_row(l)).count();
    assert_eq!(rows, 4, "{}", v.report);

    // Growth outside the scope exactly at the tolerance passes; so does growth that skipped an
    // iteration, whatever its total: only growth at every measured iteration is the body's.
    let leak_outside = || {
        std::thread::spawn(|| {
            let a = vramscope::device(0);
            std::mem::forget(a.alloc::<u8>(&a.default_stream(), 8192).unwrap());
        })
        .join()
        .unwrap();
    };
    let inside = || {
        let a = vramscope::device(0);
        drop(a.alloc::<u8>(&a.default_stream(), 100).unwrap());
    };
    let v = MemTest::new("mem_test_alone::at_tolerance").iters(3).tolerance(3 * 8192).check(|| {
        inside();
        leak_outside();
    });
    assert!(v.passed, "{}", v.report);
    let mut i = 0;
    let v = MemTest::new("mem_test_alone::odd_iterations").iters(4).check(|| {
        i += 1;
        inside();
        if i % 2 == 1 {
            leak_outside();
        }
    });
    assert!(v.passed, "{}", v.report);
    assert_eq!(v.unattributed_growth, Some(2 * 8192), "{}", v.report);

    // Growth outside the scope in an allocator the body never allocated in is another's (a
    // plain test running beside it in the binary, with an allocator of its own): not judged.
    let theirs = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(64 << 20));
    let mut kept = Vec::new();
    let v = MemTest::new("mem_test_alone::neighbour").iters(3).check(|| {
        inside();
        let b = std::thread::scope(|s| s.spawn(|| theirs.alloc::<u8>(theirs.default_stream(), 8192).unwrap()).join());
        kept.push(b.unwrap());
    });
    assert!(v.passed, "{}", v.report);
    assert_eq!(v.unattributed_growth, Some(0), "{}", v.report);
    assert_eq!(theirs.memory_allocated(), 4 * 8192, "the neighbour's blocks are live");
}
