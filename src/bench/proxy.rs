//! A TCP proxy for fault tests and the region benchmark: it adds a delay each way (a link
//! between regions) and can be cut (a partition, or a replica cut off from its Redis) and
//! healed. Loopback only: it listens on 127.0.0.1 and forwards to a loopback target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A running proxy; dropping it closes every connection.
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Cut requests for the forwarding tasks, which drop their connections.
    cuts: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`, `delay` each way.
    ///
    /// # Errors
    /// The target is not on loopback, or no port could be bound.
    pub async fn start(target: SocketAddr, delay: Duration) -> std::io::Result<Proxy> {
        if !target.ip().is_loopback() {
            return Err(std::io::Error::other("the proxy forwards to loopback only"));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (cuts, watch) = tokio::sync::watch::channel(0);
        let task = tokio::spawn(accept(listener, target, delay, Arc::clone(&cut), watch));
        Ok(Proxy {
            addr,
            cut,
            cuts,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection and refuses new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|cuts| *cuts += 1);
    }

    /// Forwards again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    delay: Duration,
    cut: Arc<AtomicBool>,
    cuts: tokio::sync::watch::Receiver<u64>,
) {
    let mut links = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if cut.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let mut cuts = cuts.clone();
        cuts.mark_unchanged();
        links.spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            tokio::select! {
                () = link(client, server, delay) => {}
                _ = cuts.changed() => {}
            }
        });
        while links.try_join_next().is_some() {}
    }
}

/// Forwards both ways until either side closes.
async fn link(client: TcpStream, server: TcpStream, delay: Duration) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = delayed(client_read, server_write, delay) => {}
        () = delayed(server_read, client_write, delay) => {}
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, in order.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(read) = from.read(&mut buffer).await {
            if read == 0
                || chunks
                    .send((Instant::now() + delay, buffer[..read].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    };
    // The writer ends after the reader closed and every chunk went out.
    tokio::join!(reader, writer);
}
