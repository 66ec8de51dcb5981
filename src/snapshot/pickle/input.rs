//! The bytes of a pickle, read from their source as the parser needs them.

use super::PickleError;

/// The pickle's bytes, read from their source a chunk at a time: a file is parsed as it is
/// read, never held whole.
pub(super) struct Reader<'s> {
    src: &'s mut dyn std::io::Read,
    buf: Vec<u8>,
    /// How much of `buf`'s allocation has been written (bytes read, or zeros put there before
    /// a read): room a read may take again without zeroing it again (zeroing a megabyte before
    /// every read was a twentieth of the parse).
    initialized: usize,
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
        Reader { src, buf: Vec::new(), initialized: 0, at: 0, base: 0, eof: false, op_at: 0 }
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
            if old + CHUNK > self.initialized {
                self.buf.resize(old + CHUNK, 0);
                self.initialized = old + CHUNK;
            } else {
                // SAFETY: `old + CHUNK` is at most `initialized`, within the allocation (which
                // only grows: nothing here shrinks it) and written before; `truncate` and
                // `drain` leave the bytes past the length as they were, so the length covers
                // written bytes only.
                unsafe { self.buf.set_len(old + CHUNK) };
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that gives at most `step` bytes a read, of the byte pattern `i * 7 + i / 251`.
    struct Trickle {
        at: usize,
        len: usize,
        step: usize,
    }

    fn byte(i: usize) -> u8 {
        (i.wrapping_mul(7) + i / 251) as u8
    }

    impl std::io::Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step).min(self.len - self.at);
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = byte(self.at + k);
            }
            self.at += n;
            Ok(n)
        }
    }

    /// Bytes read a few at a time, over several megabytes (the buffer's room used again many
    /// times), arrive as the source gave them, in order, up to the end and no further.
    #[test]
    fn short_reads_over_many_chunks_give_the_source_s_bytes() {
        let len = 3 * CHUNK + 12_345;
        let mut src = Trickle { at: 0, len, step: 100_003 };
        let mut r = Reader::new(&mut src);
        let mut pos = 0;
        for n in [1usize, 7, 4096, CHUNK - 3, 2, CHUNK + 17, 65_536].iter().cycle() {
            if pos + n > len {
                break;
            }
            let got = r.take(*n).unwrap().to_vec();
            assert!(got.iter().enumerate().all(|(k, &b)| b == byte(pos + k)), "{n} bytes at {pos}");
            pos += n;
            assert_eq!(r.pos(), pos);
            let b = r.u8().unwrap();
            assert_eq!(b, byte(pos));
            pos += 1;
        }
        let rest = len - pos;
        assert_eq!(r.take(rest).unwrap().len(), rest);
        assert!(r.u8().unwrap_err().truncated);
    }
}
