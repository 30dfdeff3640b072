//! What a model file must pass before anything it says is used: a header that describes
//! exactly the file's bytes (checked before its data is read), metadata sealed by grinnder's
//! `checksum` together with the tensors' names, types and shapes, and sizes in the metadata
//! that agree with the tensors (checked before a model is allocated from them).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use super::{Arch, ModelFileError, MODEL_FILE_BYTES_MAX};

/// The safetensors format's bound on a header (`safetensors`' `MAX_HEADER_SIZE`).
const HEADER_BYTES_MAX: u64 = 100_000_000;

/// The metadata entries grinnder writes; a file grinnder wrote holds no others.
const KNOWN_KEYS: [&str; 21] = [
    "model",
    "layers",
    "hidden",
    "heads",
    "norm",
    "residual",
    "gin_eps",
    "train_eps",
    "alpha",
    "theta",
    "in_features",
    "classes",
    "feature_norm",
    "feature_shift",
    "directed",
    "edge_weight",
    "format",
    "producer",
    "params",
    "checksums",
    "checksum",
];

/// Reads a model file whole, once its header has said how long the file must be: a file
/// longer than its tensors (a sparse or appended-to file) or shorter is refused after reading
/// its header alone.
pub(super) fn read(path: &Path) -> Result<Vec<u8>, ModelFileError> {
    let read_err = |source| ModelFileError::Read { path: path.into(), source };
    let format = |reason: String| ModelFileError::Format { path: path.into(), reason };
    let mut file = grinnder_graph::io::files::open_input(path).map_err(read_err)?;
    let len = file.metadata().map_err(read_err)?.len();
    if len > MODEL_FILE_BYTES_MAX {
        return Err(format(format!(
            "it is {len} bytes, more than a model file can be ({MODEL_FILE_BYTES_MAX} bytes at most)"
        )));
    }
    if len < 8 {
        return Err(format(format!("{len} bytes, shorter than a safetensors header")));
    }
    let mut bytes = vec![0u8; 8];
    file.read_exact(&mut bytes).map_err(read_err)?;
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n > HEADER_BYTES_MAX.min(len - 8) {
        return Err(format(format!(
            "its header claims {n} bytes but the file has {len}: not a safetensors file, or cut short"
        )));
    }
    bytes.resize(8 + n as usize, 0);
    file.read_exact(&mut bytes[8..]).map_err(read_err)?;
    let data_len = len - 8 - n;
    let Some(end) = data_end(&bytes[8..]) else {
        return Err(diagnose(&bytes[8..], data_len, path, "its header is not a safetensors header"));
    };
    if end > data_len {
        return Err(diagnose(&bytes[8..], data_len, path, "cut short"));
    }
    if end < data_len {
        return Err(format(format!(
            "{} bytes follow its last tensor's data (the file is {len} bytes, its header describes {}): \
             the file was appended to, or is not a model file",
            data_len - end,
            8 + n + end
        )));
    }
    file.take(data_len).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 != len {
        return Err(format(format!("it changed while it was read ({len} bytes, then {})", bytes.len())));
    }
    Ok(bytes)
}

/// Where the last tensor's data ends in the data section, from a header's JSON (`None`: not a
/// header of tensors).
fn data_end(header: &[u8]) -> Option<u64> {
    let map: BTreeMap<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    map.iter().filter(|(k, _)| *k != "__metadata__").try_fold(0u64, |end, (_, v)| {
        let o = v.get("data_offsets")?.as_array()?;
        Some(end.max(o.get(1)?.as_u64()?))
    })
}

/// The `checksum` entry: xxh3 of every other metadata entry (by key) and of each tensor's
/// name, element type and shape, so that a changed entry, name, type or shape is refused as
/// a changed value is (by the `checksums` of the tensors' bytes, an entry it covers).
pub(super) fn seal<'a>(
    meta: &HashMap<String, String>,
    tensors: impl Iterator<Item = (&'a str, String, &'a [usize])>,
) -> String {
    let meta: BTreeMap<&str, &str> =
        meta.iter().filter(|(k, _)| *k != "checksum").map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut tensors: Vec<_> = tensors.collect();
    tensors.sort();
    let bytes = serde_json::to_vec(&(meta, tensors)).expect("strings and integers serialise");
    format!("{:016x}", xxh3_64(&bytes))
}

/// Refuses metadata grinnder did not write into a file it wrote: an entry it does not write,
/// or entries, tensor names, types or shapes its `checksum` does not match. A file of another
/// producer (PyG's, with or without metadata) is read as it is; a file grinnder wrote without
/// the `checksum` entry (before 2026-12-05, or with it removed) is refused unless
/// [`UNSEALED_VAR`] is set, and then accepted when its entries are grinnder's.
pub(super) fn metadata<'a>(
    meta: &HashMap<String, String>,
    tensors: impl Iterator<Item = (&'a str, String, &'a [usize])>,
    path: &Path,
) -> Result<(), ModelFileError> {
    metadata_with(meta, tensors, path, unsealed_accepted())
}

/// [`metadata`], a file without the `checksum` entry accepted or not.
pub(super) fn metadata_with<'a>(
    meta: &HashMap<String, String>,
    tensors: impl Iterator<Item = (&'a str, String, &'a [usize])>,
    path: &Path,
    accept_unsealed: bool,
) -> Result<(), ModelFileError> {
    let grinnders = meta.get("producer").is_some_and(|p| p.starts_with("grinnder"))
        || meta.contains_key("checksums")
        || meta.contains_key("checksum");
    if !grinnders {
        return Ok(());
    }
    let changed = |key: &str, value: &str, what: &str| ModelFileError::Metadata {
        path: path.into(),
        key: key.into(),
        value: value.into(),
        reason: format!("{what}: the file was changed after grinnder saved it"),
    };
    let mut keys: Vec<&String> = meta.keys().collect();
    keys.sort();
    if let Some(k) = keys.into_iter().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
        return Err(changed(k, &meta[k], "not an entry grinnder writes"));
    }
    match meta.get("checksum") {
        Some(want) if seal(meta, tensors) != *want => Err(changed(
            "checksum",
            want,
            "the metadata or the tensors' names, types or shapes differ from what it covers",
        )),
        Some(_) => Ok(()),
        None if accept_unsealed => {
            tracing::warn!(
                "model file {}: no checksum entry; its metadata is taken as written ({UNSEALED_VAR}=1)",
                path.display()
            );
            Ok(())
        }
        None => Err(ModelFileError::Metadata {
            path: path.into(),
            key: "checksum".into(),
            value: String::new(),
            reason: format!(
                "absent from a file grinnder wrote: grinnder seals every file it writes, so this one was written before 2026-12-05 or had its checksum removed, and its metadata (which changes predictions) cannot be checked; train it again, or set {UNSEALED_VAR}=1 to read it as written"
            ),
        }),
    }
}

/// The variable that lets a grinnder file without a `checksum` entry be read (files written
/// before 2026-12-05 have none).
pub(super) const UNSEALED_VAR: &str = "GRINNDER_UNSEALED_MODELS";

/// Whether [`UNSEALED_VAR`] is `1`.
fn unsealed_accepted() -> bool {
    std::env::var(UNSEALED_VAR).is_ok_and(|v| v == "1")
}

/// What the tensors say of the model, to hold the metadata against.
pub(super) struct Seen {
    pub layers: usize,
    pub in_features: usize,
    /// The first layer's output width (GAT: all heads).
    pub first_out: usize,
    pub heads: usize,
    pub classes: usize,
    /// Values in all tensors.
    pub values: u64,
}

/// Refuses metadata whose sizes the tensors contradict, before a model of those sizes is
/// allocated: a file cannot make grinnder allocate more than a few times what it holds.
pub(super) fn agrees(arch: &Arch, seen: &Seen, path: &Path) -> Result<(), ModelFileError> {
    let wrong = |key: &str, value: usize, reason: String| ModelFileError::Metadata {
        path: path.into(),
        key: key.into(),
        value: value.to_string(),
        reason,
    };
    if arch.layers != seen.layers {
        let held = match seen.layers {
            0 => "none".to_string(),
            n => format!("{n} (convs.0 … convs.{})", n - 1),
        };
        return Err(wrong("layers", arch.layers, format!("the tensors hold the layers {held}")));
    }
    if arch.in_features != seen.in_features {
        return Err(wrong(
            "in_features",
            arch.in_features,
            format!("the first layer takes {} features", seen.in_features),
        ));
    }
    if arch.classes != seen.classes {
        return Err(wrong("classes", arch.classes, format!("the last layer gives {} outputs", seen.classes)));
    }
    if arch.hidden == 0 || arch.heads == 0 {
        let (key, v) = if arch.hidden == 0 { ("hidden", arch.hidden) } else { ("heads", arch.heads) };
        return Err(wrong(key, v, "a model has at least one".into()));
    }
    let heads = arch.model_config().heads_of_hidden();
    let Some(width) = arch.hidden.checked_mul(heads) else {
        return Err(wrong("hidden", arch.hidden, format!("× {heads} heads is more than a machine holds")));
    };
    if arch.layers > 1 && (width != seen.first_out || heads != seen.heads) {
        return Err(wrong(
            "hidden",
            arch.hidden,
            format!(
                "with {heads} heads, the first layer would give {width} outputs; it gives {} ({} heads)",
                seen.first_out, seen.heads
            ),
        ));
    }
    for (key, v) in [("gin_eps", arch.gin_eps), ("feature_shift", arch.feature_shift)] {
        if !v.is_finite() {
            return Err(ModelFileError::Metadata {
                path: path.into(),
                key: key.into(),
                value: v.to_string(),
                reason: "not a finite number".into(),
            });
        }
    }
    // what each family's parameters can be at most against what the file holds (weights,
    // biases, attention vectors and norms are all in the file)
    let bound = arch.model_config().parameter_bound(arch.in_features, arch.classes);
    if bound.is_none_or(|b| b > 4 * seen.values + 4096) {
        return Err(wrong(
            "layers",
            arch.layers,
            format!(
                "a model of these sizes ({}) holds more parameters than the file's {} values",
                arch.describe(),
                seen.values
            ),
        ));
    }
    Ok(())
}

/// An error of the safetensors reader, naming the tensor at fault where the header (`header`,
/// its JSON) tells; `data_len` is the data section's length.
pub(super) fn diagnose(header: &[u8], data_len: u64, path: &Path, reason: &str) -> ModelFileError {
    let format = |reason: String| ModelFileError::Format { path: path.into(), reason };
    let Ok(map) = serde_json::from_slice::<BTreeMap<String, serde_json::Value>>(header) else {
        return format(format!("its header is not JSON ({reason})"));
    };
    // (name, shape, dtype, data offsets)
    type Info = (String, Vec<u64>, String, (u64, u64));
    let mut infos: Vec<Info> = map
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(k, v)| {
            let shape =
                v.get("shape")?.as_array()?.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>()?;
            let dtype = v.get("dtype")?.as_str()?.to_string();
            let o = v.get("data_offsets")?.as_array()?;
            Some((k.clone(), shape, dtype, (o.first()?.as_u64()?, o.get(1)?.as_u64()?)))
        })
        .collect();
    infos.sort_by_key(|i| i.3);
    for (name, shape, dtype, (s, e)) in &infos {
        let size = match dtype.as_str() {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            _ => 1,
        };
        let want = shape.iter().try_fold(size, |a: u64, &d| a.checked_mul(d));
        let tensor =
            |reason: String| ModelFileError::Tensor { path: path.into(), name: name.clone(), reason };
        if *e > data_len {
            return tensor(format!(
                "its data ends at byte {e} of the data section, but the file holds {data_len}: the file is cut short"
            ));
        }
        if want != Some(e.saturating_sub(*s)) {
            return tensor(format!(
                "shape {shape:?} of {dtype} needs {} bytes, its offsets {s}..{e} give {}",
                want.map_or("more".into(), |w| w.to_string()),
                e.saturating_sub(*s)
            ));
        }
    }
    format(reason.to_string())
}

/// [`diagnose`] for a whole file's bytes.
pub(super) fn diagnose_bytes(bytes: &[u8], path: &Path, reason: &str) -> ModelFileError {
    let format = |reason: String| ModelFileError::Format { path: path.into(), reason };
    let Some(n) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))) else {
        return format(format!("{} bytes, shorter than a safetensors header", bytes.len()));
    };
    let Some(header) = usize::try_from(n).ok().and_then(|n| bytes.get(8..8usize.saturating_add(n))) else {
        return format(format!("its header claims {n} bytes but the file has {}: cut short?", bytes.len()));
    };
    diagnose(header, (bytes.len() - 8 - header.len()) as u64, path, reason)
}
