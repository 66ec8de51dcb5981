//! Snapshots: the model every report reads, how it is built from an allocator, and the
//! PyTorch pickle reader.

mod build;
mod model;
pub(crate) mod pickle;
mod pickle_write;
mod torch;

pub use build::SNAPSHOT_VERSION;
pub use model::{BlockInfo, BlockState, ContextInfo, HistoryEntry, SegmentInfo, Snapshot};

/// What a file's first byte says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A pickle (protocol 2 or later starts with `PROTO`).
    Pickle,
    /// A JSON object.
    Json,
}

/// Tells a pickle from JSON, or says why the data is neither.
pub(crate) fn sniff(data: &[u8], what: &str) -> Result<FileKind, String> {
    match data.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(0x80) => Ok(FileKind::Pickle),
        Some(b'{') => Ok(FileKind::Json),
        None => Err("the file is empty".into()),
        Some(_) => Err(format!("neither a PyTorch snapshot pickle (protocol 2 or later) nor {what}")),
    }
}
