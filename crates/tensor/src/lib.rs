//! Dense and sparse matrices and the small [`Backend`] trait every layer is written on, with
//! its CPU implementation ([`Cpu`]).
//!
//! **Invariant:** this crate knows nothing of graphs, datasets or models: a graph reaches it as
//! a [`SparseMatrix`] with value sets.

pub mod backend;
pub mod collective;
pub mod cpu;
pub mod dropout;
pub mod mat;
pub mod scalar;
pub mod sparse;

pub use backend::{
    Backend, Binary, DenseOps, DeviceMemory, GraphOps, HandOffs, MaskKey, Memory, PairGrads, Rows, Side,
    StepRule, TrainOps, Transfers, Unary,
};
pub use collective::MatComm;
pub use cpu::Cpu;
pub use mat::Mat;
pub use scalar::Scalar;
pub use sparse::SparseMatrix;

/// Every op-family trait, for code that calls backend methods on a concrete backend (`Cpu`,
/// `Cuda`) rather than through a `B: Backend` bound: `use grinnder_tensor::ops::*;`.
pub mod ops {
    pub use crate::backend::{DenseOps, GraphOps, HandOffs, Memory, TrainOps, Transfers};
}
