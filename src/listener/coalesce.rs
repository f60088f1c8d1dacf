//! Write coalescing for a connection's answers.
//!
//! A call's answer wakes its connection task, and Tokio runs a task woken that way right
//! after the waker (its LIFO slot). So the connection wrote each answer in its own
//! `writev` as soon as it was ready, even with dozens of answers a few microseconds behind
//! it: one syscall per call, a third of the service's CPU under load. Here writes go into a
//! buffer, and the first flush of a buffer only puts the connection task at the back of the
//! run queue; the answers that are ready meanwhile join the buffer, and the next flush
//! sends them all. When nothing else is runnable, the task is polled again at once, so an
//! idle service answers as fast as before. The load generator's client sends its calls the
//! same way.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};

/// Bytes buffered before a write goes to the socket without waiting for a flush: about a
/// hundred ordinary answers. Allocated per connection (160 MB at the 10,000-connection cap);
/// half of it cost about 15% of the decisions at 512 calls in flight over 4 connections.
const BUFFER_BYTES: usize = 16 * 1024;

/// A connection whose writes are buffered and whose flushes are deferred once.
pub struct Coalesced<IO> {
    inner: BufWriter<IO>,
    /// Whether the pending flush has already let the other runnable tasks go first.
    yielded: bool,
}

impl<IO: AsyncWrite> Coalesced<IO> {
    /// Buffers the writes to `io`.
    pub fn new(io: IO) -> Coalesced<IO> {
        Coalesced {
            inner: BufWriter::with_capacity(BUFFER_BYTES, io),
            yielded: false,
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesced<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Coalesced<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.yielded && !self.inner.buffer().is_empty() {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.yielded = false;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn writes_reach_the_peer_only_when_flushed_and_all_at_once() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let mut near = Coalesced::new(near);
        near.write_all(b"first ").await.unwrap();
        near.write_all(b"second").await.unwrap();
        let mut buf = [0u8; 12];
        assert!(
            far.read(&mut buf).now_or_never().is_none(),
            "nothing is sent before a flush"
        );
        near.flush().await.unwrap();
        far.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"first second");
    }

    #[tokio::test]
    async fn a_flush_with_nothing_buffered_does_not_wait() {
        let (near, _far) = tokio::io::duplex(64);
        let mut near = Coalesced::new(near);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(
            Pin::new(&mut near).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        near.write_all(b"x").await.unwrap();
        assert!(Pin::new(&mut near).poll_flush(&mut cx).is_pending());
        assert!(matches!(
            Pin::new(&mut near).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
    }
}
