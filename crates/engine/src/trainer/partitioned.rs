//! [`super::Mode::Tiered`] and [`super::Mode::Ranks`]: the layer-wise, partition-wise executor
//! over the tiered store, in one process or as one rank of many. Over ranks each computes its
//! share of the partitions, halo rows and gradients cross ranks, and parameter gradients, the
//! loss and the accuracy counts are summed over every rank — every rank sees the whole graph's
//! figures, the same as one process. With server shares (flexible preloading, expansion-aware
//! sampling) the executor runs on the server's share and the figures are the whole's.

use grinnder_dist::Groups;
use grinnder_graph::Dataset;
use grinnder_nn::{Model, Optimizer};
use grinnder_tensor::Backend;

use super::Engine;
use crate::config::{TrainConfig, TrainError};
use crate::preload::{share, DeviceGroups, Expansion};
use crate::tiered::{
    shared_partitioning, DeviceComms, DistConfig, Executor, PhaseStats, SubgraphOf, TieredConfig,
};

pub(super) struct Partitioned<'a, B: Backend> {
    b: &'a B,
    ex: Executor<'a, B>,
    /// Trains on a server's share of the graph (its rows are not all its own).
    share: bool,
}

impl<'a, B: Backend> Partitioned<'a, B> {
    pub(super) fn one_process(
        b: &'a B,
        ds: &Dataset,
        cfg: &TrainConfig,
        tc: &TieredConfig,
    ) -> Result<Self, TrainError> {
        Self::on(b, ds, None, cfg, tc, None)
    }

    /// One rank of `groups`: plain partition-parallel for [`Expansion::Plain`], otherwise on
    /// this server's share (see [`crate::preload`]). `tc.parts` counts partitions over every
    /// rank (at least one per rank).
    pub(super) fn ranks(
        b: &'a B,
        ds: &Dataset,
        cfg: &TrainConfig,
        tc: &TieredConfig,
        groups: &'a Groups,
        device: Option<&'a DeviceGroups<B>>,
        expansion: Expansion,
    ) -> Result<Self, TrainError> {
        let layout = groups.layout;
        if expansion == Expansion::Plain {
            let dist = DistConfig {
                comm: groups.global.as_ref(),
                ranks_per_server: layout.ranks_per_server,
                reduce: None,
                device: device.map(|d| DeviceComms { comm: d.global.as_ref(), reduce: d.global.as_ref() }),
                groups: Some(groups),
            };
            return Self::on(b, ds, None, cfg, tc, Some(dist));
        }
        let servers = layout.servers();
        let me = groups.global.rank();
        let server_parts = TieredConfig { parts: servers, ..tc.clone() };
        let part = shared_partitioning(groups.global.as_ref(), ds, &server_parts)?.part;
        let sh = share(ds, &part, layout.server(me), expansion, cfg);
        tracing::info!(
            "server {} of {servers}: owns {} nodes, trains on {} (expansion {})",
            layout.server(me),
            sh.owned,
            sh.ds.num_nodes(),
            expansion
        );
        // the partitions of every rank, shared out by server
        let per_server = (tc.parts / servers).max(groups.server.size());
        let tc_server = TieredConfig { parts: per_server, partition_cache: None, ..tc.clone() };
        let dist = DistConfig {
            comm: groups.server.as_ref(),
            ranks_per_server: layout.ranks_per_server,
            reduce: Some(groups.global.as_ref()),
            device: device.map(|d| DeviceComms { comm: d.server.as_ref(), reduce: d.global.as_ref() }),
            groups: Some(groups),
        };
        let mut me = Self::on(b, &sh.ds, Some(&sh.of), cfg, &tc_server, Some(dist))?;
        me.share = true;
        Ok(me)
    }

    fn on(
        b: &'a B,
        ds: &Dataset,
        sub: Option<&SubgraphOf>,
        cfg: &TrainConfig,
        tc: &TieredConfig,
        dist: Option<DistConfig<'a, B>>,
    ) -> Result<Self, TrainError> {
        let ex = Executor::new_share(b, ds, sub, &cfg.model, cfg.features(), tc, dist)?;
        tracing::info!(
            "{} partitions; host cache {}, mode {}; blocks {:.1} MiB in all, at most {:.1} MiB on the host at once; storage {}",
            tc.parts,
            ex.plan
                .cache_bytes
                .map_or("unlimited".to_string(), |c| format!("{:.1} MiB", c as f64 / 1048576.0)),
            ex.plan.mode,
            ex.plan.block_bytes as f64 / 1048576.0,
            ex.plan.host_block_bytes.unwrap_or(ex.plan.block_bytes) as f64 / 1048576.0,
            match ex.store_direct_io() {
                None => "none",
                Some((true, true)) => "O_DIRECT through io_uring",
                Some((true, false)) => "O_DIRECT with pread/pwrite",
                Some((false, true)) => "buffered through io_uring",
                Some((false, false)) => "buffered pread/pwrite",
            }
        );
        if let Some(without) = ex.plan.block_bytes_without_input_dropout {
            tracing::info!(
                "input dropout {} keeps layer 0 from running on its aggregation computed once: {:.1} MiB of blocks, {:.1} MiB with --input-dropout 0 (`grinnder info` with these flags predicts both epochs' traffic)",
                cfg.model.input_dropout,
                ex.plan.block_bytes as f64 / 1048576.0,
                without as f64 / 1048576.0
            );
        }
        Ok(Partitioned { b, ex, share: false })
    }
}

impl<B: Backend> Engine<B> for Partitioned<'_, B> {
    fn train_epoch(
        &mut self,
        opt: &mut Optimizer,
        epoch: u64,
    ) -> Result<(f64, Option<PhaseStats>), TrainError> {
        let e = &mut self.ex;
        e.model.zero_grad(self.b);
        let (loss, _) = e.forward_backward(epoch)?;
        if let Some(measured) = e.take_measured_working() {
            tracing::debug!(
                "epoch {epoch}: the largest working set measured {:.1} MiB (heap growth in a phase), the plan's {:.1} MiB",
                measured as f64 / 1048576.0,
                e.plan.working_bytes as f64 / 1048576.0
            );
        }
        if let Some(measured) = e.take_measured_device_working() {
            tracing::debug!(
                "epoch {epoch}: the largest GPU working set measured {:.1} MiB (growth in a phase beyond the blocks it added), the plan's {:.1} MiB",
                measured as f64 / 1048576.0,
                e.plan.device_working_bytes as f64 / 1048576.0
            );
        }
        let mut loss = [loss];
        e.reduce(&mut loss);
        e.reduce_gradients();
        opt.step(self.b, e.model.params_mut());
        self.b.synchronize();
        Ok((loss[0], Some(e.take_stats())))
    }

    fn correct(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        let mut c = self.ex.evaluate(epoch)?.map(|n| n as u64);
        // the evaluation's phase figures are not the next training step's (every rank takes
        // them: with ranks, a collective)
        self.ex.take_stats();
        self.ex.reduce(&mut c);
        Ok(c.map(|n| n as usize))
    }

    fn model(&mut self) -> &mut Model<B> {
        &mut self.ex.model
    }

    fn predict(
        &mut self,
        upto: usize,
        wanted: &dyn Fn(u32) -> bool,
        emit: &mut crate::tiered::Emit<'_>,
    ) -> Result<Option<PhaseStats>, TrainError> {
        if self.share {
            return Err(TrainError::Config(
                "predictions run over the whole graph: use plain partition-parallel ranks (no --expansion)"
                    .into(),
            ));
        }
        self.ex.predict(upto, wanted, emit)?;
        Ok(Some(self.ex.take_stats()))
    }

    fn predict_epoch(&mut self, rates: Option<&crate::tiered::Rates>) -> Option<crate::tiered::Prediction> {
        self.ex.predict_epoch(rates)
    }
}
