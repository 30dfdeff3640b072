//! GNN layers with forward and backward written by hand, the loss, the optimizers and models,
//! all on the [`grinnder_tensor::Backend`] trait.
//!
//! Every layer has the same shape: `init`, `forward` returning what backward needs,
//! `backward` accumulating parameter gradients and returning the input gradient, and
//! `params_mut`. Each layer's module documents its formula and shapes. A convolution family
//! is one module stating what it is and what its layers can do ([`conv::Family`],
//! [`conv::Conv`]), listed once in the registry ([`families`]).

pub mod aggregate;
pub mod aggregation;
pub mod conv;
pub mod families;
pub mod graph;
pub mod layer_norm;
pub mod linear;
pub mod memory;
pub mod model;
pub mod optim;
pub mod param;
pub mod work;

pub use aggregation::{Aggregation, Factors};
pub use families::Kind;
pub use graph::Graph;
pub use model::{Model, ModelConfig, Norm};
pub use optim::{LrSchedule, OptimConfig, Optimizer};
pub use param::Param;
