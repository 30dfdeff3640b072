//! Loading the dataset a command names (shared by the subcommands and the benchmarks).

use std::time::Instant;

use anyhow::Context;
use grinnder_graph::{io, Dataset};

use crate::args::Input;

/// The dataset `input` names, and the seconds it took to load.
pub fn load(input: &Input) -> anyhow::Result<(Dataset, f64)> {
    let path = input.path()?;
    let t = Instant::now();
    let ds = io::open(&path, input.format(), &input.options()?)
        .with_context(|| format!("cannot load {}", path.display()))?;
    Ok((ds, t.elapsed().as_secs_f64()))
}
