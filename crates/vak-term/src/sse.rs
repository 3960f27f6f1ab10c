//! An incremental text/event-stream parser: bytes in, `event` / `data` / `id` frames out (comments and keepalives skipped).

/// One dispatched SSE frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SseFrame {
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

/// Feed it chunks as they arrive; it returns the frames they complete. Lines
/// end with LF, CRLF or CR, as the EventSource specification allows.
#[derive(Default)]
pub(crate) struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: Vec<String>,
    id: Option<String>,
    after_cr: bool,
}

/// A frame larger than this is a broken server, not a reason to grow without bound.
const MAX_LINE: usize = 64 * 1024 * 1024;

impl SseParser {
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseFrame>, String> {
        let mut out = Vec::new();
        for &b in chunk {
            // The LF of a CRLF whose CR already ended the line.
            if std::mem::take(&mut self.after_cr) && b == b'\n' {
                continue;
            }
            if b == b'\n' || b == b'\r' {
                self.after_cr = b == b'\r';
                let line = String::from_utf8_lossy(&self.buf).into_owned();
                self.buf.clear();
                if let Some(f) = self.line(&line) {
                    out.push(f);
                }
            } else {
                self.buf.push(b);
            }
        }
        if self.buf.len() > MAX_LINE {
            return Err("an SSE line longer than 64 MiB".into());
        }
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Option<SseFrame> {
        if line.is_empty() {
            let frame = (!self.data.is_empty()).then(|| SseFrame {
                event: std::mem::take(&mut self.event),
                data: self.data.join("\n"),
                id: self.id.take(),
            });
            self.event.clear();
            self.data.clear();
            self.id = None;
            return frame;
        }
        if line.starts_with(':') {
            return None; // a comment, e.g. the server's `: keepalive`
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => self.data.push(value.to_string()),
            "id" => self.id = Some(value.to_string()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere_parse_the_same() {
        let text = b"event: stream_opened\ndata: {\"seq\":0}\n\n: keepalive\n\nevent: text_delta\r\ndata: {\"a\":1}\r\ndata: x\r\nid: 4\r\n\r\nevent: e\rdata:y\r\r";
        let want = vec![
            SseFrame {
                event: "stream_opened".into(),
                data: "{\"seq\":0}".into(),
                id: None,
            },
            SseFrame {
                event: "text_delta".into(),
                data: "{\"a\":1}\nx".into(),
                id: Some("4".into()),
            },
            SseFrame {
                event: "e".into(),
                data: "y".into(),
                id: None,
            },
        ];
        for split in 0..text.len() {
            let mut p = SseParser::default();
            let mut got = p.feed(&text[..split]).unwrap();
            got.extend(p.feed(&text[split..]).unwrap());
            assert_eq!(got, want, "split at {split}");
        }
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for b in text {
            got.extend(p.feed(&[*b]).unwrap());
        }
        assert_eq!(got, want, "byte by byte");
    }
}
