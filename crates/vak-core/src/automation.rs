//! Work that runs without a person watching: scheduled tasks, their cron schedules and the scheduler that fires them.

mod clock;
pub mod config;
pub mod cron;
mod handle;
pub mod scheduler;
pub mod store;
pub mod task;
