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
    /// Worker threads (default: one per core; under mpirun, the cores shared among the ranks
    /// on the machine).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a GNN on a dataset, full-graph (every node and edge, every epoch).
    Train(Box<TrainArgs>),
    /// Partition a dataset and print the quality of the partitioning.
    Partition(PartitionArgs),
    /// Print a dataset's statistics and the memory full-graph training needs.
    Info(InfoArgs),
    /// Convert a dataset (OGB raw, IGB, npy) into the fast native `.grnd` file.
    Convert(ConvertArgs),
    /// Write a dataset in another layout (npy exchange, OGB raw, IGB).
    Export(ExportArgs),
    /// Generate a synthetic benchmark graph (DESIGN.md §7 presets).
    Generate(GenerateArgs),
    /// Microbenchmarks: GPU gather, transfer, SpMM, GEMM and launch costs, CPU mini-batch
    /// sampling; each prints one JSON object.
    Bench(BenchArgs),
    /// Draw the speed-up of runs on several GPUs (or ranks) over one, from their metrics files.
    PlotScaling(PlotScalingArgs),
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
    /// GPU to measure: cuda or cuda:N (`sample` runs on the CPU).
    #[arg(long, global = true, default_value = "cuda")]
    pub device: String,
    /// Timed repetitions (the median is reported).
    #[arg(long, global = true, default_value_t = 5)]
    pub reps: usize,
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Subcommand, Debug)]
pub enum BenchWhat {
    /// Random rows of a table in pinned host memory into the GPU: CPU gather + copy (pinned and
    /// pageable), zero-copy (GPU threads read the mapped rows), the plain copy of as many
    /// contiguous bytes, and a gather from GPU memory.
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
    /// Host ↔ GPU copy bandwidth from pageable and pinned memory.
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
    /// Dense `C = op(A)·op(B)` through the backend's GEMM at one shape, each transposition,
    /// FP32 and TF32.
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
    /// Accept a dataset whose splits share nodes (warned about) instead of refusing it.
    #[arg(long)]
    pub allow_split_overlap: bool,
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionerArg {
    Metis,
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
    /// Partitioner: METIS k-way, Spinner, dependency-aware LPA (halo volume), random, contiguous.
    #[arg(long, value_enum, default_value_t = PartitionerArg::Metis)]
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
    pub fn method(self, seed: u64) -> grinnder_partition::Method {
        match self {
            PartitionerArg::Metis => grinnder_partition::Method::Metis { seed },
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

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelArg {
    Gcn,
    Sage,
    Gat,
    Gin,
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
    #[arg(long, value_enum)]
    pub model: Option<ModelArg>,
    /// Number of layers [default: 2].
    #[arg(long)]
    pub layers: Option<usize>,
    /// Hidden width [default: 16].
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Dropout after each hidden layer [default: 0.5].
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Dropout on the input features [default: the --dropout value, as Kipf & Welling; 0 keeps
    /// the input fixed, so the first aggregation is computed once].
    #[arg(long)]
    pub input_dropout: Option<f64>,
    /// Input feature preprocessing: row (PyG's NormalizeFeatures: shift by the global minimum,
    /// divide each row by its sum) or none [default: row].
    #[arg(long, value_enum)]
    pub feature_norm: Option<FeatureNormArg>,
    /// GAT: attention heads of hidden layers, concatenated (the output layer has one) [default: 8].
    #[arg(long)]
    pub heads: Option<usize>,
    /// GAT: dropout on attention coefficients [default: the --dropout value].
    #[arg(long)]
    pub attn_dropout: Option<f64>,
    /// GIN: ε, a node's own row weighs 1 + ε in its sum (the initial value with --train-eps)
    /// [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub gin_eps: Option<f64>,
    /// GIN: train ε (PyG's train_eps) [default: false].
    #[arg(long)]
    pub train_eps: Option<bool>,
    /// Normalisation between layers [default: none].
    #[arg(long, value_enum)]
    pub norm: Option<NormArg>,
    /// Residual connections between layers of equal width [default: false].
    #[arg(long)]
    pub residual: Option<bool>,
    /// Optimizer [default: adam].
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimArg>,
    /// Learning rate [default: 0.01].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Weight decay (L2 for adam and sgd, decoupled for adamw) [default: 5e-4].
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// SGD momentum [default: 0.9].
    #[arg(long)]
    pub momentum: Option<f64>,
    /// Epochs [default: 200].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Evaluate every this many epochs, and after the last (0: never, for benchmarks; the
    /// accuracies are then not reported) [default: 1].
    #[arg(long)]
    pub eval_every: Option<usize>,
    /// Seed of initialisation and dropout [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Arithmetic precision [default: f32].
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
    /// Full-graph or mini-batch training [default: full].
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Mini-batch neighbours sampled per hop from the seeds, e.g. 15,10,5 (-1: all); one per
    /// layer with --sampler neighbor, one per hop with khop [default: 10 per layer].
    #[arg(long, allow_hyphen_values = true)]
    pub fanout: Option<String>,
    /// How mini-batches are sampled [default: neighbor].
    #[arg(long, value_enum)]
    pub sampler: Option<SamplerArg>,
    /// Train on the first N batches of each epoch's shuffled order only (benchmarks on graphs
    /// whose epochs are long) [default: every batch].
    #[arg(long)]
    pub max_batches: Option<usize>,
    /// Seed nodes per mini-batch [default: 1024].
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Sampling threads of --mode minibatch, which run ahead of the trainer (PyG's
    /// num_workers; with --feature-access copy they also gather the input rows) [default: half
    /// the cores, at most 8].
    #[arg(long)]
    pub loader_threads: Option<usize>,
    /// How mini-batch input rows reach the GPU: copy (the sampling threads gather them into
    /// page-locked blocks, uploaded beside the previous batch's compute) or zero-copy (features
    /// in mapped page-locked host memory, gathered by GPU threads) [default: copy].
    #[arg(long, value_enum)]
    pub feature_access: Option<FeatureAccessArg>,
    /// Where to compute: cpu, or cuda / cuda:N for GPU N (f32 only) [default: cpu].
    #[arg(long)]
    pub device: Option<String>,
    /// Train layer by layer and partition by partition over this many partitions (the tiered
    /// executor; gradients equal whole-graph training's) [default: whole graph in memory, or 4
    /// when another executor flag below is given].
    #[arg(long)]
    pub parts: Option<usize>,
    /// Partitioner of the tiered executor [default: metis].
    #[arg(long, value_enum)]
    pub partitioner: Option<PartitionerArg>,
    /// Which blocks leave host RAM first: whole layers (lru_layer), single blocks with the
    /// computing partition's dependencies pinned (partition_lru), or chosen by the memory plan
    /// (auto) [default: auto].
    #[arg(long, value_enum)]
    pub cache_mode: Option<CacheModeArg>,
    /// Host memory budget of the whole process, e.g. 8GiB or 500MB (peak RSS stays within it;
    /// a budget below the minimum is refused, naming it); blocks beyond it go to
    /// --storage-dir [default: no limit].
    #[arg(long)]
    pub host_mem: Option<String>,
    /// Size of the host cache for blocks, overriding what the memory plan derives from
    /// --host-mem, e.g. 2GiB; 0 sends every block through --storage-dir.
    #[arg(long)]
    pub block_cache: Option<String>,
    /// Directory for block files of the storage tier (needed when --host-mem is exceeded).
    #[arg(long)]
    pub storage_dir: Option<PathBuf>,
    /// Element type of cached and stored blocks: f32, or bf16 for half the bytes [default: f32].
    #[arg(long, value_enum)]
    pub tier_dtype: Option<TierDtypeArg>,
    /// Keep the block files at the end of the run.
    #[arg(long)]
    pub keep_storage: Option<bool>,
    /// GPU memory budget of the run with --device cuda, e.g. 8GiB: allocations past it stop the
    /// run; with --parts, the tiered executor keeps the blocks that fit on the GPU and the rest
    /// in host memory (and storage) [default: the whole GPU].
    #[arg(long)]
    pub gpu_mem: Option<String>,
    /// Under mpirun: consecutive ranks that share a server (the intra-server links; emulates
    /// servers on one machine) [default: the ranks MPI finds on each machine].
    #[arg(long)]
    pub ranks_per_server: Option<usize>,
    /// Under mpirun with --device cuda: how full-graph ranks move halo rows, halo gradients and
    /// parameter-gradient sums. nccl: between the GPUs' memories (one GPU per rank); mpi:
    /// through host memory; auto: nccl where each rank of a machine has a GPU of its own and
    /// NCCL loads [default: auto].
    #[arg(long, value_enum)]
    pub transport: Option<TransportArg>,
    /// Under mpirun: what each server trains on besides the nodes it owns. none: plain
    /// partition-parallel (halo rows cross servers); preload: their closure of --preload-hops
    /// hops (flexible preloading; as many hops as layers is exact, and then only the gradient
    /// sum crosses servers); eas: expansion-aware sampling (--eas-hops from the server's
    /// boundary, --eas-fanout neighbours per node) [default: none].
    #[arg(long, value_enum)]
    pub expansion: Option<ExpansionArg>,
    /// Hops of flexible preloading, or auto: the most (up to --layers) whose share fits the
    /// server's --host-mem (or --gpu-mem) summed over its ranks [default: --layers].
    #[arg(long)]
    pub preload_hops: Option<String>,
    /// Hops of expansion-aware sampling from a server's boundary [default: 1].
    #[arg(long)]
    pub eas_hops: Option<usize>,
    /// Outside neighbours each boundary node keeps in expansion-aware sampling [default: 15].
    #[arg(long)]
    pub eas_fanout: Option<usize>,
    /// GEMMs on TF32 tensor cores with --device cuda (faster, 10-bit mantissa products).
    #[arg(long)]
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

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub input: Input,
    #[command(flatten)]
    pub settings: TrainSettings,
    /// Read settings from a TOML file (flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Write one JSON object per evaluated epoch, then a summary line with "final": true.
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Draw loss and accuracy curves into a PNG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write checkpoints (parameters, optimizer state, epoch) into this directory.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every this many epochs (and after the last).
    #[arg(long, default_value_t = 1)]
    pub checkpoint_every: usize,
    /// Checkpoints kept (the newest).
    #[arg(long, default_value_t = 3)]
    pub checkpoint_keep: usize,
    /// Continue from the newest valid checkpoint in --checkpoint-dir (refused when it was made
    /// for other settings or another dataset; starts afresh when there is none).
    #[arg(long, requires = "checkpoint_dir")]
    pub resume: bool,
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

/// Validated training settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainPlan {
    pub config: grinnder_engine::TrainConfig,
    pub precision: PrecisionArg,
    pub device: Device,
    /// The tiered executor's settings; `None`: the in-memory trainer.
    pub tiered: Option<TieredPlan>,
    /// Mini-batch training's settings; `None`: full-graph training.
    pub minibatch: Option<grinnder_engine::MiniBatchConfig>,
    pub feature_access: FeatureAccessArg,
    pub tf32: bool,
    /// `--gpu-mem`: the GPU memory budget of either trainer.
    pub gpu_mem: Option<u64>,
    /// `--ranks-per-server` (partition-parallel runs under mpirun).
    pub ranks_per_server: Option<usize>,
    /// `--transport` (GPU ranks under mpirun).
    pub transport: TransportArg,
    /// What servers train on besides the nodes they own (runs under mpirun).
    pub expansion: grinnder_engine::Expansion,
}

/// Where training computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl Device {
    pub fn parse(text: &str) -> anyhow::Result<Device> {
        match text {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            t => match t.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => anyhow::bail!("--device {t:?}: use cpu, cuda or cuda:N"),
            },
        }
    }
}

/// The tiered executor's validated settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TieredPlan {
    pub parts: usize,
    pub partitioner: PartitionerArg,
    pub cache_mode: grinnder_engine::CacheMode,
    pub host_mem: Option<u64>,
    pub storage_dir: Option<PathBuf>,
    pub tier_dtype: grinnder_engine::TierDtype,
    pub keep_storage: bool,
    pub block_cache: Option<u64>,
}

impl TieredPlan {
    /// The executor's defaults over `parts` partitions (every block in RAM).
    pub fn with_parts(parts: usize) -> TieredPlan {
        TieredPlan {
            parts,
            partitioner: PartitionerArg::Metis,
            cache_mode: grinnder_engine::CacheMode::Auto,
            host_mem: None,
            storage_dir: None,
            tier_dtype: grinnder_engine::TierDtype::F32,
            keep_storage: false,
            block_cache: None,
        }
    }
}

/// The largest `--config` file read: a run's settings take a few hundred bytes.
const CONFIG_BYTES_MAX: u64 = 1 << 20;

impl TrainArgs {
    /// Merges flags over the config file over the defaults, and validates once.
    pub fn plan(&self) -> anyhow::Result<TrainPlan> {
        let file: TrainSettings = match &self.config {
            Some(p) => {
                let text = grinnder_graph::io::files::read_text_bounded(p, CONFIG_BYTES_MAX, "config file")
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
            }
            None => TrainSettings::default(),
        };
        let f = &self.settings;
        macro_rules! pick {
            ($field:ident, $default:expr) => {
                f.$field.or(file.$field).unwrap_or($default)
            };
        }
        let layers = pick!(layers, 2);
        let hidden = pick!(hidden, 16);
        let dropout = pick!(dropout, 0.5);
        let input_dropout = pick!(input_dropout, dropout);
        let attn_dropout = pick!(attn_dropout, dropout);
        let heads = pick!(heads, 8);
        anyhow::ensure!(heads >= 1, "--heads must be at least 1");
        let lr = pick!(lr, 0.01);
        let weight_decay = pick!(weight_decay, 5e-4);
        let momentum = pick!(momentum, 0.9);
        let epochs = pick!(epochs, 200);
        let eval_every = pick!(eval_every, 1);
        anyhow::ensure!(layers >= 1, "--layers must be at least 1");
        anyhow::ensure!(hidden >= 1, "--hidden must be at least 1");
        for (name, p) in
            [("--dropout", dropout), ("--input-dropout", input_dropout), ("--attn-dropout", attn_dropout)]
        {
            anyhow::ensure!((0.0..1.0).contains(&p), "{name} must be in [0, 1), got {p}");
        }
        anyhow::ensure!(lr > 0.0 && lr.is_finite(), "--lr must be positive, got {lr}");
        anyhow::ensure!(weight_decay >= 0.0, "--weight-decay must be non-negative");
        anyhow::ensure!((0.0..1.0).contains(&momentum), "--momentum must be in [0, 1)");
        anyhow::ensure!(epochs >= 1, "--epochs must be at least 1");
        let optim = match pick!(optimizer, OptimArg::Adam) {
            OptimArg::Adam => grinnder_nn::OptimConfig::Adam { lr, weight_decay },
            OptimArg::Adamw => grinnder_nn::OptimConfig::Adamw { lr, weight_decay },
            OptimArg::Sgd => grinnder_nn::OptimConfig::Sgd { lr, momentum, weight_decay },
        };
        let model = grinnder_nn::ModelConfig {
            kind: match pick!(model, ModelArg::Gcn) {
                ModelArg::Gcn => grinnder_nn::Kind::Gcn,
                ModelArg::Sage => grinnder_nn::Kind::Sage,
                ModelArg::Gat => grinnder_nn::Kind::Gat,
                ModelArg::Gin => grinnder_nn::Kind::Gin,
            },
            gin_eps: pick!(gin_eps, 0.0),
            train_eps: pick!(train_eps, false),
            heads,
            attn_dropout,
            layers,
            hidden,
            dropout,
            input_dropout,
            norm: match pick!(norm, NormArg::None) {
                NormArg::None => grinnder_nn::Norm::None,
                NormArg::Layer => grinnder_nn::Norm::Layer,
            },
            residual: pick!(residual, false),
            seed: pick!(seed, 0),
        };
        Ok(TrainPlan {
            config: grinnder_engine::TrainConfig {
                model,
                optim,
                epochs,
                eval_every,
                feature_norm: match pick!(feature_norm, FeatureNormArg::Row) {
                    FeatureNormArg::None => grinnder_engine::FeatureNorm::None,
                    FeatureNormArg::Row => grinnder_engine::FeatureNorm::Row,
                },
            },
            precision: pick!(precision, PrecisionArg::F32),
            device: {
                let d =
                    Device::parse(&f.device.clone().or(file.device.clone()).unwrap_or_else(|| "cpu".into()))?;
                if d != Device::Cpu {
                    anyhow::ensure!(
                        pick!(precision, PrecisionArg::F32) == PrecisionArg::F32,
                        "--device cuda computes in f32 only (drop --precision f64)"
                    );
                }
                d
            },
            tiered: self.tiered_plan(&file)?,
            minibatch: match pick!(mode, ModeArg::Full) {
                ModeArg::Full => {
                    anyhow::ensure!(
                        f.fanout.is_none()
                            && file.fanout.is_none()
                            && f.batch_size.or(file.batch_size).is_none()
                            && f.sampler.or(file.sampler).is_none()
                            && f.max_batches.or(file.max_batches).is_none()
                            && f.loader_threads.or(file.loader_threads).is_none(),
                        "--fanout, --batch-size, --sampler, --max-batches and --loader-threads are for --mode minibatch"
                    );
                    None
                }
                ModeArg::Minibatch => {
                    let fanouts: Vec<i64> = match f.fanout.clone().or(file.fanout.clone()) {
                        Some(t) => t
                            .split(',')
                            .map(|x| x.trim().parse::<i64>())
                            .collect::<Result<_, _>>()
                            .map_err(|e| anyhow::anyhow!("--fanout {t:?}: {e}"))?,
                        None => vec![10; layers],
                    };
                    let sampler = pick!(sampler, SamplerArg::Neighbor);
                    anyhow::ensure!(
                        fanouts.len() == layers || sampler == SamplerArg::Khop,
                        "--fanout has {} numbers for {layers} layers: give one per layer",
                        fanouts.len()
                    );
                    anyhow::ensure!(
                        fanouts.iter().all(|&k| k == -1 || k > 0),
                        "--fanout numbers are positive, or -1 for every neighbour"
                    );
                    let batch_size = pick!(batch_size, 1024);
                    anyhow::ensure!(batch_size >= 1, "--batch-size must be at least 1");
                    let sampler = match sampler {
                        SamplerArg::Neighbor => grinnder_engine::Sampler::Neighbor,
                        SamplerArg::Khop => grinnder_engine::Sampler::KHop,
                    };
                    let max_batches = f.max_batches.or(file.max_batches);
                    anyhow::ensure!(max_batches != Some(0), "--max-batches must be at least 1");
                    let loader_threads = f.loader_threads.or(file.loader_threads);
                    anyhow::ensure!(loader_threads != Some(0), "--loader-threads must be at least 1");
                    Some(grinnder_engine::MiniBatchConfig {
                        fanouts,
                        sampler,
                        batch_size,
                        eval_parts: 1,
                        max_batches,
                        loader_threads,
                    })
                }
            },
            tf32: f.tf32.or(file.tf32).unwrap_or(false),
            feature_access: pick!(feature_access, FeatureAccessArg::Copy),
            gpu_mem: byte_size(f.gpu_mem.clone().or(file.gpu_mem.clone()))?,
            transport: pick!(transport, TransportArg::Auto),
            ranks_per_server: match f.ranks_per_server.or(file.ranks_per_server) {
                Some(0) => anyhow::bail!("--ranks-per-server must be at least 1"),
                r => r,
            },
            expansion: {
                let hops = f.preload_hops.clone().or(file.preload_hops.clone());
                let (eas_hops, eas_fanout) = (f.eas_hops.or(file.eas_hops), f.eas_fanout.or(file.eas_fanout));
                let memory = byte_size(f.host_mem.clone().or(file.host_mem.clone()))?
                    .or(byte_size(f.gpu_mem.clone().or(file.gpu_mem.clone()))?);
                match pick!(expansion, ExpansionArg::None) {
                    ExpansionArg::None => {
                        anyhow::ensure!(
                            hops.is_none() && eas_hops.is_none() && eas_fanout.is_none(),
                            "--preload-hops, --eas-hops and --eas-fanout need --expansion preload or eas"
                        );
                        grinnder_engine::Expansion::Plain
                    }
                    ExpansionArg::Preload => {
                        anyhow::ensure!(
                            eas_hops.is_none() && eas_fanout.is_none(),
                            "--eas-hops and --eas-fanout are for --expansion eas"
                        );
                        match hops.as_deref() {
                            None => grinnder_engine::Expansion::Closure { hops: layers },
                            Some("auto") => match memory {
                                Some(m) => grinnder_engine::Expansion::ClosureWithin {
                                    budget: m * f.ranks_per_server.or(file.ranks_per_server).unwrap_or(1) as u64,
                                },
                                None => anyhow::bail!("--preload-hops auto needs --host-mem or --gpu-mem to fit"),
                            },
                            Some(t) => grinnder_engine::Expansion::Closure {
                                hops: t.parse().map_err(|e| anyhow::anyhow!("--preload-hops {t:?}: {e} (a number, or auto)"))?,
                            },
                        }
                    }
                    ExpansionArg::Eas => {
                        anyhow::ensure!(hops.is_none(), "--preload-hops is for --expansion preload");
                        let hops = eas_hops.unwrap_or(1);
                        let fanout = eas_fanout.unwrap_or(15);
                        anyhow::ensure!(hops >= 1 && fanout >= 1, "--eas-hops and --eas-fanout must be at least 1");
                        grinnder_engine::Expansion::Sampled { hops, fanout }
                    }
                }
            },
        })
        .and_then(|mut p| {
            if let (Some(mb), Some(t)) = (p.minibatch.as_mut(), &p.tiered) {
                anyhow::ensure!(
                    t.host_mem.is_none() && t.storage_dir.is_none() && t.block_cache.is_none(),
                    "--host-mem, --storage-dir and --block-cache apply to full-graph training; with --mode minibatch, --parts sets the evaluation's partitions"
                );
                mb.eval_parts = t.parts;
                p.tiered = None;
            }
            if p.feature_access == FeatureAccessArg::ZeroCopy {
                anyhow::ensure!(
                    p.device != Device::Cpu && p.minibatch.is_some(),
                    "--feature-access zero-copy needs --device cuda and --mode minibatch"
                );
            }
            if p.transport == TransportArg::Nccl {
                anyhow::ensure!(
                    p.device != Device::Cpu && p.minibatch.is_none(),
                    "--transport nccl needs --device cuda and full-graph training (cooperative mini-batches exchange through MPI)"
                );
            }
            if p.device == Device::Cpu {
                anyhow::ensure!(!p.tf32, "--tf32 needs --device cuda");
                anyhow::ensure!(
                    p.gpu_mem.is_none(),
                    "--gpu-mem needs --device cuda (on the CPU, --host-mem budgets memory)"
                );
            }
            Ok(p)
        })
    }

    fn tiered_plan(&self, file: &TrainSettings) -> anyhow::Result<Option<TieredPlan>> {
        let f = &self.settings;
        macro_rules! get {
            ($field:ident) => {
                f.$field.clone().or(file.$field.clone())
            };
        }
        let host_mem = byte_size(get!(host_mem))?;
        let storage_dir = get!(storage_dir);
        let block_cache = byte_size(get!(block_cache))?;
        let any = block_cache.is_some()
            || get!(parts).is_some()
            || get!(partitioner).is_some()
            || get!(cache_mode).is_some()
            || host_mem.is_some()
            || storage_dir.is_some()
            || get!(tier_dtype).is_some()
            || get!(keep_storage).is_some();
        if !any {
            return Ok(None);
        }
        let parts = get!(parts).unwrap_or(4);
        anyhow::ensure!(parts >= 1, "--parts must be at least 1");
        if let Some(d) = &storage_dir {
            anyhow::ensure!(d.is_dir(), "--storage-dir {} is not an existing directory", d.display());
        }
        Ok(Some(TieredPlan {
            parts,
            partitioner: get!(partitioner).unwrap_or(PartitionerArg::Metis),
            cache_mode: match get!(cache_mode).unwrap_or(CacheModeArg::Auto) {
                CacheModeArg::Auto => grinnder_engine::CacheMode::Auto,
                CacheModeArg::LruLayer => grinnder_engine::CacheMode::LruLayer,
                CacheModeArg::PartitionLru => grinnder_engine::CacheMode::PartitionLru,
            },
            host_mem,
            storage_dir,
            tier_dtype: match get!(tier_dtype).unwrap_or(TierDtypeArg::F32) {
                TierDtypeArg::F32 => grinnder_engine::TierDtype::F32,
                TierDtypeArg::Bf16 => grinnder_engine::TierDtype::Bf16,
            },
            keep_storage: get!(keep_storage).unwrap_or(false),
            block_cache,
        }))
    }
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
            allow_split_overlap: self.allow_split_overlap,
            ..LoadOptions::default()
        })
    }
}

/// Parses a byte size: `1024`, `512MiB`, `8GiB`, `1.5GB`, `2T`.
/// An optional byte-size setting (see [`parse_bytes`]).
fn byte_size(text: Option<String>) -> anyhow::Result<Option<u64>> {
    text.map(|t| parse_bytes(&t).map_err(anyhow::Error::msg)).transpose()
}

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
