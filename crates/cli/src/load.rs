//! Loading the dataset a command names (shared by the subcommands and the benchmarks): the
//! messages a first run meets (a mistyped path, labels that leave classes empty) are made here.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use grinnder_graph::{io, Dataset};

use crate::args::Input;

/// The dataset `input` names, and the seconds it took to load.
pub fn load(input: &Input) -> anyhow::Result<(Dataset, f64)> {
    let path = input.path()?;
    let t = Instant::now();
    let ds = open(&path, input, None)?;
    Ok((ds, t.elapsed().as_secs_f64()))
}

/// What a compressed archive's declared sizes must fit before it is inflated: `host_mem` (the
/// run's --host-mem), else the memory this machine has available (cgroup and ulimit -v counted).
pub fn memory_limit(host_mem: Option<u64>) -> Option<io::MemoryLimit> {
    match host_mem {
        Some(bytes) => Some(io::MemoryLimit { bytes, source: "--host-mem".into() }),
        None => grinnder_engine::machine::HostMemory::read()
            .usable()
            .map(|bytes| io::MemoryLimit { bytes, source: "memory this machine has available".into() }),
    }
}

/// Opens the dataset at `path` as `input` says, then applies `--num-classes` and warns about
/// classes without a node.
/// `host_mem`: the run's --host-mem, under which (else under the machine's available memory)
/// a compressed archive's declared sizes must fit before it is inflated.
pub fn open(path: &Path, input: &Input, host_mem: Option<u64>) -> anyhow::Result<Dataset> {
    if std::fs::symlink_metadata(path).is_err() {
        anyhow::bail!("{}: no such file or folder{}", path.display(), suggestion(path));
    }
    let phase = grinnder_graph::progress::phase(&format!("loading {}", path.display()));
    let mut opts = input.options()?;
    opts.memory_limit = memory_limit(host_mem);
    let mut ds =
        io::open(path, input.format(), &opts).with_context(|| format!("cannot load {}", path.display()))?;
    drop(phase);
    settle_classes(&mut ds, input.num_classes)?;
    Ok(ds)
}

/// Sets the class count to `num_classes` where given (refused below the labels' largest + 1);
/// else warns when classes up to the largest label have no node.
pub fn settle_classes(ds: &mut Dataset, num_classes: Option<u32>) -> anyhow::Result<()> {
    if let Some(c) = num_classes {
        let seen = ds.labels.iter().copied().max().map_or(0, |m| (m + 1).max(0) as u32);
        anyhow::ensure!(
            c >= seen,
            "--num-classes {c}: the labels go up to {}, so there are at least {seen} classes",
            seen.saturating_sub(1)
        );
        ds.num_classes = c;
    }
    warn_empty_classes(ds, num_classes.is_some());
    Ok(())
}

/// Warns when classes up to the largest label have no node (unless the user set the count):
/// labels that are not `0..K` (a label of 1000 in a 4-class graph makes 1,001 outputs) train a
/// model with dead outputs.
fn warn_empty_classes(ds: &Dataset, counted_by_user: bool) {
    let classes = ds.num_classes as usize;
    if classes == 0 || counted_by_user || ds.labels.iter().all(|&y| y < 0) {
        return;
    }
    // the distinct labels, not a count per class: --num-classes may be far more than the nodes
    let mut seen: Vec<i32> = ds.labels.iter().copied().filter(|&y| y >= 0).collect();
    seen.sort_unstable();
    seen.dedup();
    let empty = classes - seen.len();
    if empty == 0 {
        return;
    }
    let first: Vec<String> = (0..classes as i32)
        .filter(|k| seen.binary_search(k).is_err())
        .take(5)
        .map(|k| k.to_string())
        .collect();
    tracing::warn!(
        "{}: {empty} of its {classes} classes have no node (classes {}{}): the model gets {classes} outputs because the largest label is {}; if the labels are not 0..K-1, renumber them (numpy: `np.unique(y, return_inverse=True)`), or set the count with --num-classes",
        ds.name,
        first.join(", "),
        if empty > 5 { ", …" } else { "" },
        classes - 1
    );
}

/// ", did you mean …?" for a path whose folder holds names close to its own.
fn suggestion(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return format!(" (nor is {})", dir.display());
    };
    let close = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|c| !c.starts_with('.'))
        .map(|c| (strsim::levenshtein(&name, &c), c))
        .filter(|(d, c)| *d <= 2.max(name.len() / 4) || c.starts_with(name.as_str()))
        .min();
    match close {
        Some((_, c)) => format!("; did you mean {}?", dir.join(c).display()),
        None => "; give a .grnd file or an OGB, IGB or npy dataset folder (docs/datasets.md)".into(),
    }
}
