//! Issue #48: an HAProxy pod's shutdown cuts no request. The chart's preStop script
//! (chart/files/haproxy-shutdown.sh) runs against a real HAProxy of each version, started as
//! the chart starts it (master-worker, a pid file): while it drains, new requests are served;
//! then its ports close, the request in flight is still answered, and the script returns only
//! once HAProxy has exited.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::env;

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A plain HTTP GET to 127.0.0.1:`port`: the status line's code, or why there is none.
fn get(port: u16, path: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return "refused".into() };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
    if stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).is_err() {
        return "closed".into();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.split_whitespace().nth(1).unwrap_or("closed").to_owned()
}

fn wait_for(port: u16, until: Instant) -> Result<()> {
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        ensure!(Instant::now() < until, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// One HAProxy: what the script and the requests made of its shutdown.
fn shutdown_of(haproxy: &Path, dir: &Path, backend_port: u16) -> Result<Vec<String>> {
    let port = free_port()?;
    let pid_file = dir.join("haproxy.pid");
    let config = format!(
        "global\n    master-worker\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\
         frontend http\n    bind 127.0.0.1:{port}\n    default_backend web\nbackend web\n    server web 127.0.0.1:{backend_port}\n"
    );
    std::fs::write(dir.join("haproxy.cfg"), config)?;
    let process = Command::new(haproxy)
        .args(["-W", "-db", "-p"])
        .arg(&pid_file)
        .arg("-f")
        .arg(dir.join("haproxy.cfg"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", haproxy.display()))?;
    // Reaped as soon as it exits, as a pod's init reaps: an unreaped zombie would still answer
    // the script's `kill -0`.
    let pid = process.id();
    let reaper = std::thread::spawn(move || {
        let mut process = process;
        process.wait().map(|status| status.code())
    });
    wait_for(port, Instant::now() + Duration::from_secs(10))?;
    while !pid_file.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/chart/files/haproxy-shutdown.sh"))?
        .replace("@DRAIN_SECONDS@", "2")
        .replace("@PID_FILE@", &pid_file.display().to_string());
    // A request in flight for 4 s, then the pod is deleted: its preStop starts.
    let in_flight = std::thread::spawn(move || get(port, "/slow?seconds=4"));
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut pre_stop = Command::new("/bin/sh").args(["-c", &script]).spawn()?;
    std::thread::sleep(Duration::from_millis(500));
    let during_drain = get(port, "/");
    std::thread::sleep(Duration::from_millis(2500));
    let after_stop = get(port, "/");
    let in_flight = in_flight.join().unwrap_or_else(|_| "panicked".into());
    let script_done = pre_stop.wait()?;
    let took = started.elapsed();
    let exited = reaper.is_finished();
    if !exited {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let _ = reaper.join();
    Ok(vec![
        format!("during the drain: {during_drain}"),
        format!("after the soft stop: {after_stop}"),
        format!("the request in flight: {in_flight}"),
        format!(
            "the script: {} after HAProxy exited ({})",
            if script_done.success() { "returned" } else { "failed" },
            if exited && took >= Duration::from_millis(3500) { "on time" } else { "too soon" }
        ),
    ])
}

#[test]
fn the_haproxy_pods_pre_stop_drains_then_stops_gracefully_on_every_version() -> Result<()> {
    let work = tempfile::tempdir()?;
    let backend_port = free_port()?;
    let _backend = env::standalone::Process(
        Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/backend.py"))
            .arg(format!("web=127.0.0.1:{backend_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    wait_for(backend_port, Instant::now() + Duration::from_secs(10))?;
    let mut binaries = env::chart::haproxy_binaries()?;
    binaries.insert(0, env::cache_dir().join("haproxy-3.4/haproxy"));
    let expected = vec![
        "during the drain: 200".to_owned(),
        "after the soft stop: refused".to_owned(),
        "the request in flight: 200".to_owned(),
        "the script: returned after HAProxy exited (on time)".to_owned(),
    ];
    for haproxy in binaries {
        let dir = tempfile::tempdir_in(work.path())?;
        let got = shutdown_of(&haproxy, dir.path(), backend_port)?;
        ensure!(got == expected, "{}: {got:#?}", haproxy.display());
    }
    Ok(())
}
