//! Command-line flags and their validation into settings.

pub use crate::bytes::parse_bytes;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use grinnder_graph::io::{native::Verify, Format, LoadOptions};
use grinnder_graph::{BuildOptions, NonFinite};

/// Full-graph GNN training on graphs larger than GPU memory.
#[derive(Parser, Debug)]
#[command(name = "grinnder", version, about, long_about = None)]
pub struct Cli {
    /// Print only warnings and errors; no progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Print debug detail too: per-epoch I/O and phase figures, the memory plan (RUST_LOG
    /// overrides both this and --quiet, e.g. RUST_LOG=grinnder_engine=trace).
    #[arg(long, short, global = true, conflicts_with = "quiet")]
    pub verbose: bool,
    /// Worker threads (default: one per core; under mpirun, the machine's cores shared by its ranks).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a GNN on a dataset, full-graph (every node and edge, every epoch).
    Train(Box<TrainArgs>),
    /// Run a trained model (a --save-model file, or a PyG model saved as safetensors) on a dataset:
    /// per-node logits, probabilities or classes, hidden layers' outputs, as .npy in node order.
    Predict(Box<PredictArgs>),
    /// Partition a dataset and print the quality of the partitioning.
    Partition(PartitionArgs),
    /// Print a dataset's statistics and the memory full-graph training needs; with train's
    /// tiered settings, the memory plan and an epoch's predicted traffic and time.
    Info(Box<InfoArgs>),
    /// Convert a dataset (OGB raw, IGB, npy) into the fast native `.grnd` file.
    Convert(ConvertArgs),
    /// Write a dataset in another layout (npy exchange, OGB raw, IGB).
    Export(ExportArgs),
    /// Generate a synthetic benchmark graph from a preset (docs/datasets.md).
    Generate(GenerateArgs),
    /// Microbenchmarks (GPU gather, transfer, SpMM, GEMM, launches; CPU sampling), cost-model rates: JSON.
    Bench(BenchArgs),
    /// Draw the speed-up of runs on several GPUs (or ranks) over one, from their metrics files.
    PlotScaling(PlotScalingArgs),
    /// Remove the storage directories (grinnder-run-…) that killed runs left in a --storage-dir:
    /// this machine's whose process is gone; live runs and other machines' are listed and kept.
    Clean {
        /// The directory given to --storage-dir.
        dir: PathBuf,
        /// List what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Args, Debug)]
pub struct PlotScalingArgs {
    /// Runs as SERIES:GPUS=METRICS, where METRICS is a run's --metrics-out file (its median
    /// epoch time is used); each series needs its one-GPU run, e.g.
    /// gcn:1=gcn-1gpu.jsonl gcn:2=gcn-2gpu.jsonl
    #[arg(required = true)]
    pub runs: Vec<String>,
    /// The PNG to write.
    #[arg(long)]
    pub out: PathBuf,
    /// The figure's title.
    #[arg(long, default_value = "speed-up over one GPU")]
    pub title: String,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Where to measure: cuda or cuda:N [default: cuda; `rates`: cpu, as train's default;
    /// `sample` runs on the CPU].
    #[arg(long, global = true)]
    pub device: Option<String>,
    /// Timed repetitions (the median is reported).
    #[arg(long, global = true, default_value_t = 5)]
    pub reps: usize,
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Subcommand, Debug)]
pub enum BenchWhat {
    /// Random rows of a pinned host table into the GPU: CPU gather + copy (pinned, pageable),
    /// zero-copy (GPU threads read the mapped rows), a plain copy, a gather in GPU memory.
    Gather {
        /// Rows gathered.
        #[arg(long, default_value_t = 500_000)]
        rows: usize,
        /// Floats per row.
        #[arg(long, default_value_t = 256)]
        width: usize,
        /// Rows of the host table (default: products-like's node count).
        #[arg(long, default_value_t = 2_449_029)]
        table_rows: usize,
    },
    /// Host ↔ GPU copy bandwidth from pageable and pinned memory, and the time to page-lock
    /// host memory (cuMemHostAlloc against faulting in on every core, then cuMemHostRegister).
    Transfer {
        /// Bytes per copy, e.g. 1GiB.
        #[arg(long, value_parser = parse_bytes, default_value = "1GiB")]
        bytes: u64,
    },
    /// GCN-normalised `Â·X` and `Âᵀ·X` on a graph at several widths: grinnder's kernels
    /// (shape-chosen and the general one), cuSPARSE, and what the automatic choice picks.
    Spmm {
        #[command(flatten)]
        input: Input,
        /// Feature widths.
        #[arg(long, value_delimiter = ',', default_value = "16,47,64,100,128,256")]
        widths: Vec<usize>,
    },
    /// Dense `C = op(A)·op(B)` through the backend's GEMM at one shape, each transposition, FP32 and TF32.
    Gemm {
        /// Rows of C.
        #[arg(long, default_value_t = 140_000)]
        m: usize,
        /// The inner dimension.
        #[arg(long, default_value_t = 100)]
        k: usize,
        /// Columns of C.
        #[arg(long, default_value_t = 256)]
        n: usize,
        /// Each timed run one row fewer than the last (a new shape every call, as mini-batches
        /// have).
        #[arg(long)]
        vary: bool,
    },
    /// The host's cost per small GPU operation: rounds of allocate, copy, ReLU and free on a
    /// 256 × 64 matrix, queued without waiting, before and after the backend's second stream
    /// exists (with GRINNDER_CUDA_EVENT_TRACKING=on, cudarc then tracks every allocation and
    /// kernel argument with events; grinnder orders its streams itself by default).
    Launches {
        /// Rounds per timed run.
        #[arg(long, default_value_t = 10_000)]
        ops: usize,
    },
    /// The rates `info` and `train` predict an epoch's time from, on --device (cpu or cuda):
    /// dense and sparse products, element-wise kernels, transfers, host copies, and with
    /// --storage-dir the block files; JSON to --out [default: rates-cpu.json or rates-cuda.json
    /// in the cache directory, where `info` and `train` look].
    Rates {
        /// Directory whose storage to measure (as train's --storage-dir).
        #[arg(long)]
        storage_dir: Option<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Mini-batch loading on the CPU, as the trainer's sampling threads do it (any machine):
    /// GraphSAGE neighbour sampling of an epoch's batches, alone and followed by the CPU
    /// gather of each batch's input rows (the work `--feature-access copy` adds to them).
    Sample {
        #[command(flatten)]
        input: Input,
        /// Neighbours per node and hop, from the seeds outwards (-1: all).
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true, default_value = "15,10,5")]
        fanout: Vec<i64>,
        /// Seed nodes per batch.
        #[arg(long, default_value_t = 1024)]
        batch_size: usize,
        /// Sampling threads, each taking whole batches [default: as `train` picks].
        #[arg(long)]
        loader_threads: Option<usize>,
        /// Batches per run [default: one epoch's].
        #[arg(long)]
        max_batches: Option<usize>,
    },
}

/// Where a dataset comes from and how to read it.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Data")]
pub struct Input {
    /// Dataset path: a .grnd file or an OGB, IGB or npy folder [default: the bundled Cora].
    pub dataset: Option<PathBuf>,
    /// Input layout.
    #[arg(long = "input-format", ignore_case = true, value_enum, default_value_t = InputFormat::Auto)]
    pub input_format: InputFormat,
    /// OGB split folder to use when there are several.
    #[arg(long)]
    pub split: Option<String>,
    /// NaN or infinite feature values: refuse the dataset, or report and keep them.
    #[arg(long, ignore_case = true, value_enum, default_value_t = NonFiniteArg::Refuse)]
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
    /// Accept a dataset whose splits share nodes (warned about) instead of refusing it.
    #[arg(long)]
    pub allow_split_overlap: bool,
    /// Take the edges as given instead of making them symmetric: each node aggregates over its
    /// in-neighbours (PyG's flow: edge_index[0] the source, edge_index[1] the target). A model
    /// file records it; predict with the same flag. Edge weights (GCN alone takes them): an npy
    /// folder's edge_weight.npy, a .grnd file's own, with or without this flag.
    #[arg(long)]
    pub directed: bool,
    /// Number of classes, when the labels do not reach the last one [default: the largest label + 1].
    #[arg(long)]
    pub num_classes: Option<u32>,
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

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionerArg {
    Metis,
    // the default: the parallel multilevel partitioner
    #[default]
    Multilevel,
    Spinner,
    Lpa,
    Random,
    Contiguous,
}

#[derive(Args, Debug)]
pub struct PartitionArgs {
    #[command(flatten)]
    pub input: Input,
    /// Number of partitions (one or more values, comma separated).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub parts: Vec<usize>,
    /// Partitioner: multilevel k-way on every core, METIS k-way (one core), Spinner,
    /// dependency-aware LPA (halo volume), random, contiguous.
    #[arg(long, ignore_case = true, value_enum, default_value_t)]
    pub partitioner: PartitionerArg,
    /// Seed of randomised partitioners.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object per partition count instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Cache partitionings here [default: $XDG_CACHE_HOME/grinnder, else ~/.cache/grinnder].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Neither read nor write the partition cache.
    #[arg(long)]
    pub no_cache: bool,
}

/// The partition cache directory: `$XDG_CACHE_HOME/grinnder`, else `~/.cache/grinnder`.
pub fn default_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("grinnder"))
}

impl PartitionerArg {
    /// As `--partitioner` takes it: `metis`, `spinner`, ….
    pub fn name(self) -> &'static str {
        match self {
            PartitionerArg::Metis => "metis",
            PartitionerArg::Multilevel => "multilevel",
            PartitionerArg::Spinner => "spinner",
            PartitionerArg::Lpa => "lpa",
            PartitionerArg::Random => "random",
            PartitionerArg::Contiguous => "contiguous",
        }
    }

    pub fn method(self, seed: u64) -> grinnder_partition::Method {
        match self {
            PartitionerArg::Metis => grinnder_partition::Method::Metis { seed },
            PartitionerArg::Multilevel => grinnder_partition::Method::Multilevel { seed },
            PartitionerArg::Spinner => grinnder_partition::Method::Spinner { seed },
            PartitionerArg::Lpa => grinnder_partition::Method::Lpa { seed },
            PartitionerArg::Random => grinnder_partition::Method::Random { seed },
            PartitionerArg::Contiguous => grinnder_partition::Method::Contiguous,
        }
    }
}

impl PartitionArgs {
    /// The cache directory in use, if any.
    pub fn cache(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        self.cache_dir.clone().or_else(default_cache_dir)
    }

    pub fn method(&self) -> grinnder_partition::Method {
        self.partitioner.method(self.seed)
    }
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub input: Input,
    /// Train's settings: with --parts, the memory plan, each tier's blocks, an epoch's traffic
    /// and predicted time; without, --gpu-mem and --host-mem are budgets for the whole graph.
    #[command(flatten)]
    pub settings: TrainSettings,
    /// Measured rates for the predicted epoch time (`grinnder bench rates`) [default: the
    /// file it writes for --device, where it exists].
    #[arg(long)]
    pub rates: Option<PathBuf>,
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
    /// How the features are stored: f32, f16 or bf16 (values rounded to nearest; training
    /// computes in f32 either way). Default: as the input stores them.
    #[arg(long, value_parser = str::parse::<grinnder_graph::FeatureDtype>)]
    pub feature_dtype: Option<grinnder_graph::FeatureDtype>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// npy exchange layout (docs/datasets.md), read by the PyG baseline.
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
    #[arg(long, ignore_case = true, value_enum)]
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
    #[arg(long, ignore_case = true, value_enum, default_value_t = GenFormat::Native)]
    pub format: GenFormat,
    /// How the features are stored: f32, or f16 / bf16 (half the disk and reads; training
    /// computes in f32 either way). The npy layout has f32 and f16.
    #[arg(long, default_value = "f32", value_parser = str::parse::<grinnder_graph::FeatureDtype>)]
    pub feature_dtype: grinnder_graph::FeatureDtype,
}

/// `--model`: a family of the registry ([`grinnder_nn::Kind`]) by its name or an alias, in
/// any case; `--help` lists the names.
fn model_parser() -> impl clap::builder::TypedValueParser<Value = grinnder_nn::Kind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let names = grinnder_nn::Kind::ALL
        .map(|k| PossibleValue::new(k.name()).aliases(k.family().aliases().iter().copied()));
    PossibleValuesParser::new(names)
        .map(|s| grinnder_nn::Kind::parse(&s).expect("the parser offers the registry's names"))
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormArg {
    None,
    Layer,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureNormArg {
    None,
    Row,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScheduleArg {
    Constant,
    Step,
    Cosine,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimArg {
    Adam,
    Adamw,
    Sgd,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeatureAccessArg {
    Copy,
    ZeroCopy,
}

/// How ranks on GPUs move halo rows and gradient sums (runs under mpirun).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportArg {
    /// NCCL where every rank of a machine has a GPU of its own, else MPI.
    Auto,
    /// MPI through host memory.
    Mpi,
    /// NCCL between the GPUs' memories (one GPU per rank).
    Nccl,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeArg {
    /// Every node and edge every epoch (in memory, or partition by partition with --parts).
    Full,
    /// Sampled mini-batches (see --sampler), exact full-graph evaluation.
    Minibatch,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpansionArg {
    None,
    Preload,
    Eas,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerArg {
    /// GraphSAGE: per-layer neighbour sampling, --fanout one number per layer.
    Neighbor,
    /// ShaDow: the node-induced subgraph within as many hops of the seeds as --fanout has
    /// numbers; every layer runs on all of it, the loss on the seeds.
    Khop,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrecisionArg {
    F32,
    F64,
}

/// Training settings: each may come from a flag or from `--config FILE.toml` (same names,
/// with `_` for `-`); flags win, then the file, then the defaults shown.
#[derive(Args, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSettings {
    /// Model family [default: gcn].
    #[arg(help_heading = "Model", long, ignore_case = true, value_parser = model_parser())]
    pub model: Option<grinnder_nn::Kind>,
    /// Number of layers [default: 2].
    #[arg(help_heading = "Model", long)]
    pub layers: Option<usize>,
    /// Hidden width [default: 16].
    #[arg(help_heading = "Model", long)]
    pub hidden: Option<usize>,
    /// Dropout after each hidden layer [default: 0.5].
    #[arg(help_heading = "Model", long)]
    pub dropout: Option<f64>,
    /// Dropout on the input features [default: 0, as PyG's GCN/GraphSAGE/GAT/GIN and OGB's examples:
    /// the first aggregation is then computed once; Kipf & Welling's citation setup used 0.5].
    #[arg(help_heading = "Model", long)]
    pub input_dropout: Option<f64>,
    /// Input feature preprocessing: row (PyG's NormalizeFeatures: shift by the global minimum,
    /// divide each row by its sum) or none [default: by the values, never the name: row where
    /// no feature is negative (bag-of-words, as the citation graphs), none otherwise].
    #[arg(help_heading = "Model", long, ignore_case = true, value_enum)]
    pub feature_norm: Option<FeatureNormArg>,
    /// GAT, GATv2: attention heads of hidden layers, concatenated (the output layer has one) [default: 8].
    #[arg(help_heading = "Model", long)]
    pub heads: Option<usize>,
    /// GAT, GATv2: dropout on attention coefficients [default: the --dropout value].
    #[arg(help_heading = "Model", long)]
    pub attn_dropout: Option<f64>,
    /// GIN: ε, a node's own row weighs 1 + ε in its sum (the initial value with --train-eps) [default: 0].
    #[arg(help_heading = "Model", long, allow_negative_numbers = true)]
    pub gin_eps: Option<f64>,
    /// GIN: train ε (PyG's train_eps) [default: false].
    #[arg(help_heading = "Model", long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub train_eps: Option<bool>,
    /// GCNII: α, the weight of the initial representation x₀ in every layer (PyG's alpha) [default: 0.1].
    #[arg(help_heading = "Model", long)]
    pub alpha: Option<f64>,
    /// GCNII: θ, layer l's identity mapping weighs β = ln(θ / l + 1) (PyG's theta) [default: 0.5].
    #[arg(help_heading = "Model", long)]
    pub theta: Option<f64>,
    /// Normalisation between layers [default: none].
    #[arg(help_heading = "Model", long, ignore_case = true, value_enum)]
    pub norm: Option<NormArg>,
    /// Residual connections between layers of equal width [default: false].
    #[arg(help_heading = "Model", long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub residual: Option<bool>,
    /// Optimizer [default: adam].
    #[arg(help_heading = "Optimisation", long, ignore_case = true, value_enum)]
    pub optimizer: Option<OptimArg>,
    /// Learning rate [default: 0.01].
    #[arg(help_heading = "Optimisation", long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Weight decay (L2 for adam and sgd, decoupled for adamw) [default: 5e-4].
    #[arg(help_heading = "Optimisation", long)]
    pub weight_decay: Option<f64>,
    /// SGD momentum [default: 0.9].
    #[arg(help_heading = "Optimisation", long)]
    pub momentum: Option<f64>,
    /// Epochs [default: 200].
    #[arg(help_heading = "Optimisation", long)]
    pub epochs: Option<usize>,
    /// Learning rate over the epochs: step (× --lr-gamma every --lr-step epochs, StepLR) or
    /// cosine (to --lr-min over --epochs, CosineAnnealingLR) [default: constant].
    #[arg(help_heading = "Optimisation", long, ignore_case = true, value_enum)]
    pub lr_schedule: Option<LrScheduleArg>,
    /// Epochs between the step schedule's decays [default: 30].
    #[arg(help_heading = "Optimisation", long)]
    pub lr_step: Option<usize>,
    /// The step schedule's factor [default: 0.1].
    #[arg(help_heading = "Optimisation", long)]
    pub lr_gamma: Option<f64>,
    /// The cosine schedule's last learning rate [default: 0].
    #[arg(help_heading = "Optimisation", long)]
    pub lr_min: Option<f64>,
    /// Stop this many epochs after the best validation accuracy (early stopping) [default: none].
    #[arg(help_heading = "Optimisation", long)]
    pub patience: Option<usize>,
    /// Evaluate every this many epochs, and after the last (0: never, for benchmarks; the
    /// accuracies are then not reported) [default: 1].
    #[arg(help_heading = "Optimisation", long)]
    pub eval_every: Option<usize>,
    /// Seed of initialisation and dropout [default: 0].
    #[arg(help_heading = "Optimisation", long)]
    pub seed: Option<u64>,
    /// Arithmetic precision [default: f32].
    #[arg(help_heading = "Optimisation", long, ignore_case = true, value_enum)]
    pub precision: Option<PrecisionArg>,
    /// Full-graph or mini-batch training [default: full].
    #[arg(help_heading = "Mini-batch", long, ignore_case = true, value_enum)]
    pub mode: Option<ModeArg>,
    /// Mini-batch neighbours sampled per hop from the seeds, e.g. 15,10,5 (-1: all); one per
    /// layer with --sampler neighbor, one per hop with khop [default: 10 per layer].
    #[arg(help_heading = "Mini-batch", long, allow_hyphen_values = true)]
    pub fanout: Option<String>,
    /// How mini-batches are sampled [default: neighbor].
    #[arg(help_heading = "Mini-batch", long, ignore_case = true, value_enum)]
    pub sampler: Option<SamplerArg>,
    /// Train on the first N batches of each epoch's shuffled order only (benchmarks on graphs
    /// whose epochs are long) [default: every batch].
    #[arg(help_heading = "Mini-batch", long)]
    pub max_batches: Option<usize>,
    /// Seed nodes per mini-batch [default: 1024].
    #[arg(help_heading = "Mini-batch", long)]
    pub batch_size: Option<usize>,
    /// Sampling threads of --mode minibatch, which run ahead of the trainer (PyG's
    /// num_workers; with --feature-access copy they also gather the input rows) [default: half
    /// the cores, at most 8].
    #[arg(help_heading = "Mini-batch", long)]
    pub loader_threads: Option<usize>,
    /// How mini-batch input rows reach the GPU: copy (the sampling threads gather them into
    /// page-locked blocks, uploaded beside the previous batch's compute) or zero-copy (features
    /// in mapped page-locked host memory, gathered by GPU threads) [default: copy].
    #[arg(help_heading = "Mini-batch", long, ignore_case = true, value_enum)]
    pub feature_access: Option<FeatureAccessArg>,
    /// Where to compute: cpu, or cuda / cuda:N for GPU N (f32 only) [default: cpu].
    #[arg(help_heading = "GPU", long)]
    pub device: Option<String>,
    /// Train layer by layer and partition by partition over this many partitions (the tiered
    /// executor; gradients equal whole-graph training's) [default: whole graph in memory, or 4
    /// when another executor flag below is given].
    #[arg(help_heading = "Memory and tiers", long)]
    pub parts: Option<usize>,
    /// Partitioner of the tiered executor [default: multilevel].
    #[arg(help_heading = "Memory and tiers", long, ignore_case = true, value_enum)]
    pub partitioner: Option<PartitionerArg>,
    /// Which blocks leave host RAM first: whole layers (lru_layer), single blocks with the
    /// computing partition's dependencies pinned (partition_lru), or chosen by the memory plan
    /// (auto) [default: auto].
    #[arg(help_heading = "Memory and tiers", long, ignore_case = true, value_enum)]
    pub cache_mode: Option<CacheModeArg>,
    /// Host memory budget of the whole process, e.g. 8GiB or 500MB (peak RSS stays within it;
    /// a budget below the minimum is refused, naming it); blocks beyond it go to
    /// --storage-dir [default: no limit].
    #[arg(help_heading = "Memory and tiers", long)]
    pub host_mem: Option<String>,
    /// Size of the host cache for blocks, overriding what the memory plan derives from
    /// --host-mem, e.g. 2GiB; 0 sends every block through --storage-dir.
    #[arg(help_heading = "Memory and tiers", long)]
    pub block_cache: Option<String>,
    /// Directory for block files of the storage tier (needed when --host-mem is exceeded).
    #[arg(help_heading = "Memory and tiers", long)]
    pub storage_dir: Option<PathBuf>,
    /// Cache partitionings here, as `grinnder partition --cache-dir` does; a cache filled on
    /// another machine serves too (it is keyed by the graph's structure and the partitioning
    /// settings only) [default: $XDG_CACHE_HOME/grinnder, else ~/.cache/grinnder].
    #[arg(help_heading = "Memory and tiers", long)]
    pub cache_dir: Option<PathBuf>,
    /// Element type of cached and stored blocks: f32, or bf16 for half the bytes [default: f32].
    #[arg(help_heading = "Memory and tiers", long, ignore_case = true, value_enum)]
    pub tier_dtype: Option<TierDtypeArg>,
    /// Keep the block files at the end of the run.
    #[arg(help_heading = "Memory and tiers", long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub keep_storage: Option<bool>,
    /// GPU memory budget of the run with --device cuda, e.g. 8GiB: allocations past it stop the
    /// run; with --parts, the tiered executor keeps the blocks that fit on the GPU and the rest
    /// in host memory (and storage) [default: the whole GPU].
    #[arg(help_heading = "GPU", long)]
    pub gpu_mem: Option<String>,
    /// Under mpirun: consecutive ranks that share a server (the intra-server links; emulates
    /// servers on one machine) [default: the ranks MPI finds on each machine].
    #[arg(help_heading = "Several processes (mpirun)", long)]
    pub ranks_per_server: Option<usize>,
    /// Under mpirun with --device cuda: how full-graph ranks move halo rows, halo gradients and
    /// parameter-gradient sums. nccl: between the GPUs' memories (one GPU per rank); mpi:
    /// through host memory; auto: nccl where each rank of a machine has a GPU of its own and
    /// NCCL loads [default: auto].
    #[arg(help_heading = "Several processes (mpirun)", long, ignore_case = true, value_enum)]
    pub transport: Option<TransportArg>,
    /// Under mpirun: what each server trains on besides the nodes it owns. none: plain
    /// partition-parallel (halo rows cross servers); preload: their closure of --preload-hops
    /// hops (flexible preloading; as many hops as layers is exact, and then only the gradient
    /// sum crosses servers); eas: expansion-aware sampling (--eas-hops from the server's
    /// boundary, --eas-fanout neighbours per node) [default: none].
    #[arg(help_heading = "Several processes (mpirun)", long, ignore_case = true, value_enum)]
    pub expansion: Option<ExpansionArg>,
    /// Hops of flexible preloading, or auto: the most (up to --layers) whose share fits the
    /// server's --host-mem (or --gpu-mem) summed over its ranks [default: --layers].
    #[arg(help_heading = "Several processes (mpirun)", long)]
    pub preload_hops: Option<String>,
    /// Hops of expansion-aware sampling from a server's boundary [default: 1].
    #[arg(help_heading = "Several processes (mpirun)", long)]
    pub eas_hops: Option<usize>,
    /// Outside neighbours each boundary node keeps in expansion-aware sampling [default: 15].
    #[arg(help_heading = "Several processes (mpirun)", long)]
    pub eas_fanout: Option<usize>,
    /// GEMMs on TF32 tensor cores with --device cuda (faster, 10-bit mantissa products).
    #[arg(help_heading = "GPU", long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub tf32: Option<bool>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum CacheModeArg {
    Auto,
    LruLayer,
    PartitionLru,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierDtypeArg {
    F32,
    Bf16,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputArg {
    /// The output layer's values (`logits.npy`, float).
    Logits,
    /// Their softmax (`probs.npy`, float).
    Probs,
    /// The predicted class, the first largest logit (`class.npy`, int64).
    Class,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDtypeArg {
    F32,
    /// bfloat16, stored as its 16-bit patterns ('<u2': `torch.from_numpy(a).view(torch.bfloat16)`).
    Bf16,
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    #[command(flatten)]
    pub input: Input,
    /// The model file: from `grinnder train --save-model`, or a PyG model's state dict saved
    /// with safetensors under the names of docs/model-files.md.
    #[arg(long)]
    pub model_file: PathBuf,
    /// Output directory (made if missing): logits.npy, probs.npy or class.npy; embedding-L.npy
    /// for --embed L; nodes.npy (the node ids of the rows) for a --nodes subset.
    #[arg(long, short)]
    pub out: PathBuf,
    /// What to write per node.
    #[arg(long, ignore_case = true, value_enum, default_value_t = OutputArg::Logits)]
    pub output: OutputArg,
    /// Also write hidden layer L's output (0-based: after its norm, ReLU and residual); several
    /// comma separated.
    #[arg(long, value_delimiter = ',')]
    pub embed: Vec<usize>,
    /// The nodes to predict: all, train, valid, test, or an .npy file of node ids (any integer
    /// type; rows are written in its order) or a boolean mask, one entry per node (as PyG's
    /// test_mask). In the last layer only what these need is computed.
    #[arg(long, default_value = "all")]
    pub nodes: String,
    /// Element type of the values written.
    #[arg(long, ignore_case = true, value_enum, default_value_t = OutDtypeArg::F32)]
    pub out_dtype: OutDtypeArg,
    /// Where to compute: cpu, or cuda / cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Run layer by layer and partition by partition over this many partitions (the tiered
    /// executor) [default: chosen from the machine — the whole graph at once where it fits —
    /// or 4 when another executor flag below is given; under mpirun one per rank].
    #[arg(long)]
    pub parts: Option<usize>,
    /// Partitioner of the tiered executor [default: multilevel].
    #[arg(long, ignore_case = true, value_enum)]
    pub partitioner: Option<PartitionerArg>,
    /// Host memory budget of the whole process, e.g. 8GiB; blocks beyond it go to --storage-dir.
    #[arg(long)]
    pub host_mem: Option<String>,
    /// Size of the host cache for blocks, e.g. 2GiB; 0 sends every block through --storage-dir.
    #[arg(long)]
    pub block_cache: Option<String>,
    /// Directory for block files of the storage tier.
    #[arg(long)]
    pub storage_dir: Option<PathBuf>,
    /// Cache partitionings here [default: $XDG_CACHE_HOME/grinnder, else ~/.cache/grinnder].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Which blocks leave host RAM first [default: auto].
    #[arg(long, ignore_case = true, value_enum)]
    pub cache_mode: Option<CacheModeArg>,
    /// Element type of cached and stored blocks [default: f32].
    #[arg(long, ignore_case = true, value_enum)]
    pub tier_dtype: Option<TierDtypeArg>,
    /// GPU memory budget with --device cuda, e.g. 8GiB.
    #[arg(long)]
    pub gpu_mem: Option<String>,
    /// GEMMs on TF32 tensor cores with --device cuda (a switch, as train's: also
    /// --tf32=true / --tf32=false).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub tf32: Option<bool>,
    /// Under mpirun: consecutive ranks that share a server [default: the ranks MPI finds per machine].
    #[arg(long)]
    pub ranks_per_server: Option<usize>,
    /// Write one JSON object per output file written (rows, time, bytes moved per tier).
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Compute (and write) every output this many times (benchmarks: the first pass also picks
    /// the GPU's SpMM kernels); each pass's time goes to --metrics-out, the last to the summary.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub input: Input,
    #[command(flatten)]
    pub settings: TrainSettings,
    /// Read settings from a TOML file (flags override it).
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub config: Option<PathBuf>,
    /// Write one JSON object per evaluated epoch, then a summary line with "final": true.
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub metrics_out: Option<PathBuf>,
    /// Print a line per this many epochs (epoch, loss, accuracies, time) [default: 1 where
    /// stderr is no terminal, as in a batch job's log; 0 on a terminal, which shows a progress
    /// bar]; 0: none.
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub log_every: Option<usize>,
    /// Draw loss and accuracy curves into a PNG file.
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub plot: Option<PathBuf>,
    /// Write checkpoints (parameters, optimizer state, epoch) into this directory.
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every this many epochs (and after the last).
    #[arg(help_heading = "Settings file, output and checkpoints", long, default_value_t = 1)]
    pub checkpoint_every: usize,
    /// Checkpoints kept (the newest).
    #[arg(help_heading = "Settings file, output and checkpoints", long, default_value_t = 3)]
    pub checkpoint_keep: usize,
    /// Continue from the newest valid checkpoint in --checkpoint-dir (refused when it was made
    /// for other settings or another dataset; starts afresh when there is none).
    #[arg(help_heading = "Settings file, output and checkpoints", long, requires = "checkpoint_dir")]
    pub resume: bool,
    /// Write the trained model to this safetensors file (PyG's parameter names; the
    /// architecture and feature preprocessing in its metadata; docs/model-files.md): the
    /// parameters of the epoch of best validation accuracy (the one whose test accuracy is
    /// reported) unless --save-last.
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub save_model: Option<PathBuf>,
    /// With --save-model: the parameters after the last epoch instead.
    #[arg(help_heading = "Settings file, output and checkpoints", long, requires = "save_model")]
    pub save_last: bool,
    /// Measured rates (`grinnder bench rates`): after the second epoch the tiered executor logs
    /// its predicted epoch time against the measured one [default: `bench rates`'s file].
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub rates: Option<PathBuf>,
    /// Start from the weights of this model file (fine-tuning, or a model trained in PyG) instead
    /// of a fresh initialisation; its tensors must fit the model the settings describe.
    #[arg(help_heading = "Settings file, output and checkpoints", long)]
    pub init_from: Option<PathBuf>,
}

impl TrainArgs {
    /// The checkpoint settings, if any.
    pub fn checkpoint(&self) -> anyhow::Result<Option<grinnder_engine::CheckpointConfig>> {
        anyhow::ensure!(self.checkpoint_every >= 1, "--checkpoint-every must be at least 1");
        anyhow::ensure!(self.checkpoint_keep >= 1, "--checkpoint-keep must be at least 1");
        Ok(self.checkpoint_dir.as_ref().map(|dir| grinnder_engine::CheckpointConfig {
            dir: dir.clone(),
            every: self.checkpoint_every,
            keep: self.checkpoint_keep,
            resume: self.resume,
        }))
    }
}

impl Input {
    /// The dataset path, defaulting to the bundled Cora (`data/cora` in the source tree, else
    /// the binary's embedded copy).
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.dataset {
            return Ok(p.clone());
        }
        crate::bundled::cora(default_cache_dir())
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
            allow_split_overlap: self.allow_split_overlap,
            build: BuildOptions { symmetrise: !self.directed, ..BuildOptions::default() },
            ..LoadOptions::default()
        })
    }
}
