//! One function per subcommand; each takes validated arguments and reports what it did.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use grinnder_graph::generate::{self, GenConfig};
use grinnder_graph::io::{exchange, igb, native, ogb};
use serde::Serialize;

use crate::args::{
    Command, ConvertArgs, ExportArgs, ExportFormat, GenFormat, GenerateArgs, PartitionArgs, PlotScalingArgs,
};
use crate::load::load;

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Train(a) => crate::train::run(*a),
        Command::Predict(a) => crate::predict::run(*a),
        Command::Info(a) => crate::info::run(*a),
        Command::Partition(a) => partition(a),
        Command::Convert(a) => convert(a),
        Command::Export(a) => export(a),
        Command::Generate(a) => generate(a),
        Command::Bench(a) => crate::bench::run(a),
        Command::PlotScaling(a) => plot_scaling(a),
        Command::Clean { dir, dry_run } => clean(&dir, dry_run),
    }
}

/// `grinnder clean DIR`: removes the run directories whose runs ended without removing them.
/// A run is live while it holds the lock on its directory's identity file: that, not a process
/// id, decides; folders without the identity file and kept storage are never touched. Fails,
/// naming each, when a removal fails.
fn clean(dir: &std::path::Path, dry_run: bool) -> anyhow::Result<()> {
    use grinnder_engine::scratch::{self, State};
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let found = scratch::find(dir);
    if found.is_empty() {
        println!("no run directories in {}", dir.display());
        return Ok(());
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    let (mut removed, mut freed, mut failed) = (0, 0, Vec::new());
    for f in &found {
        let what = match &f.state {
            State::Ended if dry_run => "would remove (its run has ended)".to_string(),
            State::Ended => match scratch::remove_ended(&f.path) {
                Ok(()) => {
                    removed += 1;
                    freed += f.bytes;
                    "removed (its run had ended)".to_string()
                }
                Err(e) => {
                    failed.push(format!("{}: {e}", f.path.display()));
                    format!("cannot remove: {e}")
                }
            },
            State::Live => "kept: its run is live (it holds the directory's lock)".into(),
            State::Kept => "kept: --keep-storage left it for you; remove it by hand when done".into(),
            State::OtherHost(h) => format!("kept: made on {h} (clean it there)"),
            State::NotOurs => format!(
                "left alone: no {} inside, so grinnder did not make it (or a version before identity files did); remove it by hand if it is yours to remove",
                scratch::IDENTITY
            ),
            State::Unknown(e) => format!("left alone: cannot try its lock ({e})"),
        };
        println!("{}  {:.1} MiB  {what}", f.path.display(), mib(f.bytes));
    }
    if !dry_run {
        println!("{removed} removed, {:.1} MiB freed", mib(freed));
    }
    anyhow::ensure!(
        failed.is_empty(),
        "cannot remove {} run director{}: {} (fix what the message says, then run grinnder clean again)",
        failed.len(),
        if failed.len() == 1 { "y" } else { "ies" },
        failed.join("; ")
    );
    Ok(())
}

fn convert(a: ConvertArgs) -> anyhow::Result<()> {
    let (ds, secs) = load(&a.input)?;
    let t = Instant::now();
    native::save_as(&ds, &a.out, a.feature_dtype).context("cannot write")?; // (the error names the path)
    tracing::info!(
        "read {} in {secs:.2} s, wrote {} in {:.2} s ({} nodes, {} edges)",
        a.input.path()?.display(),
        a.out.display(),
        t.elapsed().as_secs_f64(),
        ds.num_nodes(),
        ds.graph.num_edges()
    );
    Ok(())
}

fn export(a: ExportArgs) -> anyhow::Result<()> {
    let (ds, _) = load(&a.input)?;
    let out: &Path = &a.out;
    match a.format {
        ExportFormat::Npy => exchange::save(&ds, out),
        ExportFormat::Ogb => ogb::write(&ds, out, "export"),
        ExportFormat::Igb => igb::write(&ds, out, false),
        ExportFormat::IgbRaw => igb::write(&ds, out, true),
    }
    .context("cannot write")?; // (the error names the path)
    tracing::info!("wrote {}", out.display());
    Ok(())
}

fn generate(a: GenerateArgs) -> anyhow::Result<()> {
    let cfg = GenConfig::new(generate::preset(&a.preset)?, a.scale, a.seed);
    let (n, e) = cfg.sizes()?;
    anyhow::ensure!(
        !(a.format == GenFormat::Npy && a.feature_dtype == grinnder_graph::FeatureDtype::Bf16),
        "--feature-dtype bf16: numpy (the npy layout) has no bfloat16; use f16, or --format native"
    );
    tracing::info!(
        "generating {} at scale {}: {n} nodes, {e} directed edges, {} features, seed {}",
        a.preset,
        a.scale,
        a.feature_dtype,
        a.seed
    );
    let dtype = Some(a.feature_dtype);
    let t0 = Instant::now();
    let context = || format!("cannot write {}", a.out.display());
    // columns stream straight to the output while rows are produced
    match a.format {
        GenFormat::Native => {
            let mut w = native::NativeWriter::create(&a.out, cfg.preset.name, n)
                .context("cannot write")? // (the error names the path)
                .with_feature_dtype(dtype);
            let g = generate::generate_streaming(&cfg, &mut |c| w.push_cols(c)).with_context(context)?;
            let rest = native::Rest {
                labels: &g.labels,
                num_classes: g.num_classes,
                splits: &g.splits,
                features: &g.features,
                edge_weight: None,
            };
            w.finish(&g.row_ptr, rest).with_context(context)?;
        }
        GenFormat::Npy => {
            let mut w = exchange::ExchangeWriter::create(&a.out, e)
                .context("cannot write")?
                .with_feature_dtype(dtype);
            let g = generate::generate_streaming(&cfg, &mut |c| w.push_cols(c)).with_context(context)?;
            w.finish(&g.row_ptr, &g.labels, &g.splits, &g.features).with_context(context)?;
        }
    }
    let total = t0.elapsed().as_secs_f64();
    tracing::info!(
        "generated and wrote in {total:.2} s: {:.1} M directed edges/s end to end -> {}",
        e as f64 / total / 1e6,
        a.out.display()
    );
    Ok(())
}

#[derive(Serialize)]
struct PartitionReport {
    partitioner: String,
    parts: usize,
    balance: f64,
    edge_cut: u64,
    halo_volume: u64,
    replication_factor: f64,
    seconds: f64,
    /// Read from the partition cache (then `seconds` is the cache read).
    cached: bool,
    peak_host_bytes: u64,
}

fn partition(a: PartitionArgs) -> anyhow::Result<()> {
    let (ds, _) = load(&a.input)?;
    if !a.json {
        println!(
            "{} nodes, {} edges; partitioner {}",
            ds.num_nodes(),
            ds.graph.num_edges(),
            a.partitioner.name()
        );
        println!(
            "{:>6} {:>8} {:>12} {:>12} {:>8} {:>9} {:>10}",
            "parts", "balance", "edge cut", "halo volume", "repl.", "time s", "peak RSS"
        );
    }
    // a directed graph is cut as training cuts it: on its symmetric structure
    let symmetric = ds.directed.then(|| ds.graph.symmetrised());
    let cut = symmetric.as_ref().unwrap_or(&ds.graph);
    for &parts in &a.parts {
        let t = Instant::now();
        let cache = a.cache();
        let (p, outcome) = grinnder_partition::partition_cached(cut, parts, a.method(), cache.as_deref())?;
        let seconds = t.elapsed().as_secs_f64();
        let cached = matches!(outcome, grinnder_partition::CacheOutcome::Hit(_));
        tracing::debug!("partition cache: {outcome:?}");
        let q = grinnder_partition::quality(&ds.graph, &p);
        let r = PartitionReport {
            partitioner: a.partitioner.name().to_string(),
            parts,
            balance: q.balance,
            edge_cut: q.edge_cut,
            halo_volume: q.halo_volume,
            replication_factor: q.replication_factor,
            seconds,
            cached,
            peak_host_bytes: grinnder_engine::process::peak_rss_bytes(),
        };
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{:>6} {:>8.3} {:>12} {:>12} {:>8.3} {:>9.2} {:>10}{}",
                parts,
                r.balance,
                r.edge_cut,
                r.halo_volume,
                r.replication_factor,
                r.seconds,
                crate::info::gib(r.peak_host_bytes),
                if cached { "  (cached)" } else { "" }
            );
        }
    }
    Ok(())
}

fn plot_scaling(a: PlotScalingArgs) -> anyhow::Result<()> {
    let mut points = Vec::new();
    for run in &a.runs {
        let parse = || -> Option<(&str, usize, &str)> {
            let (head, file) = run.split_once('=')?;
            let (series, gpus) = head.rsplit_once(':')?;
            Some((series, gpus.parse().ok()?, file))
        };
        let (series, gpus, file) = parse()
            .with_context(|| format!("{run:?}: expected SERIES:GPUS=METRICS, e.g. gcn:2=gcn-2gpu.jsonl"))?;
        anyhow::ensure!(gpus > 0, "{run:?}: at least one GPU");
        // a metrics file holds a line per epoch: a gigabyte is far beyond any run
        let text = grinnder_graph::io::files::read_text_bounded(Path::new(file), 1 << 30, "metrics file")
            .with_context(|| format!("cannot read {file}"))?;
        let summary = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .rfind(|v| v.get("final").is_some())
            .with_context(|| format!("{file}: no final summary line (did the run finish?)"))?;
        let epoch_s = summary["epoch_s_median"]
            .as_f64()
            .filter(|&t| t > 0.0)
            .with_context(|| format!("{file}: no median epoch time"))?;
        points.push(crate::plot::ScalingPoint { series: series.to_string(), gpus, epoch_s });
    }
    crate::plot::scaling(&a.out, &a.title, &points)
        .with_context(|| format!("cannot draw {}", a.out.display()))?;
    for p in &points {
        println!("{} on {}: {:.4} s per epoch", p.series, p.gpus, p.epoch_s);
    }
    Ok(())
}
