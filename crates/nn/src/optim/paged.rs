//! Paged optimizer state (bitsandbytes' paged optimizers, Dettmers et al. 2023 §3 "Paged
//! Optimizers"): the state of each flat buffer lives in host memory between its updates and is
//! paged onto the device for its own update only, so the device holds one block's state at a
//! time instead of the model's. bitsandbytes pages through CUDA unified memory, evicting only
//! under memory pressure; headroom pages every block every step, the behaviour under the most
//! pressure, so the device's `optimizer_state` is always one block's.
//!
//! Not for: the update arithmetic (unchanged: a paged run's weights are bitwise the unpaged
//! run's) or offload of master weights with the states (see the offload crate).

use super::StateBuffer;
use headroom_memory::{Category, Device, DeviceBuffer, OutOfMemory};

/// The host copies of every flat buffer's state, in the optimizer's layout order.
#[derive(Debug, Default)]
pub(super) struct HostPages {
    /// Per flat buffer, each state buffer's bytes (empty vectors on a shape-only device, where
    /// there are no values to keep).
    pages: Vec<Vec<Vec<u8>>>,
}

impl HostPages {
    /// Whether buffer `index` has been paged out at least once.
    pub(super) fn has(&self, index: usize) -> bool {
        self.pages.get(index).is_some_and(|p| !p.is_empty())
    }

    /// The host bytes of buffer `index`.
    pub(super) fn get(&self, index: usize) -> &[Vec<u8>] {
        self.pages.get(index).map_or(&[], |p| p.as_slice())
    }

    /// Mutable host bytes of buffer `index`, created zeroed in `layout`'s sizes if absent.
    pub(super) fn get_mut(&mut self, index: usize, layout: &[StateBuffer]) -> &mut Vec<Vec<u8>> {
        while self.pages.len() <= index {
            self.pages.push(Vec::new());
        }
        if self.pages[index].is_empty() {
            self.pages[index] = layout.iter().map(|p| vec![0u8; p.bytes]).collect();
        }
        &mut self.pages[index]
    }

    /// Device buffers for buffer `index`, tagged `optimizer_state`, holding its host bytes.
    pub(super) fn page_in(
        &self,
        device: &Device,
        index: usize,
        layout: &[StateBuffer],
    ) -> Result<Vec<DeviceBuffer>, OutOfMemory> {
        let host = self.get(index);
        if self.has(index) {
            let bytes = layout.iter().map(|p| p.bytes as u64).sum();
            headroom_tensor::backend::work::host_transfer(bytes);
        }
        layout
            .iter()
            .enumerate()
            .map(|(k, part)| {
                let label = format!("group{index}.{}", part.name);
                let mut buffer =
                    device.alloc(part.bytes as u64, Category::OptimizerState, Some(&label))?;
                if let Some(b) = buffer.as_bytes_mut() {
                    match host.get(k) {
                        Some(bytes) if bytes.len() == b.len() => b.copy_from_slice(bytes),
                        _ => b.fill(0),
                    }
                }
                Ok(buffer)
            })
            .collect()
    }

    /// Copies `buffers` (buffer `index`'s state) to the host; dropping them gives the device
    /// bytes back.
    pub(super) fn page_out(&mut self, index: usize, buffers: &[DeviceBuffer]) {
        while self.pages.len() <= index {
            self.pages.push(Vec::new());
        }
        headroom_tensor::backend::work::host_transfer(
            buffers.iter().map(DeviceBuffer::len_bytes).sum(),
        );
        self.pages[index] = buffers
            .iter()
            // A shape-only device's buffers have no bytes: empty pages of the right count.
            .map(|b| b.as_bytes().map(<[u8]>::to_vec).unwrap_or_default())
            .collect();
    }
}
