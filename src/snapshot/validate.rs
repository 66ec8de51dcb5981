//! Consistency of a loaded snapshot: every report assumes blocks lie inside their segment in
//! address order without overlapping, and that every index points into its table. A file that
//! breaks one of these is refused with the first inconsistency, its path and its values, rather
//! than reported on with pieces silently skipped: a report over such a file would be wrong.

use super::model::{ContextInfo, Snapshot, MAX_DEVICES};

impl Snapshot {
    /// Checks the snapshot's consistency; the error names the first inconsistency found
    /// (`segments[3].blocks[7]: ...`). Linear in the snapshot's size.
    pub fn validate(&self) -> Result<(), String> {
        let device = |d: usize, at: &dyn Fn() -> String| {
            (d < MAX_DEVICES)
                .then_some(())
                .ok_or_else(|| format!("{}: device {d} is not a device index (0 to {})", at(), MAX_DEVICES - 1))
        };
        device(self.device, &|| "device".into())?;
        for (si, seg) in self.segments.iter().enumerate() {
            seg.device.map_or(Ok(()), |d| device(d, &|| format!("segments[{si}]")))?;
        }
        for (hi, e) in self.history.iter().enumerate() {
            e.device.map_or(Ok(()), |d| device(d, &|| format!("history[{hi}]")))?;
        }
        let mut prev_end: Option<(usize, u64)> = None;
        for (si, seg) in self.segments.iter().enumerate() {
            let end = seg.address.checked_add(seg.total_size).ok_or_else(|| {
                format!("segments[{si}]: address {:#x} + total_size {} overflows 64 bits", seg.address, seg.total_size)
            })?;
            if let Some((pi, pend)) = prev_end {
                if seg.address < pend {
                    return Err(format!(
                        "segments[{si}]: starts at {:#x}, inside segments[{pi}] (which ends at {pend:#x}); \
                         segments must be in address order without overlapping",
                        seg.address
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
                    .ok_or_else(|| format!("{}: address {:#x} + size {} overflows 64 bits", at(), b.address, b.size))?;
                if b.address < seg.address || bend > end {
                    return Err(format!(
                        "{}: block [{:#x}, {bend:#x}) lies outside its segment [{:#x}, {end:#x})",
                        at(),
                        b.address,
                        seg.address
                    ));
                }
                if b.address < cursor {
                    return Err(format!(
                        "{}: block at {:#x} overlaps the block before it, which ends at {cursor:#x}",
                        at(),
                        b.address
                    ));
                }
                cursor = bend;
                if let Some(c) = &b.context {
                    self.check_context(c, &at)?;
                }
            }
        }
        for (hi, h) in self.history.iter().enumerate() {
            if let Some(c) = &h.context {
                self.check_context(c, &|| format!("history[{hi}]"))?;
            }
        }
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
                return Err(format!(
                    "stacks[{ki}][{fi}]: frame {} does not exist (there are {} frames)",
                    stack[fi],
                    self.frames.len()
                ));
            }
        }
        Ok(())
    }

    fn check_context(&self, c: &ContextInfo, at: &dyn Fn() -> String) -> Result<(), String> {
        let check = |what: &str, index: usize, len: usize, zero_ok: bool| {
            // Index 0 of an empty table is "none recorded" (PyTorch snapshots have no scopes).
            if index < len || (zero_ok && index == 0 && len == 0) {
                Ok(())
            } else {
                Err(format!("{}.context: {what} {index} does not exist (there are {len} {what}s)", at()))
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
fn check_depth(v: &serde_json::Value, at: &str) -> Result<(), String> {
    let mut stack = vec![(v, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        if depth > super::torch::MAX_DEPTH {
            return Err(format!("{at}: nested more than {} deep", super::torch::MAX_DEPTH));
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
    use crate::snapshot::model::*;

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
        let e = snap(&[(4096, 4096), (8192, 8192)]).validate().unwrap_err();
        assert_eq!(e, "segments[0].blocks[1]: block [0x2000, 0x4000) lies outside its segment [0x1000, 0x3000)");
        let e = snap(&[(4096, 4096), (6144, 2048)]).validate().unwrap_err();
        assert!(e.starts_with("segments[0].blocks[1]: block at 0x1800 overlaps"), "{e}");
        let e = snap(&[(u64::MAX, 2)]).validate().unwrap_err();
        assert!(e.contains("overflows 64 bits"), "{e}");
    }

    #[test]
    fn indices_out_of_range_are_named() {
        let mut s = snap(&[(4096, 4096)]);
        s.segments[0].blocks[0].context =
            Some(ContextInfo { stack: Some(StackId(3)), scope: ScopeId(0), thread: ThreadId(0), step: 0 });
        let e = s.validate().unwrap_err();
        assert_eq!(e, "segments[0].blocks[0].context: stack 3 does not exist (there are 0 stacks)");
        s.segments[0].blocks[0].context =
            Some(ContextInfo { stack: None, scope: ScopeId(9), thread: ThreadId(0), step: 0 });
        assert!(s.validate().unwrap_err().contains("scope 9 does not exist (there are 1 scopes)"));
        s.segments[0].blocks[0].context = None;
        s.stacks.push(vec![FrameId(0)]);
        assert_eq!(s.validate().unwrap_err(), "stacks[0][0]: frame 0 does not exist (there are 0 frames)");
    }

    /// A device index beyond any machine's is refused: the pickle writer writes a trace list
    /// per device up to the highest.
    #[test]
    fn device_indices_are_bounded() {
        let mut s = snap(&[(4096, 4096)]);
        s.segments[0].device = Some(1 << 60);
        assert_eq!(
            s.validate().unwrap_err(),
            "segments[0]: device 1152921504606846976 is not a device index (0 to 65535)"
        );
        s.segments[0].device = Some(7);
        s.device = usize::MAX;
        assert!(s.validate().unwrap_err().starts_with("device: device 18446744073709551615 is not a device index"));
    }
}
