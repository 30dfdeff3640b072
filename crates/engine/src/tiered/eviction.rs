//! Which blocks the host cache evicts next, by cache mode: shared by the store and the cost
//! model's ledger, which must choose alike for the predicted storage traffic to be the
//! measured one.

use std::collections::HashMap;

use super::block::{BlockId, BlockKind, CacheMode};

/// The blocks `mode` evicts next among `evictable` (each with its last use): a partition's
/// least recently used block, or every block of the (kind, layer) whose most recent use is
/// oldest. The store and the cost model's ledger choose alike.
pub(super) fn victims_of(mode: CacheMode, evictable: &[(BlockId, u64)]) -> Vec<BlockId> {
    match mode {
        CacheMode::PartitionLru => {
            evictable.iter().min_by_key(|(id, used)| (*used, *id)).map(|(id, _)| *id).into_iter().collect()
        }
        CacheMode::LruLayer | CacheMode::Auto => {
            let mut recency: HashMap<(BlockKind, usize), u64> = HashMap::new();
            for (id, used) in evictable {
                let r = recency.entry((id.kind, id.layer)).or_insert(0);
                *r = (*r).max(*used);
            }
            let Some((&group, _)) = recency.iter().min_by_key(|(k, r)| (**r, **k)) else {
                return Vec::new();
            };
            let mut ids: Vec<BlockId> =
                evictable.iter().map(|(id, _)| *id).filter(|id| (id.kind, id.layer) == group).collect();
            ids.sort();
            ids
        }
    }
}
