//! Allocation traces: what a replay replays, read from a PyTorch snapshot pickle or from the
//! compact `*.trace.json` form, either of them gzipped or not.

use crate::error::{Error, Result};
use crate::record::Action;
use crate::snapshot::{sniff, FileKind, Snapshot};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One allocation or free in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Allocation or free.
    pub op: TraceOp,
    /// The address the recorded program got (used only to pair frees with allocations).
    pub addr: u64,
    /// Bytes requested.
    pub size: u64,
    /// The stream of the recorded program.
    pub stream: u64,
}

/// What a [`TraceEvent`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TraceOp {
    /// An allocation.
    Alloc,
    /// A free (PyTorch's `free_completed`).
    Free,
}

/// A sequence of allocations and frees of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Where it came from, for reports.
    pub source: String,
    /// The events in order.
    pub events: Vec<TraceEvent>,
}

fn format_err(source: &str, message: impl Into<String>) -> Error {
    Error::Format { source_name: source.to_string(), message: message.into() }
}

impl Trace {
    /// Reads a trace from a file: a PyTorch snapshot pickle (its `device_traces`) or a JSON trace
    /// `{"events": [["a"|"f", addr, size, stream], ...]}`, either of them gzipped or not.
    /// A pickle is parsed as it is read, never held whole.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Trace> {
        let path = path.as_ref();
        let (mut input, limit) = crate::snapshot::open_input(path, "a JSON trace")?;
        let source = path.display().to_string();
        match input.kind {
            FileKind::Pickle => {
                Self::from_snapshot(Snapshot::from_pytorch_input(&mut input, &source, limit, Vec::new())?, &source)
            }
            FileKind::Json => Self::from_bytes_within(&input.read_all()?, &source, limit),
        }
    }

    /// Reads a trace from bytes; `source` names them in errors.
    pub fn from_bytes(data: &[u8], source: &str) -> Result<Trace> {
        Self::from_bytes_within(data, source, crate::snapshot::read_limit(data.len() as u64)?)
    }

    fn from_bytes_within(data: &[u8], source: &str, limit: crate::snapshot::ReadLimit) -> Result<Trace> {
        match sniff(data, "a JSON trace").map_err(|m| format_err(source, m))? {
            FileKind::Pickle => Self::from_pickle(data, source, limit),
            FileKind::Json => Self::from_json(data, source),
        }
    }

    fn from_json(data: &[u8], source: &str) -> Result<Trace> {
        #[derive(Deserialize)]
        struct Compact {
            events: Vec<(String, u64, u64, Option<u64>)>,
        }
        let c: Compact = serde_json::from_slice(data).map_err(|e| {
            format_err(
                source,
                format!("not a JSON trace ({e}); expected {{\"events\": [[\"a\"|\"f\", addr, size, stream], ...]}}"),
            )
        })?;
        let mut events = Vec::with_capacity(c.events.len());
        for (i, (op, addr, size, stream)) in c.events.into_iter().enumerate() {
            let op = match op.as_str() {
                "a" => TraceOp::Alloc,
                "f" => TraceOp::Free,
                other => {
                    return Err(format_err(
                        source,
                        format!("event {i}: unknown operation `{other}`; expected \"a\" or \"f\""),
                    ))
                }
            };
            events.push(TraceEvent { op, addr, size, stream: stream.unwrap_or(0) });
        }
        Ok(Trace { source: source.to_string(), events })
    }

    /// The allocations and completed frees of a PyTorch snapshot's `device_traces` (of the
    /// device with the most events), read as a [`Snapshot`]'s history.
    fn from_pickle(data: &[u8], source: &str, limit: crate::snapshot::ReadLimit) -> Result<Trace> {
        Self::from_snapshot(Snapshot::from_pytorch_pickle_within(data, source, limit)?, source)
    }

    /// The trace of a snapshot read from PyTorch's pickle (see [`Trace::from_pickle`]).
    fn from_snapshot(all: Snapshot, source: &str) -> Result<Trace> {
        let mut events_on: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
        for e in &all.history {
            *events_on.entry(e.device.unwrap_or(all.device)).or_default() += 1;
        }
        // The device with the most events (the lowest of equals); the snapshot's own if none.
        let busiest =
            events_on.iter().max_by_key(|&(&d, &n)| (n, std::cmp::Reverse(d))).map_or(all.device, |(&d, _)| d);
        let snap = all.for_device(busiest);
        let events = snap
            .history
            .iter()
            .filter_map(|e| {
                let op = match e.action {
                    Action::Alloc => TraceOp::Alloc,
                    Action::FreeCompleted => TraceOp::Free,
                    _ => return None,
                };
                Some(TraceEvent { op, addr: e.addr, size: e.size, stream: e.stream })
            })
            .collect();
        Ok(Trace { source: source.to_string(), events })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_trace() {
        let t = Trace::from_bytes(br#"{"events":[["a",4096,100,0],["f",4096,100,0]]}"#, "t").unwrap();
        assert_eq!(t.events.len(), 2);
        assert_eq!(t.events[1].op, TraceOp::Free);
    }

    #[test]
    fn clear_errors() {
        let e = Trace::from_bytes(b"", "x.json").unwrap_err().to_string();
        assert_eq!(e, "x.json: the file is empty");
        let e = Trace::from_bytes(b"hello", "x").unwrap_err().to_string();
        assert!(e.contains("neither"), "{e}");
        let e = Trace::from_bytes(br#"{"events":[["z",1,2,0]]}"#, "x").unwrap_err().to_string();
        assert!(e.contains("event 0") && e.contains("`z`"), "{e}");
        let e = Trace::from_bytes(br#"{"events":[["a",-1,2,0]]}"#, "x").unwrap_err().to_string();
        assert!(e.contains("not a JSON trace"), "{e}");
        // pickle.dumps({"x": 1}, protocol=4)
        let e = Trace::from_bytes(b"\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01x\x94K\x01s.", "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("segments"), "{e}");
    }
}
