//! The setup's unit tests: storage checks, refusals' levers, factored partition graphs.

use crate::tiered::CacheMode;

use super::*;

fn plan(cache: u64, blocks: u64) -> Plan {
    Plan {
        resident_bytes: 0,
        working_bytes: 0,
        device_working_bytes: 0,
        margin_bytes: 0,
        cache_bytes: Some(cache),
        mode: CacheMode::PartitionLru,
        block_bytes: blocks,
        host_block_bytes: None,
        largest_block_bytes: 5 << 20,
        block_bytes_without_input_dropout: None,
        device: None,
    }
}

/// The partitions' adjacency keeps its values as factors per node (no values per entry,
/// no transposed entry order) for the layers that multiply by the adjacency's values alone,
/// and per entry for attention and for edge weights.
#[test]
fn partition_graphs_keep_factored_values_where_the_layers_allow() {
    if std::env::var_os("GRINNDER_FACTORED").is_some() {
        return; // the variable chooses instead (see `factors_values`)
    }
    use grinnder_graph::generate::{generate, preset, GenConfig};
    use grinnder_nn::graph::Values;
    let mut ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.001, 5)).unwrap().into_dataset().unwrap();
    let b = grinnder_tensor::Cpu::<f32>::new();
    let tc = TieredConfig::in_ram(3, grinnder_partition::Method::Contiguous);
    let factored = |ds: &Dataset, family: &str| {
        let cfg = super::super::plan::tests::model_config(family, 2, 8);
        let ex = Executor::new(&b, ds, &cfg, FeatureNorm::Row, &tc).unwrap();
        let kinds: Vec<(bool, bool)> = ex
            .parts
            .iter()
            .flat_map(|p| &p.graph.adjacencies)
            .map(|(_, a)| (matches!(a.vals, Values::Factored { .. }), a.s.has_entry_order()))
            .collect();
        assert_eq!(kinds.len(), 3, "{family}: one adjacency a partition");
        assert!(kinds.iter().all(|&(f, order)| f != order), "{family}: {kinds:?}");
        kinds[0].0
    };
    for family in ["gcn", "sage", "gin"] {
        assert!(factored(&ds, family), "{family}: factored");
    }
    assert!(!factored(&ds, "gat"), "attention reads values per entry");
    ds.edge_weight = Some(vec![0.5f32; ds.graph.num_edges()].into());
    assert!(!factored(&ds, "gcn"), "edge weights are values per entry");
}

/// A refusal for want of storage names only the levers not pulled: bf16 blocks where they
/// are f32, no input dropout where it keeps layer 0 from its aggregation computed once.
#[test]
fn storage_refusals_name_the_levers_not_pulled() {
    let b = grinnder_tensor::Cpu::<f32>::new();
    let model = |family: &str, input_dropout: f64| {
        let cfg = grinnder_nn::ModelConfig {
            input_dropout,
            ..super::super::plan::tests::model_config(family, 2, 8)
        };
        Model::init(&b, cfg, 16, 4)
    };
    let f32 = TieredConfig::in_ram(4, grinnder_partition::Method::Contiguous);
    let bf16 = TieredConfig { tier_dtype: TierDtype::Bf16, ..f32.clone() };
    let unfused = Plan { block_bytes_without_input_dropout: Some(40 << 20), ..plan(0, 100 << 20) };
    let both = block_levers(&unfused, &model("gcn", 0.5), &f32);
    assert!(both.contains("--tier-dtype bf16") && both.contains("--input-dropout 0"), "{both}");
    assert!(both.contains("100.0 MiB of blocks, 40.0 MiB without"), "{both}");
    assert_eq!(block_levers(&unfused, &model("gcn", 0.5), &bf16).matches("--").count(), 1);
    assert!(block_levers(&plan(0, 1), &model("gcn", 0.0), &bf16).is_empty());
}

/// The plan says what input dropout costs where it keeps layer 0 from its aggregation
/// computed once and that would take fewer blocks (GCN), and nothing where it would not
/// (SAGE), where there is none, or for attention.
#[test]
fn the_plan_counts_the_blocks_input_dropout_costs() {
    use grinnder_graph::generate::{generate, preset, GenConfig};
    let ds =
        generate(&GenConfig::new(preset("arxiv-like").unwrap(), 0.001, 5)).unwrap().into_dataset().unwrap();
    let b = grinnder_tensor::Cpu::<f32>::new();
    let tc = TieredConfig::in_ram(3, grinnder_partition::Method::Contiguous);
    let plan_of = |family: &str, input_dropout: f64| {
        let cfg = grinnder_nn::ModelConfig {
            input_dropout,
            // (SAGE's aggregation is computed once only where it is no wider than layer
            // 0's output: the features are 128 wide)
            ..super::super::plan::tests::model_config(family, 2, 256)
        };
        Executor::new(&b, &ds, &cfg, FeatureNorm::Row, &tc).unwrap().plan
    };
    let (with, without) = (plan_of("gcn", 0.5), plan_of("gcn", 0.0));
    assert_eq!(with.block_bytes_without_input_dropout, Some(without.block_bytes));
    assert!(without.block_bytes < with.block_bytes);
    assert_eq!(without.block_bytes_without_input_dropout, None);
    // SAGE keeps its features beside the aggregation (its root term): no fewer blocks
    let (with, without) = (plan_of("sage", 0.5), plan_of("sage", 0.0));
    assert!(without.block_bytes >= with.block_bytes);
    assert_eq!(with.block_bytes_without_input_dropout, None);
    assert_eq!(plan_of("gat", 0.5).block_bytes_without_input_dropout, None);
}

/// Factored values by default, never for attention or edge weights.
#[test]
fn factored_values_are_the_default() {
    if std::env::var_os("GRINNDER_FACTORED").is_some() {
        return; // the variable chooses instead (see `factors_values`)
    }
    assert!(factors_values(false, false));
    assert!(!factors_values(true, false) && !factors_values(false, true));
}

/// Where the storage directory holds every block's file, files outlive their reads; where
/// it holds only the spill beyond the cache (and two of the largest blocks), each goes once
/// read; below that, refused.
#[test]
fn storage_holds_every_block_file_or_the_spill() {
    let dir = std::path::Path::new("/scratch");
    const M: u64 = 1 << 20;
    // every block's file fits: kept after reads
    let levers = "halve the blocks with --tier-dtype bf16, ";
    assert!(check_storage(&plan(60 * M, 100 * M), 100 * M, dir, levers).unwrap());
    // the spill (40, and two blocks of 5 in flight) fits, every block does not: removed
    assert!(!check_storage(&plan(60 * M, 100 * M), 50 * M, dir, levers).unwrap());
    let e = check_storage(&plan(60 * M, 100 * M), 50 * M - 1, dir, levers).unwrap_err().to_string();
    assert!(e.contains("/scratch") && e.contains("--tier-dtype bf16") && e.contains("take 50.0 MiB"), "{e}");
    // blocks within the cache write no file
    assert!(check_storage(&plan(100 * M, 100 * M), 0, dir, levers).unwrap());
    // the blocks that exist at once count, not every block an epoch makes
    let at_once = Plan { host_block_bytes: Some(60 * M), ..plan(60 * M, 100 * M) };
    assert!(check_storage(&at_once, 0, dir, levers).unwrap());
    let at_once = Plan { host_block_bytes: Some(80 * M), ..plan(60 * M, 100 * M) };
    assert!(!check_storage(&at_once, 30 * M, dir, levers).unwrap());
}
