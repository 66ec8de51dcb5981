//! A caching DWARF unwinder for x86-64 Linux: the stack of every allocation in any build.
//!
//! Every function that Rust, C and C++ compilers emit has call frame information in its
//! object's `.eh_frame` (panics and C++ exceptions unwind with it), frame pointers or not.
//! Reading it takes microseconds per frame (the `backtrace` crate's unwinder pays that on every
//! call); what it says at an address never changes while the object is loaded. So the first
//! time a thread meets a return address, [`objects::find`] reads the rule there and this
//! module caches it, packed in one word ([`rule::Step`]), in a per-thread table
//! ([`cache::RuleCache`]); afterwards the frame costs one table lookup and one or two reads of
//! the stack, with no lock, no system call and no atomic write. A capture from a place the
//! thread captured from before does not even look the rules up: it checks that the stack
//! slots the last walk read still hold what they held ([`walk`], [`replay`]). The frame
//! pointer register and the slots it was saved to count only where a rule used them (a CFA
//! found from the frame pointer, before another frame restored it): in code built without
//! frame pointers the register is an ordinary one, and a loop's captures hold other values
//! there each time while their frames are the same.
//!
//! Frames with frame pointers need no special case: their rule says "the CFA is the frame
//! pointer plus 16", which the same lookup finds. Frames the packed rule cannot describe
//! (signal trampolines, CFA expressions, code generated at run time) make [`capture`] return
//! `None`: the caller takes the whole stack with the `backtrace` crate's unwinder instead.
//!
//! Objects loaded later (`dlopen`, as cudarc loads the CUDA driver) are found at their first
//! miss. Unloading is seen at the next miss: glibc counts unloads, and when the count moved
//! every thread's table is dropped before its next capture, as the freed addresses may hold
//! other code. Every read of the stack is checked against the thread's stack bounds, so a
//! wrong rule can end a stack early but never read outside it.

mod cache;
mod objects;
mod rule;

use cache::RuleCache;
use rule::Step;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bumped when objects were unloaded: every thread's table is stale.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The unload count glibc last reported (`u64::MAX`: not read yet).
static UNLOADS: AtomicU64 = AtomicU64::new(u64::MAX);

struct ThreadState {
    cache: RuleCache,
    generation: u64,
    ctx: Option<Box<objects::Context>>,
    /// This thread's previous walk, and a spare buffer for the next.
    last: Trace,
    spare: Vec<Seen>,
}

/// What one walk read, frame by frame, so that the next capture from the same place can check
/// the same stack slots instead of looking the rules up again (see [`walk`]).
#[derive(Debug)]
struct Trace {
    frames: Vec<Seen>,
    /// The walk ended after its last frame (the stack's end, or a slot outside the stack),
    /// rather than because the output was full.
    stopped: bool,
    /// Where it `stopped`, whether the stop was decided from the frame pointer (a CFA found
    /// from it); not where it met the stack's end (decided by the address alone).
    stop_used_fp: bool,
    /// Whether any frame's CFA (or the stop) was found from the frame pointer the walk started
    /// with, passed up unchanged by the frames below it. In code built without frame pointers
    /// the register is an ordinary one and holds whatever the code last put there: a walk
    /// that never used it is the same walk whatever it holds.
    fp0_needed: bool,
    /// The last capture's length and hash.
    hash: (usize, u64),
    /// Changes whenever `frames` change: a capture's frames are the same as another's of this
    /// thread when both have the same version and length (see [`Captured::version`]).
    version: u64,
}

/// A capture's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Captured {
    /// Frames written.
    pub(crate) len: usize,
    /// Their [`hash_stack`](super::hash::hash_stack).
    pub(crate) hash: u64,
    /// The capturing thread's trace version: two captures of one thread with the same version
    /// and length hold the same frames, so a recorder may reuse what it made of the first.
    pub(crate) version: u64,
}

impl Trace {
    const fn new() -> Trace {
        Trace { frames: Vec::new(), stopped: false, stop_used_fp: true, fp0_needed: true, hash: (0, 0), version: 0 }
    }

    /// Forgets the walk.
    fn clear(&mut self) {
        self.version += 1;
        self.frames.clear();
        self.fp0_needed = true;
    }

    /// A new walk in `frames`: marks, from the last frame down, which frame pointers a replay
    /// must compare: the one the walk started with and each one restored from a slot, where a
    /// caller's CFA (or the stop) was found from it before another frame restored it.
    fn index(&mut self) {
        self.version += 1;
        let mut need = self.stopped && self.stop_used_fp;
        for f in self.frames.iter_mut().rev() {
            f.check_fp = f.fp_at != 0 && need;
            need = if f.fp_at != 0 { f.cfa_from_fp } else { need || f.cfa_from_fp };
        }
        self.fp0_needed = need;
    }
}

/// One frame of a walk: the registers it started from, the slots it read and what they held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    lookup: u64,
    sp: u64,
    fp: u64,
    ra_at: u64,
    ra: u64,
    /// Where the caller's frame pointer was read (0: not read, it is `fp` unchanged).
    fp_at: u64,
    /// The caller's frame pointer.
    fp_after: u64,
    cfa: u64,
    /// The CFA was found from `fp` (else from `sp`).
    cfa_from_fp: bool,
    /// A replay compares the slot at `fp_at` (see [`Trace::index`]).
    check_fp: bool,
}

thread_local! {
    static STATE: RefCell<ThreadState> = const {
        RefCell::new(ThreadState {
            cache: RuleCache::new(),
            generation: 0,
            ctx: None,
            last: Trace::new(),
            spare: Vec::new(),
        })
    };
}

/// The registers an unwind starts from: this function's own frame.
#[derive(Debug, Clone, Copy)]
struct Regs {
    pc: u64,
    sp: u64,
    fp: u64,
}

#[inline(always)]
fn registers() -> Regs {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads three registers into locals; no memory access. All three come from the
    // same instruction, so the rule at `pc` describes `sp` and `fp`.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        )
    };
    Regs { pc, sp, fp }
}

/// Captures the calling thread's return addresses into `out`, innermost first, starting with
/// the return address into this function's caller. `stack` is the thread's stack `[lo, hi)`.
/// `None`: a frame this unwinder does not model was met (or the thread is not on the stack
/// it was given); the caller unwinds with the `backtrace` crate instead.
#[inline(never)]
pub(crate) fn capture(out: &mut [usize], stack: (usize, usize)) -> Option<Captured> {
    let regs = registers();
    STATE
        .try_with(|state| {
            // Re-entered (a capture from inside a capture's slow path): let the other unwinder work.
            let mut state = state.try_borrow_mut().ok()?;
            let generation = GENERATION.load(Ordering::Relaxed);
            if state.generation != generation {
                state.cache.clear();
                state.last.clear();
                state.generation = generation;
            }
            if let Some((len, hash)) = replay(&mut state.last, regs, out) {
                return Some(Captured { len, hash, version: state.last.version });
            }
            let n = walk(&mut state, regs, stack, out)?;
            if state.generation != generation {
                // A miss saw objects unloaded during this walk: its trace may hold stale rules.
                state.last.clear();
            }
            let hash = super::hash::hash_stack(&out[..n]);
            state.last.hash = (n, hash);
            Some(Captured { len: n, hash, version: state.last.version })
        })
        .ok()
        .flatten()
}

/// The whole previous walk again, where this capture starts from the registers it started
/// from and every slot it read holds the same value: then the walk would read the same slots
/// under the same rules (see [`walk`]) and give the same frames. The frame pointer (the
/// starting register, a restored slot) is compared only where the walk used it: a value no
/// rule reads cannot change a frame. The slots need no bounds check: the same stack pointer
/// gives the same lower bound as when they were read.
#[inline(always)]
fn replay(last: &mut Trace, regs: Regs, out: &mut [usize]) -> Option<(usize, u64)> {
    let first = last.frames.first()?;
    if (first.lookup, first.sp) != (regs.pc, regs.sp) || out.is_empty() {
        return None;
    }
    let m = out.len().min(last.frames.len());
    // Where the previous walk stopped after `m` frames, or where `out` is full: the same end.
    if m == last.frames.len() && !last.stopped && m < out.len() {
        return None;
    }
    // The frame pointer only where the frames replayed were found from it: in code without
    // frame pointers the register holds whatever the code last put there.
    if first.fp != regs.fp && last.fp0_needed {
        return None;
    }
    // One pass: `out` is scratch until this returns `Some` (a miss walks over it).
    for (o, f) in out[..m].iter_mut().zip(&last.frames[..m]) {
        // SAFETY: every slot was an aligned word of this thread's stack, at or above the stack
        // pointer of the capture that read it, which is the stack pointer now: mapped and
        // readable while this function runs.
        let same =
            unsafe { *(f.ra_at as *const u64) == f.ra && (!f.check_fp || *(f.fp_at as *const u64) == f.fp_after) };
        if !same {
            return None;
        }
        *o = f.ra as usize;
    }
    if last.hash.0 != m {
        last.hash = (m, super::hash::hash_stack(&out[..m]));
    }
    Some(last.hash)
}

/// The unwind proper.
///
/// A frame is a function of three registers (the address whose rule applies, the stack
/// pointer, the frame pointer) and of the stack slots its rule reads. When the walk reaches a
/// state the previous capture of this thread also passed through (same three registers), the
/// previous walk's remaining frames are checked instead of recomputed: each slot it read must
/// hold the same value now. Those loads do not depend on each other, where looking rules up
/// chains a table lookup on every loaded return address; a capture from a place the thread
/// captured from before costs a compare per frame. By induction over the frames the result
/// is exactly the full walk's: the same state, the same rules (the table is only cleared,
/// never changed, and a cleared table clears the trace), the same slots with the same values.
/// Where a slot differs, the walk goes on from that frame's state as usual, and the next
/// frame whose state the previous walk also had is checked again.
#[inline(always)]
fn walk(state: &mut ThreadState, regs: Regs, (lo, hi): (usize, usize), out: &mut [usize]) -> Option<usize> {
    const WORD: u64 = 8;
    let (lo, hi) = ((lo as u64).max(regs.sp), hi as u64);
    if !(lo <= regs.sp && regs.sp < hi) {
        return None;
    }
    // The word at `at`, where it is an aligned word of this thread's stack between the live
    // stack pointer and the stack's top; `None` elsewhere.
    let read = |at: u64| {
        let on_stack = at >= lo && at <= hi - WORD && at.is_multiple_of(WORD);
        // SAFETY: such a word is mapped and readable while this function runs.
        on_stack.then(|| unsafe { *(at as *const u64) })
    };
    let last = std::mem::take(&mut state.last.frames);
    let last_stopped = state.last.stopped;
    let last_stop_used_fp = state.last.stop_used_fp;
    let mut stop_used_fp = false;
    // The previous walk is written back below, changed or not.
    let mut new = std::mem::take(&mut state.spare);
    new.clear();
    // Frames taken verbatim from `last[..same]` while nothing differed (no copy needed then).
    let mut same = 0;
    let mut diverged = false;
    // The first frame's row is the one at its own address; a caller's is the one at the call
    // instruction, just before the return address.
    let (mut lookup, mut sp, mut fp) = (regs.pc, regs.sp, regs.fp);
    let mut j = 0;
    let mut n = 0;
    let mut stopped = false;
    'frames: while n < out.len() {
        // Resume the previous walk where it passed through this state.
        while j < last.len() && last[j].sp < sp {
            j += 1;
        }
        if j < last.len() && last[j].sp == sp && last[j].lookup == lookup && last[j].fp == fp {
            let mut k = j;
            while k < last.len() && n < out.len() {
                let f = &last[k];
                let ok = read(f.ra_at) == Some(f.ra) && (f.fp_at == 0 || read(f.fp_at) == Some(f.fp_after));
                if !ok {
                    break;
                }
                out[n] = f.ra as usize;
                n += 1;
                if !diverged && k == same {
                    same += 1;
                } else {
                    if !diverged {
                        new.extend_from_slice(&last[..same]);
                        diverged = true;
                    }
                    new.push(*f);
                }
                k += 1;
            }
            if k == last.len() {
                if last_stopped {
                    // The same state after the last frame, so the same end.
                    stopped = true;
                    stop_used_fp = last_stop_used_fp;
                    break 'frames;
                }
                let f = &last[k - 1];
                (lookup, sp, fp) = (f.ra - 1, f.cfa, f.fp_after);
            } else if n < out.len() {
                // A slot differs: walk this frame from its state.
                let f = &last[k];
                (lookup, sp, fp) = (f.lookup, f.sp, f.fp);
            }
            j = k + 1;
            if n == out.len() {
                break;
            }
        }
        let word = match state.cache.get(lookup) {
            Some(w) => w,
            None => miss(state, lookup),
        };
        let rule = match Step::decode(word) {
            Step::Rule(r) => r,
            Step::End => {
                stopped = true;
                stop_used_fp = false;
                break;
            }
            Step::Fallback => {
                state.spare = new;
                state.last.frames = last;
                return None;
            }
        };
        let base = if rule.cfa_from_fp { fp } else { sp };
        let cfa = base.wrapping_add(u64::from(rule.cfa_offset));
        let ra_at = cfa.wrapping_sub(u64::from(rule.ra_below));
        // Every slot read lies on this thread's stack, above the current frame.
        let Some(ra) = read(ra_at).filter(|_| cfa > sp) else {
            stopped = true;
            stop_used_fp = rule.cfa_from_fp;
            break;
        };
        let (fp_at, fp_after) = match rule.fp_below {
            Some(below) => {
                let at = cfa.wrapping_sub(u64::from(below));
                let Some(saved) = read(at) else {
                    stopped = true;
                    stop_used_fp = rule.cfa_from_fp;
                    break;
                };
                (at, saved)
            }
            None => (0, fp),
        };
        if ra == 0 {
            stopped = true;
            stop_used_fp = rule.cfa_from_fp;
            break;
        }
        if !diverged {
            new.extend_from_slice(&last[..same]);
            diverged = true;
        }
        new.push(Seen {
            lookup,
            sp,
            fp,
            ra_at,
            ra,
            fp_at,
            fp_after,
            cfa,
            cfa_from_fp: rule.cfa_from_fp,
            check_fp: false,
        });
        out[n] = ra as usize;
        n += 1;
        (lookup, sp, fp) = (ra - 1, cfa, fp_after);
    }
    if !diverged && same == last.len() && stopped == last_stopped && stop_used_fp == last_stop_used_fp {
        // Exactly the previous walk: keep it.
        state.spare = new;
        state.last.frames = last;
    } else {
        if !diverged {
            new.extend_from_slice(&last[..same]);
        }
        state.spare = last;
        state.last.frames = new;
        state.last.stopped = stopped;
        state.last.stop_used_fp = stop_used_fp;
        state.last.index();
    }
    Some(n)
}

/// Finds and caches the step at `lookup`.
#[cold]
#[inline(never)]
fn miss(state: &mut ThreadState, lookup: u64) -> u64 {
    let ctx = state.ctx.get_or_insert_with(|| Box::new(objects::Context::new()));
    let found = objects::find(lookup, ctx);
    if let Some(unloads) = found.unloads {
        let before = UNLOADS.swap(unloads, Ordering::Relaxed);
        if before != u64::MAX && before != unloads {
            // Objects were unloaded: rules cached for their addresses may be wrong now.
            state.generation = GENERATION.fetch_add(1, Ordering::Relaxed) + 1;
            state.cache.clear();
        }
    }
    let word = found.step.encode();
    state.cache.insert(lookup, word);
    word
}

#[cfg(test)]
mod tests {
    use super::rule::Rule;
    use super::*;

    fn state() -> ThreadState {
        ThreadState { cache: RuleCache::new(), generation: 0, ctx: None, last: Trace::new(), spare: Vec::new() }
    }

    /// A stack of words at a fixed place, and rules for made-up code addresses: the start
    /// (`P`) saves the frame pointer; `A` finds its CFA from the frame pointer; `B` and `C`
    /// end the stack.
    const P: u64 = 0x10_0000;
    const A: u64 = 0x20_0000;
    const B: u64 = 0x30_0000;
    const C: u64 = 0x40_0000;

    fn rules(state: &mut ThreadState) {
        let saves_fp = Rule::new(false, 16, -8, Some(-16)).unwrap();
        let from_fp = Rule::new(true, 16, -8, Some(-16)).unwrap();
        state.cache.insert(P, Step::Rule(saves_fp).encode());
        state.cache.insert(A, Step::Rule(from_fp).encode());
        state.cache.insert(B, Step::End.encode());
        state.cache.insert(C, Step::End.encode());
    }

    fn run(state: &mut ThreadState, stack: &[u64], out: &mut [usize]) -> Vec<usize> {
        let base = stack.as_ptr() as u64;
        let regs = Regs { pc: P, sp: base, fp: 0 };
        let bounds = (base as usize, base as usize + stack.len() * 8);
        let n = match replay(&mut state.last, regs, out) {
            Some((n, _)) => n,
            None => walk(state, regs, bounds, out).expect("no fallback"),
        };
        out[..n].to_vec()
    }

    #[test]
    fn a_remembered_walk_sees_a_changed_frame_pointer_slot() {
        let mut stack = vec![0u64; 16];
        let base = stack.as_ptr() as u64;
        // Frame 0: saved frame pointer, return address into A.
        stack[0] = base + 32;
        stack[1] = A + 1;
        // Frame 1 (CFA = fp + 16 = base + 48): saved frame pointer, return address into B.
        stack[4] = base + 64;
        stack[5] = B + 1;
        // Another frame 1, for when frame 0's saved frame pointer points at it.
        stack[8] = base + 96;
        stack[9] = C + 1;
        let mut st = state();
        rules(&mut st);
        let mut out = [0usize; 8];
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1, B as usize + 1]);
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1, B as usize + 1], "replayed");
        // The same return addresses everywhere but another saved frame pointer: the caller's
        // frame is elsewhere.
        stack[0] = base + 64;
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1, C as usize + 1]);
        stack[0] = base + 32;
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1, B as usize + 1]);
        // A changed return address.
        stack[5] = C + 1;
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1, C as usize + 1]);
        // A short output, then a longer one resumes after the remembered frames.
        stack[5] = B + 1;
        assert_eq!(run(&mut st, &stack, &mut out[..1]), [A as usize + 1]);
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1, B as usize + 1]);
    }

    /// Code built without frame pointers: the register is an ordinary one, and the slots it is
    /// saved to hold whatever the code had there. A walk that found no CFA from it replays
    /// whatever they hold; one that did is walked again where they changed. Either way the
    /// result is a fresh walk's.
    #[test]
    fn only_a_frame_pointer_that_was_used_must_be_the_same_to_replay() {
        const S: u64 = 0x50_0000; // saves the frame pointer, CFA from the stack pointer
        const T: u64 = 0x60_0000; // CFA from the stack pointer, saves nothing
        const U: u64 = 0x70_0000; // CFA from the frame pointer
        let mut stack = vec![0u64; 16];
        let base = stack.as_ptr() as u64;
        let bounds = (base as usize, base as usize + stack.len() * 8);
        let with_rules = || {
            let mut st = state();
            st.cache.insert(S, Step::Rule(Rule::new(false, 16, -8, Some(-16)).unwrap()).encode());
            st.cache.insert(T, Step::Rule(Rule::new(false, 16, -8, None).unwrap()).encode());
            st.cache.insert(U, Step::Rule(Rule::new(true, 16, -8, None).unwrap()).encode());
            st.cache.insert(B, Step::End.encode());
            st
        };
        let mut st = with_rules();
        let mut out = [0usize; 8];
        let fresh = |stack: &[u64], fp: u64| {
            let mut out = [0usize; 8];
            let regs = Regs { pc: S, sp: stack.as_ptr() as u64, fp };
            let n = walk(&mut with_rules(), regs, bounds, &mut out).expect("no fallback");
            out[..n].to_vec()
        };
        // Frame 0 (S): a saved register at `base`, the return address into T above it; frame 1
        // (T, CFA base + 32): the return address into B, the stack's end.
        stack[0] = 12_345;
        stack[1] = T + 1;
        stack[3] = B + 1;
        let regs = |fp: u64| Regs { pc: S, sp: base, fp };
        let n = walk(&mut st, regs(1), bounds, &mut out).unwrap();
        assert_eq!(out[..n], [T as usize + 1, B as usize + 1]);
        // Another value in the register and in the slot it was saved to: replayed, and the
        // same as a fresh walk.
        stack[0] = 999;
        let (n, _) = replay(&mut st.last, regs(2), &mut out).expect("replayed: the frame pointer was never used");
        assert_eq!(out[..n], fresh(&stack, 2)[..]);
        // Frame 1 finds its CFA from the frame pointer frame 0 restored: that slot must match.
        stack[1] = U + 1;
        stack[0] = base + 16;
        let n = walk(&mut st, regs(1), bounds, &mut out).unwrap();
        assert_eq!(out[..n], [U as usize + 1, B as usize + 1]);
        assert!(replay(&mut st.last, regs(2), &mut out).is_some(), "the starting register is still unused");
        stack[0] = base + 64;
        assert!(replay(&mut st.last, regs(1), &mut out).is_none(), "the restored frame pointer changed");
        let n = walk(&mut st, regs(1), bounds, &mut out).unwrap();
        assert_eq!(out[..n], fresh(&stack, 1)[..]);
        // Frame 0 itself finds its CFA from the frame pointer it starts with: that must match.
        st.cache.insert(S, Step::Rule(Rule::new(true, 16, -8, None).unwrap()).encode());
        st.last.clear();
        stack[1] = T + 1;
        let n = walk(&mut st, regs(base), bounds, &mut out).unwrap();
        assert_eq!(out[..n], [T as usize + 1, B as usize + 1]);
        assert!(replay(&mut st.last, regs(base), &mut out).is_some());
        assert!(replay(&mut st.last, regs(base + 8), &mut out).is_none(), "the starting frame pointer was used");
    }

    #[test]
    fn slots_outside_the_stack_end_the_walk() {
        let mut stack = vec![0u64; 4];
        let base = stack.as_ptr() as u64;
        // Frame 0's saved frame pointer points above the stack: A's CFA is outside.
        stack[0] = base + 4096;
        stack[1] = A + 1;
        let mut st = state();
        rules(&mut st);
        let mut out = [0usize; 8];
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1]);
        assert_eq!(run(&mut st, &stack, &mut out), [A as usize + 1]);
        stack[1] = 0;
        assert_eq!(run(&mut st, &stack, &mut out), Vec::<usize>::new(), "a zero return address ends it");
    }
}
