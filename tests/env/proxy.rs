//! A TCP proxy in front of the API server that a test can cut (connections close at once) or
//! blackhole (connections stay open and go silent, new ones are accepted and never answered,
//! as when a network drops packets), to partition one controller from the API server while
//! everything else keeps talking to it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    Cut,
    Blackhole,
}

/// A running proxy; dropping it stops it.
pub struct CuttableProxy {
    /// Where it listens.
    pub address: SocketAddr,
    mode: watch::Sender<Mode>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

/// Waits until the mode is `wanted` (or the proxy is gone).
async fn until(mode: &mut watch::Receiver<Mode>, wanted: impl Fn(Mode) -> bool) {
    let _ = mode.wait_for(|current| wanted(*current)).await;
}

impl CuttableProxy {
    /// Starts forwarding 127.0.0.1:<some port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Forward);
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let mode = mode.clone();
            let connections = connections.clone();
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let mut watching = mode.subscribe();
                    let now = *watching.borrow();
                    let forward = match now {
                        Mode::Cut => continue, // dropped: the connection is closed at once
                        // Accepted, then never answered, until healed (then closed).
                        Mode::Blackhole => tokio::spawn(async move {
                            until(&mut watching, |m| m != Mode::Blackhole).await;
                            drop(inbound);
                        }),
                        Mode::Forward => tokio::spawn(async move {
                            let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                                // Silent: both sockets held open, nothing moves, until healed.
                                _ = until(&mut watching, |m| m == Mode::Blackhole) => {
                                    until(&mut watching, |m| m != Mode::Blackhole).await;
                                }
                            }
                        }),
                    };
                    connections.lock().await.push(forward);
                }
            }
        });
        Ok(Self { address, mode, connections, accept })
    }

    /// Cuts every open connection and refuses new ones.
    pub async fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
        for connection in self.connections.lock().await.drain(..) {
            connection.abort();
        }
    }

    /// Silences every open connection (held open, nothing passes) and accepts new ones without
    /// ever answering them: a network that drops packets, not one that refuses.
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Lets connections through again (silenced ones are closed, so their clients reconnect).
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Forward);
    }

    /// A copy of `kubeconfig` (written to `to`) whose server is this proxy.
    pub fn kubeconfig(&self, kubeconfig: &Path, to: &Path) -> Result<()> {
        let upstream = apiserver_address(kubeconfig)?;
        let text = std::fs::read_to_string(kubeconfig)?;
        std::fs::write(to, text.replace(&format!("https://{upstream}"), &format!("https://{}", self.address)))?;
        Ok(())
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut connections) = self.connections.try_lock() {
            for connection in connections.drain(..) {
                connection.abort();
            }
        }
    }
}

/// The API server's address from a kubeconfig.
pub fn apiserver_address(kubeconfig: &Path) -> Result<SocketAddr> {
    let text = std::fs::read_to_string(kubeconfig)?;
    let server = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: https://"))
        .context("no server in the kubeconfig")?;
    server.parse().context("the kubeconfig's server is not an address")
}
