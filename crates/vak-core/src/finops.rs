//! What model use costs: prices, the cost ledger, the daily budget and the usage digest.

pub mod config;
