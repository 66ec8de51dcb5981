//! Reading PyTorch's memory snapshots (`torch.cuda.memory._snapshot()` dumped with pickle)
//! into a [`Snapshot`].

use super::build::SNAPSHOT_VERSION;
use super::model::{
    BlockInfo, BlockState, ContextInfo, FrameId, HistoryEntry, ScopeId, SegmentInfo, Snapshot, StackId, ThreadId,
    MAX_DEVICES,
};
use super::pickle::{self, Kept, Memo, Value};
use crate::alloc::{MemoryStats, Pool};
use crate::error::{Error, Result};
use crate::intern::Interner;
use crate::record::{Action, Frame};
use std::collections::HashMap;

fn bad(source: &str, message: impl Into<String>) -> Error {
    Error::Format { source_name: source.to_string(), message: message.into() }
}

/// How much work reading a pickle may do: the logical elements it expands to (segments, blocks,
/// frames, events, and the fields looked up in each) and the bytes of text it copies (one
/// element per [`BYTES_PER_ELEMENT`] bytes), against a budget proportional to its size. A
/// pickle's memo lets one list or string appear many times for a few bytes each, so a small
/// file can stand for billions of blocks or gigabytes of text. The 17 PyTorch snapshots under
/// `fixtures/torch` spend 0.18 to 0.60 elements per byte of the file (text included), far below
/// the budget's 8 per byte; what the budget lets a file copy is at most twice the budget in
/// bytes, 16 times the file's size plus 2 MB. Values the pickle shares and the reader keeps
/// once (frames, stacks, scope paths) are read and paid for once, at their first reference;
/// what each reference copies (a compile context, settings) is paid for at each.
///
/// What the reader keeps of the file (the history's entries, the segments' blocks) is also
/// bounded by the read limit, checked before it is built: a file that stands for millions of
/// events in a few bytes each is refused at once, not after it filled memory.
///
/// A file read as it is parsed (a gzipped one, whose size is known only at its end) earns its
/// budget as its bytes are read ([`Budget::grow`]).
struct Budget {
    spent: u64,
    total: u64,
    /// Bytes held for what the reader keeps, against
    /// [`ReadLimit::keep`](super::ReadLimit::keep) of the bytes read.
    held: u64,
    /// The pickle's bytes read so far.
    read: u64,
    limit: super::ReadLimit,
}

impl Budget {
    fn for_bytes(n: usize, limit: super::ReadLimit) -> Budget {
        let mut budget = Budget { spent: 0, total: 0, held: 0, read: 0, limit };
        budget.grow(n);
        budget
    }

    /// Counts the pickle's bytes read so far (`read`, if more than counted).
    fn grow(&mut self, read: usize) {
        self.read = self.read.max(read as u64);
        self.total = 1_000_000u64.saturating_add(self.read.saturating_mul(8));
    }

    /// Holds memory for `n` values of type `T` read at `at`, or says the file expands past
    /// the read limit.
    fn hold<T>(&mut self, n: usize, at: &dyn Fn() -> String, source: &str) -> Result<()> {
        let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let (keep, named) = self.limit.keep(self.read);
        match self.held.checked_add(bytes).filter(|&held| held <= keep) {
            Some(held) => {
                self.held = held;
                Ok(())
            }
            None => Err(bad(
                source,
                format!(
                    "{}: {n} entries would take {}, past what the reader may keep ({named}); to read it, \
                     set a read limit (--read-limit SIZE, or {}=SIZE)",
                    at(),
                    crate::error::fmt_bytes(bytes),
                    super::READ_LIMIT_ENV,
                ),
            )),
        }
    }

    /// Spends the elements that copying `bytes` bytes of text costs.
    fn spend_bytes(&mut self, bytes: usize, at: &dyn Fn() -> String, source: &str) -> Result<()> {
        self.spend(bytes.div_ceil(BYTES_PER_ELEMENT), at, source)
    }

    /// Spends `n` elements for what is read at `at`, or says the file expands too far.
    fn spend(&mut self, n: usize, at: &dyn Fn() -> String, source: &str) -> Result<()> {
        match self.spent.checked_add(n as u64).filter(|&spent| spent <= self.total) {
            Some(spent) => {
                self.spent = spent;
                Ok(())
            }
            None => Err(bad(
                source,
                format!(
                    "{}: the pickle expands to more than {} elements (8 per byte of the file, plus a \
                     million; copied text counts one per {BYTES_PER_ELEMENT} bytes): shared references \
                     repeat the same data far beyond what a memory snapshot holds, refused",
                    at(),
                    self.total
                ),
            )),
        }
    }
}

/// Files from this size on are freed on a thread of their own once read.
const DROP_ELSEWHERE_ABOVE: usize = 16 << 20;

/// Bytes of copied text that cost one element of the [`Budget`].
const BYTES_PER_ELEMENT: usize = 2;

/// Frames, stacks and scopes interned while reading, and what was made of each value the
/// pickle shares, so that a shared frame list, frame or scope string is read once however
/// often it is referenced.
///
/// While the pickle is parsed, what was made of a list or dict goes in its memo slot
/// ([`Kept`]), and the value itself may be freed; after, the tree is whole and values are
/// known by their address ([`Value::identity`]). Each map keeps the value it was made from, so
/// that its address is not reused by another value while the map knows it.
struct Tables {
    frames: Interner<Frame>,
    stacks: Interner<Vec<FrameId>>,
    /// Scope paths from PyTorch's `user_metadata` strings (`a/b`); index 0 is the root.
    scopes: Interner<String, Vec<String>>,
    stack_of: HashMap<usize, (Value, Option<StackId>)>,
    frame_of: HashMap<usize, (Value, FrameId)>,
    scope_of: HashMap<usize, (Value, ScopeId)>,
}

impl Tables {
    fn new() -> Self {
        let mut scopes = Interner::default();
        scopes.id(String::new(), |_| Vec::new());
        Tables {
            frames: Interner::default(),
            stacks: Interner::default(),
            scopes,
            stack_of: HashMap::new(),
            frame_of: HashMap::new(),
            scope_of: HashMap::new(),
        }
    }

    /// The scope of a trace entry's `user_metadata` when it is a string (vramscope writes scope
    /// paths there, `/` between names); the root for an empty, absent or other one.
    fn scope(
        &mut self,
        meta: Option<&Value>,
        budget: &mut Budget,
        at: &dyn Fn() -> String,
        source: &str,
    ) -> Result<ScopeId> {
        let Some(v) = meta.filter(|v| v.as_str().is_some_and(|t| !t.is_empty())) else { return Ok(ScopeId::ROOT) };
        let Some(id) = v.identity() else { return Ok(ScopeId::ROOT) };
        if let Some(&(_, scope)) = self.scope_of.get(&id) {
            return Ok(scope);
        }
        budget.spend_bytes(v.byte_len(), at, source)?;
        let text = v.as_str().unwrap_or_default();
        let scope = ScopeId(self.scopes.id(text.to_string(), |text| text.split('/').map(str::to_string).collect()));
        self.scope_of.insert(id, (v.clone(), scope));
        Ok(scope)
    }

    /// The stack of a `frames` list; `None` when it is empty or absent. `memo` is the parser's
    /// while the pickle is being parsed: the list's and each new frame's slots then get what
    /// was made of them.
    fn stack(
        &mut self,
        frames: Option<&Value>,
        mut memo: Option<&mut Memo>,
        budget: &mut Budget,
        at: &dyn Fn() -> String,
        source: &str,
    ) -> Result<Option<StackId>> {
        let Some(frames) = frames else { return Ok(None) };
        if let Some(Kept::Stack(known)) = frames.kept() {
            return Ok(known.map(StackId));
        }
        let id = frames.identity();
        if let Some(&(_, known)) = id.and_then(|id| self.stack_of.get(&id)) {
            return Ok(known);
        }
        budget.spend(frames.len(), at, source)?;
        let mut ids = Vec::with_capacity(frames.len());
        if let Some(list) = frames.items_ref() {
            for (i, f) in list.iter().enumerate() {
                let frame = match f.kept() {
                    Some(Kept::Frame(frame)) => FrameId(frame),
                    _ => match f.identity().and_then(|id| self.frame_of.get(&id)) {
                        Some(&(_, frame)) => frame,
                        None => {
                            let read = read_frame(f, budget, &|| format!("{}: frame {i}", at()), source)?;
                            let frame = FrameId(self.frames.intern(read));
                            let kept = memo.as_deref_mut().is_some_and(|m| m.keep(f, Kept::Frame(frame.0)));
                            if let (false, Some(id)) = (kept, f.identity()) {
                                self.frame_of.insert(id, (f.clone(), frame));
                            }
                            frame
                        }
                    },
                };
                ids.push(frame);
            }
        }
        let stack = (!ids.is_empty()).then(|| StackId(self.stacks.intern(ids)));
        let kept = memo.is_some_and(|m| m.keep(frames, Kept::Stack(stack.map(|s| s.0))));
        if let (false, Some(id)) = (kept, id) {
            self.stack_of.insert(id, (frames.clone(), stack));
        }
        Ok(stack)
    }
}

/// One frame of a `frames` list. PyTorch writes `??` where it knows no file and line 0 where it
/// knows no line (its C++ frames); both are read as unknown, and written back the same way.
fn read_frame(f: &Value, budget: &mut Budget, at: &dyn Fn() -> String, source: &str) -> Result<Frame> {
    budget.spend(f.len().max(1), at, source)?;
    let function =
        text(f, "name", budget, at, source)?.ok_or_else(|| bad(source, format!("{} has no `name`", at())))?;
    let file = text(f, "filename", budget, at, source)?.filter(|f| f != "??");
    let line = match f.get("line") {
        None | Some(Value::None) => None,
        Some(v) => match v.as_i128().map(u32::try_from) {
            Some(Ok(0)) => None,
            Some(Ok(line)) => Some(line),
            _ => {
                return Err(bad(
                    source,
                    format!("{}: `line` is {v:?}, expected a line number from 0 to {}", at(), u32::MAX),
                ))
            }
        },
    };
    Ok(Frame { function, file, line })
}

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
        let path = path.as_ref();
        let (input, limit) = super::open_input(path, "a vramscope JSON snapshot")?;
        let source = path.display().to_string();
        match input.kind {
            super::FileKind::Pickle => {
                let mut input = input;
                let size = input.plain_size().and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
                let read = Self::read_pytorch_pickle(&mut input, size, &source, limit);
                // What stopped the file's read is the error, not what the parser made of it.
                let snap = match (read, input.failure()) {
                    (_, Some(e)) => return Err(e),
                    (read, None) => read?,
                };
                Self::checked_pytorch(snap, &source)
            }
            super::FileKind::Json => Self::from_bytes_within(&input.read_all()?, &source, limit),
        }
    }

    /// Reads a snapshot from bytes (JSON or pickle); `source` names them in errors.
    pub fn from_bytes(data: &[u8], source: &str) -> Result<Snapshot> {
        Self::from_bytes_within(data, source, super::read_limit(data.len() as u64)?)
    }

    pub(crate) fn from_bytes_within(data: &[u8], source: &str, limit: super::ReadLimit) -> Result<Snapshot> {
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
        limit: super::ReadLimit,
    ) -> Result<Snapshot> {
        let size = data.len();
        let snap = Self::read_pytorch_pickle(&mut data, size, source, limit)?;
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
    /// known (0 where not: its budget grows as it is read).
    fn read_pytorch_pickle(
        data: &mut dyn std::io::Read,
        size: usize,
        source: &str,
        limit: super::ReadLimit,
    ) -> Result<Snapshot> {
        let mut traces = TraceReader {
            tables: Tables::new(),
            budget: Budget::for_bytes(size, limit),
            source,
            lists: TraceLists::default(),
        };
        let (root, read) = pickle::parse_with(data, &mut traces).map_err(|f| match f {
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
            // the snapshot it built owns copies, not values of the tree.
            let tree = unsafe { pickle::Detached::new(root) };
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
        let (history, time_origin_us) = read_history(root, lists, &mut t, &mut budget, source)?;
        // Devices are named on each part only in a snapshot of several.
        let mut devices: Vec<usize> =
            segments.iter().filter_map(|s| s.device).chain(history.iter().filter_map(|e| e.device)).collect();
        devices.sort_unstable();
        devices.dedup();
        let several = devices.len() > 1;
        let device = devices.first().copied().unwrap_or(0);
        for s in &mut segments {
            s.device = s.device.filter(|_| several);
        }
        let mut history = history;
        if !several {
            for e in &mut history {
                e.device = None;
            }
        }
        // A block's scope is its allocation's, where the trace still holds the allocation
        // (PyTorch's blocks carry no scope); else what the block itself carries (vramscope writes
        // it beside the block's frames).
        let mut scope_at: HashMap<u64, ScopeId> = HashMap::new();
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
            backend: super::model::PYTORCH_BACKEND.into(),
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

/// Reads the trace entries of a PyTorch snapshot while its pickle is parsed: each batch of
/// entries appended to a list of `device_traces` is read into [`HistoryEntry`]s and dropped,
/// so the generic tree of a trace (a dict per event, a list of frames per event), many times
/// the size of what is read of it, never exists whole. What the rest of the file holds is read
/// from the tree after the parse, as before.
struct TraceReader<'s> {
    tables: Tables,
    budget: Budget,
    source: &'s str,
    lists: TraceLists,
}

/// The trace lists read so far, with their entries and the entries' `time_us`. Each keeps its
/// list (the tree holds it anyway), so that its address names it.
#[derive(Default)]
struct TraceLists {
    lists: Vec<TraceList>,
    list_of: HashMap<usize, u32>,
}

struct TraceList {
    /// Held so that its address is not reused while `list_of` names it.
    _list: Value,
    entries: Vec<HistoryEntry>,
    times: Vec<i128>,
    /// The list's items read, entries or not.
    seen: usize,
}

impl pickle::Reshape for TraceReader<'_> {
    type Error = Error;

    fn append(
        &mut self,
        stack: &[Value],
        at: usize,
        items: &mut Vec<Value>,
        memo: &mut Memo,
        read: usize,
    ) -> Result<()> {
        let Some(device) = device_trace_at(stack, at) else { return Ok(()) };
        self.budget.grow(read);
        let list = &stack[at];
        let id = list.identity().expect("a list has an address");
        let lists = &mut self.lists.lists;
        let slot = *self.lists.list_of.entry(id).or_insert_with(|| {
            lists.push(TraceList { _list: list.clone(), entries: Vec::new(), times: Vec::new(), seen: 0 });
            (lists.len() - 1) as u32
        });
        let (source, budget) = (self.source, &mut self.budget);
        let first = lists[slot as usize].seen + list.len();
        let batch = || format!("device_traces[{device}]");
        budget.spend(items.len(), &batch, source)?;
        budget.hold::<(HistoryEntry, i128)>(items.len(), &batch, source)?;
        let out = &mut lists[slot as usize];
        // The budget bounds the entries; memory it cannot have is an error.
        let room = |e| bad(source, format!("{}: memory for {} more entries: {e}", batch(), items.len()));
        out.entries.try_reserve(items.len()).map_err(room)?;
        out.times.try_reserve(items.len()).map_err(room)?;
        for (k, e) in items.drain(..).enumerate() {
            let at = || format!("device_traces[{device}][{}]", first + k);
            let read = match e.kept() {
                // An entry the pickle shares: the same event again.
                Some(Kept::Entry { list, index }) => {
                    let from = &lists[list as usize];
                    let entry = &from.entries[index as usize];
                    // Each reference copies the entry's text: paid for as if read again.
                    budget.spend(ENTRY_FIELDS, &at, source)?;
                    budget.spend_bytes(entry.compile_context.as_ref().map_or(0, |c| c.len()), &at, source)?;
                    if let Some(meta) = &entry.user_metadata {
                        let written = serde_json::to_vec(meta).map_or(0, |v| v.len());
                        budget.spend_bytes(written.saturating_mul(BYTES_PER_ELEMENT), &at, source)?;
                    }
                    Some((from.times[index as usize], entry.clone()))
                }
                _ => read_entry(&e, &mut self.tables, Some(&mut *memo), budget, &at, source)?,
            };
            let out = &mut lists[slot as usize];
            out.seen += 1;
            if let Some((time, entry)) = read {
                if e.kept().is_none() {
                    memo.keep(&e, Kept::Entry { list: slot, index: out.entries.len() as u32 });
                }
                out.entries.push(entry);
                out.times.push(time);
            }
        }
        Ok(())
    }
}

/// The device whose trace `stack[at]` is, when it is one: the root dict is at the bottom of the
/// stack with its keys and values above it, the key `device_traces`, then its list of traces,
/// then the traces read and not yet appended to it, the last of them `stack[at]`.
fn device_trace_at(stack: &[Value], at: usize) -> Option<usize> {
    if !matches!(stack.first(), Some(Value::Dict(_))) || !matches!(stack.get(at), Some(Value::List(_))) {
        return None;
    }
    let mut key = 1;
    while key + 2 <= at {
        match &stack[key] {
            Value::Str(k) if &**k == "device_traces" => {
                let Value::List(traces) = &stack[key + 1] else { return None };
                let waiting = &stack[key + 2..at];
                return waiting
                    .iter()
                    .all(|v| matches!(v, Value::List(_)))
                    .then(|| traces.borrow().len() + waiting.len());
            }
            Value::Str(_) => key += 2,
            _ => return None,
        }
    }
    None
}

/// Every device's trace (`device_traces[d]` is device `d`'s), merged into one history in time
/// order, each device's entries in their own order; each entry with its device. The origin of
/// the entries' `time_ns` is the earliest `time_us` of all. A trace's entries are those the
/// [`TraceReader`] read while the pickle was parsed, after any the list was made with.
fn read_history(
    root: &Value,
    mut read: TraceLists,
    t: &mut Tables,
    budget: &mut Budget,
    source: &str,
) -> Result<(Vec<HistoryEntry>, u64)> {
    let Some(traces) = root.get("device_traces") else { return Ok((Vec::new(), 0)) };
    budget.spend(traces.len(), &|| "device_traces".to_string(), source)?;
    let traces = traces
        .items()
        .ok_or_else(|| bad(source, format!("`device_traces` is a {}, expected a list", traces.type_name())))?;
    let slot_of = |trace: &Value| trace.identity().and_then(|id| read.list_of.get(&id)).map(|&slot| slot as usize);
    // How often each list read while parsing is listed (twice is the same events twice).
    let mut uses = vec![0usize; read.lists.len()];
    for slot in traces.iter().filter_map(slot_of) {
        uses[slot] += 1;
    }
    // Each device's entries, and beside them their times in microseconds, as read.
    let mut per_device: Vec<(Vec<HistoryEntry>, Vec<i128>)> = Vec::new();
    for (d, trace) in traces.iter().enumerate() {
        let (mut out, mut times) = (Vec::new(), Vec::new());
        if let Some(items) = trace.items_ref() {
            budget.spend(items.len(), &|| format!("device_traces[{d}]"), source)?;
            budget.hold::<(HistoryEntry, i128)>(items.len(), &|| format!("device_traces[{d}]"), source)?;
            // The budget bounds the entries; memory it cannot have is an error.
            let room = |e| bad(source, format!("device_traces[{d}]: memory for {} entries: {e}", items.len()));
            out.try_reserve_exact(items.len()).map_err(room)?;
            times.try_reserve_exact(items.len()).map_err(room)?;
            for (i, e) in items.iter().enumerate() {
                let at = || format!("device_traces[{d}][{i}]");
                if let Some((time, entry)) = read_entry(e, t, None, budget, &at, source)? {
                    out.push(entry);
                    times.push(time);
                }
            }
        }
        if let Some(slot) = slot_of(trace) {
            let list = &mut read.lists[slot];
            uses[slot] -= 1;
            if out.is_empty() && uses[slot] == 0 {
                out = std::mem::take(&mut list.entries);
                times = std::mem::take(&mut list.times);
            } else {
                out.extend(list.entries.iter().cloned());
                times.extend(list.times.iter().copied());
            }
        }
        for entry in &mut out {
            entry.device = Some(d);
        }
        per_device.push((out, times));
    }
    drop(read);
    let Some(t0) = per_device.iter().flat_map(|(_, times)| times).min().copied() else {
        return Ok((Vec::new(), 0));
    };
    // Saturating: a hostile file's times may be any 128-bit integers, in any order.
    let ns = |time: i128| u64::try_from(time.saturating_sub(t0).max(0).saturating_mul(1000)).unwrap_or(u64::MAX);
    let origin = u64::try_from(t0.max(0)).unwrap_or(u64::MAX);
    if per_device.iter().filter(|(out, _)| !out.is_empty()).count() <= 1 {
        let (mut out, times) = per_device.into_iter().find(|(out, _)| !out.is_empty()).unwrap_or_default();
        for (entry, time) in out.iter_mut().zip(times) {
            entry.time_ns = ns(time);
        }
        return Ok((out, origin));
    }
    let mut merged = Vec::new();
    let total = per_device.iter().map(|(out, _)| out.len()).sum();
    merged.try_reserve_exact(total).map_err(|e| bad(source, format!("memory for {total} trace entries: {e}")))?;
    // A merge by time that keeps each device's order (ties to the lower device): the heap holds
    // each device's next entry's time.
    let mut lists: Vec<_> = per_device.into_iter().map(|(out, times)| out.into_iter().zip(times).peekable()).collect();
    let mut heads: std::collections::BinaryHeap<std::cmp::Reverse<(i128, usize)>> =
        lists.iter_mut().enumerate().filter_map(|(d, l)| Some(std::cmp::Reverse((l.peek()?.1, d)))).collect();
    while let Some(std::cmp::Reverse((_, d))) = heads.pop() {
        let Some((mut entry, time)) = lists[d].next() else { continue };
        entry.time_ns = ns(time);
        merged.push(entry);
        if let Some((_, time)) = lists[d].peek() {
            heads.push(std::cmp::Reverse((*time, d)));
        }
    }
    Ok((merged, origin))
}

/// The fields of a PyTorch trace entry: what reading one costs in the budget's elements.
const ENTRY_FIELDS: usize = 8;

/// The fields of a trace entry vramscope reads, found in one pass over its dict (a key given
/// twice has the value given last, as in the dict Python builds).
#[derive(Default)]
struct EntryFields<'v> {
    action: Option<&'v Value>,
    addr: Option<&'v Value>,
    size: Option<&'v Value>,
    stream: Option<&'v Value>,
    time_us: Option<&'v Value>,
    frames: Option<&'v Value>,
    user_metadata: Option<&'v Value>,
    compile_context: Option<&'v Value>,
    device_free: Option<&'v Value>,
}

/// One trace entry with its `time_us`; `None` for an action vramscope does not know (or an
/// item that is not a dict). `memo` is the parser's while the pickle is parsed.
fn read_entry(
    e: &Value,
    t: &mut Tables,
    memo: Option<&mut Memo>,
    budget: &mut Budget,
    at: &dyn Fn() -> String,
    source: &str,
) -> Result<Option<(i128, HistoryEntry)>> {
    budget.spend(e.len(), at, source)?;
    let Value::Dict(dict) = e else { return Ok(None) };
    let pairs = dict.borrow();
    let mut f = EntryFields::default();
    for (k, v) in pairs.iter() {
        let Value::Str(k) = k else { continue };
        let field = match &**k {
            "action" => &mut f.action,
            "addr" => &mut f.addr,
            "size" => &mut f.size,
            "stream" => &mut f.stream,
            "time_us" => &mut f.time_us,
            "frames" => &mut f.frames,
            "user_metadata" => &mut f.user_metadata,
            "compile_context" => &mut f.compile_context,
            "device_free" => &mut f.device_free,
            _ => continue,
        };
        *field = Some(v);
    }
    let Some(action) = f.action.and_then(Value::as_str).and_then(Action::from_name) else {
        return Ok(None);
    };
    let time_us = f.time_us.and_then(Value::as_i128).unwrap_or(0);
    let stack = t.stack(f.frames, memo, budget, at, source)?;
    let scope = t.scope(f.user_metadata, budget, at, source)?;
    let user_metadata = match f.user_metadata {
        Some(v) if !matches!(v, Value::Str(_)) => {
            Some(Box::new(to_json(v, 0, budget, &|| format!("{}.user_metadata", at()), source)?))
        }
        _ => None,
    };
    let compile_context = match f.compile_context {
        Some(c @ Value::Str(_)) => {
            budget.spend_bytes(c.byte_len(), at, source)?;
            c.as_str().map(str::to_string)
        }
        _ => None,
    };
    let field = |v: Option<&Value>, key: &str| field_uint(v, key, at, source);
    Ok(Some((
        time_us,
        HistoryEntry {
            action,
            // PyTorch's `oom` entries have no address but the bytes the device had free.
            addr: if action == Action::Oom {
                field(f.device_free, "device_free").or_else(|_| field(f.addr, "addr")).unwrap_or(0)
            } else {
                field(f.addr, "addr")?
            },
            size: field(f.size, "size")?,
            stream: field(f.stream, "stream").unwrap_or(0),
            device: None,
            time_ns: 0,
            context: context_in(stack, scope),
            // "N/A" (outside torch.compile) is what the writer puts where there is none.
            compile_context: compile_context.filter(|c| c != "N/A").map(String::into_boxed_str),
            user_metadata,
        },
    )))
}

/// The current-value statistics a PyTorch snapshot implies (it carries no counters).
pub(crate) fn stats_of(segments: &[SegmentInfo]) -> MemoryStats {
    let mut m = MemoryStats::default();
    for seg in segments {
        let s = seg.summary();
        let figures = [
            (&mut m.reserved_bytes, seg.total_size),
            (&mut m.allocated_bytes, s.allocated),
            (&mut m.active_bytes, s.active),
            (&mut m.requested_bytes, s.requested),
            (&mut m.segment, 1),
            (&mut m.allocation, s.allocated_blocks),
            (&mut m.active, s.active_blocks),
        ];
        for (stat, f) in figures {
            let pool = if seg.pool == Pool::Small { &mut stat.small_pool } else { &mut stat.large_pool };
            pool.current = pool.current.saturating_add(f);
            stat.all.current = stat.all.current.saturating_add(f);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The snapshot read from the whole value tree, with no trace read while parsing: what
    /// the reader made before it read traces as they were parsed.
    fn from_tree(data: &[u8]) -> Result<Snapshot> {
        let limit = super::super::read_limit(data.len() as u64)?;
        let root = pickle::parse(data).map_err(|e| bad("tree", e.to_string()))?;
        let traces = TraceReader {
            tables: Tables::new(),
            budget: Budget::for_bytes(data.len(), limit),
            source: "tree",
            lists: TraceLists::default(),
        };
        Snapshot::checked_pytorch(Snapshot::from_pickle_value(&root, traces, "tree")?, "tree")
    }

    fn streamed(data: &[u8]) -> Result<Snapshot> {
        Snapshot::from_pytorch_pickle(data, "tree")
    }

    /// `pickle.dumps({"segments": [], "device_traces": [[e1, e2, e1], [e4, e3]]}, protocol=4)`:
    /// `e1` is listed twice (a memo reference), `e2` shares `e1`'s frame list, and the two
    /// devices' events interleave in time.
    const SHARED: &[u8] = b"\x80\x04\x95A\x01\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94(]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94M\x00\x10\x8c\x04size\x94M\x00\x02\x8c\x06stream\x94K\x00\x8c\x07time_us\x94K\x05\x8c\x06frames\x94]\x94(}\x94(\x8c\x04name\x94\x8c\x05train\x94\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03u}\x94(h\x10\x8c\x04step\x94h\x12\x8c\x04b.py\x94h\x14K\tueu}\x94(h\x07\x8c\x0efree_requested\x94h\tM\x00\x10h\nM\x00\x02h\x0bK\x00h\x0cK\x07h\rh\x0euh\x06e]\x94(}\x94(h\x07\x8c\rsegment_alloc\x94h\tM\x00 h\nJ\x00\x00 \x00h\x0bK\x00h\x0cK\x01h\r]\x94u}\x94(h\x07h\x08h\tM\x00 h\nM\x00\x04h\x0bK\x00h\x0cK\x06h\r]\x94h\x15aueeu.";

    #[test]
    fn shared_entries_and_frame_lists_read_as_from_the_whole_tree() {
        let (streamed, tree) = (streamed(SHARED).unwrap(), from_tree(SHARED).unwrap());
        assert_eq!(streamed, tree);
        assert_eq!(streamed.history.len(), 5);
        let h = &streamed.history;
        let actions: Vec<_> = h.iter().map(|e| (e.device, e.action, e.addr)).collect();
        assert_eq!(
            actions,
            [
                (Some(1), Action::SegmentAlloc, 8192),
                (Some(0), Action::Alloc, 4096),
                (Some(1), Action::Alloc, 8192),
                (Some(0), Action::FreeRequested, 4096),
                (Some(0), Action::Alloc, 4096),
            ]
        );
        // One stack for e1 and e2 (shared), one for e3; e4 has none.
        let stack = |i: usize| h[i].context.and_then(|c| c.stack);
        assert_eq!(stack(1), stack(3));
        assert_eq!(stack(1), stack(4));
        assert_ne!(stack(1), stack(2));
        assert_eq!(stack(0), None);
        assert_eq!(streamed.stacks.len(), 2);
    }

    /// Every PyTorch pickle under `fixtures/` (recorded by PyTorch, written by vramscope, and
    /// hostile ones) reads the same, or fails, both ways.
    #[test]
    fn every_fixture_pickle_reads_as_from_the_whole_tree() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let mut work = vec![root];
        let mut read = 0;
        while let Some(dir) = work.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    work.push(path);
                    continue;
                }
                let data = std::fs::read(&path).unwrap();
                if data.first() != Some(&0x80) {
                    continue;
                }
                match (streamed(&data), from_tree(&data)) {
                    // Frames, stacks and scopes are numbered in the order they are read (the
                    // trace's first now): the same snapshot writes the same pickle.
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a.history.len(), b.history.len(), "{}", path.display());
                        assert!(a.to_pytorch_pickle() == b.to_pytorch_pickle(), "{}", path.display());
                    }
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("{}: streamed {:?}, from the tree {:?}", path.display(), a.err(), b.err()),
                }
                read += 1;
            }
        }
        assert!(read >= 20, "{read} pickles");
    }
}
