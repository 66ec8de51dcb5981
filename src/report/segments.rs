use super::bytes;
use crate::snapshot::{BlockState, Snapshot};

/// Each segment's map: used, free and rounding waste, and the largest free block. Blocks are
/// drawn one character per 1/64 of the segment: `#` allocated, `~` waiting for another stream,
/// `.` free.
pub fn segments(snapshot: &Snapshot) -> String {
    let mut s = String::new();
    let total: u64 = snapshot.segments.iter().map(|g| g.total_size).fold(0, u64::saturating_add);
    s.push_str(&format!(
        "{} segments, {} reserved (sN: stream N; # allocated, ~ awaiting a stream, . free)\n",
        snapshot.segments.len(),
        bytes(total)
    ));
    for (i, seg) in snapshot.segments.iter().enumerate() {
        let sum = seg.summary();
        let mut map = vec!['.'; 64];
        for b in &seg.blocks {
            let c = match b.state {
                BlockState::ActiveAllocated => '#',
                BlockState::ActivePendingFree => '~',
                BlockState::Inactive => continue,
            };
            let span = seg.total_size.max(1) as u128;
            let lo = ((b.address.saturating_sub(seg.address)) as u128 * 64 / span) as usize;
            let end = b.address.saturating_sub(seg.address) as u128 + b.size as u128;
            let hi = (end * 64).div_ceil(span).min(64) as usize;
            for m in map.iter_mut().take(hi.min(64)).skip(lo.min(63)) {
                *m = c;
            }
        }
        // Two lines of at most 100 columns: figures, then the map with the largest free block.
        s.push_str(&format!(
            "#{i:<4} {:<5} s{:<3} {:>11}  used {:>11}  free {:>11}  waste {:>11} {:>6} {}\n      [{}]  largest free {}\n",
            seg.pool,
            seg.stream,
            bytes(seg.total_size),
            bytes(sum.allocated),
            bytes(sum.free),
            bytes(sum.waste),
            seg.blocks.len(),
            if seg.blocks.len() == 1 { "block" } else { "blocks" },
            map.into_iter().collect::<String>(),
            bytes(sum.largest_free),
        ));
    }
    s
}
