//! The planned arena (`--allocator planned`): windows of requests recorded once with their
//! lifetimes (`plan`), packed into one arena by offset (`packing`), and served from it by the
//! caching allocator while a window repeats (`allocator::planned`).
//!
//! Not for: the caching allocator's own pools (see `allocator`).

pub mod packing;
pub mod plan;

pub use packing::{Interval, pack, peak_live};
pub use plan::{ArenaPlan, PlannedRequest, Recorded, Recorder, WindowPlan};
