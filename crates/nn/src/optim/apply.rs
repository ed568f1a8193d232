//! One update of a flat buffer given its state bytes, wherever they live (the optimizer's
//! device buffers or an offload region): the Adam-family hyperparameters of the step, the state
//! bytes viewed in their format, and the rule's update (SGD, AdamW with f32/bf16/8-bit states,
//! LAMB with or without completed sums).
//!
//! Not for: allocating state (`mod.rs`) or the rules' arithmetic (`sgd`, `adamw`, `adamw8bit`,
//! `lamb`).

use super::{
    AdafactorStep, AdamStep, FlatParams, OptimizerConfig, SgdStep, StateDtype, StateElem,
    TensorShape, TensorSums, UpdateRule, adafactor_update, adamw_update, adamw8bit_update,
    lamb_apply, lamb_sums, lamb_update, sgd_update,
};
use half::bf16;

/// The Adam-family hyperparameters of step `step` (1-based).
fn adam_step(c: &OptimizerConfig, grad_multiplier: f32, lr: f32, step: u64) -> AdamStep {
    AdamStep {
        lr,
        beta1: c.beta1,
        beta2: c.beta2,
        eps: c.eps,
        weight_decay: c.weight_decay,
        step,
        grad_multiplier,
    }
}

/// LAMB's sums of `group`'s tensors from state bytes `state` (m, v).
pub(super) fn sums_of(
    c: &OptimizerConfig,
    step: u64,
    state: &[&[u8]],
    group: &FlatParams<'_>,
    grad_multiplier: f32,
    lr: f32,
) -> Vec<TensorSums> {
    let h = adam_step(c, grad_multiplier, lr, step.max(1));
    let (params, grads, tensors) = (&*group.params, group.grads, group.tensors);
    let (m, v) = (state[0], state[1]);
    match c.state_dtype {
        StateDtype::F32 => lamb_sums::<f32>(params, grads, cast(m), cast(v), tensors, h),
        StateDtype::Bf16 => lamb_sums::<bf16>(params, grads, cast(m), cast(v), tensors, h),
        StateDtype::Int8 => unreachable!("LAMB keeps f32 or bf16 states"),
    }
}

fn cast<S: StateElem>(bytes: &[u8]) -> &[S] {
    bytemuck::cast_slice(bytes)
}

fn cast_mut<S: StateElem>(bytes: &mut [u8]) -> &mut [S] {
    bytemuck::cast_slice_mut(bytes)
}

/// One update of `group` (its tensors `shapes`) at optimizer step `step` with state bytes
/// `state`, wherever they live.
pub(super) fn apply(
    c: &OptimizerConfig,
    (step, shapes): (u64, &[TensorShape]),
    state: &mut [&mut [u8]],
    group: &mut FlatParams<'_>,
    grad_multiplier: f32,
    lr: f32,
    sums: Option<&[TensorSums]>,
) {
    let h = adam_step(c, grad_multiplier, lr, step.max(1));
    if c.kind == UpdateRule::Adafactor {
        let h = AdafactorStep {
            lr,
            weight_decay: c.weight_decay,
            step: step.max(1),
            grad_multiplier,
        };
        let [factored] = state else {
            panic!("Adafactor keeps one state buffer, got {}", state.len());
        };
        adafactor_update(group.params, group.grads, cast_mut(factored), shapes, h);
        return;
    }
    match c.state_dtype {
        StateDtype::F32 => update::<f32>(c, state, group, h, sums),
        StateDtype::Bf16 => update::<bf16>(c, state, group, h, sums),
        StateDtype::Int8 => {
            let [mq, vq, ma, va] = state else {
                panic!("8-bit AdamW keeps four state buffers, got {}", state.len());
            };
            adamw8bit_update(
                group.params,
                group.grads,
                (mq, vq),
                (bytemuck::cast_slice_mut(ma), bytemuck::cast_slice_mut(va)),
                h,
            );
        }
    }
}

fn update<S: StateElem>(
    c: &OptimizerConfig,
    state: &mut [&mut [u8]],
    group: &mut FlatParams<'_>,
    adam: AdamStep,
    sums: Option<&[TensorSums]>,
) {
    let (lr, step, grad_multiplier) = (adam.lr, adam.step, adam.grad_multiplier);
    match c.kind {
        UpdateRule::Sgd => {
            let h = SgdStep {
                lr,
                momentum: c.momentum,
                weight_decay: c.weight_decay,
                nesterov: c.nesterov,
                first_step: step == 1,
                grad_multiplier,
            };
            let buf = state.first_mut().map(|b| cast_mut::<S>(b));
            sgd_update(group.params, group.grads, buf, h);
        }
        UpdateRule::Adafactor => unreachable!("Adafactor is applied above"),
        UpdateRule::AdamW | UpdateRule::Lamb => {
            let (m, v) = state.split_at_mut(1);
            let (m, v) = (cast_mut::<S>(m[0]), cast_mut::<S>(v[0]));
            let (params, grads, tensors) = (&mut *group.params, group.grads, group.tensors);
            match (c.kind, sums) {
                (UpdateRule::AdamW, _) => adamw_update(params, grads, m, v, adam),
                (_, Some(sums)) => lamb_apply(params, grads, m, v, tensors, sums, adam),
                (_, None) => lamb_update(params, grads, m, v, tensors, adam),
            }
        }
    }
}
