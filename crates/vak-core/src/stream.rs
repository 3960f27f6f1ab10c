//! How events reach readers: the per-session bus with its lossless queues, the multiplexer behind `/stream`, and its cursor vector.

pub(crate) mod bus;
pub mod bus_config;
pub mod cursor;
pub mod delivery;
pub mod mux;
mod ring;
mod sub_queue;
pub mod subscription;
