//! Plan: what a pod needs to go from the files it was last given to the desired ones —
//! nothing, a list of runtime changes (no reload), or a full sync — decided by comparing
//! parsed configurations and map entries, not text.
//!
//! Pure functions over plain data. A runtime plan is chosen only when every difference is one
//! the Runtime API can make and read back:
//! - a runtime-eligible attribute (address, port, weight, enabled/disabled) of a server that
//!   exists on both sides;
//! - a backend section that is gone (it stays, unused, in the running HAProxy until its next
//!   reload: nothing can route to it, since no map entry and no directive names it);
//! - map entries added, changed or removed, in maps that exist on both sides;
//! - a certificate of the same name with new content.
//!
//! Anything else (a new backend, a directive, a general file, a certificate added or removed),
//! or anything this module cannot tell, is a full sync. Every runtime plan also stores the
//! desired files on the pod, so a later reload starts from exactly them.

pub mod config;
pub mod maps;
#[cfg(test)]
mod model;
pub mod slots;

use std::collections::BTreeMap;
use std::fmt;

use crate::files::{FileSet, RenderedFile};
use config::{Section, Server, parse};

/// One change the HAProxy Runtime API can make without a reload.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuntimeAction {
    /// `SetServerAddr <backend> <server> <ip> <port>`.
    SetAddress {
        /// The backend.
        backend: String,
        /// The server.
        server: String,
        /// The new address.
        address: String,
        /// The new port.
        port: String,
    },
    /// `SetServerWeight <backend> <server> <weight>`.
    SetWeight {
        /// The backend.
        backend: String,
        /// The server.
        server: String,
        /// The new weight.
        weight: String,
    },
    /// `SetServerState <backend> <server> ready|maint`.
    SetState {
        /// The backend.
        backend: String,
        /// The server.
        server: String,
        /// Whether it takes traffic.
        ready: bool,
    },
    /// `add server <backend>/<server> <address>:<port> [weight <w>]`: a server the running
    /// backend does not have (a dynamic server, HAProxy 2.6 and later), put in traffic when
    /// `ready` (a new server starts in maintenance).
    AddServer {
        /// The backend.
        backend: String,
        /// The new server's name.
        server: String,
        /// Its address.
        address: String,
        /// Its port.
        port: String,
        /// Its weight, when the configuration gives one.
        weight: Option<String>,
        /// Whether it takes traffic.
        ready: bool,
    },
    /// `del server` + `add server` + `ready`: a server out of traffic (a free slot) taken by
    /// an endpoint at a new address. Three quick runtime commands that do not wait for the
    /// configuration's write, which checks the whole configuration first (the slower path an
    /// address change through `X-Runtime-Actions` takes, and the one a slot whose server HAProxy
    /// will not delete yet takes: its address is changed in place, still without a reload).
    ReplaceServer {
        /// The backend.
        backend: String,
        /// The server.
        server: String,
        /// Its new address.
        address: String,
        /// Its new port.
        port: String,
        /// Its weight, when the configuration gives one.
        weight: Option<String>,
    },
    /// `add map <map> <key> <value>`: a key the running map does not have.
    AddMapEntry {
        /// The map file's name (`host-exact.map`).
        map: String,
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// `set map <map> <key> <value>`: a key whose value changes.
    SetMapEntry {
        /// The map file's name.
        map: String,
        /// The key.
        key: String,
        /// Its new value.
        value: String,
    },
    /// `del map <map> <key>`: a key that goes.
    DeleteMapEntry {
        /// The map file's name.
        map: String,
        /// The key.
        key: String,
    },
    /// `set ssl cert` + `commit ssl cert`: a certificate file of the same name, renewed.
    RenewCertificate {
        /// The certificate file's name.
        name: String,
    },
}

impl RuntimeAction {
    /// What kind of change it is, as `haptic_runtime_actions_total{kind}` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SetAddress { .. } => "server-address",
            Self::SetWeight { .. } => "server-weight",
            Self::SetState { .. } => "server-state",
            Self::AddServer { .. } => "server-add",
            Self::ReplaceServer { .. } => "server-replace",
            Self::AddMapEntry { .. } => "map-add",
            Self::SetMapEntry { .. } => "map-set",
            Self::DeleteMapEntry { .. } => "map-delete",
            Self::RenewCertificate { .. } => "certificate",
        }
    }

    /// The map file it changes, for an entry change.
    pub fn map(&self) -> Option<&str> {
        match self {
            Self::AddMapEntry { map, .. } | Self::SetMapEntry { map, .. } | Self::DeleteMapEntry { map, .. } => {
                Some(map)
            }
            _ => None,
        }
    }

    /// Whether it changes an existing server (sent with the configuration's write, as the
    /// Dataplane API's `X-Runtime-Actions`; a new server is added after that write).
    pub fn is_server_action(&self) -> bool {
        matches!(self, Self::SetAddress { .. } | Self::SetWeight { .. } | Self::SetState { .. })
    }
}

impl fmt::Display for RuntimeAction {
    /// Server actions in the Dataplane API's `X-Runtime-Actions` syntax; the others as the
    /// Runtime API command they become.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SetAddress { backend, server, address, port } => {
                write!(f, "SetServerAddr {backend} {server} {address} {port}")
            }
            Self::SetWeight { backend, server, weight } => write!(f, "SetServerWeight {backend} {server} {weight}"),
            Self::SetState { backend, server, ready } => {
                write!(f, "SetServerState {backend} {server} {}", if *ready { "ready" } else { "maint" })
            }
            Self::AddServer { backend, server, address, port, .. } => {
                write!(f, "add server {backend}/{server} {address}:{port}")
            }
            Self::ReplaceServer { backend, server, address, port, .. } => {
                write!(f, "del server + add server {backend}/{server} {address}:{port}")
            }
            Self::AddMapEntry { map, key, value } => write!(f, "add map {map} {key} {value}"),
            Self::SetMapEntry { map, key, value } => write!(f, "set map {map} {key} {value}"),
            Self::DeleteMapEntry { map, key } => write!(f, "del map {map} {key}"),
            Self::RenewCertificate { name } => write!(f, "set ssl cert {name}"),
        }
    }
}

/// What a pod's HAProxy does with a server's open connections when the server's address or
/// port changes at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressChanges {
    /// Every request after the change goes to the new address (HAProxy 2.7 and later).
    Followed,
    /// A client connection whose request was in flight during the change keeps reusing its
    /// server connection to the old address, for as long as the client keeps it open
    /// (HAProxy 2.6, measured): only a server out of traffic before or after the change may
    /// change address at run time; a serving one needs a reload. Assumed when the version is
    /// not known.
    #[default]
    OnlyOutOfTraffic,
}

impl AddressChanges {
    /// What the HAProxy of this version (`2.6.12-1+deb12u4`, `2.8.25-5cf5d0683`) does.
    pub fn of_version(version: &str) -> Self {
        let mut numbers = version.split(|c: char| !c.is_ascii_digit()).map(str::parse::<u32>);
        match (numbers.next(), numbers.next()) {
            (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= (2, 7) => Self::Followed,
            _ => Self::OnlyOutOfTraffic,
        }
    }
}

/// What a pod needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Exactly what it has.
    NoOp,
    /// The new files written without a reload, and these runtime changes, in this order
    /// (none when only comments or layout differ).
    Runtime(Vec<RuntimeAction>),
    /// A validated push with a reload.
    Full,
}

/// Why a pod was reloaded, as `haptic_reloads_total{reason}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadReason {
    /// Nothing was known of what the pod ran (a new pod, a restart, another leader's term).
    Unverified,
    /// The pod was found changed by someone else.
    Drift,
    /// `haproxy.cfg` changed beyond what the Runtime API can apply (a new backend, say).
    Configuration,
    /// A server's address changed while it served, on a HAProxy that keeps busy connections
    /// on the old address (2.6): the Runtime API could, but not safely.
    ServerAddress,
    /// A map file came or went, or is not plain enough to change entry by entry.
    Map,
    /// A certificate was added or removed.
    Certificate,
    /// A general file (an error page, a crt-list...) changed.
    File,
    /// Nothing differs that calls for one (a retry, a runtime patch that did not take).
    Retry,
}

impl ReloadReason {
    /// Every reason.
    pub const ALL: [ReloadReason; 8] = [
        Self::Unverified,
        Self::Drift,
        Self::Configuration,
        Self::ServerAddress,
        Self::Map,
        Self::Certificate,
        Self::File,
        Self::Retry,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unverified => "unverified",
            Self::Drift => "drift",
            Self::Configuration => "configuration",
            Self::ServerAddress => "server-address",
            Self::Map => "map",
            Self::Certificate => "certificate",
            Self::File => "file",
            Self::Retry => "retry",
        }
    }
}

/// Why a reload takes `pushed` (what the pod is known to run; `None` when unknown) to
/// `desired`: the first kind of difference the Runtime API cannot make (configuration, map,
/// certificate, general file, in that order), or `Retry` when there is none.
pub fn reload_reason(pushed: Option<&FileSet>, desired: &FileSet, address_changes: AddressChanges) -> ReloadReason {
    match pushed {
        None => ReloadReason::Unverified,
        Some(pushed) => runtime_plan(pushed, desired, address_changes).err().unwrap_or(ReloadReason::Retry),
    }
}

/// The header value for the server actions of a runtime plan: actions separated by `;`.
pub fn runtime_actions_header(actions: &[RuntimeAction]) -> String {
    actions.iter().filter(|a| a.is_server_action()).map(ToString::to_string).collect::<Vec<_>>().join(";")
}

/// What a pod that runs `pushed` needs to run `desired`, on a HAProxy that handles address
/// changes as `address_changes` says.
pub fn plan(pushed: &FileSet, desired: &FileSet, address_changes: AddressChanges) -> Plan {
    let same = |a: &RenderedFile, b: &RenderedFile| a.checksum == b.checksum;
    let same_files = |a: &BTreeMap<String, RenderedFile>, b: &BTreeMap<String, RenderedFile>| {
        a.len() == b.len() && a.iter().zip(b).all(|((n1, f1), (n2, f2))| n1 == n2 && same(f1, f2))
    };
    if same(&pushed.haproxy_cfg, &desired.haproxy_cfg)
        && same_files(&pushed.maps, &desired.maps)
        && same_files(&pushed.files, &desired.files)
        && same_files(&pushed.certs, &desired.certs)
    {
        return Plan::NoOp;
    }
    match runtime_plan(pushed, desired, address_changes) {
        Ok(actions) => Plan::Runtime(actions),
        Err(_) => Plan::Full,
    }
}

/// The runtime actions from `pushed` to `desired`, in the order they are safe to run (servers,
/// then map entries that may point at them, then certificates), or why a reload is needed.
fn runtime_plan(
    pushed: &FileSet,
    desired: &FileSet,
    address_changes: AddressChanges,
) -> Result<Vec<RuntimeAction>, ReloadReason> {
    let mut actions = Vec::new();
    if pushed.haproxy_cfg.checksum != desired.haproxy_cfg.checksum {
        let (before, after) = (&pushed.haproxy_cfg.content, &desired.haproxy_cfg.content);
        match runtime_difference(before, after, address_changes) {
            Some(servers) => actions.extend(servers),
            None if runtime_difference(before, after, AddressChanges::Followed).is_some() => {
                return Err(ReloadReason::ServerAddress);
            }
            None => return Err(ReloadReason::Configuration),
        }
    }
    if !pushed.maps.keys().eq(desired.maps.keys()) {
        return Err(ReloadReason::Map);
    }
    let mut removals = Vec::new();
    for ((name, was), is) in pushed.maps.iter().zip(desired.maps.values()) {
        if was.checksum == is.checksum {
            continue;
        }
        let changes = maps::difference(name, &was.content, &is.content).ok_or(ReloadReason::Map)?;
        let (gone, kept): (Vec<_>, Vec<_>) =
            changes.into_iter().partition(|action| matches!(action, RuntimeAction::DeleteMapEntry { .. }));
        actions.extend(kept);
        removals.extend(gone);
    }
    // Every map's additions before any map's removals: a route moving between maps (from
    // exact to prefix, say) is never without an entry.
    actions.extend(removals);
    if !pushed.certs.keys().eq(desired.certs.keys()) {
        return Err(ReloadReason::Certificate);
    }
    for ((name, was), is) in pushed.certs.iter().zip(desired.certs.values()) {
        if was.checksum != is.checksum {
            actions.push(RuntimeAction::RenewCertificate { name: name.clone() });
        }
    }
    let general =
        |files: &BTreeMap<String, RenderedFile>| files.iter().map(|(n, f)| (n.clone(), f.checksum)).collect::<Vec<_>>();
    if general(&pushed.files) != general(&desired.files) {
        return Err(ReloadReason::File);
    }
    Ok(actions)
}

/// The server actions that turn `old` into `new`, or `None` when a reload is needed. Sections
/// are matched by their header; `new` may lack backend sections `old` has (they stay, unused,
/// in the running HAProxy) but must otherwise have the same sections in the same order, since
/// the order of sections is meaningful (a `defaults` section applies to those after it). Only
/// sections whose text differs are parsed.
pub fn runtime_difference(old: &str, new: &str, address_changes: AddressChanges) -> Option<Vec<RuntimeAction>> {
    runtime_difference_of(old, new, address_changes, Parse::WhereChanged)
}

/// Which sections [`runtime_difference_of`] parses: the planner's choice, and every one (what
/// the property test holds it to).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Parse {
    WhereChanged,
    #[cfg(test)]
    Everything,
}

fn runtime_difference_of(
    old: &str,
    new: &str,
    address_changes: AddressChanges,
    parse_where: Parse,
) -> Option<Vec<RuntimeAction>> {
    let (old, new) = (config::split_sections(old), config::split_sections(new));
    if old.preamble != new.preamble && parse(old.preamble).preamble != parse(new.preamble).preamble {
        return None;
    }
    // Dynamic servers (`add server`) do not take `default-server` settings: with any, servers
    // are only ever changed in place.
    let dynamic = !new.sections.iter().any(|s| {
        s.text.contains("default-server") && s.text.lines().skip(1).any(|l| config::first_word(l) == "default-server")
    });
    let mut actions = Vec::new();
    let mut old_sections = old.sections.iter();
    // The load-balancing algorithm the last `defaults` section sets for the sections after it.
    let mut inherited_balance: Option<bool> = None;
    for after_text in &new.sections {
        // Skip the backends that are gone; any other missing section needs a reload.
        let before_text = loop {
            let candidate = old_sections.next()?;
            if candidate.same_header(after_text) {
                break candidate;
            }
            if candidate.kind() != "backend" {
                return None;
            }
        };
        let is_defaults = after_text.kind() == "defaults";
        // The same text is the same section: nothing to do, unless it sets what follows.
        if before_text.text == after_text.text && !is_defaults && parse_where == Parse::WhereChanged {
            continue;
        }
        let (before, after) = (before_text.parse(), after_text.parse());
        let own_balance = balance_takes_dynamic_servers(&after);
        if is_defaults {
            inherited_balance = own_balance;
        }
        // HAProxy adds servers at run time only to backends balancing dynamically.
        let dynamic = dynamic && own_balance.or(inherited_balance).unwrap_or(true);
        actions.extend(section_difference(&before, &after, address_changes, dynamic)?);
    }
    if old_sections.any(|rest| rest.kind() != "backend") {
        return None;
    }
    Some(actions)
}

/// Whether a section's `balance` (when it has one) lets HAProxy add servers at run time:
/// `roundrobin`, `leastconn`, `first` and `random` do; static and hash-based ones do not.
fn balance_takes_dynamic_servers(section: &Section) -> Option<bool> {
    let balance = section.directives.iter().rev().find(|d| d.first().map(String::as_str) == Some("balance"))?;
    Some(matches!(balance.get(1).map(String::as_str), Some("roundrobin" | "leastconn" | "first" | "random")))
}

fn section_difference(
    before: &Section,
    after: &Section,
    address_changes: AddressChanges,
    dynamic: bool,
) -> Option<Vec<RuntimeAction>> {
    // Servers may be added at the end (a backend's slots growing), never removed or reordered.
    if before.directives != after.directives || before.servers.len() > after.servers.len() {
        return None;
    }
    // Only backends' and listen sections' servers are runtime-addressable; a `server` in
    // `peers` or `ring` is something else entirely.
    let runtime_addressable = matches!(before.header.first().map(String::as_str), Some("backend" | "listen"));
    if !runtime_addressable {
        return (before.servers == after.servers).then(Vec::new);
    }
    if before.servers.len() != after.servers.len() && before.header.first().map(String::as_str) != Some("backend") {
        return None;
    }
    let backend = before.header.get(1).cloned().unwrap_or_default();
    let mut actions = Vec::new();
    for (was, is) in before.servers.iter().zip(&after.servers) {
        actions.extend(server_difference(&backend, was, is, address_changes, dynamic)?);
    }
    for added in &after.servers[before.servers.len()..] {
        actions.push(added_server(&backend, before, added).filter(|_| dynamic)?);
    }
    Some(actions)
}

/// A server the backend gains, when `add server` can make it as the configuration says: a new
/// name, an address and port, and nothing but a weight and `disabled` besides (any other
/// keyword, `check` say, would need more than `add server` does).
fn added_server(backend: &str, before: &Section, added: &Server) -> Option<RuntimeAction> {
    if !added.rest.is_empty() || before.servers.iter().any(|server| server.name == added.name) {
        return None;
    }
    Some(RuntimeAction::AddServer {
        backend: backend.to_owned(),
        server: added.name.clone(),
        address: added.address.clone(),
        port: added.port.clone()?,
        weight: added.weight.clone(),
        ready: !added.disabled,
    })
}

fn server_difference(
    backend: &str,
    was: &Server,
    is: &Server,
    address_changes: AddressChanges,
    dynamic: bool,
) -> Option<Vec<RuntimeAction>> {
    // A name or any other keyword changing needs a reload. So does adding or removing a port
    // or weight (the runtime cannot express "no port" or "default weight").
    if was.name != is.name || was.rest != is.rest || was.port.is_some() != is.port.is_some() {
        return None;
    }
    if was.weight.is_some() != is.weight.is_some() {
        return None;
    }
    let moved = was.address != is.address || was.port != is.port;
    if moved && !was.disabled && !is.disabled && address_changes == AddressChanges::OnlyOutOfTraffic {
        return None;
    }
    let (server, backend) = (is.name.clone(), backend.to_owned());
    // A free slot taken: replaced at once, without waiting for the configuration's write.
    if moved
        && was.disabled
        && !is.disabled
        && dynamic
        && is.rest.is_empty()
        && let Some(port) = is.port.clone()
    {
        return Some(vec![RuntimeAction::ReplaceServer {
            backend,
            server,
            address: is.address.clone(),
            port,
            weight: is.weight.clone(),
        }]);
    }
    let mut actions = Vec::new();
    // A server leaving traffic leaves it first: moved while still ready, it would take requests
    // at its new address (a free slot's placeholder) until the state change, and a request
    // sent there fails after its retries.
    let leaves_traffic = !was.disabled && is.disabled;
    if leaves_traffic {
        actions.push(RuntimeAction::SetState { backend: backend.clone(), server: server.clone(), ready: false });
    }
    if moved {
        actions.push(RuntimeAction::SetAddress {
            backend: backend.clone(),
            server: server.clone(),
            address: is.address.clone(),
            port: is.port.clone().unwrap_or_default(),
        });
    }
    if let Some(weight) = is.weight.as_ref().filter(|_| was.weight != is.weight) {
        actions.push(RuntimeAction::SetWeight {
            backend: backend.clone(),
            server: server.clone(),
            weight: weight.clone(),
        });
    }
    if was.disabled && !is.disabled {
        actions.push(RuntimeAction::SetState { backend, server, ready: true });
    }
    Some(actions)
}

#[cfg(test)]
mod reload_reasons {
    use super::*;

    fn files(config: &str, map: &str) -> FileSet {
        FileSet {
            haproxy_cfg: RenderedFile::new(config),
            maps: BTreeMap::from([("host.map".into(), RenderedFile::new(map))]),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        }
    }

    #[test]
    fn each_reload_names_the_kind_of_difference_that_needed_it() {
        let base = files("backend be\n    server s1 10.0.0.1:80\n", "a be\n");
        let safe = AddressChanges::Followed;
        assert_eq!(reload_reason(None, &base, safe), ReloadReason::Unverified);
        assert_eq!(reload_reason(Some(&base), &files("global\n", "a be\n"), safe), ReloadReason::Configuration);
        assert_eq!(
            reload_reason(Some(&base), &files("backend be\n    server s1 10.0.0.1:80\n", "a be\na other\n"), safe),
            ReloadReason::Map,
            "a map HAProxy would read its own way"
        );
        let moved = files("backend be\n    server s1 10.0.0.2:80\n", "a be\n");
        assert_eq!(reload_reason(Some(&base), &moved, AddressChanges::OnlyOutOfTraffic), ReloadReason::ServerAddress);
        let mut with_file = base.clone();
        with_file.files.insert("crt-list.txt".into(), RenderedFile::new("x.pem\n"));
        assert_eq!(reload_reason(Some(&base), &with_file, safe), ReloadReason::File);
        let mut with_cert = base.clone();
        with_cert.certs.insert("x.pem".into(), RenderedFile::sensitive("pem"));
        assert_eq!(reload_reason(Some(&base), &with_cert, safe), ReloadReason::Certificate);
        assert_eq!(reload_reason(Some(&base), &base, safe), ReloadReason::Retry);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::*;

    const BASE: &str = "global\n    maxconn 1000\n\ndefaults\n    mode http\n    timeout client 30s\n\n\
frontend http\n    bind :80\n    default_backend app\n\nbackend app\n    balance roundrobin\n\
    server s1 10.0.0.1:8080 weight 10 check\n    server s2 10.0.0.2:8080 weight 10 check\n    \
server s3 10.0.0.3:8080 weight 10 check disabled\n";

    fn only_config(text: &str) -> FileSet {
        FileSet {
            haproxy_cfg: RenderedFile::new(text),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        }
    }

    fn plan_configs(old: &str, new: &str, address_changes: AddressChanges) -> Plan {
        plan(&only_config(old), &only_config(new), address_changes)
    }

    fn plan_text(old: &str, new: &str) -> Plan {
        plan_configs(old, new, AddressChanges::Followed)
    }

    #[test]
    fn identical_text_is_a_no_op_and_comments_need_no_reload() {
        assert_eq!(plan_text(BASE, BASE), Plan::NoOp);
        assert_eq!(plan_text(BASE, &format!("# _version=9\n{BASE}    # trailing note\n")), Plan::Runtime(vec![]));
    }

    #[test]
    fn address_weight_and_state_of_existing_servers_are_runtime_changes() {
        let new = BASE
            .replace("s1 10.0.0.1:8080 weight 10", "s1 10.0.0.9:9090 weight 10")
            .replace("s2 10.0.0.2:8080 weight 10", "s2 10.0.0.2:8080 weight 50")
            .replace("weight 10 check disabled", "weight 10 check");
        let Plan::Runtime(actions) = plan_text(BASE, &new) else { panic!("expected a runtime plan") };
        assert_eq!(
            runtime_actions_header(&actions),
            "SetServerAddr app s1 10.0.0.9 9090;SetServerWeight app s2 50;SetServerState app s3 ready"
        );
    }

    #[test]
    fn a_server_freed_leaves_traffic_before_it_moves_and_one_taken_moves_before_it_enters() {
        // Moved first, a ready server took requests at the free slot's placeholder until its
        // state changed: a 503 after three refused connections (issue #45, defect 12's test).
        let freed = BASE.replace("s1 10.0.0.1:8080 weight 10", "s1 127.0.0.1:1 weight 10 disabled");
        let Plan::Runtime(actions) = plan_text(BASE, &freed) else { panic!("expected a runtime plan") };
        assert_eq!(runtime_actions_header(&actions), "SetServerState app s1 maint;SetServerAddr app s1 127.0.0.1 1");
        let taken = BASE.replace("s3 10.0.0.3:8080 weight 10 check disabled", "s3 10.0.0.7:8080 weight 10 check");
        let Plan::Runtime(actions) = plan_text(BASE, &taken) else { panic!("expected a runtime plan") };
        assert_eq!(runtime_actions_header(&actions), "SetServerAddr app s3 10.0.0.7 8080;SetServerState app s3 ready");
    }

    #[test]
    fn everything_else_is_a_full_sync() {
        let cases = [
            ("a timeout", BASE.replace("timeout client 30s", "timeout client 31s")),
            ("a new server with options", BASE.replace("disabled\n", "disabled\n    server s4 10.0.0.4:8080 check\n")),
            ("a removed server", BASE.replace("    server s2 10.0.0.2:8080 weight 10 check\n", "")),
            ("a renamed server", BASE.replace("server s2 ", "server s9 ")),
            (
                "reordered servers",
                BASE.replace("s1 10.0.0.1", "sX 10.0.0.1")
                    .replace("s2 10.0.0.2", "s1 10.0.0.2")
                    .replace("sX 10.0.0.1", "s2 10.0.0.1"),
            ),
            (
                "a server option",
                BASE.replace("10.0.0.1:8080 weight 10 check", "10.0.0.1:8080 weight 10 check inter 5s"),
            ),
            ("a weight dropped", BASE.replace("s1 10.0.0.1:8080 weight 10 check", "s1 10.0.0.1:8080 check")),
            ("a new backend", format!("{BASE}\nbackend other\n    server o1 10.1.0.1:80\n")),
            ("a global setting", BASE.replace("maxconn 1000", "maxconn 2000")),
            ("a frontend rule", BASE.replace("bind :80", "bind :80\n    http-request deny")),
            ("a port dropped", BASE.replace("s1 10.0.0.1:8080", "s1 10.0.0.1")),
        ];
        let with_peers = format!("{BASE}\npeers mesh\n    server p1 10.2.0.1:1024\n");
        assert_eq!(
            plan_text(&with_peers, &with_peers.replace("10.2.0.1:1024", "10.2.0.2:1024")),
            Plan::Full,
            "a peer's address"
        );
        let with_ring = format!("{BASE}\nring logs\n    server collector 10.3.0.1:514\n");
        assert_eq!(plan_text(&with_ring, &with_ring.replace("10.3.0.1", "10.3.0.9")), Plan::Full, "a ring's server");
        for (what, new) in cases {
            assert_eq!(plan_text(BASE, &new), Plan::Full, "{what}");
        }
    }

    #[test]
    fn servers_added_at_the_end_of_a_backend_are_dynamic_servers() {
        let grown = BASE.replace(
            "disabled\n",
            "disabled\n    server s4 10.0.0.4:8080 weight 5\n    server s5 127.0.0.1:1 disabled\n",
        );
        let Plan::Runtime(actions) = plan_text(BASE, &grown) else { panic!("servers added at run time") };
        assert_eq!(
            actions,
            [
                RuntimeAction::AddServer {
                    backend: "app".into(),
                    server: "s4".into(),
                    address: "10.0.0.4".into(),
                    port: "8080".into(),
                    weight: Some("5".into()),
                    ready: true,
                },
                RuntimeAction::AddServer {
                    backend: "app".into(),
                    server: "s5".into(),
                    address: "127.0.0.1".into(),
                    port: "1".into(),
                    weight: None,
                    ready: false,
                },
            ]
        );
        assert_eq!(runtime_actions_header(&actions), "", "not an X-Runtime-Actions action");
        // Not in a listen section, not before the others, not under a name already there.
        let listen = format!("{BASE}\nlisten l\n    bind :81\n");
        let listen_grown = format!("{listen}    server l1 10.0.0.9:80\n");
        assert_eq!(plan_text(&listen, &listen_grown), Plan::Full);
        let first = BASE.replace("server s1 ", "server s0 10.0.0.4:8080\n    server s1 ");
        assert_eq!(plan_text(BASE, &first), Plan::Full);
        let twice = BASE.replace("disabled\n", "disabled\n    server s2 10.0.0.4:8080\n");
        assert_eq!(plan_text(BASE, &twice), Plan::Full);
    }

    #[test]
    fn a_free_slot_taken_is_a_replaced_server_unless_default_server_settings_apply() {
        let free = "backend app\n    server s1 10.0.0.1:80\n    server s2 127.0.0.1:1 disabled\n";
        let taken = free.replace("127.0.0.1:1 disabled", "10.0.0.2:8080");
        assert_eq!(
            plan_text(free, &taken),
            Plan::Runtime(vec![RuntimeAction::ReplaceServer {
                backend: "app".into(),
                server: "s2".into(),
                address: "10.0.0.2".into(),
                port: "8080".into(),
                weight: None,
            }])
        );
        let with_defaults = |text: &str| format!("defaults\n    default-server inter 2s\n{text}");
        let Plan::Runtime(actions) = plan_text(&with_defaults(free), &with_defaults(&taken)) else {
            panic!("still a runtime change")
        };
        assert_eq!(runtime_actions_header(&actions), "SetServerAddr app s2 10.0.0.2 8080;SetServerState app s2 ready");
        let grown = format!("{free}    server s3 10.0.0.3:80\n");
        assert_eq!(plan_text(&with_defaults(free), &with_defaults(&grown)), Plan::Full, "no dynamic servers");
        // Nor where the backend balances by a hash, itself or from its defaults.
        let hashed = |text: &str| text.replace("backend app\n", "backend app\n    balance source\n");
        assert_eq!(plan_text(&hashed(free), &hashed(&grown)), Plan::Full);
        let Plan::Runtime(actions) = plan_text(&hashed(free), &hashed(&taken)) else { panic!("in place") };
        assert_eq!(runtime_actions_header(&actions), "SetServerAddr app s2 10.0.0.2 8080;SetServerState app s2 ready");
        let inherited = |text: &str| format!("defaults\n    balance uri\n{text}");
        assert_eq!(plan_text(&inherited(free), &inherited(&grown)), Plan::Full);
        let overridden = |text: &str| inherited(text).replace("backend app\n", "backend app\n    balance leastconn\n");
        assert!(matches!(plan_text(&overridden(free), &overridden(&grown)), Plan::Runtime(_)));
    }

    #[test]
    fn a_general_file_change_is_a_full_sync_even_with_the_same_config() {
        let mut old = only_config(BASE);
        old.files.insert("503.http".into(), RenderedFile::new("a"));
        let mut new = old.clone();
        new.files.insert("503.http".into(), RenderedFile::new("b"));
        assert_eq!(plan(&old, &new, AddressChanges::Followed), Plan::Full);
    }

    #[test]
    fn on_haproxy_2_6_a_serving_server_moves_only_with_a_reload() {
        assert_eq!(AddressChanges::of_version("2.6.12-1+deb12u4"), AddressChanges::OnlyOutOfTraffic);
        assert_eq!(AddressChanges::of_version("2.8.25-5cf5d0683"), AddressChanges::Followed);
        assert_eq!(AddressChanges::of_version("3.2.0"), AddressChanges::Followed);
        assert_eq!(AddressChanges::of_version("garbage"), AddressChanges::OnlyOutOfTraffic);
        let strict = |old: &str, new: &str| plan_configs(old, new, AddressChanges::OnlyOutOfTraffic);
        // s1 serves before and after: its open connections would stay on the old address.
        assert_eq!(strict(BASE, &BASE.replace("10.0.0.1:8080", "10.0.0.9:8080")), Plan::Full);
        assert_eq!(strict(BASE, &BASE.replace("10.0.0.1:8080", "10.0.0.1:9090")), Plan::Full);
        // s3 is disabled: it takes its new address and then traffic (the slots' scale-up).
        let enabled = BASE.replace("10.0.0.3:8080 weight 10 check disabled", "10.0.0.7:8080 weight 10 check");
        let Plan::Runtime(actions) = strict(BASE, &enabled) else { panic!("a slot taken at run time") };
        assert_eq!(runtime_actions_header(&actions), "SetServerAddr app s3 10.0.0.7 8080;SetServerState app s3 ready");
        // s2 leaves traffic: its address may change with it (the slots' scale-down).
        let disabled = BASE.replace("10.0.0.2:8080 weight 10 check", "127.0.0.1:1 weight 10 check disabled");
        assert!(matches!(strict(BASE, &disabled), Plan::Runtime(_)));
        // Weights and states alone move nothing.
        assert!(matches!(
            strict(BASE, &BASE.replace("s2 10.0.0.2:8080 weight 10", "s2 10.0.0.2:8080 weight 50")),
            Plan::Runtime(_)
        ));
    }

    fn server_line() -> impl Strategy<Value = (u8, u16, u8, bool)> {
        (1u8..255, 1u16..65535, 1u8..=255, any::<bool>())
    }

    fn config_with(servers: &[(u8, u16, u8, bool)], extra: &str) -> String {
        let mut text = String::from("global\n    maxconn 1000\n\nbackend app\n    balance roundrobin\n");
        text.push_str(extra);
        for (i, (ip, port, weight, disabled)) in servers.iter().enumerate() {
            text.push_str(&format!(
                "    server s{i} 10.0.0.{ip}:{port} weight {weight} check{}\n",
                if *disabled { " disabled" } else { "" }
            ));
        }
        text
    }

    #[test]
    fn an_unchanged_defaults_section_still_sets_the_balance_of_changed_backends() {
        let before = "defaults\n    balance source\n\nbackend app\n    server s1 10.0.0.1:80\n";
        let after = format!("{before}    server s2 10.0.0.2:80\n");
        // Static balancing takes no dynamic server: the new server needs a reload.
        assert_eq!(runtime_difference(before, &after, AddressChanges::Followed), None);
        let roundrobin = |text: &str| text.replace("source", "roundrobin");
        assert!(runtime_difference(&roundrobin(before), &roundrobin(&after), AddressChanges::Followed).is_some());
    }

    /// A section of a random configuration: its kind (0 defaults, 1 frontend, else a backend),
    /// a `balance` choice, whether it has a `default-server`, and its servers.
    type SectionSpec = (u8, u8, bool, Vec<(u8, u16, u8, bool)>);

    fn section_spec() -> impl Strategy<Value = SectionSpec> {
        (0u8..5, 0u8..3, proptest::bool::weighted(0.1), proptest::collection::vec(server_line(), 0..4))
    }

    fn config_of(sections: &[SectionSpec]) -> String {
        let mut text = String::from("# _version=1\nglobal\n    maxconn 1000\n");
        for (i, (kind, balance, default_server, servers)) in sections.iter().enumerate() {
            let header = match kind {
                0 => "defaults".to_owned(),
                1 => format!("frontend f{i}"),
                _ => format!("backend b{i}"),
            };
            text.push_str(&format!("\n{header}\n"));
            match balance {
                0 => {}
                1 => text.push_str("    balance roundrobin\n"),
                _ => text.push_str("    balance source\n"),
            }
            if *default_server {
                text.push_str("    default-server check\n");
            }
            for (n, (ip, port, weight, disabled)) in servers.iter().enumerate() {
                let state = if *disabled { " disabled" } else { "" };
                text.push_str(&format!("    server s{n} 10.0.0.{ip}:{port} weight {weight}{state}\n"));
            }
        }
        text
    }

    proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        // The differences it looks for need a few sections in the right order: many cases,
        // each a few microseconds.
        ..ProptestConfig::with_cases(4096)
    })]

        /// Parsing only the sections whose text changed decides exactly as parsing everything:
        /// for random multi-section configurations and random edits of them (servers moved,
        /// added or removed, sections dropped, balances and `default-server` lines changed).
        #[test]
        fn parsing_only_changed_sections_decides_as_parsing_all(
            before in proptest::collection::vec(section_spec(), 1..6),
            edits in proptest::collection::vec((0usize..6, section_spec(), 0u8..6), 0..4),
        ) {
            let mut after = before.clone();
            for (at, replacement, how) in edits {
                if after.is_empty() { break; }
                let at = at % after.len();
                match how {
                    0 => { after.remove(at); }
                    1 => after[at] = replacement,
                    2 => after[at].3 = replacement.3,
                    3 => after[at].1 = replacement.1,
                    // A server added at the end (a dynamic server, if the balance allows).
                    4 => after[at].3.extend(replacement.3.first()),
                    // A disabled server taking traffic at a new address (a free slot taken).
                    _ => if let (Some(server), Some(new)) = (after[at].3.first_mut(), replacement.3.first()) {
                        *server = (new.0, new.1, server.2, !server.3);
                    },
                }
            }
            let (old, new) = (config_of(&before), config_of(&after));
            for changes in [AddressChanges::Followed, AddressChanges::OnlyOutOfTraffic] {
                prop_assert_eq!(
                    runtime_difference_of(&old, &new, changes, Parse::WhereChanged),
                    runtime_difference_of(&old, &new, changes, Parse::Everything)
                );
            }
        }
    }

    proptest! {
    #![proptest_config(ProptestConfig {
        // Regressions live beside the source, not in a directory at the top of the project.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(256)
    })]

        /// Changing only addresses, ports, weights and states of the same servers is always a
        /// runtime plan whose actions, applied, give exactly the new attributes.
        #[test]
        fn runtime_only_changes_are_runtime_plans(
            before in proptest::collection::vec(server_line(), 1..8),
            seed in proptest::collection::vec(server_line(), 8),
        ) {
            let after: Vec<_> = before.iter().zip(&seed).map(|(_, s)| *s).collect();
            let plan = plan_text(&config_with(&before, ""), &config_with(&after, ""));
            if before == after {
                prop_assert_eq!(plan, Plan::NoOp);
            } else {
                let Plan::Runtime(actions) = plan else { return Err(TestCaseError::fail("expected runtime")) };
                for (i, ((ip0, port0, w0, d0), (ip1, port1, w1, d1))) in before.iter().zip(&after).enumerate() {
                    let name = format!("s{i}");
                    let has = |a: &RuntimeAction| match a {
                        RuntimeAction::SetAddress { server, .. } | RuntimeAction::SetWeight { server, .. }
                        | RuntimeAction::SetState { server, .. } => *server == name,
                        _ => false,
                    };
                    let count = actions.iter().filter(|a| has(a)).count();
                    let expected = usize::from((ip0, port0) != (ip1, port1)) + usize::from(w0 != w1) + usize::from(d0 != d1);
                    prop_assert_eq!(count, expected);
                }
            }
        }

        /// For HAProxy 2.6, a runtime plan never moves a server that serves before and after,
        /// and every other runtime-only change still is one.
        #[test]
        fn on_2_6_only_servers_out_of_traffic_move_at_run_time(
            before in proptest::collection::vec(server_line(), 1..8),
            seed in proptest::collection::vec(server_line(), 8),
        ) {
            let after: Vec<_> = before.iter().zip(&seed).map(|(_, s)| *s).collect();
            let plan = plan_configs(&config_with(&before, ""), &config_with(&after, ""), AddressChanges::OnlyOutOfTraffic);
            let serving_moved = before.iter().zip(&after)
                .any(|((ip0, port0, _, d0), (ip1, port1, _, d1))| (ip0, port0) != (ip1, port1) && !d0 && !d1);
            match plan {
                Plan::Full => prop_assert!(serving_moved),
                Plan::NoOp => prop_assert_eq!(&before, &after),
                Plan::Runtime(actions) => {
                    prop_assert!(!serving_moved);
                    for action in &actions {
                        if let RuntimeAction::SetAddress { server, .. } = action {
                            let i: usize = server[1..].parse().unwrap_or(usize::MAX);
                            prop_assert!(before[i].3 || after[i].3, "{} moved while serving", server);
                        }
                    }
                }
            }
        }

        /// Any change to anything else (a directive added anywhere, a server added or removed)
        /// is never called runtime-eligible.
        #[test]
        fn structural_changes_are_never_runtime(
            servers in proptest::collection::vec(server_line(), 1..6),
            directive in "(timeout (client|server|connect) [1-9][0-9]?s|option (httplog|forwardfor)|http-request deny)",
            drop_one in any::<bool>(),
        ) {
            let old = config_with(&servers, "");
            let new = if drop_one && servers.len() > 1 {
                config_with(&servers[1..], "")
            } else {
                config_with(&servers, &format!("    {directive}\n"))
            };
            prop_assert_eq!(plan_text(&old, &new), Plan::Full);
        }
    }
}
