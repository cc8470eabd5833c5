//! A rendered `haproxy.cfg` made runnable beside whatever else runs on this machine, for the
//! validation tests' requests: every `bind` moved to a free loopback port (or a socket in a
//! scratch directory), the pods' directories pointed at scratch copies, the process settings
//! that need a pod (`chroot`, `user`, `daemon`, `stats socket`...) dropped, and every HTTP
//! backend answering in its own name after its own rules, so a request says which backend
//! took it without any server running. Pure: text in, text out.

use std::collections::BTreeMap;
use std::path::Path;

/// The runnable configuration and what it moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instrumented {
    /// The configuration to run.
    pub config: String,
    /// Each TCP `bind` moved, in the rendered file's order.
    pub ports: Vec<MovedPort>,
    /// For each line of `config` (from 0), the rendered file's line (from 1) it comes from.
    pub origin: Vec<Option<usize>>,
}

/// A TCP `bind` moved to a local port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MovedPort {
    /// The port in the rendered file.
    pub rendered: u16,
    /// Where it listens now, on 127.0.0.1.
    pub local: u16,
    /// Whether it speaks TLS (`ssl`).
    pub tls: bool,
    /// Whether its section routes to backends (`use_backend`, `default_backend`): where
    /// requests go when they name no port.
    pub routes: bool,
}

/// The header every instrumented HTTP backend answers with: its name.
pub const BACKEND_HEADER: &str = "x-haptic-validate-backend";

/// Global directives a process outside a pod cannot or must not keep.
const POD_ONLY_GLOBALS: &[&str] =
    &["chroot", "user", "group", "uid", "gid", "daemon", "master-worker", "pidfile", "nbproc", "stats"];

/// Why a render cannot be run outside a pod.
#[derive(Debug, thiserror::Error)]
pub enum InstrumentError {
    /// A `bind` line without an address.
    #[error("line {line}: a bind without an address")]
    BindWithoutAddress {
        /// Its line in `haproxy.cfg`.
        line: usize,
    },
    /// A bind address that is neither a TCP port nor a socket that can be moved.
    #[error("line {line}: cannot move the bind address {address}")]
    Unmovable {
        /// Its line in `haproxy.cfg`.
        line: usize,
        /// The address.
        address: String,
    },
    /// No local port was free.
    #[error("no free local port: {0}")]
    NoFreePort(#[source] std::io::Error),
}

/// Makes `config` runnable: `dirs` maps each pod directory to its scratch copy, `scratch` holds
/// moved sockets, `next_port` hands out free local ports.
pub fn instrument(
    config: &str,
    dirs: &[(String, String)],
    scratch: &Path,
    next_port: &mut dyn FnMut() -> std::io::Result<u16>,
) -> Result<Instrumented, InstrumentError> {
    let lines: Vec<&str> = config.lines().collect();
    // Sockets first: a server may name a socket bound further down.
    let mut sockets: BTreeMap<String, String> = BTreeMap::new();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"bind")
            && let Some(address) = words.get(1)
            && is_socket(address)
            && !sockets.contains_key(*address)
        {
            let moved = if address.starts_with("abns@") {
                format!("abns@haptic-validate-{}-{}", std::process::id(), sockets.len())
            } else {
                format!("unix@{}", scratch.join(format!("socket-{}.sock", sockets.len())).display())
            };
            sockets.insert((*address).to_owned(), moved);
        }
    }
    let mut out = Instrumented { config: String::new(), ports: Vec::new(), origin: Vec::new() };
    let mut push = |out: &mut Instrumented, text: &str, origin: Option<usize>| {
        let mut text = text.to_owned();
        for (from, to) in dirs {
            text = text.replace(from.as_str(), to.as_str());
        }
        out.config.push_str(&text);
        out.config.push('\n');
        out.origin.push(origin);
    };
    let mut section = Section::default();
    let mut defaults_http = false;
    // Ports bound by the section being read, marked routing when it turns out to route.
    let mut section_ports = 0..0;
    for (index, line) in lines.iter().enumerate() {
        let number = Some(index + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = words.first().copied() else {
            push(&mut out, line, number);
            continue;
        };
        if !line.starts_with(char::is_whitespace) && !first.starts_with('#') {
            close(&mut out, &section, defaults_http, &mut push);
            section_ports = out.ports.len()..out.ports.len();
            if section.kind == "defaults" {
                defaults_http = section.http.unwrap_or(defaults_http);
            }
            section = Section { kind: first.to_owned(), name: words.get(1).map(|w| (*w).to_owned()), http: None };
            push(&mut out, line, number);
            continue;
        }
        match (section.kind.as_str(), first) {
            ("global", directive) if POD_ONLY_GLOBALS.contains(&directive) => continue,
            (_, "mode") => {
                section.http = Some(words.get(1) == Some(&"http"));
                push(&mut out, line, number);
            }
            ("frontend" | "listen", "bind") => {
                let Some(address) = words.get(1) else {
                    return Err(InstrumentError::BindWithoutAddress { line: index + 1 });
                };
                let rest = words[2..].join(" ");
                let moved = if let Some(socket) = sockets.get(*address) {
                    socket.clone()
                } else if address.starts_with("quic") {
                    continue; // QUIC needs UDP and certificates; requests here are TCP
                } else if let Some(port) = tcp_port(address) {
                    let local = next_port().map_err(InstrumentError::NoFreePort)?;
                    out.ports.push(MovedPort { rendered: port, local, tls: words.contains(&"ssl"), routes: false });
                    section_ports.end = out.ports.len();
                    format!("127.0.0.1:{local}")
                } else {
                    return Err(InstrumentError::Unmovable { line: index + 1, address: (*address).to_owned() });
                };
                push(&mut out, &format!("    bind {moved} {rest}"), number);
            }
            ("frontend" | "listen", "use_backend" | "default_backend") => {
                for port in &mut out.ports[section_ports.clone()] {
                    port.routes = true;
                }
                push(&mut out, line, number);
            }
            (_, "server") if words.get(2).is_some_and(|address| sockets.contains_key(*address)) => {
                let mut moved: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
                moved[2] = sockets[words[2]].clone();
                push(&mut out, &format!("    {}", moved.join(" ")), number);
            }
            _ => push(&mut out, line, number),
        }
    }
    close(&mut out, &section, defaults_http, &mut push);
    Ok(out)
}

#[derive(Default)]
struct Section {
    kind: String,
    name: Option<String>,
    /// `mode http` or `mode tcp` in the section itself; `None`: the defaults' mode.
    http: Option<bool>,
}

/// Ends a section: an HTTP backend (or listen) answers in its name after its own rules.
fn close(
    out: &mut Instrumented,
    section: &Section,
    defaults_http: bool,
    push: &mut dyn FnMut(&mut Instrumented, &str, Option<usize>),
) {
    let serves_http = matches!(section.kind.as_str(), "backend" | "listen") && section.http.unwrap_or(defaults_http);
    if let (true, Some(name)) = (serves_http, &section.name)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
    {
        // Trailing blank lines belong before the next section, not inside this one's rules.
        let mut blanks = 0;
        while out.config.ends_with("\n\n") {
            out.config.pop();
            out.origin.pop();
            blanks += 1;
        }
        push(
            out,
            &format!(
                "    http-request return status 200 content-type text/plain string \"backend={name}\" hdr {BACKEND_HEADER} \"{name}\""
            ),
            None,
        );
        for _ in 0..blanks {
            push(out, "", None);
        }
    }
}

fn is_socket(address: &str) -> bool {
    address.starts_with('/') || address.starts_with("unix@") || address.starts_with("abns@")
}

/// The port of `[addr]:port`, `addr:port`, `:port`, `ipv4@addr:port`.
fn tcp_port(address: &str) -> Option<u16> {
    let (_, port) = address.rsplit_once(':')?;
    port.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENDERED: &str = "\
global
    daemon
    user haproxy
    stats socket /var/run/haproxy.sock mode 600 level admin
    maxconn 1000

defaults
    mode http

frontend http
    bind :80
    bind [::]:443 ssl crt /etc/haproxy/ssl/ alpn h2
    bind unix@/var/run/https.sock accept-proxy
    use_backend %[req.hdr(host),map(/etc/haproxy/maps/host.map)]

backend be_web
    http-request redirect scheme https unless { ssl_fc }
    server s1 10.0.0.1:80

backend be_tcp
    mode tcp
    server loop unix@/var/run/https.sock send-proxy-v2
";

    #[test]
    fn binds_move_to_local_ports_dirs_to_scratch_and_http_backends_answer_in_their_name() {
        let mut ports = 40_000..;
        let dirs = [
            ("/etc/haproxy/maps/".to_owned(), "/tmp/s/maps/".to_owned()),
            ("/etc/haproxy/ssl/".to_owned(), "/tmp/s/certs/".to_owned()),
        ];
        let done = instrument(RENDERED, &dirs, Path::new("/tmp/s"), &mut || Ok(ports.next().unwrap())).unwrap();
        let moved = |rendered, local, tls| MovedPort { rendered, local, tls, routes: true };
        assert_eq!(done.ports, [moved(80, 40_000, false), moved(443, 40_001, true)]);
        let config = &done.config;
        for gone in ["daemon", "user haproxy", "stats socket", "/etc/haproxy", "/var/run/https.sock"] {
            assert!(!config.contains(gone), "{gone} left in:\n{config}");
        }
        assert!(config.contains("    bind 127.0.0.1:40001 ssl crt /tmp/s/certs/ alpn h2\n"), "{config}");
        assert!(config.contains("    bind unix@/tmp/s/socket-0.sock accept-proxy\n"), "{config}");
        assert!(
            config.contains("    server loop unix@/tmp/s/socket-0.sock send-proxy-v2\n"),
            "the server follows its socket"
        );
        assert!(config.contains("map(/tmp/s/maps/host.map)"));
        let web = config.find("backend be_web").unwrap();
        let answer = config[web..].find("http-request return status 200").unwrap() + web;
        assert!(
            answer > config.find("server s1").unwrap() && answer < config.find("backend be_tcp").unwrap(),
            "{config}"
        );
        assert_eq!(config.matches("http-request return").count(), 1, "not in a TCP backend:\n{config}");
        // Each line says where it came from: the maxconn line is the rendered file's 5th.
        let maxconn = config.lines().position(|l| l.contains("maxconn")).unwrap();
        assert_eq!(done.origin[maxconn], Some(5));
        assert_eq!(done.origin.len(), config.lines().count());
    }

    #[test]
    fn a_bind_that_cannot_be_moved_is_refused_with_its_line() {
        let error = instrument("frontend f\n    bind fd@3\n", &[], Path::new("/tmp"), &mut || Ok(1)).unwrap_err();
        assert_eq!(error.to_string(), "line 2: cannot move the bind address fd@3");
    }
}
