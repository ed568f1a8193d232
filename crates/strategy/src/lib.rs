//! The strategy vocabulary of headroom, defined once and used by the planner, the engine and the
//! CLI alike: `Precision` (with its bytes per category), `Optimizer` (every optimizer either side
//! knows, each saying whether the engine runs it), `Checkpoint` (every activation-checkpointing
//! policy), `Attention`, `Loss` (plain or chunked cross-entropy), `Lora` (low-rank adapters on a frozen base), `Placement` (ZeRO stage and the offload tier of each model state), the `Mesh` (tp, pp, cp, ep beside dp), the
//! `Strategy` that combines them, the `Pins` a user fixes, and the `MemoryBreakdown` every
//! prediction and every report is expressed in.
//!
//! Values are typed from the parser inward: each type parses its CLI/TOML name (`FromStr`,
//! serde), and a bad value gets one message naming the flag and the accepted values.
//!
//! Not for: what a strategy costs (the planner's cost model, the engine's dry run) or how it is
//! run (the engine).

mod attention;
mod checkpoint;
mod error;
mod framework;
mod lora;
mod loss;
mod mesh;
mod named;
mod optimizer;
mod pins;
mod placement;
mod precision;
mod split;
mod strategy;

pub use attention::Attention;
pub use checkpoint::Checkpoint;
pub use error::{StrategyError, parse_flag};
pub use framework::Framework;
pub use lora::{BaseDtype, BaseWeights, Lora, LoraTarget, LoraTargets};
pub use loss::Loss;
pub use mesh::{Mesh, MeshShape, PipelineSchedule};
pub use optimizer::{LossImpl, Optimizer, OptimizerImpl, ZeroGrad};
pub use pins::{Pins, changed_levers};
pub use placement::{Offload, Placement, ZeroStage};
pub use precision::{NumberFormat, Precision};
pub use split::{batch_splits, largest_fitting};
pub use strategy::Strategy;

pub use headroom_memory::{Category, CategoryBytes, MemoryBreakdown};
