//! Reference cycles among what a pickle built: found and broken, so that no value of a hostile
//! pickle is kept alive by itself.

use super::{container_id, Node, Value};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// Child `i` of a container if it is itself a container: `None` past the end, `Some(None)`
/// for a child that is not a container (nothing is cloned for those).
fn child_container(v: &Value, i: usize) -> Option<Option<Value>> {
    let pick = |c: &Value| container_id(c).map(|_| c.clone());
    match v {
        Value::List(l) => l.borrow().get(i).map(pick),
        Value::Tuple(t) => t.get(i).map(pick),
        Value::Dict(d) => d.borrow().get(i / 2).map(|(k, v)| pick(if i.is_multiple_of(2) { k } else { v })),
        _ => None,
    }
}

/// Whether any container reachable from `roots` contains itself: an iterative depth-first
/// search, each container visited once (shared ones are not a cycle).
pub(super) fn has_cycle<'a>(roots: impl Iterator<Item = &'a Value>) -> bool {
    #[derive(PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    let mut marks: HashMap<usize, Mark, BuildHasherDefault<AddressHasher>> = HashMap::default();
    // A container with no container among its items is in no cycle: a snapshot's frames,
    // shared thousands of times, are dicts of strings and numbers.
    let holds_container = |v: &Value| (0..).map_while(|i| child_container(v, i)).any(|c| c.is_some());
    for root in roots {
        let Some(id) = container_id(root) else { continue };
        if !holds_container(root) || marks.contains_key(&id) {
            continue;
        }
        marks.insert(id, Mark::Open);
        let mut path: Vec<(usize, Value, usize)> = vec![(id, root.clone(), 0)];
        while let Some((id, node, next)) = path.last_mut() {
            match child_container(node, *next) {
                Some(child) => {
                    *next += 1;
                    let Some(child) = child else { continue };
                    let cid = container_id(&child).expect("a container");
                    match marks.get(&cid) {
                        Some(Mark::Open) => return true,
                        Some(Mark::Done) => {}
                        None => {
                            marks.insert(cid, Mark::Open);
                            path.push((cid, child, 0));
                        }
                    }
                }
                None => {
                    marks.insert(*id, Mark::Done);
                    path.pop();
                }
            }
        }
    }
    false
}

/// Hashes addresses (multiplicative mixing: their low bits are always zero).
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_right(29);
    }
}

/// Empties every list and dict reachable from `roots`, which breaks every cycle among them.
pub(super) fn empty_containers<'a>(roots: impl Iterator<Item = &'a Value>) {
    let mut seen = std::collections::HashSet::new();
    let mut work: Vec<Value> = roots.cloned().collect();
    while let Some(v) = work.pop() {
        let Some(id) = container_id(&v) else { continue };
        if !seen.insert(id) {
            continue;
        }
        match &v {
            Value::List(l) => work.append(&mut l.borrow_mut()),
            Value::Dict(d) => work.extend(d.borrow_mut().drain(..).flat_map(|(k, v)| [k, v])),
            Value::Tuple(t) => work.extend(t.iter().cloned()),
            _ => {}
        }
    }
}

/// A container pushed a second time, known without keeping it alive.
pub(super) enum Again {
    List(std::rc::Weak<Node<Vec<Value>>>),
    Dict(std::rc::Weak<Node<Vec<(Value, Value)>>>),
    Tuple(std::rc::Weak<[Value]>),
}

impl Again {
    pub(super) fn of(v: &Value) -> Option<Again> {
        match v {
            Value::List(n) => Some(Again::List(Rc::downgrade(n))),
            Value::Dict(n) => Some(Again::Dict(Rc::downgrade(n))),
            Value::Tuple(t) => Some(Again::Tuple(Rc::downgrade(t))),
            _ => None,
        }
    }

    pub(super) fn upgrade(&self) -> Option<Value> {
        match self {
            Again::List(w) => w.upgrade().map(Value::List),
            Again::Dict(w) => w.upgrade().map(Value::Dict),
            Again::Tuple(w) => w.upgrade().map(Value::Tuple),
        }
    }
}

/// Keeps `v` in `again` if it is a container not kept there yet (lists and dicts say so
/// themselves; tuples, rare in a snapshot, are told apart by address).
#[inline]
pub(super) fn note_again(
    again: &mut Vec<Again>,
    tuples: &mut std::collections::HashSet<usize, BuildHasherDefault<AddressHasher>>,
    v: &Value,
) {
    let first = match v {
        Value::List(n) => !n.again.replace(true),
        Value::Dict(n) => !n.again.replace(true),
        Value::Tuple(_) => container_id(v).is_some_and(|id| tuples.insert(id)),
        _ => false,
    };
    if first {
        again.extend(Again::of(v));
    }
}
