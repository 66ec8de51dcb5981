//! Byte sizes as people write them. One parser serves `VRAMSCOPE_CAPACITY`, the command line's
//! `--capacity` and `#[gpu_mem_test(tolerance = "...")]`, which evaluates it at compile time
//! (it is a `const fn`), so that every place accepts the same text.

/// Why a text is not a byte size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ByteSizeError {
    /// Nothing but spaces.
    Empty,
    /// No number where the text starts (after spaces), or a number with no digit.
    NotANumber,
    /// A unit other than those [`parse_byte_size`] lists.
    UnknownUnit,
    /// Above `u64::MAX` bytes, or more than 18 digits after the point.
    OutOfRange,
}

impl ByteSizeError {
    /// What was wrong, and what is accepted.
    pub const fn message(self) -> &'static str {
        match self {
            ByteSizeError::Empty => "no byte size given (e.g. `64 KiB`)",
            ByteSizeError::NotANumber => "not a byte size: a number comes first (e.g. `8GiB`, `1.5 MiB`, `4096`)",
            ByteSizeError::UnknownUnit => "unknown unit; accepted: B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB",
            ByteSizeError::OutOfRange => "out of range: at most 2^64 - 1 bytes, and 18 digits after the point",
        }
    }
}

impl std::fmt::Display for ByteSizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ByteSizeError {}

/// Units, lower case, with their bytes. `K`, `M`, `G`, `T` alone are decimal, as `KB`.
const UNITS: [(&str, u64); 14] = [
    ("", 1),
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("kib", 1 << 10),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("mib", 1 << 20),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("gib", 1 << 30),
    ("t", 1_000_000_000_000),
    ("tb", 1_000_000_000_000),
    ("tib", 1 << 40),
];

const fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t' || b == b'\n' || b == b'\r'
}

/// Whether `text[start..end]` equals `unit` ignoring ASCII case.
const fn unit_is(text: &[u8], start: usize, end: usize, unit: &str) -> bool {
    let u = unit.as_bytes();
    if end - start != u.len() {
        return false;
    }
    let mut i = 0;
    while i < u.len() {
        if text[start + i].to_ascii_lowercase() != u[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Parses a byte size: a number, optionally with a fraction, then optionally a unit, with
/// spaces allowed around and between: `4096`, `512 KiB`, `8GiB`, `2 GB`, `1.5MiB`. Units
/// are case-insensitive: B, K/KB (1,000), KiB (1,024), M/MB, MiB, G/GB, GiB, T/TB, TiB. The
/// result is exact (no floating point), rounded down to whole bytes.
///
/// ```
/// use vramscope::config::{parse_byte_size, ByteSizeError};
/// assert_eq!(parse_byte_size("1.5MiB"), Ok(1_572_864));
/// assert_eq!(parse_byte_size(" 2 GB "), Ok(2_000_000_000));
/// assert_eq!(parse_byte_size("5 parsecs"), Err(ByteSizeError::UnknownUnit));
/// const TOLERANCE: u64 = match parse_byte_size("64 KiB") { Ok(b) => b, Err(_) => 0 };
/// assert_eq!(TOLERANCE, 65_536);
/// ```
pub const fn parse_byte_size(text: &str) -> Result<u64, ByteSizeError> {
    let t = text.as_bytes();
    let (mut start, mut end) = (0, t.len());
    while start < end && is_space(t[start]) {
        start += 1;
    }
    while end > start && is_space(t[end - 1]) {
        end -= 1;
    }
    if start == end {
        return Err(ByteSizeError::Empty);
    }
    // The number: whole part and fraction as one integer, with the fraction's digits counted.
    let (mut value, mut scale, mut digits, mut point) = (0u128, 0u32, 0u32, false);
    let mut i = start;
    while i < end {
        let b = t[i];
        if b == b'.' && !point {
            point = true;
        } else if b.is_ascii_digit() {
            if point {
                scale += 1;
                if scale > 18 {
                    return Err(ByteSizeError::OutOfRange);
                }
            }
            value = match value.checked_mul(10) {
                Some(v) => v + (b - b'0') as u128,
                None => return Err(ByteSizeError::OutOfRange),
            };
            digits += 1;
        } else {
            break;
        }
        i += 1;
    }
    if digits == 0 {
        return Err(ByteSizeError::NotANumber);
    }
    while i < end && is_space(t[i]) {
        i += 1;
    }
    let mut k = 0;
    let mut mult = 0;
    while k < UNITS.len() {
        if unit_is(t, i, end, UNITS[k].0) {
            mult = UNITS[k].1;
            break;
        }
        k += 1;
    }
    if mult == 0 {
        return Err(ByteSizeError::UnknownUnit);
    }
    let bytes = match value.checked_mul(mult as u128) {
        Some(b) => b / 10u128.pow(scale),
        None => return Err(ByteSizeError::OutOfRange),
    };
    if bytes > u64::MAX as u128 {
        return Err(ByteSizeError::OutOfRange);
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_exactly() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("0 B", 0),
            ("512 KiB", 512 << 10),
            ("8GiB", 8 << 30),
            (" 2 GB ", 2_000_000_000),
            ("1.5MiB", 3 << 19),
            ("1.5 mib", 3 << 19),
            ("2k", 2_000),
            ("0.1 KB", 100),
            ("1.0000001 KiB", 1024),
            ("16 TiB", 16 << 40),
            ("18446744073709551615", u64::MAX),
            ("18446744073709551615 B", u64::MAX),
            (".5 KiB", 512),
            ("3.", 3),
        ] {
            assert_eq!(parse_byte_size(text), Ok(bytes), "{text:?}");
        }
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        for (text, err) in [
            ("", ByteSizeError::Empty),
            ("   ", ByteSizeError::Empty),
            ("lots", ByteSizeError::NotANumber),
            ("-5", ByteSizeError::NotANumber),
            (".", ByteSizeError::NotANumber),
            ("KiB", ByteSizeError::NotANumber),
            ("5 parsecs", ByteSizeError::UnknownUnit),
            ("1.2.3", ByteSizeError::UnknownUnit),
            ("1e30TiB", ByteSizeError::UnknownUnit),
            ("18446744073709551616", ByteSizeError::OutOfRange),
            ("16777216 TiB", ByteSizeError::OutOfRange),
            ("999999999999999999999999999999999999999999", ByteSizeError::OutOfRange),
            ("1.0000000000000000001", ByteSizeError::OutOfRange),
        ] {
            assert_eq!(parse_byte_size(text), Err(err), "{text:?}");
        }
    }

    proptest::proptest! {
        /// Any whole number of bytes with any unit reads back as that many bytes times the unit.
        #[test]
        fn whole_numbers_with_units(n in 0u64..1_000_000, unit in 0usize..UNITS.len(), spaced: bool) {
            let (name, mult) = UNITS[unit];
            let text = format!("{n}{}{}", if spaced { " " } else { "" }, name.to_uppercase());
            proptest::prop_assert_eq!(parse_byte_size(&text), Ok(n * mult));
        }
    }
}
