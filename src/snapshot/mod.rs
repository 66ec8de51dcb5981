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
    BlockInfo, BlockState, ContextInfo, DriverPool, FrameId, HistoryEntry, ScopeId, SegmentInfo, SegmentSummary,
    Snapshot, StackCapture, StackId, ThreadId,
};
pub use validate::{Inconsistency, InconsistencyKind};

/// What a file's first byte says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A pickle (protocol 2 or later starts with `PROTO`).
    Pickle,
    /// A JSON object.
    Json,
}

/// How much of a file's head [`read_input`] looks at before reading the rest.
const HEAD_BYTES: usize = 64 * 1024;

/// Reads an input file whole: only a regular file (a FIFO would block forever and a device
/// such as `/dev/zero` never ends), and only once its first bytes say it is a pickle or JSON
/// (`what` names the JSON expected), so that a large file of something else is refused after
/// reading its head, not all of it.
pub(crate) fn read_input(path: &std::path::Path, what: &str) -> crate::error::Result<Vec<u8>> {
    use std::io::Read;
    let name = || path.display().to_string();
    let io = |error| crate::error::Error::Io { path: name(), error };
    let format = |message: String| crate::error::Error::Format { source_name: name(), message };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(format("not a regular file (a directory, device, FIFO or socket): name a file".into()));
    }
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(HEAD_BYTES));
    (&mut file).take(HEAD_BYTES as u64).read_to_end(&mut data).map_err(io)?;
    if let Err(m) = sniff(&data, what) {
        let whitespace_head = data.len() == HEAD_BYTES && data.iter().all(u8::is_ascii_whitespace);
        return Err(format(if whitespace_head {
            format!("its first {} KiB are whitespace: neither a PyTorch snapshot pickle nor {what}", HEAD_BYTES / 1024)
        } else {
            m
        }));
    }
    file.read_to_end(&mut data).map_err(io)?;
    Ok(data)
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
