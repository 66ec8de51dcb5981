//! What [`Error::Usage`](super::Error::Usage), [`Error::InvalidRequest`](super::Error::InvalidRequest)
//! and [`Error::Report`](super::Error::Report) carry: one variant per thing a caller could
//! branch on, each with the values it concerned. Their `Display` is the message users read.

use crate::units::ByteSizeError;
use std::fmt;

/// A buffer, stream or setting used where it does not belong: a mistake in the calling code,
/// not a lack of memory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageError {
    /// A stream made by another allocator was given to this one.
    ForeignStream {
        /// The stream's index in its own allocator.
        stream: u32,
    },
    /// A buffer allocated by another allocator was given to this one.
    ForeignBuffer,
    /// An allocator already has `u32::MAX` streams.
    TooManyStreams,
    /// A shape whose element count is not the buffer's length.
    ShapeMismatch {
        /// The shape given.
        shape: Vec<usize>,
        /// The buffer's length in elements.
        len: usize,
    },
    /// A copy between a slice and a buffer of different lengths.
    LengthMismatch {
        /// Elements of the slice.
        source: usize,
        /// Elements of the buffer.
        destination: usize,
    },
    /// The backend's memory cannot be reached from the host: read or write it through the
    /// device's API (CUDA copies), or use a backend that can copy.
    NotHostAddressable {
        /// The backend's name (`sim`, `cuda`).
        backend: String,
        /// Whether the backend can copy to and from the device instead.
        can_copy: bool,
    },
    /// A frame pattern that is empty, so would match every frame.
    EmptyPattern {
        /// `user-code` or `library`.
        kind: &'static str,
    },
    /// Memory allocated elsewhere was reported to an allocator that serves memory itself
    /// (only one made by [`CachingAllocator::external`](crate::CachingAllocator::external)
    /// records it).
    NotExternal {
        /// The allocator's backend.
        backend: String,
    },
    /// A memory test asked for more iterations, warm-up included, than
    /// [`MAX_ITERATIONS`](crate::testing::MAX_ITERATIONS).
    TooManyIterations {
        /// The test's name.
        test: String,
        /// Warm-up iterations asked for.
        warmup: usize,
        /// Measured iterations asked for.
        iters: usize,
        /// The most iterations a test may run, warm-up included.
        limit: usize,
    },
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageError::ForeignStream { stream } => write!(
                f,
                "stream {stream} belongs to another allocator; create streams with this allocator's new_stream()"
            ),
            UsageError::ForeignBuffer => f.write_str("the buffer belongs to another allocator"),
            UsageError::TooManyStreams => write!(f, "too many streams: an allocator holds at most {}", u32::MAX),
            UsageError::ShapeMismatch { shape, len } => {
                write!(f, "shape {shape:?} does not hold exactly {len} elements")
            }
            UsageError::LengthMismatch { source, destination } => {
                write!(f, "copy of {source} elements into a buffer of {destination}")
            }
            UsageError::NotHostAddressable { backend, can_copy: true } => write!(
                f,
                "the {backend} backend's memory is not addressable from the host; copy through the device API"
            ),
            UsageError::NotHostAddressable { backend, can_copy: false } => {
                write!(f, "the {backend} backend's memory is not addressable from the host and it cannot copy")
            }
            UsageError::EmptyPattern { kind } => write!(
                f,
                "an empty {kind} pattern would match every frame: give a part of a path or a function \
                 name, e.g. `vendor/` or `my_crate::`"
            ),
            UsageError::NotExternal { backend } => write!(
                f,
                "the {backend} allocator serves memory itself; record memory allocated elsewhere in an \
                 allocator made by CachingAllocator::external"
            ),
            UsageError::TooManyIterations { test, warmup, iters, limit } => {
                write!(f, "{test}: {warmup} warm-up and {iters} measured iterations: at most {limit} in all")
            }
        }
    }
}

/// What a block or segment size is rounded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rounding {
    /// A block size (512 bytes and up).
    Block,
    /// A segment size (the backend's page and up).
    Segment,
}

/// A request the allocator can never satisfy, whatever memory is free.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidRequest {
    /// `len` elements of `element` bytes are more than 64 bits of bytes.
    BytesOverflow {
        /// Elements asked for.
        len: usize,
        /// Bytes of one element.
        element: usize,
    },
    /// A shape with more elements than the address space holds.
    ShapeOverflow {
        /// The shape given.
        shape: Vec<usize>,
    },
    /// A size that overflows when rounded up.
    RoundingOverflow {
        /// Bytes asked for.
        requested: u64,
        /// What it was being rounded to.
        to: Rounding,
    },
    /// Text that is not a byte size (see [`units::parse_byte_size`](crate::units::parse_byte_size)).
    ByteSize {
        /// The text given.
        text: String,
        /// What was wrong with it.
        error: ByteSizeError,
    },
}

impl fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidRequest::BytesOverflow { len, element } => {
                write!(f, "{len} elements of {element} bytes overflow 64 bits")
            }
            InvalidRequest::ShapeOverflow { shape } => {
                write!(f, "shape {shape:?} has more elements than the address space can hold")
            }
            InvalidRequest::RoundingOverflow { requested, to } => {
                let to = match to {
                    Rounding::Block => "block",
                    Rounding::Segment => "segment",
                };
                write!(f, "{requested} bytes cannot be rounded to a {to} size without overflow")
            }
            InvalidRequest::ByteSize { text, error } => write!(f, "`{text}`: {error}"),
        }
    }
}

/// Why a report could not be produced from what it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReportError {
    /// A flamegraph of a profile with no bytes in any stack: there is nothing to draw (a
    /// caller writing one flamegraph per snapshot may skip these).
    EmptyProfile {
        /// The report's title.
        title: String,
    },
    /// `inferno` could not draw or compare the profiles.
    Render {
        /// The report's title.
        title: String,
        /// What `inferno` said.
        message: String,
    },
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::EmptyProfile { title } => {
                write!(f, "{title}: nothing to draw, the profile is empty (no bytes in any stack)")
            }
            ReportError::Render { title, message } => write!(f, "{title}: {message}"),
        }
    }
}
