//! Allocator configuration: a struct with documented defaults, and the `VRAMSCOPE_ALLOC_CONF`
//! string form with PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys where they apply.

use crate::error::{Error, Result};

/// The environment variable [`AllocatorConfig::from_env`] reads.
pub const ALLOC_CONF_ENV: &str = "VRAMSCOPE_ALLOC_CONF";

/// Keys accepted in a configuration string, for error messages.
const KEYS: &str = "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
                    garbage_collection_threshold, per_process_memory_fraction, fragmentation_limit, \
                    fragmentation_limit_max, release_pages, expandable_segments, share_idle_streams, \
                    alias_pages, backend";

/// Keys of `PYTORCH_CUDA_ALLOC_CONF` that vramscope does not implement. A configuration
/// naming one is refused, as an unknown key is: a setting vramscope would silently ignore
/// would make the configuration say what the allocator does not do.
const PYTORCH_ONLY_KEYS: [&str; 9] = [
    "throw_on_cudamalloc_oom",
    "pinned_free_catch_all",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "expandable_segments_handle_type",
    "graph_capture_record_stream_reuse",
];

/// Size intervals of [`AllocatorConfig::roundup_power2_divisions`]: 1 MiB to 64 GiB, as
/// PyTorch's.
pub const ROUNDUP_INTERVALS: usize = 16;

/// The most [`AllocatorConfig::fragmentation_limit`] and `fragmentation_limit_max` take (a
/// limit above it is no limit: say `off`).
pub const MAX_FRAGMENTATION_LIMIT: f64 = 16.0;

/// How a [`CachingAllocator`](crate::CachingAllocator) sizes, splits and reclaims memory.
///
/// Start from [`Default`] and set fields, or parse PyTorch's string form:
///
/// ```
/// use vramscope::config::AllocatorConfig;
/// let mut c = AllocatorConfig::default();
/// c.fragmentation_limit = None; // cache like PyTorch
///
/// let c = AllocatorConfig::parse("max_split_size_mb:256,garbage_collection_threshold:0.8").unwrap();
/// assert_eq!(c.max_split_size, Some(256 << 20));
/// let e = AllocatorConfig::parse("max_split_size_mb:lots").unwrap_err();
/// assert!(e.to_string().contains("max_split_size_mb"));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AllocatorConfig {
    /// PyTorch's `max_split_size_mb`: requests smaller than this take no free block of at least
    /// this size, and larger ones take none 20 MiB or more larger than themselves (which they
    /// then keep whole), so that large blocks stay whole for requests of about their size.
    /// Two exceptions, where holding to the rules made the allocator reserve many times what
    /// it used (up to 158 times on an H200, `BENCHMARKS.md`): they do not apply in a segment
    /// that grows in place (whose free end is split as PyTorch's expandable segments split
    /// it), and over [`fragmentation_limit`](Self::fragmentation_limit) they give way to the
    /// best fit instead of reserving more. Default: `None`, no such rules.
    pub max_split_size: Option<u64>,
    /// How much larger than a request of at least [`max_split_size`](Self::max_split_size) a
    /// free block it takes whole may be (PyTorch's `max_non_split_rounding_mb`): larger values
    /// reuse large cached blocks for smaller large requests, at the cost of the difference.
    /// Only with `max_split_size`, as in PyTorch. Default: `None`, 20 MiB.
    pub max_non_split_rounding: Option<u64>,
    /// Round request sizes up to one of this many divisions between powers of two, per size
    /// interval as PyTorch keeps them (`roundup_power2_divisions`): entry `i` applies to requests
    /// of `2^i` MiB up to `2^(i+1)` MiB, entry 0 also to smaller ones and entry 15 to larger
    /// ones (32 GiB on); `0` or `1` rounds to 512 bytes only. The string form takes one number
    /// for every size (`roundup_power2_divisions:4`) or PyTorch's list, read as PyTorch reads
    /// it (`roundup_power2_divisions:[256:1,512:2,>:8]`): each `MiB:divisions` pair sets the
    /// interval starting at that size, the first pair also every smaller one, and `>` every
    /// interval from the last pair's on (that one included). Default: all `0`.
    pub roundup_power2_divisions: [u32; ROUNDUP_INTERVALS],
    /// When reserved memory would exceed this fraction of the memory the allocator may use
    /// (the device's capacity, or less under
    /// [`per_process_memory_fraction`](Self::per_process_memory_fraction)), release cached
    /// segments before growing (PyTorch's `garbage_collection_threshold`). Default: `None`.
    pub garbage_collection_threshold: Option<f64>,
    /// The most the allocator may reserve, as a fraction of the device's capacity (PyTorch's
    /// `per_process_memory_fraction` and `torch.cuda.set_per_process_memory_fraction`): a
    /// request that would reserve more first has the cache given back, as when the device
    /// itself runs out, then fails with [`Error::OutOfMemory`](crate::Error::OutOfMemory) saying
    /// what was allowed. With it a test on a large GPU shows whether a program fits a smaller
    /// one; the soft limit ([`fragmentation_limit`](Self::fragmentation_limit)) stays under it.
    /// Only the allocator's own memory counts. On the default device, `VRAMSCOPE_CAPACITY` sets
    /// it on CUDA (see [`crate::device`]). Default: `None`, the whole device.
    pub per_process_memory_fraction: Option<f64>,
    /// The allocator grows reserved memory freely while it stays within this multiple of the
    /// peak of allocated bytes; beyond it, it first gives cached memory back to the backend
    /// (whole free segments, then the pages under free holes where the backend can unmap), and
    /// it sizes new segments to the request. `None` caches like PyTorch: nothing is released
    /// before the device is full. Default: `Some(1.05)`.
    pub fragmentation_limit: Option<f64>,
    /// How far the fragmentation limit may rise when holding to it makes the allocator churn:
    /// each time it must ask the backend for memory to serve a request that a piece it gave
    /// back (since the last peak of allocated bytes) would have served, the limit rises at once
    /// to what growing then takes without giving anything back (reserved bytes plus the new
    /// segment, over the peak) or, where more, to what reserved had to reach for those pieces
    /// to stay (at least 0.5% more, in steps of 0.5%). That churn is proof the workload's
    /// steps need that much cache; raising the limit a fixed step at a time instead
    /// paid driver calls at every step until it got there (on CUDA, with dynamic shapes, more
    /// steps than a test runs: `BENCHMARKS.md`). A steady workload (a training loop) settles
    /// within one or two steps; where it must rise again before a new peak of allocated bytes,
    /// each rise is at least twice the last, so that a loop whose steps keep churning (dynamic
    /// shapes) gets there in a few. Default: [`LimitMax::Auto`].
    pub fragmentation_limit_max: LimitMax,
    /// Where the backend can map and unmap pages (CUDA's virtual-memory segments, the sim),
    /// give back the pages under free holes inside segments when reclaiming, and let a large
    /// segment grow in place (one stream's at a time), as PyTorch's
    /// expandable segments do (see the crate docs, "How the allocator works"). Default: `true`.
    pub release_pages: bool,
    /// Where a stream's large request (over 1 MiB) finds none of its own free blocks that
    /// fits, serve it from the memory of the stream that holds the most (the range that grows
    /// in place; with segments that do not grow, the stream holding the most large segments)
    /// while that stream has no work queued (or no memory joined its free blocks since it was
    /// last seen idle), the block lent. Memory then moves between streams as in the
    /// `cudaMallocAsync` pool, and makes one stream wait for another's work only where a
    /// borrower idle when last asked has work queued when its returned loans are checked
    /// (see the crate docs, "How the allocator works").
    /// `false` keeps each stream's memory to itself but for loans over the fragmentation
    /// limit, as PyTorch's allocator does (`share_idle_streams:false`). Default: `true`.
    pub share_idle_streams: bool,
    /// Where the range that grows in place ([`release_pages`](Self::release_pages)) would grow
    /// for a large request (over 1 MiB) that none of its holes fits, serve the request instead
    /// from the range's wholly free mappings, wherever they lie, mapped once more in order at
    /// addresses of their own (a *view*), if that maps fewer new bytes than growing would; the
    /// view is kept for the next request of its size in pages once its memory is all free
    /// again. Only whole mappings can be mapped twice: the range's, as it maps them anyway (a
    /// 2 MiB page each for growths under 128 MiB, coarser for larger ones). Needs a backend
    /// that can [`alias`](crate::backend::Backend::alias) (the sim; CUDA's virtual-memory
    /// segments). vramscope's own. Default: `true` (see the crate docs, "How the allocator
    /// works", and `BENCHMARKS.md`, "Views of the range's free pages" and "Views of whole
    /// mappings").
    pub alias_pages: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: None,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: None,
            per_process_memory_fraction: None,
            fragmentation_limit: Some(1.05),
            fragmentation_limit_max: LimitMax::Auto,
            release_pages: true,
            share_idle_streams: true,
            alias_pages: true,
        }
    }
}

/// How far [`AllocatorConfig::fragmentation_limit`] may rise when holding to it churns.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum LimitMax {
    /// Up to [`LimitMax::AUTO_CEILING`] on backends whose segment calls are costly
    /// ([`Backend::costly_segments`](crate::backend::Backend::costly_segments): CUDA, where
    /// `cuMemAlloc` takes tens of microseconds and `cuMemFree` synchronizes the device);
    /// fixed on the others (host, sim), where giving memory back costs next to nothing. The
    /// ceiling gives way to churn that repeats: once the limit is at it, a request whose size
    /// (in pages) already churned there raises the limit past it, as below it, so that a loop
    /// whose steady state needs more cache settles instead of calling the driver on every step.
    #[default]
    Auto,
    /// The limit stays where it is configured.
    Off,
    /// Up to this multiple of the peak of allocated bytes, never past it.
    At(f64),
}

impl LimitMax {
    /// The ceiling of [`LimitMax::Auto`] on backends with costly segment calls.
    pub const AUTO_CEILING: f64 = 1.25;

    /// The ceiling in force on a backend whose segment calls are (or are not) costly; `None`
    /// when the limit stays fixed.
    pub fn resolve(self, costly_segments: bool) -> Option<f64> {
        match self {
            LimitMax::Auto if costly_segments => Some(Self::AUTO_CEILING),
            LimitMax::Auto | LimitMax::Off => None,
            LimitMax::At(m) => Some(m),
        }
    }
}

fn bad(key: &str, message: impl Into<String>) -> Error {
    Error::Config { key: key.to_string(), message: message.into() }
}

/// `off` or `none`, in any case: a limit switched off.
fn is_off(value: &str) -> bool {
    value.eq_ignore_ascii_case("off") || value.eq_ignore_ascii_case("none")
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(bad(key, format!("`{v}` is not a boolean; accepted: True or False"))),
    }
}

/// A whole number of MiB, more than 20 (PyTorch's `max_split_size_mb` and
/// `max_non_split_rounding_mb`), in bytes.
fn parse_mib(key: &str, value: &str) -> Result<u64> {
    let mb: u64 =
        value.parse().map_err(|_| bad(key, format!("`{value}` is not a whole number of MiB (e.g. {key}:256)")))?;
    if mb <= 20 {
        return Err(bad(key, format!("{mb} MiB is too small; it must be more than 20")));
    }
    mb.checked_mul(1 << 20).ok_or_else(|| bad(key, format!("{mb} MiB does not fit in 64 bits")))
}

impl AllocatorConfig {
    /// Parses `key:value` pairs separated by commas, as in `PYTORCH_CUDA_ALLOC_CONF`.
    ///
    /// Keys: `max_split_size_mb` and `max_non_split_rounding_mb` (whole numbers of MiB, more
    /// than 20; the second only with the first, alone it changes nothing in PyTorch either),
    /// `roundup_power2_divisions` (0 or a power of two, at most 64, or PyTorch's list
    /// `[256:1,512:2,>:8]`), `garbage_collection_threshold` (a number strictly between 0 and 1),
    /// `per_process_memory_fraction` (a number above 0 and at most 1),
    /// `fragmentation_limit` and `fragmentation_limit_max` (numbers from 1 to
    /// [`MAX_FRAGMENTATION_LIMIT`], or `off`; the second also `auto`), `release_pages` and its
    /// PyTorch-named alias `expandable_segments` (`True` or `False`), `share_idle_streams` and
    /// `alias_pages` (`True` or `False`; vramscope's own), and `backend:native`
    /// (vramscope is PyTorch's native allocator; `cudaMallocAsync` is refused). Each key at most
    /// once. Unknown keys, PyTorch's keys that vramscope does not implement
    /// (`release_lock_on_cudamalloc`, the `pinned_*` keys, ...) and malformed values are errors
    /// naming the key and the accepted form: vramscope refuses a setting it would ignore. An
    /// empty string is the default configuration.
    pub fn parse(s: &str) -> Result<Self> {
        let mut c = AllocatorConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in split_items(s)?.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| bad(item, format!("expected `key:value`; accepted keys: {KEYS}")))?;
            if seen.contains(&key) {
                return Err(bad(key, "is given twice; give each key once"));
            }
            seen.push(key);
            match key {
                "max_split_size_mb" => c.max_split_size = Some(parse_mib(key, value)?),
                "max_non_split_rounding_mb" => c.max_non_split_rounding = Some(parse_mib(key, value)?),
                "roundup_power2_divisions" => c.roundup_power2_divisions = parse_divisions(value)?,
                // PyTorch's choice of allocator: vramscope is the caching one (`native`).
                "backend" if value == "native" => {}
                "backend" => {
                    return Err(bad(
                        key,
                        format!(
                            "`{value}` is PyTorch's choice of allocator; vramscope is the caching allocator \
                             (`native`): choose where its memory comes from with VRAMSCOPE_BACKEND"
                        ),
                    ))
                }
                _ if PYTORCH_ONLY_KEYS.contains(&key) => {
                    return Err(bad(
                        key,
                        format!(
                            "is PyTorch's key, which vramscope does not implement (it refuses settings it \
                             would ignore): remove it; accepted keys: {KEYS}"
                        ),
                    ))
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| {
                        bad(key, format!("`{value}` is not a number (e.g. garbage_collection_threshold:0.8)"))
                    })?;
                    c.garbage_collection_threshold = Some(t);
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value.parse().map_err(|_| {
                        bad(key, format!("`{value}` is not a number (e.g. per_process_memory_fraction:0.3)"))
                    })?;
                    c.per_process_memory_fraction = Some(f);
                }
                "fragmentation_limit" => {
                    if is_off(value) {
                        c.fragmentation_limit = None;
                    } else {
                        let f: f64 = value.parse().map_err(|_| {
                            bad(key, format!("`{value}` is not a number or `off` (e.g. fragmentation_limit:1.1)"))
                        })?;
                        c.fragmentation_limit = Some(f);
                    }
                }
                "fragmentation_limit_max" => {
                    c.fragmentation_limit_max = if value.eq_ignore_ascii_case("auto") {
                        LimitMax::Auto
                    } else if is_off(value) {
                        LimitMax::Off
                    } else {
                        LimitMax::At(value.parse().map_err(|_| {
                            bad(
                                key,
                                format!(
                                    "`{value}` is not a number, `auto` or `off` (e.g. fragmentation_limit_max:1.2)"
                                ),
                            )
                        })?)
                    }
                }
                "release_pages" | "expandable_segments" => c.release_pages = parse_bool(key, value)?,
                "share_idle_streams" => c.share_idle_streams = parse_bool(key, value)?,
                "alias_pages" => c.alias_pages = parse_bool(key, value)?,
                _ => return Err(bad(key, format!("unknown key; accepted keys: {KEYS}"))),
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Reads [`ALLOC_CONF_ENV`]; an unset variable is the default configuration.
    pub fn from_env() -> Result<Self> {
        match std::env::var(ALLOC_CONF_ENV) {
            Ok(s) => Self::parse(&s).map_err(|e| match e {
                Error::Config { key, message } => {
                    Error::Config { key, message: format!("{message} (in {ALLOC_CONF_ENV})") }
                }
                e => e,
            }),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(bad(ALLOC_CONF_ENV, "the variable is not valid UTF-8")),
        }
    }

    /// Checks the ranges of the values (also of those set directly on the struct).
    pub(crate) fn validate(&self) -> Result<()> {
        let in_range = |x: f64| (1.0..=MAX_FRAGMENTATION_LIMIT).contains(&x);
        let out_of_range = |key: &str, x: f64| {
            // `{:e}` keeps a huge or tiny value one short word (`1e308`, not 309 digits).
            let shown = if x.is_finite() && x.abs() < 1e6 { format!("{x}") } else { format!("{x:e}") };
            bad(key, format!("{shown} must be at least 1 and at most {MAX_FRAGMENTATION_LIMIT} (`off` for no limit)"))
        };
        if let Some(f) = self.fragmentation_limit {
            if !in_range(f) {
                return Err(out_of_range("fragmentation_limit", f));
            }
        }
        if let LimitMax::At(m) = self.fragmentation_limit_max {
            if !in_range(m) {
                return Err(out_of_range("fragmentation_limit_max", m));
            }
        }
        if let (Some(f), LimitMax::At(m)) = (self.fragmentation_limit, self.fragmentation_limit_max) {
            if m < f {
                return Err(bad(
                    "fragmentation_limit_max",
                    format!("{m} is below fragmentation_limit {f}: the limit rises up to the maximum, never above it"),
                ));
            }
        }
        if let Some(t) = self.garbage_collection_threshold {
            if !(t > 0.0 && t < 1.0) {
                return Err(bad("garbage_collection_threshold", format!("{t} must be strictly between 0 and 1")));
            }
        }
        if let Some(f) = self.per_process_memory_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err(bad("per_process_memory_fraction", format!("{f} must be above 0 and at most 1")));
            }
        }
        if let Some(r) = self.max_non_split_rounding {
            let key = "max_non_split_rounding_mb";
            if self.max_split_size.is_none() {
                return Err(bad(
                    key,
                    "applies only to blocks of at least max_split_size_mb, which is not set (alone it \
                     changes nothing in PyTorch either): set max_split_size_mb too, or remove it",
                ));
            }
            if r <= 20 << 20 {
                return Err(bad(key, format!("{r} bytes is too small; it must be more than 20 MiB")));
            }
        }
        for &d in &self.roundup_power2_divisions {
            if d > 64 || (d > 0 && !d.is_power_of_two()) {
                return Err(bad("roundup_power2_divisions", format!("{d} must be 0 or a power of two of at most 64")));
            }
        }
        Ok(())
    }

    /// Lets the allocator of a device of `total` bytes reserve at most `capacity` of them (and
    /// of those at most its [`per_process_memory_fraction`](Self::per_process_memory_fraction),
    /// if set): a smaller device, seen from a larger one. `VRAMSCOPE_CAPACITY` and the command
    /// line's `--capacity` do this on CUDA.
    ///
    /// ```
    /// # use vramscope::config::AllocatorConfig;
    /// let mut c = AllocatorConfig::default();
    /// c.limit_to_capacity(24 << 30, 80 << 30).unwrap();
    /// assert_eq!(c.per_process_memory_fraction, Some(0.3));
    /// assert!(c.limit_to_capacity(100 << 30, 80 << 30).is_err());
    /// ```
    ///
    /// Errors when `capacity` is 0 or more than `total`.
    pub fn limit_to_capacity(&mut self, capacity: u64, total: u64) -> Result<()> {
        if capacity == 0 || capacity > total {
            return Err(bad(
                "capacity",
                format!(
                    "{} is not a capacity a device of {} can stand for: it must be above 0 and at most that",
                    crate::error::fmt_bytes(capacity),
                    crate::error::fmt_bytes(total)
                ),
            ));
        }
        let f = self.per_process_memory_fraction.unwrap_or(1.0) * (capacity as f64 / total as f64);
        self.per_process_memory_fraction = Some(f);
        self.validate()
    }

    /// The divisions that apply to a request of `size` bytes (PyTorch's
    /// `roundup_power2_divisions(size)`).
    pub(crate) fn divisions_for(&self, size: u64) -> u32 {
        let log = 63 - size.max(1).leading_zeros() as usize;
        self.roundup_power2_divisions[log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1)]
    }
}

/// Splits a configuration string at the commas outside brackets (PyTorch's list values).
fn split_items(s: &str) -> Result<Vec<&str>> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, ch) in s.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => {
                depth = depth.checked_sub(1).ok_or_else(|| bad(&s[start..=i], "a `]` without its `[`"))?;
            }
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(bad(s[start..].trim(), "a `[` without its `]`"));
    }
    items.push(&s[start..]);
    Ok(items)
}

/// `roundup_power2_divisions`: one number for every size, or PyTorch's list of
/// `MiB:divisions` pairs (`[256:1,512:2,>:8]`), read as PyTorch reads it: the first pair also
/// covers every smaller size, `>` every size after the last pair.
fn parse_divisions(value: &str) -> Result<[u32; ROUNDUP_INTERVALS]> {
    const KEY: &str = "roundup_power2_divisions";
    let number = |v: &str| {
        v.trim().parse::<u32>().map_err(|_| {
            bad(KEY, format!("`{}` is not a whole number (e.g. roundup_power2_divisions:4 or [256:1,>:4])", v.trim()))
        })
    };
    let Some(list) = value.strip_prefix('[') else {
        return Ok([number(value)?; ROUNDUP_INTERVALS]);
    };
    let list = list
        .strip_suffix(']')
        .ok_or_else(|| bad(KEY, format!("`{value}`: a list ends with `]` (e.g. [256:1,512:2,>:4])")))?;
    let mut out = [0u32; ROUNDUP_INTERVALS];
    let (mut first, mut last) = (true, 0usize);
    for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (mib, divisions) = pair
            .split_once(':')
            .ok_or_else(|| bad(KEY, format!("`{pair}` is not `MiB:divisions` (e.g. [256:1,512:2,>:4])")))?;
        let divisions = number(divisions)?;
        if mib.trim() == ">" {
            out[last..].fill(divisions);
            continue;
        }
        let mib = u64::from(number(mib)?);
        if !mib.is_power_of_two() {
            return Err(bad(KEY, format!("{mib} MiB: the sizes of a list are powers of two (e.g. 256:1)")));
        }
        let index = (mib.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
        if first {
            out[..index].fill(divisions);
            first = false;
        }
        out[index] = divisions;
        last = index;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contradictory_limits_are_an_error() {
        let e = AllocatorConfig::parse("fragmentation_limit:2,fragmentation_limit_max:1").unwrap_err().to_string();
        assert!(e.contains("fragmentation_limit_max") && e.contains("below fragmentation_limit 2"), "{e}");
        assert!(AllocatorConfig::parse("fragmentation_limit:1.1,fragmentation_limit_max:1.1").is_ok());
    }

    #[test]
    fn parses_every_key() {
        let c = AllocatorConfig::parse(
            " max_split_size_mb:128, roundup_power2_divisions:4,garbage_collection_threshold:0.6,\
             fragmentation_limit:1.2,fragmentation_limit_max:1.3,expandable_segments:False",
        )
        .unwrap();
        assert_eq!(c.max_split_size, Some(128 << 20));
        assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
        assert_eq!(c.garbage_collection_threshold, Some(0.6));
        assert_eq!(c.fragmentation_limit, Some(1.2));
        assert_eq!(c.fragmentation_limit_max, LimitMax::At(1.3));
        assert_eq!(
            AllocatorConfig::parse("fragmentation_limit_max:off").unwrap().fragmentation_limit_max,
            LimitMax::Off
        );
        assert_eq!(
            AllocatorConfig::parse("fragmentation_limit_max:auto").unwrap().fragmentation_limit_max,
            LimitMax::Auto
        );
        assert!(!c.release_pages);
        assert!(c.share_idle_streams, "shared by default");
        assert!(!AllocatorConfig::parse("share_idle_streams:False").unwrap().share_idle_streams);
        assert!(c.alias_pages, "views by default");
        assert!(!AllocatorConfig::parse("alias_pages:False").unwrap().alias_pages);
        assert_eq!(AllocatorConfig::parse("").unwrap(), AllocatorConfig::default());
        assert_eq!(AllocatorConfig::parse("fragmentation_limit:off").unwrap().fragmentation_limit, None);
    }

    /// PyTorch's list form, read as `parseRoundUpPower2Divisions` reads it.
    #[test]
    fn divisions_per_size_interval() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8],max_split_size_mb:64").unwrap();
        let mut expected = [1; ROUNDUP_INTERVALS];
        expected[9] = 2;
        expected[10..].fill(8);
        expected[10] = 8;
        assert_eq!(c.roundup_power2_divisions, expected);
        assert_eq!(c.max_split_size, Some(64 << 20), "the list's commas do not end the item");
        assert_eq!(c.divisions_for(100), 1);
        assert_eq!(c.divisions_for(300 << 20), 1, "256 MiB to 512 MiB: the pair 256:1");
        assert_eq!(c.divisions_for(600 << 20), 2);
        assert_eq!(c.divisions_for(1 << 40), 8);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[1:4]").unwrap();
        assert_eq!(c.roundup_power2_divisions[0], 4);
        assert_eq!(c.roundup_power2_divisions[1], 0, "no `>`: later intervals keep 0");
        assert_eq!(AllocatorConfig::parse("backend:native").unwrap(), AllocatorConfig::default());
    }

    #[test]
    fn errors_name_the_key_and_form() {
        for (input, key, needle) in [
            ("max_split_size_mb:abc", "max_split_size_mb", "whole number"),
            ("max_split_size_mb:10", "max_split_size_mb", "more than 20"),
            ("max_split_size_mb:99999999999999999", "max_split_size_mb", "64 bits"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions", "power of two"),
            ("roundup_power2_divisions:[256:1,300:2]", "roundup_power2_divisions", "powers of two"),
            ("roundup_power2_divisions:[256:1,512:3]", "roundup_power2_divisions", "power of two"),
            ("roundup_power2_divisions:[256-1]", "roundup_power2_divisions", "MiB:divisions"),
            ("roundup_power2_divisions:[256:1", "roundup_power2_divisions:[256:1", "without its `]`"),
            ("fragmentation_limit:1e308", "fragmentation_limit", "1e308 must be at least 1 and at most 16"),
            ("fragmentation_limit:17", "fragmentation_limit", "at most 16"),
            ("fragmentation_limit_max:inf", "fragmentation_limit_max", "at most 16"),
            ("backend:cudaMallocAsync", "backend", "VRAMSCOPE_BACKEND"),
            ("pinned_use_background_threads:True", "pinned_use_background_threads", "does not implement"),
            ("per_process_memory_fraction:0", "per_process_memory_fraction", "above 0 and at most 1"),
            ("per_process_memory_fraction:1.5", "per_process_memory_fraction", "above 0 and at most 1"),
            ("per_process_memory_fraction:most", "per_process_memory_fraction", "not a number"),
            ("throw_on_cudamalloc_oom:True", "throw_on_cudamalloc_oom", "does not implement"),
            ("max_non_split_rounding_mb:20", "max_non_split_rounding_mb", "more than 20"),
            ("max_non_split_rounding_mb:1.5", "max_non_split_rounding_mb", "whole number"),
            ("expandable_segments:True,max_non_split_rounding_mb:256", "max_non_split_rounding_mb", "set max_split"),
            ("fragmentation_limit:1.1,fragmentation_limit:1.2", "fragmentation_limit", "twice"),
            ("garbage_collection_threshold:1.5", "garbage_collection_threshold", "between 0 and 1"),
            ("fragmentation_limit:0.5", "fragmentation_limit", "at least 1"),
            ("fragmentation_limit:NaN", "fragmentation_limit", "at least 1"),
            ("fragmentation_limit_max:0.9", "fragmentation_limit_max", "at least 1"),
            ("fragmentation_limit_max:x", "fragmentation_limit_max", "not a number"),
            ("release_pages:maybe", "release_pages", "True or False"),
            ("share_idle_streams:sometimes", "share_idle_streams", "True or False"),
            ("alias_pages:2", "alias_pages", "True or False"),
            ("colour:blue", "colour", "accepted keys"),
            ("max_split_size_mb", "max_split_size_mb", "key:value"),
        ] {
            match AllocatorConfig::parse(input) {
                Err(Error::Config { key: k, message }) => {
                    assert_eq!(k, key, "{input}");
                    assert!(message.contains(needle), "{input}: {message}");
                }
                other => panic!("{input}: expected a config error, got {other:?}"),
            }
        }
    }
}
