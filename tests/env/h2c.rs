//! An HTTP/2-only backend in clear text (h2c, prior knowledge), as gRPC servers are: it answers
//! every request 200 with `content-type: application/grpc`, `grpc-status: 0`, `x-backend: NAME`
//! and `x-path: PATH`, and refuses HTTP/1 (so a request it answers reached it over HTTP/2).
//!
//! EndpointSlices may not hold loopback addresses, so it runs on the environment's backend host:
//! the test binary runs itself there (`ip netns exec`) with `HAPTIC_H2C_BACKENDS` set, and
//! [`serve_if_asked`], called from a test of that binary, serves until killed.

use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use super::standalone::Process;

/// The variable that makes [`serve_if_asked`] serve: `name=address:port,...`.
const VARIABLE: &str = "HAPTIC_H2C_BACKENDS";

/// Starts `specs` (`name=address:port`) on the backend host by running `test` of this binary.
pub fn start(dir: &std::path::Path, test: &str, specs: &[String]) -> Result<Process> {
    let host = &super::environment().backend_host;
    let child = Command::new("ip")
        .args(["netns", "exec", &host.namespace])
        .arg(std::env::current_exe()?)
        .args(["--exact", test, "--nocapture"])
        .env(VARIABLE, specs.join(","))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("h2c-backends.log"))?)
        .spawn()
        .context("starting the h2c backends")?;
    Ok(Process(child))
}

/// Serves the backends named in the environment, forever; returns at once when none are.
pub async fn serve_if_asked() -> Result<()> {
    let Ok(specs) = std::env::var(VARIABLE) else { return Ok(()) };
    let mut tasks = Vec::new();
    for spec in specs.split(',') {
        let (name, address) = spec.split_once('=').context("name=address:port")?;
        let listener = tokio::net::TcpListener::bind(address).await?;
        let name = name.to_owned();
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let name = name.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        let response = hyper::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "0")
                            .header("x-backend", name.as_str())
                            .header("x-path", request.uri().path())
                            .body(http_body_util::Empty::<hyper::body::Bytes>::new());
                        async move { response }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        }));
    }
    futures::future::join_all(tasks).await;
    Ok(())
}
