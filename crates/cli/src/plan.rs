//! `grinnder train`'s settings merged (flags over the config file over the defaults) and
//! validated once into a [`TrainPlan`].

use std::path::PathBuf;

use crate::args::*;
use crate::bytes::byte_size;

/// A setting from the flags (`f`), else the config file (`file`), else `default`.
macro_rules! pick_from {
    ($f:ident, $file:ident, $field:ident, $default:expr) => {
        $f.$field.or($file.$field).unwrap_or($default)
    };
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
    /// Whether `--feature-norm` was given: otherwise `config.feature_norm` is settled by the
    /// features' values ([`TrainPlan::settle_feature_norm`]).
    pub feature_norm_given: bool,
}

impl TrainPlan {
    /// Settles `config.feature_norm` where `--feature-norm` was not given, by `ds`'s feature
    /// values alone ([`grinnder_engine::features::default_prep`]: row normalisation where none is
    /// negative, the values as stored otherwise) — never by the dataset's name, so the same
    /// arrays train alike through any door — and says which it chose and why.
    pub fn settle_feature_norm(&mut self, ds: &grinnder_graph::Dataset) {
        if self.feature_norm_given {
            return;
        }
        let prep = {
            let _phase = grinnder_graph::progress::phase("normalisation (the features' minimum)");
            grinnder_engine::features::default_prep(ds)
        };
        self.config.feature_norm = prep.norm;
        self.config.feature_shift = prep.shift;
        match prep.norm {
            grinnder_engine::FeatureNorm::Row => tracing::info!(
                "feature norm row: no feature value is negative (bag-of-words or TF-IDF), so each \
                 row is divided by its sum; --feature-norm none uses them as stored"
            ),
            grinnder_engine::FeatureNorm::None => tracing::info!(
                "feature norm none: the features are used as stored (some values are negative, as \
                 embeddings' are); --feature-norm row divides each row by its sum"
            ),
        }
    }
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
    /// Whether `--parts` was given (otherwise [`crate::budgets::settle`] chooses).
    pub parts_given: bool,
    pub partitioner: PartitionerArg,
    pub cache_mode: grinnder_engine::CacheMode,
    pub host_mem: Option<u64>,
    pub storage_dir: Option<PathBuf>,
    /// The partition cache's directory (`None`: the default one).
    pub cache_dir: Option<PathBuf>,
    pub tier_dtype: grinnder_engine::TierDtype,
    pub keep_storage: bool,
    pub block_cache: Option<u64>,
    /// With no `--host-mem`, the host memory chosen from the machine ([`crate::budgets`]).
    pub host_auto: Option<grinnder_engine::tiered::HostAuto>,
    /// The partitions and both budgets were chosen from the machine: the executor may take
    /// more partitions where a working set does not fit.
    pub auto_parts: bool,
}

impl TieredPlan {
    /// The executor's defaults over `parts` partitions (every block in RAM).
    pub fn with_parts(parts: usize) -> TieredPlan {
        TieredPlan {
            parts,
            parts_given: false,
            partitioner: PartitionerArg::default(),
            cache_mode: grinnder_engine::CacheMode::Auto,
            host_mem: None,
            storage_dir: None,
            cache_dir: None,
            tier_dtype: grinnder_engine::TierDtype::F32,
            keep_storage: false,
            block_cache: None,
            host_auto: None,
            auto_parts: false,
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
        plan_of(&self.settings, &file)
    }
}

/// `--lr-schedule` with its flags, checked.
fn lr_schedule_of(
    f: &TrainSettings,
    file: &TrainSettings,
    lr: f64,
    epochs: usize,
) -> anyhow::Result<grinnder_nn::LrSchedule> {
    macro_rules! pick {
        ($field:ident, $default:expr) => {
            pick_from!(f, file, $field, $default)
        };
    }
    Ok(match pick!(lr_schedule, LrScheduleArg::Constant) {
        LrScheduleArg::Constant => grinnder_nn::LrSchedule::Constant,
        LrScheduleArg::Step => {
            let (every, gamma) = (pick!(lr_step, 30), pick!(lr_gamma, 0.1));
            anyhow::ensure!(every >= 1, "--lr-step must be at least 1");
            anyhow::ensure!(gamma > 0.0 && gamma.is_finite(), "--lr-gamma must be positive, got {gamma}");
            grinnder_nn::LrSchedule::Step { every, gamma }
        }
        LrScheduleArg::Cosine => {
            let min_lr = pick!(lr_min, 0.0);
            anyhow::ensure!((0.0..=lr).contains(&min_lr), "--lr-min must be in [0, --lr], got {min_lr}");
            grinnder_nn::LrSchedule::Cosine { epochs, min_lr }
        }
    })
}

/// Settings given directly (`f`: flags, Python keywords) over those of a config file (`file`)
/// over the defaults, validated once.
pub fn plan_of(f: &TrainSettings, file: &TrainSettings) -> anyhow::Result<TrainPlan> {
    macro_rules! pick {
        ($field:ident, $default:expr) => {
            pick_from!(f, file, $field, $default)
        };
    }
    let layers = pick!(layers, 2);
    let hidden = pick!(hidden, 16);
    let dropout = pick!(dropout, 0.5);
    // 0 by default: PyG's BasicGNN models (`GCN`, `GraphSAGE`, `GAT`, `GIN`, whose parameter names
    // the model files carry) drop out between layers only, as OGB's examples do; on Cora the mean
    // test accuracy over five seeds was 79.8 % either way (2026-12-06), and a fixed input lets
    // layer 0's aggregation be computed once (no feature, layer-1 input or gradient blocks for it)
    let input_dropout = pick!(input_dropout, 0.0);
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
    let alpha = pick!(alpha, grinnder_nn::model::DEFAULT_ALPHA);
    anyhow::ensure!(grinnder_nn::model::valid_alpha(alpha), "--alpha must be in [0, 1], got {alpha}");
    let theta = pick!(theta, grinnder_nn::model::DEFAULT_THETA);
    anyhow::ensure!(grinnder_nn::model::valid_theta(theta), "--theta must be non-negative, got {theta}");
    let lr_schedule = lr_schedule_of(f, file, lr, epochs)?;
    let patience = f.patience.or(file.patience);
    anyhow::ensure!(
        patience.is_none() || eval_every >= 1,
        "--patience stops on the validation accuracy, which --eval-every 0 never measures: give --eval-every 1 (or drop --patience)"
    );
    anyhow::ensure!(patience != Some(0), "--patience must be at least 1 epoch");
    let optim = match pick!(optimizer, OptimArg::Adam) {
        OptimArg::Adam => grinnder_nn::OptimConfig::Adam { lr, weight_decay },
        OptimArg::Adamw => grinnder_nn::OptimConfig::Adamw { lr, weight_decay },
        OptimArg::Sgd => grinnder_nn::OptimConfig::Sgd { lr, momentum, weight_decay },
    };
    let model = grinnder_nn::ModelConfig {
        kind: pick!(model, grinnder_nn::Kind::Gcn),
        gin_eps: pick!(gin_eps, 0.0),
        train_eps: pick!(train_eps, false),
        alpha,
        theta,
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
    let feature_norm_given = f.feature_norm.or(file.feature_norm).is_some();
    Ok(TrainPlan {
        feature_norm_given,
        config: grinnder_engine::TrainConfig {
            lr_schedule,
            patience,
            model,
            optim,
            epochs,
            eval_every,
            // settled by the dataset where not given (`settle_feature_norm`)
            feature_norm: match pick!(feature_norm, FeatureNormArg::None) {
                FeatureNormArg::None => grinnder_engine::FeatureNorm::None,
                FeatureNormArg::Row => grinnder_engine::FeatureNorm::Row,
            },
            feature_shift: None,
        },
        precision: pick!(precision, PrecisionArg::F32),
        device: {
            let d = Device::parse(&f.device.clone().or(file.device.clone()).unwrap_or_else(|| "cpu".into()))?;
            if d != Device::Cpu {
                anyhow::ensure!(
                    pick!(precision, PrecisionArg::F32) == PrecisionArg::F32,
                    "--device cuda computes in f32 only (drop --precision f64)"
                );
            }
            d
        },
        tiered: tiered_plan(f, file)?,
        minibatch: minibatch_plan(f, file, layers)?,
        tf32: f.tf32.or(file.tf32).unwrap_or(false),
        feature_access: pick!(feature_access, FeatureAccessArg::Copy),
        gpu_mem: byte_size(f.gpu_mem.clone().or(file.gpu_mem.clone()))?,
        transport: pick!(transport, TransportArg::Auto),
        ranks_per_server: match f.ranks_per_server.or(file.ranks_per_server) {
            Some(0) => anyhow::bail!("--ranks-per-server must be at least 1"),
            r => r,
        },
        expansion: expansion_plan(f, file, layers)?,
    })
    .and_then(check_combinations)
}

/// The tiered executor's settings, where any of them is given.
fn tiered_plan(f: &TrainSettings, file: &TrainSettings) -> anyhow::Result<Option<TieredPlan>> {
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
        parts_given: get!(parts).is_some(),
        partitioner: get!(partitioner).unwrap_or_default(),
        cache_mode: match get!(cache_mode).unwrap_or(CacheModeArg::Auto) {
            CacheModeArg::Auto => grinnder_engine::CacheMode::Auto,
            CacheModeArg::LruLayer => grinnder_engine::CacheMode::LruLayer,
            CacheModeArg::PartitionLru => grinnder_engine::CacheMode::PartitionLru,
        },
        host_mem,
        storage_dir,
        cache_dir: get!(cache_dir),
        tier_dtype: match get!(tier_dtype).unwrap_or(TierDtypeArg::F32) {
            TierDtypeArg::F32 => grinnder_engine::TierDtype::F32,
            TierDtypeArg::Bf16 => grinnder_engine::TierDtype::Bf16,
        },
        keep_storage: get!(keep_storage).unwrap_or(false),
        block_cache,
        host_auto: None,
        auto_parts: false,
    }))
}

/// `--mode`'s settings: `None` for full-graph training (refusing mini-batch flags).
fn minibatch_plan(
    f: &TrainSettings,
    file: &TrainSettings,
    layers: usize,
) -> anyhow::Result<Option<grinnder_engine::MiniBatchConfig>> {
    macro_rules! pick {
        ($field:ident, $default:expr) => {
            pick_from!(f, file, $field, $default)
        };
    }
    Ok(match pick!(mode, ModeArg::Full) {
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
    })
}

/// `--expansion`'s settings: what servers train on besides the nodes they own.
fn expansion_plan(
    f: &TrainSettings,
    file: &TrainSettings,
    layers: usize,
) -> anyhow::Result<grinnder_engine::Expansion> {
    macro_rules! pick {
        ($field:ident, $default:expr) => {
            pick_from!(f, file, $field, $default)
        };
    }
    let hops = f.preload_hops.clone().or(file.preload_hops.clone());
    let (eas_hops, eas_fanout) = (f.eas_hops.or(file.eas_hops), f.eas_fanout.or(file.eas_fanout));
    let memory = byte_size(f.host_mem.clone().or(file.host_mem.clone()))?
        .or(byte_size(f.gpu_mem.clone().or(file.gpu_mem.clone()))?);
    Ok(match pick!(expansion, ExpansionArg::None) {
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
                    hops: t
                        .parse()
                        .map_err(|e| anyhow::anyhow!("--preload-hops {t:?}: {e} (a number, or auto)"))?,
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
    })
}

/// Refuses flags that do not go together, and gives mini-batch runs the evaluation's partitions.
fn check_combinations(mut p: TrainPlan) -> anyhow::Result<TrainPlan> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcniis_alpha_and_theta_out_of_range_are_refused_naming_the_flag() {
        let none = TrainSettings::default();
        let with =
            |alpha: Option<f64>, theta: Option<f64>| TrainSettings { alpha, theta, ..Default::default() };
        for (alpha, theta, flag) in [
            (Some(1.5), None, "--alpha"),
            (Some(-0.1), None, "--alpha"),
            (Some(f64::NAN), None, "--alpha"),
            (None, Some(-1.0), "--theta"),
            (None, Some(f64::INFINITY), "--theta"),
            (None, Some(f64::NAN), "--theta"),
        ] {
            let err = plan_of(&with(alpha, theta), &none).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(flag), "{alpha:?} {theta:?}: {err}");
        }
        let plan = plan_of(&with(Some(0.0), Some(0.0)), &none).unwrap();
        assert_eq!((plan.config.model.alpha, plan.config.model.theta), (0.0, 0.0));
    }
}
