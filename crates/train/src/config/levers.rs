//! The strategy levers' flags as a group of their own (`Levers`), for a command that pins levers
//! without training (`headroom plan`): the flags, help texts and value parsers are
//! `TrainConfig`'s own, taken from its clap definitions, so each lever's flag is written once
//! and both commands spell it the same way.
//!
//! Not for: what a lever means (the vocabulary) or the other keys of a run (`TrainConfig`).

use super::TrainConfig;
use clap::{ArgMatches, Command};
use headroom_strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Pins, Precision, ZeroStage,
};

/// Declares the lever keys once: their clap ids and how a group's matches set them.
macro_rules! levers {
    ($($field:ident: $t:ty),+ $(,)?) => {
        /// The clap ids (the `TrainConfig` field names) of the strategy levers.
        const LEVERS: &[&str] = &[$(stringify!($field)),+];

        /// The lever keys `matches` sets, every other key unset.
        fn keys_of(matches: &ArgMatches) -> TrainConfig {
            TrainConfig {
                $($field: matches.get_one::<$t>(stringify!($field)).cloned(),)+
                ..TrainConfig::default()
            }
        }
    };
}

levers!(
    precision: Precision,
    micro_batch: usize,
    accumulation: usize,
    optimizer: Optimizer,
    checkpoint: Checkpoint,
    attention: Attention,
    loss: Loss,
    optimizer_in_backward: bool,
    zero_stage: ZeroStage,
    offload_optimizer: Offload,
    offload_params: Offload,
    offload_activations: Offload,
);

/// The strategy levers a command's flags pinned, as the `TrainConfig` keys they set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Levers {
    /// The lever keys given; no other key is set.
    pub keys: TrainConfig,
}

impl Levers {
    /// The levers pinned (the one place pins are read from keys: `TrainConfig::pins`).
    pub fn pins(&self) -> Pins {
        self.keys.pins()
    }
}

impl clap::Args for Levers {
    fn augment_args(cmd: Command) -> Command {
        let train = <TrainConfig as clap::Args>::augment_args(Command::new("train"));
        train
            .get_arguments()
            .filter(|a| LEVERS.contains(&a.get_id().as_str()))
            // Listed in the order of the command they join.
            .fold(cmd, |cmd, a| cmd.arg(a.clone().display_order(None)))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for Levers {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Levers {
            keys: keys_of(matches),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.keys = std::mem::take(&mut self.keys).overridden_by(keys_of(matches));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Plan {
        #[command(flatten)]
        levers: Levers,
    }

    #[derive(Debug, Parser)]
    struct Train {
        #[command(flatten)]
        keys: TrainConfig,
    }

    /// The flags of a lever read the same into the group as into the run's keys.
    #[test]
    fn the_group_parses_what_train_parses() {
        let argv = [
            "x",
            "--precision",
            "bf16-mixed",
            "--micro-batch",
            "4",
            "--accumulation",
            "2",
            "--optimizer",
            "lamb",
            "--checkpoint",
            "every:2",
            "--attention",
            "memory-efficient",
            "--loss",
            "chunked:8",
            "--optimizer-in-backward",
            "false",
            "--zero",
            "1",
            "--offload-optimizer",
            "cpu",
            "--offload-params",
            "none",
            "--offload-activations",
            "cpu",
        ];
        let plan = Plan::try_parse_from(argv).unwrap();
        let train = Train::try_parse_from(argv).unwrap();
        assert_eq!(plan.levers.keys, train.keys);
        let pins = plan.levers.pins();
        assert_eq!(pins.precision, Some(Precision::Bf16Mixed));
        assert_eq!(pins.zero_stage, Some(ZeroStage::new(1).unwrap()));
        assert_eq!(pins.loss, Some(Loss::Chunked(8)));
        assert_eq!(pins.optimizer_in_backward, Some(false));
        assert_eq!((pins.micro_batch, pins.accumulation), (Some(4), Some(2)));
    }

    /// Every lever of `TrainConfig` is in the group, and nothing else: a run's other keys are
    /// refused.
    #[test]
    fn the_group_holds_the_levers_and_nothing_else() {
        let plan = <Plan as clap::CommandFactory>::command();
        let ids: Vec<&str> = plan
            .get_arguments()
            .map(|a| a.get_id().as_str())
            .filter(|id| *id != "help")
            .collect();
        assert_eq!(ids, LEVERS);
        // The keys a strategy is written as are exactly the group's.
        let written: toml::Table = toml::from_str(&headroom_plan::export::headroom::strategy_toml(
            &headroom_strategy::Strategy::default(),
        ))
        .unwrap();
        let mut written: Vec<&str> = written.keys().map(String::as_str).collect();
        let mut levers = LEVERS.to_vec();
        written.sort_unstable();
        levers.sort_unstable();
        assert_eq!(written, levers);
        assert!(Plan::try_parse_from(["x", "--steps", "3"]).is_err());
        let pins = Plan::try_parse_from(["x"]).unwrap().levers.pins();
        assert!(!pins.any());
    }
}
