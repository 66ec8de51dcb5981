//! Scopes in async code: `Scope::wrap` carries a scope into tasks on a multi-threaded runtime.

use vramscope::testing::MemTest;
use vramscope::Buffer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapped_tasks_allocate_inside_the_scope_on_any_worker() {
    let alloc = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    let _g = vramscope::scope("async_scopes::outer");
    let here = vramscope::current_scope();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let alloc = alloc.clone();
            tokio::spawn(here.wrap(async move {
                tokio::task::yield_now().await;
                let b = alloc.alloc::<u8>(&alloc.default_stream(), 1000 + i).unwrap();
                tokio::task::yield_now().await;
                (b, vramscope::current_scope().path())
            }))
        })
        .collect();
    let mut kept: Vec<Buffer<u8>> = Vec::new();
    for t in tasks {
        let (b, path) = t.await.unwrap();
        assert_eq!(path, ["async_scopes::outer"]);
        kept.push(b);
    }
    assert_eq!(alloc.scope_usage(here).blocks, 8);
    drop(_g);
}

/// A memory test whose body spawns tasks on a multi-threaded runtime: wrapped tasks count.
#[test]
fn a_memory_test_sees_wrapped_tasks() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let alloc = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
    let mut kept = Vec::new();
    let v = MemTest::new("async_scopes::leaky").iters(3).check(|| {
        let here = vramscope::current_scope();
        let a = alloc.clone();
        let b = rt.block_on(async {
            tokio::spawn(here.wrap(async move { a.alloc::<u8>(&a.default_stream(), 4096).unwrap() })).await
        });
        kept.push(b.unwrap());
    });
    assert!(!v.passed, "{}", v.report);
    assert_eq!(v.growth, 3 * 4096);
}
