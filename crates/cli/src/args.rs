//! Command-line flags and their validation into settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use grinnder_graph::io::{native::Verify, Format, LoadOptions};
use grinnder_graph::NonFinite;

/// Full-graph GNN training on graphs larger than GPU memory.
#[derive(Parser, Debug)]
#[command(name = "grinnder", version, about, long_about = None)]
pub struct Cli {
    /// Print only warnings and errors; no progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Worker threads (default: one per core).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a dataset's statistics and the memory full-graph training needs.
    Info(InfoArgs),
    /// Convert a dataset (OGB raw, IGB, npy) into the fast native `.grnd` file.
    Convert(ConvertArgs),
    /// Write a dataset in another layout (npy exchange, OGB raw, IGB).
    Export(ExportArgs),
    /// Generate a synthetic benchmark graph (DESIGN.md §7 presets).
    Generate(GenerateArgs),
}

/// Where a dataset comes from and how to read it.
#[derive(Args, Debug, Clone)]
pub struct Input {
    /// Dataset path: a .grnd file or an OGB, IGB or npy folder [default: the bundled Cora].
    pub dataset: Option<PathBuf>,
    /// Input layout.
    #[arg(long = "input-format", value_enum, default_value_t = InputFormat::Auto)]
    pub input_format: InputFormat,
    /// OGB split folder to use when there are several.
    #[arg(long)]
    pub split: Option<String>,
    /// NaN or infinite feature values: refuse the dataset, or report and keep them.
    #[arg(long, value_enum, default_value_t = NonFiniteArg::Refuse)]
    pub non_finite: NonFiniteArg,
    /// IGB: node count, for headerless feature files without a label file to count from.
    #[arg(long)]
    pub num_nodes: Option<u64>,
    /// IGB: number of classes (19 or 2983).
    #[arg(long, default_value_t = 19)]
    pub igb_classes: u32,
    /// Native files: skip verifying the feature checksums (for feature sections far larger than RAM).
    #[arg(long)]
    pub skip_feature_checksums: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    Auto,
    Native,
    Ogb,
    Igb,
    Npy,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFiniteArg {
    Refuse,
    Report,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub input: Input,
    /// Hidden size for the memory estimate.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Layers for the memory estimate.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// GPU memory budget to check against, e.g. 8GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_mem: Option<u64>,
    /// Host memory budget to check against, e.g. 64GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub host_mem: Option<u64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    #[command(flatten)]
    pub input: Input,
    /// Output .grnd file.
    #[arg(long, short)]
    pub out: PathBuf,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// npy exchange layout (DESIGN.md §7), read by the PyG baseline.
    Npy,
    /// OGB node-property raw layout (gzip CSV).
    Ogb,
    /// IGB processed layout (features with an npy header).
    Igb,
    /// IGB processed layout with a headerless feature file (as IGB large/full ship it).
    IgbRaw,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub input: Input,
    /// Output layout.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Output folder.
    #[arg(long, short)]
    pub out: PathBuf,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenFormat {
    Native,
    Npy,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Size preset: arxiv-like, products-like, igb-medium-like or papers-like.
    #[arg(long)]
    pub preset: String,
    /// Multiply nodes and edges by this factor (average degree is kept).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Random seed: the same seed gives the same graph on any machine and thread count.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output: a .grnd file (native) or a folder (npy).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Output layout.
    #[arg(long, value_enum, default_value_t = GenFormat::Native)]
    pub format: GenFormat,
}

impl Input {
    /// The dataset path, defaulting to the bundled Cora.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.dataset {
            return Ok(p.clone());
        }
        let candidates = [
            PathBuf::from("data/cora"),
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/cora")),
        ];
        candidates.into_iter().find(|p| p.is_dir()).ok_or_else(|| {
            anyhow::anyhow!("no dataset given and the bundled data/cora was not found; pass a DATASET path")
        })
    }

    pub fn format(&self) -> Format {
        match self.input_format {
            InputFormat::Auto => Format::Auto,
            InputFormat::Native => Format::Native,
            InputFormat::Ogb => Format::Ogb,
            InputFormat::Igb => Format::Igb,
            InputFormat::Npy => Format::Npy,
        }
    }

    pub fn options(&self) -> anyhow::Result<LoadOptions> {
        anyhow::ensure!(
            matches!(self.igb_classes, 19 | 2983),
            "--igb-classes must be 19 or 2983, got {}",
            self.igb_classes
        );
        Ok(LoadOptions {
            split: self.split.clone(),
            non_finite: match self.non_finite {
                NonFiniteArg::Refuse => NonFinite::Refuse,
                NonFiniteArg::Report => NonFinite::Report,
            },
            num_nodes: self.num_nodes,
            igb_classes: self.igb_classes,
            verify: if self.skip_feature_checksums { Verify::SkipFeatures } else { Verify::Full },
            ..LoadOptions::default()
        })
    }
}

/// Parses a byte size: `1024`, `512MiB`, `8GiB`, `1.5GB`, `2T`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| format!("{s:?} is not a size like 8GiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024f64.powi(2),
        "mb" => 1e6,
        "g" | "gib" => 1024f64.powi(3),
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        u => return Err(format!("unknown unit {u:?} in {s:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    Ok((x * mult) as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }
}
