//! The rates `grinnder bench rates` measures and `info` and `train` predict an epoch's time
//! from: where they live, and reading them.

use std::path::{Path, PathBuf};

use anyhow::Context;
use grinnder_engine::tiered::Rates;

use crate::args::default_cache_dir;
use crate::plan::{Device, TrainPlan};

/// Where `grinnder bench rates` writes the rates of a device (`cpu` or `cuda`), and `info` and
/// `train` look for them.
pub fn default_rates_file(device: &str) -> Option<PathBuf> {
    default_cache_dir().map(|d| d.join(format!("rates-{device}.json")))
}

/// Rates from `path`, written by `grinnder bench rates`.
pub fn read_rates(path: &Path) -> anyhow::Result<Rates> {
    let text = grinnder_graph::io::files::read_text_bounded(path, 1 << 20, "rates file")
        .with_context(|| format!("cannot read the rates in {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not rates as `grinnder bench rates` writes them", path.display()))
}

/// The rates `grinnder bench rates` wrote for the plan's device, where they exist.
pub fn default_rates(plan: &TrainPlan) -> anyhow::Result<Option<(Rates, PathBuf)>> {
    let kind = match plan.device {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
    };
    match default_rates_file(kind).filter(|p| p.is_file()) {
        Some(p) => Ok(Some((read_rates(&p)?, p))),
        None => Ok(None),
    }
}
