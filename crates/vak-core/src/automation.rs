//! Work that runs without a person watching: scheduled tasks, their cron schedules and the scheduler that fires them.

pub mod config;
pub mod cron;
pub mod store;
pub mod task;
