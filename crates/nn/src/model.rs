//! What the trainer needs of a model: its parameter blocks (flat buffers, in a fixed order),
//! the loss of a micro-batch, and which blocks run inside checkpoint scopes.
//!
//! Not for: training (see the train crate).

use headroom_tensor::{ParamBlock, Result, Tensor};

/// A trainable model on the tensor engine.
pub trait Model {
    /// Preset or configuration name.
    fn name(&self) -> &str;
    /// Parameter blocks in a fixed order (the order of checkpoints and optimizer state).
    fn blocks(&self) -> &[ParamBlock];
    /// Number of repeated blocks (transformer blocks, residual MLP blocks) a checkpoint policy
    /// chooses among.
    fn depth(&self) -> usize;
    /// Mean cross-entropy of a micro-batch: `inputs` and `targets` are `(B, T)` integer tensors.
    /// `checkpointed[i]` runs repeated block `i` inside a checkpoint scope.
    fn loss(&self, inputs: &Tensor, targets: &Tensor, checkpointed: &[bool]) -> Result<Tensor>;

    /// Total parameter count.
    fn num_params(&self) -> usize {
        self.blocks().iter().map(|b| b.numel()).sum()
    }
}
