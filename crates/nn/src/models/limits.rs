//! The largest shapes headroom's own models accept, checked before anything is allocated, so a
//! hostile size (`--layers 1000000000`) is an error naming the field instead of an exhausted
//! host: at most 10,000 blocks and 1,048,576 along any other dimension.
//!
//! Not for: what fits a device budget (the dry run decides that).

use headroom_tensor::{Result, TensorError};

/// Most blocks a model may have.
pub const MAX_BLOCKS: usize = 10_000;
/// Most elements along any other dimension (width, heads, FFN, vocabulary, context).
pub const MAX_DIM: usize = 1 << 20;

/// Checks each `(field, value, limit)`.
pub fn check_sizes(what: &'static str, sizes: &[(&str, usize, usize)]) -> Result<()> {
    for &(field, value, limit) in sizes {
        if value > limit {
            return Err(TensorError::invalid(
                what,
                format!("{field} {value} is above the limit of {limit}"),
            ));
        }
    }
    Ok(())
}
