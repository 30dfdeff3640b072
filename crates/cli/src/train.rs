//! `grinnder train`: load, validate the settings once, train (in memory, or with the tiered
//! executor when partitions or a memory budget are asked for), report.

use std::io::Write;

use anyhow::Context;
use grinnder_engine::{
    CheckpointConfig, DeviceGroups, EpochMetrics, FeatureSource, HostFeatures, Mode, Summary, TieredConfig,
    Trainer, Weights,
};
use grinnder_graph::{progress, Dataset};
use grinnder_tensor::{Backend, Cpu};

use crate::args::{FeatureAccessArg, PrecisionArg, TrainArgs, TransportArg};
use crate::plan::{Device, TrainPlan};

/// Mini-batch input rows read by GPU threads from mapped page-locked host memory
/// (`--feature-access zero-copy`).
pub struct ZeroCopyFeatures {
    table: grinnder_cuda::HostTable,
    /// The labels, read by the loss kernel by node id.
    labels: grinnder_cuda::HostLabels,
}

impl ZeroCopyFeatures {
    pub fn new(
        g: &grinnder_cuda::Cuda,
        ds: &Dataset,
        norm: grinnder_engine::FeatureNorm,
    ) -> anyhow::Result<Self> {
        let host = HostFeatures::new(ds, norm);
        let mut table =
            g.host_table(ds.num_nodes(), host.dim()).context("cannot map the features for zero-copy")?;
        host.write_rows(None, table.as_mut_slice());
        let labels =
            g.host_labels(&ds.labels, ds.num_classes).context("cannot map the labels for zero-copy")?;
        Ok(ZeroCopyFeatures { table, labels })
    }
}

impl FeatureSource<grinnder_cuda::Cuda> for ZeroCopyFeatures {
    fn gather(&self, g: &grinnder_cuda::Cuda, ids: &[u32]) -> grinnder_cuda::DMat {
        g.arrived(g.gather_host_async(&self.table, ids))
    }

    fn start(&self, g: &grinnder_cuda::Cuda, ids: &[u32]) -> Option<grinnder_cuda::Arriving> {
        Some(g.gather_host_async(&self.table, ids))
    }

    fn loss(
        &self,
        g: &grinnder_cuda::Cuda,
        logits: &grinnder_cuda::DMat,
        ids: &[u32],
        scale: f64,
        grad: &mut grinnder_cuda::DMat,
    ) -> Option<grinnder_cuda::CudaLoss> {
        Some(g.cross_entropy_mapped(logits, &self.labels, ids, scale, grad))
    }

    fn describe(&self) -> String {
        "zero-copy (GPU threads read the mapped page-locked feature rows and labels)".into()
    }
}

/// This process's place in a partition-parallel run started by `mpirun`.
pub(crate) struct Launch {
    /// Every rank, this server's ranks, the server heads.
    pub(crate) groups: grinnder_dist::Groups,
    /// This rank's index among the ranks of its machine (which GPU it uses).
    pub(crate) local_rank: usize,
    /// How many ranks share this machine.
    local_size: usize,
    /// MPI stays initialised while this lives (declared last: dropped after `comm`).
    #[cfg(feature = "mpi")]
    _mpi: grinnder_dist::mpi::Mpi,
}

/// Joins the MPI job this process was started in, if any (more than one rank); servers of
/// `ranks_per_server` ranks (default: the ranks on each machine).
pub(crate) fn launch(ranks_per_server: Option<usize>) -> anyhow::Result<Option<Launch>> {
    let Some(ranks) = grinnder_dist::launched_ranks().filter(|&n| n > 1) else { return Ok(None) };
    #[cfg(feature = "mpi")]
    {
        let _ = ranks;
        let mpi = grinnder_dist::mpi::Mpi::init().context("MPI did not initialise")?;
        let world = mpi.world();
        let (local_rank, local_size) = world.local();
        let ranks_per_server = ranks_per_server.unwrap_or(local_size);
        let groups = grinnder_dist::Groups::new(Box::new(world), ranks_per_server);
        Ok(Some(Launch { groups, local_rank, local_size, _mpi: mpi }))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = ranks_per_server;
        anyhow::bail!(
            "started as one of {ranks} MPI ranks, but this grinnder was built without MPI: build it with `cargo build --release --features mpi` (needs Open MPI: libopenmpi-dev)"
        )
    }
}

/// NCCL communicators over the global and server groups, where `transport` asks for them
/// (auto: every rank of every machine has a GPU of its own and NCCL loads). The choice is
/// agreed by every rank, since making communicators is collective.
fn nccl_groups(
    gpu: &grinnder_cuda::Cuda,
    l: &Launch,
    transport: TransportArg,
) -> anyhow::Result<Option<DeviceGroups<grinnder_cuda::Cuda>>> {
    let gpus = grinnder_cuda::device_count();
    let own_gpu = l.local_size <= gpus;
    let usable = own_gpu && grinnder_cuda::nccl_present();
    if transport == TransportArg::Mpi {
        return Ok(None);
    }
    // every rank learns whether every rank can (a rank that stopped alone would leave the
    // others waiting)
    let all = l.groups.global.all_gather(&[usable as u8]);
    let failing = all.iter().position(|b| b[0] == 0);
    match (transport, failing) {
        (_, None) => {}
        (TransportArg::Nccl, Some(r)) => anyhow::bail!(
            "--transport nccl needs a GPU per rank and libnccl.so: rank {r} has not (here: {} ranks, {gpus} GPU(s), NCCL {})",
            l.local_size,
            if grinnder_cuda::nccl_present() { "found" } else { "not found" }
        ),
        (_, Some(_)) => {
            tracing::info!("halo rows and gradient sums through MPI (NCCL needs one GPU per rank)");
            return Ok(None);
        }
    }
    let global =
        grinnder_cuda::Nccl::new(gpu, l.groups.global.as_ref()).context("NCCL did not initialise")?;
    let server =
        grinnder_cuda::Nccl::new(gpu, l.groups.server.as_ref()).context("NCCL did not initialise")?;
    tracing::info!("halo rows and gradient sums over {}", grinnder_tensor::MatComm::describe(&global));
    Ok(Some(DeviceGroups { global: Box::new(global), server: Box::new(server) }))
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    let mut plan = a.plan()?;
    let ckpt = a.checkpoint()?;
    check_outputs(&a, ckpt.as_ref())?;
    let launch = launch(plan.ranks_per_server)?;
    anyhow::ensure!(
        launch.is_some() || plan.expansion == grinnder_engine::Expansion::Plain,
        "--expansion shares the graph out by server: start several ranks with mpirun"
    );
    anyhow::ensure!(
        launch.is_none() || plan.minibatch.as_ref().is_none_or(|mb| mb.loader_threads.is_none()),
        "--loader-threads is for mini-batches in one process: cooperative batches (mpirun) sample on each rank's training thread"
    );
    if let Some(l) = &launch {
        fit_to_ranks(&mut plan, l)?;
    }
    let lead = launch.as_ref().is_none_or(|l| l.groups.global.rank() == 0);
    let groups = launch.as_ref().map(|l| &l.groups);
    let host_mem = plan.tiered.as_ref().and_then(|t| t.host_mem);
    if host_mem.is_some() {
        crate::return_freed_memory_at_once();
    }
    // the GPU and every output file are settled before the dataset loads: a machine without
    // the GPU, or a path that cannot be written, is refused at once, not after the load or the
    // run
    let mut gpu = match plan.device {
        Device::Cuda(n) => Some(open_gpu(n, plan.gpu_mem, plan.tf32, "train")?),
        Device::Cpu => None,
    };
    let mut metrics_file = match a.metrics_out.as_ref().filter(|_| lead) {
        Some(p) => Some(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?),
        None => None,
    };
    let path = a.input.path()?;
    let ds = crate::load::open(&path, &a.input, host_mem)?;
    plan.settle_feature_norm(&ds);
    check_model(&plan, &ds, gpu.is_some())?;
    // (weights where they cannot be used are refused before budgets and partitions)
    let whole_graph = plan.minibatch.is_none() && plan.expansion == grinnder_engine::Expansion::Plain;
    grinnder_engine::config::check_edge_weights(&ds, plan.config.model.kind, whole_graph)?;
    if launch.is_none() {
        settle_budgets(&mut plan, &ds, gpu.as_mut())?;
    }
    let m = &plan.config.model;
    tracing::info!(
        "{}: {} nodes, {} edges; {} {} layers, hidden {}, dropout {}, {}, feature norm {}, {} epochs, {} threads",
        ds.name,
        ds.num_nodes(),
        ds.graph.num_edges(),
        m.kind,
        m.layers,
        m.hidden,
        m.dropout,
        plan.config.optim,
        plan.config.feature_norm,
        plan.config.epochs,
        rayon::current_num_threads()
    );
    let mut history = Vec::new();
    macro_rules! run_on {
        ($backend:expr, $features:expr, $device:expr) => {
            run_on(
                $backend,
                &ds,
                &plan,
                $features,
                groups,
                $device,
                ckpt.as_ref(),
                &a,
                &mut metrics_file,
                &mut history,
            )?
        };
    }
    let summary = match (&gpu, plan.precision) {
        (Some(gpu), _) => {
            let zero_copy = match plan.feature_access {
                FeatureAccessArg::ZeroCopy => {
                    Some(ZeroCopyFeatures::new(gpu, &ds, plan.config.feature_norm)?)
                }
                FeatureAccessArg::Copy => None,
            };
            let source = zero_copy.as_ref().map(|z| z as &dyn FeatureSource<grinnder_cuda::Cuda>);
            let device = match &launch {
                Some(l) if plan.minibatch.is_none() => nccl_groups(gpu, l, plan.transport)?,
                _ => None,
            };
            let summary = run_on!(gpu, source, device.as_ref());
            let (secs, bytes) = gpu.side_time();
            if bytes > 0 {
                tracing::info!(
                    "second stream: {:.1} GB of host rows gathered or uploaded in {secs:.3} s of its time ({:.1} GB/s while busy)",
                    bytes as f64 / 1e9,
                    bytes as f64 / 1e9 / secs.max(1e-9)
                );
            }
            summary
        }
        (None, PrecisionArg::F32) => run_on!(&Cpu::<f32>::new(), None, None),
        (None, PrecisionArg::F64) => run_on!(&Cpu::<f64>::new(), None, None),
    };
    if let Some(f) = metrics_file.as_mut() {
        let mut v = serde_json::to_value(&summary)?;
        v["final"] = true.into();
        writeln!(f, "{v}")?;
    }
    if !lead {
        return Ok(());
    }
    // the result line first: a plot that cannot be drawn loses nothing of the run
    report(&summary, &plan, host_mem);
    if let Some(p) = &a.plot {
        crate::plot::curves(p, &ds.name, &history).with_context(|| format!("cannot draw {}", p.display()))?;
    }
    Ok(())
}

/// Refuses a model no machine holds before budgets are planned around it (its parameters,
/// gradients and moments at the run's precision against the host's memory).
fn check_model(plan: &TrainPlan, ds: &Dataset, on_gpu: bool) -> anyhow::Result<()> {
    let elem = if !on_gpu && plan.precision == PrecisionArg::F64 { 8 } else { 4 };
    let m = &plan.config.model;
    Ok(grinnder_engine::budgets::check_model(m, ds.features.dim, ds.num_classes as usize, elem)?)
}

/// What the flags leave open, chosen from the machine ([`crate::budgets::settle`]), each choice
/// logged with its reason; the GPU's budget set where one was chosen.
pub fn settle_budgets(
    plan: &mut TrainPlan,
    ds: &Dataset,
    gpu: Option<&mut grinnder_cuda::Cuda>,
) -> anyhow::Result<()> {
    let given = plan.gpu_mem;
    let free = gpu.as_ref().map(|g| g.mem_info().0 as u64);
    for r in crate::budgets::settle(plan, ds, free)? {
        tracing::info!("plan: {r}");
    }
    if let (Some(g), true) = (gpu, plan.gpu_mem != given) {
        g.set_memory_budget(plan.gpu_mem)?;
    }
    Ok(())
}

/// The setup's phases so far, logged as one line.
fn setup_done() -> Vec<grinnder_engine::metrics::SetupPhase> {
    let setup = grinnder_engine::metrics::SetupPhase::all();
    if !setup.is_empty() {
        tracing::info!("setup done in {}", grinnder_engine::metrics::SetupPhase::describe(&setup));
    }
    setup
}

/// The CUDA device `n` with a memory budget and the TF32 setting, for `what` (train, predict).
pub fn open_gpu(
    n: usize,
    gpu_mem: Option<u64>,
    tf32: bool,
    what: &str,
) -> anyhow::Result<grinnder_cuda::Cuda> {
    let mut gpu = grinnder_cuda::Cuda::new(n).with_context(|| {
        format!("cannot use CUDA device {n} (--device cuda); leave --device out to {what} on the CPU")
    })?;
    gpu.set_memory_budget(gpu_mem)?;
    gpu.set_tf32(tf32)?;
    Ok(gpu)
}

/// Refuses, before any work, every output of the run that could not be written: the model
/// file, the plot, the metrics and the checkpoint directory (made here if missing).
fn check_outputs(a: &TrainArgs, ckpt: Option<&grinnder_engine::CheckpointConfig>) -> anyhow::Result<()> {
    if let Some(p) = &a.save_model {
        crate::outputs::check_renamed_writable(p, "--save-model")?;
    }
    for (path, flag) in [(&a.plot, "--plot"), (&a.metrics_out, "--metrics-out")] {
        if let Some(p) = path {
            crate::outputs::check_writable(p, flag)?;
        }
    }
    if let Some(p) = &a.plot {
        crate::plot::check_path(p)?;
    }
    if let Some(c) = ckpt {
        crate::outputs::check_dir_writable(&c.dir, "--checkpoint-dir")?;
    }
    Ok(())
}

/// Settles `plan` for this rank of `l`: the partitions (at least one per rank), this rank's GPU,
/// and quiet progress off rank 0.
fn fit_to_ranks(plan: &mut TrainPlan, l: &Launch) -> anyhow::Result<()> {
    let ranks = l.groups.global.size();
    // full-graph: one partition per rank unless --parts says more; mini-batch: cooperative
    // batches, evaluated over one partition per rank
    let parts = if plan.minibatch.is_some() {
        anyhow::ensure!(
            plan.expansion == grinnder_engine::Expansion::Plain,
            "--expansion is for full-graph training; --mode minibatch forms cooperative batches per server"
        );
        ranks
    } else {
        let t = plan.tiered.get_or_insert_with(|| crate::plan::TieredPlan::with_parts(ranks));
        anyhow::ensure!(
            t.parts >= ranks,
            "--parts {} is fewer than the {ranks} ranks: every rank computes at least one partition",
            t.parts
        );
        t.parts
    };
    if let Device::Cuda(n) = plan.device {
        // ranks of a machine take its GPUs in turn (several share one where there are fewer)
        plan.device = Device::Cuda((n + l.local_rank) % grinnder_cuda::device_count().max(1));
    }
    if l.groups.global.rank() > 0 {
        // rank 0 reports; the others train quietly
        progress::set_quiet(true);
    }
    tracing::info!(
        "rank {} of {} ({}; {} per server), partitions {}, expansion {}",
        l.groups.global.rank(),
        ranks,
        l.groups.global.describe(),
        l.groups.layout.ranks_per_server,
        parts,
        plan.expansion
    );
    Ok(())
}

/// The run's last line (rank 0): the accuracy at the best validation epoch, the loss, the median
/// epoch and peak memory; a warning if the process went past `--host-mem`.
fn report(summary: &Summary, plan: &TrainPlan, host_mem: Option<u64>) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let accuracy = if plan.config.eval_every == 0 {
        "not evaluated (--eval-every 0)".to_string()
    } else if !summary.selected_by_valid {
        format!(
            "test accuracy {:.2} % (epoch {}, the last: no validation split to select by)",
            summary.test_acc * 100.0,
            summary.best_epoch
        )
    } else {
        format!(
            "test accuracy {:.2} % (epoch {} of best validation accuracy {:.2} %)",
            summary.test_acc * 100.0,
            summary.best_epoch,
            summary.best_valid_acc * 100.0
        )
    };
    println!(
        "{accuracy}; final loss {:.4}; {:.4} s per epoch (median), peak host memory {:.2} GiB{}",
        summary.final_loss,
        summary.epoch_s_median,
        gib(summary.peak_host_bytes),
        summary.peak_device_bytes.map_or(String::new(), |b| format!(", peak GPU memory {:.2} GiB", gib(b)))
    );
    if let Some(h) = host_mem.filter(|&h| summary.peak_host_bytes > h) {
        tracing::warn!(
            "peak host memory {:.1} MiB exceeded --host-mem {:.1} MiB by {:.1} %",
            summary.peak_host_bytes as f64 / 1048576.0,
            h as f64 / 1048576.0,
            (summary.peak_host_bytes as f64 / h as f64 - 1.0) * 100.0
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn run_on<B: Backend>(
    b: &B,
    ds: &Dataset,
    plan: &TrainPlan,
    features: Option<&dyn FeatureSource<B>>,
    groups: Option<&grinnder_dist::Groups>,
    device: Option<&DeviceGroups<B>>,
    ckpt: Option<&CheckpointConfig>,
    a: &TrainArgs,
    file: &mut Option<std::fs::File>,
    history: &mut Vec<EpochMetrics>,
) -> anyhow::Result<Summary> {
    let pb = progress::bar(plan.config.epochs as u64, "train", false);
    let mut write_err = None;
    let log_every = a.log_every.unwrap_or(usize::from(!std::io::IsTerminal::is_terminal(&std::io::stderr())));
    let mut on_epoch = |m: &EpochMetrics| {
        pb.set_position(m.epoch as u64 + 1);
        if let Some(v) = m.valid_acc {
            pb.set_message(format!("loss {:.3} val {:.1}%", m.loss, v * 100.0));
        }
        if log_every > 0 && (m.epoch + 1) % log_every == 0 {
            tracing::info!("{}", epoch_line(m));
        }
        if let Some(f) = file.as_mut() {
            if let Err(e) =
                serde_json::to_string(m).map_err(std::io::Error::other).and_then(|s| writeln!(f, "{s}"))
            {
                write_err.get_or_insert(e);
            }
        }
        if let (Some(t), Some(sample_s)) = (&m.tier, m.tier.as_ref().and_then(|t| t.sample_s)) {
            tracing::debug!(
                "epoch {}: {} batches, sampling {:.3} s (threads' sum), waiting for batches {:.3} s, input rows {:.3} s ({:.1} MiB), compute {:.3} s",
                m.epoch,
                t.batches.unwrap_or(0),
                sample_s,
                t.batch_wait_s.unwrap_or(0.0),
                t.gather_s,
                t.upload_bytes as f64 / 1048576.0,
                t.compute_s
            );
        } else if let Some(t) = &m.tier {
            tracing::debug!(
                "epoch {}: gather {:.3} s, compute {:.3} s, write-back {:.3} s (to the backend {:.1} MiB, back {:.1} MiB), storage read {:.3} s write {:.3} s; cache hits {} misses {}, storage read {:.1} MiB ({:.1} MiB of it asked for, {} partial reads) written {:.1} MiB",
                m.epoch,
                t.gather_s,
                t.compute_s,
                t.write_back_s,
                t.upload_bytes as f64 / 1048576.0,
                t.download_bytes as f64 / 1048576.0,
                t.tier.read_s,
                t.tier.write_s,
                t.tier.hits,
                t.tier.misses,
                t.tier.storage_read_bytes as f64 / 1048576.0,
                t.tier.storage_needed_bytes as f64 / 1048576.0,
                t.tier.row_reads,
                t.tier.storage_write_bytes as f64 / 1048576.0
            );
        }
        if let Some(c) = m.tier.as_ref().and_then(|t| t.comm.as_ref()) {
            let mb = |b: u64| b as f64 / 1048576.0;
            tracing::debug!(
                "epoch {}: exchanged (all ranks) halo rows {:.1} MiB within servers, {:.1} MiB between; halo gradients {:.1} / {:.1} MiB; reductions {:.1} / {:.1} MiB; {:.3} s exchanging",
                m.epoch,
                mb(c.halo_intra_bytes),
                mb(c.halo_inter_bytes),
                mb(c.grad_intra_bytes),
                mb(c.grad_inter_bytes),
                mb(c.reduce_intra_bytes),
                mb(c.reduce_inter_bytes),
                c.comm_s
            );
        }
        history.push(m.clone());
    };
    let mode = mode_of(plan, features, groups, device);
    let mut trainer = Trainer::new(b, ds, plan.config.clone(), mode)?;
    if let Some(c) = ckpt {
        trainer = trainer.with_checkpoints(c)?;
        if c.resume && trainer.done() {
            tracing::warn!(
                "the checkpoint in {} has {} epochs trained, and --epochs asks for {}: nothing is left to train (raise --epochs to go on)",
                c.dir.display(),
                trainer.epochs_done(),
                plan.config.epochs
            );
        }
    }
    if let Some(p) = &a.init_from {
        if trainer.epochs_done() > 0 {
            tracing::info!(
                "resumed at epoch {}: the checkpoint's weights, not --init-from's",
                trainer.epochs_done()
            );
        } else {
            let f = grinnder_engine::ModelFile::load(p)?;
            trainer.load_weights(&f)?;
            tracing::info!("starting from the weights of {} ({})", p.display(), f.arch.describe());
        }
    }
    let setup = setup_done();
    train_epochs(&mut trainer, plan, a, &mut on_epoch)?;
    let mut summary = trainer.summary();
    summary.setup = setup;
    pb.finish_and_clear();
    if let Some(e) = write_err {
        return Err(e).context("cannot write the metrics file");
    }
    if let Some(p) = &a.save_model {
        let which = if a.save_last { Weights::Last } else { Weights::BestValid };
        let note = trainer.save_model(p, which)?;
        tracing::info!("model saved to {} ({note})", p.display());
    }
    Ok(summary)
}

/// The epochs left to train, each handed to `on_epoch`; after the second (the first carries
/// one-time work: calibration, the GPU tier's refinement) the cost model's epoch is logged
/// against it.
fn train_epochs<B: Backend>(
    trainer: &mut Trainer<'_, B>,
    plan: &TrainPlan,
    a: &TrainArgs,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> anyhow::Result<()> {
    let rates = match &a.rates {
        Some(p) => Some((crate::rates::read_rates(p)?, p.clone())),
        None => crate::rates::default_rates(plan)?,
    };
    let compared = 1.min(plan.config.epochs.saturating_sub(1));
    let mut steps = None;
    while !trainer.done() {
        let epoch = trainer.epochs_done();
        let m = with_ticker(epoch, steps, || trainer.train_epoch())?;
        // an epoch takes the steps of the one before: the next shows "of" them
        steps = Some(progress::activity().1).filter(|&s| s > 0);
        on_epoch(&m);
        if m.epoch == compared {
            if let Some(p) = trainer.predicted_epoch(rates.as_ref().map(|r| &r.0)) {
                predicted_against_measured(&m, &p, rates.as_ref().map(|r| r.1.as_path()));
            }
        }
    }
    Ok(())
}

/// Runs `work` (epoch `epoch`) while another thread shows what it is doing once it has taken
/// a while: on a terminal a line under the bar, redrawn (the phase, partition steps, bytes
/// moved); off one, as in a batch job's log, a line every 30 s of a long epoch.
/// `steps`: the partition steps of the epoch before, if known.
fn with_ticker<R>(epoch: usize, steps: Option<u64>, work: impl FnOnce() -> R) -> R {
    use std::time::{Duration, Instant};
    // the ticker waits on this channel: it wakes at once when the epoch ends (its sender
    // dropped, also when the work panics) instead of after its sleep
    let (alive, ended) = std::sync::mpsc::channel::<()>();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let mut spinner = None;
            // (GRINNDER_PROGRESS_SECONDS: another interval, for tests)
            let every = std::env::var("GRINNDER_PROGRESS_SECONDS")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
                .map_or(Duration::from_secs(30), Duration::from_secs_f64);
            let mut next_line = every;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                ended.recv_timeout(Duration::from_millis(100))
            {
                let t = start.elapsed();
                let (phase, done, bytes) = progress::activity();
                let what = format!(
                    "{}{done}{} partition steps, {:.1} GB moved",
                    if phase.is_empty() { String::new() } else { format!("{phase}; ") },
                    steps.map_or(String::new(), |s| format!(" of {s}")),
                    bytes as f64 / 1e9
                );
                if terminal && t > Duration::from_secs(2) {
                    spinner
                        .get_or_insert_with(|| progress::spinner(&format!("epoch {epoch}")))
                        .set_message(format!("epoch {epoch}: {what}"));
                } else if !terminal && t >= next_line {
                    tracing::info!("epoch {epoch}: {:.1} s in: {what}", t.as_secs_f64());
                    next_line += every;
                }
            }
            if let Some(s) = spinner {
                s.finish_and_clear();
            }
        });
        let _alive = alive;
        work()
    })
}

/// The cost model's epoch against the measured one (`train` after its second epoch).
fn predicted_against_measured(
    m: &EpochMetrics,
    p: &grinnder_engine::tiered::Prediction,
    rates: Option<&std::path::Path>,
) {
    let mib = |b: u64| b as f64 / 1048576.0;
    if let Some(t) = &m.tier {
        let (pt, st) = (&p.traffic, &t.tier);
        tracing::debug!(
            "epoch {}: predicted / measured MiB: to the backend {:.1} / {:.1}, back {:.1} / {:.1}, storage read {:.1} / {:.1}, written {:.1} / {:.1}",
            m.epoch,
            mib(pt.upload_bytes),
            mib(t.upload_bytes),
            mib(pt.download_bytes),
            mib(t.download_bytes),
            mib(pt.storage_read_bytes),
            mib(st.storage_read_bytes),
            mib(pt.storage_write_bytes),
            mib(st.storage_write_bytes)
        );
    }
    if let (Some(e), Some(predicted)) = (m.eval_s, p.evaluation_s) {
        tracing::info!("epoch {}: evaluation {e:.3} s; the cost model predicted {predicted:.3} s", m.epoch);
    }
    if let (Some(s), Some(r)) = (&p.seconds, rates) {
        tracing::info!(
            "epoch {}: {:.3} s; the cost model predicted {:.3} s ({:+.0} %: compute {:.3} s, bus {:.3} s, host copies {:.3} s, storage {:.3} s at the rates in {})",
            m.epoch,
            m.epoch_s,
            s.epoch_s,
            (s.epoch_s / m.epoch_s - 1.0) * 100.0,
            s.compute_s,
            s.transfer_s,
            s.host_copy_s,
            s.storage_s,
            r.display()
        );
    }
}

/// The trainer's mode for `plan`: mini-batches (cooperative over ranks), the whole graph in
/// memory, or the tiered executor (partition-parallel over ranks).
pub fn mode_of<'a, B: Backend>(
    plan: &TrainPlan,
    features: Option<&'a dyn FeatureSource<B>>,
    groups: Option<&'a grinnder_dist::Groups>,
    device: Option<&'a DeviceGroups<B>>,
) -> Mode<'a, B> {
    match (&plan.tiered, &plan.minibatch) {
        (_, Some(mb)) => match groups {
            Some(groups) => Mode::Cooperative { config: mb.clone(), groups, features },
            None => Mode::MiniBatch { config: mb.clone(), features },
        },
        (None, None) => Mode::FullGraph,
        (Some(t), None) => {
            let tiered = TieredConfig {
                parts: t.parts,
                method: t.partitioner.method(plan.config.model.seed),
                partition_cache: t.cache_dir.clone().or_else(crate::args::default_cache_dir),
                cache_mode: t.cache_mode,
                host_mem: t.host_mem,
                storage_dir: t.storage_dir.clone(),
                tier_dtype: t.tier_dtype,
                keep_storage: t.keep_storage,
                faults: Default::default(),
                cache_bytes: t.block_cache,
                gpu_mem: plan.gpu_mem,
                device_cache_bytes: None,
                host_auto: t.host_auto.clone(),
                auto_parts: t.auto_parts,
                // (a model file's trainer sets it: Trainer::for_model)
                inference: false,
            };
            match groups {
                Some(groups) => Mode::Ranks { tiered, groups, device, expansion: plan.expansion },
                None => Mode::Tiered(tiered),
            }
        }
    }
}

/// One epoch as a log line: `epoch 3: loss 1.2345, accuracy train 80.1 % valid 78.2 % test
/// 77.9 %, 0.052 s + evaluation 0.011 s` (accuracies and the evaluation's time on evaluated
/// epochs only).
fn epoch_line(m: &EpochMetrics) -> String {
    let acc = match (m.train_acc, m.valid_acc, m.test_acc) {
        (Some(t), Some(v), Some(s)) => {
            format!(", accuracy train {:.1} % valid {:.1} % test {:.1} %", t * 100.0, v * 100.0, s * 100.0)
        }
        _ => String::new(),
    };
    let eval = m.eval_s.map_or(String::new(), |e| format!(" + evaluation {e:.3} s"));
    format!("epoch {}: loss {:.4}{acc}, {:.3} s{eval}", m.epoch, m.loss, m.epoch_s)
}
