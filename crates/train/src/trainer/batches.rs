//! The batches a step feeds the model: token tensors uploaded from the loader's staging buffers
//! (the copy into device memory is tagged `input`), allocated shape-only on a dry run, and the
//! tape-free validation pass that consumes them.

use super::{TrainError, TrainEvent, Trainer};
use crate::data::TokenBatch;
use crate::report::ValLoss;
use headroom_memory::Category;
use headroom_nn::Recompute;
use headroom_tensor::{DType, Tensor, no_grad};

impl Trainer {
    /// Mean loss over the validation batches, computed without a tape.
    pub fn validate(&mut self) -> Result<f64, TrainError> {
        {
            let mut a = self.device.lock();
            a.trace_mut().set_phase("validation");
            a.begin_window(super::step::EVALUATION_WINDOW);
        }
        let batches = self
            .sampler
            .sampler()
            .try_validation_batches(self.config.micro_batch(), self.config.eval_batches)
            .map_err(crate::data::DataError::from)?;
        let mut sum = 0.0;
        // Nothing is kept for backward, but a chunked loss still holds one chunk's logits.
        let plan = Recompute {
            loss_chunks: self.recompute.loss_chunks,
            ..Recompute::none()
        };
        for batch in &batches {
            let (x, y) = self.batch_tensors(batch)?;
            // Under ZeRO-3 the blocks are gathered for the forward.
            let loss = self.with_zero(None, |t| Ok(no_grad(|| t.model.loss(&x, &y, &plan))?))?;
            if !self.dry {
                sum += loss.to_scalar_f32()? as f64;
            }
        }
        self.device.lock().end_window();
        let mean = sum / batches.len().max(1) as f64;
        self.report.val_losses.push(ValLoss {
            step: self.step,
            loss: mean,
        });
        Ok(mean)
    }

    /// The input and target tensors of a micro-batch on a shape-only device: allocated like
    /// [`Self::batch_tensors`]'s, with nothing to upload.
    pub(super) fn dry_batch_tensors(
        &self,
        micro_batch: usize,
    ) -> Result<(Tensor, Tensor), TrainError> {
        let shape = [micro_batch, self.seq_len];
        let x = Tensor::zeros(
            &self.device,
            &shape,
            DType::I64,
            Category::Input,
            Some("tokens"),
        )?;
        let y = Tensor::zeros(
            &self.device,
            &shape,
            DType::I64,
            Category::Input,
            Some("targets"),
        )?;
        Ok((x, y))
    }

    /// The next training micro-batch from the loader, uploaded; the loader's warnings (a
    /// shortened queue, a host running out of memory) are passed on.
    pub(super) fn next_batch_tensors(
        &mut self,
        micro_batch: usize,
        on_event: &mut dyn FnMut(TrainEvent),
    ) -> Result<(Tensor, Tensor), TrainError> {
        let batch = self.sampler.next_batch(micro_batch)?;
        for warning in self.sampler.take_warnings() {
            self.report.warnings.push(warning.clone());
            on_event(TrainEvent::Warning(warning));
        }
        let shape = [batch.batch, batch.seq_len];
        let upload = |ids: &[i64], name| {
            Tensor::from_i64(
                &self.device,
                &shape,
                ids,
                DType::I64,
                Category::Input,
                Some(name),
            )
        };
        Ok((
            upload(batch.inputs(), "tokens")?,
            upload(batch.targets(), "targets")?,
        ))
    }

    pub(super) fn batch_tensors(&self, batch: &TokenBatch) -> Result<(Tensor, Tensor), TrainError> {
        let shape = [batch.batch, batch.seq_len];
        let ids: Vec<i64> = batch.inputs.iter().map(|&t| t as i64).collect();
        let targets: Vec<i64> = batch.targets.iter().map(|&t| t as i64).collect();
        let x = Tensor::from_i64(
            &self.device,
            &shape,
            &ids,
            DType::I64,
            Category::Input,
            Some("tokens"),
        )?;
        let y = Tensor::from_i64(
            &self.device,
            &shape,
            &targets,
            DType::I64,
            Category::Input,
            Some("targets"),
        )?;
        Ok((x, y))
    }
}
