//! Snapshots: the model every report reads, how it is built from an allocator, and the
//! PyTorch pickle reader.

mod build;
mod model;
pub(crate) mod pickle;
mod pickle_write;
mod torch;

pub use build::SNAPSHOT_VERSION;
pub use model::{BlockInfo, BlockState, ContextInfo, HistoryEntry, SegmentInfo, Snapshot};
