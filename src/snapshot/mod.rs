//! Snapshots: the model every report reads, how it is built from an allocator, and the
//! PyTorch pickle reader.

mod build;
mod model;
pub(crate) mod pickle;
mod pickle_write;
mod torch;
mod validate;

pub(crate) use build::HISTORY_REQUESTED_SINCE;
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

/// The first two bytes of a gzip stream (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The most a gzipped input may expand to. A plain file's size is bounded by the disk it lies
/// on; a gzipped one's is not (a few megabytes of gzip hold gigabytes of zeros), so past this
/// it is refused with a line that says to decompress it first.
const GUNZIPPED_MAX: u64 = 4 << 30;

/// Reads an input file whole: only a regular file (a FIFO would block forever and a device
/// such as `/dev/zero` never ends), and only once its first bytes say it is a pickle or JSON
/// (`what` names the JSON expected), so that a large file of something else is refused after
/// reading its head, not all of it. A gzipped file (`gzip` or Python's `gzip.open`, known by
/// its magic bytes, whatever its name) is read as what it holds, under the same rules.
pub(crate) fn read_input(path: &std::path::Path, what: &str) -> crate::error::Result<Vec<u8>> {
    read_input_within(path, what, GUNZIPPED_MAX)
}

/// [`read_input`], with what a gzipped file may expand to as an argument (tests use a small one).
fn read_input_within(path: &std::path::Path, what: &str, gunzipped_max: u64) -> crate::error::Result<Vec<u8>> {
    use std::io::Read;
    let name = || path.display().to_string();
    let io = |error| crate::error::Error::Io { path: name(), error };
    let format = |message: String| crate::error::Error::Format { source_name: name(), message };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(format("not a regular file (a directory, device, FIFO or socket): name a file".into()));
    }
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut magic = Vec::with_capacity(2);
    (&mut file).take(2).read_to_end(&mut magic).map_err(io)?;
    let gzipped = magic == GZIP_MAGIC;
    let mut reader: Box<dyn Read> = if gzipped {
        // One byte past the most it may expand to tells "too large" from "exactly that".
        Box::new(flate2::read::MultiGzDecoder::new(std::io::Cursor::new(magic).chain(file)).take(gunzipped_max + 1))
    } else {
        Box::new(std::io::Cursor::new(magic).chain(file))
    };
    // A corrupt or cut-off gzip stream says so, not only what the I/O layer calls it (flate2
    // reports both as one of these kinds; a failing disk stays an I/O error).
    let read_error = |error: std::io::Error| {
        use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
        if gzipped && matches!(error.kind(), InvalidData | InvalidInput | UnexpectedEof) {
            format(format!("a gzip file that does not decompress ({error}): is it whole?"))
        } else {
            io(error)
        }
    };
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(HEAD_BYTES));
    (&mut reader).take(HEAD_BYTES as u64).read_to_end(&mut data).map_err(read_error)?;
    if let Err(m) = sniff(&data, what) {
        let whitespace_head = data.len() == HEAD_BYTES && data.iter().all(u8::is_ascii_whitespace);
        let m = if whitespace_head {
            format!("its first {} KiB are whitespace: neither a PyTorch snapshot pickle nor {what}", HEAD_BYTES / 1024)
        } else {
            m
        };
        return Err(format(if gzipped { format!("gzipped; inside it, {m}") } else { m }));
    }
    reader.read_to_end(&mut data).map_err(read_error)?;
    if gzipped && data.len() as u64 > gunzipped_max {
        return Err(format(format!(
            "a gzip file that expands past {} MiB; decompress it (`gunzip -k`) and name the file it gives",
            gunzipped_max >> 20
        )));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// A file named `name` holding `data`, removed when dropped.
    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            std::fs::remove_file(&self.0).ok();
        }
    }

    impl AsRef<std::path::Path> for TempFile {
        fn as_ref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl std::ops::Deref for TempFile {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    fn file(name: &str, data: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("vramscope-read-input-{}-{name}", std::process::id()));
        std::fs::write(&path, data).unwrap();
        TempFile(path)
    }

    #[test]
    fn gzipped_input_reads_as_what_it_holds_whatever_its_name() {
        let json = br#"{"events": [["a", 1, 512, 0], ["f", 1, 512, 0]]}"#;
        for name in ["t.trace.json.gz", "t.trace.json"] {
            let path = file(name, &gzip(json));
            assert_eq!(read_input(&path, "a JSON trace").unwrap(), json);
        }
        // Two gzip members one after the other (`cat a.gz b.gz`) read as their contents joined.
        let mut two = gzip(&json[..10]);
        two.extend(gzip(&json[10..]));
        assert_eq!(read_input(&file("two.gz", &two), "a JSON trace").unwrap(), json);
        // A file of one byte, the first of gzip's two: read as a plain file, and refused as one.
        let e = read_input(&file("one", &[0x1f]), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("neither a PyTorch snapshot pickle"), "{e}");
    }

    /// A PyTorch pickle gzipped loads as the same snapshot as the pickle itself.
    #[test]
    fn a_gzipped_pytorch_pickle_loads_as_the_pickle() {
        let pickle = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch/leaky_train.snapshot.pickle");
        let gz = file("leaky_train.snapshot.pickle.gz", &gzip(&std::fs::read(pickle).unwrap()));
        let (plain, zipped) = (Snapshot::load(pickle).unwrap(), Snapshot::load(&gz).unwrap());
        assert_eq!(plain, zipped);
        assert!(!plain.history.is_empty() && !plain.segments.is_empty());
    }

    #[test]
    fn bad_gzip_says_what_is_wrong_and_where() {
        let whole = gzip(&[b'{'; 100_000]);
        let cut = file("cut.gz", &whole[..whole.len() / 2]);
        let e = read_input(&cut, "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("cut.gz") && e.contains("a gzip file that does not decompress"), "{e}");
        let e = read_input(&file("empty.gz", &gzip(b"")), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("gzipped; inside it, the file is empty"), "{e}");
        let e = read_input(&file("text.gz", &gzip(b"hello")), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("gzipped; inside it, neither a PyTorch snapshot pickle"), "{e}");
        let e = read_input(&file("spaces.gz", &gzip(&[b' '; 70_000])), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("gzipped; inside it, its first 64 KiB are whitespace"), "{e}");
    }

    /// A small gzip file that expands past the bound is refused after reading the bound, not
    /// expanded whole; one that expands to exactly the bound reads.
    #[test]
    fn gzip_that_expands_past_the_bound_is_refused() {
        let mut big = vec![b' '; 3 << 20];
        big[0] = b'{';
        let path = file("bomb.gz", &gzip(&big));
        assert!(std::fs::metadata(&path).unwrap().len() < 64 << 10);
        let e = read_input_within(&path, "a JSON trace", 2 << 20).unwrap_err().to_string();
        assert!(e.contains("a gzip file that expands past 2 MiB; decompress it (`gunzip -k`)"), "{e}");
        assert_eq!(read_input_within(&path, "a JSON trace", 3 << 20).unwrap().len(), 3 << 20);
    }
}
