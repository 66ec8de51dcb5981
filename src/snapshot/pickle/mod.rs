//! A pickle reader for plain data: the subset of the pickle protocol (0 to 5) that
//! dicts, lists, tuples, sets, strings, bytes, integers, floats, booleans and `None` use.
//! Anything that would construct an object (`GLOBAL`, `REDUCE`, ...) is an error: reading a
//! snapshot never runs code.

mod cycles;
mod input;

pub(crate) use cycles::AddressHasher;
use cycles::{empty_containers, has_cycle, note_again, Again};
use input::{err_at, Reader};
use std::cell::{Cell, Ref, RefCell, RefMut};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::rc::Rc;

/// A map keyed by the address of a value ([`Value::identity`]): addresses are not chosen by
/// the file, so a multiplicative hash serves, at a fraction of SipHash's cost per event.
pub(crate) type AddressMap<V> = std::collections::HashMap<usize, V, BuildHasherDefault<AddressHasher>>;

/// A value read from a pickle. Containers are shared (`Rc`) because the pickle memo lets one
/// container appear in several places, and dicts and lists are filled after they are memoized.
///
/// The tag takes a whole word (`repr(u64)`): the payload then starts on a word and a value is
/// copied as three words. With a one-byte tag, the copies of the parser's hottest opcodes
/// (memo references, MEMOIZE) moved the bytes beside the tag as overlapping pieces that later
/// whole-word reads stalled on. The size is the same, 24 bytes.
#[repr(u64)]
pub(crate) enum Value {
    None,
    Bool(bool),
    /// An integer that fits 64 bits: every figure of a real snapshot.
    Int(i64),
    /// A wider one (pickles allow any width; a hostile file may hold one), kept apart so that
    /// a value takes 24 bytes, not the 32 an `i128` field would make it.
    Big(Box<i128>),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<Node<Vec<Value>>>),
    Tuple(Rc<[Value]>),
    Dict(Rc<Node<Vec<(Value, Value)>>>),
    /// What a [`Reshape`] made of a value while the pickle was read, put in the memo in the
    /// value's place so that later references to it find the result, not the value.
    Kept(Kept),
}

/// A value a [`Reshape`] has read into a form of its own (an index into its own tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// An entry of a trace: the reader's list `list`, item `index`.
    Entry { list: u32, index: u32 },
    /// A list of frames, read as a stack (`None`: an empty one).
    Stack(Option<u32>),
    /// One frame.
    Frame(u32),
    /// A dict whose items a reader took as they were set ([`Reshape::dict`]): what it read
    /// waits, in its batch `batch`, at `index`.
    Pending { batch: u32, index: u32 },
}

/// A mutable container (list or dict) with what the reader needs to know of it: where the
/// memo keeps it, and whether it was pushed a second time (a memo GET or a DUP).
pub(crate) struct Node<T> {
    items: RefCell<T>,
    /// The memo index that stores it last ([`NOT_MEMOIZED`] if none).
    memo: Cell<u32>,
    /// Pushed a second time: kept for the cycle check.
    again: Cell<bool>,
    /// What a [`Reshape`] made of it, for references that reach it after (one made before
    /// it was read, or one that did not go through the memo).
    kept: Cell<Option<Kept>>,
}

/// The memo index of a container no memo slot stores (or one past what 32 bits index).
const NOT_MEMOIZED: u32 = u32::MAX;

impl<T> Node<T> {
    fn new(items: T) -> Node<T> {
        Node {
            items: RefCell::new(items),
            memo: Cell::new(NOT_MEMOIZED),
            again: Cell::new(false),
            kept: Cell::new(None),
        }
    }

    /// The items, borrowed.
    pub(crate) fn borrow(&self) -> Ref<'_, T> {
        self.items.borrow()
    }

    pub(crate) fn borrow_mut(&self) -> RefMut<'_, T> {
        self.items.borrow_mut()
    }
}

impl<X> Node<Vec<X>> {
    /// Makes an empty container as new, to be used again ([`Spare`]); `false` for one with
    /// items, or room for many (what a hostile file made large is not kept).
    fn reset(&mut self) -> bool {
        let items = self.items.get_mut();
        if !items.is_empty() || items.capacity() > 64 {
            return false;
        }
        *self = Node::new(std::mem::take(items));
        true
    }
}

/// A whole value tree, with the parser's memo that holds parts of it, handed to another thread
/// to be freed.
pub(crate) struct Detached(#[allow(dead_code)] Value, #[allow(dead_code)] Memo);

impl Detached {
    /// Takes `root` and the `memo` [`parse_with`] read it with, to be sent to another thread.
    ///
    /// # Safety
    ///
    /// `root` and `memo` are the only ways to reach every container inside them: no clone of
    /// either or of any container they hold lives elsewhere (a reader's tables that hold clones
    /// are dropped first). A clone kept elsewhere would share a non-atomic count with the
    /// thread that frees the tree.
    pub(crate) unsafe fn new(root: Value, memo: Memo) -> Detached {
        Detached(root, memo)
    }
}

// SAFETY: `Detached::new`'s contract: nothing outside the tree holds one of its `Rc`s, so the
// counts are touched by one thread only, the one that owns the tree.
unsafe impl Send for Detached {}

/// Dropping a deeply nested value recursively would overflow the stack (a hostile pickle can
/// nest a million lists in a few megabytes): containers that are dropped for good hand their
/// items that are themselves containers dropped for good to a work list instead. What stays
/// in a container drops in place without recursing (a number, a string, a container shared
/// elsewhere, whose count only falls), and a container with no such items needs no work list:
/// the dicts of a snapshot's events drop without one.
impl Drop for Value {
    #[inline]
    fn drop(&mut self) {
        // Most values dropped are numbers, strings and kept values: no work list to consider.
        if !matches!(self, Value::List(_) | Value::Dict(_) | Value::Tuple(_)) {
            return;
        }
        self.drop_container();
    }
}

impl Value {
    #[inline(never)]
    fn drop_container(&mut self) {
        /// Whether `v` is a container that dropping it frees, with items of its own.
        fn owned_container(v: &Value) -> bool {
            match v {
                Value::List(l) => Rc::strong_count(l) == 1 && !l.borrow().is_empty(),
                Value::Dict(d) => Rc::strong_count(d) == 1 && !d.borrow().is_empty(),
                Value::Tuple(t) => Rc::strong_count(t) == 1 && !t.is_empty(),
                _ => false,
            }
        }
        /// Moves the containers among `v`'s items that dropping them frees to `out`.
        fn take_children(v: &mut Value, out: &mut Vec<Value>) {
            let mut take = |item: &mut Value| {
                if owned_container(item) {
                    out.push(std::mem::replace(item, Value::None));
                }
            };
            match v {
                Value::List(l) if Rc::strong_count(l) == 1 => l.borrow_mut().iter_mut().for_each(take),
                Value::Dict(d) if Rc::strong_count(d) == 1 => {
                    d.borrow_mut().iter_mut().for_each(|(k, v)| {
                        take(k);
                        take(v);
                    });
                }
                Value::Tuple(t) => {
                    if let Some(items) = Rc::get_mut(t) {
                        items.iter_mut().for_each(take);
                    }
                }
                _ => {}
            }
        }
        if !owned_container(self) {
            return;
        }
        let mut work = Vec::new();
        take_children(self, &mut work);
        while let Some(mut v) = work.pop() {
            take_children(&mut v, &mut work);
            // `v` is now shallow and drops without recursion.
        }
    }
}

/// Half the opcodes of a snapshot push a memoized value again, so a clone is on the parser's
/// hottest path. Built variant by variant, the clone went through a temporary whose tag byte
/// was stored apart from its payload, and reading the temporary back whole stalled on every
/// clone (a seventh of a large pickle's read, by `perf`). Here the count of a shared value is
/// raised and its 24 bytes copied as they lie.
impl Clone for Value {
    // Always: out of line (as the compiler chose in some builds, by where the code around it
    // fell among codegen units), the copy went through memory again, a tenth of a parse.
    #[inline(always)]
    fn clone(&self) -> Value {
        match self {
            Value::Big(i) => return Value::Big(i.clone()),
            // A clone forgotten raises the count by one: the copy below owns that share.
            Value::Str(s) => std::mem::forget(Rc::clone(s)),
            Value::Bytes(b) => std::mem::forget(Rc::clone(b)),
            Value::List(l) => std::mem::forget(Rc::clone(l)),
            Value::Tuple(t) => std::mem::forget(Rc::clone(t)),
            Value::Dict(d) => std::mem::forget(Rc::clone(d)),
            Value::None | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Kept(_) => {}
        }
        // SAFETY: every variant but `Big` (returned above) is plain data or one `Rc`, whose
        // count was raised by one just above: the bitwise copy is a second owner of a share
        // that exists for it, as `Rc::clone` would make, and dropping either drops one share.
        unsafe { std::ptr::read(self) }
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::None => f.write_str("None"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Big(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
            Value::List(l) => write!(f, "<list of {}>", l.borrow().len()),
            Value::Tuple(t) => write!(f, "<tuple of {}>", t.len()),
            Value::Dict(d) => write!(f, "<dict of {}>", d.borrow().len()),
            Value::Kept(k) => write!(f, "<{k:?}>"),
        }
    }
}

impl Value {
    /// What a [`Reshape`] made of this value, if it did: the value is one it kept, or a
    /// container it read.
    pub(crate) fn kept(&self) -> Option<Kept> {
        match self {
            Value::Kept(k) => Some(*k),
            Value::List(n) => n.kept.get(),
            Value::Dict(n) => n.kept.get(),
            _ => None,
        }
    }

    /// Whether this is the list `other`, never pushed on the parser's stack a second time (by
    /// a memo reference or a DUP): where it stands on the stack is where it was first pushed,
    /// and what lies below it has not changed since (taking it off the stack is the only way
    /// to reach below it, and it would have been pushed again to be back).
    pub(crate) fn is_unmoved(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::List(a), Value::List(b)) => Rc::ptr_eq(a, b) && !a.again.get(),
            _ => false,
        }
    }

    /// Says on a container what a [`Reshape`] made of it (no memo slot changes).
    pub(crate) fn remember(&self, kept: Kept) {
        match self {
            Value::List(n) => n.kept.set(Some(kept)),
            Value::Dict(n) => n.kept.set(Some(kept)),
            _ => {}
        }
    }

    /// An integer, in 64 bits where it fits.
    pub(crate) fn int(i: i128) -> Value {
        match i64::try_from(i) {
            Ok(small) => Value::Int(small),
            Err(_) => Value::Big(Box::new(i)),
        }
    }

    /// A short name of the value's type, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::Big(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Kept(Kept::Entry { .. }) => "trace entry (read already)",
            Value::Kept(Kept::Stack(_)) => "list of frames (read already)",
            Value::Kept(Kept::Frame(_)) => "frame (read already)",
            Value::Kept(Kept::Pending { .. }) => "trace entry (being read)",
        }
    }

    /// Looks up a string key in a dict. A key given twice (`SETITEMS` may repeat one) has the
    /// value given last, as in the dict Python builds.
    pub(crate) fn get(&self, key: &str) -> Option<Value> {
        match self {
            Value::Dict(d) => {
                d.borrow().iter().rev().find(|(k, _)| matches!(k, Value::Str(s) if &**s == key)).map(|(_, v)| v.clone())
            }
            _ => None,
        }
    }

    /// The identity of a value the pickle may share through its memo: the address of a
    /// container, string or bytes (`None` for numbers, booleans and `None`). Every reference to
    /// one memoized value has the same identity while the value lives, so a reader can do the
    /// work of a shared value once, not once per reference.
    pub(crate) fn identity(&self) -> Option<usize> {
        match self {
            Value::Str(s) => Some(Rc::as_ptr(s) as *const u8 as usize),
            Value::Bytes(b) => Some(Rc::as_ptr(b) as *const u8 as usize),
            _ => container_id(self),
        }
    }

    /// The length in bytes of a string or bytes value (0 for anything else): what copying it
    /// costs.
    pub(crate) fn byte_len(&self) -> usize {
        match self {
            Value::Str(s) => s.len(),
            Value::Bytes(b) => b.len(),
            _ => 0,
        }
    }

    /// How many items a list, tuple or dict holds (0 for anything else), without copying them.
    pub(crate) fn len(&self) -> usize {
        match self {
            Value::List(l) => l.borrow().len(),
            Value::Tuple(t) => t.len(),
            Value::Dict(d) => d.borrow().len(),
            _ => 0,
        }
    }

    /// The items of a list or tuple, borrowed (a long list is not copied to be read).
    pub(crate) fn items_ref(&self) -> Option<Items<'_>> {
        match self {
            Value::List(l) => Some(Items::List(l.borrow())),
            Value::Tuple(t) => Some(Items::Tuple(t)),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub(crate) fn items(&self) -> Option<Vec<Value>> {
        match self {
            Value::List(l) => Some(l.borrow().clone()),
            Value::Tuple(t) => Some(t.to_vec()),
            _ => None,
        }
    }

    pub(crate) fn as_i128(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(i128::from(*i)),
            Value::Big(i) => Some(**i),
            Value::Bool(b) => Some(i128::from(*b)),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The items of a list or tuple, borrowed.
pub(crate) enum Items<'a> {
    List(std::cell::Ref<'a, Vec<Value>>),
    Tuple(&'a [Value]),
}

impl std::ops::Deref for Items<'_> {
    type Target = [Value];
    fn deref(&self) -> &[Value] {
        match self {
            Items::List(l) => l,
            Items::Tuple(t) => t,
        }
    }
}

/// Why a pickle could not be read, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PickleError {
    pub(crate) offset: usize,
    pub(crate) message: String,
    /// The data ended before the pickle did: the error of a whole file cut short, or of the
    /// head of a longer one read alone.
    pub(crate) truncated: bool,
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid pickle at byte {}: {}", self.offset, self.message)
    }
}

fn str_value(op_at: usize, bytes: &[u8]) -> Result<Value, PickleError> {
    std::str::from_utf8(bytes)
        .map(|s| Value::Str(Rc::from(s)))
        .map_err(|_| err_at(op_at, "a string is not valid UTF-8"))
}

/// Little-endian two's-complement integer of at most 16 bytes.
#[inline]
fn long_value(op_at: usize, bytes: &[u8]) -> Result<Value, PickleError> {
    if bytes.len() > 16 {
        return Err(err_at(op_at, format!("an integer of {} bytes does not fit in 128 bits", bytes.len())));
    }
    if bytes.is_empty() {
        return Ok(Value::Int(0));
    }
    // Up to 8 bytes (every address and size of a snapshot): sign-extended in 64 bits, built
    // in a register (a copy into a buffer read back whole stalled the parser on every address).
    if bytes.len() <= 8 {
        let bits = bytes.iter().rev().fold(0u64, |v, &b| (v << 8) | u64::from(b));
        let unused = 64 - 8 * bytes.len() as u32;
        // Shifted up and back arithmetically: the sign bit fills the bytes above.
        return Ok(Value::Int(((bits << unused) as i64) >> unused));
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut buf = [if negative { 0xff } else { 0 }; 16];
    buf[..bytes.len()].copy_from_slice(bytes);
    Ok(Value::int(i128::from_le_bytes(buf)))
}

/// The memo: what the pickle stored for later references, by index.
pub(crate) struct Memo(Vec<Option<Value>>);

impl Memo {
    /// Puts `kept` in the memo slot of `container` where the memo still stores it there, so
    /// that later references find what the reader made of it, and the memo no longer keeps the
    /// container alive.
    ///
    /// The container remembers it too ([`Value::remember`]). Returns whether the memo took it
    /// (a container stored nowhere, or stored again elsewhere since, is left there).
    pub(crate) fn keep(&mut self, container: &Value, kept: Kept) -> bool {
        container.remember(kept);
        let idx = match container {
            Value::List(n) => n.memo.get(),
            Value::Dict(n) => n.memo.get(),
            _ => return false,
        };
        match self.0.get_mut(idx as usize) {
            Some(slot) if slot.as_ref().and_then(container_id) == container_id(container) => {
                *slot = Some(Value::Kept(kept));
                true
            }
            _ => false,
        }
    }
}

/// A reader that reads parts of a pickle while it is parsed, into a form of its own, so that
/// the generic value tree of those parts is never built whole: each part is read and dropped
/// as soon as it is complete.
pub(crate) trait Reshape {
    /// What stops the reading.
    type Error;

    /// The items `stack[at + 1..]`, each complete, are about to be appended, by one APPEND or
    /// APPENDS, to the list `stack[at]`; `marks` are the stack positions of the MARKs still
    /// open. The reader may take them instead (`true`): they are dropped, never appended, and
    /// the list stays as it was. It may put what it made of a container in the container's
    /// memo slot ([`Memo::keep`]). `read` is the bytes of the pickle read so far.
    fn append(
        &mut self,
        _stack: &[Value],
        _marks: &[usize],
        _at: usize,
        _memo: &mut Memo,
        _read: usize,
    ) -> Result<bool, Self::Error> {
        Ok(false)
    }

    /// The key-value pairs `stack[from..]` are about to be set, in one SETITEMS, in the dict
    /// `stack[from - 1]`; `marks` are the stack positions of the MARKs still open. The reader
    /// may take them instead (`true`): they are dropped, never set, and the dict stays as it
    /// was. `read` is the bytes of the pickle read so far.
    fn dict(
        &mut self,
        _stack: &[Value],
        _marks: &[usize],
        _from: usize,
        _memo: &mut Memo,
        _read: usize,
    ) -> Result<bool, Self::Error> {
        Ok(false)
    }
}

/// Reads the generic value tree only.
struct Plain;

impl Reshape for Plain {
    type Error = std::convert::Infallible;
}

/// Why [`parse_with`] stopped.
#[derive(Debug)]
pub(crate) enum Failure<E> {
    /// The data is not a pickle this reader reads.
    Pickle(PickleError),
    /// The [`Reshape`] refused a part of it.
    Reader(E),
}

/// Parses a whole pickle and returns the value it stops with.
pub(crate) fn parse(mut data: &[u8]) -> Result<Value, PickleError> {
    parse_with(&mut data, &mut Plain).map(|(v, _, _)| v).map_err(|f| match f {
        Failure::Pickle(e) => e,
        Failure::Reader(never) => match never {},
    })
}

/// Parses a whole pickle read from `src` as it goes (up to its STOP opcode, no further),
/// `reshape` reading the lists it recognizes as they are filled. Returns the value, the bytes
/// the pickle took and the memo (which holds parts of the value: a caller that frees the value
/// elsewhere frees the memo with it, [`Detached`]).
pub(crate) fn parse_with<R: Reshape>(
    src: &mut dyn std::io::Read,
    reshape: &mut R,
) -> Result<(Value, usize, Memo), Failure<R::Error>> {
    let mut stack: Vec<Value> = Vec::new();
    let mut memo = Memo(Vec::new());
    let mut again: Vec<Again> = Vec::new();
    let mut refused = None;
    let mut r = Reader::new(src);
    let result = parse_into(&mut r, &mut stack, &mut memo, &mut again, reshape, &mut refused);
    let read = r.pos();
    // A memo reference or a DUP can put a container inside itself (`l = []; l.append(l)`):
    // such a value could never be dropped. Whether the pickle was read or not, a cycle among
    // what it built is broken (every list and dict emptied) and reported. A cycle holds a
    // container pushed a second time (a memo GET or a DUP put it inside what it already
    // contained), so those containers are where to look: what the stack and the memo still
    // hold would miss a cycle popped off the stack before STOP, which leaked (found by
    // `fuzz/run.sh`).
    // Only containers still alive can be in a cycle (a cycle keeps its members alive); those
    // the reader took and dropped are not looked at.
    let alive: Vec<Value> = again.iter().filter_map(Again::upgrade).collect();
    drop(again);
    if !alive.is_empty() && has_cycle(alive.iter()) {
        empty_containers(alive.iter());
        return Err(Failure::Pickle(PickleError {
            truncated: false,
            offset: read,
            message: "the pickle holds a reference cycle (a list or dict inside itself); snapshots never do".into(),
        }));
    }
    match (result, refused) {
        (_, Some(e)) => Err(Failure::Reader(e)),
        (result, None) => result.map(|v| (v, read, memo)).map_err(Failure::Pickle),
    }
}

/// Whether the first bytes of a pickle can begin one: `Err` with the error where they cannot
/// (an opcode no pickle has, say), so that a long file of something else is refused before it is
/// read whole; `Ok` where they parse, or run out before the pickle ends.
pub(crate) fn check_head(head: &[u8]) -> Result<(), PickleError> {
    match parse(head) {
        Err(e) if !e.truncated => Err(e),
        _ => Ok(()),
    }
}

/// Empty lists and dicts the reader took and no one else holds, kept to be the next ones the
/// pickle makes: each event of a trace makes a dict, and with Python stacks a list of frames,
/// and freeing them to allocate the next ones was most of the parse's calls to the allocator.
#[derive(Default)]
struct Spare {
    lists: Vec<Rc<Node<Vec<Value>>>>,
    dicts: Vec<Rc<DictNode>>,
}

/// A dict's node: its key-value pairs in the order set.
type DictNode = Node<Vec<(Value, Value)>>;

/// Containers kept aside at most, of each kind (a trace's batch makes a thousand).
const SPARE_MAX: usize = 2048;

impl Spare {
    /// Drops `stack[from..]`, the items a [`Reshape`] took, keeping aside the empty lists and
    /// dicts among them that nothing else holds: no memo slot, no table of the reader and no
    /// cycle check (a weak reference) knows them, so that a container made from one is new to
    /// everyone.
    fn take(&mut self, stack: &mut Vec<Value>, from: usize) {
        for mut v in stack.drain(from..) {
            let kept = match &mut v {
                Value::List(n) => self.lists.len() < SPARE_MAX && Rc::get_mut(n).is_some_and(Node::reset),
                Value::Dict(n) => self.dicts.len() < SPARE_MAX && Rc::get_mut(n).is_some_and(Node::reset),
                // Most items taken (a frame read already, a number) own nothing: forgotten,
                // not dropped through a call each (a twentieth of a default-stacks parse).
                Value::None | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Kept(_) => {
                    std::mem::forget(v);
                    continue;
                }
                _ => false,
            };
            match &v {
                Value::List(n) if kept => self.lists.push(Rc::clone(n)),
                Value::Dict(n) if kept => self.dicts.push(Rc::clone(n)),
                _ => {}
            }
        }
    }
}

/// The address of a container (`None` for anything else).
fn container_id(v: &Value) -> Option<usize> {
    match v {
        Value::List(l) => Some(Rc::as_ptr(l) as *const u8 as usize),
        Value::Dict(d) => Some(Rc::as_ptr(d) as *const u8 as usize),
        Value::Tuple(t) => Some(Rc::as_ptr(t) as *const u8 as usize),
        _ => None,
    }
}

/// Reads the pickle, keeping in `again` each container it pushes a second time (a memo GET or
/// a DUP), once each, for [`parse`] to check for cycles.
fn parse_into<R: Reshape>(
    r: &mut Reader<'_>,
    stack: &mut Vec<Value>,
    memo: &mut Memo,
    again: &mut Vec<Again>,
    reshape: &mut R,
    refused: &mut Option<R::Error>,
) -> Result<Value, PickleError> {
    let mut marks: Vec<usize> = Vec::new();
    let mut spare = Spare::default();
    // The tuples already in `again`: one entry per container is all the cycle check needs.
    let mut again_ids: std::collections::HashSet<usize, BuildHasherDefault<AddressHasher>> = Default::default();

    macro_rules! pop {
        () => {
            stack.pop().ok_or_else(|| r.err("the stack is empty"))?
        };
    }
    // Where the items since the last MARK begin on the stack.
    macro_rules! mark {
        () => {{
            let m = marks.pop().ok_or_else(|| r.err("no MARK before a collection opcode"))?;
            if m > stack.len() {
                return Err(r.err("MARK refers past the stack"));
            }
            m
        }};
    }
    macro_rules! since_mark {
        () => {{
            let m = mark!();
            stack.split_off(m)
        }};
    }
    // What the reader answers; a refusal stops the parse, and is the error reported.
    macro_rules! reader {
        ($answer:expr) => {
            match $answer {
                Ok(v) => v,
                Err(e) => {
                    *refused = Some(e);
                    return Err(r.err("the reader refused what it read"));
                }
            }
        };
    }
    fn put(memo: &mut Memo, idx: usize, v: Value, r: &Reader<'_>) -> Result<(), PickleError> {
        // A memo index more than the bytes read so far cannot come from a real pickler.
        if idx > r.pos() + 1024 {
            return Err(r.err(format!("memo index {idx} is implausibly large")));
        }
        let at = u32::try_from(idx).unwrap_or(NOT_MEMOIZED);
        match &v {
            Value::List(n) => n.memo.set(at),
            Value::Dict(n) => n.memo.set(at),
            _ => {}
        }
        let memo = &mut memo.0;
        if memo.len() == idx {
            memo.push(Some(v));
            return Ok(());
        }
        if memo.len() < idx {
            memo.resize(idx + 1, None);
        }
        memo[idx] = Some(v);
        Ok(())
    }
    // A memo reference: the value pushed again. The value is cloned straight onto the stack
    // (most opcodes of a snapshot are these), never moved through a `Result`.
    macro_rules! get {
        ($idx:expr) => {{
            let idx = $idx;
            match memo.0.get(idx) {
                Some(Some(v)) => {
                    note_again(again, &mut again_ids, v);
                    stack.push(v.clone());
                }
                _ => return Err(r.err(format!("memo index {idx} was never stored"))),
            }
        }};
    }
    fn append(target: &Value, items: impl ExactSizeIterator<Item = Value>, r: &Reader<'_>) -> Result<(), PickleError> {
        match target {
            Value::List(l) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            other => Err(r.err(format!("APPEND to a {} instead of a list", other.type_name()))),
        }
    }
    /// Moves the key-value pairs `stack[from..]` into the dict below them, `stack[from - 1]`.
    fn set_items(stack: &mut Vec<Value>, from: usize, r: &Reader<'_>) -> Result<(), PickleError> {
        let n = stack.len() - from;
        if !n.is_multiple_of(2) {
            return Err(r.err("SETITEMS with an odd number of values"));
        }
        let target = from.checked_sub(1).map(|t| &stack[t]).ok_or_else(|| r.err("SETITEMS with no dict"))?;
        let Value::Dict(d) = target else {
            return Err(r.err(format!("SETITEM on a {} instead of a dict", target.type_name())));
        };
        let d = Rc::clone(d);
        let mut d = d.borrow_mut();
        d.reserve(n / 2);
        let mut it = stack.drain(from..);
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }

    loop {
        r.op_at = r.pos();
        let op_at = r.op_at;
        let op = r.u8().map_err(|_| r.short("the data ends before the STOP opcode (is the file truncated?)"))?;
        match op {
            0x80 => {
                let proto = r.u8()?;
                if proto > 5 {
                    return Err(r.err(format!("unsupported pickle protocol {proto}")));
                }
            }
            0x95 => {
                r.u64()?;
            }
            b'.' => {
                let v = pop!();
                return Ok(v);
            }
            b'}' => stack.push(Value::Dict(spare.dicts.pop().unwrap_or_else(|| Rc::new(Node::new(Vec::new()))))),
            b']' => stack.push(Value::List(spare.lists.pop().unwrap_or_else(|| Rc::new(Node::new(Vec::new()))))),
            b')' => stack.push(Value::Tuple(Rc::from(Vec::new()))),
            0x8f => stack.push(Value::List(spare.lists.pop().unwrap_or_else(|| Rc::new(Node::new(Vec::new()))))),
            b'(' => marks.push(stack.len()),
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool(true)),
            0x89 => stack.push(Value::Bool(false)),
            b'J' => {
                let v = r.u32()? as i32;
                stack.push(Value::Int(i64::from(v)))
            }
            b'K' => {
                let v = r.u8()?;
                stack.push(Value::Int(i64::from(v)))
            }
            b'M' => {
                let v = r.u16()?;
                stack.push(Value::Int(i64::from(v)))
            }
            0x8a => {
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                stack.push(long_value(op_at, b)?);
            }
            0x8b => {
                let n = r.u32()? as i32;
                if n < 0 {
                    return Err(r.err("LONG4 with a negative length"));
                }
                let n = r.len(n as u64)?;
                let b = r.take(n)?;
                stack.push(long_value(op_at, b)?);
            }
            b'I' => {
                let line = r.line()?;
                let s = std::str::from_utf8(line).map_err(|_| err_at(op_at, "INT argument is not text"))?;
                let v = match s {
                    "01" => Value::Bool(true),
                    "00" => Value::Bool(false),
                    _ => Value::int(
                        s.parse().map_err(|_| err_at(op_at, format!("INT argument `{s}` is not an integer")))?,
                    ),
                };
                stack.push(v);
            }
            b'G' => {
                let v = f64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
                stack.push(Value::Float(v));
            }
            b'X' => {
                let n = r.u32()?;
                let n = r.len(u64::from(n))?;
                let b = r.take(n)?;
                stack.push(str_value(op_at, b)?);
            }
            0x8c => {
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                stack.push(str_value(op_at, b)?);
            }
            0x8d => {
                let n = r.u64()?;
                let n = r.len(n)?;
                let b = r.take(n)?;
                stack.push(str_value(op_at, b)?);
            }
            b'C' | b'U' => {
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                stack.push(Value::Bytes(Rc::from(b)));
            }
            b'B' | b'T' => {
                let n = r.u32()?;
                let n = r.len(u64::from(n))?;
                let b = r.take(n)?;
                stack.push(Value::Bytes(Rc::from(b)));
            }
            0x8e => {
                let n = r.u64()?;
                let n = r.len(n)?;
                let b = r.take(n)?;
                stack.push(Value::Bytes(Rc::from(b)));
            }
            b't' | 0x91 => {
                let items = since_mark!();
                stack.push(if op == b't' {
                    Value::Tuple(Rc::from(items))
                } else {
                    Value::List(Rc::new(Node::new(items)))
                });
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return Err(r.err(format!("TUPLE{n} with {} values on the stack", stack.len())));
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Value::Tuple(Rc::from(items)));
            }
            b'l' => {
                let items = since_mark!();
                stack.push(Value::List(Rc::new(Node::new(items))));
            }
            b'd' => {
                let m = mark!();
                stack.insert(m, Value::Dict(Rc::new(Node::new(Vec::new()))));
                set_items(stack, m + 1, r)?;
            }
            b'a' | b'e' | 0x90 => {
                // The items stay on the stack while the reader looks at them: most are taken,
                // and none is moved twice.
                let (from, name) = if op == b'a' {
                    (stack.len().checked_sub(1).ok_or_else(|| r.err("the stack is empty"))?, "APPEND")
                } else {
                    (mark!(), "APPENDS")
                };
                let at = from.checked_sub(1).ok_or_else(|| r.err(format!("{name} with no list")))?;
                if reader!(reshape.append(stack, &marks, at, memo, r.pos())) {
                    spare.take(stack, from);
                } else {
                    let list = stack[at].clone();
                    append(&list, stack.drain(from..), r)?;
                }
            }
            b's' => {
                if stack.len() < 3 {
                    return Err(r.err(format!("SETITEM with {} values on the stack", stack.len())));
                }
                set_items(stack, stack.len() - 2, r)?;
            }
            b'u' => {
                let m = mark!();
                if reader!(reshape.dict(stack, &marks, m, memo, r.pos())) {
                    spare.take(stack, m);
                } else {
                    set_items(stack, m, r)?;
                }
            }
            0x94 => {
                let v = stack.last().cloned().ok_or_else(|| r.err("MEMOIZE with an empty stack"))?;
                let idx = memo.0.len();
                put(memo, idx, v, r)?;
            }
            b'q' => {
                let idx = r.u8()? as usize;
                let v = stack.last().cloned().ok_or_else(|| r.err("BINPUT with an empty stack"))?;
                put(memo, idx, v, r)?;
            }
            b'r' => {
                let idx = r.u32()? as usize;
                let v = stack.last().cloned().ok_or_else(|| r.err("LONG_BINPUT with an empty stack"))?;
                put(memo, idx, v, r)?;
            }
            b'h' => get!(r.u8()? as usize),
            b'j' => get!(r.u32()? as usize),
            b'0' => {
                pop!();
            }
            b'1' => {
                let _ = since_mark!();
            }
            b'2' => {
                let v = stack.last().cloned().ok_or_else(|| r.err("DUP with an empty stack"))?;
                note_again(again, &mut again_ids, &v);
                stack.push(v);
            }
            b'c' | 0x93 | b'R' | 0x81 | 0x92 | b'b' | b'i' | b'o' => {
                return Err(r.err(format!(
                    "opcode {op:#04x} constructs an object; only plain data (dicts, lists, strings, numbers) is read"
                )));
            }
            _ => return Err(r.err(format!("unknown or unsupported opcode {op:#04x}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_takes_24_bytes_and_wide_integers_stay_exact() {
        assert_eq!(std::mem::size_of::<Value>(), 24);
        for n in [0i128, -1, i128::from(i64::MAX), i128::from(i64::MAX) + 1, i128::from(u64::MAX), -(1 << 100)] {
            assert_eq!(Value::int(n).as_i128(), Some(n));
        }
        // LONG1 of 9 bytes: 2^64.
        let v = parse(&[0x80, 2, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1, b'.']).unwrap();
        assert_eq!(v.as_i128(), Some(1 << 64));
        assert_eq!(std::mem::size_of::<Option<Value>>(), 24, "a memo slot is a value's size");
    }

    #[test]
    fn integers_of_every_width_read_as_python_writes_them() {
        // Python's LONG1 writes the fewest two's-complement bytes, little-endian; each width
        // from 1 to 16 bytes, either sign, at the edges of the width and inside it.
        let mut seen = 0;
        for width in 1..=16u32 {
            let top = 1i128 << (8 * width - 1).min(126);
            for n in [top - 1, -top, top / 3, -top / 3, 0, -1, 1] {
                let bytes = n.to_le_bytes();
                let mut op = vec![0x80, 2, 0x8a, width as u8];
                op.extend_from_slice(&bytes[..width as usize]);
                op.push(b'.');
                let read = parse(&op).unwrap().as_i128();
                // The bytes given, sign-extended: what Python's `int.from_bytes(.., signed=True)` gives.
                let mut wide = [if bytes[width as usize - 1] & 0x80 != 0 { 0xff } else { 0 }; 16];
                wide[..width as usize].copy_from_slice(&bytes[..width as usize]);
                assert_eq!(read, Some(i128::from_le_bytes(wide)), "{width} bytes of {n}");
                seen += 1;
            }
        }
        assert_eq!(seen, 16 * 7);
    }

    #[test]
    fn a_clone_shares_what_it_clones_and_dropping_it_gives_the_share_back() {
        let text: Rc<str> = Rc::from("frames");
        let list = Rc::new(Node::new(vec![Value::Int(1)]));
        let tuple: Rc<[Value]> = Rc::from(vec![Value::Str(Rc::clone(&text))]);
        let values = [
            Value::Str(Rc::clone(&text)),
            Value::List(Rc::clone(&list)),
            Value::Tuple(Rc::clone(&tuple)),
            Value::Big(Box::new(-(1 << 100))),
            Value::Kept(Kept::Frame(7)),
        ];
        // `text` is held by itself, `values[0]` and the tuple's item.
        assert_eq!((Rc::strong_count(&text), Rc::strong_count(&list), Rc::strong_count(&tuple)), (3, 2, 2));
        let clones: Vec<Value> = values.iter().map(Value::clone).collect();
        assert_eq!((Rc::strong_count(&text), Rc::strong_count(&list), Rc::strong_count(&tuple)), (4, 3, 3));
        assert_eq!(clones[3].as_i128(), Some(-(1 << 100)));
        assert_eq!(clones[4].kept(), Some(Kept::Frame(7)));
        assert_eq!(clones[1].identity(), values[1].identity(), "a container is shared, not copied");
        drop(clones);
        assert_eq!((Rc::strong_count(&text), Rc::strong_count(&list), Rc::strong_count(&tuple)), (3, 2, 2));
        drop(values);
        assert_eq!((Rc::strong_count(&text), Rc::strong_count(&list), Rc::strong_count(&tuple)), (2, 1, 1));
    }

    #[test]
    fn reads_protocol_4_dict() {
        // pickle.dumps({"a": [1, 2**40, -3], "b": ("x", None, True, 1.5)}, protocol=4)
        let data = b"\x80\x04\x95,\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01\x8a\x06\x00\x00\x00\x00\x00\x01J\xfd\xff\xff\xffe\x8c\x01b\x94(\x8c\x01x\x94N\x88G?\xf8\x00\x00\x00\x00\x00\x00t\x94u.";
        let v = parse(data).unwrap();
        let a = v.get("a").unwrap().items().unwrap();
        assert_eq!(a.iter().map(|x| x.as_i128().unwrap()).collect::<Vec<_>>(), vec![1, 1 << 40, -3]);
        let b = v.get("b").unwrap().items().unwrap();
        assert_eq!(b[0].as_str(), Some("x"));
        assert!(matches!(b[1], Value::None));
        assert!(matches!(b[3], Value::Float(x) if x == 1.5));
    }

    #[test]
    fn rejects_bad_input_with_offsets() {
        assert!(parse(b"").unwrap_err().message.contains("STOP"));
        assert!(parse(b"\x80\x04}").unwrap_err().message.contains("truncated"));
        let e = parse(b"\x80\x04\x8c\xff").unwrap_err();
        assert!(e.message.contains("ends early"), "{e}");
        let e = parse(b"\x80\x04cos\nsystem\n.").unwrap_err();
        assert!(e.message.contains("constructs an object"), "{e}");
        assert_eq!(e.offset, 2);
        assert!(parse(b"\x80\x04X\xff\xff\xff\xff").unwrap_err().message.contains("runs past"));
        assert!(parse(b"\x80\x04h\x05.").unwrap_err().message.contains("never stored"));
        assert!(parse(b"\x80\x04a.").unwrap_err().message.contains("empty"));
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;

    #[test]
    fn a_million_nested_lists_parse_and_drop_without_overflow() {
        // ] ] ] ... then APPEND each into the one below: one list nested a million deep.
        let depth = 1_000_000;
        let mut data = vec![0x80, 4];
        data.extend(std::iter::repeat_n(b']', depth));
        data.extend(std::iter::repeat_n(b'a', depth - 1));
        data.push(b'.');
        let v = parse(&data).unwrap();
        assert!(matches!(v, Value::List(_)));
        drop(v);
        // The same with tuples of one and dicts.
        let mut data = vec![0x80, 4, b'N'];
        data.extend(std::iter::repeat_n(0x85, depth));
        data.push(b'.');
        drop(parse(&data).unwrap());
    }
}
