//! Inference: a trained model's outputs per node — logits, probabilities, classes, or any
//! hidden layer's output (an embedding) — for every node or a chosen set, in the dataset's node
//! order. A mode computes the rows a partition (or the whole graph) at a time and hands them
//! on with their node ids; here they are selected, finished (softmax, argmax) and given to a
//! [`RowSink`] with their output positions, so no mode ever holds the whole output and a sink
//! can write it straight to a file.

use grinnder_graph::Dataset;
use rayon::prelude::*;

use crate::config::TrainError;

/// What to compute for each node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The output layer's values.
    Logits,
    /// Their softmax.
    Probs,
    /// The predicted class (the first largest logit).
    Class,
    /// The output of hidden layer `l` (0-based: after its norm, ReLU and residual).
    Embedding(usize),
}

/// Which output and for which nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub output: Output,
    /// Node ids of the dataset, in the order their rows are written (no id twice); `None`:
    /// every node, in id order.
    pub nodes: Option<Vec<u32>>,
}

pub use crate::tiered::Emit;

/// Finished rows on their way to a sink.
pub enum Rows<'a> {
    /// `width` values per row.
    Values { data: &'a [f32], width: usize },
    /// One class per row.
    Classes(&'a [i64]),
}

/// Where predictions go: row i of `rows` is output row `at[i]`. Called with rows in any order
/// (partition by partition), each output row exactly once.
pub trait RowSink {
    fn write(&mut self, at: &[u64], rows: Rows<'_>) -> Result<(), TrainError>;
    /// Makes what was written visible to the other ranks (called once a pass is done, before
    /// the ranks meet).
    fn flush(&mut self) -> Result<(), TrainError> {
        Ok(())
    }
}

/// What an inference run did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// Output rows written (this rank's).
    pub rows: u64,
    /// Values per row (1 for classes).
    pub width: usize,
    /// Correct predictions and labelled nodes among the requested ones (every rank's; `None`
    /// for embeddings).
    pub correct: Option<(u64, u64)>,
    /// Seconds computing (the forward pass, without the sink's writes).
    pub compute_s: f64,
    /// Seconds in the sink.
    pub write_s: f64,
    /// The executor's figures (tiered modes): bytes moved per tier, phase times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::tiered::PhaseStats>,
}

impl Prediction {
    /// The accuracy over the labelled requested nodes, if there were any.
    pub fn accuracy(&self) -> Option<f64> {
        self.correct.filter(|c| c.1 > 0).map(|(c, n)| c as f64 / n as f64)
    }
}

/// Output positions of node ids: the id itself, or its place in the requested list.
pub(crate) struct Positions {
    /// (id, position), sorted by id; `None`: every node at its own id.
    sorted: Option<Vec<(u32, u64)>>,
}

impl Positions {
    /// Checks `req`'s nodes against `ds` (ids in range, none twice).
    pub(crate) fn new(req: &Request, ds: &Dataset) -> Result<Positions, TrainError> {
        let Some(nodes) = &req.nodes else { return Ok(Positions { sorted: None }) };
        let n = ds.num_nodes();
        if let Some(&v) = nodes.iter().find(|&&v| v as usize >= n) {
            return Err(TrainError::Config(format!(
                "node {v} is not in the graph ({n} nodes, ids 0 to {})",
                n - 1
            )));
        }
        let mut sorted: Vec<(u32, u64)> = nodes.iter().enumerate().map(|(i, &v)| (v, i as u64)).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(TrainError::Config(format!("node {} is asked for twice", w[0].0)));
        }
        Ok(Positions { sorted: Some(sorted) })
    }

    /// Where node `v`'s row goes, if it was asked for.
    pub(crate) fn at(&self, v: u32) -> Option<u64> {
        match &self.sorted {
            None => Some(v as u64),
            Some(s) => s.binary_search_by_key(&v, |e| e.0).ok().map(|i| s[i].1),
        }
    }
}

/// Selects the requested rows of a mode's output, finishes them and writes them to a sink,
/// counting correct predictions on the way.
pub(crate) struct Finisher<'a> {
    pub output: Output,
    pub positions: &'a Positions,
    pub labels: &'a [i32],
    pub sink: &'a mut dyn RowSink,
    pub done: Prediction,
}

impl Finisher<'_> {
    /// Rows of nodes `ids` (row i: node `ids[i]`; `rows` row-major, `w` values each).
    pub(crate) fn take(&mut self, ids: &[u32], rows: &[f32], w: usize) -> Result<(), TrainError> {
        let t = std::time::Instant::now();
        let row = |i: usize| &rows[i * w..(i + 1) * w];
        let (pick, at): (Vec<usize>, Vec<u64>) =
            ids.iter().enumerate().filter_map(|(i, &v)| self.positions.at(v).map(|p| (i, p))).unzip();
        self.done.rows += at.len() as u64;
        let counting = !matches!(self.output, Output::Embedding(_));
        if counting {
            let labels = self.labels;
            let (right, labelled) = pick
                .par_iter()
                .with_min_len(1 << 12)
                .map(|&i| match labels[ids[i] as usize] {
                    l if l >= 0 => ((argmax(row(i)) as i32 == l) as u64, 1u64),
                    _ => (0, 0),
                })
                .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            let c = self.done.correct.get_or_insert((0, 0));
            (c.0, c.1) = (c.0 + right, c.1 + labelled);
        }
        match self.output {
            Output::Class => {
                self.done.width = 1;
                let classes: Vec<i64> = pick.par_iter().map(|&i| argmax(row(i)) as i64).collect();
                self.sink.write(&at, Rows::Classes(&classes))?;
            }
            // every row, in order: handed on as it is
            Output::Logits | Output::Embedding(_) if pick.len() == ids.len() => {
                self.done.width = w;
                self.sink.write(&at, Rows::Values { data: rows, width: w })?;
            }
            out => {
                self.done.width = w;
                let mut data: Vec<f32> = Vec::with_capacity(pick.len() * w);
                for &i in &pick {
                    data.extend_from_slice(row(i));
                }
                if out == Output::Probs {
                    data.chunks_mut(w.max(1)).for_each(softmax);
                }
                self.sink.write(&at, Rows::Values { data: &data, width: w })?;
            }
        }
        self.done.write_s += t.elapsed().as_secs_f64();
        Ok(())
    }
}

/// The first largest value's index (the rule of the backends' accuracy counts).
pub fn argmax(z: &[f32]) -> usize {
    (0..z.len()).fold(0, |best, j| if z[j] > z[best] { j } else { best })
}

/// A row's softmax in place, computed in f64.
fn softmax(z: &mut [f32]) {
    let max = z.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = z.iter().map(|&x| (x as f64 - max).exp()).sum();
    z.iter_mut().for_each(|x| *x = ((*x as f64 - max).exp() / sum) as f32);
}

/// A sink that keeps everything in memory: `values` (`rows × width`, row-major) or `classes`.
#[derive(Debug, Default)]
pub struct Collect {
    pub values: Vec<f32>,
    pub classes: Vec<i64>,
    pub width: usize,
}

impl Collect {
    /// For `rows` output rows.
    pub fn new(rows: usize) -> Collect {
        Collect { values: Vec::new(), classes: vec![-1; rows], width: 0 }
    }
}

impl RowSink for Collect {
    fn write(&mut self, at: &[u64], rows: Rows<'_>) -> Result<(), TrainError> {
        match rows {
            Rows::Classes(c) => at.iter().zip(c).for_each(|(&p, &k)| self.classes[p as usize] = k),
            Rows::Values { data, width } => {
                if self.width == 0 {
                    self.width = width;
                    self.values = vec![f32::NAN; self.classes.len() * width];
                }
                for (i, &p) in at.iter().enumerate() {
                    let p = p as usize;
                    self.values[p * width..(p + 1) * width]
                        .copy_from_slice(&data[i * width..(i + 1) * width]);
                }
            }
        }
        Ok(())
    }
}
