//! The floors: one thread writes the latency scenario's paced SSE frames, or a sized burst's, straight to the subscribers' sockets (no runtime, no bus, no HTTP library), so a figure shows what this machine's loopback TCP allows before vak costs anything.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vak_proto::sse;

/// The session id the floor's frames carry (the client checks it on sampled frames).
pub(crate) const SESSION: &str = "floor";

/// What a floor writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Frames {
    /// `rate` deltas a second, each stamped with its send time (`/pace`).
    Paced { rate: u64 },
    /// Every delta at once, each `t{i}` padded with `_` to `size` bytes
    /// and a space (`/burst N SIZE`).
    Sized { size: u64 },
}

/// A floor server on 127.0.0.1: it accepts `subs` SSE subscribers, and on
/// `start` writes `n` text deltas to all of them (as `frames` says), then
/// `run_finished`.
pub(crate) struct Floor {
    pub addr: SocketAddr,
    start: Option<mpsc::Sender<()>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

/// One subscriber: its socket, how much of the frame log it has been
/// given, and the chunk bytes not yet written.
pub(crate) struct Conn {
    pub(crate) tcp: TcpStream,
    given: usize,
    pub(crate) out: Vec<u8>,
}

impl Floor {
    pub(crate) fn start(subs: usize, n: u64, frames: Frames) -> io::Result<Floor> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (start, started) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("floor".into())
            .spawn(move || serve(listener, subs, n, frames, started, &flag))?;
        Ok(Floor {
            addr,
            start: Some(start),
            stop,
            thread: Some(thread),
        })
    }

    /// Starts the paced run (the subscribers are all open).
    pub(crate) fn run(&mut self) {
        if let Some(s) = self.start.take() {
            let _ = s.send(());
        }
    }

    /// Ends the thread and returns its error, if any.
    pub(crate) fn finish(mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Release);
        self.start.take();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the floor thread panicked".into()),
            None => Ok(()),
        }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn serve(
    listener: TcpListener,
    subs: usize,
    n: u64,
    frames: Frames,
    started: mpsc::Receiver<()>,
    stop: &AtomicBool,
) -> Result<(), String> {
    listener.set_nonblocking(true).map_err(failed("listen"))?;
    let mut conns = Vec::with_capacity(subs);
    let opened = opened();
    while conns.len() < subs {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        match listener.accept() {
            Ok((tcp, _)) => conns.push(open(tcp, &opened).map_err(failed("accept"))?),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(err) => return Err(failed("accept")(err)),
        }
    }
    loop {
        match started.recv_timeout(Duration::from_millis(100)) {
            Ok(()) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if !stop.load(Ordering::Acquire) => {}
            Err(_) => return Ok(()),
        }
    }
    // One thread: two (each with half the sockets) measured worse, p99 47
    // against 25 ms at 1 000/s, as they take the bench's cores.
    pace(conns, Instant::now(), n, frames, stop)
}

/// `/burst N SIZE`'s delta `i`, as the offline model writes it.
pub(crate) fn sized_token(i: u64, size: u64) -> String {
    let mut t = format!("t{i}");
    let want = size as usize;
    if t.len() + 1 < want {
        t.extend(std::iter::repeat_n('_', want - 1 - t.len()));
    }
    t.push(' ');
    t
}

/// Writes the frames to `conns` from `t0` on.
fn pace(mut conns: Vec<Conn>, t0: Instant, n: u64, frames: Frames, stop: &AtomicBool) -> Result<(), String> {
    // Every frame in order; a subscriber is given what it has not had yet,
    // as one chunk, on each sweep: the batching a reader that lags gets.
    let per_frame = match frames {
        Frames::Paced { .. } => 128,
        Frames::Sized { size } => size as usize + 96,
    };
    let mut log = bytes::BytesMut::with_capacity(n as usize * per_frame);
    let due = |i: u64| match frames {
        Frames::Paced { rate } => t0 + Duration::from_secs_f64(i as f64 / rate as f64),
        Frames::Sized { .. } => t0,
    };
    let mut next = 0u64;
    let mut finished = false;
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = Instant::now();
        while next < n && due(next) <= now {
            // vak's own frame encoder, so the bytes are what vak would send.
            let seq = next + 2;
            let text = match frames {
                Frames::Paced { .. } => format!("p{next}@{} ", crate::clients::unix_micros()),
                Frames::Sized { size } => sized_token(next, size),
            };
            let json = format!(
                "{{\"seq\":{seq},\"session_id\":\"{SESSION}\",\"text_delta\":{{\"text\":\"{text}\"}}}}"
            );
            sse::write_frame(&mut log, "text_delta", Some(&seq.to_string()), json.as_bytes());
            next += 1;
        }
        if next == n && !finished {
            finished = true;
            let json = format!("{{\"session_id\":\"{SESSION}\"}}");
            sse::write_frame(&mut log, "run_finished", None, json.as_bytes());
        }
        let mut waiting = false;
        for c in conns
            .iter_mut()
            .filter(|c| c.given < log.len() || !c.out.is_empty())
        {
            if c.given < log.len() {
                chunk(&mut c.out, &log[c.given..]);
                c.given = log.len();
            }
            match c.tcp.write(&c.out) {
                Ok(k) => {
                    c.out.drain(..k);
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(failed("write")(err)),
            }
            waiting |= !c.out.is_empty();
        }
        if finished && !waiting {
            return Ok(());
        }
        if waiting {
            // A socket is full: its reader is behind; look again soon.
            std::thread::sleep(Duration::from_micros(50));
        } else if next < n {
            std::thread::sleep(due(next).saturating_duration_since(Instant::now()));
        }
    }
}

/// Reads the request head, answers with the response head and `opened`,
/// and leaves the socket non-blocking.
pub(crate) fn open(mut tcp: TcpStream, opened: &[u8]) -> io::Result<Conn> {
    tcp.set_nonblocking(false)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.set_nodelay(true)?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while memchr::memmem::find(&head, b"\r\n\r\n").is_none() {
        let k = tcp.read(&mut buf)?;
        if k == 0 || head.len() > 16 * 1024 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "no request head"));
        }
        head.extend_from_slice(&buf[..k]);
    }
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    out.extend_from_slice(opened);
    tcp.write_all(&out)?;
    tcp.set_nonblocking(true)?;
    Ok(Conn {
        tcp,
        given: 0,
        out: Vec::new(),
    })
}

/// An I/O error of the floor, naming what it was doing.
fn failed(what: &'static str) -> impl Fn(io::Error) -> String {
    move |err| format!("floor {what}: {err}")
}

/// What every floor subscriber gets first, as chunks: the retry line and stream_opened.
pub(crate) fn opened() -> Vec<u8> {
    let mut opened = Vec::new();
    chunk(&mut opened, b"retry: 1000\n");
    let head = sse::frame(
        "stream_opened",
        None,
        format!("{{\"session_id\":\"{SESSION}\"}}").as_bytes(),
    );
    chunk(&mut opened, &head);
    opened
}

/// Appends `data` as one HTTP/1.1 chunk.
pub(crate) fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sized_token_is_the_offline_models_one_token_of_that_size() {
        assert_eq!(sized_token(7, 0), "t7 ");
        assert_eq!(sized_token(7, 3), "t7 ");
        assert_eq!(sized_token(7, 4), "t7_ ");
        let t = sized_token(123, 65536);
        assert_eq!(t.len(), 65536);
        assert!(t.starts_with("t123_") && t.ends_with("_ ") && t.matches(' ').count() == 1);
    }
}
