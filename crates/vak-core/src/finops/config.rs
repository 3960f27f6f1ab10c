//! `[finops]` in config.toml: prices per model, the daily budget and whether task fires stop at it.

use crate::provider::TokenUsage;
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

impl FileFinops {
    /// Refuses what would make the budget meaningless: a limit that is not a
    /// positive number, a price that is negative or not a number, a price
    /// key that is not "provider/model". The message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(max) = self.max_day_usd {
            if !(max.is_finite() && max > 0.0) {
                return Err(format!(
                    "[finops] max_day_usd must be a positive number of US dollars, not {max}"
                ));
            }
        }
        for (key, price) in &self.prices {
            match key.split_once('/') {
                Some((p, m)) if !p.is_empty() && !m.is_empty() => {}
                _ => {
                    return Err(format!(
                    "[finops.prices] {key:?}: a price's key is \"provider/model\", such as \"openai/gpt-4o\""
                ))
                }
            }
            for (field, v) in [
                ("input_per_mtok", price.input_per_mtok),
                ("output_per_mtok", price.output_per_mtok),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!(
                        "[finops.prices.{key:?}] {field} must be zero or more US dollars per million tokens, not {v}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// What `usage` of `provider`/`model` cost; None when that model has no
    /// price (no price, no cost: the digest says which models those were).
    /// Input and output tokens are priced; cache reads and writes, which
    /// some providers report beside them, are not.
    pub(crate) fn cost(&self, provider: &str, model: &str, usage: &TokenUsage) -> Option<f64> {
        let price = self.prices.get(&model_key(provider, model))?;
        Some(
            (usage.input_tokens as f64 * price.input_per_mtok
                + usage.output_tokens as f64 * price.output_per_mtok)
                / 1_000_000.0,
        )
    }
}

/// "provider/model": how prices, the ledger and the digest name a model.
pub(crate) fn model_key(provider: &str, model: &str) -> String {
    format!("{provider}/{model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finops(toml_text: &str) -> FileFinops {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn usage_is_priced_per_million_tokens_and_an_unpriced_model_costs_nothing_known() {
        let f = finops(
            "max_day_usd = 10\n[prices.\"openai/gpt-4o\"]\ninput_per_mtok = 2.5\noutput_per_mtok = 10\n",
        );
        f.validate().unwrap();
        let u = TokenUsage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cache_read_tokens: 7_000_000,
            cache_write_tokens: 0,
        };
        assert_eq!(f.cost("openai", "gpt-4o", &u), Some(2.5 + 5.0));
        assert_eq!(f.cost("openai", "gpt-4o-mini", &u), None, "no price: no cost");
        assert_eq!(
            f.cost("anthropic", "gpt-4o", &u),
            None,
            "the provider is part of the key"
        );
        let small = TokenUsage {
            input_tokens: 3,
            output_tokens: 2,
            ..TokenUsage::default()
        };
        let c = f.cost("openai", "gpt-4o", &small).unwrap();
        assert!((c - 0.0000275).abs() < 1e-12, "{c}");
    }

    #[test]
    fn a_bad_limit_or_price_is_refused_naming_it() {
        let e = finops("max_day_usd = 0\n").validate().unwrap_err();
        assert!(e.contains("max_day_usd"), "{e}");
        let e = finops("[prices.gpt]\ninput_per_mtok = 1\noutput_per_mtok = 1\n")
            .validate()
            .unwrap_err();
        assert!(e.contains("\"gpt\"") && e.contains("provider/model"), "{e}");
        let e = finops("[prices.\"a/b\"]\ninput_per_mtok = -1\noutput_per_mtok = 1\n")
            .validate()
            .unwrap_err();
        assert!(e.contains("input_per_mtok"), "{e}");
        assert!(toml::from_str::<FileFinops>("[prices.\"a/b\"]\ninput_per_mtok = 1\n").is_err());
    }
}
