//! Which repeated blocks run inside checkpoint scopes, from the checkpoint policy:
//! `none` keeps every activation, `all` checkpoints every block, `every:K` checkpoints blocks
//! 0, K, 2K, … (one block in every K, as the planner counts it).
//!
//! Not for: the recomputation mechanism (the tensor crate's checkpoint scopes).

use headroom_plan::strategy::Checkpoint;

/// `checkpointed[i]` for each of `depth` blocks.
pub fn checkpointed_blocks(policy: Checkpoint, depth: usize) -> Vec<bool> {
    match policy {
        Checkpoint::None | Checkpoint::Selective => vec![false; depth],
        Checkpoint::EveryNth(k) => (0..depth)
            .map(|i| (i as u64).is_multiple_of(k.max(1)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_k_checkpoints_one_block_in_k() {
        assert_eq!(checkpointed_blocks(Checkpoint::None, 3), vec![false; 3]);
        assert_eq!(
            checkpointed_blocks(Checkpoint::EveryNth(1), 3),
            vec![true; 3]
        );
        assert_eq!(
            checkpointed_blocks(Checkpoint::EveryNth(2), 5),
            vec![true, false, true, false, true]
        );
    }
}
