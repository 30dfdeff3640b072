//! The graph crate's error type. Every variant that comes from outside names the file and,
//! where the format has them, the line (text) or the byte offset (binary) at fault.

use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

/// What can go wrong while building, reading or writing a graph.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The operating system refused an operation on a file. (The message includes the
    /// cause, which is therefore not also given as the error's `source`: a chain printed whole
    /// would say it twice.)
    #[error("{}: {cause}", path.display())]
    Io { path: PathBuf, cause: std::io::Error },
    /// A compressed or text stream broke off (truncated gzip, bad CRC, ...).
    #[error("{}: cannot decode after {offset} decompressed bytes: {cause}", path.display())]
    Decode { path: PathBuf, offset: u64, cause: std::io::Error },
    /// A text file has a malformed field.
    #[error("{}:{line}: {msg}", path.display())]
    Parse { path: PathBuf, line: u64, msg: String },
    /// A binary file is malformed at a byte offset.
    #[error("{}: at byte {offset}: {msg}", path.display())]
    Format { path: PathBuf, offset: u64, msg: String },
    /// A file is well formed but its content is invalid (out-of-range ids, duplicates, ...).
    #[error("{}: {msg}", path.display())]
    Invalid { path: PathBuf, msg: String },
    /// A size exceeds a documented limit of the implementation.
    #[error("limit exceeded: {what} is {value}, the maximum is {max}")]
    Limit { what: String, value: u64, max: u64 },
    /// A request that cannot be satisfied (unknown preset, bad option combination, ...).
    #[error("{0}")]
    Usage(String),
}

impl GraphError {
    pub(crate) fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        GraphError::Io { path: path.into(), cause }
    }
    pub(crate) fn parse(path: impl Into<PathBuf>, line: u64, msg: impl Into<String>) -> Self {
        GraphError::Parse { path: path.into(), line, msg: msg.into() }
    }
    pub(crate) fn format(path: impl Into<PathBuf>, offset: u64, msg: impl Into<String>) -> Self {
        GraphError::Format { path: path.into(), offset, msg: msg.into() }
    }
    pub(crate) fn invalid(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        GraphError::Invalid { path: path.into(), msg: msg.into() }
    }
}
