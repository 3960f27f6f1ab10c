//! The integration tests, one binary: each module is what used to be its own
//! `tests/<name>.rs` binary. One binary links the crate once (38 binaries of ~87 MB
//! each once filled a CI disk); `cargo test --test it <module>::` runs one module.
//! The tests share one process and its test threads: a test that changes
//! process-wide state (an rlimit, the environment) re-runs itself alone
//! (`support::own_process`), and heavy tests whose deadlines assume a quiet
//! machine run one at a time (`support::heavy`).

mod support;

mod app;
mod architecture;
mod attachments;
mod backup;
mod big_records;
mod cluster;
mod commitments;
mod config;
mod connect;
mod connect_stream;
mod connections;
mod docs;
mod doctor;
mod durability;
mod eventsource_client;
mod file_tools;
mod finops;
mod goal;
mod grpc;
mod grpc_web;
mod hooks;
mod host;
mod intent;
mod jetstream;
mod launch;
mod leases;
mod lifecycle;
mod login_link;
mod mcp;
mod memory;
mod memory_search;
mod metrics;
mod modes;
mod mux;
mod nats_auth;
mod openapi;
mod otlp;
mod pr;
mod presentation;
mod process;
mod providers;
mod real_model;
mod receipts;
mod rest;
mod resync;
mod route_feedback;
mod rules;
mod sandbox;
mod security;
mod serve_cluster;
mod settings;
mod side;
mod skills;
mod stop_reason;
mod storage;
mod stream;
mod tasks;
mod term;
mod term_background;
mod term_skills;
mod term_stop;
mod term_workers;
mod tools;
mod worker_tool;
mod workers;
mod workspace_api;
