//! A real HAProxy running one render for the validation tests' requests: the IO edge of
//! `checks`. The render is instrumented (`instrument.rs`), written to a scratch directory
//! with its maps, files and certificates, checked (`haproxy -c`), started in the foreground
//! and asked over plain HTTP/1.1 on loopback; it is stopped (killed) when done or dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use super::Answer;
use super::instrument::{BACKEND_HEADER, Instrumented, instrument};
use crate::config::{DataplaneSettings, RequestAssertion};
use crate::files::FileSet;

/// How long HAProxy may take to listen, and a request to be answered.
const PATIENCE: Duration = Duration::from_secs(10);

/// Why a render could not be asked.
#[derive(Debug, Error)]
pub enum HaproxyError {
    /// The scratch directory or a file in it.
    #[error("{what} ({}): {source}", path.display())]
    Scratch {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The render cannot be run outside a pod.
    #[error("the render cannot be run locally: {0}")]
    Instrument(#[from] super::instrument::InstrumentError),
    /// The binary did not start.
    #[error("cannot run HAProxy ({}): {source}", binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// HAProxy refused the render (its alerts, at the rendered file's lines).
    #[error("HAProxy refuses the render: {0}")]
    Refused(String),
    /// HAProxy started, then did not listen (or exited).
    #[error("HAProxy did not listen on every port within {}s: {log}", PATIENCE.as_secs())]
    NotListening {
        /// Its output.
        log: String,
    },
    /// The request names a port no `bind` has, or the render has no plain routing bind.
    #[error("no plain HTTP bind on port {0} in the render (without a port: in a frontend that routes)")]
    NoPort(String),
    /// The request could not be made or its answer not read.
    #[error("the request failed: {0}")]
    Request(String),
    /// The validator's Dataplane API could not be asked, or did not run the render.
    #[error("the validator's Dataplane API: {0}")]
    Validator(String),
}

/// A directory removed with everything in it when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An HAProxy running an instrumented render.
pub struct LocalHaproxy {
    child: Child,
    instrumented: Instrumented,
    _scratch: Scratch,
}

impl LocalHaproxy {
    /// Writes `files` to a scratch directory (the pods' directories from `dataplane` mapped
    /// into it), has `binary` check the configuration, then starts it and waits until it listens.
    pub async fn start(binary: &Path, files: &FileSet, dataplane: &DataplaneSettings) -> Result<Self, HaproxyError> {
        let prepared = prepare(binary, files, dataplane).await?;
        let Prepared { scratch, instrumented, config } = prepared;
        let dir = scratch.0.clone();
        let log = dir.join("haproxy.log");
        let log_file = std::fs::File::create(&log).map_err(|source| HaproxyError::Scratch {
            what: "creating",
            path: log.clone(),
            source,
        })?;
        let log_err = log_file.try_clone().map_err(|source| HaproxyError::Scratch {
            what: "opening",
            path: log.clone(),
            source,
        })?;
        let child = Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| HaproxyError::Spawn { binary: binary.into(), source })?;
        let mut running = Self { child, instrumented, _scratch: scratch };
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let child = &mut running.child;
        if until_listening(&running.instrumented, deadline, || matches!(child.try_wait(), Ok(Some(_)))).await.is_err() {
            let output = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(HaproxyError::NotListening { log: alerts(&output, &config, &running.instrumented) });
        }
        Ok(running)
    }

    /// Sends `request` and reads the answer (status, headers, and the backend that took it).
    pub async fn ask(&self, request: &RequestAssertion) -> Result<Answer, HaproxyError> {
        ask(&self.instrumented, request).await
    }

    /// Stops HAProxy.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Sends `request` to the HAProxy running `instrumented` (on loopback here) and reads the answer
/// (status, headers, and the backend that took it).
pub async fn ask(instrumented: &Instrumented, request: &RequestAssertion) -> Result<Answer, HaproxyError> {
    let plain = instrumented.ports.iter().filter(|port| !port.tls);
    let port = match request.port {
        Some(wanted) => plain.clone().find(|port| port.rendered == wanted),
        None => plain.clone().find(|port| port.routes),
    }
    .map(|port| port.local)
    .ok_or_else(|| HaproxyError::NoPort(request.port.map_or("(any)".into(), |p| p.to_string())))?;
    let method = request.method.as_deref().unwrap_or("GET");
    let path = request.path.as_deref().unwrap_or("/");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", request.host);
    for (name, value) in &request.headers {
        if name.contains(['\r', '\n', ':']) || value.contains(['\r', '\n']) {
            return Err(HaproxyError::Request(format!("header {name:?} cannot be sent")));
        }
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !matches!(method, "GET" | "HEAD" | "OPTIONS" | "DELETE") {
        head.push_str("Content-Length: 0\r\n");
    }
    head.push_str("\r\n");
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(head.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(PATIENCE, exchange)
        .await
        .map_err(|_| HaproxyError::Request(format!("no answer within {}s", PATIENCE.as_secs())))?
        .map_err(|error| HaproxyError::Request(error.to_string()))?;
    parse_answer(&answer).map_err(HaproxyError::Request)
}

/// Waits until every port of `instrumented` takes connections on loopback here; `Err` with the
/// first that does not by `deadline`, or once `gone` says HAProxy exited.
pub async fn until_listening(
    instrumented: &Instrumented,
    deadline: tokio::time::Instant,
    mut gone: impl FnMut() -> bool,
) -> Result<(), u16> {
    for port in &instrumented.ports {
        while TcpStream::connect(("127.0.0.1", port.local)).await.is_err() {
            if gone() || tokio::time::Instant::now() > deadline {
                return Err(port.local);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// A free port on loopback here (a port HAProxy's instrumented binds take).
pub fn free_local_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).map(|address| address.port())
}

/// A render written to a scratch directory, made runnable, and accepted by `haproxy -c`.
struct Prepared {
    scratch: Scratch,
    instrumented: Instrumented,
    config: PathBuf,
}

/// Writes `files` to a scratch directory (the pods' directories from `dataplane` mapped into
/// it), instruments the configuration and has `binary` check it.
async fn prepare(binary: &Path, files: &FileSet, dataplane: &DataplaneSettings) -> Result<Prepared, HaproxyError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("haptic-validate-{}-{unique}", std::process::id()));
    let scratch = Scratch(dir.clone());
    let write = |path: PathBuf, content: &str| {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| HaproxyError::Scratch {
                what: "creating a directory",
                path: parent.into(),
                source,
            })?;
        }
        std::fs::write(&path, content).map_err(|source| HaproxyError::Scratch { what: "writing", path, source })
    };
    let mut dirs = Vec::new();
    for (pod_dir, local, named) in [
        (&dataplane.maps_dir, "maps", &files.maps),
        (&dataplane.general_dir, "general", &files.files),
        (&dataplane.certs_dir, "certs", &files.certs),
    ] {
        let local_dir = dir.join(local);
        std::fs::create_dir_all(&local_dir).map_err(|source| HaproxyError::Scratch {
            what: "creating a directory",
            path: local_dir.clone(),
            source,
        })?;
        for (name, file) in named {
            write(local_dir.join(name), &file.content)?;
        }
        dirs.push((format!("{}/", pod_dir.trim_end_matches('/')), format!("{}/", local_dir.display())));
    }
    let mut next_port = free_local_port;
    let instrumented =
        instrument(&files.haproxy_cfg.content, &dirs, &dir, &mut next_port).map_err(HaproxyError::Instrument)?;
    let config = dir.join("haproxy.cfg");
    write(config.clone(), &instrumented.config)?;

    let check = Command::new(binary)
        .arg("-c")
        .arg("-f")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| HaproxyError::Spawn { binary: binary.into(), source })?;
    if !check.status.success() {
        let output = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
        return Err(HaproxyError::Refused(alerts(&output, &config, &instrumented)));
    }
    Ok(Prepared { scratch, instrumented, config })
}

/// Whether HAProxy (`binary`) accepts the render `files` (`haproxy -c`, nothing started).
pub async fn check(binary: &Path, files: &FileSet, dataplane: &DataplaneSettings) -> Result<(), HaproxyError> {
    prepare(binary, files, dataplane).await.map(drop)
}

/// Status line and headers of an HTTP/1.1 answer.
fn parse_answer(bytes: &[u8]) -> Result<Answer, String> {
    let text = String::from_utf8_lossy(bytes);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {:?}", status_line.chars().take(80).collect::<String>()))?;
    let mut answer = Answer { status, ..Answer::default() };
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            answer.headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    answer.backend = answer.headers.remove(BACKEND_HEADER);
    Ok(answer)
}

/// HAProxy's alerts from `output`, with the instrumented file's lines given as the render's.
fn alerts(output: &str, config: &Path, instrumented: &Instrumented) -> String {
    let path = config.display().to_string();
    let lines: Vec<String> = output
        .lines()
        .filter(|line| line.contains("[ALERT]") || line.contains("[WARNING]") && line.contains("Proxy"))
        .map(|line| {
            let mut line = line.to_owned();
            // `[/tmp/.../haproxy.cfg:12]` → the rendered file's own line.
            while let Some(at) = line.find(&format!("{path}:")) {
                let digits: String = line[at + path.len() + 1..].chars().take_while(char::is_ascii_digit).collect();
                let shown = digits
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| instrumented.origin.get(n.wrapping_sub(1)).copied().flatten())
                    .map_or_else(|| "(instrumented)".to_owned(), |n| n.to_string());
                line.replace_range(at..at + path.len() + 1 + digits.len(), &format!("haproxy.cfg:{shown}"));
            }
            line
        })
        .collect();
    if lines.is_empty() { output.trim().chars().take(2000).collect() } else { lines.join("\n") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_gives_its_status_headers_and_backend() {
        let answer = parse_answer(
            b"HTTP/1.1 302 Found\r\nlocation: https://example.com/\r\nX-Haptic-Validate-Backend: be_web\r\n\r\nbody",
        )
        .unwrap();
        assert_eq!(answer.status, 302);
        assert_eq!(answer.headers.get("location").map(String::as_str), Some("https://example.com/"));
        assert_eq!(answer.backend.as_deref(), Some("be_web"));
        assert!(parse_answer(b"garbage").is_err());
    }

    #[test]
    fn alerts_point_at_the_rendered_files_lines() {
        let instrumented = Instrumented { config: String::new(), ports: vec![], origin: vec![Some(1), None, Some(7)] };
        let output = "[NOTICE] x\n[ALERT]    (1) : config : parsing [/tmp/v/haproxy.cfg:3] : unknown keyword 'bogus'\n";
        assert_eq!(
            alerts(output, Path::new("/tmp/v/haproxy.cfg"), &instrumented),
            "[ALERT]    (1) : config : parsing [haproxy.cfg:7] : unknown keyword 'bogus'"
        );
    }
}
