//! Reading PyTorch's memory snapshots (`torch.cuda.memory._snapshot()` dumped with pickle)
//! into a [`Snapshot`].

mod budget;
mod tables;
mod trace;

use super::pickle::{self, Value};
use crate::error::{Error, Result};
use crate::model::stats::Pool;
use crate::model::stats_of;
use crate::model::SNAPSHOT_VERSION;
use crate::model::{
    BlockInfo, BlockState, ContextInfo, HistoryEntry, ScopeId, SegmentInfo, Snapshot, StackId, ThreadId, MAX_DEVICES,
};
use crate::record::Action;
use budget::Budget;
use trace::{read_history, TraceReader};

fn bad(source: &str, message: impl Into<String>) -> Error {
    Error::Format { source_name: source.to_string(), message: message.into() }
}

/// Files from this size on are freed on a thread of their own once read.
const DROP_ELSEWHERE_ABOVE: usize = 16 << 20;

/// An optional string field of `v` (absent or `None` is `None`), its bytes counted against the
/// budget.
fn text(v: &Value, key: &str, budget: &mut Budget, at: &dyn Fn() -> String, source: &str) -> Result<Option<String>> {
    match v.get(key) {
        None | Some(Value::None) => Ok(None),
        Some(s @ Value::Str(_)) => {
            budget.spend_bytes(s.byte_len(), at, source)?;
            Ok(s.as_str().map(str::to_string))
        }
        Some(x) => Err(bad(source, format!("{}: `{key}` is a {}, expected a string", at(), x.type_name()))),
    }
}

fn uint(v: &Value, key: &str, at: &dyn Fn() -> String, source: &str) -> Result<u64> {
    field_uint(v.get(key).as_ref(), key, at, source)
}

/// A field's value (`v`, `None` where absent) as a non-negative integer below 2^64.
fn field_uint(v: Option<&Value>, key: &str, at: &dyn Fn() -> String, source: &str) -> Result<u64> {
    let x = v.ok_or_else(|| bad(source, format!("{}: missing `{key}`", at())))?;
    x.as_i128()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| bad(source, format!("{}: `{key}` is {x:?}, expected a non-negative integer below 2^64", at())))
}

/// A block's `dtype`, which vramscope writes for blocks described as tensors (PyTorch does not).
fn tensor_dtype(b: &Value, at: &dyn Fn() -> String, source: &str) -> Result<Option<String>> {
    match b.get("dtype") {
        None | Some(Value::None) => Ok(None),
        Some(v) => match v.as_str() {
            Some(s) => Ok(Some(s.to_string())),
            None => Err(bad(source, format!("{}: `dtype` is a {}, expected a string", at(), v.type_name()))),
        },
    }
}

/// A block's `shape` (see [`tensor_dtype`]), its dimensions counted against the budget.
fn tensor_shape(b: &Value, budget: &mut Budget, at: &dyn Fn() -> String, source: &str) -> Result<Option<Vec<usize>>> {
    let v = match b.get("shape") {
        None | Some(Value::None) => return Ok(None),
        Some(v) => v,
    };
    let dims =
        v.items().ok_or_else(|| bad(source, format!("{}: `shape` is a {}, expected a list", at(), v.type_name())))?;
    budget.spend(dims.len(), at, source)?;
    dims.iter()
        .enumerate()
        .map(|(i, d)| {
            d.as_i128()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad(source, format!("{}: `shape[{i}]` is {d:?}, expected a non-negative integer", at())))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn context(stack: Option<StackId>) -> Option<ContextInfo> {
    context_in(stack, ScopeId::ROOT)
}

/// PyTorch records no threads: every context is thread 0, `unknown`.
fn context_in(stack: Option<StackId>, scope: ScopeId) -> Option<ContextInfo> {
    (stack.is_some() || scope != ScopeId::ROOT).then_some(ContextInfo { stack, scope, thread: ThreadId(0), step: 0 })
}

/// Nesting allowed in the free-form parts kept as read (settings, annotations).
pub(super) const MAX_DEPTH: usize = 32;

/// A pickle value as JSON, for the parts of a PyTorch snapshot kept as read; every element
/// counts against the budget, and nesting is bounded.
fn to_json(
    v: &Value,
    depth: usize,
    budget: &mut Budget,
    at: &dyn Fn() -> String,
    source: &str,
) -> Result<serde_json::Value> {
    use serde_json::Value as J;
    if depth > MAX_DEPTH {
        return Err(bad(source, format!("{}: nested more than {MAX_DEPTH} deep", at())));
    }
    budget.spend(v.len().max(1), at, source)?;
    // Each reference copies a string; bytes become a list of numbers, 32 bytes each.
    match v {
        Value::Str(_) => budget.spend_bytes(v.byte_len(), at, source)?,
        Value::Bytes(_) => budget.spend_bytes(v.byte_len().saturating_mul(32), at, source)?,
        _ => {}
    }
    Ok(match v {
        Value::None => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::Big(i) => match u64::try_from(**i) {
            Ok(n) => J::from(n),
            _ => return Err(bad(source, format!("{}: integer {i} does not fit 64 bits", at()))),
        },
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::Kept(_) => {
            return Err(bad(source, format!("{}: a {} where plain data was expected", at(), v.type_name())))
        }
        Value::Str(s) => J::String(s.to_string()),
        Value::Bytes(b) => J::Array(b.iter().map(|&x| J::from(x)).collect()),
        Value::List(_) | Value::Tuple(_) => {
            let items = v.items().unwrap_or_default();
            J::Array(items.iter().map(|x| to_json(x, depth + 1, budget, at, source)).collect::<Result<_>>()?)
        }
        Value::Dict(d) => {
            let mut m = serde_json::Map::new();
            for (k, x) in d.borrow().iter() {
                let key = match k {
                    Value::Str(s) => s.to_string(),
                    other => other.as_i128().map_or_else(|| format!("{other:?}"), |n| n.to_string()),
                };
                m.insert(key, to_json(x, depth + 1, budget, at, source)?);
            }
            J::Object(m)
        }
    })
}

impl Snapshot {
    /// Reads a snapshot from a file: vramscope's JSON or a PyTorch snapshot pickle, either of
    /// them gzipped or not (told by the file's first bytes, not its name).
    ///
    /// What the file may expand to, and what the reader builds of it, are bounded by the read
    /// limit ([`config::READ_LIMIT_ENV`](crate::config::READ_LIMIT_ENV)).
    ///
    /// A pickle is parsed as it is read (and decompressed, on another thread), never held
    /// whole.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Snapshot> {
        Self::load_with(path.as_ref(), Vec::new())
    }

    /// [`Snapshot::load`], into the memory of `before`, a snapshot read before (where there is
    /// one), which is dropped: its history's room holds the new history where the file is a
    /// PyTorch pickle. Reading many files one after another (a job's ranks), the system is asked
    /// for each history's memory once, not once per file: a pickle's history is most of what is
    /// read, and memory the system hands out afresh costs a fault per page on its first write.
    ///
    /// ```no_run
    /// # fn main() -> vramscope::Result<()> {
    /// use vramscope::{report, snapshot::Snapshot};
    /// let mut parts = Vec::new();
    /// let mut last: Option<Snapshot> = None;
    /// for rank in ["rank0.pickle", "rank1.pickle"] {
    ///     let snap = Snapshot::load_reusing(rank, last.take())?;
    ///     parts.push(report::rank_part(rank, &snap));
    ///     last = Some(snap);
    /// }
    /// print!("{}", report::ranks_from(parts).render());
    /// # Ok(())
    /// # }
    /// ```
    pub fn load_reusing(path: impl AsRef<std::path::Path>, before: Option<Snapshot>) -> Result<Snapshot> {
        // The history's buffer is kept; the rest of `before` is freed here, not held through
        // the read.
        let mut room = before.map(|mut before| std::mem::take(&mut before.history)).unwrap_or_default();
        room.clear();
        Self::load_with(path.as_ref(), room)
    }

    /// [`Snapshot::load`], the history of a pickle read into `room` (empty).
    fn load_with(path: &std::path::Path, room: Vec<HistoryEntry>) -> Result<Snapshot> {
        let (mut input, limit) = super::open_input(path, "a vramscope JSON snapshot")?;
        let source = path.display().to_string();
        match input.kind {
            super::FileKind::Pickle => Self::from_pytorch_input(&mut input, &source, limit, room),
            super::FileKind::Json => Self::from_bytes_within(&input.read_all()?, &source, limit),
        }
    }

    /// Reads PyTorch's snapshot pickle from an opened file, parsed as it is read; its history
    /// goes into `room` (empty), grown as needed.
    pub(crate) fn from_pytorch_input(
        input: &mut super::Input,
        source: &str,
        limit: crate::snapshot::ReadLimit,
        room: Vec<HistoryEntry>,
    ) -> Result<Snapshot> {
        let size = input.plain_size().and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
        let read = Self::read_pytorch_pickle(input, size, source, limit, room);
        // What stopped the file's read is the error, not what the parser made of it.
        let snap = match (read, input.failure()) {
            (_, Some(e)) => return Err(e),
            (read, None) => read?,
        };
        Self::checked_pytorch(snap, source)
    }

    /// Reads a snapshot from bytes (JSON or pickle); `source` names them in errors.
    pub fn from_bytes(data: &[u8], source: &str) -> Result<Snapshot> {
        Self::from_bytes_within(data, source, super::read_limit(data.len() as u64)?)
    }

    pub(crate) fn from_bytes_within(data: &[u8], source: &str, limit: crate::snapshot::ReadLimit) -> Result<Snapshot> {
        match super::sniff(data, "a vramscope JSON snapshot").map_err(|m| bad(source, m))? {
            super::FileKind::Pickle => Self::from_pytorch_pickle_within(data, source, limit),
            super::FileKind::Json => {
                // The version first, then the consistency, each with its own message.
                let mut de = serde_json::Deserializer::from_slice(data);
                let snap =
                    Snapshot::deserialize_unchecked(&mut de).and_then(|s| de.end().map(|()| s)).map_err(|e| {
                        bad(source, format!("not a vramscope snapshot ({e}); expected the JSON that `snapshot` writes"))
                    })?;
                if snap.version == 0 {
                    return Err(bad(
                        source,
                        "snapshot format version 0: versions start at 1; not a file vramscope wrote",
                    ));
                }
                if snap.version > super::SNAPSHOT_VERSION {
                    return Err(bad(
                        source,
                        format!(
                            "snapshot format version {} is newer than this build reads (up to {}): update vramscope",
                            snap.version,
                            super::SNAPSHOT_VERSION
                        ),
                    ));
                }
                snap.validate().map_err(|m| bad(source, format!("inconsistent snapshot: {m}")))?;
                Ok(snap)
            }
        }
    }

    /// Reads PyTorch's snapshot pickle: segments with their blocks and frames, and every
    /// device's `device_traces` as the history; an inconsistent one is refused.
    pub fn from_pytorch_pickle(data: &[u8], source: &str) -> Result<Snapshot> {
        Self::from_pytorch_pickle_within(data, source, super::read_limit(data.len() as u64)?)
    }

    pub(crate) fn from_pytorch_pickle_within(
        mut data: &[u8],
        source: &str,
        limit: crate::snapshot::ReadLimit,
    ) -> Result<Snapshot> {
        let size = data.len();
        let snap = Self::read_pytorch_pickle(&mut data, size, source, limit, Vec::new())?;
        Self::checked_pytorch(snap, source)
    }

    /// `snap`, read from a PyTorch pickle, if it is consistent.
    fn checked_pytorch(snap: Snapshot, source: &str) -> Result<Snapshot> {
        snap.validate().map_err(|m| {
            bad(source, format!("inconsistent PyTorch snapshot (segments counted in address order): {m}"))
        })?;
        Ok(snap)
    }

    /// Reads a snapshot pickle from `data`, parsed as it is read; `size` is its size where
    /// known (0 where not: its budget grows as it is read); the history goes into `room`.
    fn read_pytorch_pickle(
        data: &mut dyn std::io::Read,
        size: usize,
        source: &str,
        limit: crate::snapshot::ReadLimit,
        room: Vec<HistoryEntry>,
    ) -> Result<Snapshot> {
        let mut traces = TraceReader::new(source, Budget::for_bytes(size, limit), room);
        let (root, read, memo) = pickle::parse_with(data, &mut traces).map_err(|f| match f {
            pickle::Failure::Pickle(e) => bad(source, e.to_string()),
            pickle::Failure::Reader(e) => e,
        })?;
        traces.budget.grow(read);
        let snapshot = Snapshot::from_pickle_value(&root, traces, source);
        // A large file's value tree takes a fifth of the read to free: another core frees it
        // while the caller goes on with the snapshot.
        if read >= DROP_ELSEWHERE_ABOVE {
            // SAFETY: `from_pickle_value` has returned and dropped the trace reader, and with
            // them every clone they made (`Tables` and `TraceLists` keep clones, and are gone);
            // the snapshot it built owns copies, not values of the tree; the memo holds values
            // of the tree alone, and goes with it.
            let tree = unsafe { pickle::Detached::new(root, memo) };
            let _ = std::thread::Builder::new().name("vramscope-free".into()).spawn(move || drop(tree));
        }
        snapshot
    }

    fn from_pickle_value(root: &Value, traces: TraceReader<'_>, source: &str) -> Result<Snapshot> {
        let TraceReader { tables: mut t, mut budget, lists, .. } = traces;
        let segments_v = root.get("segments").ok_or_else(|| {
            bad(source, format!("a {} without `segments`: not a PyTorch memory snapshot", root.type_name()))
        })?;
        budget.spend(segments_v.len(), &|| "segments".to_string(), source)?;
        let segs = segments_v
            .items()
            .ok_or_else(|| bad(source, format!("`segments` is a {}, expected a list", segments_v.type_name())))?;
        let mut segments = Vec::with_capacity(segs.len());
        for (si, seg) in segs.iter().enumerate() {
            let at = || format!("segments[{si}]");
            budget.spend(seg.len(), &at, source)?;
            let device = match seg.get("device") {
                None | Some(Value::None) => 0,
                Some(d) => {
                    d.as_i128().and_then(|d| usize::try_from(d).ok()).filter(|&d| d < MAX_DEVICES).ok_or_else(|| {
                        bad(source, format!("{}: `device` is {d:?}, expected a device index below {MAX_DEVICES}", at()))
                    })?
                }
            };
            let blocks_v = seg.get("blocks");
            budget.spend(blocks_v.as_ref().map_or(0, Value::len), &at, source)?;
            let blocks_v = blocks_v.and_then(|b| b.items()).unwrap_or_default();
            let mut blocks = Vec::with_capacity(blocks_v.len());
            for (bi, b) in blocks_v.iter().enumerate() {
                let at = || format!("segments[{si}].blocks[{bi}]");
                budget.spend(b.len(), &at, source)?;
                let state = match b.get("state").as_ref().and_then(Value::as_str) {
                    Some("active_allocated") => BlockState::ActiveAllocated,
                    Some("active_pending_free") => BlockState::ActivePendingFree,
                    Some("inactive") => BlockState::Inactive,
                    other => return Err(bad(source, format!("{}: unknown block state {other:?}", at()))),
                };
                let stack = t.stack(b.get("frames").as_ref(), None, &mut budget, &at, source)?;
                // vramscope writes a block's scope beside its frames (not in PyTorch's schema):
                // it stands where the allocation's entry has left the trace.
                let scope = t.scope(b.get("user_metadata").as_ref(), &mut budget, &at, source)?;
                blocks.push(BlockInfo {
                    address: uint(b, "address", &at, source)?,
                    size: uint(b, "size", &at, source)?,
                    requested_size: uint(b, "requested_size", &at, source).unwrap_or(0),
                    state,
                    dtype: tensor_dtype(b, &at, source)?,
                    shape: tensor_shape(b, &mut budget, &at, source)?,
                    context: context_in(stack, scope),
                });
            }
            let total_size = uint(seg, "total_size", &at, source)?;
            let made_by = t.stack(seg.get("frames").as_ref(), None, &mut budget, &at, source)?;
            segments.push(SegmentInfo {
                address: uint(seg, "address", &at, source)?,
                total_size,
                mapped_size: total_size,
                expandable: seg.get("is_expandable").is_some_and(|v| v.as_i128() == Some(1)),
                stream: uint(seg, "stream", &at, source).unwrap_or(0),
                pool: match seg.get("segment_type").as_ref().and_then(Value::as_str) {
                    Some("small") => Pool::Small,
                    _ => Pool::Large,
                },
                pool_id: match seg.get("segment_pool_id") {
                    None | Some(Value::None) => None,
                    Some(v) => {
                        let ids = v.items().unwrap_or_default();
                        let id = |i: usize| ids.get(i).and_then(Value::as_i128).and_then(|n| u64::try_from(n).ok());
                        match (ids.len(), id(0), id(1)) {
                            (2, Some(0), Some(0)) => None,
                            (2, Some(a), Some(b)) => Some((a, b)),
                            _ => {
                                return Err(bad(
                                    source,
                                    format!("{}: `segment_pool_id` is {v:?}, expected a pair of integers", at()),
                                ))
                            }
                        }
                    }
                },
                allocated_size: uint(seg, "allocated_size", &at, source).unwrap_or(0),
                active_size: uint(seg, "active_size", &at, source).unwrap_or(0),
                requested_size: uint(seg, "requested_size", &at, source).unwrap_or(0),
                blocks,
                context: context(made_by),
                // vramscope's own key: whose memory it is (PyTorch writes none).
                source: text(seg, "source", &mut budget, &at, source)?,
                device: Some(device),
            });
        }
        segments.sort_by_key(|s| s.address);
        let read = read_history(root, lists, &mut t, &mut budget, source)?;
        let time_origin_us = read.origin_us;
        let mut history = read.entries;
        // Devices are named on each part only in a snapshot of several. The history's devices
        // are those of the traces with entries: no pass over millions of entries finds them.
        let mut devices: Vec<usize> =
            segments.iter().filter_map(|s| s.device).chain(read.devices.iter().copied()).collect();
        devices.sort_unstable();
        devices.dedup();
        let several = devices.len() > 1;
        let device = devices.first().copied().unwrap_or(0);
        for s in &mut segments {
            s.device = s.device.filter(|_| several);
        }
        if let (true, [d]) = (several, &read.devices[..]) {
            for e in &mut history {
                e.device = Some(*d);
            }
        }
        // A block's scope is its allocation's, where the trace still holds the allocation
        // (PyTorch's blocks carry no scope); else what the block itself carries (vramscope writes
        // it beside the block's frames). Where the file names no scope at all (PyTorch's own
        // files: the table holds the root alone), every block's scope is the root already.
        if t.scopes.len() > 1 {
            let mut scope_at: crate::intern::Map<u64, ScopeId> = Default::default();
            for e in history.iter().filter(|e| e.action == Action::Alloc) {
                scope_at.insert(e.addr, e.context.map_or(ScopeId::ROOT, |c| c.scope));
            }
            for b in segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
                let own = b.context.map_or(ScopeId::ROOT, |c| c.scope);
                let scope = if b.state == BlockState::Inactive {
                    ScopeId::ROOT
                } else {
                    scope_at.get(&b.address).copied().unwrap_or(own)
                };
                b.context = context_in(b.context.and_then(|c| c.stack), scope);
            }
        }
        let settings = match root.get("allocator_settings") {
            Some(v) => Some(to_json(&v, 0, &mut budget, &|| "allocator_settings".into(), source)?),
            None => None,
        };
        let annotations = match root.get("external_annotations") {
            Some(v) => match to_json(&v, 0, &mut budget, &|| "external_annotations".into(), source)? {
                serde_json::Value::Array(items) => items,
                other => vec![other],
            },
            None => Vec::new(),
        };
        let stats = stats_of(&segments);
        let (stacks, found) = t.stacks.into_parts();
        // A large table is freed on another core while the caller goes on with the snapshot.
        if found.len() >= 100_000 {
            let _ = std::thread::Builder::new().name("vramscope-free".into()).spawn(move || drop(found));
        }
        Ok(Snapshot {
            version: SNAPSHOT_VERSION,
            device,
            backend: crate::model::PYTORCH_BACKEND.into(),
            segments,
            history,
            history_dropped: 0,
            frames: t.frames.into_items(),
            stacks,
            scopes: t.scopes.into_items(),
            threads: vec!["unknown".into()],
            stats,
            time_origin_us,
            allocator_settings: settings,
            external_annotations: annotations,
            stack_capture: None,
            driver_pool: None,
            ledger: None,
        })
    }
}
