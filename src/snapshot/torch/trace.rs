//! The trace of a PyTorch snapshot, read while its pickle is parsed.

use super::budget::{Budget, BYTES_PER_ELEMENT};
use super::tables::Tables;
use super::{bad, context_in, field_uint, to_json};
use crate::error::{Error, Result};
use crate::model::HistoryEntry;
use crate::record::Action;
use crate::snapshot::pickle::AddressMap;
use crate::snapshot::pickle::{self, Kept, Memo, Value};

/// Reads the trace entries of a PyTorch snapshot while its pickle is parsed: each batch of
/// entries appended to a list of `device_traces` is read into [`HistoryEntry`]s and dropped,
/// so the generic tree of a trace (a dict per event, a list of frames per event), many times
/// the size of what is read of it, never exists whole. What the rest of the file holds is read
/// from the tree after the parse.
pub(super) struct TraceReader<'s> {
    pub(super) tables: Tables,
    pub(super) budget: Budget,
    source: &'s str,
    pub(super) lists: TraceLists,
    /// Events read as their dict's items were set ([`pickle::Reshape::dict`]), waiting for
    /// their batch to be appended to its trace (`None` once taken).
    pending: Vec<Option<Option<(i128, HistoryEntry)>>>,
    /// The batch `pending` holds ([`Kept::Pending`]).
    batch: u32,
    /// Where the batch being read goes ([`event_place`]).
    place: Option<Place>,
    /// Room for the entries of the first trace list (empty; most files have one).
    room: Vec<HistoryEntry>,
}

/// The trace a batch of events is appended to, found at its first event: the others of the
/// batch are placed without looking again (a look goes down the stack to the snapshot's root
/// and through the trace lists' map, which per event cost a tenth of the read).
struct Place {
    /// The batch's MARK.
    batch_mark: usize,
    /// The trace's list, just below the MARK.
    list: Value,
    device: usize,
    /// The trace's items before the batch.
    base: usize,
}

/// The trace lists read so far, with their entries and the entries' `time_us`. Each keeps its
/// list (the tree holds it anyway), so that its address names it.
#[derive(Default)]
pub(super) struct TraceLists {
    lists: Vec<TraceList>,
    list_of: AddressMap<u32>,
}

struct TraceList {
    /// Held so that its address is not reused while `list_of` names it.
    _list: Value,
    entries: Vec<HistoryEntry>,
    times: Times,
    /// The list's items read, entries or not.
    seen: usize,
}

/// The `time_us` of a trace's entries, as read: in each entry's `time_ns` where it fits in 64
/// bits (a real file's do: microseconds since 1970), else beside it, by the entry's index
/// (a hostile file's may be any integer). Their earliest is kept as they come: the history's
/// times count from the earliest of every trace ([`read_history`]), which a second pass over
/// the entries would otherwise find.
#[derive(Default)]
struct Times {
    /// The entries whose time does not fit, in increasing order of index.
    wide: Vec<(usize, i128)>,
    earliest: Option<i128>,
}

impl Times {
    /// Puts `time` in `entry`, the `index`th of its trace (after every other put).
    fn put(&mut self, index: usize, time: i128, entry: &mut HistoryEntry) {
        match i64::try_from(time) {
            // The bits of an i64 in a u64, read back by `get`.
            Ok(t) => entry.time_ns = t as u64,
            Err(_) => {
                entry.time_ns = 0;
                self.wide.push((index, time));
            }
        }
        self.earliest = Some(self.earliest.map_or(time, |e| e.min(time)));
    }

    /// The time put in `entry`, the `index`th.
    fn get(&self, index: usize, entry: &HistoryEntry) -> i128 {
        if let Ok(k) = self.wide.binary_search_by_key(&index, |w| w.0) {
            return self.wide[k].1;
        }
        i128::from(entry.time_ns as i64)
    }

    /// The times of `more` (entries of their own), for the entries put after `before` of ours.
    fn extend(&mut self, before: usize, more: &Times) {
        self.wide.extend(more.wide.iter().map(|&(i, t)| (before + i, t)));
        self.earliest = self.earliest.into_iter().chain(more.earliest).min();
    }

    /// Each of `entries`' time put, turned into `time_ns` by `ns`.
    fn resolve(&self, entries: &mut [HistoryEntry], ns: impl Fn(i128) -> u64) {
        let mut wide = self.wide.iter().peekable();
        for (i, entry) in entries.iter_mut().enumerate() {
            let time = match wide.next_if(|w| w.0 == i) {
                Some(&(_, t)) => t,
                None => i128::from(entry.time_ns as i64),
            };
            entry.time_ns = ns(time);
        }
    }
}

impl<'s> TraceReader<'s> {
    /// A reader of the traces of the pickle `source`, within `budget`; the first trace's
    /// entries go into `room` (empty).
    pub(super) fn new(source: &'s str, budget: Budget, room: Vec<HistoryEntry>) -> Self {
        debug_assert!(room.is_empty());
        TraceReader {
            tables: Tables::new(),
            budget,
            source,
            lists: TraceLists::default(),
            pending: Vec::new(),
            batch: 0,
            place: None,
            room,
        }
    }

    /// The slot of trace list `list` in `lists`, made on its first batch.
    fn slot_of(&mut self, list: &Value) -> u32 {
        let id = list.identity().expect("a list has an address");
        let (lists, room) = (&mut self.lists.lists, &mut self.room);
        *self.lists.list_of.entry(id).or_insert_with(|| {
            let entries = std::mem::take(room);
            lists.push(TraceList { _list: list.clone(), entries, times: Times::default(), seen: 0 });
            (lists.len() - 1) as u32
        })
    }
}

/// Python's pickler sets a dict's items and appends a list's in batches of this many (one item
/// alone by APPEND or SETITEM): a batch of fewer into an empty container is the only one it
/// gets.
const PICKLER_BATCH: usize = 1000;

impl pickle::Reshape for TraceReader<'_> {
    type Error = Error;

    /// An event's items, read straight from the parser's stack: its dict is never filled.
    fn dict(&mut self, stack: &[Value], marks: &[usize], from: usize, memo: &mut Memo, read: usize) -> Result<bool> {
        let Some(at) = from.checked_sub(1) else { return Ok(false) };
        let pairs = stack.len() - from;
        let empty = matches!(&stack[at], Value::Dict(d) if d.borrow().is_empty());
        let read_already = matches!(stack[at].kept(), Some(Kept::Pending { .. }));
        if !empty || !(read_already || stack[at].kept().is_none()) {
            return Ok(false);
        }
        // The events of a batch wait on the stack above their trace's MARK.
        let Some(&batch_mark) = marks.last() else { return Ok(false) };
        let Some((device, index)) = event_place(stack, batch_mark, at, &self.lists, &mut self.place) else {
            return Ok(false);
        };
        self.budget.grow(read);
        let (source, budget) = (self.source, &mut self.budget);
        let at_entry = || format!("device_traces[{device}][{index}]");
        if read_already {
            return Err(bad(
                source,
                format!("{}: an event whose items are set in two batches (a pickler sets them in one)", at_entry()),
            ));
        }
        if !pairs.is_multiple_of(2) || pairs / 2 >= PICKLER_BATCH {
            return Ok(false);
        }
        // Its place in the trace, paid for here rather than when the batch is appended.
        budget.spend(1, &at_entry, source)?;
        budget.hold::<(HistoryEntry, i128)>(1, &at_entry, source)?;
        let items = stack[from..].chunks_exact(2).map(|p| (&p[0], &p[1]));
        // An event that does not read may be completed by a later SETITEMS (no pickler writes
        // one so, but the file is a valid pickle): its dict is filled and read whole instead.
        let Ok(read) = read_entry_pairs(items, pairs / 2, &mut self.tables, Some(memo), budget, &at_entry, source)
        else {
            return Ok(false);
        };
        self.pending.push(Some(read));
        stack[at].remember(Kept::Pending { batch: self.batch, index: (self.pending.len() - 1) as u32 });
        Ok(true)
    }

    fn append(&mut self, stack: &[Value], marks: &[usize], at: usize, memo: &mut Memo, read: usize) -> Result<bool> {
        // A list at or below the batch's trace is appended to: the trace may grow, or be the
        // list appended to (a batch of it, read below).
        if self.place.as_ref().is_some_and(|p| at < p.batch_mark) {
            self.place = None;
        }
        let items = &stack[at + 1..];
        if let Some(Kept::Stack(_)) = stack[at].kept() {
            return Err(bad(self.source, "a list of frames appended to after it was read (a pickler never does so)"));
        }
        let whole = (2..PICKLER_BATCH).contains(&items.len());
        if let Some((device, index)) = event_frames_at(stack, marks, at, &self.lists, &mut self.place).filter(|_| whole)
        {
            // An event's frames, read as they are appended: the list is never filled.
            self.budget.grow(read);
            let at_entry = || format!("device_traces[{device}][{index}]");
            let stack_id =
                self.tables.stack_of_items(items, Some(&mut *memo), &mut self.budget, &at_entry, self.source)?;
            memo.keep(&stack[at], Kept::Stack(stack_id.map(|s| s.0)));
            return Ok(true);
        }
        let Some(device) = device_trace_at(stack, at) else { return Ok(false) };
        self.budget.grow(read);
        let list = &stack[at];
        let slot = self.slot_of(list);
        let (source, budget, lists) = (self.source, &mut self.budget, &mut self.lists.lists);
        let first = lists[slot as usize].seen + list.len();
        let batch = || format!("device_traces[{device}]");
        // The events read as their items were set paid for their place then: each once (the
        // pickle may list one many times).
        let waiting = self.pending.iter().filter(|p| p.is_some()).count();
        budget.spend(items.len().saturating_sub(waiting), &batch, source)?;
        // The batch's memory is held whole, in place of what its events held one by one.
        budget.release::<(HistoryEntry, i128)>(waiting);
        budget.hold::<HistoryEntry>(items.len(), &batch, source)?;
        let out = &mut lists[slot as usize];
        // The budget bounds the entries; memory it cannot have is an error.
        let room = |e| bad(source, format!("{}: memory for {} more entries: {e}", batch(), items.len()));
        out.entries.try_reserve(items.len()).map_err(room)?;
        for (k, e) in items.iter().enumerate() {
            let at = || format!("device_traces[{device}][{}]", first + k);
            let read = match e.kept() {
                Some(Kept::Pending { batch, index }) if batch == self.batch => {
                    // Taken once; listed again in the same batch, a skipped event is skipped
                    // again (a kept one is an entry by now, below).
                    self.pending[index as usize].take().flatten()
                }
                Some(Kept::Pending { .. }) => {
                    return Err(bad(
                        source,
                        format!("{}: an event read in an earlier batch of a trace and listed only now", at()),
                    ))
                }
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
                    Some((from.times.get(index as usize, entry), entry.clone()))
                }
                _ => read_entry(e, &mut self.tables, Some(&mut *memo), budget, &at, source)?,
            };
            let out = &mut lists[slot as usize];
            out.seen += 1;
            if let Some((time, mut entry)) = read {
                if !matches!(e.kept(), Some(Kept::Entry { .. })) {
                    memo.keep(e, Kept::Entry { list: slot, index: out.entries.len() as u32 });
                }
                out.times.put(out.entries.len(), time, &mut entry);
                out.entries.push(entry);
            }
        }
        // What a batch left waiting (a hostile file popped it) is gone with it.
        self.pending.clear();
        self.batch = self.batch.wrapping_add(1);
        Ok(true)
    }
}

/// Where the list `stack[at]` is the `frames` of an event being read ([`TraceReader::dict`]):
/// the event's device and index in its trace. Only a list not filled before is one (the
/// caller also asks that one APPENDS fill it whole).
fn event_frames_at(
    stack: &[Value],
    marks: &[usize],
    at: usize,
    lists: &TraceLists,
    place: &mut Option<Place>,
) -> Option<(usize, usize)> {
    let fresh = matches!(&stack[at], Value::List(l) if l.borrow().is_empty()) && stack[at].kept().is_none();
    let key = at.checked_sub(1)?;
    if !fresh || !matches!(&stack[key], Value::Str(k) if &**k == "frames") {
        return None;
    }
    // The event's dict, its items since its MARK (keys at even offsets), in a batch of a trace.
    let (&event_mark, rest) = marks.split_last()?;
    let event = event_mark.checked_sub(1)?;
    if key < event_mark || !(key - event_mark).is_multiple_of(2) || !matches!(&stack[event], Value::Dict(_)) {
        return None;
    }
    event_place(stack, *rest.last()?, event, lists, place)
}

/// Where the dict `stack[event]` is an event of a batch of a trace whose MARK is at
/// `batch_mark` (the trace's list just below it): the event's device and its index in the
/// trace (the trace's items read in earlier batches, those it was made with, and the events of
/// this batch before it).
///
/// What is found for a batch's first event is kept in `place` for the others. It holds while
/// the same list is below the same MARK and was never pushed a second time: then nothing below
/// it on the stack has changed (the stack changes at its top only, and the list would have
/// been popped), so neither has the device; its items change only by an APPENDS to it, and
/// the list of traces only by one to that list below it, either of which clears `place`
/// ([`TraceReader`]'s `append`).
fn event_place(
    stack: &[Value],
    batch_mark: usize,
    event: usize,
    lists: &TraceLists,
    place: &mut Option<Place>,
) -> Option<(usize, usize)> {
    let list_at = batch_mark.checked_sub(1).filter(|&l| l < event)?;
    let list = &stack[list_at];
    if let Some(p) = place.as_ref().filter(|p| p.batch_mark == batch_mark && list.is_unmoved(&p.list)) {
        return Some((p.device, p.base + (event - batch_mark)));
    }
    let device = device_trace_at(stack, list_at)?;
    let seen = list.identity().and_then(|id| lists.list_of.get(&id)).map_or(0, |&slot| lists.lists[slot as usize].seen);
    let base = seen + list.len();
    *place = Some(Place { batch_mark, list: list.clone(), device, base });
    Some((device, base + (event - batch_mark)))
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

/// A history read from `device_traces`: the entries, the origin of their `time_ns` (the earliest
/// `time_us` of all) and the devices that have entries.
pub(super) struct History {
    pub(super) entries: Vec<HistoryEntry>,
    pub(super) origin_us: u64,
    /// In increasing order. With one device, the entries do not name it (each part of a
    /// snapshot names its device only in a snapshot of several: the caller decides).
    pub(super) devices: Vec<usize>,
}

/// Every device's trace (`device_traces[d]` is device `d`'s), merged into one history in time
/// order, each device's entries in their own order; each entry with its device where several
/// devices have entries. A trace's entries are those the [`TraceReader`] read while the pickle
/// was parsed, after any the list was made with.
pub(super) fn read_history(
    root: &Value,
    mut read: TraceLists,
    t: &mut Tables,
    budget: &mut Budget,
    source: &str,
) -> Result<History> {
    let none = |origin_us| History { entries: Vec::new(), origin_us, devices: Vec::new() };
    let Some(traces) = root.get("device_traces") else { return Ok(none(0)) };
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
    // Each device's entries, and their times in microseconds, as read.
    let mut per_device: Vec<(Vec<HistoryEntry>, Times)> = Vec::new();
    for (d, trace) in traces.iter().enumerate() {
        let (mut out, mut times) = (Vec::new(), Times::default());
        if let Some(items) = trace.items_ref() {
            budget.spend(items.len(), &|| format!("device_traces[{d}]"), source)?;
            budget.hold::<HistoryEntry>(items.len(), &|| format!("device_traces[{d}]"), source)?;
            // The budget bounds the entries; memory it cannot have is an error.
            let room = |e| bad(source, format!("device_traces[{d}]: memory for {} entries: {e}", items.len()));
            out.try_reserve_exact(items.len()).map_err(room)?;
            for (i, e) in items.iter().enumerate() {
                let at = || format!("device_traces[{d}][{i}]");
                if let Some((time, mut entry)) = read_entry(e, t, None, budget, &at, source)? {
                    times.put(out.len(), time, &mut entry);
                    out.push(entry);
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
                times.extend(out.len(), &list.times);
                out.extend(list.entries.iter().cloned());
            }
        }
        per_device.push((out, times));
    }
    drop(read);
    let Some(t0) = per_device.iter().filter_map(|(_, times)| times.earliest).min() else {
        return Ok(none(0));
    };
    // Saturating: a hostile file's times may be any 128-bit integers, in any order.
    let ns = |time: i128| u64::try_from(time.saturating_sub(t0).max(0).saturating_mul(1000)).unwrap_or(u64::MAX);
    let origin = u64::try_from(t0.max(0)).unwrap_or(u64::MAX);
    // Each entry's time (and its device, where several devices have entries) is set in one
    // pass over the entries, which for a long trace are hundreds of megabytes.
    let devices: Vec<usize> =
        per_device.iter().enumerate().filter(|(_, (out, _))| !out.is_empty()).map(|(d, _)| d).collect();
    if let [d] = devices[..] {
        let (mut out, times) = per_device.swap_remove(d);
        times.resolve(&mut out, ns);
        return Ok(History { entries: out, origin_us: origin, devices });
    }
    if devices.is_empty() {
        return Ok(none(origin));
    }
    let mut merged = Vec::new();
    let total = per_device.iter().map(|(out, _)| out.len()).sum();
    merged.try_reserve_exact(total).map_err(|e| bad(source, format!("memory for {total} trace entries: {e}")))?;
    // A merge by time that keeps each device's order (ties to the lower device): the heap holds
    // each device's next entry's time.
    let mut lists: Vec<_> = per_device
        .into_iter()
        .map(|(out, times)| {
            let times: Vec<i128> = out.iter().enumerate().map(|(i, e)| times.get(i, e)).collect();
            out.into_iter().zip(times).peekable()
        })
        .collect();
    let mut heads: std::collections::BinaryHeap<std::cmp::Reverse<(i128, usize)>> =
        lists.iter_mut().enumerate().filter_map(|(d, l)| Some(std::cmp::Reverse((l.peek()?.1, d)))).collect();
    while let Some(std::cmp::Reverse((_, d))) = heads.pop() {
        let Some((mut entry, time)) = lists[d].next() else { continue };
        entry.device = Some(d);
        entry.time_ns = ns(time);
        merged.push(entry);
        if let Some((_, time)) = lists[d].peek() {
            heads.push(std::cmp::Reverse((*time, d)));
        }
    }
    Ok(History { entries: merged, origin_us: origin, devices })
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
pub(super) fn read_entry(
    e: &Value,
    t: &mut Tables,
    memo: Option<&mut Memo>,
    budget: &mut Budget,
    at: &dyn Fn() -> String,
    source: &str,
) -> Result<Option<(i128, HistoryEntry)>> {
    let Value::Dict(dict) = e else {
        budget.spend(e.len(), at, source)?;
        return Ok(None);
    };
    let pairs = dict.borrow();
    read_entry_pairs(pairs.iter().map(|(k, v)| (k, v)), pairs.len(), t, memo, budget, at, source)
}

/// [`read_entry`] of an event whose `n` key-value pairs are `items`, not in a dict.
pub(super) fn read_entry_pairs<'v>(
    items: impl Iterator<Item = (&'v Value, &'v Value)>,
    n: usize,
    t: &mut Tables,
    memo: Option<&mut Memo>,
    budget: &mut Budget,
    at: &dyn Fn() -> String,
    source: &str,
) -> Result<Option<(i128, HistoryEntry)>> {
    budget.spend(n, at, source)?;
    let mut f = EntryFields::default();
    for (k, v) in items {
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
    // "N/A" (outside torch.compile) is what the writer puts where there is none: not copied
    // (nearly every event of a trace has it).
    let compile_context = match f.compile_context {
        Some(c @ Value::Str(_)) => {
            budget.spend_bytes(c.byte_len(), at, source)?;
            c.as_str().filter(|&c| c != "N/A").map(Box::from)
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
            compile_context,
            user_metadata,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Snapshot;

    /// The snapshot read from the whole value tree, no trace read while parsing: what the
    /// streamed read is held to.
    fn from_tree(data: &[u8]) -> Result<Snapshot> {
        let limit = crate::snapshot::read_limit(data.len() as u64)?;
        let root = pickle::parse(data).map_err(|e| bad("tree", e.to_string()))?;
        let traces = TraceReader::new("tree", Budget::for_bytes(data.len(), limit), Vec::new());
        Snapshot::checked_pytorch(Snapshot::from_pickle_value(&root, traces, "tree")?, "tree")
    }

    fn streamed(data: &[u8]) -> Result<Snapshot> {
        Snapshot::from_pytorch_pickle(data, "tree")
    }

    /// `pickle.dumps({"segments": [], "device_traces": [[e1, e2, e1], [e4, e3]]}, protocol=4)`:
    /// `e1` is listed twice (a memo reference), `e2` shares `e1`'s frame list, and the two
    /// devices' events interleave in time.
    const SHARED: &[u8] = b"\x80\x04\x95A\x01\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94(]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94M\x00\x10\x8c\x04size\x94M\x00\x02\x8c\x06stream\x94K\x00\x8c\x07time_us\x94K\x05\x8c\x06frames\x94]\x94(}\x94(\x8c\x04name\x94\x8c\x05train\x94\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03u}\x94(h\x10\x8c\x04step\x94h\x12\x8c\x04b.py\x94h\x14K\tueu}\x94(h\x07\x8c\x0efree_requested\x94h\tM\x00\x10h\nM\x00\x02h\x0bK\x00h\x0cK\x07h\rh\x0euh\x06e]\x94(}\x94(h\x07\x8c\rsegment_alloc\x94h\tM\x00 h\nJ\x00\x00 \x00h\x0bK\x00h\x0cK\x01h\r]\x94u}\x94(h\x07h\x08h\tM\x00 h\nM\x00\x04h\x0bK\x00h\x0cK\x06h\r]\x94h\x15aueeu.";

    /// One trace whose `time_us` are `[m, m - 10, m + 2, m - 4, m + 1]`, `m` = -2^63: the
    /// second and fourth do not fit in 64 bits, and the earliest of them is the origin.
    const WIDE_TIMES: &[u8] = b"\x80\x04\x95\xfb\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94M\x00\x10\x8c\x04size\x94M\x00\x02\x8c\x06stream\x94K\x00\x8c\x07time_us\x94\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80u}\x94(h\x07h\x08h\x09M\x00 h\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x09\xf6\xff\xff\xff\xff\xff\xff\x7f\xffu}\x94(h\x07h\x08h\x09M\x000h\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x08\x02\x00\x00\x00\x00\x00\x00\x80u}\x94(h\x07h\x08h\x09M\x00@h\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x09\xfc\xff\xff\xff\xff\xff\xff\x7f\xffu}\x94(h\x07h\x08h\x09M\x00Ph\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x08\x01\x00\x00\x00\x00\x00\x00\x80ueau.";

    /// Two devices' traces, `time_us` `[m - 10, m + 5]` and `[m - 4, m + 1]` (`m` = -2^63).
    const WIDE_TIMES_TWO_DEVICES: &[u8] = b"\x80\x04\x95\xe2\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94(]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94M\x00\x10\x8c\x04size\x94M\x00\x02\x8c\x06stream\x94K\x00\x8c\x07time_us\x94\x8a\x09\xf6\xff\xff\xff\xff\xff\xff\x7f\xffu}\x94(h\x07h\x08h\x09M\x00 h\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x08\x05\x00\x00\x00\x00\x00\x00\x80ue]\x94(}\x94(h\x07h\x08h\x09J\x00\x10\x10\x00h\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x09\xfc\xff\xff\xff\xff\xff\xff\x7f\xffu}\x94(h\x07h\x08h\x09J\x00 \x10\x00h\x0aM\x00\x02h\x0bK\x00h\x0c\x8a\x08\x01\x00\x00\x00\x00\x00\x00\x80ueeu.";

    /// A trace made by LIST with one event (`time_us` 5), then two appended (`m - 10`, `m + 1`,
    /// `m` = -2^63): the event of the tree first, then those read as they were appended.
    const WIDE_TIMES_AFTER_THE_TREE_S: &[u8] = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]((}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05ul(}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00 \x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_us\x8a\x0a\xf6\xff\xff\xff\xff\xff\xff\x7f\xff\xffu}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x000\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_us\x8a\x09\x01\x00\x00\x00\x00\x00\x00\x80\xffueeu.";

    /// Times that do not fit in 64 bits (a hostile file's) count as the integers they are,
    /// beside times that do, streamed and from the tree, on one device and merged from two.
    #[test]
    fn times_beyond_64_bits_count_exactly_beside_the_others() {
        for read in [streamed(WIDE_TIMES).unwrap(), from_tree(WIDE_TIMES).unwrap()] {
            let ns: Vec<u64> = read.history.iter().map(|e| e.time_ns).collect();
            assert_eq!(ns, [10_000, 0, 12_000, 6_000, 11_000]);
            assert_eq!(read.time_origin_us, 0, "an origin before 1970 is 0");
        }
        for read in [streamed(WIDE_TIMES_TWO_DEVICES).unwrap(), from_tree(WIDE_TIMES_TWO_DEVICES).unwrap()] {
            let got: Vec<(u64, Option<usize>)> = read.history.iter().map(|e| (e.time_ns, e.device)).collect();
            assert_eq!(got, [(0, Some(0)), (6_000, Some(1)), (11_000, Some(1)), (15_000, Some(0))]);
        }
        for read in [streamed(WIDE_TIMES_AFTER_THE_TREE_S).unwrap(), from_tree(WIDE_TIMES_AFTER_THE_TREE_S).unwrap()] {
            let ns: Vec<(u64, u64)> = read.history.iter().map(|e| (e.addr, e.time_ns)).collect();
            assert_eq!(ns, [(0x1000, u64::MAX), (0x2000, 0), (0x3000, 11_000)], "5 us is 2^63 + 15 us after");
        }
    }

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

    /// Shapes no pickler writes: read as the tree reads them where the streamed reader can,
    /// else refused saying what it met.
    #[test]
    fn containers_filled_in_two_batches_read_whole_or_are_refused() {
        // The first event's items in two SETITEMS, the first lacking `size`: read whole.
        let two_batches = b"\x80\x04}\x94(\x8c\x08segments]\x94\x8c\rdevice_traces]\x94]\x94(}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10u(\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05u}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00 \x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x06ueau.";
        assert_eq!(from_tree(two_batches).unwrap().history.len(), 2);
        assert_eq!(streamed(two_batches).unwrap(), from_tree(two_batches).unwrap());
        // The same, the first batch an event already: refused.
        let complete_first = b"\x80\x04}\x94(\x8c\x08segments]\x94\x8c\x0ddevice_traces]\x94]\x94(}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02u(\x8c\x06streamK\x00\x8c\x07time_usK\x05u}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00 \x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x06ueau.";
        assert_eq!(from_tree(complete_first).unwrap().history.len(), 2);
        let e = streamed(complete_first).unwrap_err().to_string();
        assert!(e.contains("device_traces[0][0]: an event whose items are set in two batches"), "{e}");
        // The same in a trace's second batch: named by its place in the trace (the batch's
        // place found again, not the first batch's kept).
        let second_batch = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](](}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05u}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00 \x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05ue(}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x000\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05u}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00@\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05u(\x8c\x06streamK\x01ueeu.";
        assert_eq!(from_tree(second_batch).unwrap().history.len(), 4);
        let e = streamed(second_batch).unwrap_err().to_string();
        assert!(e.contains("device_traces[0][3]: an event whose items are set in two batches"), "{e}");
        // The first event's frames in two APPENDS.
        let frames_twice = b"\x80\x04}\x94(\x8c\x08segments]\x94\x8c\rdevice_traces]\x94]\x94(}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05\x8c\x06frames]\x94(}\x94(\x8c\x04name\x8c\x01f\x8c\x08filename\x8c\x04a.py\x8c\x04lineK\x03u}\x94(\x8c\x04name\x8c\x01f\x8c\x08filename\x8c\x04a.py\x8c\x04lineK\x03ue(}\x94(\x8c\x04name\x8c\x01f\x8c\x08filename\x8c\x04a.py\x8c\x04lineK\x03u}\x94(\x8c\x04name\x8c\x01f\x8c\x08filename\x8c\x04a.py\x8c\x04lineK\x03ueu}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00 \x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x06ueau.";
        let tree = from_tree(frames_twice).unwrap();
        assert_eq!(tree.stacks[tree.history[0].context.unwrap().stack.unwrap().index()].len(), 4);
        let e = streamed(frames_twice).unwrap_err().to_string();
        assert!(e.contains("a list of frames appended to after it was read"), "{e}");
    }

    /// A batch's first event finds its trace; the others reuse what it found only while the
    /// stack below them is the same. Here, after the first event, the trace's key and list are
    /// popped and pushed again under another key (the trace list itself by a memo reference):
    /// the second event is not in a trace, is kept as a dict, and is read from the tree once the
    /// list is put in `device_traces` after all.
    #[test]
    fn an_event_below_a_stack_changed_since_the_batch_began_reads_as_from_the_tree() {
        let moved = b"\x80\x04}\x94(\x8c\x08segments]\x8c\x0ddevice_traces\x94]\x94]\x94(}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00\x10\x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05u0000\x8c\x05otherh\x02h\x03}(\x8c\x06action\x8c\x05alloc\x8c\x04addrM\x00 \x8c\x04sizeM\x00\x02\x8c\x06streamK\x00\x8c\x07time_usK\x05ue000h\x01h\x02(h\x03eu.";
        let tree = from_tree(moved).unwrap();
        assert_eq!(tree.history.iter().map(|e| e.addr).collect::<Vec<_>>(), [0x2000]);
        assert_eq!(streamed(moved).unwrap(), tree);
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

    /// Every snapshot under `fixtures/` (pickles, JSON, gzipped or not, hostile ones) read into
    /// the memory of the one read before it reads as it reads alone, or fails as it fails
    /// alone: histories longer and shorter than the room they are read into, and rooms from
    /// files of either kind.
    #[test]
    fn every_fixture_read_into_the_memory_of_another_reads_as_alone() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let (mut work, mut files) = (vec![root], Vec::new());
        while let Some(dir) = work.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    work.push(path);
                } else if ["pickle", "json", "gz"].iter().any(|x| path.extension().is_some_and(|e| e == *x)) {
                    files.push(path);
                }
            }
        }
        files.sort();
        let mut before: Option<Snapshot> = None;
        let (mut reused, mut failed) = (0, 0);
        for path in &files {
            let alone = Snapshot::load(path);
            let Some(room) = before.take() else {
                before = alone.ok();
                continue;
            };
            let had = room.history.len();
            match (Snapshot::load_reusing(path, Some(room)), alone) {
                (Ok(a), Ok(b)) => {
                    assert!(a == b, "{} read into the memory of {had} entries", path.display());
                    reused += 1;
                    before = Some(a);
                }
                (Err(a), Err(b)) => {
                    assert_eq!(a.to_string(), b.to_string());
                    failed += 1;
                }
                (a, b) => panic!("{}: reusing {:?}, alone {:?}", path.display(), a.err(), b.err()),
            }
        }
        assert!(reused >= 40 && failed >= 5, "{reused} read, {failed} refused");
    }
}
