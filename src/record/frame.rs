//! One source location of a stack, as symbolization gives it.

use serde::{Deserialize, Serialize};

/// One source location of a stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frame {
    /// Demangled function name, without the hash suffix.
    pub function: String,
    /// Source file, where debug info has it.
    pub file: Option<String>,
    /// Line, where debug info has it.
    pub line: Option<u32>,
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) if self.function.is_empty() => write!(f, "{file}:{line}"),
            (Some(file), Some(line)) => write!(f, "{file}:{line} ({})", self.function),
            (Some(file), None) => write!(f, "{file} ({})", self.function),
            _ => f.write_str(&self.function),
        }
    }
}
