//! Caps on open streams, per client address and in total, so that hostile or broken clients cannot pile up subscriptions.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tonic::Status;

pub struct StreamLimits {
    per_client: usize,
    total: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// One open stream; dropping it frees the slot.
pub struct StreamPermit {
    limits: Arc<StreamLimits>,
    client: Option<IpAddr>,
}

impl StreamLimits {
    pub fn new(total: usize, per_client: usize) -> Arc<StreamLimits> {
        Arc::new(StreamLimits {
            per_client,
            total,
            open: Mutex::new(Open::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for one more stream from `client`, or RESOURCE_EXHAUSTED (HTTP 429).
    pub fn acquire(self: &Arc<Self>, client: Option<IpAddr>) -> Result<StreamPermit, Status> {
        let mut open = self.lock();
        if open.total >= self.total {
            return Err(Status::resource_exhausted(format!(
                "the server has {} open, its limit; try again later",
                streams(self.total)
            )));
        }
        if let Some(ip) = client {
            let n = open.by_client.entry(ip).or_default();
            if *n >= self.per_client {
                return Err(Status::resource_exhausted(format!(
                    "{ip} already has {} open, the per-client limit; close one first",
                    streams(self.per_client)
                )));
            }
            *n += 1;
        }
        open.total += 1;
        Ok(StreamPermit {
            limits: self.clone(),
            client,
        })
    }

    pub fn open_streams(&self) -> usize {
        self.lock().total
    }
}

/// `1 stream`, `2 streams`.
fn streams(n: usize) -> String {
    if n == 1 {
        "1 stream".to_string()
    } else {
        format!("{n} streams")
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.limits.lock();
        open.total -= 1;
        if let Some(ip) = self.client {
            if let Some(n) = open.by_client.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.by_client.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_of_one_says_1_stream() {
        let l = StreamLimits::new(1, 1);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let _p = l.acquire(Some(a)).unwrap();
        let e = l.acquire(Some(a)).err().unwrap();
        assert!(e.message().contains("has 1 stream open"), "{}", e.message());
        assert!(!e.message().contains("1 streams"), "{}", e.message());
    }

    #[test]
    fn caps_per_client_and_in_total_and_frees_on_drop() {
        let l = StreamLimits::new(3, 2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let p1 = l.acquire(Some(a)).unwrap();
        let _p2 = l.acquire(Some(a)).unwrap();
        let e = l.acquire(Some(a)).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        let _p3 = l.acquire(Some(b)).unwrap();
        assert_eq!(
            l.acquire(Some(b)).err().unwrap().code(),
            tonic::Code::ResourceExhausted,
            "total cap"
        );
        drop(p1);
        assert_eq!(l.open_streams(), 2);
        let _p4 = l.acquire(Some(a)).unwrap();
    }
}
