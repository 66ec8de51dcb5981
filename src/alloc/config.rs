//! Allocator configuration: a struct with documented defaults, and the `VRAMSCOPE_ALLOC_CONF`
//! string form with PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys where they apply.

use crate::error::{Error, Result};

/// The environment variable [`AllocatorConfig::from_env`] reads.
pub const ALLOC_CONF_ENV: &str = "VRAMSCOPE_ALLOC_CONF";

/// Keys accepted in a configuration string, for error messages.
const KEYS: &str = "max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, \
                    fragmentation_limit, fragmentation_limit_max, release_pages, expandable_segments";

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
    /// Blocks larger than this are never split, and requests smaller than it never take them
    /// (PyTorch's `max_split_size_mb`). Default: `None`, no limit.
    pub max_split_size: Option<u64>,
    /// Round request sizes up to one of this many divisions between powers of two
    /// (PyTorch's `roundup_power2_divisions`); `0` or `1` rounds to 512 bytes only. Default: `0`.
    pub roundup_power2_divisions: u32,
    /// When reserved memory would exceed this fraction of the device's capacity, release cached
    /// segments before growing (PyTorch's `garbage_collection_threshold`). Default: `None`.
    pub garbage_collection_threshold: Option<f64>,
    /// The allocator grows reserved memory freely while it stays within this multiple of the
    /// peak of allocated bytes; beyond it, it first gives cached memory back to the backend
    /// (whole free segments, then the pages under free holes where the backend can unmap), and
    /// it sizes new segments to the request. `None` caches like PyTorch: nothing is released
    /// before the device is full. Default: `Some(1.05)`.
    pub fragmentation_limit: Option<f64>,
    /// How far the fragmentation limit may rise when holding to it makes the allocator churn:
    /// each time it must ask the backend for memory to serve a request that a piece it gave
    /// back (since the last peak of allocated bytes) would have served, the limit rises by 0.5%
    /// of the peak. A steady workload (a training loop) settles within a few steps at the
    /// lowest limit at which its iterations reuse the cache without calling the backend.
    /// Default: [`LimitMax::Auto`].
    pub fragmentation_limit_max: LimitMax,
    /// Where the backend can unmap pages, give back the pages under free holes inside segments
    /// when reclaiming, as PyTorch's expandable segments do. Default: `true`.
    pub release_pages: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            roundup_power2_divisions: 0,
            garbage_collection_threshold: None,
            fragmentation_limit: Some(1.05),
            fragmentation_limit_max: LimitMax::Auto,
            release_pages: true,
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
    /// fixed on the others (host, sim), where giving memory back costs next to nothing.
    #[default]
    Auto,
    /// The limit stays where it is configured.
    Off,
    /// Up to this multiple of the peak of allocated bytes.
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

impl AllocatorConfig {
    /// Parses `key:value` pairs separated by commas, as in `PYTORCH_CUDA_ALLOC_CONF`.
    ///
    /// Keys: `max_split_size_mb` (an integer number of MiB, more than 20),
    /// `roundup_power2_divisions` (a power of two, at most 64), `garbage_collection_threshold`
    /// (a number strictly between 0 and 1), `fragmentation_limit` and `fragmentation_limit_max`
    /// (numbers at least 1, or `off`; the second also `auto`),
    /// `release_pages` and its PyTorch-named alias `expandable_segments` (`True` or `False`).
    /// Unknown keys and malformed values are errors naming the key and the accepted form; an
    /// empty string is the default configuration.
    pub fn parse(s: &str) -> Result<Self> {
        let mut c = AllocatorConfig::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| bad(item, format!("expected `key:value`; accepted keys: {KEYS}")))?;
            match key {
                "max_split_size_mb" => {
                    let mb: u64 = value.parse().map_err(|_| {
                        bad(key, format!("`{value}` is not a whole number of MiB (e.g. max_split_size_mb:256)"))
                    })?;
                    if mb <= 20 {
                        return Err(bad(key, format!("{mb} MiB is too small; it must be more than 20")));
                    }
                    let bytes =
                        mb.checked_mul(1 << 20).ok_or_else(|| bad(key, format!("{mb} MiB does not fit in 64 bits")))?;
                    c.max_split_size = Some(bytes);
                }
                "roundup_power2_divisions" => {
                    let d: u32 = value.parse().map_err(|_| {
                        bad(key, format!("`{value}` is not a whole number (e.g. roundup_power2_divisions:4)"))
                    })?;
                    c.roundup_power2_divisions = d;
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| {
                        bad(key, format!("`{value}` is not a number (e.g. garbage_collection_threshold:0.8)"))
                    })?;
                    c.garbage_collection_threshold = Some(t);
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
        if let Some(f) = self.fragmentation_limit {
            if !(f.is_finite() && f >= 1.0) {
                return Err(bad("fragmentation_limit", format!("{f} must be at least 1")));
            }
        }
        if let LimitMax::At(m) = self.fragmentation_limit_max {
            if !(m.is_finite() && m >= 1.0) {
                return Err(bad("fragmentation_limit_max", format!("{m} must be at least 1")));
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
        let d = self.roundup_power2_divisions;
        if d > 64 || (d > 0 && !d.is_power_of_two()) {
            return Err(bad("roundup_power2_divisions", format!("{d} must be 0 or a power of two of at most 64")));
        }
        Ok(())
    }
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
        assert_eq!(c.roundup_power2_divisions, 4);
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
        assert_eq!(AllocatorConfig::parse("").unwrap(), AllocatorConfig::default());
        assert_eq!(AllocatorConfig::parse("fragmentation_limit:off").unwrap().fragmentation_limit, None);
    }

    #[test]
    fn errors_name_the_key_and_form() {
        for (input, key, needle) in [
            ("max_split_size_mb:abc", "max_split_size_mb", "whole number"),
            ("max_split_size_mb:10", "max_split_size_mb", "more than 20"),
            ("max_split_size_mb:99999999999999999", "max_split_size_mb", "64 bits"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions", "power of two"),
            ("garbage_collection_threshold:1.5", "garbage_collection_threshold", "between 0 and 1"),
            ("fragmentation_limit:0.5", "fragmentation_limit", "at least 1"),
            ("fragmentation_limit:NaN", "fragmentation_limit", "at least 1"),
            ("fragmentation_limit_max:0.9", "fragmentation_limit_max", "at least 1"),
            ("fragmentation_limit_max:x", "fragmentation_limit_max", "not a number"),
            ("release_pages:maybe", "release_pages", "True or False"),
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
