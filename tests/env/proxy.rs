//! A TCP proxy in front of the API server that a test can cut, to partition one controller
//! from the API server while everything else keeps talking to it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// A running proxy; dropping it stops it.
pub struct CuttableProxy {
    /// Where it listens.
    pub address: SocketAddr,
    cut: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl CuttableProxy {
    /// Starts forwarding 127.0.0.1:<some port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let cut = cut.clone();
            let connections = connections.clone();
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::Acquire) {
                        continue; // dropped: the connection is closed at once
                    }
                    let forward = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections.lock().await.push(forward);
                }
            }
        });
        Ok(Self { address, cut, connections, accept })
    }

    /// Cuts every open connection and refuses new ones.
    pub async fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        for connection in self.connections.lock().await.drain(..) {
            connection.abort();
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::Release);
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
