//! Stack capture: one `#[inline(never)]` capture site, raw instruction pointers only.
//!
//! The fast mode ([`StackMode::Fast`]) uses the best unwinder this platform has
//! ([`fast_unwinder`]): on x86-64 Linux the caching DWARF unwinder of `super::unwind`, exact
//! in any build; elsewhere a frame-pointer walk, validated against the thread's stack bounds
//! and used only where it was checked once per process against the `backtrace` crate's
//! unwinder, else that unwinder. The full mode always uses the `backtrace` crate's unwinder.

use super::hash::hash_stack;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// How allocations capture their stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StackMode {
    /// No stacks.
    Off,
    /// The fastest exact unwinder of the platform ([`fast_unwinder`] says which): cached
    /// unwind tables on x86-64 Linux, frame pointers or the `backtrace` crate elsewhere.
    #[default]
    Fast,
    /// The `backtrace` crate's unwinder: complete everywhere, microseconds per stack.
    Full,
}

/// Which unwinder took a recording's stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unwinder {
    /// No stacks were taken.
    None,
    /// The unwind tables (`.eh_frame`) of the loaded objects, with the rule for each return
    /// address cached per thread: exact without frame pointers, through C and C++ libraries
    /// (x86-64 Linux).
    CachedTables,
    /// The frame-pointer chain (where the platform has no cached unwinder and this build
    /// keeps frame pointers).
    FramePointers,
    /// The `backtrace` crate's unwinder.
    Backtrace,
}

/// The unwinder [`StackMode::Fast`] uses in this process: [`Unwinder::CachedTables`] on
/// x86-64 Linux; elsewhere [`Unwinder::FramePointers`] where the walk agreed with the
/// `backtrace` crate's unwinder when checked once, else [`Unwinder::Backtrace`].
///
/// ```
/// println!("fast stacks: {:?}", vramscope::record::fast_unwinder());
/// ```
pub fn fast_unwinder() -> Unwinder {
    if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        Unwinder::CachedTables
    } else if frame_pointers_work() {
        Unwinder::FramePointers
    } else {
        Unwinder::Backtrace
    }
}

/// Captures in the fast mode that met a frame the cached unwinder does not model (a signal
/// handler's frame, code generated at run time) and were taken by the `backtrace` crate's
/// unwinder instead, in this process so far.
pub fn fast_fallbacks() -> u64 {
    FALLBACKS.load(Ordering::Relaxed)
}

static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Captures the calling thread's stack as return addresses, innermost first, as an allocation
/// recording with `mode` does, into `out` (at most `out.len()` frames); returns how many.
/// The first frames are vramscope's own.
///
/// ```
/// use vramscope::record::{capture_stack, StackMode};
/// let mut frames = [0usize; 64];
/// let n = capture_stack(StackMode::Fast, &mut frames);
/// assert!(n > 0);
/// ```
#[inline(never)]
pub fn capture_stack(mode: StackMode, out: &mut [usize]) -> usize {
    capture(mode, out).len
}

thread_local! {
    /// The current thread's stack bounds `[lo, hi)`, or `(0, 0)` where unknown.
    static BOUNDS: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

#[cfg(target_os = "linux")]
fn query_bounds() -> (usize, usize) {
    // SAFETY: `attr` is initialized by `pthread_getattr_np` before it is read, and destroyed
    // once; the out-pointers point at locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok {
            (addr as usize, addr as usize + size)
        } else {
            (0, 0)
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn query_bounds() -> (usize, usize) {
    (0, 0)
}

fn stack_bounds() -> (usize, usize) {
    BOUNDS.with(|b| match b.get() {
        Some(v) => v,
        None => {
            let v = query_bounds();
            b.set(Some(v));
            v
        }
    })
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn frame_pointer() -> usize {
    let fp: usize;
    // SAFETY: reads a register; no memory access.
    unsafe { std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    fp
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn frame_pointer() -> usize {
    let fp: usize;
    // SAFETY: reads a register; no memory access.
    unsafe { std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    fp
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn frame_pointer() -> usize {
    0
}

/// Walks the frame-pointer chain from `fp`, pushing return addresses; returns how many.
/// Every frame must lie inside `[low, hi)` (the live part of this thread's stack), be
/// word-aligned and above the previous one; the walk stops at the first frame that is not.
#[inline(always)]
fn walk(mut fp: usize, low: usize, hi: usize, out: &mut [usize]) -> usize {
    const WORD: usize = std::mem::size_of::<usize>();
    let low = low.max(WORD);
    let mut n = 0;
    // A frame record at `fp` is readable when `low <= fp <= hi - 2 words`.
    let Some(span) = hi.checked_sub(2 * WORD).and_then(|last| last.checked_sub(low)) else {
        return 0;
    };
    while n < out.len() {
        if fp.wrapping_sub(low) > span || !fp.is_multiple_of(WORD) {
            break;
        }
        // SAFETY: `[fp, fp + 2 words)` lies between the current stack pointer and the top of
        // this thread's stack (checked above), memory that is mapped and readable while this
        // function runs. Frame records are two words: the caller's frame pointer, then the
        // return address.
        let (next, ret) = unsafe { (*(fp as *const usize), *((fp + WORD) as *const usize)) };
        if ret == 0 {
            break;
        }
        out[n] = ret;
        n += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// A captured stack: how many frames, their [`hash_stack`], and where the cached unwinder took
/// it, its trace version (two captures of one thread with the same version and length hold
/// the same frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Captured {
    pub(crate) len: usize,
    pub(crate) hash: u64,
    pub(crate) version: Option<u64>,
}

impl Captured {
    fn hashed(out: &[usize]) -> Captured {
        Captured { len: out.len(), hash: hash_stack(out), version: None }
    }
}

/// Captures the calling thread's stack into `out` (at most `out.len()` frames). The first
/// frames are vramscope's own; reports trim them.
#[inline(never)]
pub(crate) fn capture(mode: StackMode, out: &mut [usize]) -> Captured {
    let n = match mode {
        StackMode::Off => return Captured { len: 0, hash: 0, version: None },
        StackMode::Fast => return fast(out),
        StackMode::Full => unwind(out),
    };
    Captured::hashed(&out[..n])
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn fast(out: &mut [usize]) -> Captured {
    match super::unwind::capture(out, stack_bounds()) {
        Some(c) => Captured { len: c.len, hash: c.hash, version: Some(c.version) },
        None => {
            FALLBACKS.fetch_add(1, Ordering::Relaxed);
            let n = unwind(out);
            Captured::hashed(&out[..n])
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline(always)]
fn fast(out: &mut [usize]) -> Captured {
    if frame_pointers_work() {
        let here = 0u8;
        let low = std::ptr::addr_of!(here) as usize;
        let (lo, hi) = stack_bounds();
        if hi != 0 {
            let n = walk(frame_pointer(), low.max(lo), hi, out);
            if n > 0 {
                return Captured::hashed(&out[..n]);
            }
        }
    }
    FALLBACKS.fetch_add(1, Ordering::Relaxed);
    let n = unwind(out);
    Captured::hashed(&out[..n])
}

fn unwind(out: &mut [usize]) -> usize {
    let mut n = 0;
    // SAFETY: `trace_unsynchronized` requires that no other thread unwinds at the same time on
    // platforms whose unwinder is not thread-safe; on the targets where vramscope walks stacks
    // (Linux with libgcc/libunwind) `_Unwind_Backtrace` is thread-safe. Elsewhere the
    // synchronized `trace` is used.
    #[cfg(target_os = "linux")]
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            if n < out.len() {
                out[n] = f.ip() as usize;
                n += 1;
            }
            n < out.len()
        })
    };
    #[cfg(not(target_os = "linux"))]
    backtrace::trace(|f| {
        if n < out.len() {
            out[n] = f.ip() as usize;
            n += 1;
        }
        n < out.len()
    });
    n
}

/// Whether the frame-pointer walk agrees with the unwinder here (checked once per process):
/// true when this code and its callers were built with frame pointers.
///
/// ```
/// println!("fast stacks walk frame pointers: {}", vramscope::record::frame_pointers_available());
/// ```
pub fn frame_pointers_available() -> bool {
    frame_pointers_work()
}

fn frame_pointers_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    // On a thread of its own with a known stack: the calibration unwinds, which takes tens of
    // kilobytes of stack in debug builds, and the first capture of a process may come from a
    // thread with a small stack, deep in recursion (found by `tests/record.rs` under the
    // `cuda` feature in the dev profile: a 128 KiB thread overflowed here).
    *WORKS.get_or_init(|| {
        std::thread::Builder::new()
            .name("vramscope-calibrate".into())
            .stack_size(1 << 20)
            .spawn(calibrate)
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false)
    })
}

#[inline(never)]
fn calibrate() -> bool {
    calibrate_inner(std::hint::black_box(3))
}

/// Compares a frame-pointer walk with an unwind from the same point: the walk's return
/// addresses must be the unwinder's caller frames, in order.
#[inline(never)]
fn calibrate_inner(n: usize) -> bool {
    if n > 0 {
        let r = calibrate_inner(std::hint::black_box(n - 1));
        return std::hint::black_box(r);
    }
    let (lo, hi) = stack_bounds();
    if hi == 0 {
        return false;
    }
    let here = 0u8;
    let low = (std::ptr::addr_of!(here) as usize).max(lo);
    let mut fp = [0usize; 6];
    let n = walk(frame_pointer(), low, hi, &mut fp);
    let fp = &fp[..n];
    let mut uw = [0usize; 16];
    let m = unwind(&mut uw);
    let uw = &uw[..m];
    // The unwinder reports call-site addresses that may differ from return addresses by the
    // size of the call instruction; compare with a small tolerance.
    let close = |a: usize, b: usize| a.abs_diff(b) <= 16;
    fp.len() >= 4 && fp.iter().take(4).all(|&r| uw.iter().any(|&u| close(u, r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_something_in_every_mode() {
        let mut out = [0usize; 32];
        assert_eq!(capture(StackMode::Off, &mut out).len, 0);
        let c = capture(StackMode::Full, &mut out);
        assert!(c.len > 2, "{:?}", &out[..c.len]);
        assert_eq!(c.hash, hash_stack(&out[..c.len]));
        assert_eq!(c.version, None);
        for _ in 0..3 {
            // The first, then a replay of the same walk: the same version.
            let c = capture(StackMode::Fast, &mut out);
            assert!(c.len > 0);
            assert_eq!(c.hash, hash_stack(&out[..c.len]));
        }
        assert!(capture(StackMode::Fast, &mut out[..2]).len <= 2);
        assert!(capture(StackMode::Full, &mut out[..2]).len <= 2);
    }

    #[test]
    fn walk_stops_at_bad_frames() {
        let mut out = [0usize; 8];
        // Misaligned, below the bound, above the bound, null: nothing is read.
        assert_eq!(walk(0x1001, 0x1000, 0x2000, &mut out), 0);
        assert_eq!(walk(0x800, 0x1000, 0x2000, &mut out), 0);
        assert_eq!(walk(0x1ff8, 0x1000, 0x2000, &mut out), 0);
        assert_eq!(walk(0, 0, usize::MAX, &mut out), 0);
        // A fake chain: two frames, then a frame pointer that goes back down.
        let mut chain = [0usize; 6];
        let base = chain.as_ptr() as usize;
        chain[0] = base + 16;
        chain[1] = 0xaaaa;
        chain[2] = base;
        chain[3] = 0xbbbb;
        let n = walk(std::hint::black_box(&chain).as_ptr() as usize, base, base + 48, &mut out);
        assert_eq!(&out[..n], [0xaaaa, 0xbbbb]);
    }

    #[test]
    fn deep_and_odd_stacks_never_crash() {
        fn recurse(n: usize, out: &mut [usize; 64]) -> usize {
            if n == 0 {
                return capture(StackMode::Fast, out).len;
            }
            let pad = [n as u8; 64];
            std::hint::black_box(&pad);
            recurse(n - 1, out) + std::hint::black_box(0)
        }
        let handle = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let mut out = [0usize; 64];
                recurse(500, &mut out)
            })
            .unwrap();
        assert!(handle.join().unwrap() > 0);
    }
}
