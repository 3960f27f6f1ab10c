//! What model use costs: prices, the cost ledger, the daily budget and the usage digest.

mod budget;
pub mod config;
pub mod digest;
mod ledger;
mod owner;
#[cfg(test)]
mod tests;

pub use digest::{DayView, DigestView, UsageSum};
pub use owner::Finops;
