//! How long a connection's bytes waited in the kernel before floodgate read them.
//!
//! Under overload most of a call's wait is there: a busy service reads a connection only
//! when its task gets its turn, and meanwhile the caller's requests pile up in the socket's
//! receive buffer (40-80 KB per connection, measured with `ss` at 256 calls in flight of 64
//! descriptors). A call's age counted from when its stream was taken leaves that wait out,
//! so calls whose callers had already given up were served, late, instead of shed.
//!
//! So TCP connections ask the kernel to stamp what they receive (`SO_TIMESTAMPNS`) and read
//! with `recvmsg`, keeping the stamp of each read. Linux stamps a TCP read with the arrival
//! of the last packet it took bytes from, so the wait measured is never longer than any
//! request's in that read.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::overload::ReceiveStamp;

/// A TCP connection whose reads keep the kernel's receive stamp in a [`ReceiveStamp`]
/// (on Linux; elsewhere a plain connection whose stamp stays unknown).
pub struct TimestampedTcp {
    tcp: TcpStream,
    stamp: Arc<ReceiveStamp>,
    /// Room for one `SCM_TIMESTAMPNS` message, reused by every read.
    #[cfg(target_os = "linux")]
    control: Vec<u8>,
}

impl TimestampedTcp {
    /// Asks the kernel to stamp what `tcp` receives. Where it cannot, reads still work and
    /// the stamp stays unknown.
    pub fn new(tcp: TcpStream) -> TimestampedTcp {
        #[cfg(target_os = "linux")]
        let _ = stamps::enable(&tcp);
        TimestampedTcp {
            tcp,
            stamp: Arc::default(),
            #[cfg(target_os = "linux")]
            control: stamps::control_buffer(),
        }
    }

    /// The stamp its reads keep.
    pub fn stamp(&self) -> Arc<ReceiveStamp> {
        Arc::clone(&self.stamp)
    }
}

impl AsyncRead for TimestampedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        #[cfg(target_os = "linux")]
        return this.poll_read_stamped(cx, buf);
        #[cfg(not(target_os = "linux"))]
        return Pin::new(&mut this.tcp).poll_read(cx, buf);
    }
}

#[cfg(target_os = "linux")]
impl TimestampedTcp {
    /// One `recvmsg` once the socket is readable, keeping its stamp (or its lack of one).
    fn poll_read_stamped(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            std::task::ready!(self.tcp.poll_read_ready(cx))?;
            let into = buf.initialize_unfilled();
            let received = self.tcp.try_io(tokio::io::Interest::READABLE, || {
                stamps::receive(&self.tcp, into, &mut self.control)
            });
            match received {
                Ok((read, stamp)) => {
                    self.stamp.stamp(stamp);
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale; `try_io` cleared it, so the next poll waits.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

/// The kernel's receive stamps, through `nix`.
#[cfg(target_os = "linux")]
mod stamps {
    use std::io::{self, IoSliceMut};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use nix::sys::socket::{self, ControlMessageOwned, MsgFlags, sockopt};
    use nix::sys::time::TimeSpec;
    use tokio::net::TcpStream;

    /// Asks the kernel to stamp every read of `tcp` (`SO_TIMESTAMPNS`).
    pub fn enable(tcp: &TcpStream) -> io::Result<()> {
        Ok(socket::setsockopt(tcp, sockopt::ReceiveTimestampns, &true)?)
    }

    /// Room for one stamp's control message.
    pub fn control_buffer() -> Vec<u8> {
        nix::cmsg_space!(TimeSpec)
    }

    /// One `recvmsg` into `into`: the bytes read, and when the newest of them arrived (since
    /// the Unix epoch).
    pub fn receive(
        tcp: &TcpStream,
        into: &mut [u8],
        control: &mut [u8],
    ) -> io::Result<(usize, Option<Duration>)> {
        let mut slices = [IoSliceMut::new(into)];
        let message = socket::recvmsg::<()>(
            tcp.as_raw_fd(),
            &mut slices,
            Some(control),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let stamp = message.cmsgs().ok().and_then(|mut messages| {
            messages.find_map(|message| match message {
                ControlMessageOwned::ScmTimestampns(stamp) => Some(Duration::new(
                    u64::try_from(stamp.tv_sec()).ok()?,
                    u32::try_from(stamp.tv_nsec()).ok()?,
                )),
                _ => None,
            })
        });
        Ok((message.bytes, stamp))
    }
}

impl AsyncWrite for TimestampedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    #[allow(
        clippy::disallowed_methods,
        reason = "compares with the kernel's stamps, which use the wall clock"
    )]
    fn wall_clock() -> SystemTime {
        SystemTime::now()
    }

    #[tokio::test]
    async fn a_read_knows_how_long_its_bytes_waited_in_the_kernel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut server = TimestampedTcp::new(server);
        let stamp = server.stamp();
        assert_eq!(stamp.waited(wall_clock), None, "nothing read yet");
        let mut buf = [0u8; 64];
        // The kernel turns stamping on a moment after the socket asks for it.
        for _ in 0..200 {
            client.write_all(b"warm").await.unwrap();
            let read = server.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..read], b"warm");
            if stamp.waited(wall_clock).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        client.write_all(b"first").await.unwrap();
        // Left unread for a while, as by a busy service.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let read = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..read], b"first");
        let first_read_at = wall_clock();
        let first = stamp
            .waited(|| first_read_at)
            .expect("the read was stamped");
        assert!(first >= Duration::from_millis(50), "{first:?}");

        // A later read keeps the later stamp: sent at least 60 ms after the first bytes.
        client.write_all(b"second").await.unwrap();
        let read = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..read], b"second");
        let now = wall_clock();
        let first_now = first + now.duration_since(first_read_at).unwrap_or_default();
        let second = stamp.waited(|| now).unwrap();
        assert!(
            second + Duration::from_millis(50) <= first_now,
            "{second:?} {first_now:?}"
        );

        // Writes pass through.
        server.write_all(b"answer").await.unwrap();
        let read = client.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..read], b"answer");
    }
}
