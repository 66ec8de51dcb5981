//! Consistency of a loaded snapshot: every report assumes blocks lie inside their segment in
//! address order without overlapping, and that every index points into its table. A file that
//! breaks one of these is refused with the first inconsistency, its path and its values, rather
//! than reported on with pieces silently skipped: a report over such a file would be wrong.

use crate::model::{ContextInfo, Snapshot, MAX_DEVICES};

/// What is inconsistent in a snapshot, and where: [`Snapshot::validate`]'s error. Its
/// `Display` names the place and the values (`segments[3].blocks[7]: block at 0x... overlaps
/// the block before it, which ends at 0x...`); [`kind`](Self::kind) says which rule broke, for
/// a caller that handles some of them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inconsistency {
    /// Where: the path of the offending item (`segments[3].blocks[7]`, `history[12].context`).
    pub at: String,
    /// Which rule it breaks, with the values.
    pub kind: InconsistencyKind,
}

/// The rules a snapshot keeps (see [`Inconsistency`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InconsistencyKind {
    /// A device index beyond any machine's (at most 65,535).
    NotADevice {
        /// The index.
        device: usize,
    },
    /// An address plus a size beyond 2^64.
    Overflow {
        /// The address.
        address: u64,
        /// The size.
        size: u64,
    },
    /// A segment starting inside the one before it (segments are in address order).
    SegmentsOverlap {
        /// Where it starts.
        address: u64,
        /// The segment before it, by index.
        previous: usize,
        /// Where that one ends.
        previous_end: u64,
    },
    /// A block not inside its segment.
    BlockOutsideSegment {
        /// The block's start and end.
        block: (u64, u64),
        /// The segment's start and end.
        segment: (u64, u64),
    },
    /// A block starting inside the one before it.
    BlocksOverlap {
        /// Where it starts.
        address: u64,
        /// Where the block before it ends.
        previous_end: u64,
    },
    /// An id that points outside its table.
    MissingEntry {
        /// The table: `stack`, `scope`, `thread` or `frame`.
        table: &'static str,
        /// The id.
        id: usize,
        /// How many entries the table has.
        len: usize,
    },
    /// Kept-as-read data (settings, annotations) nested deeper than the reader accepts.
    TooDeep {
        /// The deepest nesting accepted.
        limit: usize,
    },
}

impl std::fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = &self.at;
        match &self.kind {
            InconsistencyKind::NotADevice { device } => {
                write!(f, "{at}: device {device} is not a device index (0 to {})", MAX_DEVICES - 1)
            }
            InconsistencyKind::Overflow { address, size } => {
                write!(f, "{at}: address {address:#x} + size {size} overflows 64 bits")
            }
            InconsistencyKind::SegmentsOverlap { address, previous, previous_end } => write!(
                f,
                "{at}: starts at {address:#x}, inside segments[{previous}] (which ends at {previous_end:#x}); \
                 segments must be in address order without overlapping"
            ),
            InconsistencyKind::BlockOutsideSegment { block: (b0, b1), segment: (s0, s1) } => {
                write!(f, "{at}: block [{b0:#x}, {b1:#x}) lies outside its segment [{s0:#x}, {s1:#x})")
            }
            InconsistencyKind::BlocksOverlap { address, previous_end } => {
                write!(f, "{at}: block at {address:#x} overlaps the block before it, which ends at {previous_end:#x}")
            }
            InconsistencyKind::MissingEntry { table, id, len } => {
                write!(f, "{at}: {table} {id} does not exist (there are {len} {table}s)")
            }
            InconsistencyKind::TooDeep { limit } => write!(f, "{at}: nested more than {limit} deep"),
        }
    }
}

impl std::error::Error for Inconsistency {}

/// An inconsistency at `at`.
fn broken(at: impl Into<String>, kind: InconsistencyKind) -> Inconsistency {
    Inconsistency { at: at.into(), kind }
}

impl Snapshot {
    /// Checks the snapshot's consistency; the error names the first inconsistency found
    /// (`segments[3].blocks[7]: ...`). Linear in the snapshot's size.
    pub fn validate(&self) -> Result<(), Inconsistency> {
        use InconsistencyKind as K;
        let device = |d: usize, at: &dyn Fn() -> String| {
            (d < MAX_DEVICES).then_some(()).ok_or_else(|| broken(at(), K::NotADevice { device: d }))
        };
        device(self.device, &|| "device".into())?;
        for (si, seg) in self.segments.iter().enumerate() {
            seg.device.map_or(Ok(()), |d| device(d, &|| format!("segments[{si}]")))?;
        }
        // One pass over the history (millions of entries) finds its first bad device and its
        // first bad context; they are reported in the order of the checks, the device first.
        let mut history_context = Ok(());
        for (hi, e) in self.history.iter().enumerate() {
            e.device.map_or(Ok(()), |d| device(d, &|| format!("history[{hi}]")))?;
            if let (Some(c), Ok(())) = (&e.context, &history_context) {
                history_context = self.check_context(c, &|| format!("history[{hi}]"));
            }
        }
        let mut prev_end: Option<(usize, u64)> = None;
        for (si, seg) in self.segments.iter().enumerate() {
            let end = seg.address.checked_add(seg.total_size).ok_or_else(|| {
                broken(format!("segments[{si}]"), K::Overflow { address: seg.address, size: seg.total_size })
            })?;
            if let Some((previous, previous_end)) = prev_end {
                if seg.address < previous_end {
                    return Err(broken(
                        format!("segments[{si}]"),
                        K::SegmentsOverlap { address: seg.address, previous, previous_end },
                    ));
                }
            }
            prev_end = Some((si, end));
            let mut cursor = seg.address;
            for (bi, b) in seg.blocks.iter().enumerate() {
                let at = || format!("segments[{si}].blocks[{bi}]");
                let bend = b
                    .address
                    .checked_add(b.size)
                    .ok_or_else(|| broken(at(), K::Overflow { address: b.address, size: b.size }))?;
                if b.address < seg.address || bend > end {
                    return Err(broken(
                        at(),
                        K::BlockOutsideSegment { block: (b.address, bend), segment: (seg.address, end) },
                    ));
                }
                if b.address < cursor {
                    return Err(broken(at(), K::BlocksOverlap { address: b.address, previous_end: cursor }));
                }
                cursor = bend;
                if let Some(c) = &b.context {
                    self.check_context(c, &at)?;
                }
            }
        }
        history_context?;
        for (si, seg) in self.segments.iter().enumerate() {
            if let Some(c) = &seg.context {
                self.check_context(c, &|| format!("segments[{si}]"))?;
            }
        }
        if let Some(settings) = &self.allocator_settings {
            check_depth(settings, "allocator_settings")?;
        }
        for (i, a) in self.external_annotations.iter().enumerate() {
            check_depth(a, &format!("external_annotations[{i}]"))?;
        }
        for (ki, stack) in self.stacks.iter().enumerate() {
            if let Some(fi) = stack.iter().position(|&f| f.index() >= self.frames.len()) {
                let (id, len) = (stack[fi].index(), self.frames.len());
                return Err(broken(format!("stacks[{ki}][{fi}]"), K::MissingEntry { table: "frame", id, len }));
            }
        }
        Ok(())
    }

    fn check_context(&self, c: &ContextInfo, at: &dyn Fn() -> String) -> Result<(), Inconsistency> {
        let check = |table: &'static str, id: usize, len: usize, zero_ok: bool| {
            // Index 0 of an empty table is "none recorded" (PyTorch snapshots have no scopes).
            if id < len || (zero_ok && id == 0 && len == 0) {
                Ok(())
            } else {
                Err(broken(format!("{}.context", at()), InconsistencyKind::MissingEntry { table, id, len }))
            }
        };
        if let Some(s) = c.stack {
            check("stack", s.index(), self.stacks.len(), false)?;
        }
        check("scope", c.scope.index(), self.scopes.len(), true)?;
        check("thread", c.thread.index(), self.threads.len(), true)
    }
}

/// The kept-as-read parts nest at most as deep as the pickle reader accepts, so that what
/// vramscope writes it can read back.
fn check_depth(v: &serde_json::Value, at: &str) -> Result<(), Inconsistency> {
    let limit = super::torch::MAX_DEPTH;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        if depth > limit {
            return Err(broken(at, InconsistencyKind::TooDeep { limit }));
        }
        match v {
            serde_json::Value::Array(items) => stack.extend(items.iter().map(|x| (x, depth + 1))),
            serde_json::Value::Object(m) => stack.extend(m.values().map(|x| (x, depth + 1))),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::InconsistencyKind;
    use crate::model::*;

    fn snap(blocks: &[(u64, u64)]) -> Snapshot {
        let mut s = Snapshot::empty("test");
        let json = format!(
            r#"{{"address":4096,"total_size":8192,"mapped_size":8192,"stream":0,"pool":"small",
               "allocated_size":0,"active_size":0,"requested_size":0,"blocks":[{}]}}"#,
            blocks
                .iter()
                .map(|(a, n)| format!(r#"{{"address":{a},"size":{n},"requested_size":{n},"state":"inactive"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        s.segments.push(serde_json::from_str(&json).unwrap());
        s
    }

    #[test]
    fn blocks_outside_or_overlapping_are_named() {
        assert_eq!(snap(&[(4096, 4096), (8192, 4096)]).validate(), Ok(()));
        let e = snap(&[(4096, 4096), (8192, 8192)]).validate().unwrap_err().to_string();
        assert_eq!(e, "segments[0].blocks[1]: block [0x2000, 0x4000) lies outside its segment [0x1000, 0x3000)");
        let e = snap(&[(4096, 4096), (6144, 2048)]).validate().unwrap_err().to_string();
        assert!(e.starts_with("segments[0].blocks[1]: block at 0x1800 overlaps"), "{e}");
        let e = snap(&[(u64::MAX, 2)]).validate().unwrap_err().to_string();
        assert!(e.contains("overflows 64 bits"), "{e}");
    }

    #[test]
    fn indices_out_of_range_are_named() {
        let mut s = snap(&[(4096, 4096)]);
        s.segments[0].blocks[0].context =
            Some(ContextInfo { stack: Some(StackId(3)), scope: ScopeId(0), thread: ThreadId(0), step: 0 });
        let e = s.validate().unwrap_err();
        assert_eq!(e.to_string(), "segments[0].blocks[0].context: stack 3 does not exist (there are 0 stacks)");
        // The kind is there for a caller that handles some inconsistencies.
        assert_eq!(e.kind, InconsistencyKind::MissingEntry { table: "stack", id: 3, len: 0 });
        assert_eq!(e.at, "segments[0].blocks[0].context");
        s.segments[0].blocks[0].context =
            Some(ContextInfo { stack: None, scope: ScopeId(9), thread: ThreadId(0), step: 0 });
        assert!(s.validate().unwrap_err().to_string().contains("scope 9 does not exist (there are 1 scopes)"));
        s.segments[0].blocks[0].context = None;
        s.stacks.push(vec![FrameId(0)]);
        assert_eq!(s.validate().unwrap_err().to_string(), "stacks[0][0]: frame 0 does not exist (there are 0 frames)");
    }

    /// The history is checked in one pass: its first bad context is the one named, and a bad
    /// device anywhere in it, or a segment out of place, is named before it (the order of the
    /// checks).
    #[test]
    fn the_history_s_first_inconsistency_in_the_order_of_the_checks() {
        let mut s = snap(&[(4096, 4096)]);
        let entry = |stack: u32, device: Option<usize>| {
            let mut e: HistoryEntry =
                serde_json::from_str(r#"{"action":"alloc","addr":4096,"size":4096,"stream":0,"time_ns":0}"#).unwrap();
            e.context =
                Some(ContextInfo { stack: Some(StackId(stack)), scope: ScopeId(0), thread: ThreadId(0), step: 0 });
            e.device = device;
            e
        };
        s.stacks.push(Vec::new());
        s.history = vec![entry(0, None), entry(5, None), entry(7, None)];
        let context = "history[1].context: stack 5 does not exist (there are 1 stacks)";
        assert_eq!(s.validate().unwrap_err().to_string(), context);
        s.history.push(entry(0, Some(1 << 20)));
        assert!(s.validate().unwrap_err().to_string().starts_with("history[3]: device 1048576 is not"));
        s.history.pop();
        s.segments[0].blocks[0].size = 1 << 20;
        assert!(s.validate().unwrap_err().to_string().contains("lies outside its segment"));
        s.segments[0].blocks[0].size = 4096;
        assert_eq!(s.validate().unwrap_err().to_string(), context);
    }

    /// A device index beyond any machine's is refused: the pickle writer writes a trace list
    /// per device up to the highest.
    #[test]
    fn device_indices_are_bounded() {
        let mut s = snap(&[(4096, 4096)]);
        s.segments[0].device = Some(1 << 60);
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "segments[0]: device 1152921504606846976 is not a device index (0 to 65535)"
        );
        s.segments[0].device = Some(7);
        s.device = usize::MAX;
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("device: device 18446744073709551615 is not a device index"));
    }
}
