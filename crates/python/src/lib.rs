//! `import grinnder`: the engine's `Trainer` for Python, over numpy arrays, torch tensors and
//! PyG `Data` objects (the Python half lives in `python/grinnder/`: the PyG conversion, `fit`'s
//! loop and the type stub).
//!
//! Thin by design: settings are the CLI's ([`grinnder_cli::args::TrainSettings`], validated by
//! [`grinnder_cli::plan::plan_of`]), datasets are built by the loaders' own code
//! ([`grinnder_graph::io::arrays`]), training and prediction are the engine's. Errors arrive as
//! Python's built-in exceptions with the engine's message (`ValueError` for bad input and
//! settings, `OSError` for files, `RuntimeError` for what fails while running), never as a crash
//! of the interpreter; the GIL is released while the engine works.

mod config;
mod data;
mod layerwise;
mod trainer;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A settings or input error as `ValueError`.
pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A loader's error: `OSError` where a file could not be read, `ValueError` where its content is
/// wrong.
pub(crate) fn graph_error(e: grinnder_graph::GraphError) -> PyErr {
    match e {
        grinnder_graph::GraphError::Io { .. } => PyOSError::new_err(e.to_string()),
        e => PyValueError::new_err(e.to_string()),
    }
}

/// What stops a run: `ValueError` for settings the engine refuses, `OSError` for storage and
/// files, `RuntimeError` otherwise.
pub(crate) fn train_error(e: grinnder_engine::TrainError) -> PyErr {
    use grinnder_engine::TrainError as E;
    match e {
        E::Config(_) | E::Unlabelled { .. } | E::NoTrainingNodes | E::NoClasses | E::Memory(_) => {
            PyValueError::new_err(e.to_string())
        }
        E::Storage(_) | E::Checkpoint(_) | E::ModelFile(_) => PyOSError::new_err(e.to_string()),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

/// An error of the CLI's helpers (`anyhow`), with its causes.
pub(crate) fn any_error(e: anyhow::Error) -> PyErr {
    PyRuntimeError::new_err(format!("{e:#}"))
}

#[pymodule]
fn _grinnder(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<data::Dataset>()?;
    m.add_class::<config::Config>()?;
    m.add_class::<trainer::Trainer>()?;
    m.add_class::<layerwise::LayerwiseRun>()?;
    m.add_function(wrap_pyfunction!(data::load_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(config::settings, m)?)?;
    Ok(())
}
