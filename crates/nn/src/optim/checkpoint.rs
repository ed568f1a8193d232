//! Saving and restoring the optimizer's state for checkpoints: every state buffer by name
//! (`group0.exp_avg`, …) with its bytes and element type, from the device or the host pages.
//!
//! Not for: the layout of the state (see `Optimizer::state_layout` in the parent `optim`).

use super::{Optimizer, StateBuffer, StateElement};

impl Optimizer {
    /// State buffers by name (`group0.exp_avg`, …) with their bytes and element type, for
    /// checkpoints.
    pub fn state_bytes(&self) -> Vec<(String, &[u8], StateElement)> {
        if self.config.paged {
            return self.paged_state_bytes();
        }
        self.state
            .iter()
            .enumerate()
            .flat_map(|(i, bufs)| {
                let len = bufs.first().map_or(0, |b| {
                    b.len_bytes() as usize / self.config.state_dtype.size_bytes() as usize
                });
                bufs.iter()
                    .zip(self.state_layout(i, len))
                    .map(move |(b, part)| {
                        (
                            format!("group{i}.{}", part.name),
                            b.as_bytes().unwrap_or(&[]),
                            part.element,
                        )
                    })
            })
            .collect()
    }

    /// Paged states by name, from their host copies.
    fn paged_state_bytes(&self) -> Vec<(String, &[u8], StateElement)> {
        (0..self.state.len())
            .flat_map(|i| {
                let pages = self.host.get(i);
                let len = pages.first().map_or(0, |p| {
                    p.len() / self.config.state_dtype.size_bytes() as usize
                });
                pages
                    .iter()
                    .zip(self.state_layout(i, len))
                    .map(move |(p, part)| (format!("group{i}.{}", part.name), &p[..], part.element))
            })
            .collect()
    }

    /// Restores state saved by [`Optimizer::state_bytes`]; `lens[i]` is buffer i's parameter count.
    pub fn load_state(
        &mut self,
        step: u64,
        lens: &[usize],
        saved: &dyn Fn(&str, &StateBuffer) -> Option<Vec<u8>>,
    ) -> Result<(), String> {
        for (i, &len) in lens.iter().enumerate() {
            let layout = self.state_layout(i, len);
            if self.config.paged {
                while self.state.len() <= i {
                    self.state.push(Vec::new());
                }
                for (page, part) in self.host.get_mut(i, &layout).iter_mut().zip(&layout) {
                    let key = format!("group{i}.{}", part.name);
                    let bytes = saved(&key, part)
                        .ok_or_else(|| format!("optimizer state {key} is missing"))?;
                    if bytes.len() != page.len() {
                        return Err(format!(
                            "optimizer state {key} has {} bytes, expected {}",
                            bytes.len(),
                            page.len()
                        ));
                    }
                    page.copy_from_slice(&bytes);
                }
                continue;
            }
            self.ensure_state(i, len).map_err(|e| e.to_string())?;
            for (buffer, part) in self.state[i].iter_mut().zip(&layout) {
                let key = format!("group{i}.{}", part.name);
                let bytes =
                    saved(&key, part).ok_or_else(|| format!("optimizer state {key} is missing"))?;
                let dst = buffer
                    .as_bytes_mut()
                    .ok_or("optimizer state on a shape-only device")?;
                if bytes.len() != dst.len() {
                    return Err(format!(
                        "optimizer state {key} has {} bytes, expected {}",
                        bytes.len(),
                        dst.len()
                    ));
                }
                dst.copy_from_slice(&bytes);
            }
        }
        self.step = step;
        Ok(())
    }
}
