//! The planner's analytical memory model applied to a headroom run, so its error on headroom's
//! own models can be measured next to the dry run's: the GPT maps onto the planner's GPT-2
//! family, the residual MLP onto its residual-MLP family, and the run's precision, optimizer,
//! checkpoint policy, attention and batch onto a planner `Strategy` on one device whose memory
//! is the run's budget (no CUDA context; the planner's default 10 % fragmentation reserve).
//!
//! Not for: planning headroom's runs (the dry run is exact; see `auto`).

use crate::config::RunConfig;
use crate::trainer::{TrainError, model_spec};
use headroom_memory::ByteSize;
use headroom_nn::models::ModelSpec as NnSpec;
use headroom_nn::models::llama::Family as LlamaFamily;
use headroom_plan::cost::{CostModel, MemoryPrediction, Problem, activation, memory};
use headroom_plan::hardware::{self, HardwareOverrides};
use headroom_plan::model::{Architecture, Family, MlpKind};
use headroom_plan::workload::{BatchSpec, Workload};

/// The planner's description of a headroom model.
pub fn planner_spec(name: &str, spec: &NnSpec) -> Architecture {
    let base = |family, vocab: usize, hidden: usize, layers: usize, inter: usize| {
        Architecture::dense(
            name,
            family,
            vocab as u64,
            hidden as u64,
            layers as u64,
            inter as u64,
        )
    };
    match spec {
        NnSpec::Gpt(c) => Architecture {
            num_heads: c.heads as u64,
            num_kv_heads: c.heads as u64,
            head_dim: (c.width / c.heads) as u64,
            max_learned_positions: Some(c.context as u64),
            tie_word_embeddings: c.tied,
            dropout: c.dropout > 0.0,
            recomputed_mlp_activation: true,
            upcasting_loss: false,
            transformers_modules: false,
            ..base(Family::Gpt2, c.vocab, c.width, c.layers, c.ffn)
        },
        NnSpec::Resmlp(c) => Architecture {
            dropout: c.dropout > 0.0,
            recomputed_mlp_activation: true,
            ..base(Family::ResMlp, c.vocab, c.width, c.depth, c.hidden)
        },
        NnSpec::Llama(c) => Architecture {
            num_heads: c.heads as u64,
            num_kv_heads: c.kv_heads as u64,
            head_dim: c.head_dim() as u64,
            mlp: MlpKind::Gated,
            trained_context: Some(c.context as u64),
            tie_word_embeddings: c.tied,
            dropout: c.dropout > 0.0,
            bias: false,
            recomputed_mlp_activation: true,
            upcasting_loss: false,
            transformers_modules: false,
            ..base(
                match c.family {
                    LlamaFamily::Llama => Family::Llama,
                    LlamaFamily::Mistral => Family::Mistral,
                    LlamaFamily::Qwen2 => Family::Qwen2,
                },
                c.vocab,
                c.width,
                c.layers,
                c.ffn,
            )
        },
    }
}

/// The planner's figures for a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Analytical {
    /// Bytes per category at the predicted peak (whichever phase sets it).
    pub memory: MemoryPrediction,
    /// Activation bytes held at the start of backward (the activations' own peak).
    pub activation_bytes: u64,
}

/// The planner's prediction for `config` on one device of `config.device_memory` bytes.
pub fn analytical_memory(config: &RunConfig) -> Result<Analytical, TrainError> {
    let strategy = config.strategy;
    let nn = model_spec(config)?;
    let spec = planner_spec(&config.model, &nn);
    let seq_len = config.seq_len_of(&nn) as u64;
    let (micro_batch, accumulation) = (strategy.micro_batch, strategy.accumulation);
    let planner = |e: headroom_plan::PlanError| TrainError::Planner(e.to_string());
    let mut hw = hardware::preset("A100-80GB").map_err(planner)?;
    // One node of `data_parallel` devices: the planner's data-parallel group.
    hw.apply(&HardwareOverrides {
        gpu_memory: Some(ByteSize(config.device_memory)),
        cuda_context: Some(ByteSize(0)),
        gpus_per_node: Some(config.data_parallel as u64),
        ..Default::default()
    })
    .map_err(planner)?;
    let workload = Workload::new(
        &spec,
        seq_len,
        BatchSpec::Split {
            micro_batch,
            accumulation,
        },
        Some(micro_batch),
        Some(accumulation),
        config.data_parallel as u64,
    )
    .map_err(planner)?;
    let workload = match &config.lora {
        Some(lora) => workload.with_lora(&spec, lora.clone()).map_err(planner)?,
        None => workload,
    };
    let problem = Problem::new(spec, hw, workload, CostModel::default());
    // The problem's spec: under LoRA it says which projection inputs are kept.
    let activation_bytes = (activation::model_activations(
        &problem.spec,
        seq_len as f64,
        micro_batch as f64,
        strategy.precision.activation_bytes() as f64,
        strategy.attention,
        strategy.checkpoint,
        strategy.loss,
    ) - memory::offloaded_activation_bytes(&problem, &strategy)
        .device_saving)
        .round() as u64;
    Ok(Analytical {
        memory: memory::predict(&problem, &strategy),
        activation_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_nn::models::preset;
    use headroom_plan::model::ParamInventory;

    #[test]
    fn the_planners_inventory_counts_headrooms_parameters_exactly() {
        // Two independent counts: the planner's module-by-module inventory of the mapped spec,
        // and the models' own closed forms (GptConfig/ResMlpConfig::num_params).
        for name in ["gpt-tiny", "gpt-small", "gpt-medium", "resmlp"] {
            let nn = preset(name).unwrap();
            let spec = planner_spec(name, &nn);
            assert_eq!(
                ParamInventory::of(&spec).total(),
                nn.num_params() as u64,
                "{name}"
            );
        }
        // An untied GPT adds its head, C·V.
        let NnSpec::Gpt(mut c) = preset("gpt-tiny").unwrap() else {
            unreachable!()
        };
        c.tied = false;
        let untied = NnSpec::Gpt(c.clone());
        assert_eq!(
            ParamInventory::of(&planner_spec("untied", &untied)).total(),
            untied.num_params() as u64
        );
        assert_eq!(
            untied.num_params(),
            preset("gpt-tiny").unwrap().num_params() + 32 * 256
        );
    }
}
