//! The OGB node-property raw layout, as OGB downloads and extracts it:
//!
//! ```text
//! <dir>/raw/edge.csv.gz            "src,dst" per line
//! <dir>/raw/node-feat.csv.gz       F comma-separated floats per line, one line per node
//! <dir>/raw/node-label.csv.gz      one class per line ("nan" = no label)
//! <dir>/raw/num-node-list.csv.gz   N
//! <dir>/raw/num-edge-list.csv.gz   E (optional; checked when present)
//! <dir>/split/<name>/{train,valid,test}.csv.gz   one node id per line
//! ```
//! `.csv` without `.gz` is accepted too. `<dir>` may be given as OGB names datasets
//! (`ogbn-arxiv` resolves to the `ogbn_arxiv` folder OGB creates). Files are streamed and parsed
//! in parallel; every error names the file and line.
//!
//! OGB's binary layout (`raw/data.npz`, as ogbn-papers100M ships) is the same format to
//! [`super::Format::Ogb`]: a folder holding it is recognised here (the folder naming is OGB's
//! for both) and read by `ogb_npz`, which [`super::open`] picks for it — this file does not
//! import that one, which imports this one's readers of splits.

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;

use super::text::{self, fields, find_csv, node_id, parse_blocks, parse_f32, parse_int, show, Block};
use super::LoadOptions;
use crate::csr::Csr;
use crate::dataset::{normalise_split, Dataset, Features, NonFinite, Splits, NO_LABEL};
use crate::error::{GraphError, Result};

/// True when `dir` looks like an OGB node-property dataset folder (CSV or binary layout).
pub fn is_ogb_dir(dir: &Path) -> bool {
    is_csv_dir(dir) || is_npz_dir(dir)
}

/// True when `dir` holds OGB's CSV layout (`raw/edge.csv.gz`).
pub fn is_csv_dir(dir: &Path) -> bool {
    find_csv(&dir.join("raw"), "edge").is_ok()
}

/// True when `dir` holds OGB's binary layout (`raw/data.npz`).
pub fn is_npz_dir(dir: &Path) -> bool {
    dir.join("raw/data.npz").is_file()
}

/// Finds the dataset folder for `path`: the folder itself, or OGB's naming of it
/// (`ogbn-products` → `ogbn_products`), also inside `path`, or the name of OGB's download
/// (`products`, `papers100M-bin` for the binary layout) beside it.
pub fn resolve_dir(path: &Path) -> Option<PathBuf> {
    if is_ogb_dir(path) {
        return Some(path.to_path_buf());
    }
    let name = path.file_name()?.to_string_lossy().to_string();
    let underscored = name.replace('-', "_");
    let mut candidates = vec![path.with_file_name(&underscored), path.join(&underscored)];
    if let Some(short) = name.strip_prefix("ogbn-").or_else(|| name.strip_prefix("ogbn_")) {
        candidates.push(path.with_file_name(short));
        candidates.push(path.with_file_name(format!("{short}-bin")));
    }
    candidates.into_iter().find(|c| is_ogb_dir(c))
}

/// Picks the split folder: the one asked for, or the only one present.
fn split_dir(dir: &Path, want: Option<&str>) -> Result<PathBuf> {
    let root = dir.join("split");
    if let Some(name) = want {
        let p = root.join(name);
        return if p.is_dir() { Ok(p) } else { Err(GraphError::invalid(&p, "split folder not found")) };
    }
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .map_err(|e| GraphError::io(&root, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(root.join(one)),
        [] => Err(GraphError::invalid(&root, "no split folder inside")),
        many => Err(GraphError::invalid(
            &root,
            format!("several splits ({}); choose one with --split", many.join(", ")),
        )),
    }
}

/// Loads an OGB raw dataset folder in the CSV layout (the binary one: `ogb_npz`).
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Dataset> {
    let dir = resolve_dir(path).filter(|d| is_csv_dir(d)).ok_or_else(|| {
        GraphError::invalid(
            path,
            "not an OGB dataset folder (no raw/edge.csv.gz or raw/data.npz here or under OGB's folder naming)",
        )
    })?;
    let raw = dir.join("raw");
    let n_path = find_csv(&raw, "num-node-list")?;
    let n = text::single_int(&n_path)?;
    if n <= 0 {
        return Err(GraphError::parse(&n_path, 1, format!("node count {n} must be positive")));
    }
    crate::csr::check_node_count(n as u64)?;
    let n = n as u64;

    let (src, dst) = load_edges(&find_csv(&raw, "edge")?, n)?;
    if let Ok(p) = find_csv(&raw, "num-edge-list") {
        let e = text::single_int(&p)?;
        if e != src.len() as i64 {
            return Err(GraphError::invalid(
                &p,
                format!("says {e} edges but edge file has {} lines (truncated?)", src.len()),
            ));
        }
    }
    let feat_path = find_csv(&raw, "node-feat")?;
    let features = load_features(&feat_path, n, opts.non_finite)?;
    let label_path = find_csv(&raw, "node-label")?;
    let (labels, num_classes) = load_labels(&label_path, n)?;
    let splits = load_splits(&dir, opts.split.as_deref(), n)?;
    let spin = crate::progress::spinner("csr");
    let graph = Csr::from_edges(n, &src, &dst, opts.build)?;
    spin.finish_and_clear();
    checked(&dir, graph, features, (labels, num_classes), splits, opts)
}

/// The split of an OGB folder (either layout): `split/<name>/{train,valid,test}.csv.gz`, the
/// folder `want` or the only one there.
pub(super) fn load_splits(dir: &Path, want: Option<&str>, n: u64) -> Result<Splits> {
    let sdir = split_dir(dir, want)?;
    let split = |name: &str| -> Result<Vec<u32>> {
        let p = find_csv(&sdir, name)?;
        let ids = load_ids(&p, n)?;
        normalise_split(&p, name, ids, n as usize)
    };
    Ok(Splits { train: split("train")?.into(), valid: split("valid")?.into(), test: split("test")?.into() })
}

fn load_edges(path: &Path, n: u64) -> Result<(Vec<u32>, Vec<u32>)> {
    let blocks = parse_blocks(path, "edges", |b: &Block| {
        let mut s = Vec::with_capacity(b.data.len() / 8);
        let mut d = Vec::with_capacity(b.data.len() / 8);
        for (ln, line) in b.lines() {
            let mut fs = fields(line);
            let (a, c) = match (fs.next(), fs.next(), fs.next()) {
                (Some(a), Some(c), None) => (a, c),
                _ => {
                    let count = fields(line).count();
                    return Err(GraphError::parse(
                        path,
                        ln,
                        format!("expected 2 columns \"src,dst\", found {count}: {}", show(line)),
                    ));
                }
            };
            s.push(node_id(path, ln, 1, a, n)?);
            d.push(node_id(path, ln, 2, c, n)?);
        }
        Ok((s, d))
    })?;
    let total: usize = blocks.iter().map(|b| b.0.len()).sum();
    let (mut src, mut dst) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for (s, d) in blocks {
        src.extend_from_slice(&s);
        dst.extend_from_slice(&d);
    }
    Ok((src, dst))
}

fn load_features(path: &Path, n: u64, policy: NonFinite) -> Result<Features> {
    // each block: (first line, its column count, values)
    let blocks = parse_blocks(path, "features", |b: &Block| {
        let mut dim = None;
        let mut vals = Vec::with_capacity(b.data.len() / 4);
        for (ln, line) in b.lines() {
            let before = vals.len();
            for (col, f) in fields(line).enumerate() {
                let x = parse_f32(f).ok_or_else(|| {
                    GraphError::parse(path, ln, format!("column {}: {} is not a number", col + 1, show(f)))
                })?;
                if !x.is_finite() && policy == NonFinite::Refuse {
                    return Err(GraphError::parse(
                        path,
                        ln,
                        format!("column {}: feature value {x} (use --non-finite report to keep it)", col + 1),
                    ));
                }
                vals.push(x);
            }
            let cols = vals.len() - before;
            match dim {
                None => dim = Some(cols),
                Some(d) if d != cols => {
                    return Err(GraphError::parse(
                        path,
                        ln,
                        format!("{cols} columns, earlier lines have {d}"),
                    ));
                }
                _ => {}
            }
        }
        Ok((b.first_line, dim, vals))
    })?;
    let dim = blocks.iter().find_map(|b| b.1).unwrap_or(0);
    if let Some(b) = blocks.iter().find(|b| b.1.is_some_and(|d| d != dim)) {
        return Err(GraphError::parse(
            path,
            b.0,
            format!("{} columns, earlier lines have {dim}", b.1.unwrap_or(0)),
        ));
    }
    if dim == 0 {
        return Err(GraphError::parse(path, 1, "no feature columns"));
    }
    let mut data = Vec::with_capacity(n as usize * dim);
    for b in blocks {
        data.extend_from_slice(&b.2);
    }
    let rows = (data.len() / dim) as u64;
    if rows != n {
        return Err(GraphError::parse(path, rows + 1, format!("{rows} feature rows for {n} nodes")));
    }
    if policy == NonFinite::Report {
        let bad = data.iter().filter(|x| !x.is_finite()).count();
        if bad > 0 {
            tracing::warn!("{}: {bad} non-finite feature values kept", path.display());
        }
    }
    Ok(Features { dim, data: data.into() })
}

fn load_labels(path: &Path, n: u64) -> Result<(Vec<i32>, u32)> {
    let blocks = parse_blocks(path, "labels", |b: &Block| {
        b.lines()
            .map(|(ln, line)| {
                let mut fs = fields(line);
                let f = fs.next().unwrap_or_default();
                if fs.next().is_some() {
                    return Err(GraphError::parse(
                        path,
                        ln,
                        "expected one label per line (multi-task labels are not supported)",
                    ));
                }
                if f.eq_ignore_ascii_case(b"nan") {
                    return Ok(NO_LABEL);
                }
                match parse_int(f) {
                    Some(y) if (0..i32::MAX as i64).contains(&y) => Ok(y as i32),
                    Some(y) => {
                        Err(GraphError::parse(path, ln, format!("label {y} is out of range (0 or more)")))
                    }
                    None => Err(GraphError::parse(path, ln, format!("label {} is not an integer", show(f)))),
                }
            })
            .collect::<Result<Vec<i32>>>()
    })?;
    let labels: Vec<i32> = blocks.into_iter().flatten().collect();
    if labels.len() as u64 != n {
        return Err(GraphError::parse(
            path,
            labels.len() as u64 + 1,
            format!("{} labels for {n} nodes", labels.len()),
        ));
    }
    let classes = labels.iter().copied().max().unwrap_or(-1) + 1;
    Ok((labels, classes.max(0) as u32))
}

fn load_ids(path: &Path, n: u64) -> Result<Vec<u32>> {
    let blocks = parse_blocks(path, "split", |b: &Block| {
        b.lines()
            .map(|(ln, line)| {
                let mut fs = fields(line);
                let f = fs.next().unwrap_or_default();
                if fs.next().is_some() {
                    return Err(GraphError::parse(path, ln, "expected one node id per line"));
                }
                node_id(path, ln, 1, f, n)
            })
            .collect::<Result<Vec<u32>>>()
    })?;
    Ok(blocks.into_iter().flatten().collect())
}

/// The dataset of a folder, validated: its edges symmetrised or taken as given as `opts` says
/// (the CSV and the binary layout alike).
pub(super) fn checked(
    dir: &Path,
    graph: Csr,
    features: Features,
    (labels, num_classes): (Vec<i32>, u32),
    splits: Splits,
    opts: &LoadOptions,
) -> Result<Dataset> {
    let name = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let directed = !opts.build.symmetrise;
    let ds = Dataset {
        name,
        graph,
        features,
        labels: labels.into(),
        num_classes,
        splits,
        directed,
        edge_weight: None,
    };
    ds.validate(dir)?;
    Ok(ds)
}

/// Writes `ds` in the OGB raw layout (each undirected edge once, as OGB ships them), with the
/// split named `split`.
pub fn write(ds: &Dataset, dir: &Path, split: &str) -> Result<()> {
    super::files::create_folder(dir).map_err(|e| GraphError::io(dir, e))?;
    let raw = dir.join("raw");
    let sdir = dir.join("split").join(split);
    for d in [&raw, &sdir] {
        super::files::create_folder(d).map_err(|e| GraphError::io(d, e))?;
    }
    let g = &ds.graph;
    let mut edges = 0u64;
    gz(&raw.join("edge.csv.gz"), &mut |w| {
        edges_once(g, &mut |u, v| {
            edges += 1;
            writeln!(w, "{u},{v}")
        })
    })?;
    gz(&raw.join("num-edge-list.csv.gz"), &mut |w| writeln!(w, "{edges}"))?;
    gz(&raw.join("num-node-list.csv.gz"), &mut |w| writeln!(w, "{}", g.num_nodes()))?;
    gz(&raw.join("node-feat.csv.gz"), &mut |w| {
        for v in 0..ds.num_nodes() {
            let row = ds.features.row(v);
            for (j, x) in row.iter().enumerate() {
                if j > 0 {
                    w.write_all(b",")?;
                }
                write!(w, "{x}")?;
            }
            w.write_all(b"\n")?;
        }
        Ok(())
    })?;
    gz(&raw.join("node-label.csv.gz"), &mut |w| {
        for &y in ds.labels.iter() {
            if y == NO_LABEL {
                writeln!(w, "nan")?;
            } else {
                writeln!(w, "{y}")?;
            }
        }
        Ok(())
    })?;
    write_splits(ds, &sdir)
}

/// Writes a gzip file, its text made by `body`: under a temporary name beside it, renamed into
/// place when whole.
fn gz(name: &Path, body: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
    let io = |e| GraphError::io(name, e);
    super::files::check_replaceable(name).map_err(io)?;
    let tmp = super::files::temp_for(name).map_err(io)?;
    let f = tmp.as_file().try_clone().map_err(io)?;
    let mut enc = GzEncoder::new(std::io::BufWriter::with_capacity(1 << 20, f), Compression::fast());
    body(&mut enc).map_err(io)?;
    enc.finish().and_then(|mut w| w.flush()).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(name).map_err(io)
}

/// Every edge of `g` as OGB ships them, `f(source, target)`: each undirected edge once (as
/// `(u, v)` with `u <= v`); a directed edge without its reverse is kept as is.
pub(super) fn edges_once<E>(
    g: &Csr,
    f: &mut dyn FnMut(u32, u32) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    for v in 0..g.num_nodes() {
        let once = |u: u32| (u as usize) <= v || g.row(u as usize).binary_search(&(v as u32)).is_err();
        for &u in g.row(v).iter().filter(|&&u| once(u)) {
            f(u, v as u32)?;
        }
    }
    Ok(())
}

/// Writes the split files `{train,valid,test}.csv.gz` into the folder `sdir`.
pub(super) fn write_splits(ds: &Dataset, sdir: &Path) -> Result<()> {
    super::files::create_folder(sdir).map_err(|e| GraphError::io(sdir, e))?;
    for (name, ids) in ds.splits.named() {
        gz(&sdir.join(format!("{name}.csv.gz")), &mut |w| {
            for v in ids {
                writeln!(w, "{v}")?;
            }
            Ok(())
        })?;
    }
    Ok(())
}
