//! headroom's neural-network room: optimizers over flat parameter buffers, gradient clipping
//! and overflow checks, (on the tensor engine) modules and models, and pretrained checkpoints
//! in formats other than Hugging Face's (GGUF).

pub mod checkpoint;
pub mod grad;
pub mod init;
pub mod model;
pub mod models;
pub mod modules;
pub mod optim;

pub use model::{HuggingFace, Model, Recompute};
