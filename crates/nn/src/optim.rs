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

impl OptimConfig {
    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match *self {
            OptimConfig::Adam { lr, .. } | OptimConfig::Adamw { lr, .. } | OptimConfig::Sgd { lr, .. } => lr,
        }
    }
}

/// How the learning rate changes over the epochs: PyTorch's schedulers as they are stepped once
/// an epoch (`StepLR`, `CosineAnnealingLR`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LrSchedule {
    /// The optimizer's rate every epoch.
    #[default]
    Constant,
    /// `lr · gamma^⌊epoch / every⌋` (`StepLR(step_size=every, gamma=gamma)`).
    Step { every: usize, gamma: f64 },
    /// `min_lr + (lr − min_lr) · (1 + cos(π · epoch / epochs)) / 2`
    /// (`CosineAnnealingLR(T_max=epochs, eta_min=min_lr)`).
    Cosine { epochs: usize, min_lr: f64 },
}

impl LrSchedule {
    /// The rate of epoch `epoch` (from 0) for a base rate `lr`.
    pub fn lr(&self, lr: f64, epoch: usize) -> f64 {
        match *self {
            LrSchedule::Constant => lr,
            LrSchedule::Step { every, gamma } => lr * gamma.powi((epoch / every.max(1)) as i32),
            LrSchedule::Cosine { epochs, min_lr } => {
                let t = epoch as f64 / epochs.max(1) as f64;
                min_lr + (lr - min_lr) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
            }
        }
    }
}

impl std::fmt::Display for LrSchedule {
    /// As the command line's flags set it: `step every 30 gamma 0.1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            LrSchedule::Constant => write!(f, "constant"),
            LrSchedule::Step { every, gamma } => write!(f, "step every {every} epochs by {gamma}"),
            LrSchedule::Cosine { epochs, min_lr } => write!(f, "cosine over {epochs} epochs to {min_lr}"),
        }
    }
}

/// An optimizer and its step count.
pub struct Optimizer {
    pub config: OptimConfig,
    pub steps: u64,
    /// The rate of the steps to come where a schedule set one (else the config's).
    pub lr: Option<f64>,
}

impl Optimizer {
    pub fn new(config: OptimConfig) -> Self {
        Optimizer { config, steps: 0, lr: None }
    }

    /// One step over `params` with their accumulated gradients.
    pub fn step<B: Backend>(&mut self, b: &B, params: Vec<&mut Param<B>>) {
        self.steps += 1;
        let t = self.steps;
        let config = match (self.config, self.lr) {
            (OptimConfig::Adam { weight_decay, .. }, Some(lr)) => OptimConfig::Adam { lr, weight_decay },
            (OptimConfig::Adamw { weight_decay, .. }, Some(lr)) => OptimConfig::Adamw { lr, weight_decay },
            (OptimConfig::Sgd { momentum, weight_decay, .. }, Some(lr)) => {
                OptimConfig::Sgd { lr, momentum, weight_decay }
            }
            (c, None) => c,
        };
        let rule = match config {
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

#[cfg(test)]
mod tests {
    use super::LrSchedule;

    #[test]
    fn schedules_give_pytorchs_rates() {
        // torch.optim.lr_scheduler.StepLR(step_size=2, gamma=0.5), CosineAnnealingLR(T_max=4,
        // eta_min=0.001) on lr 0.1, stepped once an epoch
        let step = LrSchedule::Step { every: 2, gamma: 0.5 };
        let want = [0.1, 0.1, 0.05, 0.05, 0.025];
        for (e, w) in want.iter().enumerate() {
            assert!((step.lr(0.1, e) - w).abs() < 1e-15, "step, epoch {e}");
        }
        let cos = LrSchedule::Cosine { epochs: 4, min_lr: 0.001 };
        let want = [0.1, 0.0855017856687341, 0.0505, 0.0154982143312659, 0.001];
        for (e, w) in want.iter().enumerate() {
            assert!((cos.lr(0.1, e) - w).abs() < 1e-8, "cosine, epoch {e}: {}", cos.lr(0.1, e));
        }
        assert_eq!(LrSchedule::Constant.lr(0.1, 7), 0.1);
    }
}
