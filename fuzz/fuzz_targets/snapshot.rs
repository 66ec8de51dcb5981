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
    // What vramscope writes, it reads back.
    Snapshot::from_bytes(snap.to_json().as_bytes(), "fuzz.json").expect("our JSON reads back");
    Snapshot::from_bytes(&snap.to_pytorch_pickle(), "fuzz.pickle").expect("our pickle reads back");
});
