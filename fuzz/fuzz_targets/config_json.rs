//! Hugging Face config.json texts: parsed, counted and planned, or refused.
#![no_main]

use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::hardware;
use headroom_plan::model::ParamInventory;
use headroom_plan::model::config_json::parse_config;
use headroom_plan::search::search;
use headroom_plan::strategy::Pins;
use headroom_plan::workload::{BatchSpec, Workload};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(spec) = parse_config("fuzz", text) else {
        return;
    };
    let _ = ParamInventory::of(&spec).total();
    let hw = hardware::preset("A100-80GB").expect("a preset");
    if let Ok(w) = Workload::new(&spec, 512, BatchSpec::Samples(8), None, None, 1) {
        let problem = Problem::new(spec, hw, w, CostModel::default());
        let _ = search(&problem, &Pins::default(), None);
    }
});
