//! The bytes of a pickle, read from their source as the parser needs them.

use super::PickleError;

/// The pickle's bytes, read from their source a chunk at a time: a file is parsed as it is
/// read, never held whole.
pub(super) struct Reader<'s> {
    src: &'s mut dyn std::io::Read,
    buf: Vec<u8>,
    /// The next byte, in `buf`.
    at: usize,
    /// The offset in the data of `buf[0]`.
    base: usize,
    /// The source has no more bytes.
    eof: bool,
    /// Where the opcode being read began, in the data.
    pub(super) op_at: usize,
}

/// Bytes asked of the source at a time.
const CHUNK: usize = 1 << 20;

impl<'s> Reader<'s> {
    pub(super) fn new(src: &'s mut dyn std::io::Read) -> Self {
        Reader { src, buf: Vec::new(), at: 0, base: 0, eof: false, op_at: 0 }
    }

    /// The offset in the data of the next byte.
    pub(super) fn pos(&self) -> usize {
        self.base + self.at
    }

    pub(super) fn err(&self, message: impl Into<String>) -> PickleError {
        err_at(self.op_at, message)
    }

    /// An error of data that ends early.
    pub(super) fn short(&self, message: impl Into<String>) -> PickleError {
        PickleError { truncated: true, ..self.err(message) }
    }

    /// The bytes left in the buffer.
    pub(super) fn left(&self) -> usize {
        self.buf.len() - self.at
    }

    /// Reads until `n` bytes are in the buffer past `at`, or the source ends. The buffer grows
    /// as bytes arrive, never by what a length in the data claims.
    #[cold]
    pub(super) fn fill(&mut self, n: usize) -> Result<(), PickleError> {
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.base += self.at;
            self.at = 0;
        }
        while self.buf.len() < n && !self.eof {
            let old = self.buf.len();
            self.buf.resize(old + CHUNK, 0);
            match self.src.read(&mut self.buf[old..]) {
                Ok(0) => {
                    self.buf.truncate(old);
                    self.eof = true;
                }
                Ok(k) => self.buf.truncate(old + k),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => self.buf.truncate(old),
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(err_at(self.pos(), format!("the data could not be read: {e}")));
                }
            }
        }
        Ok(())
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        if n > self.left() {
            self.fill(n)?;
            if n > self.left() {
                return Err(self.short(format!(
                    "the data ends early: {n} bytes needed, {} left (is the file truncated?)",
                    self.left()
                )));
            }
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    #[inline]
    pub(super) fn u8(&mut self) -> Result<u8, PickleError> {
        match self.buf.get(self.at) {
            Some(&b) => {
                self.at += 1;
                Ok(b)
            }
            None => Ok(self.take(1)?[0]),
        }
    }

    /// The next `N` bytes: read in place while the buffer holds them (a memo reference's
    /// index, a length), through [`Reader::take`] where it must be filled first.
    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        match self.buf.get(self.at..self.at + N) {
            Some(b) => {
                self.at += N;
                Ok(b.try_into().expect("N bytes"))
            }
            None => Ok(self.take(N)?.try_into().expect("N bytes")),
        }
    }

    #[inline]
    pub(super) fn u16(&mut self) -> Result<u16, PickleError> {
        self.array().map(u16::from_le_bytes)
    }

    #[inline]
    pub(super) fn u32(&mut self) -> Result<u32, PickleError> {
        self.array().map(u32::from_le_bytes)
    }

    #[inline]
    pub(super) fn u64(&mut self) -> Result<u64, PickleError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length read from the data, checked against the bytes that follow it.
    pub(super) fn len(&mut self, n: u64) -> Result<usize, PickleError> {
        let fits = usize::try_from(n).ok();
        if let Some(n) = fits.filter(|&n| n > self.left()) {
            self.fill(n)?;
        }
        fits.filter(|&n| n <= self.left()).ok_or_else(|| {
            self.short(format!("a length of {n} bytes runs past the end of the data ({} left)", self.left()))
        })
    }

    pub(super) fn line(&mut self) -> Result<&[u8], PickleError> {
        let mut searched = 0;
        loop {
            if let Some(end) = self.buf[self.at + searched..].iter().position(|&b| b == b'\n') {
                let end = searched + end;
                let s = &self.buf[self.at..self.at + end];
                self.at += end + 1;
                return Ok(s);
            }
            searched = self.left();
            if self.eof {
                return Err(self.short("unterminated text argument"));
            }
            self.fill(self.left() + 1)?;
        }
    }
}

pub(super) fn err_at(offset: usize, message: impl Into<String>) -> PickleError {
    PickleError { offset, message: message.into(), truncated: false }
}
