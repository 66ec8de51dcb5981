//! Allocation traces: what a replay replays, read from a PyTorch snapshot pickle or from the
//! compact `*.trace.json` form.

use crate::error::{Error, Result};
use crate::snapshot::pickle::{self, Value};
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
    /// `{"events": [["a"|"f", addr, size, stream], ...]}`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Trace> {
        let path = path.as_ref();
        let data = std::fs::read(path).map_err(|error| Error::Io { path: path.display().to_string(), error })?;
        Self::from_bytes(&data, &path.display().to_string())
    }

    /// Reads a trace from bytes; `source` names them in errors.
    pub fn from_bytes(data: &[u8], source: &str) -> Result<Trace> {
        match data.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(0x80) => Self::from_pickle(data, source),
            Some(b'{') => Self::from_json(data, source),
            None => Err(format_err(source, "the file is empty")),
            Some(_) => {
                Err(format_err(source, "neither a PyTorch snapshot pickle (protocol 2 or later) nor a JSON trace"))
            }
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

    fn from_pickle(data: &[u8], source: &str) -> Result<Trace> {
        let root = pickle::parse(data).map_err(|e| format_err(source, e.to_string()))?;
        let traces = root.get("device_traces").ok_or_else(|| {
            format_err(source, format!("a {} without `device_traces`: not a PyTorch memory snapshot", root.type_name()))
        })?;
        let traces = traces.items().ok_or_else(|| {
            format_err(source, format!("`device_traces` is a {}, expected a list", traces.type_name()))
        })?;
        // Replay the device with the most events.
        let mut best: Vec<TraceEvent> = Vec::new();
        for (d, dev) in traces.iter().enumerate() {
            let items = dev.items().ok_or_else(|| {
                format_err(source, format!("device_traces[{d}] is a {}, expected a list", dev.type_name()))
            })?;
            let mut events = Vec::new();
            for (i, e) in items.iter().enumerate() {
                let at = || format!("device_traces[{d}][{i}]");
                let action = e.get("action").and_then(|a| a.as_str().map(str::to_string)).ok_or_else(|| {
                    format_err(source, format!("{}: a {} without a string `action`", at(), e.type_name()))
                })?;
                let op = match action.as_str() {
                    "alloc" => TraceOp::Alloc,
                    "free_completed" => TraceOp::Free,
                    _ => continue,
                };
                let num = |key: &str| -> Result<u64> {
                    let v = e.get(key).ok_or_else(|| format_err(source, format!("{}: missing `{key}`", at())))?;
                    v.as_i128().and_then(|n| u64::try_from(n).ok()).ok_or_else(|| {
                        format_err(
                            source,
                            format!("{}: `{key}` is {v:?}, expected a non-negative integer below 2^64", at()),
                        )
                    })
                };
                let stream = match e.get("stream") {
                    None | Some(Value::None) => 0,
                    Some(_) => num("stream")?,
                };
                events.push(TraceEvent { op, addr: num("addr")?, size: num("size")?, stream });
            }
            if events.len() > best.len() {
                best = events;
            }
        }
        Ok(Trace { source: source.to_string(), events: best })
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
        assert!(e.contains("device_traces"), "{e}");
    }
}
