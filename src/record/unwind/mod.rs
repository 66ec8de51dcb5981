//! A caching DWARF unwinder for x86-64 Linux: the stack of every allocation in any build.
//!
//! Every function that Rust, C and C++ compilers emit has call frame information in its
//! object's `.eh_frame` (panics and C++ exceptions unwind with it), frame pointers or not.
//! Reading it takes microseconds per frame (the `backtrace` crate's unwinder pays that on every
//! call); what it says at an address never changes while the object is loaded. So the first
//! time a thread meets a return address, [`objects::find`] reads the rule there and this
//! module caches it, packed in one word ([`rule::Step`]), in a per-thread table
//! ([`cache::RuleCache`]); afterwards the frame costs one table lookup and one or two reads of
//! the stack, with no lock, no system call and no atomic operation shared between threads.
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
}

thread_local! {
    static STATE: RefCell<ThreadState> =
        const { RefCell::new(ThreadState { cache: RuleCache::new(), generation: 0, ctx: None }) };
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
pub(crate) fn capture(out: &mut [usize], stack: (usize, usize)) -> Option<usize> {
    let regs = registers();
    STATE
        .try_with(|state| {
            // Re-entered (a capture from inside a capture's slow path): let the other unwinder work.
            let mut state = state.try_borrow_mut().ok()?;
            let generation = GENERATION.load(Ordering::Relaxed);
            if state.generation != generation {
                state.cache.clear();
                state.generation = generation;
            }
            walk(&mut state, regs, stack, out)
        })
        .ok()
        .flatten()
}

/// The unwind proper.
#[inline(always)]
fn walk(state: &mut ThreadState, mut regs: Regs, (lo, hi): (usize, usize), out: &mut [usize]) -> Option<usize> {
    const WORD: u64 = 8;
    let (lo, hi) = ((lo as u64).max(regs.sp), hi as u64);
    if !(lo <= regs.sp && regs.sp < hi) {
        return None;
    }
    // The first frame's row is the one at its own address; a caller's is the one at the call
    // instruction, just before the return address.
    let mut lookup = regs.pc;
    let mut n = 0;
    while n < out.len() {
        let word = match state.cache.get(lookup) {
            Some(w) => w,
            None => miss(state, lookup),
        };
        let rule = match Step::decode(word) {
            Step::Rule(r) => r,
            Step::End => break,
            Step::Fallback => return None,
        };
        let base = if rule.cfa_from_fp { regs.fp } else { regs.sp };
        let cfa = base.wrapping_add(u64::from(rule.cfa_offset));
        let ra_at = cfa.wrapping_sub(u64::from(rule.ra_below));
        // Every slot read lies on this thread's stack, above the current frame.
        let readable = |at: u64| at >= lo && at <= hi - WORD && at.is_multiple_of(WORD);
        if !readable(ra_at) || cfa <= regs.sp {
            break;
        }
        // SAFETY: `ra_at` is an aligned word of this thread's stack between the live stack
        // pointer and the stack's top, mapped and readable while this function runs.
        let ra = unsafe { *(ra_at as *const u64) };
        if let Some(below) = rule.fp_below {
            let fp_at = cfa.wrapping_sub(u64::from(below));
            if !readable(fp_at) {
                break;
            }
            // SAFETY: as above.
            regs.fp = unsafe { *(fp_at as *const u64) };
        }
        if ra == 0 {
            break;
        }
        out[n] = ra as usize;
        n += 1;
        regs.sp = cfa;
        lookup = ra - 1;
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

/// Return addresses this thread has cached rules for (for tests and benchmarks).
#[cfg(test)]
pub(crate) fn cached_addresses() -> usize {
    STATE.with(|s| s.borrow().cache.len())
}
