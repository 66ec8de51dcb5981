//! The slow path: which loaded object holds an address, and what its `.eh_frame` says there.
//!
//! `dl_iterate_phdr` lists the objects loaded now (the program, every shared library, those
//! `dlopen`ed since the last miss, as cudarc loads the driver) and holds the dynamic loader's
//! lock while its callback runs, so no object can be unloaded while the callback reads its
//! `.eh_frame_hdr` and `.eh_frame` in place. The object's `PT_GNU_EH_FRAME` segment is the
//! `.eh_frame_hdr`, with a table of the functions sorted by address; gimli finds the function's
//! entry there and runs its CFI program up to the address, giving the row this module turns
//! into a [`Step`].

use super::rule::{Rule, Step};
use gimli::{BaseAddresses, EhFrame, EhFrameHdr, NativeEndian, Pointer, RegisterRule, UnwindContext, UnwindSection};
use std::ffi::{c_int, c_void};

/// The CFI program's working state, kept per thread between misses.
pub(crate) type Context = UnwindContext<usize>;

/// What one search found.
pub(crate) struct Found {
    /// The step at the address.
    pub(crate) step: Step,
    /// How many objects have been unloaded since the process started (glibc's `dlpi_subs`;
    /// `None` where the C library does not say).
    pub(crate) unloads: Option<u64>,
}

struct Search<'a> {
    addr: u64,
    ctx: &'a mut Context,
    step: Option<Step>,
    unloads: Option<u64>,
}

/// The step at `addr`: `lookup` is the address whose row applies (a return address minus one,
/// so that a call that ends its function finds that function; the first frame's own address).
pub(crate) fn find(lookup: u64, ctx: &mut Context) -> Found {
    let mut search = Search { addr: lookup, ctx, step: None, unloads: None };
    // SAFETY: the callback has the signature `dl_iterate_phdr` expects and reads `data` only as
    // the `Search` passed here, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast()) };
    // An address in no loaded object: code generated at run time, which only frames
    // registered with the system unwinder describe.
    Found { step: search.step.unwrap_or(Step::Fallback), unloads: search.unloads }
}

/// `dl_iterate_phdr`'s callback: stops (returns 1) at the object that holds the address.
///
/// # Safety
///
/// `info` must point at a `dl_phdr_info` of `size` bytes describing a loaded object, valid
/// for the call, and `data` at the [`Search`] of this iteration, borrowed by nothing else: as
/// `dl_iterate_phdr` calls it from [`find`], holding the loader's lock.
unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Search` that `find` passed, borrowed by nothing else while the
    // iteration runs; `info` points at a valid `dl_phdr_info` of `size` bytes for the duration
    // of the call.
    let (search, info) = unsafe { (&mut *data.cast::<Search<'_>>(), &*info) };
    let has_counts = size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + std::mem::size_of::<u64>();
    if has_counts {
        search.unloads = Some(info.dlpi_subs);
    }
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers, mapped while the object is
    // loaded, which the loader's lock held during this callback guarantees.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr;
    let range = |h: &libc::Elf64_Phdr| {
        let start = base.wrapping_add(h.p_vaddr);
        (start, start.wrapping_add(h.p_memsz))
    };
    let holds = |h: &libc::Elf64_Phdr, a: u64| {
        let (lo, hi) = range(h);
        h.p_type == libc::PT_LOAD && lo <= a && a < hi
    };
    if !headers.iter().any(|h| holds(h, search.addr)) {
        return 0;
    }
    let step = headers
        .iter()
        .find(|h| h.p_type == libc::PT_GNU_EH_FRAME)
        .map(|hdr| {
            let (hdr_lo, hdr_hi) = range(hdr);
            let readable = |a: u64| headers.iter().find(|h| holds(h, a) && h.p_flags & libc::PF_R != 0);
            match readable(hdr_lo) {
                Some(seg) if hdr_hi <= range(seg).1 => {
                    // SAFETY: the header table lies inside a readable `PT_LOAD` segment of an
                    // object that stays loaded while this callback runs (the loader's lock).
                    let hdr = unsafe { section(hdr_lo, hdr_hi) };
                    step_at(
                        search.addr,
                        hdr_lo,
                        hdr,
                        |eh_frame| {
                            let seg = readable(eh_frame)?;
                            // SAFETY: as above: from `.eh_frame`'s start to the end of its segment
                            // (the section's length is not recorded; its entries end within it).
                            Some(unsafe { section(eh_frame, range(seg).1) })
                        },
                        search.ctx,
                    )
                }
                _ => Step::Fallback,
            }
        })
        // No `.eh_frame_hdr`: the system unwinder would search `.eh_frame` linearly; let it.
        .unwrap_or(Step::Fallback);
    search.step = Some(step);
    1
}

/// The bytes `[lo, hi)` of a loaded object.
///
/// # Safety
///
/// The range must be mapped and readable, and stay so while the slice lives.
unsafe fn section<'a>(lo: u64, hi: u64) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(lo as usize as *const u8, hi.saturating_sub(lo) as usize) }
}

/// The step at `addr` from an object's `.eh_frame_hdr` (at address `hdr_addr`); `eh_frame`
/// gives the `.eh_frame` section that starts at an address.
fn step_at<'a>(
    addr: u64,
    hdr_addr: u64,
    hdr: &'a [u8],
    eh_frame: impl FnOnce(u64) -> Option<&'a [u8]>,
    ctx: &mut Context,
) -> Step {
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_addr);
    let Ok(parsed) = EhFrameHdr::new(hdr, NativeEndian).parse(&bases, 8) else { return Step::Fallback };
    let Pointer::Direct(frame_addr) = parsed.eh_frame_ptr() else { return Step::Fallback };
    let Some(frame) = eh_frame(frame_addr) else { return Step::Fallback };
    let Some(table) = parsed.table() else { return Step::Fallback };
    let bases = bases.set_eh_frame(frame_addr);
    let frame = EhFrame::new(frame, NativeEndian);
    let fde = match table.fde_for_address(&frame, &bases, addr, EhFrame::cie_from_offset) {
        Ok(fde) => fde,
        // No function covers the address: the system unwinder ends the stack here.
        Err(gimli::Error::NoUnwindInfoForAddress) => return Step::End,
        Err(_) => return Step::Fallback,
    };
    if fde.cie().is_signal_trampoline() {
        return Step::Fallback;
    }
    let ra_register = fde.cie().return_address_register();
    let Ok(row) = fde.unwind_info_for_address(&frame, &bases, ctx, addr) else { return Step::Fallback };
    let gimli::CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else { return Step::Fallback };
    let cfa_from_fp = match register {
        gimli::X86_64::RSP => false,
        gimli::X86_64::RBP => true,
        _ => return Step::Fallback,
    };
    let ra_at = match row.register(ra_register) {
        Some(RegisterRule::Undefined) => return Step::End,
        Some(RegisterRule::Offset(at)) => at,
        _ => return Step::Fallback,
    };
    let fp_at = match row.register(gimli::X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => None,
        Some(RegisterRule::Offset(at)) => Some(at),
        _ => return Step::Fallback,
    };
    Rule::new(cfa_from_fp, offset, ra_at, fp_at).map_or(Step::Fallback, Step::Rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn here() -> u64 {
        here as *const () as usize as u64 + 1
    }

    #[test]
    fn a_function_of_this_program_has_a_rule() {
        let mut ctx = Context::new();
        let found = find(here(), &mut ctx);
        assert!(matches!(found.step, Step::Rule(_)), "{:?}", found.step);
        assert!(found.unloads.is_some(), "glibc reports unloads");
    }

    #[test]
    fn a_function_of_the_c_library_has_a_rule() {
        let mut ctx = Context::new();
        let addr = libc::getpid as *const () as usize as u64 + 1;
        assert!(matches!(find(addr, &mut ctx).step, Step::Rule(_)));
    }

    #[test]
    fn an_address_in_no_object_falls_back() {
        let mut ctx = Context::new();
        let heap = Box::new(0u64);
        assert_eq!(find(&*heap as *const u64 as u64, &mut ctx).step, Step::Fallback);
        assert_eq!(find(8, &mut ctx).step, Step::Fallback);
    }
}
