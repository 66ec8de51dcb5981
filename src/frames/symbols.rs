//! Symbolization of interned stacks, once per address, with frames of vramscope, std and the
//! unwinder trimmed (by this module's rules: [`is_harness`](super::is_harness),
//! [`is_captures_own`](super::is_captures_own)).

use crate::frames;
use crate::record::Frame;
use std::collections::HashMap;

/// A source path as reports show it: relative to the working directory when it lies below
/// it (so that reports read the same on every machine), else as it is.
fn relative(path: &std::path::Path) -> String {
    static CWD: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let cwd = CWD.get_or_init(|| std::env::current_dir().ok());
    cwd.as_deref().and_then(|c| path.strip_prefix(c).ok()).unwrap_or(path).display().to_string()
}

/// The name of a memory test's body where debug info names it without its path (inlined, in a
/// build with line tables only: `{closure#0}`); its `file:line` is known.
pub(crate) const TEST_BODY: &str = "the memory test's body";

/// The frame that stands for a memory-test body whose own frames cannot be seen: inlined into
/// the harness in a build without line tables, where the symbol table names only the harness.
pub(crate) const INLINED_TEST_BODY: &str = "the memory test's body (inlined; no line tables in this build)";

/// The frame that stands for code of the program inlined into library frames (a spawned
/// thread's closure inlined into the standard library's thread start, in a build with symbols
/// only).
pub(crate) const INLINED_ELSEWHERE: &str = "code inlined into library frames (no line tables in this build)";

/// Resolves instruction pointers to frames, caching every address.
#[derive(Default)]
pub(crate) struct Symbolizer {
    cache: HashMap<usize, (Vec<Frame>, bool)>,
}

impl Symbolizer {
    /// The frames of return address `ip`, innermost (inlined) first, with trimmed frames
    /// removed, and whether the memory-test harness is among them (then the frames stop at it
    /// and the stack ends there).
    pub(crate) fn resolve(&mut self, ip: usize) -> (&[Frame], bool) {
        let (frames, harness) = self.cache.entry(ip).or_insert_with(|| {
            let mut frames = Vec::new();
            // A return address points after the call; look up the call itself.
            let lookup = ip.saturating_sub(1);
            backtrace::resolve(lookup as *mut std::ffi::c_void, |sym| {
                let function = sym.name().map_or_else(|| "<unknown>".to_string(), |n| format!("{n:#}"));
                let file = sym.filename().map(|p| p.display().to_string());
                frames.push(Frame { function, file, line: sym.lineno() });
            });
            // Where the memory-test harness called a test body, the stack ends.
            let harness = frames.iter().position(|f| frames::is_harness(&f.function, f.file.as_deref()));
            if let Some(k) = harness {
                frames.truncate(k);
                // The frame the harness called is the test's body. Inlined, in a build with
                // line tables only, debug info names it without its path (`{closure#0}`):
                // say what it is.
                if let Some(body) = frames.last_mut().filter(|f| !f.function.contains("::")) {
                    body.function = TEST_BODY.to_string();
                }
            }
            frames.retain(|f| !frames::is_captures_own(f));
            for f in &mut frames {
                f.file = f.file.take().map(|p| relative(std::path::Path::new(&p)));
            }
            (frames, harness.is_some())
        });
        (frames, *harness)
    }

    /// Addresses resolved so far.
    #[cfg(test)]
    pub(crate) fn resolved(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn some_function() -> usize {
        std::hint::black_box(7)
    }

    #[test]
    fn caches_each_address_once() {
        let mut s = Symbolizer::default();
        let ip = some_function as fn() -> usize as usize + 4;
        let a = s.resolve(ip).0.to_vec();
        let b = s.resolve(ip).0.to_vec();
        assert_eq!(a, b);
        assert_eq!(s.resolved(), 1);
    }
}
