//! An on-disk cache of partitionings, keyed by a hash of the graph and the parameters, so a
//! second run with the same graph and settings starts straight away.
//!
//! One file per key: magic `GRNDPART`, format version, key, node and partition counts, the
//! owner of every node, and an xxh3 checksum of everything before it. A file that does not
//! verify — wrong version, another key, truncated, flipped bits, owners out of range — is
//! reported and rebuilt; files are written to a new, unpredictably named temporary and renamed into place; reads are
//! bounded by the length the node count gives.

use std::path::{Path, PathBuf};

use grinnder_graph::buf::as_bytes;
use grinnder_graph::Csr;
use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

use crate::partitioner::{partition, Method, PartitionError, Partitioning};

const MAGIC: &[u8; 8] = b"GRNDPART";
// (3: the parallel multilevel coarsening, 2026-12-03, changed the `lpa` partitionings)
const VERSION: u32 = 3;
const HEADER: usize = 8 + 4 + 8 + 8 + 8;

/// Where a partitioning came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from this file.
    Hit(PathBuf),
    /// Computed and stored in this file.
    Stored(PathBuf),
    /// Computed; the file was stale or corrupted (the reason) and has been rewritten.
    Rebuilt(PathBuf, String),
    /// Computed, no cache directory given.
    Uncached,
}

/// xxh3 of the graph structure (in parallel chunks) and the parameters.
pub fn key(graph: &Csr, parts: usize, method: Method) -> u64 {
    let leaves: Vec<u64> = [as_bytes(graph.row_ptr()), as_bytes(graph.col_idx())]
        .iter()
        .flat_map(|b| b.par_chunks(64 << 20).map(xxh3_64).collect::<Vec<_>>())
        .collect();
    let params = format!("v{VERSION} parts={parts} method={method:?}");
    xxh3_64(&[as_bytes(&leaves), params.as_bytes()].concat())
}

/// Partitions `graph`, reading and writing `dir` when given.
pub fn partition_cached(
    graph: &Csr,
    parts: usize,
    method: Method,
    dir: Option<&Path>,
) -> Result<(Partitioning, CacheOutcome), PartitionError> {
    let Some(dir) = dir else {
        return Ok((partition(graph, parts, method)?, CacheOutcome::Uncached));
    };
    let k = key(graph, parts, method);
    let file = dir.join(format!("{k:016x}.part"));
    // the file holds a header, one owner per node and a checksum: nothing longer is read
    let max_bytes = (HEADER + graph.num_nodes() * 4 + 8) as u64;
    let stale = match grinnder_graph::io::files::read_bounded(&file, max_bytes, "partition cache file") {
        Ok(bytes) => match decode(&bytes, k, graph.num_nodes(), parts) {
            Ok(part) => return Ok((Partitioning::from_parts(parts, part), CacheOutcome::Hit(file))),
            Err(why) => Some(why),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(e.to_string()),
    };
    let p = partition(graph, parts, method)?;
    let written = std::fs::create_dir_all(dir).and_then(|_| {
        // a new file under an unpredictable name, renamed into place (never through a link)
        let mut tmp = grinnder_graph::io::files::temp_in(dir, &format!(".{k:016x}.part."))?;
        std::io::Write::write_all(&mut tmp, &encode(k, parts, &p.part))?;
        tmp.persist(&file)
    });
    let outcome = match (written, stale) {
        (Err(e), _) => {
            tracing::warn!("cannot write the partition cache {}: {e}", file.display());
            CacheOutcome::Uncached
        }
        (Ok(()), Some(why)) => {
            tracing::warn!("partition cache {} was {why}; rebuilt", file.display());
            CacheOutcome::Rebuilt(file, why)
        }
        (Ok(()), None) => CacheOutcome::Stored(file),
    };
    Ok((p, outcome))
}

fn encode(key: u64, parts: usize, part: &[u32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER + part.len() * 4 + 8);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&key.to_le_bytes());
    b.extend_from_slice(&(part.len() as u64).to_le_bytes());
    b.extend_from_slice(&(parts as u64).to_le_bytes());
    b.extend_from_slice(as_bytes(part));
    let sum = xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

fn decode(b: &[u8], key: u64, n: usize, parts: usize) -> Result<Vec<u32>, String> {
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    if b.len() < HEADER + 8 || &b[..8] != MAGIC {
        return Err("not a partition cache file".into());
    }
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(format!("format version {version}, not {VERSION}"));
    }
    if b.len() != HEADER + n * 4 + 8 {
        return Err(format!("{} bytes long, expected {} (truncated?)", b.len(), HEADER + n * 4 + 8));
    }
    let body = &b[..b.len() - 8];
    if xxh3_64(body) != word(b.len() - 8) {
        return Err("corrupted (checksum mismatch)".into());
    }
    if word(12) != key || word(20) != n as u64 || word(28) != parts as u64 {
        return Err("made for another graph or parameters".into());
    }
    let part: Vec<u32> =
        body[HEADER..].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    if part.iter().any(|&p| p as usize >= parts) {
        return Err("an owner out of range".into());
    }
    Ok(part)
}
