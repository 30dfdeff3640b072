//! Output paths a command will write, checked before any work: a path that cannot be written
//! is refused at once, not after the dataset loads or the run ends.

use anyhow::Context;

/// Makes `dir` if it is missing and checks that it takes a new file.
pub fn check_dir_writable(dir: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{flag} {}: cannot make the directory", dir.display()))?;
    grinnder_graph::io::files::temp_in(dir, ".grinnder-write-test-")
        .map(drop)
        .with_context(|| format!("{flag} {}: cannot write into the directory", dir.display()))
}

/// Refuses an output path that cannot be written, before any work: its directory must exist
/// and take a new file.
pub fn check_writable(path: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    anyhow::ensure!(!path.is_dir(), "{flag} {} is a directory; give a file name", path.display());
    anyhow::ensure!(
        dir.is_dir(),
        "{flag} {}: the folder {} does not exist (make it first)",
        path.display(),
        dir.display()
    );
    grinnder_graph::io::files::temp_in(dir, ".grinnder-write-test-").map(drop).map_err(|e| {
        // the OS's reason without tempfile's made-up file name
        let why = e
            .raw_os_error()
            .map_or(e.kind().to_string(), |c| std::io::Error::from_raw_os_error(c).to_string());
        anyhow::anyhow!("{flag} {}: cannot write into {}: {why}", path.display(), dir.display())
    })
}

/// [`check_writable`] for an output written whole and renamed into place: refuses a path that
/// holds a device, FIFO or socket, which the rename would replace (a stream written in place,
/// such as `--metrics-out /dev/null`, may name one).
pub fn check_renamed_writable(path: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    grinnder_graph::io::files::check_replaceable(path)
        .with_context(|| format!("{flag} {}: cannot write there", path.display()))?;
    check_writable(path, flag)
}
