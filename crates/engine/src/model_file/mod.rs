//! Model files: a model's weights and what it takes to run it, in the safetensors format with
//! PyG's parameter names and shapes (`convs.0.lin.weight` `[out, in]`, `convs.0.bias` `[out]`,
//! …, stacked as PyG's `BasicGNN` stacks them; `docs/model-files.md` has a table per model), so
//! `safetensors.torch.load_file` gives a state dict PyG's layers take, and a model trained in PyG
//! and saved under those names runs here.
//!
//! The architecture and the feature preprocessing (with the statistic it was fitted with on the
//! training graph) are string entries of the file's metadata ([`Arch`]); a file without them
//! (one written by `safetensors.torch.save_file` without metadata) has its architecture read
//! from the tensors' names and shapes, with no residual and no feature normalisation unless
//! the metadata says otherwise.
//!
//! Invariants: a file is written whole or not at all (temporary, sync, rename); a file is
//! never trusted unchecked — a tensor cut short, a shape that does not match its bytes or the
//! model, a value changed after grinnder wrote it (the `checksums` entry), a missing or unknown
//! tensor is refused, naming the tensor.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use grinnder_graph::Dataset;
use grinnder_nn::model::{valid_alpha, valid_theta, DEFAULT_ALPHA, DEFAULT_THETA};
use grinnder_nn::{Kind, Model, ModelConfig, Norm, OptimConfig};
use grinnder_tensor::{Backend, Mat, Scalar};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use xxhash_rust::xxh3::xxh3_64;

use crate::config::{FeatureNorm, TrainConfig};

mod check;

/// The largest model file read: parameters only (a 1024-wide, 8-layer GAT is tens of MB).
pub const MODEL_FILE_BYTES_MAX: u64 = 4 << 30;

/// What a model file says besides its tensors: the model and its input's preprocessing.
#[derive(Clone, Debug, PartialEq)]
pub struct Arch {
    pub kind: Kind,
    pub layers: usize,
    /// Hidden width (per head for GAT).
    pub hidden: usize,
    /// GAT: heads of the hidden layers (the output layer has one).
    pub heads: usize,
    pub norm: Norm,
    pub residual: bool,
    /// GIN: ε's initial value (the trained value is the `eps` tensor).
    pub gin_eps: f64,
    pub train_eps: bool,
    /// GCNII: α and θ.
    pub alpha: f64,
    pub theta: f64,
    pub in_features: usize,
    pub classes: usize,
    pub feature_norm: FeatureNorm,
    /// The statistic of `feature_norm` on the training graph ([`FeatureNorm::Row`]'s shift).
    pub feature_shift: f64,
    /// The adjacency it was trained on: the edges as given (`--directed`) or made symmetric,
    /// and with edge weights or without; `None` where the file does not say (one saved by
    /// PyG): whatever the run gives is taken.
    pub graph: Option<GraphKind>,
}

/// The adjacency a model was trained on (the metadata entries `directed` and `edge_weight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphKind {
    pub directed: bool,
    pub edge_weight: bool,
}

impl GraphKind {
    /// The adjacency of `ds`.
    pub fn of(ds: &Dataset) -> GraphKind {
        GraphKind { directed: ds.directed, edge_weight: ds.edge_weight.is_some() }
    }
}

impl Arch {
    /// The architecture `cfg` trains on `ds` (its feature width, classes and adjacency), its
    /// features preprocessed with `shift`.
    pub fn of(cfg: &TrainConfig, ds: &Dataset, shift: f64) -> Arch {
        let (in_features, classes) = (ds.features.dim, ds.num_classes as usize);
        let m = &cfg.model;
        Arch {
            kind: m.kind,
            layers: m.layers,
            hidden: m.hidden,
            heads: m.heads_of_hidden(),
            norm: m.norm,
            residual: m.residual,
            gin_eps: m.gin_eps,
            train_eps: m.train_eps,
            alpha: m.alpha,
            theta: m.theta,
            in_features,
            classes,
            feature_norm: cfg.feature_norm,
            feature_shift: shift,
            graph: Some(GraphKind::of(ds)),
        }
    }

    /// The model to run: this architecture without dropout.
    pub fn model_config(&self) -> ModelConfig {
        ModelConfig {
            kind: self.kind,
            layers: self.layers,
            hidden: self.hidden,
            dropout: 0.0,
            input_dropout: 0.0,
            norm: self.norm,
            residual: self.residual,
            heads: self.heads,
            attn_dropout: 0.0,
            gin_eps: self.gin_eps,
            train_eps: self.train_eps,
            alpha: self.alpha,
            theta: self.theta,
            seed: 0,
        }
    }

    /// A configuration that runs the model and trains nothing (no epochs).
    pub fn inference_config(&self) -> TrainConfig {
        TrainConfig {
            lr_schedule: Default::default(),
            patience: None,
            model: self.model_config(),
            optim: OptimConfig::Adam { lr: 0.01, weight_decay: 0.0 },
            epochs: 0,
            eval_every: 0,
            feature_norm: self.feature_norm,
            feature_shift: Some(self.feature_shift),
        }
    }

    /// One line for logs: `gcn, 2 layers, hidden 16, …`.
    pub fn describe(&self) -> String {
        let mut s = format!("{}, {} layers, hidden {}", self.kind.name(), self.layers, self.hidden);
        let heads = self.model_config().heads_of_hidden();
        if heads > 1 {
            s += &format!(" × {heads} heads");
        }
        if self.norm == Norm::Layer {
            s += ", layer norm";
        }
        if self.residual {
            s += ", residual";
        }
        s += &format!(
            ", {} features → {} classes, feature norm {}",
            self.in_features,
            self.classes,
            norm_name(self.feature_norm)
        );
        if let Some(g) = self.graph {
            s += if g.directed { ", directed graph" } else { ", undirected graph" };
            if g.edge_weight {
                s += ", edge weights";
            }
        }
        s
    }

    /// Refuses a dataset whose adjacency is not the one the model was trained on (another
    /// direction, or weights where it had none or none where it had them), naming the fix.
    pub fn check_graph(&self, ds: &Dataset, path: &Path) -> Result<(), ModelFileError> {
        self.check_directed(ds.directed, path)?;
        let Some(g) = self.graph.filter(|g| g.edge_weight != ds.edge_weight.is_some()) else { return Ok(()) };
        let reason = if g.edge_weight {
            "was trained with edge weights, and this graph has none; give it its weights \
             (edge_weight.npy beside edge_index.npy, edge_weight= in Python)"
        } else {
            "was trained without edge weights, and this graph has them; drop them (remove \
             edge_weight.npy, leave out edge_weight= in Python), or train a model with them"
        };
        Err(ModelFileError::Graph { path: path.to_path_buf(), reason: reason.into() })
    }

    /// Refuses a graph read in the other direction than the model's training graph
    /// (`directed`: the edges taken as given), naming the flag: before a graph is loaded.
    pub fn check_directed(&self, directed: bool, path: &Path) -> Result<(), ModelFileError> {
        let Some(g) = self.graph.filter(|g| g.directed != directed) else { return Ok(()) };
        let reason = if g.directed {
            "was trained on a directed graph (its edges as given, --directed); give --directed \
             (directed=True in Python) so that the graph is aggregated as it was in training"
        } else {
            "was trained on an undirected graph (its edges made symmetric); leave out --directed \
             (directed=False in Python) so that the graph is aggregated as it was in training"
        };
        Err(ModelFileError::Graph { path: path.to_path_buf(), reason: reason.into() })
    }

    /// Refuses a dataset the model cannot run on: another feature width, or labels of more
    /// classes than the model predicts.
    pub fn check_dataset(&self, ds: &Dataset, path: &Path) -> Result<(), ModelFileError> {
        let mismatch = |what: &str, file: usize, here: usize| ModelFileError::Dataset {
            path: path.to_path_buf(),
            what: what.into(),
            file,
            here,
        };
        if ds.features.dim != self.in_features {
            return Err(mismatch("features per node", self.in_features, ds.features.dim));
        }
        let classes = ds.num_classes as usize;
        // a graph without labels (every node -1) predicts into the model's classes
        if classes != 0 && classes != self.classes {
            return Err(mismatch("classes", self.classes, classes));
        }
        Ok(())
    }

    fn metadata(&self) -> Vec<(&'static str, String)> {
        let mut m = vec![
            ("model", self.kind.name().into()),
            ("layers", self.layers.to_string()),
            ("hidden", self.hidden.to_string()),
            ("heads", self.heads.to_string()),
            ("norm", if self.norm == Norm::Layer { "layer" } else { "none" }.into()),
            ("residual", self.residual.to_string()),
            ("gin_eps", self.gin_eps.to_string()),
            ("train_eps", self.train_eps.to_string()),
            ("alpha", self.alpha.to_string()),
            ("theta", self.theta.to_string()),
            ("in_features", self.in_features.to_string()),
            ("classes", self.classes.to_string()),
            ("feature_norm", norm_name(self.feature_norm).into()),
            ("feature_shift", self.feature_shift.to_string()),
        ];
        if let Some(g) = self.graph {
            m.push(("directed", g.directed.to_string()));
            m.push(("edge_weight", g.edge_weight.to_string()));
        }
        m
    }
}

fn norm_name(n: FeatureNorm) -> &'static str {
    match n {
        FeatureNorm::None => "none",
        FeatureNorm::Row => "row",
    }
}

/// One tensor: PyG's name and shape, its values row-major.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// The element type tensors are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    F32,
    F64,
}

/// A model file's contents.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFile {
    pub arch: Arch,
    pub tensors: Vec<Tensor>,
    pub value_type: ValueType,
    /// Free text kept in the metadata (`params`: which parameters these are).
    pub note: Option<String>,
    /// Where it was read from.
    pub path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelFileError {
    #[error("cannot read model file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write model file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a usable model file: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("model file {path}: tensor {name}: {reason}")]
    Tensor { path: PathBuf, name: String, reason: String },
    #[error("model file {path}: metadata {key} = {value:?}: {reason}")]
    Metadata { path: PathBuf, key: String, value: String, reason: String },
    #[error(
        "model file {path} is for {file} {what}, but the dataset has {here}; a model runs on \
         graphs with the features and classes it was trained on"
    )]
    Dataset { path: PathBuf, what: String, file: usize, here: usize },
    /// The dataset's adjacency is not the model's (direction, weights).
    #[error("model file {path} {reason}")]
    Graph { path: PathBuf, reason: String },
}

impl From<ModelFileError> for crate::config::TrainError {
    /// A dataset the model does not fit (its features, classes, direction or weights) is a
    /// setting refused (Python's `ValueError`), as the dataset's own checks are; a file that
    /// cannot be read, written or parsed stays a file's error (`OSError`).
    fn from(e: ModelFileError) -> Self {
        use crate::config::TrainError;
        match e {
            ModelFileError::Dataset { .. } | ModelFileError::Graph { .. } => {
                TrainError::Config(e.to_string())
            }
            e => TrainError::ModelFile(e.to_string()),
        }
    }
}

impl ModelFile {
    /// The current values of `model`'s parameters (and PyG's buffers: a fixed GIN ε).
    pub fn capture<B: Backend>(b: &B, model: &mut Model<B>, arch: Arch, note: Option<String>) -> ModelFile {
        let value_type = if std::mem::size_of::<B::T>() == 8 { ValueType::F64 } else { ValueType::F32 };
        let mut tensors = capture_tensors(b, model);
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        ModelFile { arch, tensors, value_type, note, path: None }
    }

    /// Writes the file atomically (see the module docs).
    pub fn save(&self, path: &Path) -> Result<(), ModelFileError> {
        let bytes = self.to_bytes().map_err(|reason| ModelFileError::Format { path: path.into(), reason })?;
        grinnder_graph::io::files::write_whole(path, &bytes)
            .map_err(|source| ModelFileError::Write { path: path.into(), source })
    }

    fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let (dtype, size) = match self.value_type {
            ValueType::F32 => (Dtype::F32, 4),
            ValueType::F64 => (Dtype::F64, 8),
        };
        let bytes: Vec<Vec<u8>> = self
            .tensors
            .iter()
            .map(|t| match self.value_type {
                ValueType::F32 => t.data.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
                ValueType::F64 => t.data.iter().flat_map(|&x| x.to_le_bytes()).collect(),
            })
            .collect();
        let mut meta: HashMap<String, String> =
            self.arch.metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        meta.insert("format".into(), "pt".into());
        meta.insert("producer".into(), format!("grinnder {}", env!("CARGO_PKG_VERSION")));
        if let Some(n) = &self.note {
            meta.insert("params".into(), n.clone());
        }
        let sums: BTreeMap<&str, String> = self
            .tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| (t.name.as_str(), format!("{:016x}", xxh3_64(b))))
            .collect();
        meta.insert("checksums".into(), serde_json::to_string(&sums).expect("strings serialise"));
        let sealed = check::seal(
            &meta,
            self.tensors.iter().map(|t| (t.name.as_str(), format!("{dtype:?}"), t.shape.as_slice())),
        );
        meta.insert("checksum".into(), sealed);
        let views = self
            .tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| {
                debug_assert_eq!(b.len(), t.shape.iter().product::<usize>() * size);
                TensorView::new(dtype, t.shape.clone(), b).map(|v| (t.name.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        safetensors::serialize(views, Some(meta)).map_err(|e| e.to_string())
    }

    /// Reads and checks a model file (see the module docs).
    pub fn load(path: &Path) -> Result<ModelFile, ModelFileError> {
        Self::from_bytes(&check::read(path)?, path)
    }

    fn from_bytes(bytes: &[u8], path: &Path) -> Result<ModelFile, ModelFileError> {
        let diagnose = |e: safetensors::SafeTensorError| check::diagnose_bytes(bytes, path, &e.to_string());
        let st = SafeTensors::deserialize(bytes).map_err(diagnose)?;
        let meta = SafeTensors::read_metadata(bytes)
            .map(|(_, m)| m.metadata().clone().unwrap_or_default())
            .map_err(diagnose)?;
        let views = st.tensors();
        check::metadata(
            &meta,
            views.iter().map(|(n, v)| (n.as_str(), format!("{:?}", v.dtype()), v.shape())),
            path,
        )?;
        let sums: Option<HashMap<String, String>> = match meta.get("checksums") {
            None => None,
            Some(s) => Some(serde_json::from_str(s).map_err(|e| ModelFileError::Metadata {
                path: path.into(),
                key: "checksums".into(),
                value: s.clone(),
                reason: e.to_string(),
            })?),
        };
        let mut tensors = Vec::new();
        let mut value_type = ValueType::F32;
        for (name, view) in views {
            let tensor_err =
                |reason: String| ModelFileError::Tensor { path: path.into(), name: name.clone(), reason };
            if let Some(sums) = &sums {
                let want = sums.get(&name).ok_or_else(|| {
                    tensor_err(
                        "not among the tensors grinnder wrote (its checksums); the file was changed".into(),
                    )
                })?;
                if *want != format!("{:016x}", xxh3_64(view.data())) {
                    return Err(tensor_err(
                        "its values differ from what grinnder wrote (checksum); the file was changed after it was saved"
                            .into(),
                    ));
                }
            }
            if view.dtype() == Dtype::F64 {
                value_type = ValueType::F64;
            }
            let data = values(&view).map_err(tensor_err)?;
            if let Some(i) = data.iter().position(|x| !x.is_finite()) {
                return Err(tensor_err(format!("value {i} is {}", data[i])));
            }
            tensors.push(Tensor { name: canonical(&name), shape: view.shape().to_vec(), data });
        }
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(ModelFileError::Tensor {
                path: path.into(),
                name: w[0].name.clone(),
                reason: "given twice (under PyG's GIN model name and GINConv's)".into(),
            });
        }
        let arch = arch_of(&tensors, &meta, path)?;
        let file = ModelFile {
            arch,
            tensors,
            value_type,
            note: meta.get("params").cloned(),
            path: Some(path.into()),
        };
        // every tensor named and shaped as the model's
        file.apply(&grinnder_tensor::Cpu::<f32>::new(), &mut file.template(), path)?;
        Ok(file)
    }

    /// A model of this architecture (initial weights) on the CPU, to check names and shapes.
    fn template(&self) -> Model<grinnder_tensor::Cpu<f32>> {
        Model::init(
            &grinnder_tensor::Cpu::new(),
            self.arch.model_config(),
            self.arch.in_features,
            self.arch.classes,
        )
    }

    /// A model of the file's architecture with its weights, on `b`.
    pub fn model<B: Backend>(&self, b: &B) -> Model<B> {
        let mut m = Model::init(b, self.arch.model_config(), self.arch.in_features, self.arch.classes);
        self.apply(b, &mut m, Path::new("")).expect("checked when the file was read");
        m
    }

    /// Sets `model`'s parameters (and buffers) to the file's; every one must be in the file,
    /// shaped as the model's, and the file may hold nothing else. `path` names the file in errors.
    pub fn apply<B: Backend>(&self, b: &B, model: &mut Model<B>, path: &Path) -> Result<(), ModelFileError> {
        let by_name: HashMap<&str, &Tensor> = self.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut used = 0;
        let describe = format!("the model is {}", self.arch.describe());
        for p in model.state_mut() {
            let err =
                |reason: String| ModelFileError::Tensor { path: path.into(), name: p.name.clone(), reason };
            let t = by_name.get(p.name.as_str()).ok_or_else(|| err(format!("missing ({describe})")))?;
            if t.shape != p.shape {
                return Err(err(format!(
                    "shaped {:?} in the file, {:?} in the model ({describe})",
                    t.shape, p.shape
                )));
            }
            let (r, c) = b.dims(&p.value);
            p.value = b.upload(&Mat::from_vec(r, c, t.data.iter().map(|&x| B::T::of(x)).collect()));
            used += 1;
        }
        if used != self.tensors.len() {
            let known: Vec<String> = model.state_mut().iter().map(|p| p.name.clone()).collect();
            let extra =
                self.tensors.iter().find(|t| !known.contains(&t.name)).expect("a tensor the model lacks");
            return Err(ModelFileError::Tensor {
                path: path.into(),
                name: extra.name.clone(),
                reason: format!("not a parameter of the model ({describe})"),
            });
        }
        Ok(())
    }
}

/// `model`'s state (parameters and buffers) as stored: PyG's names and shapes.
pub fn capture_tensors<B: Backend>(b: &B, model: &mut Model<B>) -> Vec<Tensor> {
    model
        .state_mut()
        .into_iter()
        .map(|p| Tensor {
            name: p.name.clone(),
            shape: p.shape.clone(),
            data: b.download(&p.value).data.iter().map(|x| x.f64()).collect(),
        })
        .collect()
}

/// PyG's `GIN` model wraps each `GINConv`'s MLP in an `MLP` (`nn.lins.0`, `nn.lins.1`); a
/// `GINConv` given `Sequential(Linear, ReLU, Linear)` names them `nn.0`, `nn.2`.
fn canonical(name: &str) -> String {
    name.replace(".nn.lins.0.", ".nn.0.").replace(".nn.lins.1.", ".nn.2.")
}

/// A tensor's values as f64 (F32, F64, F16 and BF16 are read).
fn values(v: &TensorView<'_>) -> Result<Vec<f64>, String> {
    let d = v.data();
    Ok(match v.dtype() {
        Dtype::F32 => {
            d.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64).collect()
        }
        Dtype::F64 => d.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes(c.try_into().expect("2 bytes")).to_f64())
            .collect(),
        Dtype::BF16 => d
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes(c.try_into().expect("2 bytes")).to_f64())
            .collect(),
        t => return Err(format!("element type {t:?}; model files hold F32, F64, F16 or BF16")),
    })
}

/// The architecture of a file: its metadata, and what the tensors' names and shapes say where
/// the metadata is silent (a file saved by PyG).
fn arch_of(tensors: &[Tensor], meta: &HashMap<String, String>, path: &Path) -> Result<Arch, ModelFileError> {
    let shape = |name: &str| tensors.iter().find(|t| t.name == name).map(|t| t.shape.clone());
    let format = |reason: String| ModelFileError::Format { path: path.into(), reason };
    let inferred_kind = Kind::recognise(|n| shape(n).is_some()).ok_or_else(|| {
        format(format!(
            "no first layer: expected {}; it holds {}",
            Kind::ALL.map(|k| format!("{} ({})", k.family().first_map(0), k.name())).join(", "),
            tensors.iter().take(6).map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
        ))
    })?;
    let m = Meta { meta, path };
    let kind = m.get("model", inferred_kind, Kind::parse)?;
    let layers_seen =
        (0..).take_while(|l| tensors.iter().any(|t| t.name.starts_with(&format!("convs.{l}.")))).count();
    let layers = m.get("layers", layers_seen, |s| s.parse().ok())?;
    let last = layers.saturating_sub(1);
    let first = shape(&kind.family().first_map(0)).filter(|s| s.len() == 2);
    let (first_out, in_seen) = first.map(|s| (s[0], s[1])).ok_or_else(|| {
        format(format!("its first layer has no {} of two dimensions", kind.family().first_map(0)))
    })?;
    let heads_seen = match kind.family().heads_tensor(0) {
        Some(t) if layers > 1 => shape(&t).and_then(|s| s.get(1).copied()).unwrap_or(1),
        _ => 1,
    };
    let classes_seen = shape(&kind.family().output_map(last)).and_then(|s| s.first().copied()).unwrap_or(0);
    let eps_seen = tensors.iter().find(|t| t.name == "convs.0.eps").and_then(|t| t.data.first().copied());
    let parse_bool = |s: &str| match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    };
    let arch = Arch {
        kind,
        layers,
        hidden: m
            .get("hidden", if layers > 1 { first_out / heads_seen.max(1) } else { 1 }, |s| s.parse().ok())?,
        heads: m.get("heads", heads_seen, |s| s.parse().ok())?,
        norm: m.get(
            "norm",
            if shape("norms.0.weight").is_some() { Norm::Layer } else { Norm::None },
            |s| match s.to_ascii_lowercase().as_str() {
                "layer" | "layer_norm" | "layernorm" => Some(Norm::Layer),
                "none" => Some(Norm::None),
                _ => None,
            },
        )?,
        residual: m.get("residual", false, parse_bool)?,
        gin_eps: m.get("gin_eps", eps_seen.unwrap_or(0.0), |s| s.parse().ok())?,
        train_eps: m.get("train_eps", false, parse_bool)?,
        alpha: m.get("alpha", DEFAULT_ALPHA, |s| s.parse().ok().filter(|&a| valid_alpha(a)))?,
        theta: m.get("theta", DEFAULT_THETA, |s| s.parse().ok().filter(|&t| valid_theta(t)))?,
        in_features: m.get("in_features", in_seen, |s| s.parse().ok())?,
        classes: m.get("classes", classes_seen, |s| s.parse().ok())?,
        feature_norm: m.get("feature_norm", FeatureNorm::None, |s| {
            match s.to_ascii_lowercase().as_str() {
                "none" => Some(FeatureNorm::None),
                "row" => Some(FeatureNorm::Row),
                _ => None,
            }
        })?,
        feature_shift: m.get("feature_shift", 0.0, |s| s.parse().ok().filter(|x: &f64| x.is_finite()))?,
        graph: graph_kind(&m, parse_bool)?,
    };
    let seen = check::Seen {
        layers: layers_seen,
        in_features: in_seen,
        first_out,
        heads: heads_seen,
        classes: classes_seen,
        values: tensors.iter().map(|t| t.data.len() as u64).sum(),
    };
    check::agrees(&arch, &seen, path)?;
    Ok(arch)
}

/// The adjacency a file's model was trained on: its entries; a file grinnder wrote before
/// they existed was trained on an undirected, unweighted graph (the only kind there was); a
/// file of another producer without them says nothing (`None`).
fn graph_kind(
    m: &Meta<'_>,
    parse_bool: impl Fn(&str) -> Option<bool> + Copy,
) -> Result<Option<GraphKind>, ModelFileError> {
    let said = m.meta.contains_key("directed") || m.meta.contains_key("edge_weight");
    let grinnders = m.meta.get("producer").is_some_and(|p| p.starts_with("grinnder"));
    if !said && !grinnders {
        return Ok(None);
    }
    Ok(Some(GraphKind {
        directed: m.get("directed", false, parse_bool)?,
        edge_weight: m.get("edge_weight", false, parse_bool)?,
    }))
}

/// Metadata entries, parsed or defaulted.
struct Meta<'a> {
    meta: &'a HashMap<String, String>,
    path: &'a Path,
}

impl Meta<'_> {
    fn get<T>(&self, key: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> Result<T, ModelFileError> {
        match self.meta.get(key) {
            None => Ok(default),
            Some(v) => parse(v.trim()).ok_or_else(|| ModelFileError::Metadata {
                path: self.path.into(),
                key: key.into(),
                value: v.clone(),
                reason: "not a value this entry takes (docs/model-files.md lists them)".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
