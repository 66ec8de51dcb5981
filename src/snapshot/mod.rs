//! Snapshots: the model every report reads, how it is built from an allocator, and the
//! PyTorch pickle reader.

mod build;
mod model;
pub(crate) mod pickle;
mod pickle_write;
mod torch;
mod validate;

pub use build::SNAPSHOT_VERSION;
pub use model::{
    BlockInfo, BlockState, ContextInfo, HistoryEntry, SegmentInfo, SegmentSummary, Snapshot, StackCapture,
};

/// What a file's first byte says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A pickle (protocol 2 or later starts with `PROTO`).
    Pickle,
    /// A JSON object.
    Json,
}

/// Reads an input file whole: only a regular file (a FIFO would block forever and a device
/// such as `/dev/zero` never ends).
pub(crate) fn read_input(path: &std::path::Path) -> crate::error::Result<Vec<u8>> {
    let name = || path.display().to_string();
    let io = |error| crate::error::Error::Io { path: name(), error };
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(crate::error::Error::Format {
            source_name: name(),
            message: "not a regular file (a directory, device, FIFO or socket): name a file".into(),
        });
    }
    std::fs::read(path).map_err(io)
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
