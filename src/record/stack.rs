//! Stack capture: one `#[inline(never)]` capture site, raw instruction pointers only.
//!
//! The fast mode walks frame pointers, validating every step against the current thread's
//! stack bounds and alignment and stopping at the first bad frame; it is complete when the
//! program is built with `-C force-frame-pointers=yes`. Where frame pointers are missing (the
//! walk was checked once per process against the unwinder and did not agree), the fast mode
//! falls back to the `backtrace` crate's unwinder, which the full mode always uses.

use std::cell::Cell;
use std::sync::OnceLock;

/// How allocations capture their stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StackMode {
    /// No stacks.
    Off,
    /// Frame-pointer walk (falls back to the unwinder where frame pointers are missing).
    #[default]
    Fast,
    /// The `backtrace` crate's unwinder: complete without frame pointers, slower.
    Full,
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

/// Walks the frame-pointer chain from `fp`, pushing return addresses. Every frame must lie
/// inside `[low, hi)` (the live part of this thread's stack), be 8-byte aligned and above the
/// previous one; the walk stops at the first frame that is not.
#[inline(always)]
fn walk(mut fp: usize, low: usize, hi: usize, depth: usize, out: &mut Vec<usize>) {
    let word = std::mem::size_of::<usize>();
    while out.len() < depth {
        if fp == 0 || fp < low || fp.checked_add(2 * word).is_none_or(|end| end > hi) || !fp.is_multiple_of(word) {
            break;
        }
        // SAFETY: `[fp, fp + 2 words)` lies between the current stack pointer and the top of
        // this thread's stack (checked above), memory that is mapped and readable while this
        // function runs. Frame records are two words: the caller's frame pointer, then the
        // return address.
        let (next, ret) = unsafe { (*(fp as *const usize), *((fp + word) as *const usize)) };
        if ret == 0 {
            break;
        }
        out.push(ret);
        if next <= fp {
            break;
        }
        fp = next;
    }
}

/// Captures the calling thread's stack into `out` (cleared first), at most `depth` frames.
/// The first frame is the caller of this function's caller's caller... in practice: frames
/// of vramscope itself come first and are trimmed when reports are made.
#[inline(never)]
pub(crate) fn capture(mode: StackMode, depth: usize, out: &mut Vec<usize>) {
    out.clear();
    match mode {
        StackMode::Off => {}
        StackMode::Fast if frame_pointers_work() => {
            let here = 0u8;
            let low = std::ptr::addr_of!(here) as usize;
            let (lo, hi) = stack_bounds();
            if hi != 0 {
                walk(frame_pointer(), low.max(lo), hi, depth, out);
            }
            if out.is_empty() {
                unwind(depth, out);
            }
        }
        StackMode::Fast | StackMode::Full => unwind(depth, out),
    }
}

fn unwind(depth: usize, out: &mut Vec<usize>) {
    // SAFETY: `trace_unsynchronized` requires that no other thread unwinds at the same time on
    // platforms whose unwinder is not thread-safe; on the targets where vramscope walks stacks
    // (Linux with libgcc/libunwind) `_Unwind_Backtrace` is thread-safe. Elsewhere the
    // synchronized `trace` is used.
    #[cfg(target_os = "linux")]
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            out.push(f.ip() as usize);
            out.len() < depth
        })
    };
    #[cfg(not(target_os = "linux"))]
    backtrace::trace(|f| {
        out.push(f.ip() as usize);
        out.len() < depth
    });
}

/// Whether the frame-pointer walk agrees with the unwinder here (checked once per process):
/// true when this code and its callers were built with frame pointers.
///
/// ```
/// println!("fast stacks walk frame pointers: {}", vramscope::frame_pointers_available());
/// ```
pub fn frame_pointers_available() -> bool {
    frame_pointers_work()
}

fn frame_pointers_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(calibrate)
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
    let mut fp = Vec::new();
    walk(frame_pointer(), low, hi, 6, &mut fp);
    let mut uw = Vec::new();
    unwind(16, &mut uw);
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
        let mut out = Vec::new();
        capture(StackMode::Off, 32, &mut out);
        assert!(out.is_empty());
        capture(StackMode::Full, 32, &mut out);
        assert!(out.len() > 2, "{out:?}");
        capture(StackMode::Fast, 32, &mut out);
        assert!(!out.is_empty());
        capture(StackMode::Fast, 2, &mut out);
        assert!(out.len() <= 2);
    }

    #[test]
    fn walk_stops_at_bad_frames() {
        let mut out = Vec::new();
        // Misaligned, below the bound, above the bound: nothing is read.
        walk(0x1001, 0x1000, 0x2000, 8, &mut out);
        walk(0x800, 0x1000, 0x2000, 8, &mut out);
        walk(0x1ff8, 0x1000, 0x2000, 8, &mut out);
        walk(0, 0, usize::MAX, 8, &mut out);
        assert!(out.is_empty());
        // A fake chain: two frames, then a frame pointer that goes back down.
        let mut chain = [0usize; 6];
        let base = chain.as_ptr() as usize;
        chain[0] = base + 16;
        chain[1] = 0xaaaa;
        chain[2] = base;
        chain[3] = 0xbbbb;
        walk(std::hint::black_box(&chain).as_ptr() as usize, base, base + 48, 8, &mut out);
        assert_eq!(out, vec![0xaaaa, 0xbbbb]);
    }

    #[test]
    fn deep_and_odd_stacks_never_crash() {
        fn recurse(n: usize, out: &mut Vec<usize>) -> usize {
            if n == 0 {
                capture(StackMode::Fast, 64, out);
                return out.len();
            }
            let pad = [n as u8; 64];
            std::hint::black_box(&pad);
            recurse(n - 1, out) + std::hint::black_box(0)
        }
        let handle = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let mut out = Vec::new();
                recurse(500, &mut out)
            })
            .unwrap();
        assert!(handle.join().unwrap() > 0);
    }
}
