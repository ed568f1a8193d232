//! headroom's tensor engine: tensors whose every byte comes from the device allocator, tagged
//! with its `Category`; CPU kernels behind a backend trait; reverse-mode autodiff on a tape that
//! owns the saved activations; checkpoint scopes; flat parameter blocks.
//!
//! ```
//! use headroom_memory::{AllocatorConfig, Category, Device};
//! use headroom_tensor::{DType, Gradients, Tape, Tensor};
//!
//! let device = Device::cpu(64 << 20, AllocatorConfig::default());
//! let x = Tensor::from_f32(&device, &[3], &[1.0, 2.0, 3.0], DType::F32, Category::Input, Some("x"))?.track();
//! let tape = Tape::new();
//! // y = Σ x², so dy/dx = 2x.
//! let y = tape.record(|| x.mul(&x)?.sum_all())?;
//! let mut grads = Gradients::new();
//! tape.backward(&y, &mut grads)?;
//! assert_eq!(grads.get(&x).unwrap().to_vec_f32()?, vec![2.0, 4.0, 6.0]);
//! # Ok::<(), headroom_tensor::TensorError>(())
//! ```
//!
//! Not for: modules, optimizers or training loops (the nn and train crates).

mod adjoint;
pub mod autocast;
pub mod backend;
mod backprop;
pub mod checkpoint;
mod context;
pub mod dtype;
pub mod error;
mod grads;
pub mod nf4;
pub mod ops;
pub mod params;
pub mod rng;
pub mod scope;
pub mod shape;
pub mod shard;
pub mod stash;
pub mod storage;
pub mod tape;
pub mod tensor;
pub mod threads;

pub use autocast::{autocast, autocast_dtype};
pub use checkpoint::{checkpoint, checkpoint_block};
pub use context::{enable_grad, is_grad_enabled, no_grad};
pub use dtype::DType;
pub use error::{Result, TensorError};
pub use grads::Gradients;
pub use nf4::Nf4Weight;
pub use ops::tensor_parallel::{ChunkColumns, ShardGroup, TensorParallel, tree_sum};
pub use params::{BlockShard, ParamBlock, ParamSpec};
pub use scope::{BlockHooks, param_scope, with_block_hooks};
pub use shard::{ShardLayout, shard_range, with_sharding};
pub use stash::with_activation_offload;
pub use tape::{Tape, VarId};
pub use tensor::Tensor;
pub use threads::{on_kernel_threads, on_own_kernel_threads, threads_per_rank};
