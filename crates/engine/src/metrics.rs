//! What training reports: per-epoch figures and the final summary.

use serde::Serialize;

/// One epoch's figures (the keys of `--metrics-out`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochMetrics {
    pub epoch: usize,
    /// Mean cross-entropy over the training nodes (train mode: with dropout).
    pub loss: f64,
    /// Accuracies and evaluation time, on evaluated epochs (`--eval-every`) only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_acc: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_acc: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_acc: Option<f64>,
    /// The learning rate of the epoch's step (its schedule's, `--lr-schedule`).
    pub lr: f64,
    /// Seconds of the training step (forward, loss, backward, optimizer).
    pub epoch_s: f64,
    /// Seconds of the evaluation pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_s: Option<f64>,
    /// Peak resident memory of the process so far.
    pub peak_host_bytes: u64,
    /// Peak bytes of GPU memory the backend held so far (GPU backends only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_bytes: Option<u64>,
    /// The tiered executor's phase times and store counters (training step only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::tiered::PhaseStats>,
}

/// The run's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub epochs: usize,
    /// The epoch the accuracies are of: the best validation epoch, or without a validation
    /// split the last one evaluated.
    pub best_epoch: usize,
    pub best_valid_acc: f64,
    /// Test accuracy at `best_epoch`.
    pub test_acc: f64,
    /// Whether `best_epoch` was selected by validation accuracy (false: the dataset has no
    /// validation split, and the last epoch evaluated is reported and saved).
    pub selected_by_valid: bool,
    /// Whether training stopped before the last epoch, `--patience` epochs after the best
    /// validation accuracy.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stopped_early: bool,
    pub final_loss: f64,
    /// Median training-step time.
    pub epoch_s_median: f64,
    pub peak_host_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_bytes: Option<u64>,
    /// The setup's phases (loading, partitioning, …) and their seconds, where the caller
    /// records them (the CLI: from [`grinnder_graph::progress::phase_times`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<SetupPhase>,
}

/// A setup phase and its seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SetupPhase {
    pub phase: String,
    pub seconds: f64,
}

impl SetupPhase {
    /// Every setup phase the process has ended so far.
    pub fn all() -> Vec<SetupPhase> {
        grinnder_graph::progress::phase_times()
            .into_iter()
            .map(|(phase, seconds)| SetupPhase { phase, seconds })
            .collect()
    }

    /// `12.3 s (loading data 3.1 s, partitioning (64 parts) 8.0 s, …)`.
    pub fn describe(phases: &[SetupPhase]) -> String {
        let total: f64 = phases.iter().map(|p| p.seconds).sum();
        let each: Vec<String> = phases.iter().map(|p| format!("{} {:.1} s", p.phase, p.seconds)).collect();
        format!("{total:.1} s ({})", each.join(", "))
    }
}
