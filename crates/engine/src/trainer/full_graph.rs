//! [`super::Mode::FullGraph`]: every node and every edge at once in the backend's memory — the
//! in-memory trainer every other mode is checked against. The loss is the mean cross-entropy
//! over the training nodes.

use grinnder_graph::Dataset;
use grinnder_nn::{Graph, Model, Optimizer};
use grinnder_tensor::Backend;

use super::Engine;
use crate::config::{TrainConfig, TrainError};
use crate::features::features;
use crate::tiered::PhaseStats;

pub(super) struct FullGraph<'a, B: Backend> {
    b: &'a B,
    ds: &'a Dataset,
    model: Model<B>,
    graph: Graph<B>,
    /// The preprocessed features (none where layer 0 reads only its precomputed aggregation).
    x: B::Mat,
}

impl<'a, B: Backend> FullGraph<'a, B> {
    pub(super) fn new(b: &'a B, ds: &'a Dataset, cfg: &TrainConfig) -> Self {
        let mut model = Model::init(b, cfg.model.clone(), ds.features.dim, ds.num_classes as usize);
        // only the adjacency the model's layers aggregate over
        let graph = Graph::with(b, &ds.graph, ds.edge_weight.as_deref(), &[model.aggregation()]);
        let x = features(b, ds, cfg.features());
        model.prepare(b, &graph, &x);
        // GCN's layer 0 reads only `Â x` from here: the features need not stay beside it
        let x = if model.reads_only_pre() {
            drop(x);
            b.zeros(0, ds.features.dim)
        } else {
            x
        };
        FullGraph { b, ds, model, graph, x }
    }
}

impl<B: Backend> Engine<B> for FullGraph<'_, B> {
    fn train_epoch(
        &mut self,
        opt: &mut Optimizer,
        epoch: u64,
    ) -> Result<(f64, Option<PhaseStats>), TrainError> {
        let (b, ds) = (self.b, self.ds);
        let train = &ds.splits.train;
        self.model.zero_grad(b);
        let (logits, tape) = self.model.forward(b, &self.graph, &self.x, true, epoch);
        let (rows, cols) = b.dims(&logits);
        let mut dlogits = b.zeros(rows, cols);
        let (loss_sum, _) =
            b.cross_entropy(&logits, &ds.labels, train, 1.0 / train.len() as f64, &mut dlogits);
        drop(logits);
        self.model.backward(b, &self.graph, &self.x, tape, dlogits);
        opt.step(b, self.model.params_mut());
        b.synchronize();
        Ok((loss_sum, None))
    }

    fn correct(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        let (eval, _) = self.model.forward(self.b, &self.graph, &self.x, false, epoch);
        Ok(self.ds.splits.named().map(|(_, ids)| self.b.count_correct(&eval, &self.ds.labels, ids)))
    }

    fn model(&mut self) -> &mut Model<B> {
        &mut self.model
    }

    fn predict(
        &mut self,
        upto: usize,
        _wanted: &dyn Fn(u32) -> bool,
        emit: &mut crate::tiered::Emit<'_>,
    ) -> Result<Option<PhaseStats>, TrainError> {
        // every node at once, as this mode trains
        let y = self.model.forward_to(self.b, &self.graph, &self.x, upto);
        let host = self.b.download(&y);
        drop(y);
        crate::mode::emit_in_pieces(&host, 0, emit)?;
        Ok(None)
    }
}
