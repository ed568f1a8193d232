//! The planned arena (`--allocator planned`): windows of requests recorded once with their
//! lifetimes into an arena layout (`layout`), packed by offset (`packing`), and served from it
//! by the caching allocator while a window repeats (`allocator::planned`).
//!
//! Not for: the caching allocator's own pools (see `allocator`).

pub mod layout;
pub mod packing;

pub use layout::{ArenaLayout, PlannedRequest, Recorded, Recorder, WindowLayout};
pub use packing::{Interval, pack, peak_live};
