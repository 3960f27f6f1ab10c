//! Work that runs without a person watching: scheduled tasks, their cron schedules and the scheduler that fires them.

pub mod config;
