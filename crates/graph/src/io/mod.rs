//! Reading and writing datasets. Only this module (and `store`, later) touches files.
//!
//! [`open`] recognises the format of a path (native file, OGB raw folder in the CSV or binary
//! layout, IGB folder, npy exchange folder) unless told, and returns a validated [`Dataset`].

pub mod arrays;
pub mod exchange;
pub mod files;
pub mod igb;
pub mod native;
pub mod npy;
pub mod npy_rows;
pub mod npz;
pub mod ogb;
pub mod ogb_npz;
pub mod text;

use std::path::Path;

use crate::csr::BuildOptions;
use crate::dataset::{Dataset, NonFinite};
use crate::error::{GraphError, Result};

/// The on-disk formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Recognise from the path's content.
    Auto,
    /// The project's own `.grnd` file.
    Native,
    /// OGB node-property raw folder: the CSV layout ([`ogb`]) or the binary one
    /// ogbn-papers100M ships in (`raw/data.npz`, [`ogb_npz`]).
    Ogb,
    /// IGB `processed/` folder.
    Igb,
    /// npy exchange folder (docs/datasets.md).
    Npy,
}

/// Options for loaders; the defaults suit every bundled and generated dataset.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// OGB split folder name (needed only when there are several).
    pub split: Option<String>,
    /// NaN/inf in features: refuse (default) or report and keep.
    pub non_finite: NonFinite,
    /// IGB: the node count, when it cannot be read from the label file.
    pub num_nodes: Option<u64>,
    /// IGB: 19 or 2983 classes.
    pub igb_classes: u32,
    /// How edges become the CSR (default: symmetrise, dedup, drop self loops).
    pub build: BuildOptions,
    /// Native files: what to verify when opening.
    pub verify: native::Verify,
    /// Accept splits that share nodes (with a warning) instead of refusing them.
    pub allow_split_overlap: bool,
    /// The most memory a reader may fill from a compressed archive (npz), whose declared
    /// sizes are checked against it before anything is inflated.
    pub memory_limit: Option<MemoryLimit>,
}

/// Bytes a load may hold, and where the figure comes from (for the refusal's message:
/// `--host-mem`, or the machine's available memory).
#[derive(Clone, Debug)]
pub struct MemoryLimit {
    pub bytes: u64,
    pub source: String,
}

impl MemoryLimit {
    /// Refuses `bytes` of `what` (declared by `origin`) past the limit, before they are read.
    pub(crate) fn check(limit: Option<&MemoryLimit>, bytes: u64, what: &str, origin: &Path) -> Result<()> {
        let Some(l) = limit.filter(|l| bytes > l.bytes) else { return Ok(()) };
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        Err(GraphError::invalid(
            origin,
            format!(
                "{what} would take {:.1} GiB of memory, more than the {:.1} GiB of {}; \
                 nothing was read. Convert the dataset into grinnder's file on a machine with the \
                 memory (`grinnder convert`): its features are read from disk",
                gib(bytes),
                gib(l.bytes),
                l.source
            ),
        ))
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            split: None,
            non_finite: NonFinite::Refuse,
            num_nodes: None,
            igb_classes: 19,
            build: BuildOptions::default(),
            verify: native::Verify::Full,
            allow_split_overlap: false,
            memory_limit: None,
        }
    }
}

/// Recognises the format of `path`.
pub fn detect(path: &Path) -> Result<Format> {
    if path.is_file() {
        let mut magic = [0u8; 8];
        use std::io::Read;
        let mut f = files::open_input(path).map_err(|e| GraphError::io(path, e))?;
        if f.read_exact(&mut magic).is_ok() && &magic == native::MAGIC {
            return Ok(Format::Native);
        }
        return Err(GraphError::invalid(
            path,
            "a file that is not a grinnder dataset (.grnd); OGB, IGB and npy datasets are folders",
        ));
    }
    if ogb::resolve_dir(path).is_some() {
        return Ok(Format::Ogb);
    }
    if igb::is_igb_dir(path) {
        return Ok(Format::Igb);
    }
    if exchange::is_exchange_dir(path) {
        return Ok(Format::Npy);
    }
    if !path.exists() {
        return Err(GraphError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
        ));
    }
    Err(GraphError::invalid(
        path,
        "unrecognised dataset: expected a .grnd file, an OGB folder (raw/edge.csv.gz or raw/data.npz), an IGB folder (processed/paper/) or an npy folder (edge_index.npy)",
    ))
}

/// Opens a dataset in any supported format.
pub fn open(path: &Path, format: Format, opts: &LoadOptions) -> Result<Dataset> {
    let format = match format {
        Format::Auto => detect(path)?,
        f => f,
    };
    let _span = tracing::info_span!("load", path = %path.display(), ?format).entered();
    let ds = match format {
        Format::Native => native::open(path, opts.verify),
        // the CSV layout, or the binary one where there is no raw/edge.csv.gz
        Format::Ogb => match ogb::resolve_dir(path) {
            Some(dir) if !ogb::is_csv_dir(&dir) => ogb_npz::load(&dir, opts),
            _ => ogb::load(path, opts),
        },
        Format::Igb => igb::load(path, opts),
        Format::Npy => exchange::load(path, opts),
        Format::Auto => unreachable!("resolved above"),
    }?;
    if format != Format::Npy {
        // the exchange layout's builder checks it (`arrays::dataset`)
        ds.splits.check_disjoint(path, opts.allow_split_overlap)?;
    }
    if format == Format::Native {
        check_direction(path, &ds, !opts.build.symmetrise)?;
    }
    Ok(ds)
}

/// A native file holds its graph as built when it was converted: directed (edges as given) or
/// made symmetric. A run that asks for the other is refused, naming the fix (its structure
/// cannot be turned back into the source's edges, nor should a directed one silently be
/// trained as undirected).
fn check_direction(path: &Path, ds: &Dataset, directed: bool) -> Result<()> {
    let msg = match (ds.directed, directed) {
        (true, false) => {
            "holds a directed graph (converted with --directed: its edges as given); load it with \
             --directed (directed=True in Python), or convert the source again without --directed \
             for the undirected graph"
        }
        (false, true) => {
            "holds an undirected graph (its edges were made symmetric when it was converted), so \
             the edges' directions are not in it; convert the source again with --directed \
             (grinnder convert SOURCE OUT.grnd --directed), or train without --directed"
        }
        _ => return Ok(()),
    };
    Err(GraphError::invalid(path, msg))
}
