//! How events reach readers: the per-session bus with its lossless queues, the multiplexer behind `/stream`, and its cursor vector.

pub mod bus;
pub mod cursor;
pub mod mux;
