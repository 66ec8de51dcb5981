//! The snapshot readers (PyTorch pickles and vramscope's JSON) and every report over what loads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope::report::{self, FoldedKind};
use vramscope::Snapshot;

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = Snapshot::from_bytes(data, "fuzz") else { return };
    let _ = report::live(&snap);
    let _ = report::leaks(&snap);
    let _ = report::segments(&snap);
    let _ = report::summary(&snap);
    let _ = report::diff(&snap, &snap);
    let folded = report::folded(&snap, FoldedKind::Live);
    let _ = report::flamegraph(&folded, "fuzz");
    let _ = report::folded(&snap, FoldedKind::Allocated);
    // What vramscope writes, it reads back: the JSON as the same snapshot, the pickle as one
    // that writes the same pickle again.
    let json = Snapshot::from_bytes(snap.to_json().as_bytes(), "fuzz.json").expect("our JSON reads back");
    assert_eq!(json, snap, "the JSON read back differs");
    let pickle = snap.to_pytorch_pickle();
    let again = Snapshot::from_bytes(&pickle, "fuzz.pickle").expect("our pickle reads back");
    assert!(again.to_pytorch_pickle() == pickle, "a second round trip through the pickle differs");
});
