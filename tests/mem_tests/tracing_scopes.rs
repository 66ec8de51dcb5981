//! Scopes from `tracing` spans (feature `tracing`).
#![cfg(feature = "tracing")]

use tracing_subscriber::prelude::*;
use vramscope::{backend::SimBackend, record::RecordConfig, CachingAllocator};

#[test]
fn entered_spans_become_scopes() {
    let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    alloc.record_memory_history(RecordConfig::default());
    let subscriber = tracing_subscriber::registry().with(vramscope::record::ScopeLayer::default());
    let buf = tracing::subscriber::with_default(subscriber, || {
        let _epoch = tracing::info_span!("epoch").entered();
        let b = {
            let _fwd = tracing::debug_span!("forward").entered();
            alloc.alloc::<u8>(&alloc.default_stream(), 4096).unwrap()
        };
        assert_eq!(vramscope::current_scope().path(), ["epoch"]);
        b
    });
    assert!(vramscope::current_scope().path().is_empty());
    let snap = alloc.snapshot();
    let block = snap.live_blocks().next().unwrap();
    assert_eq!(snap.scopes[block.context.unwrap().scope.index()], ["epoch", "forward"]);
    drop(buf);
}

/// Spans that exit out of order restore the scope by span: with `a` then `b` entered, `a`
/// exiting first leaves `b` (entered from the root) as the scope, and `b` exiting the root.
#[test]
fn out_of_order_exits_restore_scopes_by_span() {
    let subscriber = tracing_subscriber::registry().with(vramscope::record::ScopeLayer::default());
    tracing::subscriber::with_default(subscriber, || {
        let a = tracing::info_span!("a");
        let b = tracing::info_span!("b");
        let ga = a.enter();
        let gb = b.enter();
        assert_eq!(vramscope::current_scope().path(), ["a", "b"]);
        drop(ga);
        assert_eq!(vramscope::current_scope().path(), ["b"]);
        drop(gb);
        assert!(vramscope::current_scope().path().is_empty());
        // In order, as before.
        let ga = a.enter();
        let gb = b.enter();
        drop(gb);
        assert_eq!(vramscope::current_scope().path(), ["a"]);
        drop(ga);
        assert!(vramscope::current_scope().path().is_empty());
    });
}
