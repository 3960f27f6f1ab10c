//! `[finops]` in config.toml: prices per model, the daily budget and whether task fires stop at it.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFinops {
    /// US dollars a server-local day may spend; absent: no budget.
    #[serde(default)]
    pub max_day_usd: Option<f64>,
    /// Past 100% of max_day_usd, refuse new task fires (interactive runs go on).
    #[serde(default)]
    pub stop_at_limit: bool,
    /// By "provider/model": `[finops.prices."openai/gpt-4o"]`.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
}

/// US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}
