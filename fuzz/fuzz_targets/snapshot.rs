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
    assert!(json == snap, "the JSON read back differs: {}", first_difference(&snap, &json));
    let pickle = snap.to_pytorch_pickle();
    let again = Snapshot::from_bytes(&pickle, "fuzz.pickle").expect("our pickle reads back");
    assert!(again.to_pytorch_pickle() == pickle, "a second round trip through the pickle differs");
});

/// The first line where two snapshots' pretty debug forms differ, with the field path above it:
/// a whole snapshot printed twice runs to megabytes, and CI keeps only a log's last lines.
fn first_difference(a: &Snapshot, b: &Snapshot) -> String {
    let (a, b) = (format!("{a:#?}"), format!("{b:#?}"));
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) else {
        return format!("one is {} lines long, the other {}", a.len(), b.len());
    };
    // The enclosing fields: the nearest less indented lines above the difference.
    let mut path = Vec::new();
    let mut indent = a[i].len() - a[i].trim_start().len();
    for line in a[..i].iter().rev() {
        let d = line.len() - line.trim_start().len();
        if d < indent {
            path.push(line.trim());
            indent = d;
        }
    }
    path.reverse();
    format!("line {i}, under {}: {} against {}", path.join(" > "), a[i].trim(), b[i].trim())
}
