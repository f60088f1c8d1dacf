//! Hands a flush's lines to the socket without ever waiting past a deadline.
//!
//! TCP keeps one connection; a failed connect, write or timeout drops it and retries after
//! a backoff (1 s doubling to 60 s), so a dead server costs at most one connect attempt per
//! flush and fewer as it stays down. Its send buffer is fixed at [`TCP_SEND_BUFFER_BYTES`]
//! (the kernel would otherwise grow it to megabytes for a server that stops reading), so a
//! stuck server is noticed at the first flush that does not fit, and costs bounded memory. A line counts as delivered once the kernel accepted all
//! of its bytes; a write cut by the deadline leaves a partial last line on the dropped
//! connection, which StatsD servers discard as malformed. UDP packs lines into datagrams of
//! at most [`MAX_DATAGRAM_BYTES`] (a longer line goes alone) and a datagram counts as
//! delivered when the send succeeds; a refused or unsendable one is dropped.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream, UdpSocket};
use tokio::time::{Instant, timeout, timeout_at};

use super::{CONNECT_TIMEOUT, Protocol};

/// Largest datagram built from several lines: fits a 1500-byte MTU with IP and UDP headers
/// (the size DogStatsD clients use).
const MAX_DATAGRAM_BYTES: usize = 1432;
/// Send buffer asked of the kernel for the TCP connection (Linux doubles it for its own
/// bookkeeping).
const TCP_SEND_BUFFER_BYTES: u32 = 256 * 1024;
/// First pause before reconnecting to a server that failed.
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A socket to the StatsD server, opened on demand.
pub(super) struct Transport {
    protocol: Protocol,
    addr: String,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    backoff: Backoff,
}

impl Transport {
    pub(super) fn new(protocol: Protocol, addr: String) -> Transport {
        Transport {
            protocol,
            addr,
            tcp: None,
            udp: None,
            backoff: Backoff::default(),
        }
    }

    /// Sends the lines of `payload` (line `i` ends at `ends[i]`, newline included) and
    /// returns which ones the socket accepted before `deadline`.
    pub(super) async fn send(
        &mut self,
        payload: &[u8],
        ends: &[usize],
        deadline: Instant,
    ) -> Vec<bool> {
        if ends.is_empty() {
            return Vec::new();
        }
        match self.protocol {
            Protocol::Tcp => {
                let written = self.write_tcp(payload, deadline).await;
                ends.iter().map(|&end| end <= written).collect()
            }
            Protocol::Udp => self.send_udp(payload, ends, deadline).await,
        }
    }

    /// Writes as much of `payload` as the connection takes before `deadline`; returns the
    /// bytes written.
    async fn write_tcp(&mut self, payload: &[u8], deadline: Instant) -> usize {
        let mut stream = match self.tcp.take() {
            Some(stream) => stream,
            None => {
                if !self.backoff.ready() {
                    return 0;
                }
                match timeout(CONNECT_TIMEOUT, connect_tcp(&self.addr)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => return self.failed(0, &error.to_string()),
                    Err(_) => return self.failed(0, "connect timed out"),
                }
            }
        };
        let mut written = 0;
        while written < payload.len() {
            match timeout_at(deadline, stream.write(&payload[written..])).await {
                Ok(Ok(0)) => return self.failed(written, "connection closed"),
                Ok(Ok(n)) => written += n,
                Ok(Err(error)) => return self.failed(written, &error.to_string()),
                Err(_) => {
                    return self.failed(written, "write timed out: the server reads too slowly");
                }
            }
        }
        self.tcp = Some(stream);
        self.backoff.succeeded(&self.addr);
        written
    }

    async fn send_udp(&mut self, payload: &[u8], ends: &[usize], deadline: Instant) -> Vec<bool> {
        let mut delivered = vec![false; ends.len()];
        if self.udp.is_none() {
            if !self.backoff.ready() {
                return delivered;
            }
            match timeout(CONNECT_TIMEOUT, bind_udp(&self.addr)).await {
                Ok(Ok(socket)) => self.udp = Some(socket),
                Ok(Err(error)) => {
                    self.failed(0, &error.to_string());
                    return delivered;
                }
                Err(_) => {
                    self.failed(0, "name lookup timed out");
                    return delivered;
                }
            }
        }
        let Some(socket) = self.udp.as_ref() else {
            return delivered;
        };
        let (mut first, mut start) = (0, 0);
        let mut error = None;
        while first < ends.len() {
            let mut last = first;
            while last + 1 < ends.len() && ends[last + 1] - start <= MAX_DATAGRAM_BYTES {
                last += 1;
            }
            // The datagram's lines without the final newline.
            let datagram = &payload[start..ends[last] - 1];
            match timeout_at(deadline, socket.send(datagram)).await {
                Ok(Ok(_)) => delivered[first..=last].fill(true),
                // Refused: an earlier datagram met a closed port; this one was not sent.
                Ok(Err(failure)) => error = Some(failure.to_string()),
                Err(_) => {
                    error = Some("send timed out".to_owned());
                    break;
                }
            }
            start = ends[last];
            first = last + 1;
        }
        match error {
            // The socket stays: UDP has no connection to rebuild, and the next flush retries.
            Some(error) => self.backoff.note_failure(&self.addr, &error),
            None => self.backoff.succeeded(&self.addr),
        }
        delivered
    }

    /// Drops the TCP connection, schedules the next attempt and returns `written`.
    fn failed(&mut self, written: usize, error: &str) -> usize {
        self.tcp = None;
        self.backoff.failed(&self.addr, error);
        written
    }
}

/// The first address `addr` resolves to.
async fn resolve(addr: &str) -> io::Result<SocketAddr> {
    tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name has no address"))
}

/// A TCP connection to `addr` with a fixed send buffer.
async fn connect_tcp(addr: &str) -> io::Result<TcpStream> {
    let target = resolve(addr).await?;
    let socket = match target {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_send_buffer_size(TCP_SEND_BUFFER_BYTES)?;
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A UDP socket connected to `addr` (so sends name no address and refusals come back).
async fn bind_udp(addr: &str) -> io::Result<UdpSocket> {
    let target = resolve(addr).await?;
    let local = match target {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(target).await?;
    Ok(socket)
}

/// When to try a failed server again; logs once when sending starts failing and once when
/// it works again, not at every flush.
struct Backoff {
    delay: Duration,
    retry_at: Option<Instant>,
    failing: bool,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            delay: INITIAL_BACKOFF,
            retry_at: None,
            failing: false,
        }
    }
}

impl Backoff {
    fn ready(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// A failure that closes the socket: wait before the next attempt.
    fn failed(&mut self, addr: &str, error: &str) {
        self.note_failure(addr, error);
        self.retry_at = Some(Instant::now() + self.delay);
        self.delay = (self.delay * 2).min(MAX_BACKOFF);
    }

    /// A failure that keeps the socket (a UDP send): logged, no pause.
    fn note_failure(&mut self, addr: &str, error: &str) {
        if !self.failing {
            tracing::warn!(
                addr,
                error,
                "cannot send StatsD; retrying, and counting unsent lines in \
                 floodgate_statsd_dropped_total"
            );
            self.failing = true;
        }
    }

    fn succeeded(&mut self, addr: &str) {
        if self.failing {
            tracing::info!(addr, "StatsD sending again");
            self.failing = false;
        }
        self.delay = INITIAL_BACKOFF;
        self.retry_at = None;
    }
}
