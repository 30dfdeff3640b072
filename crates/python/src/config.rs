//! `grinnder.Config`: a run's settings as keywords whose names are the CLI's flags with `_` for
//! `-` and the keys of `--config` TOML files — the same struct ([`TrainSettings`]) parses all
//! three and the same function ([`plan_of`]) validates them, so they cannot drift. An unknown
//! keyword is refused naming the closest known one.

use std::path::PathBuf;

use clap::Args;
use grinnder_cli::args::TrainSettings;
use grinnder_cli::plan::{plan_of, TrainPlan};
use grinnder_engine::CheckpointConfig;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::value_error;

/// Keywords beyond the training settings: the CLI's checkpoint flags and `--init-from`.
const RUN_KEYWORDS: [(&str, &str); 5] = [
    ("checkpoint_dir", "Write checkpoints (parameters, optimizer state, epoch) into this directory."),
    ("checkpoint_every", "Checkpoint every this many epochs (and after the last) [default: 1]."),
    ("checkpoint_keep", "Checkpoints kept (the newest) [default: 3]."),
    ("resume", "Continue from the newest valid checkpoint in checkpoint_dir [default: false]."),
    ("init_from", "Start from the weights of this model file instead of a fresh initialisation."),
];

/// Every keyword `Config` takes, with its help text (the CLI's `--help` for the flag).
fn keywords() -> Vec<(String, String)> {
    let cmd = TrainSettings::augment_args(clap::Command::new("settings"));
    let mut v: Vec<(String, String)> = cmd
        .get_arguments()
        .map(|a| (a.get_id().to_string(), a.get_help().map(|h| h.to_string()).unwrap_or_default()))
        .collect();
    v.extend(RUN_KEYWORDS.iter().map(|(k, h)| (k.to_string(), h.to_string())));
    v
}

/// The settings `grinnder.Config` takes: name → the CLI's help for it.
#[pyfunction]
pub fn settings(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (k, h) in keywords() {
        d.set_item(k, h)?;
    }
    Ok(d)
}

/// Edit distance, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = (prev + (ca != b[j]) as usize).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// A keyword's value as the settings' text form takes it: booleans, numbers, text; paths as
/// text; a list of numbers (`fanout=[15, 10]`) as `15,10`.
fn json_of(key: &str, v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    use serde_json::Value as J;
    if v.is_instance_of::<PyBool>() {
        return Ok(J::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(J::from(v.extract::<i64>()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(J::from(v.extract::<f64>()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(J::String(v.extract()?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let parts: Vec<String> =
            v.try_iter()?.map(|x| x.and_then(|x| x.str().map(|s| s.to_string()))).collect::<PyResult<_>>()?;
        return Ok(J::String(parts.join(",")));
    }
    if v.hasattr("__fspath__")? {
        let p: PathBuf = v.extract()?;
        return Ok(J::String(p.display().to_string()));
    }
    Err(value_error(format!("{key}: a {} is not a setting's value", v.get_type().name()?)))
}

/// Validated settings of a run.
#[pyclass(module = "grinnder", frozen)]
#[derive(Clone)]
pub struct Config {
    pub(crate) plan: TrainPlan,
    pub(crate) checkpoint: Option<CheckpointConfig>,
    pub(crate) init_from: Option<PathBuf>,
    /// The keywords given, for `repr` and `to_dict`.
    given: Vec<(String, String)>,
}

impl Config {
    /// The settings of `kwargs` (names as `Config` takes them).
    pub(crate) fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
        let known = keywords();
        let mut settings = serde_json::Map::new();
        let mut run = serde_json::Map::new();
        let mut given = Vec::new();
        for (k, v) in kwargs.into_iter().flat_map(|d| d.iter()) {
            let key: String = k.extract()?;
            if !known.iter().any(|(n, _)| *n == key) {
                let closest = known.iter().min_by_key(|(n, _)| distance(&key, n)).map(|(n, _)| n.as_str());
                return Err(value_error(format!(
                    "unknown setting {key:?}{} (grinnder.settings() lists them all)",
                    closest.map_or(String::new(), |c| format!(": did you mean {c:?}?"))
                )));
            }
            if v.is_none() {
                continue;
            }
            let value = json_of(&key, &v)?;
            given.push((key.clone(), v.repr()?.to_string()));
            let into = if RUN_KEYWORDS.iter().any(|(n, _)| *n == key) { &mut run } else { &mut settings };
            into.insert(key, value);
        }
        // each setting alone first, so that a wrong value is named with its key; numbers for
        // settings written as text ("8GiB" or 8589934592) are taken as their text
        for (k, v) in settings.iter_mut() {
            let one = |v: &serde_json::Value| {
                let mut m = serde_json::Map::new();
                m.insert(k.clone(), v.clone());
                serde_json::from_value::<TrainSettings>(serde_json::Value::Object(m))
            };
            if one(v).is_err() && v.is_number() {
                let text = serde_json::Value::String(v.to_string());
                if one(&text).is_ok() {
                    *v = text;
                }
            }
            // names of choices in any case, as the command line takes them ("GCN", "Adam")
            if let Some(lower) = v.as_str().map(str::to_lowercase).filter(|_| one(v).is_err()) {
                let lower = serde_json::Value::String(lower);
                if one(&lower).is_ok() {
                    *v = lower;
                }
            }
            one(v).map_err(|e| value_error(format!("{k}={v}: {e}")))?;
        }
        let s: TrainSettings =
            serde_json::from_value(serde_json::Value::Object(settings)).map_err(value_error)?;
        let plan = plan_of(&s, &TrainSettings::default()).map_err(|e| value_error(format!("{e:#}")))?;
        let text = |k: &str| run.get(k).and_then(|v| v.as_str().map(str::to_string));
        let int = |k: &str, d: usize| -> PyResult<usize> {
            match run.get(k) {
                None => Ok(d),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n >= 1)
                    .map(|n| n as usize)
                    .ok_or_else(|| value_error(format!("{k} must be a whole number of at least 1"))),
            }
        };
        let resume = run
            .get("resume")
            .map(|v| v.as_bool().ok_or_else(|| value_error("resume must be True or False")))
            .transpose()?
            .unwrap_or(false);
        let checkpoint = match text("checkpoint_dir") {
            Some(dir) => Some(CheckpointConfig {
                dir: dir.into(),
                every: int("checkpoint_every", 1)?,
                keep: int("checkpoint_keep", 3)?,
                resume,
            }),
            None if resume || run.contains_key("checkpoint_every") || run.contains_key("checkpoint_keep") => {
                return Err(value_error("resume, checkpoint_every and checkpoint_keep need checkpoint_dir"))
            }
            None => None,
        };
        Ok(Config { plan, checkpoint, init_from: text("init_from").map(PathBuf::from), given })
    }
}

#[pymethods]
impl Config {
    /// Settings by keyword: the CLI's flags with `_` for `-` (`hidden=256`, `host_mem="8GiB"`,
    /// `storage_dir="/nvme/tmp"`, `device="cuda"`, `epochs=200`, …; `grinnder.settings()` lists
    /// them with their help), validated as the CLI validates them: a wrong name or value raises
    /// `ValueError` saying which.
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
        Config::from_kwargs(kwargs)
    }

    /// The keywords given (their Python repr).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.given {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Epochs `fit` trains.
    #[getter]
    fn epochs(&self) -> usize {
        self.plan.config.epochs
    }

    fn __repr__(&self) -> String {
        let args: Vec<String> = self.given.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("Config({})", args.join(", "))
    }
}
