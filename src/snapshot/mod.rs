//! Snapshots in files: reading them (vramscope's JSON, PyTorch's pickles, gzipped or not, within
//! a read budget), writing PyTorch's pickle, and checking them. The model itself, which every
//! report reads and the allocator builds, is re-exported here from the layer below the
//! allocator.

pub(crate) mod pickle;
mod pickle_write;
mod torch;
mod validate;

pub use crate::backend::DriverPool;
pub(crate) use crate::model::ledger::{clip, push_unseen};
pub use crate::model::ledger::{
    AllocatorPart, ContextPart, DriverReading, Ledger, OwnerPart, PoolPart, SitePart, TotalSource, NOT_EXPLAINED_HINT,
    PROGRAM,
};
pub(crate) use crate::model::{stats_of, HISTORY_REQUESTED_SINCE};
pub use crate::model::{
    BlockInfo, BlockState, ContextInfo, FrameId, HistoryEntry, ScopeId, SegmentInfo, SegmentSummary, Snapshot,
    StackCapture, StackId, ThreadId, SNAPSHOT_VERSION,
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

/// How much of a file's head [`open_input`] looks at before reading the rest.
const HEAD_BYTES: usize = 64 * 1024;

/// The first two bytes of a gzip stream (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The environment variable that sets the read limit (a byte size such as `16GiB`): the most
/// a file may expand to when read, what a gzipped file decompresses to included. The command
/// line's `--read-limit` sets the same. Unset, the limit is [`default_read_limit`].
pub const READ_LIMIT_ENV: &str = "VRAMSCOPE_READ_LIMIT";

/// The read limit the process set with [`set_read_limit`] (0: none set).
static READ_LIMIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sets the read limit of every later read in this process (see [`READ_LIMIT_ENV`]); `None`
/// goes back to the environment variable or the default.
pub fn set_read_limit(bytes: Option<u64>) {
    let stored = match bytes {
        Some(b) => b.max(1),
        None => 0,
    };
    READ_LIMIT.store(stored, std::sync::atomic::Ordering::Relaxed);
}

/// What a file of `size` bytes on disk may expand to when read where nobody set a limit:
/// 64 times its size, and at least 256 MiB. Real snapshots and traces compress 5 to 20
/// times, so every real file reads; a file of gzipped zeros or spaces (over a thousand times)
/// is refused in well under a second, before it fills memory.
pub fn default_read_limit(size: u64) -> u64 {
    size.saturating_mul(64).max(256 << 20)
}

/// The read limit of one read, and where it came from (named in a refusal).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadLimit {
    pub(crate) bytes: u64,
    pub(crate) named: &'static str,
    /// Set by the user (flag or variable), not the default.
    pub(crate) explicit: bool,
}

impl ReadLimit {
    /// What the reader may keep of `read` bytes of data: the limit where the user set it; by
    /// default 16 times the data, at least 256 MiB and at most the limit. A real PyTorch
    /// snapshot's model takes about 2 to 3 times its pickle; a file whose few bytes stand for
    /// millions of entries (memo references) is refused before they are made.
    pub(crate) fn keep(&self, read: u64) -> (u64, String) {
        let keep = self.keep_bytes(read);
        if self.explicit {
            (keep, format!("the read limit of {} ({})", crate::error::fmt_bytes(self.bytes), self.named))
        } else {
            (keep, format!("{}, 16 times the data read and at least 256 MiB", crate::error::fmt_bytes(keep)))
        }
    }

    /// [`ReadLimit::keep`]'s bytes alone (nothing formatted: the reader asks once an event).
    pub(crate) fn keep_bytes(&self, read: u64) -> u64 {
        if self.explicit {
            self.bytes
        } else {
            read.saturating_mul(16).max(256 << 20).min(self.bytes)
        }
    }
}

/// The read limit for a file of `size` bytes on disk: the one `--read-limit` set, else
/// [`READ_LIMIT_ENV`], else [`default_read_limit`].
pub(crate) fn read_limit(size: u64) -> crate::error::Result<ReadLimit> {
    let set = READ_LIMIT.load(std::sync::atomic::Ordering::Relaxed);
    if set != 0 {
        return Ok(ReadLimit { bytes: set, named: "the read limit set by --read-limit", explicit: true });
    }
    match crate::error::env_text(READ_LIMIT_ENV)? {
        None => Ok(ReadLimit {
            bytes: default_read_limit(size),
            named: "the default read limit, 64 times the file's size and at least 256 MiB",
            explicit: false,
        }),
        Some(text) => {
            let bytes = crate::units::parse_byte_size(&text).map_err(|e| crate::error::Error::Config {
                key: READ_LIMIT_ENV.into(),
                message: format!("`{text}`: {e} (e.g. {READ_LIMIT_ENV}=16GiB)"),
            })?;
            Ok(ReadLimit { bytes: bytes.max(1), named: READ_LIMIT_ENV, explicit: true })
        }
    }
}

/// Reads an input file whole, as [`open_input`] opens it (the tests' way to read one).
#[cfg(test)]
fn read_input(path: &std::path::Path, what: &str) -> crate::error::Result<(Vec<u8>, ReadLimit)> {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let limit = read_limit(size)?;
    Ok((read_input_within(path, what, limit.bytes, limit.named)?, limit))
}

/// [`read_input`], with the read limit as an argument (tests use a small one).
#[cfg(test)]
fn read_input_within(path: &std::path::Path, what: &str, limit: u64, named: &str) -> crate::error::Result<Vec<u8>> {
    open_input_within(path, what, limit, named)?.read_all()
}

/// An input file opened for reading: what its head says it is, and its bytes, the head first,
/// read as the reader asks for them and counted against the read limit. A gzipped file is
/// decompressed on a thread of its own, ahead of the reader.
pub(crate) struct Input {
    pub(crate) kind: FileKind,
    head: std::io::Cursor<Vec<u8>>,
    rest: Box<dyn std::io::Read + Send>,
    /// Bytes read, the head's included.
    read: u64,
    limit: u64,
    named: String,
    name: String,
    /// The file's size on disk.
    size: u64,
    gzipped: bool,
    /// Why a read failed, as the error to report (the reader sees an I/O error only).
    failure: Option<crate::error::Error>,
}

/// Opens an input file, reading its head only: only a regular file (a FIFO would block forever
/// and a device such as `/dev/zero` never ends), and only once its first bytes say it is a
/// pickle or JSON (`what` names the JSON expected) and parse as the start of one, so that a
/// large file of something else is refused after reading its head, not all of it. A gzipped
/// file (`gzip` or Python's `gzip.open`, known by its magic bytes, whatever its name) is read as
/// what it holds, under the same rules. What a file expands to is bounded by the read limit
/// ([`READ_LIMIT_ENV`]), named in the refusal; memory the reader cannot have is an error, not an
/// abort.
///
/// Returns the file, to be read as a stream or whole ([`Input::read_all`]), and the read limit,
/// which also bounds what the reader builds of it.
pub(crate) fn open_input(path: &std::path::Path, what: &str) -> crate::error::Result<(Input, ReadLimit)> {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let limit = read_limit(size)?;
    Ok((open_input_within(path, what, limit.bytes, limit.named)?, limit))
}

fn open_input_within(path: &std::path::Path, what: &str, limit: u64, named: &str) -> crate::error::Result<Input> {
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
    // One byte past the limit tells "too large" from "exactly that".
    let rest: Box<dyn Read + Send> = if gzipped {
        let input = std::io::BufReader::new(std::io::Cursor::new(magic).chain(file));
        Box::new(Ahead::spawn(GzMembers::new(input).take(limit.saturating_add(1))))
    } else {
        Box::new(std::io::Cursor::new(magic).chain(file))
    };
    let mut input = Input {
        kind: FileKind::Json,
        head: std::io::Cursor::new(Vec::new()),
        rest,
        read: 0,
        limit,
        named: named.to_string(),
        name: name(),
        size: meta.len(),
        gzipped,
        failure: None,
    };
    if !gzipped && meta.len() > limit {
        return Err(input.too_large());
    }
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(HEAD_BYTES));
    if let Err(e) = (&mut input).take(HEAD_BYTES as u64).read_to_end(&mut data) {
        return Err(input.failure.take().unwrap_or_else(|| io(e)));
    }
    let inside = |m: String| format(if gzipped { format!("gzipped; inside it, {m}") } else { m });
    input.kind = match sniff(&data, what) {
        Err(m) => {
            let whitespace_head = data.len() == HEAD_BYTES && data.iter().all(u8::is_ascii_whitespace);
            return Err(inside(if whitespace_head {
                format!(
                    "its first {} KiB are whitespace: neither a PyTorch snapshot pickle nor {what}",
                    HEAD_BYTES / 1024
                )
            } else {
                m
            }));
        }
        Ok(kind) => kind,
    };
    match input.kind {
        // The head must parse as the start of what it claims to be: a file whose third byte
        // is already wrong is refused now, not after gigabytes were read.
        FileKind::Pickle => pickle::check_head(&data).map_err(|e| inside(e.to_string()))?,
        FileKind::Json => {
            let mut values = serde_json::Deserializer::from_slice(&data).into_iter::<serde::de::IgnoredAny>();
            if let Some(Err(e)) = values.next() {
                if e.classify() != serde_json::error::Category::Eof {
                    return Err(inside(format!("not JSON: {e}")));
                }
            }
        }
    }
    input.head = std::io::Cursor::new(data);
    Ok(input)
}

impl Input {
    fn format(&self, message: String) -> crate::error::Error {
        crate::error::Error::Format { source_name: self.name.clone(), message }
    }

    fn too_large(&self) -> crate::error::Error {
        let what = if self.gzipped {
            "a gzip file that expands past".to_string()
        } else {
            format!("a file of {}, over", crate::error::fmt_bytes(self.size))
        };
        self.format(format!(
            "{what} the read limit of {} ({}); to read it, set a larger one (--read-limit SIZE, or \
             {READ_LIMIT_ENV}=SIZE){}",
            crate::error::fmt_bytes(self.limit),
            self.named,
            if self.gzipped { ", or decompress it first" } else { "" }
        ))
    }

    /// The file's size on disk where its bytes are read as they are (not gzipped).
    pub(crate) fn plain_size(&self) -> Option<u64> {
        (!self.gzipped).then_some(self.size)
    }

    /// The error that stopped a read, once (the reader of [`Input`] sees an I/O error only).
    pub(crate) fn failure(&mut self) -> Option<crate::error::Error> {
        self.failure.take()
    }

    /// Reads the rest of the file, and returns it all.
    pub(crate) fn read_all(mut self) -> crate::error::Result<Vec<u8>> {
        use std::io::Read;
        let mut data = std::mem::take(self.head.get_mut());
        // Where the size is known, the memory is taken at once, and refused as an error.
        let expected = if self.gzipped { 0 } else { usize::try_from(self.size).unwrap_or(usize::MAX) };
        data.try_reserve_exact(expected.saturating_sub(data.len())).map_err(|_| {
            self.format(format!("{} of memory to read it could not be had", crate::error::fmt_bytes(self.size)))
        })?;
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let n = match self.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let name = self.name.clone();
                    return Err(self.failure().unwrap_or(crate::error::Error::Io { path: name, error: e }));
                }
            };
            data.try_reserve(n).map_err(|_| {
                self.format(format!(
                    "memory to read past {} could not be had",
                    crate::error::fmt_bytes(data.len() as u64)
                ))
            })?;
            data.extend_from_slice(&chunk[..n]);
        }
        Ok(data)
    }
}

impl std::io::Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.head.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        match self.rest.read(buf) {
            Ok(n) => {
                self.read += n as u64;
                // The head was read from `rest` too: counted once, in `read`.
                if self.read > self.limit {
                    self.failure = Some(self.too_large());
                    return Err(std::io::Error::other("past the read limit"));
                }
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(e),
            Err(error) => {
                // A corrupt or cut-off gzip stream says so, not only what the I/O layer calls
                // it (flate2 reports both as one of these kinds; a failing disk stays an I/O
                // error).
                use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
                let message = error.to_string();
                self.failure =
                    Some(if self.gzipped && matches!(error.kind(), InvalidData | InvalidInput | UnexpectedEof) {
                        self.format(format!("a gzip file that does not decompress ({error}): is it whole?"))
                    } else {
                        crate::error::Error::Io { path: self.name.clone(), error }
                    });
                Err(std::io::Error::other(message))
            }
        }
    }
}

/// A reader that reads its source on a thread of its own, a few chunks ahead of its user:
/// decompression runs on another core while the parser works. The thread ends when the data
/// does, on an error, or when the user drops the reader.
struct Ahead {
    chunks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: std::io::Cursor<Vec<u8>>,
    done: bool,
}

impl Ahead {
    fn spawn(mut source: impl std::io::Read + Send + 'static) -> Ahead {
        let (tx, chunks) = std::sync::mpsc::sync_channel(4);
        let spawned = std::thread::Builder::new().name("vramscope-read".into()).spawn(move || loop {
            let mut chunk = vec![0u8; 1 << 20];
            match source.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    chunk.truncate(n);
                    if tx.send(Ok(chunk)).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    break;
                }
            }
        });
        let done = spawned.is_err();
        Ahead { chunks, chunk: std::io::Cursor::new(Vec::new()), done }
    }
}

impl std::io::Read for Ahead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.chunk.read(buf)?;
            if n > 0 || buf.is_empty() || self.done {
                return Ok(n);
            }
            match self.chunks.recv() {
                Ok(Ok(chunk)) => self.chunk = std::io::Cursor::new(chunk),
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => self.done = true,
            }
        }
    }
}

/// The gzip members of a stream one after the other (`cat a.gz b.gz`), as `gzip -d` reads them:
/// zero bytes after the last member (padding a tape or a block device leaves) end the data;
/// other bytes there are an error.
struct GzMembers<R: std::io::BufRead> {
    member: Option<flate2::bufread::GzDecoder<R>>,
}

impl<R: std::io::BufRead> GzMembers<R> {
    fn new(input: R) -> Self {
        GzMembers { member: Some(flate2::bufread::GzDecoder::new(input)) }
    }
}

impl<R: std::io::BufRead> std::io::Read for GzMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(member) = self.member.as_mut() else { return Ok(0) };
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This member ended: another follows, zeros pad the end, or something else does.
            let mut rest = self.member.take().expect("a member was being read").into_inner();
            let next = rest.fill_buf()?;
            if next.is_empty() {
                return Ok(0);
            }
            if next.starts_with(&GZIP_MAGIC) || next.len() == 1 && next[0] == GZIP_MAGIC[0] {
                self.member = Some(flate2::bufread::GzDecoder::new(rest));
                continue;
            }
            loop {
                let next = rest.fill_buf()?;
                if next.is_empty() {
                    return Ok(0);
                }
                if next.iter().any(|&b| b != 0) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "bytes after the gzip data that are neither zeros nor another gzip member",
                    ));
                }
                let n = next.len();
                rest.consume(n);
            }
        }
    }
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
            assert_eq!(read_input(&path, "a JSON trace").unwrap().0, json);
        }
        // Two gzip members one after the other (`cat a.gz b.gz`) read as their contents joined.
        let mut two = gzip(&json[..10]);
        two.extend(gzip(&json[10..]));
        assert_eq!(read_input(&file("two.gz", &two), "a JSON trace").unwrap().0, json);
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
        let mut whole = vec![b' '; 100_000];
        whole[0] = b'{';
        let whole = gzip(&whole);
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

    /// Zeros after the gzip data (padding) end it, as `gzip -d` reads them; other bytes there
    /// are an error.
    #[test]
    fn zeros_after_gzip_data_are_padding() {
        let json = br#"{"events": [["a", 1, 512, 0]]}"#;
        let mut padded = gzip(json);
        padded.extend([0u8; 4096]);
        assert_eq!(read_input(&file("padded.gz", &padded), "a JSON trace").unwrap().0, json);
        let mut garbage = gzip(json);
        garbage.extend(b"trailing");
        let e = read_input(&file("garbage.gz", &garbage), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("neither zeros nor another gzip member"), "{e}");
    }

    /// A file whose first bytes already cannot begin a pickle or JSON is refused from its head,
    /// however long it is; a head that is only cut short reads on.
    #[test]
    fn a_head_that_cannot_begin_a_file_is_refused_at_once() {
        let mut json = vec![0u8; 1 << 20];
        json[0] = b'{';
        let e = read_input(&file("nul.json", &json), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("not JSON"), "{e}");
        let mut pickle = vec![0u8; 1 << 20];
        pickle[..2].copy_from_slice(&[0x80, 4]);
        let e = read_input(&file("nul.pickle", &pickle), "a JSON trace").unwrap_err().to_string();
        assert!(e.contains("invalid pickle at byte 2"), "{e}");
        // A real pickle's head, cut anywhere, is only short.
        let real =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch/leaky_train.snapshot.pickle")).unwrap();
        for cut in [2, 3, 100, 4096, HEAD_BYTES] {
            assert!(pickle::check_head(&real[..cut]).is_ok(), "cut at {cut}");
        }
    }

    /// The read limit: the default scales with the file, a set one applies to plain files too,
    /// and each refusal names the limit and how to raise it.
    #[test]
    fn the_read_limit_is_named_in_its_refusal() {
        assert_eq!(default_read_limit(1 << 20), 256 << 20);
        assert_eq!(default_read_limit(1 << 30), 64 << 30);
        let path = file("plain.json", br#"{"events": []}"#);
        let e = read_input_within(&path, "a JSON trace", 4, "VRAMSCOPE_READ_LIMIT").unwrap_err().to_string();
        assert!(e.contains("a file of 14 B, over the read limit of 4 B (VRAMSCOPE_READ_LIMIT)"), "{e}");
        assert!(!e.contains("decompress"), "{e}");
    }

    /// A small gzip file that expands past the bound is refused after reading the bound, not
    /// expanded whole; one that expands to exactly the bound reads.
    #[test]
    fn gzip_that_expands_past_the_bound_is_refused() {
        let mut big = vec![b' '; 3 << 20];
        big[0] = b'{';
        let path = file("bomb.gz", &gzip(&big));
        assert!(std::fs::metadata(&path).unwrap().len() < 64 << 10);
        let e = read_input_within(&path, "a JSON trace", 2 << 20, "a test's limit").unwrap_err().to_string();
        assert!(e.contains("a gzip file that expands past the read limit of 2.00 MiB (a test's limit)"), "{e}");
        assert!(e.contains("--read-limit SIZE, or VRAMSCOPE_READ_LIMIT=SIZE), or decompress it first"), "{e}");
        assert_eq!(read_input_within(&path, "a JSON trace", 3 << 20, "a test's limit").unwrap().len(), 3 << 20);
        // Read as a stream (as a pickle is parsed), the same bytes under the same limit.
        let mut all = Vec::new();
        let mut input = open_input_within(&path, "a JSON trace", 3 << 20, "a test's limit").unwrap();
        std::io::Read::read_to_end(&mut input, &mut all).unwrap();
        assert_eq!(all.len(), 3 << 20);
        let mut input = open_input_within(&path, "a JSON trace", (3 << 20) - 1, "a test's limit").unwrap();
        assert!(std::io::Read::read_to_end(&mut input, &mut Vec::new()).is_err());
        let e = input.failure().unwrap().to_string();
        assert!(e.contains("a gzip file that expands past the read limit"), "{e}");
    }
}
