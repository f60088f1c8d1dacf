//! Counts the streams and connections the HTTP/2 layer resets.
//!
//! h2 resets a stream it finds malformed (an unparsable header, a stream past the limit)
//! before the call reaches floodgate, and closes a connection on a protocol error with a
//! GOAWAY; neither reaches the service, and the client only sees its call fail. Envoy then
//! applies its failure mode, so rate limiting is silently off (or everything denied). To make
//! that visible, the frames the server sends are read on their way out: every `RST_STREAM`,
//! and every `GOAWAY` with an error code, counts in `floodgate_http2_resets{kind,code}` and
//! is logged, at most once per [`LOG_INTERVAL`].
//!
//! Only frame headers are parsed (nine bytes per frame; a reset's first payload bytes), so
//! the cost is a few comparisons per written frame whatever its size.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::metrics::Http2ResetLabels;

/// Shortest time between two log lines about resets.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Length of an HTTP/2 frame header.
const FRAME_HEADER_BYTES: usize = 9;
/// Frame type `RST_STREAM`: its payload is the error code.
const RST_STREAM: u8 = 0x3;
/// Frame type `GOAWAY`: its payload is the last stream id, then the error code.
const GOAWAY: u8 = 0x7;
/// Error code `NO_ERROR`: a GOAWAY with it is a graceful close, not a failure.
const NO_ERROR: u32 = 0;

/// A reset the server sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// `RST_STREAM` with this error code.
    Stream(u32),
    /// `GOAWAY` with this (non-`NO_ERROR`) error code.
    Connection(u32),
}

/// Where resets are counted and logged; shared by every connection of a listener.
#[derive(Clone)]
pub struct ResetCounter {
    counts: Family<Http2ResetLabels, Counter>,
    /// Milliseconds since `epoch` of the last log line, plus one (0: never logged).
    last_logged: std::sync::Arc<AtomicU64>,
    epoch: Instant,
}

impl ResetCounter {
    /// Counts into `counts` (the metrics' `http2_resets` family).
    pub fn new(counts: Family<Http2ResetLabels, Counter>) -> ResetCounter {
        ResetCounter {
            counts,
            last_logged: Default::default(),
            epoch: Instant::now(),
        }
    }

    fn record(&self, reset: Reset) {
        let (kind, code) = match reset {
            Reset::Stream(code) => ("stream", code),
            Reset::Connection(code) => ("connection", code),
        };
        // h2's names for the codes it knows; it sends no other.
        let code = format!("{:?}", h2::Reason::from(code));
        self.counts
            .get_or_create(&Http2ResetLabels {
                kind,
                code: code.clone(),
            })
            .inc();
        if self.may_log() {
            tracing::warn!(
                kind,
                code,
                "HTTP/2 reset sent to a client before its call reached the service \
                 (floodgate_http2_resets counts them; RUST_LOG=h2=debug shows the cause)"
            );
        }
    }

    /// True at most once per [`LOG_INTERVAL`], across every connection.
    fn may_log(&self) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        let last = self.last_logged.load(Ordering::Relaxed);
        let interval = u64::try_from(LOG_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        (last == 0 || now.saturating_sub(last) >= interval)
            && self
                .last_logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Finds the resets in a stream of outgoing HTTP/2 frames fed in arbitrary pieces.
#[derive(Debug, Default)]
struct FrameScanner {
    header: [u8; FRAME_HEADER_BYTES],
    /// Header bytes read of the current frame; `FRAME_HEADER_BYTES` while in its payload.
    header_len: usize,
    /// Payload bytes of the current frame not yet seen.
    payload_left: usize,
    /// The payload's first bytes, as far as a reset needs them.
    start: [u8; 8],
    start_len: usize,
    /// How many of the payload's first bytes the current frame needs (0: none).
    start_wanted: usize,
}

impl FrameScanner {
    /// Reads `bytes`, the next ones written, and hands each reset they complete to `found`.
    fn feed(&mut self, mut bytes: &[u8], mut found: impl FnMut(Reset)) {
        while !bytes.is_empty() {
            if self.header_len < FRAME_HEADER_BYTES {
                let take = (FRAME_HEADER_BYTES - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[..take]);
                self.header_len += take;
                bytes = &bytes[take..];
                if self.header_len == FRAME_HEADER_BYTES {
                    self.start_frame();
                }
                continue;
            }
            let take = self.payload_left.min(bytes.len());
            if self.start_len < self.start_wanted {
                let copy = (self.start_wanted - self.start_len).min(take);
                self.start[self.start_len..self.start_len + copy].copy_from_slice(&bytes[..copy]);
                self.start_len += copy;
                if self.start_len == self.start_wanted {
                    self.finish_reset(&mut found);
                }
            }
            self.payload_left -= take;
            bytes = &bytes[take..];
            if self.payload_left == 0 {
                self.header_len = 0;
            }
        }
    }

    fn start_frame(&mut self) {
        let [l0, l1, l2, kind, ..] = self.header;
        self.payload_left = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
        self.start_len = 0;
        self.start_wanted = match kind {
            RST_STREAM => 4,
            GOAWAY => 8,
            _ => 0,
        }
        .min(self.payload_left);
        if self.payload_left == 0 {
            self.header_len = 0;
        }
    }

    fn finish_reset(&self, found: &mut impl FnMut(Reset)) {
        let code = |at: usize| {
            u32::from_be_bytes([
                self.start[at],
                self.start[at + 1],
                self.start[at + 2],
                self.start[at + 3],
            ])
        };
        match (self.header[3], self.start_wanted) {
            (RST_STREAM, 4) => found(Reset::Stream(code(0))),
            (GOAWAY, 8) if code(4) != NO_ERROR => found(Reset::Connection(code(4))),
            _ => {}
        }
    }
}

/// A server connection whose outgoing resets are counted.
pub struct ResetWatch<IO> {
    inner: IO,
    scanner: FrameScanner,
    counter: ResetCounter,
}

impl<IO> ResetWatch<IO> {
    /// Watches what the server writes to `io`.
    pub fn new(io: IO, counter: ResetCounter) -> ResetWatch<IO> {
        ResetWatch {
            inner: io,
            scanner: FrameScanner::default(),
            counter,
        }
    }

    fn written(&mut self, bufs: &[io::IoSlice<'_>], mut count: usize) {
        for buf in bufs {
            if count == 0 {
                break;
            }
            let take = buf.len().min(count);
            let counter = &self.counter;
            self.scanner
                .feed(&buf[..take], |reset| counter.record(reset));
            count -= take;
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for ResetWatch<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for ResetWatch<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(count)) = polled {
            self.written(&[io::IoSlice::new(buf)], count);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(count)) = polled {
            self.written(bufs, count);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, 0];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn resets_in(bytes: &[u8], piece: usize) -> Vec<Reset> {
        let mut scanner = FrameScanner::default();
        let mut found = Vec::new();
        for chunk in bytes.chunks(piece) {
            scanner.feed(chunk, |reset| found.push(reset));
        }
        found
    }

    #[test]
    fn finds_resets_between_other_frames_however_the_bytes_are_cut() {
        let mut bytes = frame(0x4, 0, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x1, 1, &[0x88; 300])); // HEADERS
        bytes.extend(frame(RST_STREAM, 3, &1u32.to_be_bytes())); // PROTOCOL_ERROR
        bytes.extend(frame(0x0, 1, &[])); // empty DATA
        bytes.extend(frame(RST_STREAM, 5, &8u32.to_be_bytes())); // CANCEL
        let mut goaway = 7u32.to_be_bytes().to_vec();
        goaway.extend(11u32.to_be_bytes()); // ENHANCE_YOUR_CALM
        goaway.extend(b"debug data");
        bytes.extend(frame(GOAWAY, 0, &goaway));
        let expected = vec![Reset::Stream(1), Reset::Stream(8), Reset::Connection(11)];
        for piece in [1, 2, 5, 9, 10, 64, bytes.len()] {
            assert_eq!(resets_in(&bytes, piece), expected, "pieces of {piece}");
        }
    }

    #[test]
    fn a_graceful_goaway_is_not_a_reset() {
        let mut goaway = 1u32.to_be_bytes().to_vec();
        goaway.extend(NO_ERROR.to_be_bytes());
        assert!(resets_in(&frame(GOAWAY, 0, &goaway), 3).is_empty());
    }

    #[tokio::test]
    async fn counts_what_reaches_the_socket_by_kind_and_code() {
        use tokio::io::AsyncWriteExt;
        let counts = Family::<Http2ResetLabels, Counter>::default();
        let (near, _far) = tokio::io::duplex(1 << 16);
        let mut watched = ResetWatch::new(near, ResetCounter::new(counts.clone()));
        let mut bytes = frame(RST_STREAM, 1, &1u32.to_be_bytes());
        bytes.extend(frame(RST_STREAM, 3, &1u32.to_be_bytes()));
        watched.write_all(&bytes).await.unwrap();
        let protocol = Http2ResetLabels {
            kind: "stream",
            code: "PROTOCOL_ERROR".into(),
        };
        assert_eq!(counts.get_or_create(&protocol).get(), 2);
    }

    #[test]
    fn logs_at_most_once_per_interval() {
        let counter = ResetCounter::new(Family::default());
        assert!(counter.may_log());
        assert!(!counter.may_log());
    }
}
