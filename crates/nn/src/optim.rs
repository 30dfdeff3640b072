//! Optimizers with PyTorch's definitions: Adam (L2 decay added to the gradient), AdamW
//! (decoupled decay), SGD with momentum (`buf = m·buf + g; p -= lr·buf`, L2 decay in `g`).

use grinnder_tensor::{Backend, StepRule};
use serde::{Deserialize, Serialize};

use crate::param::Param;

/// Which optimizer, with its hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OptimConfig {
    Adam { lr: f64, weight_decay: f64 },
    Adamw { lr: f64, weight_decay: f64 },
    Sgd { lr: f64, momentum: f64, weight_decay: f64 },
}

impl std::fmt::Display for OptimConfig {
    /// As the command line's flags set it: `adam lr=0.01 weight_decay=0.0005`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            OptimConfig::Adam { lr, weight_decay } => write!(f, "adam lr={lr} weight_decay={weight_decay}"),
            OptimConfig::Adamw { lr, weight_decay } => write!(f, "adamw lr={lr} weight_decay={weight_decay}"),
            OptimConfig::Sgd { lr, momentum, weight_decay } => {
                write!(f, "sgd lr={lr} momentum={momentum} weight_decay={weight_decay}")
            }
        }
    }
}

/// An optimizer and its step count.
pub struct Optimizer {
    pub config: OptimConfig,
    pub steps: u64,
}

impl Optimizer {
    pub fn new(config: OptimConfig) -> Self {
        Optimizer { config, steps: 0 }
    }

    /// One step over `params` with their accumulated gradients.
    pub fn step<B: Backend>(&mut self, b: &B, params: Vec<&mut Param<B>>) {
        self.steps += 1;
        let t = self.steps;
        let rule = match self.config {
            OptimConfig::Adam { lr, weight_decay } => {
                StepRule::Adam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay, decoupled: false, t }
            }
            OptimConfig::Adamw { lr, weight_decay } => {
                StepRule::Adam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay, decoupled: true, t }
            }
            OptimConfig::Sgd { lr, momentum, weight_decay } => {
                StepRule::Sgd { lr, momentum, weight_decay, first: t == 1 }
            }
        };
        for p in params {
            let (r, c) = b.dims(&p.value);
            let (s1, s2) = p.state.get_or_insert_with(|| (b.zeros(r, c), b.zeros(r, c)));
            b.step(rule, &mut p.value, &p.grad, s1, s2);
        }
    }
}
