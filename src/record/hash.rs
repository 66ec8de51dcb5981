//! The hashes stacks and sites are filed under: a leaf of `record`, used by the stack capture,
//! the unwinder's cache and the tables alike.

/// One step of a serial hash of words (the site table's; see [`hash_stack`] for stacks).
#[inline(always)]
pub(crate) fn mix(h: u64, ip: usize) -> u64 {
    (h.rotate_left(5) ^ ip as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// The hash the stack table files a stack under. Each frame is multiplied on its own and the
/// products summed (with the frame's position folded in), so the multiplications of a long
/// stack run side by side instead of one after another.
#[inline]
pub(crate) fn hash_stack(ips: &[usize]) -> u64 {
    let sum = ips.iter().enumerate().fold(ips.len() as u64, |h, (i, &ip)| {
        h.wrapping_add((ip as u64 ^ (i as u64).rotate_right(12)).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    });
    (sum ^ (sum >> 31)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}
