//! What a caller brings of its own: a model of its layers ([`Executor::for_layers`]), and a
//! criterion. A training pass whose loss is the caller's: the forward runs as in any pass, then the
//! output layer's rows of every training node go to the caller's criterion at once (a loss
//! over the whole train split, any reduction: class weights, multi-label, regression), and
//! its gradient of those rows starts the backward in place of the built-in cross entropy.
//! The gradients are then those of whole-graph training under that criterion, for any
//! partitioning. The output layer runs once more than in a built-in pass (its forward for
//! the criterion, then again in its backward).

use grinnder_graph::Dataset;
use grinnder_nn::Model;
use grinnder_tensor::{Backend, Mat, Scalar};

use crate::config::{FeaturePrep, TrainError};

use super::executor::{io_err, Executor};
use super::settings::TieredConfig;

/// A caller's criterion: `(ids, rows, width)` are the training nodes' dataset ids and their
/// output rows (row-major, `width` wide, row i being node `ids[i]`); it returns the loss and
/// the loss's gradient of those rows, in the same layout.
pub type Criterion<'a> = dyn FnMut(&[u32], &[f32], usize) -> Result<(f64, Vec<f32>), TrainError> + 'a;

impl<'a, B: Backend> Executor<'a, B> {
    /// [`Executor::new`] for a model of the caller's layers ([`Model::from_layers`]): `make`
    /// makes it (again where the partition count is raised and the setup starts over).
    pub fn for_layers(
        b: &'a B,
        ds: &Dataset,
        make: &dyn Fn() -> Model<B>,
        features: impl Into<FeaturePrep>,
        tc: &TieredConfig,
    ) -> Result<Self, TrainError> {
        let ex = Self::set_up(b, ds, None, &|| Ok(make()), tc, None, false)?;
        ex.with_first_blocks(ds, None, features.into())
    }

    /// One training pass under `criterion` (see the module): accumulates every parameter's
    /// gradient (the caller zeroes them) and returns the criterion's loss. One process only.
    pub fn forward_backward_with(
        &mut self,
        epoch: u64,
        criterion: &mut Criterion<'_>,
    ) -> Result<f64, TrainError> {
        assert!(!self.inference, "a training pass on an executor planned to predict");
        if self.dist.is_some() {
            return Err(TrainError::Config(
                "a criterion of the caller's runs in one process, not over ranks".into(),
            ));
        }
        // (a criterion's error stops this pass only: the executor is as before it)
        self.guarded(|ex| ex.criterion_pass(epoch, criterion))?
    }

    /// The pass; its inner result is the criterion's (an error there, or a gradient of the
    /// wrong size, removes the forward's blocks and leaves the executor whole), its outer one
    /// the executor's.
    fn criterion_pass(
        &mut self,
        epoch: u64,
        criterion: &mut Criterion<'_>,
    ) -> Result<Result<f64, TrainError>, TrainError> {
        let layers = self.model.layers();
        self.meters.begin_pass();
        self.forward_to(layers, true, epoch)?;
        // the training nodes' output rows, partition by partition, with the dropout a layer
        // applies inside itself in training (as its backward recomputes them)
        let (mut ids, mut rows, mut width) = (Vec::new(), Vec::new(), 0);
        for q in self.local.clone() {
            let steps = self.output_steps(q, q + 1);
            let y = self.run(&steps, true, epoch)?.y.expect("the output layer's rows");
            let y = self.b.download(&y);
            width = y.cols;
            let own = self.own_ids(q);
            for &r in &self.parts[q].split_rows[0] {
                ids.push(own[r as usize]);
                rows.extend(y.row(r as usize).iter().map(|v| v.f64() as f32));
            }
        }
        let checked = criterion(&ids, &rows, width).and_then(|(loss, grad)| match grad.len() == rows.len() {
            true => Ok((loss, grad)),
            false => Err(TrainError::Config(format!(
                "the criterion gave a gradient of {} values for {} output rows of {width}",
                grad.len(),
                ids.len()
            ))),
        });
        let (loss, grad) = match checked {
            Ok(c) => c,
            Err(e) => {
                self.remove_forward_blocks(layers)?;
                return Ok(Err(e));
            }
        };
        // each partition's output gradient: its training rows', zero elsewhere
        let mut at = 0;
        let mut given = Vec::with_capacity(self.parts.len());
        for q in 0..self.parts.len() {
            if !self.local.contains(&q) {
                given.push(None);
                continue;
            }
            let part = &self.parts[q];
            let mut dy = Mat::<B::T>::zeros(part.own, width);
            for &r in &part.split_rows[0] {
                let g = &grad[at * width..(at + 1) * width];
                dy.row_mut(r as usize).iter_mut().zip(g).for_each(|(d, &v)| *d = B::T::of(v as f64));
                at += 1;
            }
            given.push(Some(self.b.upload_owned(dy)));
        }
        self.given = Some(given);
        let steps = self.backward_steps();
        let ran = self.run(&steps, true, epoch);
        self.given = None;
        ran?;
        self.tiers.store.sync().map_err(io_err)?;
        Ok(Ok(loss))
    }
}
