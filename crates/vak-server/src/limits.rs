//! Caps on open streams, per client address and in total, so that hostile or broken clients cannot pile up subscriptions. Every loopback address counts as one client (this machine): 127.0.0.2 is no fresh quota.

use crate::metrics::{reject, OpenStream, Rejection, StreamSurface, Transport};
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
    by_client: HashMap<Client, usize>,
}

/// Whom a stream counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    /// Every loopback address (127.0.0.0/8, ::1, their IPv4-mapped forms):
    /// any local process can pick any of them as its source.
    Loopback,
    Remote(IpAddr),
}

impl Client {
    fn of(ip: IpAddr) -> Client {
        let ip = ip.to_canonical();
        if ip.is_loopback() {
            Client::Loopback
        } else {
            Client::Remote(ip)
        }
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Loopback => f.write_str("loopback"),
            Client::Remote(ip) => ip.fmt(f),
        }
    }
}

/// One open stream; dropping it frees the slot.
pub struct StreamPermit {
    limits: Arc<StreamLimits>,
    client: Option<Client>,
    /// Its count in `vak_streams_open`, once its transport and surface are known.
    open: Option<OpenStream>,
}

impl StreamPermit {
    /// Counts this stream in `vak_streams_open` by transport and surface.
    pub(crate) fn counted(mut self, transport: Transport, surface: StreamSurface) -> StreamPermit {
        self.open = Some(OpenStream::new(transport, surface));
        self
    }
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
            drop(open);
            reject(Rejection::StreamCap);
            return Err(Status::resource_exhausted(format!(
                "the server has {} open, its limit; try again later",
                streams(self.total)
            )));
        }
        let client = client.map(Client::of);
        if let Some(c) = client {
            let n = open.by_client.entry(c).or_default();
            if *n >= self.per_client {
                drop(open);
                reject(Rejection::StreamCap);
                return Err(Status::resource_exhausted(format!(
                    "{c} already has {} open, the per-client limit; close one first",
                    streams(self.per_client)
                )));
            }
            *n += 1;
        }
        open.total += 1;
        Ok(StreamPermit {
            limits: self.clone(),
            client,
            open: None,
        })
    }

    pub fn open_streams(&self) -> usize {
        self.lock().total
    }

    /// The caps: (in total, per client).
    pub fn caps(&self) -> (usize, usize) {
        (self.total, self.per_client)
    }

    /// Open streams per client address (`loopback` for all of this machine's), most first.
    pub fn by_client(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = self
            .lock()
            .by_client
            .iter()
            .map(|(c, n)| (c.to_string(), *n))
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

/// `1 stream`, `2 streams`.
fn streams(n: usize) -> String {
    vak_proto::text::count(n, "stream")
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.limits.lock();
        open.total -= 1;
        if let Some(c) = self.client {
            if let Some(n) = open.by_client.get_mut(&c) {
                *n -= 1;
                if *n == 0 {
                    open.by_client.remove(&c);
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
    fn every_loopback_address_is_one_client() {
        let l = StreamLimits::new(100, 3);
        let _a = l.acquire(Some("127.0.0.1".parse().unwrap())).unwrap();
        let _b = l.acquire(Some("127.0.0.2".parse().unwrap())).unwrap();
        let _c = l.acquire(Some("::1".parse().unwrap())).unwrap();
        for more in ["127.9.9.9", "::ffff:127.0.0.3", "::1"] {
            let e = l.acquire(Some(more.parse().unwrap())).err().unwrap();
            assert!(
                e.message().starts_with("loopback already has 3 streams open"),
                "{more}: {}",
                e.message()
            );
        }
        let remote: IpAddr = "10.0.0.1".parse().unwrap();
        let _r = l.acquire(Some(remote)).unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let _r2 = l.acquire(Some(mapped)).unwrap();
        let _r3 = l.acquire(Some(remote)).unwrap();
        let e = l.acquire(Some(mapped)).err().unwrap();
        assert!(e.message().starts_with("10.0.0.1 already has"), "{}", e.message());
    }

    #[test]
    fn caps_per_client_and_in_total_and_frees_on_drop() {
        let l = StreamLimits::new(3, 2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
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
        assert_eq!(
            l.by_client(),
            vec![("loopback".to_string(), 2), ("10.0.0.2".to_string(), 1)]
        );
        assert_eq!(l.caps(), (3, 2));
        drop(p1);
        assert_eq!(l.open_streams(), 2);
        let _p4 = l.acquire(Some(a)).unwrap();
    }
}
