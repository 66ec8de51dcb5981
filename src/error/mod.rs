//! The crate's error type.

mod kinds;

pub use kinds::{InvalidRequest, ReportError, Rounding, UsageError};
use std::fmt;

/// Bytes exactly, with thousands separators: `262,144 B`.
pub(crate) fn fmt_bytes_exact(n: u64) -> String {
    thousands(n) + " B"
}

/// A count with thousands separators: `9,937`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 2);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats a byte count the way the reports do: `1.50 GiB`, `512 B`.
pub(crate) fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.2} {unit}")
}

/// An environment variable's text: `None` when unset, an error naming it when it is not UTF-8
/// (never silently the default).
pub(crate) fn env_text(key: &str) -> std::result::Result<Option<String>, Error> {
    match std::env::var(key) {
        Ok(s) => Ok(Some(s)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::Config { key: key.into(), message: format!("{v:?} is not UTF-8 text") })
        }
    }
}

/// Everything that can go wrong in vramscope.
///
/// Errors are plain values: they carry what was asked and what was found, so that a test or
/// a log line can say exactly why memory could not be had.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The device could not supply the memory a request needed, even after the allocator
    /// released its cache and retried.
    OutOfMemory(Box<OomReport>),
    /// The backend failed for a reason other than running out of memory.
    Backend(BackendError),
    /// A configuration string (`VRAMSCOPE_ALLOC_CONF` or [`AllocatorConfig::parse`]) was malformed.
    ///
    /// [`AllocatorConfig::parse`]: crate::config::AllocatorConfig::parse
    Config {
        /// The key whose value was wrong, or the unknown key.
        key: String,
        /// What was wrong and which form is accepted.
        message: String,
    },
    /// A request the allocator can never satisfy (for example a length whose byte size overflows).
    InvalidRequest(InvalidRequest),
    /// A buffer, stream or setting was used where it does not belong (another allocator's
    /// stream, a host slice of device memory, an empty frame pattern).
    Usage(UsageError),
    /// A report could not be produced from what it was given (a flamegraph of an empty
    /// profile, or one that `inferno` could not draw); the message names the report.
    Report(ReportError),
    /// A trace or snapshot file could not be read or understood.
    Format {
        /// Where the input came from (a path, or `<memory>`).
        source_name: String,
        /// What was wrong, and where in the input.
        message: String,
    },
    /// An I/O error, with the path it concerned.
    Io {
        /// The path being read or written.
        path: String,
        /// The underlying error.
        error: std::io::Error,
    },
}

/// What the allocator knew when a request ran out of memory.
///
/// Its `Display` is the message users see; every field is public so that code can react to it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OomReport {
    /// Device index of the allocator.
    pub device: usize,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Bytes the request needed after rounding (a block size).
    pub rounded: u64,
    /// The backend's total capacity.
    pub capacity: u64,
    /// Free memory as the backend reported it when the request failed.
    pub free: u64,
    /// Bytes handed out to live buffers.
    pub allocated: u64,
    /// Bytes held from the backend.
    pub reserved: u64,
    /// The largest free block in the cache.
    pub largest_free_block: u64,
    /// The most the allocator may reserve, where less than the device
    /// ([`AllocatorConfig::per_process_memory_fraction`](crate::config::AllocatorConfig::per_process_memory_fraction)).
    pub allowed: Option<u64>,
    /// What the backend said.
    pub backend_message: String,
    /// Where a snapshot was written (see `VRAMSCOPE_OOM_SNAPSHOT`), if one was.
    pub snapshot_path: Option<String>,
    /// Why no snapshot was written where `VRAMSCOPE_OOM_SNAPSHOT` asked for one.
    pub snapshot_error: Option<String>,
}

impl OomReport {
    /// Reserved bytes not handed out to any buffer (cache and fragmentation).
    pub fn reserved_unused(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory on device {}: tried to allocate {} ({} after rounding); the device has a \
             capacity of {} of which {} is free",
            self.device,
            fmt_bytes(self.requested),
            fmt_bytes(self.rounded),
            fmt_bytes(self.capacity),
            fmt_bytes(self.free),
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, ", and the allocator may reserve {} of it", fmt_bytes(allowed))?;
        }
        write!(
            f,
            "; {} is allocated to live buffers, {} is reserved but unused by the allocator, and the \
             largest free cached block is {} ({})",
            fmt_bytes(self.allocated),
            fmt_bytes(self.reserved_unused()),
            fmt_bytes(self.largest_free_block),
            self.backend_message,
        )?;
        if let Some(p) = &self.snapshot_path {
            write!(f, "; a snapshot was written to {p}")?;
        }
        if let Some(why) = &self.snapshot_error {
            write!(f, "; no snapshot was written: {why}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfMemory(r) => r.fmt(f),
            Error::Backend(e) => write!(f, "backend error: {e}"),
            // Environment variables are named as such, keys of a configuration string as keys.
            Error::Config { key, message } if key.starts_with("VRAMSCOPE_") => {
                write!(f, "environment variable `{key}`: {message}")
            }
            Error::Config { key, message } => write!(f, "allocator configuration key `{key}`: {message}"),
            Error::InvalidRequest(e) => write!(f, "invalid request: {e}"),
            Error::Usage(e) => write!(f, "usage error: {e}"),
            Error::Report(e) => e.fmt(f),
            Error::Format { source_name, message } => write!(f, "{source_name}: {message}"),
            Error::Io { path, error } => write!(f, "{path}: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Backend(e) => Some(e),
            Error::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error::Backend(e)
    }
}

impl From<UsageError> for Error {
    fn from(e: UsageError) -> Self {
        Error::Usage(e)
    }
}

impl From<InvalidRequest> for Error {
    fn from(e: InvalidRequest) -> Self {
        Error::InvalidRequest(e)
    }
}

impl From<ReportError> for Error {
    fn from(e: ReportError) -> Self {
        Error::Report(e)
    }
}

/// An error reported by a [`Backend`](crate::backend::Backend).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend has no memory for the request.
    OutOfMemory {
        /// Bytes the backend was asked for.
        requested: u64,
        /// What the backend said.
        message: String,
    },
    /// The backend does not support this operation.
    Unsupported(&'static str),
    /// Any other failure, with the backend's message.
    Other(String),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::OutOfMemory { requested, message } => {
                write!(f, "out of memory reserving {}: {message}", fmt_bytes(*requested))
            }
            BackendError::Unsupported(what) => write!(f, "operation not supported by this backend: {what}"),
            BackendError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for BackendError {}

/// `Result` with vramscope's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
        assert_eq!(fmt_bytes_exact(0), "0 B");
        assert_eq!(fmt_bytes_exact(512), "512 B");
        assert_eq!(fmt_bytes_exact(1536), "1,536 B");
        assert_eq!(fmt_bytes_exact(262_144), "262,144 B");
        assert_eq!(fmt_bytes_exact(1_048_576), "1,048,576 B");
    }

    #[test]
    fn oom_message_names_every_figure() {
        let r = OomReport {
            device: 0,
            requested: 3 << 20,
            rounded: 4 << 20,
            capacity: 8 << 30,
            free: 1 << 20,
            allocated: 6 << 30,
            reserved: 7 << 30,
            largest_free_block: 2 << 20,
            allowed: Some(7 << 30),
            backend_message: "host capacity reached".into(),
            snapshot_path: Some("/tmp/oom.json".into()),
            snapshot_error: None,
        };
        let m = Error::OutOfMemory(Box::new(r)).to_string();
        for part in [
            "3.00 MiB",
            "4.00 MiB",
            "8.00 GiB",
            "1.00 MiB",
            "6.00 GiB",
            "1.00 GiB",
            "2.00 MiB",
            "/tmp/oom.json",
            "may reserve 7.00 GiB",
        ] {
            assert!(m.contains(part), "{part} missing from {m}");
        }
    }
}
