//! Server-sent events read from a model server's byte stream: linear in the bytes
//! received (each byte is scanned for a line end once, whatever the chunking), and
//! bounded (a line, or an event's data, longer than the bound is refused before it is
//! kept).

/// What [`Parser::push`] found in the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// An event's data (its `data:` lines joined by newlines).
    Data(String),
    /// `data: [DONE]`: the stream's end.
    Done,
}

/// A line, or an event's data, went past the bound.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TooLong;

/// An incremental parser of `text/event-stream`.
pub(crate) struct Parser {
    /// Bytes of the line being received (no line end in them yet, past `scanned`).
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no line end.
    scanned: usize,
    /// The current event's data so far.
    data: String,
    /// Whether the current event has a `data:` line.
    has_data: bool,
    /// The current event's name (`event:`).
    name: String,
    /// A `\r` ended the last chunk: a `\n` that starts the next one ends no line.
    after_cr: bool,
    max_line: usize,
}

impl Parser {
    /// A parser refusing lines and event data longer than `max_line` bytes.
    pub(crate) fn new(max_line: usize) -> Self {
        Parser {
            buf: Vec::new(),
            scanned: 0,
            data: String::new(),
            has_data: false,
            name: String::new(),
            after_cr: false,
            max_line,
        }
    }

    /// Takes the next bytes of the stream; hands each complete event to `out`.
    pub(crate) fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Event>) -> Result<(), TooLong> {
        if self.after_cr && bytes.first() == Some(&b'\n') {
            bytes = &bytes[1..];
        }
        self.after_cr = false;
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        let mut i = self.scanned;
        while i < self.buf.len() {
            let b = self.buf[i];
            if b == b'\n' || b == b'\r' {
                let line_end = i;
                if b == b'\r' {
                    match self.buf.get(i + 1) {
                        Some(b'\n') => i += 1,
                        Some(_) => {}
                        None => self.after_cr = true,
                    }
                }
                let line = String::from_utf8_lossy(&self.buf[start..line_end]).into_owned();
                self.line(&line, out)?;
                start = i + 1;
            }
            i += 1;
        }
        // What is left is the start of a line: kept, its bytes known to hold no end.
        if start > 0 {
            self.buf.drain(..start);
        }
        self.scanned = self.buf.len();
        if self.buf.len() > self.max_line {
            return Err(TooLong);
        }
        Ok(())
    }

    fn line(&mut self, line: &str, out: &mut Vec<Event>) -> Result<(), TooLong> {
        if line.len() > self.max_line {
            return Err(TooLong);
        }
        if line.is_empty() {
            // The event's end.
            let data = std::mem::take(&mut self.data);
            let name = std::mem::take(&mut self.name);
            if std::mem::take(&mut self.has_data) && name != "keepalive" {
                out.push(if data == "[DONE]" {
                    Event::Done
                } else {
                    Event::Data(data)
                });
            }
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(()); // a comment
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.data.len() + 1 + value.len() > self.max_line {
                    return Err(TooLong);
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => {
                self.name.clear();
                self.name.push_str(value);
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(p: &mut Parser, parts: &[&[u8]]) -> Result<Vec<Event>, TooLong> {
        let mut out = Vec::new();
        for part in parts {
            p.push(part, &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn events_are_read_however_the_bytes_are_cut() {
        let text = b"data: {\"a\":1}\n\n: comment\nevent: keepalive\ndata: x\n\ndata: one\r\ndata: two\r\n\r\nid: 3\ndata:[DONE]\n\n";
        let want = vec![
            Event::Data("{\"a\":1}".into()),
            Event::Data("one\ntwo".into()),
            Event::Done,
        ];
        assert_eq!(all(&mut Parser::new(1024), &[text]).unwrap(), want);
        for cut in 1..text.len() {
            let (a, b) = text.split_at(cut);
            assert_eq!(
                all(&mut Parser::new(1024), &[a, b]).unwrap(),
                want,
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(all(&mut Parser::new(1024), &bytes).unwrap(), want);
    }

    #[test]
    fn a_line_or_an_event_past_the_bound_is_refused() {
        // One line without an end, arriving a byte at a time.
        let mut p = Parser::new(100);
        let mut out = Vec::new();
        let mut refused = false;
        for _ in 0..200 {
            if p.push(b"x", &mut out).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
        // A complete line, in one chunk.
        let long = format!("data: {}\n\n", "y".repeat(200));
        assert_eq!(all(&mut Parser::new(100), &[long.as_bytes()]), Err(TooLong));
        // Many short data lines of one event.
        let many = "data: zzzzzzzzzz\n".repeat(20);
        assert_eq!(all(&mut Parser::new(100), &[many.as_bytes()]), Err(TooLong));
        // Within the bound: fine.
        let ok = format!("data: {}\n\n", "y".repeat(90));
        assert_eq!(
            all(&mut Parser::new(100), &[ok.as_bytes()]).unwrap(),
            vec![Event::Data("y".repeat(90))]
        );
    }

    /// A line without an end that arrives in many small chunks costs time linear in
    /// its bytes: 4 MiB a few bytes at a time takes well under a second (the old
    /// parser scanned the whole buffer again on every chunk: minutes).
    #[test]
    fn a_long_line_in_small_chunks_is_parsed_in_linear_time() {
        let mut p = Parser::new(8 << 20);
        let mut out = Vec::new();
        let piece = [b'a'; 16];
        let began = std::time::Instant::now();
        for _ in 0..(4 << 20) / piece.len() {
            p.push(&piece, &mut out).unwrap();
        }
        p.push(b"\n\n", &mut out).unwrap();
        assert!(out.is_empty(), "a line that is no field is ignored");
        let took = began.elapsed();
        assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
    }
}
