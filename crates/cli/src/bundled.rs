//! The bundled Cora (the default dataset), embedded in the binary: an installed `grinnder`
//! (`cargo install --path crates/cli`) finds it without the source tree. It is written out
//! once, as the OGB raw folder it ships as, under the cache directory.

use std::path::PathBuf;

use anyhow::Context;

macro_rules! file {
    ($name:literal) => {
        ($name, include_bytes!(concat!("../../../data/cora/", $name)) as &[u8])
    };
}

/// The folder's files (109 KB).
const CORA: [(&str, &[u8]); 8] = [
    file!("raw/edge.csv.gz"),
    file!("raw/node-feat.csv.gz"),
    file!("raw/node-label.csv.gz"),
    file!("raw/num-edge-list.csv.gz"),
    file!("raw/num-node-list.csv.gz"),
    file!("split/public/train.csv.gz"),
    file!("split/public/valid.csv.gz"),
    file!("split/public/test.csv.gz"),
];

/// The bundled Cora's folder: `data/cora` when run from the source tree, else the embedded
/// copy, written out under `cache` (else the temporary directory) the first time.
pub fn cora(cache: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let here = PathBuf::from("data/cora");
    if here.is_dir() {
        return Ok(here);
    }
    let root = cache
        .unwrap_or_else(std::env::temp_dir)
        .join(concat!("bundled-", env!("CARGO_PKG_VERSION")))
        .join("cora");
    for (name, bytes) in CORA {
        let path = root.join(name);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
            continue;
        }
        let dir = path.parent().expect("a file in a folder");
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot write the bundled Cora into {}", dir.display()))?;
        grinnder_graph::io::files::write_whole(&path, bytes)
            .with_context(|| format!("cannot write the bundled Cora into {}", path.display()))?;
    }
    Ok(root)
}
