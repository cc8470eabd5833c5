//! [`build`]: listeners, attachment, references, precedence, and the status of each.

use std::collections::{BTreeMap, BTreeSet};

use super::hostnames;
use super::resources::{self, BackendRef, GROUP, Gateway, Listener, ParentReference, Route, RouteMatch, RouteRule};
use super::status::{Body, Condition, ListenerStatus, ObjectStatus, ParentStatus};
use super::{
    ConditionalRule, Frontend, HeaderChanges, HostKind, Inputs, ListenerModel, MapEntry, Model, PathRewrite,
    PortNumber, Protocol, RedirectModel, RuleBackend, SecretKey, ServiceRef, ServiceTarget, ValueCondition,
    WeightedRef,
};
use crate::config::GatewaySettings;

/// The route kinds, in the order their routes are considered.
const HTTP_ROUTE: &str = "HTTPRoute";
const GRPC_ROUTE: &str = "GRPCRoute";
const TLS_ROUTE: &str = "TLSRoute";
const TCP_ROUTE: &str = "TCPRoute";

/// The backend a rule goes to when it has no valid one: it answers 500, as the spec asks.
pub const INVALID_BACKEND: &str = "gw_invalid";
/// The backend a TLS or TCP rule goes to when it has no valid one: it closes the connection,
/// which is how a stream refuses (an HTTP 500 would reach a TLS client as garbage).
pub const INVALID_STREAM_BACKEND: &str = "gw_invalid_stream";

/// One listener being judged.
struct ListenerState<'a> {
    gateway: usize,
    listener: &'a Listener,
    id: String,
    /// The port the spec gives it (what routes' `parentRef.port` names).
    port: u16,
    /// The port its frontend binds on the pods: `port`, or a fleet port of its Gateway's own.
    frontend_port: u16,
    hostname: Option<String>,
    protocol: Option<Protocol>,
    kinds: Vec<&'static str>,
    certificates: Vec<SecretKey>,
    /// Why it cannot be served (Accepted=False), if it cannot.
    refused: Option<(&'static str, String)>,
    /// ResolvedRefs=False, if a reference is wrong.
    unresolved: Option<(&'static str, String)>,
    /// Conflicted=True, if it is.
    conflict: Option<(&'static str, String)>,
    attached: i64,
}

impl ListenerState<'_> {
    fn served(&self) -> bool {
        self.refused.is_none() && self.conflict.is_none() && self.protocol.is_some()
    }

    /// Whether routes attach to it: a served listener, or one only its certificates keep from
    /// being served (the spec counts its routes, which are served once a certificate is there).
    fn attachable(&self) -> bool {
        self.served()
            || (self.conflict.is_none() && self.protocol.is_some() && matches!(self.refused, Some((NO_CERTIFICATE, _))))
    }
}

/// The reason an HTTPS listener without one usable certificate is refused.
const NO_CERTIFICATE: &str = "Invalid";

fn default_kinds(protocol: Protocol) -> Vec<&'static str> {
    match protocol {
        Protocol::Http | Protocol::Https => vec![HTTP_ROUTE, GRPC_ROUTE],
        Protocol::TlsPassthrough => vec![TLS_ROUTE],
        Protocol::Tcp => vec![TCP_ROUTE],
    }
}

fn is_core(group: Option<&str>) -> bool {
    group.is_none_or(str::is_empty)
}

/// Whether a ReferenceGrant in `to_namespace` lets a `from_kind` in `from_namespace` refer to
/// the `to_kind` (core group) named `to_name`.
fn granted(
    inputs: &Inputs,
    from_kind: &str,
    from_namespace: &str,
    to_kind: &str,
    to_namespace: &str,
    to_name: &str,
) -> bool {
    inputs.grants.iter().filter(|grant| grant.metadata.namespace == to_namespace).any(|grant| {
        grant
            .spec
            .from
            .iter()
            .any(|from| from.group == GROUP && from.kind == from_kind && from.namespace == from_namespace)
            && grant.spec.to.iter().any(|to| {
                to.group.is_empty() && to.kind == to_kind && to.name.as_deref().is_none_or(|name| name == to_name)
            })
    })
}

/// A printable name part (DNS labels and subdomains).
fn plain(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn valid_hostname(host: &str) -> bool {
    crate::syntax::is_hostname(host)
}

fn valid_path(path: &str) -> bool {
    crate::syntax::url_path_flaw(path).is_none()
}

fn valid_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn printable(text: &str) -> bool {
    crate::syntax::forbidden_char(text).is_none()
}

/// Every listener of the served Gateways, judged: whether it can be served, what it refers to,
/// and whether it conflicts with another. Within a Gateway, indistinct listeners all conflict
/// (the spec: none is picked as the winner). Across Gateways sharing the pods' ports, the older
/// Gateway keeps a contested port or hostname; with `gatewayServices` each Gateway has ports of
/// its own, so Gateways never contend.
fn judge_listeners<'a>(
    settings: &GatewaySettings,
    inputs: &Inputs,
    gateways: &[&'a Gateway],
) -> Vec<ListenerState<'a>> {
    let mut states = Vec::new();
    // Frontend port → (protocol, hostnames taken) across every served Gateway.
    let mut ports: BTreeMap<u16, (Protocol, Vec<Option<String>>)> = BTreeMap::new();
    let mut fleet = settings.gateway_services.as_ref().map(|services| FleetPorts::new(settings, services));
    for (index, gateway) in gateways.iter().enumerate() {
        let mut own: Vec<ListenerState<'a>> = gateway
            .spec
            .listeners
            .iter()
            .map(|listener| {
                let mut state = judge_listener(settings, index, gateway, listener);
                if let Some(protocol) = state.protocol {
                    judge_route_kinds(&mut state, protocol);
                    if protocol == Protocol::Https {
                        judge_certificates(inputs, &gateway.metadata.namespace, &mut state);
                    }
                }
                state
            })
            .collect();
        if let Some(fleet) = fleet.as_mut() {
            fleet.assign(gateway, &mut own);
        }
        judge_indistinct(&mut own);
        for mut state in own {
            claim_port(&mut ports, &mut state);
            states.push(state);
        }
    }
    states
}

/// Listeners of one Gateway that cannot be told apart: on one port with different protocols
/// (`ProtocolConflict`), or with the same protocol and hostname (`HostnameConflict`; any two
/// TCP listeners). Every one of them is conflicted.
fn judge_indistinct(own: &mut [ListenerState<'_>]) {
    let servable: Vec<(usize, u16, Protocol, Option<String>)> = own
        .iter()
        .enumerate()
        .filter(|(_, s)| s.refused.is_none())
        .filter_map(|(i, s)| s.protocol.map(|p| (i, s.port, p, s.hostname.clone())))
        .collect();
    for &(i, port, protocol, ref hostname) in &servable {
        let others = servable.iter().filter(|(j, p, ..)| *j != i && *p == port);
        let mut conflict = None;
        for (_, _, other_protocol, other_hostname) in others {
            if *other_protocol != protocol {
                conflict =
                    Some(("ProtocolConflict", format!("another listener on port {port} speaks another protocol")));
                break;
            }
            if protocol == Protocol::Tcp || other_hostname == hostname {
                let why = format!("another listener of this Gateway on port {port} has the same hostname");
                conflict.get_or_insert(("HostnameConflict", why));
            }
        }
        if conflict.is_some() {
            own[i].conflict = conflict;
        }
    }
}

/// The fleet ports handed to Gateways' listeners (`gatewayServices`): each (Gateway, listener
/// port) gets a port of the range picked by a hash of its names, the next free one when taken
/// by an older Gateway, so a Gateway keeps its ports as others come and go.
struct FleetPorts {
    first: u16,
    span: u32,
    taken: BTreeSet<u16>,
}

impl FleetPorts {
    fn new(settings: &GatewaySettings, services: &crate::config::GatewayServices) -> Self {
        let (first, last) = (services.first_port.min(services.last_port), services.first_port.max(services.last_port));
        let mut taken: BTreeSet<u16> = settings.reserved_ports.iter().copied().collect();
        taken.extend(settings.shared_http_port);
        Self { first, span: u32::from(last - first) + 1, taken }
    }

    /// Gives each servable listener of `gateway` its Gateway's fleet port for its port; a
    /// listener left without one (the range is full) is refused.
    fn assign(&mut self, gateway: &Gateway, own: &mut [ListenerState<'_>]) {
        let mut given: BTreeMap<u16, Option<u16>> = BTreeMap::new();
        for state in own.iter_mut().filter(|s| s.refused.is_none()) {
            let port = state.port;
            let fleet_port = *given.entry(port).or_insert_with(|| self.take(gateway, port));
            match fleet_port {
                Some(fleet_port) => state.frontend_port = fleet_port,
                None => {
                    let why = format!("no fleet port is left for port {port} (gatewayServices' range is full)");
                    state.refused = Some(("PortUnavailable", why));
                }
            }
        }
    }

    fn take(&mut self, gateway: &Gateway, port: u16) -> Option<u16> {
        let meta = &gateway.metadata;
        let start = stable_hash(&format!("{}/{}/{port}", meta.namespace, meta.name)) % u64::from(self.span);
        let start = u32::try_from(start).unwrap_or(0);
        let free = (0..self.span)
            .map(|step| self.first.saturating_add(u16::try_from((start + step) % self.span).unwrap_or(0)))
            .find(|candidate| !self.taken.contains(candidate))?;
        self.taken.insert(free);
        Some(free)
    }
}

/// FNV-1a: a hash that stays the same across builds and platforms (fleet ports must).
pub fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// A listener's protocol, name, port and hostname, judged on their own.
fn judge_listener<'a>(
    settings: &GatewaySettings,
    index: usize,
    gateway: &Gateway,
    listener: &'a Listener,
) -> ListenerState<'a> {
    let meta = &gateway.metadata;
    let mut state = ListenerState {
        gateway: index,
        listener,
        id: format!("{}_{}_{}", meta.namespace, meta.name, listener.name),
        port: u16::try_from(listener.port).unwrap_or(0),
        frontend_port: u16::try_from(listener.port).unwrap_or(0),
        hostname: listener.hostname.as_ref().map(|h| h.to_ascii_lowercase()),
        protocol: None,
        kinds: Vec::new(),
        certificates: Vec::new(),
        refused: None,
        unresolved: None,
        conflict: None,
        attached: 0,
    };
    let mode = listener.tls.as_ref().and_then(|tls| tls.mode.clone()).unwrap_or_else(|| "Terminate".into());
    state.protocol = match (listener.protocol.as_str(), mode.as_str()) {
        ("HTTP", _) => Some(Protocol::Http),
        ("HTTPS", "Terminate") => Some(Protocol::Https),
        ("TLS", "Passthrough") => Some(Protocol::TlsPassthrough),
        ("TCP", _) => Some(Protocol::Tcp),
        ("HTTPS", _) | ("TLS", _) => {
            let why = format!("protocol {} with TLS mode {mode} is not supported", listener.protocol);
            state.refused = Some(("UnsupportedValue", why));
            None
        }
        (other, _) => {
            state.refused = Some(("UnsupportedProtocol", format!("protocol {other} is not supported")));
            None
        }
    };
    if !(plain(&meta.namespace) && plain(&meta.name) && plain(&listener.name)) {
        state.refused = Some(("UnsupportedValue", "the Gateway's or listener's name cannot name a listener".into()));
    }
    // The shared port takes HTTP listeners only; other reserved ports take none. With
    // Gateway Services, listeners bind fleet ports, so no port of theirs is taken.
    let taken = if settings.gateway_services.is_some() {
        false
    } else if settings.shared_http_port == Some(state.port) {
        state.protocol != Some(Protocol::Http)
    } else {
        settings.reserved_ports.contains(&state.port)
    };
    if state.port == 0 || taken {
        let why = format!("port {} is taken by the rest of the configuration", listener.port);
        state.refused = Some(("PortUnavailable", why));
    }
    if let Some(host) = &state.hostname
        && !valid_hostname(host)
    {
        state.refused = Some(("UnsupportedValue", "the hostname cannot be served".into()));
    }
    state
}

/// The route kinds a listener allows: those it asks for that its protocol takes.
fn judge_route_kinds(state: &mut ListenerState<'_>, protocol: Protocol) {
    let listener = state.listener;
    let allowed = default_kinds(protocol);
    let asked = listener.allowed_routes.as_ref().map(|a| a.kinds.clone()).unwrap_or_default();
    if asked.is_empty() {
        state.kinds = allowed;
        return;
    }
    for kind in &asked {
        let group_ok = kind.group.as_deref().is_none_or(|g| g == GROUP);
        match allowed.iter().find(|k| **k == kind.kind) {
            Some(k) if group_ok => state.kinds.push(k),
            _ => {
                let why = format!("route kind {} is not supported on a {} listener", kind.kind, listener.protocol);
                state.unresolved = Some(("InvalidRouteKinds", why));
            }
        }
    }
}

/// An HTTPS listener's certificates: each usable one kept, the last problem reported; none
/// usable refuses the listener.
fn judge_certificates(inputs: &Inputs, gateway_namespace: &str, state: &mut ListenerState<'_>) {
    for reference in state.listener.tls.iter().flat_map(|tls| &tls.certificate_refs) {
        let namespace = reference.namespace.clone().unwrap_or_else(|| gateway_namespace.to_owned());
        let kind = reference.kind.as_deref().unwrap_or("Secret");
        let name = &reference.name;
        let problem = if !is_core(reference.group.as_deref()) || kind != "Secret" {
            Some(("InvalidCertificateRef", format!("certificate {name} is not a Secret")))
        } else if namespace != gateway_namespace
            && !granted(inputs, "Gateway", gateway_namespace, "Secret", &namespace, name)
        {
            Some(("RefNotPermitted", format!("no ReferenceGrant lets this Gateway use Secret {namespace}/{name}")))
        } else {
            match inputs.secrets.get(&(namespace.clone(), name.clone())) {
                Some(secret) if secret.data.contains_key("tls.crt") && secret.data.contains_key("tls.key") => None,
                Some(_) => {
                    Some(("InvalidCertificateRef", format!("Secret {namespace}/{name} holds no certificate and key")))
                }
                None => Some(("InvalidCertificateRef", format!("Secret {namespace}/{name} does not exist"))),
            }
        };
        match problem {
            Some(problem) => state.unresolved = Some(problem),
            None => state.certificates.push(SecretKey { namespace, name: name.clone() }),
        }
    }
    if state.certificates.is_empty() && state.refused.is_none() {
        state.refused = Some((NO_CERTIFICATE, "no usable certificate".into()));
        state.unresolved.get_or_insert(("InvalidCertificateRef", "no certificate".into()));
    }
}

/// Claims a servable listener's frontend port and hostname, or marks it conflicted with an
/// older Gateway's listener there.
fn claim_port(ports: &mut BTreeMap<u16, (Protocol, Vec<Option<String>>)>, state: &mut ListenerState<'_>) {
    let (None, None, Some(protocol)) = (&state.refused, &state.conflict, state.protocol) else { return };
    let port = state.frontend_port;
    match ports.get_mut(&port) {
        Some((taken, _)) if *taken != protocol => {
            state.conflict = Some(("ProtocolConflict", format!("port {port} serves another protocol")));
        }
        Some((_, hosts)) if protocol == Protocol::Tcp || hosts.contains(&state.hostname) => {
            let why = format!("another Gateway's listener on port {port} serves this hostname");
            state.conflict = Some(("HostnameConflict", why));
        }
        Some((_, hosts)) => hosts.push(state.hostname.clone()),
        None => {
            ports.insert(port, (protocol, vec![state.hostname.clone()]));
        }
    }
}

/// A backend reference, resolved.
enum Resolved {
    Service { namespace: String, name: String, port: u16, weight: u32, h2c: bool },
    Invalid(&'static str, String),
}

fn resolve(inputs: &Inputs, route_kind: &str, route_namespace: &str, backend: &BackendRef) -> Resolved {
    let kind = backend.kind.as_deref().unwrap_or("Service");
    if !is_core(backend.group.as_deref()) || kind != "Service" {
        return Resolved::Invalid("InvalidKind", format!("backend {} is a {kind}, not a Service", backend.name));
    }
    let namespace = backend.namespace.clone().unwrap_or_else(|| route_namespace.to_owned());
    if namespace != route_namespace
        && !granted(inputs, route_kind, route_namespace, "Service", &namespace, &backend.name)
    {
        return Resolved::Invalid(
            "RefNotPermitted",
            format!("no ReferenceGrant in {namespace} lets this route use Service {namespace}/{}", backend.name),
        );
    }
    let Some(service) = inputs.services.get(&(namespace.clone(), backend.name.clone())) else {
        return Resolved::Invalid("BackendNotFound", format!("Service {namespace}/{} does not exist", backend.name));
    };
    let Some(port) = backend.port.and_then(|p| u16::try_from(p).ok()) else {
        return Resolved::Invalid("BackendNotFound", format!("backend {} names no port", backend.name));
    };
    let Some(service_port) = service.spec.ports.iter().find(|p| p.port == i64::from(port)) else {
        return Resolved::Invalid(
            "BackendNotFound",
            format!("Service {namespace}/{} has no port {port}", backend.name),
        );
    };
    if !plain(&namespace) || !plain(&backend.name) {
        return Resolved::Invalid("BackendNotFound", "the Service's name cannot name a backend".into());
    }
    let h2c = matches!(service_port.app_protocol.as_deref(), Some("kubernetes.io/h2c" | "grpc"));
    let weight = backend.weight.unwrap_or(1).clamp(0, 1_000_000) as u32;
    Resolved::Service { namespace, name: backend.name.clone(), port, weight, h2c }
}

/// A route's rule, ready to be matched: where it goes.
struct RuleTarget {
    /// The backend's name (without `be_`).
    backend: String,
    /// A backend of its own, when it needs one.
    own: Option<RuleBackend>,
    /// A shared Service backend, when it goes to one.
    shared: Option<ServiceTarget>,
}

fn service_target(namespace: &str, name: &str, port: u16) -> ServiceTarget {
    ServiceTarget {
        backend: format!("{namespace}_{name}_{port}"),
        namespace: namespace.to_owned(),
        service: ServiceRef { name: name.to_owned(), port: PortNumber { number: port } },
    }
}

/// Milliseconds of a Gateway API duration (`1h30m`, `500ms`, `10s`); zero means none.
fn duration_ms(text: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else {
            match rest.bytes().next()? {
                b'h' => (3_600_000, 1),
                b'm' => (60_000, 1),
                b's' => (1000, 1),
                _ => return None,
            }
        };
        total += number * unit;
        rest = &rest[len..];
    }
    Some(total)
}

/// The effective match list of a rule: GRPCRoute methods become paths.
struct Match {
    path_kind: &'static str,
    path: String,
    method: Option<String>,
    headers: Vec<ValueCondition>,
    query: Vec<ValueCondition>,
}

fn value_conditions(list: &[resources::ValueMatch]) -> Result<Vec<ValueCondition>, String> {
    list.iter()
        .map(|m| {
            let kind = match m.kind.as_deref().unwrap_or("Exact") {
                "Exact" => "exact",
                "RegularExpression" => "regex",
                other => return Err(format!("match type {other} is not supported")),
            };
            if !valid_header_name(&m.name) || !printable(&m.value) || m.value.is_empty() {
                return Err(format!("the match on {:?} cannot be expressed", m.name));
            }
            if kind == "regex" && regex::Regex::new(&m.value).is_err() {
                return Err("a regular expression does not compile".into());
            }
            Ok(ValueCondition { name: m.name.clone(), kind, value: m.value.clone() })
        })
        .collect()
}

fn http_match(m: &RouteMatch) -> Result<Match, String> {
    let (path_kind, path) = match &m.path {
        None => ("prefix", "/".to_owned()),
        Some(path) => {
            let value = path.value.clone().unwrap_or_else(|| "/".into());
            match path.kind.as_deref().unwrap_or("PathPrefix") {
                "Exact" => ("exact", value),
                "PathPrefix" => ("prefix", value),
                "RegularExpression" => ("regex", value),
                other => return Err(format!("path match type {other} is not supported")),
            }
        }
    };
    if path_kind == "regex" {
        if !printable(&path) || regex::Regex::new(&path).is_err() {
            return Err("a path regular expression does not compile".into());
        }
    } else if !valid_path(&path) {
        return Err("a path cannot be served".into());
    }
    let method = match &m.method {
        None => None,
        Some(serde_json::Value::String(method)) if method.bytes().all(|b| b.is_ascii_uppercase()) => {
            Some(method.clone())
        }
        Some(_) => return Err("the method cannot be matched".into()),
    };
    let headers = value_conditions(&m.headers)?;
    let query = value_conditions(&m.query_params)?;
    for q in &query {
        if !q.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
            return Err("a query parameter's name cannot be matched".into());
        }
    }
    Ok(Match { path_kind, path, method, headers, query })
}

fn grpc_match(m: &RouteMatch) -> Result<Match, String> {
    let method = m.method.as_ref().cloned().unwrap_or(serde_json::Value::Null);
    let field = |name: &str| method.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    let (service, name) = (field("service"), field("method"));
    let kind = field("type").unwrap_or_else(|| "Exact".into());
    let word = |text: &Option<String>| {
        text.as_ref().is_none_or(|t| t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_'))
    };
    let (path_kind, path) = match (kind.as_str(), &service, &name) {
        ("Exact", Some(s), Some(n)) if word(&service) && word(&name) => ("exact", format!("/{s}/{n}")),
        ("Exact", Some(s), None) if word(&service) => ("prefix", format!("/{s}")),
        ("Exact", None, Some(n)) if word(&name) => ("regex", format!("^/[^/]+/{n}$")),
        ("Exact", None, None) => ("prefix", "/".into()),
        ("RegularExpression", s, n) => {
            let s = s.clone().unwrap_or_else(|| "[^/]+".into());
            let n = n.clone().unwrap_or_else(|| "[^/]+".into());
            ("regex", format!("^/({s})/({n})$"))
        }
        _ => return Err("the gRPC method match cannot be expressed".into()),
    };
    if path_kind == "regex" && (!printable(&path) || regex::Regex::new(&path).is_err()) {
        return Err("a gRPC method regular expression does not compile".into());
    }
    Ok(Match { path_kind, path, method: None, headers: value_conditions(&m.headers)?, query: Vec::new() })
}

/// The spec's precedence as one number: host, then path kind and length, then method, headers
/// and query parameters. Higher wins. The spec leaves regular expressions' place to each
/// implementation: here one ranks as a prefix as long as the expression, so `/re/[0-9]+`
/// beats `/` and `/re`, and a longer literal prefix beats it.
fn rank(host: Option<&str>, m: &Match) -> u64 {
    let path_type = match m.path_kind {
        "exact" => 2,
        _ => 1,
    };
    let path_length = match m.path_kind {
        "prefix" => m.path.trim_end_matches('/').len(),
        _ => m.path.len(),
    }
    .min(2047) as u64;
    let host = hostnames::specificity(host).min(2047);
    ((((host * 4 + path_type) * 2048 + path_length) * 2 + u64::from(m.method.is_some())) * 32
        + (m.headers.len().min(31) as u64))
        * 32
        + m.query.len().min(31) as u64
}

struct RouteContext<'a> {
    kind: &'static str,
    route: &'a Route,
    order: usize,
}

/// Works out where each rule of a route goes; the first problem with a filter or match
/// refuses the route (UnsupportedValue), the first bad reference is its ResolvedRefs reason.
fn rule_targets(
    inputs: &Inputs,
    ctx: &RouteContext<'_>,
    unresolved: &mut Option<(&'static str, String)>,
) -> Result<Vec<(RuleTarget, Vec<Match>)>, String> {
    let meta = &ctx.route.metadata;
    let prefix = match ctx.kind {
        HTTP_ROUTE => "http",
        GRPC_ROUTE => "grpc",
        TLS_ROUTE => "tls",
        _ => "tcp",
    };
    let mut out = Vec::new();
    for (index, rule) in ctx.route.spec.rules.iter().enumerate() {
        let matches: Vec<Match> = match ctx.kind {
            HTTP_ROUTE if rule.matches.is_empty() => vec![http_match(&RouteMatch::default())?],
            HTTP_ROUTE => rule.matches.iter().map(http_match).collect::<Result<_, _>>()?,
            GRPC_ROUTE if rule.matches.is_empty() => vec![grpc_match(&RouteMatch::default())?],
            GRPC_ROUTE => rule.matches.iter().map(grpc_match).collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        let name = format!("{prefix}_{}_{}_r{}", meta.namespace, meta.name, index + 1);
        let target = rule_target(inputs, ctx, rule, &matches, name, unresolved)?;
        out.push((target, matches));
    }
    Ok(out)
}

fn rule_target(
    inputs: &Inputs,
    ctx: &RouteContext<'_>,
    rule: &RouteRule,
    matches: &[Match],
    name: String,
    unresolved: &mut Option<(&'static str, String)>,
) -> Result<RuleTarget, String> {
    let meta = &ctx.route.metadata;
    let tcp = matches!(ctx.kind, TLS_ROUTE | TCP_ROUTE);
    let mut own = RuleBackend {
        name: name.clone(),
        mode: if tcp { "tcp" } else { "http" },
        h2: ctx.kind == GRPC_ROUTE,
        ..RuleBackend::default()
    };
    let mut needs_own = tcp || ctx.kind == GRPC_ROUTE;
    for filter in &rule.filters {
        needs_own = true;
        apply_filter(inputs, ctx, filter, matches, &mut own, unresolved)?;
    }
    if let Some(timeouts) = &rule.timeouts {
        let chosen = timeouts.backend_request.as_deref().or(timeouts.request.as_deref());
        if let Some(text) = chosen {
            let ms = duration_ms(text).ok_or("a timeout is not a duration")?;
            if ms > 0 {
                own.timeout = Some(format!("{ms}ms"));
                needs_own = true;
            }
        }
    }
    let mut valid = Vec::new();
    for backend in &rule.backend_refs {
        match resolve(inputs, ctx.kind, &meta.namespace, backend) {
            Resolved::Service { namespace, name, port, weight, h2c } => {
                if h2c && ctx.kind == HTTP_ROUTE {
                    own.h2 = true;
                    needs_own = true;
                }
                if weight > 0 {
                    valid.push(WeightedRef {
                        namespace,
                        service: ServiceRef { name, port: PortNumber { number: port } },
                        weight,
                    });
                }
            }
            Resolved::Invalid(reason, message) => {
                unresolved.get_or_insert((reason, message));
            }
        }
    }
    if own.redirect.is_some() {
        return Ok(RuleTarget { backend: name, own: Some(own), shared: None });
    }
    if valid.is_empty() {
        // No backend to send to: the spec's 500 (also for a rule with only invalid references),
        // or, for a stream, the connection closed.
        let invalid = if tcp { INVALID_STREAM_BACKEND } else { INVALID_BACKEND };
        return Ok(RuleTarget { backend: invalid.into(), own: None, shared: None });
    }
    if valid.len() > 1 {
        needs_own = true;
        own.weighted = true;
    }
    if !needs_own {
        let only = &valid[0];
        let shared = service_target(&only.namespace, &only.service.name, only.service.port.number);
        return Ok(RuleTarget { backend: shared.backend.clone(), own: None, shared: Some(shared) });
    }
    own.refs = valid;
    Ok(RuleTarget { backend: name, own: Some(own), shared: None })
}

/// What one filter of a rule asks of the rule's own backend.
fn apply_filter(
    inputs: &Inputs,
    ctx: &RouteContext<'_>,
    filter: &resources::Filter,
    matches: &[Match],
    own: &mut RuleBackend,
    unresolved: &mut Option<(&'static str, String)>,
) -> Result<(), String> {
    let meta = &ctx.route.metadata;
    match filter.kind.as_str() {
        "RequestHeaderModifier" | "ResponseHeaderModifier" => {
            let (modifier, changes) = if filter.kind == "RequestHeaderModifier" {
                (filter.request_header_modifier.as_ref(), &mut own.request_headers)
            } else {
                (filter.response_header_modifier.as_ref(), &mut own.response_headers)
            };
            let modifier = modifier.ok_or("a header filter has no settings")?;
            *changes = header_changes(modifier)?;
        }
        "RequestRedirect" => {
            let redirect = filter.request_redirect.as_ref().ok_or("a redirect has no settings")?;
            let code = redirect.status_code.unwrap_or(302);
            if ![301, 302, 303, 307, 308].contains(&code) {
                return Err(format!("redirect status {code} is not supported"));
            }
            if let Some(host) = &redirect.hostname
                && !valid_hostname(host)
            {
                return Err("the redirect's hostname cannot be served".into());
            }
            let scheme = redirect.scheme.clone();
            if scheme.as_deref().is_some_and(|s| s != "http" && s != "https") {
                return Err("the redirect's scheme is not http or https".into());
            }
            own.redirect = Some(RedirectModel {
                scheme,
                hostname: redirect.hostname.clone(),
                port: redirect.port.and_then(|p| u16::try_from(p).ok()),
                path: redirect.path.as_ref().map(|p| path_rewrite(p, matches)).transpose()?,
                code: code as u16,
            });
        }
        "URLRewrite" => {
            let rewrite = filter.url_rewrite.as_ref().ok_or("a rewrite has no settings")?;
            if let Some(host) = &rewrite.hostname {
                if !valid_hostname(host) {
                    return Err("the rewrite's hostname cannot be served".into());
                }
                own.rewrite_host = Some(host.clone());
            }
            own.rewrite_path = rewrite.path.as_ref().map(|p| path_rewrite(p, matches)).transpose()?;
        }
        "RequestMirror" => {
            // Copies go out from the pod itself, without waiting (the library's gw-mirror.lua),
            // to the mirror Service's shared backend.
            let mirror = filter.request_mirror.as_ref().ok_or("a mirror has no settings")?;
            let share = match (&mirror.percent, &mirror.fraction) {
                (Some(percent), _) => ((*percent).clamp(0, 100) * 100) as u32,
                (None, Some(fraction)) => {
                    let denominator = fraction.denominator.unwrap_or(100).max(1);
                    (fraction.numerator.clamp(0, denominator) * 10_000 / denominator) as u32
                }
                (None, None) => 10_000,
            };
            match resolve(inputs, ctx.kind, &meta.namespace, &mirror.backend_ref) {
                Resolved::Service { namespace, name, port, .. } => {
                    own.mirrors.push(super::Mirror { target: service_target(&namespace, &name, port), share });
                }
                Resolved::Invalid(reason, message) => {
                    unresolved.get_or_insert((reason, message));
                }
            }
        }
        other => return Err(format!("filter {other} is not supported")),
    }
    Ok(())
}

fn header_changes(modifier: &resources::HeaderModifier) -> Result<HeaderChanges, String> {
    let pair = |h: &resources::Header| -> Result<(String, String), String> {
        if !valid_header_name(&h.name) || !printable(&h.value) {
            return Err(format!("header {:?} cannot be written", h.name));
        }
        Ok((h.name.clone(), h.value.clone()))
    };
    let remove =
        modifier
            .remove
            .iter()
            .map(|name| {
                if valid_header_name(name) {
                    Ok(name.clone())
                } else {
                    Err(format!("header {name:?} cannot be removed"))
                }
            })
            .collect::<Result<_, _>>()?;
    Ok(HeaderChanges {
        set: modifier.set.iter().map(pair).collect::<Result<_, _>>()?,
        add: modifier.add.iter().map(pair).collect::<Result<_, _>>()?,
        remove,
    })
}

fn path_rewrite(modifier: &resources::PathModifier, matches: &[Match]) -> Result<PathRewrite, String> {
    match modifier.kind.as_str() {
        "ReplaceFullPath" => {
            let path = modifier.replace_full_path.clone().unwrap_or_else(|| "/".into());
            if !valid_path(&path) {
                return Err("the replacement path cannot be written".into());
            }
            Ok(PathRewrite {
                kind: "full",
                value: path,
                pattern: String::new(),
                replacement: String::new(),
                whole: None,
            })
        }
        "ReplacePrefixMatch" => {
            let replacement = modifier.replace_prefix_match.clone().unwrap_or_else(|| "/".into());
            if !valid_path(&replacement) {
                return Err("the replacement prefix cannot be written".into());
            }
            // The spec allows it only with one PathPrefix match, whose prefix is replaced.
            let [only] = matches else { return Err("ReplacePrefixMatch needs exactly one PathPrefix match".into()) };
            if only.path_kind != "prefix" {
                return Err("ReplacePrefixMatch needs a PathPrefix match".into());
            }
            // Element-wise: the prefix, then the end of the path or a `/` and the rest.
            let matched = only.path.trim_end_matches('/');
            let value = replacement.trim_end_matches('/');
            let escaped = regex::escape(matched);
            Ok(if value.is_empty() {
                PathRewrite {
                    kind: "prefix",
                    value: String::new(),
                    pattern: format!("^{escaped}(/.*)$"),
                    replacement: "\\1".into(),
                    whole: Some(format!("^{escaped}/?$")),
                }
            } else {
                PathRewrite {
                    kind: "prefix",
                    value: String::new(),
                    pattern: format!("^{escaped}(/.*)?$"),
                    replacement: format!("{value}\\1"),
                    whole: None,
                }
            })
        }
        other => Err(format!("path modifier {other} is not supported")),
    }
}

/// A conditional rule with what orders it: rank (highest first), then the route's age order,
/// the rule's and the match's index.
type RankedRule = (u64, usize, usize, usize, ConditionalRule);

/// One route being attached.
struct Attachment {
    listener: usize,
    hosts: Vec<Option<String>>,
}

/// Builds the model and every status from the watched objects.
pub fn build(settings: &GatewaySettings, inputs: &Inputs) -> Model {
    let mut model = Model::default();
    let classes = served_classes(settings, inputs, &mut model.status);
    let gateways = gateways_in_order(inputs, &classes);
    let mut listeners = judge_listeners(settings, inputs, &gateways);
    let mut frontends = frontends_of(settings, &listeners);
    let mut tables = RouteTables::default();
    for ctx in &routes_in_order(inputs) {
        let Some((status, attached)) = attach_route(inputs, ctx, &gateways, &listeners) else { continue };
        model.status.push(status);
        let Some((targets, attachments)) = attached else { continue };
        for attachment in &attachments {
            listeners[attachment.listener].attached += 1;
        }
        tables.add_route(ctx, targets, &attachments, &listeners, &mut frontends);
    }
    tables.finish(&mut model, frontends);
    model.status.extend(gateway_statuses(settings, inputs, &gateways, &listeners));
    if settings.gateway_services.is_some() {
        model.gateway_services = gateway_services(&gateways, &listeners);
    }
    model
}

/// The Service of each Gateway with a served listener: its listener ports to its fleet ports.
fn gateway_services(gateways: &[&Gateway], listeners: &[ListenerState<'_>]) -> Vec<super::GatewayService> {
    let mut services = Vec::new();
    for (index, gateway) in gateways.iter().enumerate() {
        let ports: BTreeSet<(u16, u16)> =
            listeners.iter().filter(|l| l.gateway == index && l.served()).map(|l| (l.port, l.frontend_port)).collect();
        if ports.is_empty() {
            continue;
        }
        let meta = &gateway.metadata;
        services.push(super::GatewayService {
            gateway_namespace: meta.namespace.clone(),
            gateway_name: meta.name.clone(),
            name: super::gateway_service_name(&meta.namespace, &meta.name),
            ports: ports.into_iter().collect(),
        });
    }
    services
}

/// The classes of this controller, each with its Accepted status.
fn served_classes<'a>(
    settings: &GatewaySettings,
    inputs: &'a Inputs,
    statuses: &mut Vec<ObjectStatus>,
) -> BTreeSet<&'a str> {
    let classes: BTreeSet<&str> = inputs
        .classes
        .iter()
        .filter(|class| class.spec.controller_name == settings.controller_name)
        .map(|class| class.metadata.name.as_str())
        .collect();
    for class in inputs.classes.iter().filter(|c| classes.contains(c.metadata.name.as_str())) {
        statuses.push(ObjectStatus {
            kind: "GatewayClass",
            namespace: String::new(),
            name: class.metadata.name.clone(),
            generation: class.metadata.generation,
            body: Body::Class {
                conditions: vec![Condition::yes("Accepted", "Accepted", "haptic serves this class")],
                features: super::supported_features(),
            },
        });
    }
    classes
}

/// The Gateways of these classes, oldest first (the spec's tie-break).
fn gateways_in_order<'a>(inputs: &'a Inputs, classes: &BTreeSet<&str>) -> Vec<&'a Gateway> {
    let mut gateways: Vec<&Gateway> =
        inputs.gateways.iter().filter(|g| classes.contains(g.spec.gateway_class_name.as_str())).collect();
    gateways.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.namespace, &a.metadata.name).cmp(&(
            &b.metadata.creation_timestamp,
            &b.metadata.namespace,
            &b.metadata.name,
        ))
    });
    gateways
}

/// One frontend per port of the served listeners, its listeners most specific first.
fn frontends_of(settings: &GatewaySettings, listeners: &[ListenerState<'_>]) -> BTreeMap<u16, Frontend> {
    let mut frontends: BTreeMap<u16, Frontend> = BTreeMap::new();
    for state in listeners.iter().filter(|s| s.served()) {
        let Some(protocol) = state.protocol else { continue };
        let frontend = frontends.entry(state.frontend_port).or_insert_with(|| Frontend {
            name: format!("gw_{}", state.frontend_port),
            port: state.frontend_port,
            public_port: state.port,
            protocol,
            listeners: Vec::new(),
            certificates: Vec::new(),
            exact_entries: Vec::new(),
            prefix_entries: Vec::new(),
            conditional: Vec::new(),
            tcp_backend: None,
            shared: settings.shared_http_port == Some(state.frontend_port),
        });
        frontend.listeners.push(ListenerModel {
            id: state.id.clone(),
            hostname: state.hostname.clone(),
            host_kind: HostKind::of(state.hostname.as_deref()),
            suffix: state.hostname.as_ref().and_then(|h| h.strip_prefix('*')).map(str::to_owned),
        });
        for certificate in &state.certificates {
            if !frontend.certificates.contains(certificate) {
                frontend.certificates.push(certificate.clone());
            }
        }
    }
    for frontend in frontends.values_mut() {
        frontend.listeners.sort_by_key(|l| std::cmp::Reverse(hostnames::specificity(l.hostname.as_deref())));
    }
    frontends
}

/// Every route, oldest first (the spec's tie-break), each kind in turn.
fn routes_in_order(inputs: &Inputs) -> Vec<RouteContext<'_>> {
    let mut routes: Vec<RouteContext<'_>> = Vec::new();
    for (kind, list) in [
        (HTTP_ROUTE, &inputs.http_routes),
        (GRPC_ROUTE, &inputs.grpc_routes),
        (TLS_ROUTE, &inputs.tls_routes),
        (TCP_ROUTE, &inputs.tcp_routes),
    ] {
        for route in list {
            routes.push(RouteContext { kind, route, order: 0 });
        }
    }
    routes.sort_by(|a, b| {
        let (a, b) = (&a.route.metadata, &b.route.metadata);
        (a.creation_timestamp.as_str(), a.namespace.as_str(), a.name.as_str()).cmp(&(
            b.creation_timestamp.as_str(),
            b.namespace.as_str(),
            b.name.as_str(),
        ))
    });
    for (order, route) in routes.iter_mut().enumerate() {
        route.order = order;
    }
    routes
}

/// Where a route's rules go and the listeners it attaches to, when it is served.
type Attached = (Vec<(RuleTarget, Vec<Match>)>, Vec<Attachment>);

/// A route's status towards the Gateways of this controller it names (`None` when it names
/// none), and, when its rules can be served, where they go.
fn attach_route(
    inputs: &Inputs,
    ctx: &RouteContext<'_>,
    gateways: &[&Gateway],
    listeners: &[ListenerState<'_>],
) -> Option<(ObjectStatus, Option<Attached>)> {
    let meta = &ctx.route.metadata;
    let mut parents = Vec::new();
    let mut attachments: Vec<Attachment> = Vec::new();
    for parent in &ctx.route.spec.parent_refs {
        if parent.group.as_deref().is_some_and(|g| g != GROUP) || parent.kind.as_deref().is_some_and(|k| k != "Gateway")
        {
            continue;
        }
        let namespace = parent.namespace.clone().unwrap_or_else(|| meta.namespace.clone());
        let Some(gateway) =
            gateways.iter().position(|g| g.metadata.namespace == namespace && g.metadata.name == parent.name)
        else {
            continue;
        };
        let (accepted, reason) = attach(inputs, ctx, gateways[gateway], gateway, parent, listeners, &mut attachments);
        let condition = if accepted {
            Condition::yes("Accepted", "Accepted", "attached")
        } else {
            Condition::no("Accepted", reason.0, reason.1)
        };
        parents.push((parent.clone(), condition));
    }
    if parents.is_empty() {
        return None;
    }
    let mut unresolved = None;
    let targets = rule_targets(inputs, ctx, &mut unresolved);
    let refused = targets.as_ref().err().cloned();
    let resolved = match &unresolved {
        Some((reason, message)) => Condition::no("ResolvedRefs", reason, message.clone()),
        None => Condition::yes("ResolvedRefs", "ResolvedRefs", "every reference resolved"),
    };
    let parent_statuses = parents
        .into_iter()
        .map(|(parent_ref, accepted)| {
            let accepted = match (&refused, accepted.status) {
                (Some(why), true) => Condition::no("Accepted", "UnsupportedValue", why.clone()),
                _ => accepted,
            };
            ParentStatus { parent_ref, conditions: vec![accepted, resolved.clone()] }
        })
        .collect();
    let status = ObjectStatus {
        kind: ctx.kind,
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        generation: meta.generation,
        body: Body::Route(parent_statuses),
    };
    Some((status, targets.ok().map(|targets| (targets, attachments))))
}

/// The routing tables the attached routes fill, per port, and the backends they use.
#[derive(Default)]
struct RouteTables {
    exact: BTreeMap<u16, BTreeMap<String, String>>,
    prefix: BTreeMap<u16, BTreeMap<String, String>>,
    conditional: BTreeMap<u16, Vec<RankedRule>>,
    shared: BTreeSet<ServiceTarget>,
    own: BTreeMap<String, RuleBackend>,
    uses_invalid: bool,
    uses_invalid_stream: bool,
}

impl RouteTables {
    /// Adds every rule of an attached route on every listener it attached to.
    fn add_route(
        &mut self,
        ctx: &RouteContext<'_>,
        targets: Vec<(RuleTarget, Vec<Match>)>,
        attachments: &[Attachment],
        listeners: &[ListenerState<'_>],
        frontends: &mut BTreeMap<u16, Frontend>,
    ) {
        for (rule_index, (target, matches)) in targets.into_iter().enumerate() {
            for attachment in attachments {
                let listener = &listeners[attachment.listener];
                if !listener.served() {
                    // Attached and counted, but its listener has no frontend to serve it.
                    continue;
                }
                match ctx.kind {
                    TCP_ROUTE => {
                        if let Some(frontend) = frontends.get_mut(&listener.frontend_port) {
                            frontend.tcp_backend.get_or_insert_with(|| target.backend.clone());
                        }
                    }
                    TLS_ROUTE if rule_index > 0 => {}
                    TLS_ROUTE => {
                        for host in &attachment.hosts {
                            let key = format!("{}|{}", listener.id, host.as_deref().unwrap_or(""));
                            let entries = self.exact.entry(listener.frontend_port).or_default();
                            entries.entry(key).or_insert_with(|| format!("0:{}", target.backend));
                        }
                    }
                    _ => {
                        for host in &attachment.hosts {
                            for (match_index, m) in matches.iter().enumerate() {
                                let order = (ctx.order, rule_index, match_index);
                                self.add_http_match(listener, host, m, &target.backend, order);
                            }
                        }
                    }
                }
            }
            if attachments.is_empty() {
                continue;
            }
            self.uses(target);
        }
    }

    /// One match of an HTTP or gRPC rule on one listener and host: a map entry when only its
    /// path decides, a conditional rule otherwise.
    fn add_http_match(
        &mut self,
        listener: &ListenerState<'_>,
        host: &Option<String>,
        m: &Match,
        backend: &str,
        (route_order, rule_index, match_index): (usize, usize, usize),
    ) {
        let port = listener.frontend_port;
        let value_rank = rank(host.as_deref(), m);
        let value = format!("{value_rank}:{backend}");
        let host_text = host.as_deref().unwrap_or("");
        let simple = m.method.is_none() && m.headers.is_empty() && m.query.is_empty();
        let prefix_key = format!("{}/", m.path.trim_end_matches('/'));
        match (m.path_kind, simple) {
            ("exact", true) => {
                let key = format!("{}|{host_text}{}", listener.id, m.path);
                self.exact.entry(port).or_default().entry(key).or_insert(value);
            }
            ("prefix", true) => {
                let key = format!("{}|{host_text}{prefix_key}", listener.id);
                self.prefix.entry(port).or_default().entry(key).or_insert(value);
            }
            _ => {
                let rule = ConditionalRule {
                    listener: listener.id.clone(),
                    host: host.clone(),
                    host_kind: HostKind::of(host.as_deref()),
                    suffix: host.as_ref().and_then(|h| h.strip_prefix('*')).map(str::to_owned),
                    path_kind: m.path_kind,
                    path: m.path.clone(),
                    prefix_key,
                    method: m.method.clone(),
                    headers: m.headers.clone(),
                    query: m.query.clone(),
                    value,
                    rank: value_rank,
                };
                let ranked = (value_rank, route_order, rule_index, match_index, rule);
                self.conditional.entry(port).or_default().push(ranked);
            }
        }
    }

    /// Notes the backends a served rule uses.
    fn uses(&mut self, target: RuleTarget) {
        if target.backend == INVALID_BACKEND {
            self.uses_invalid = true;
        }
        if target.backend == INVALID_STREAM_BACKEND {
            self.uses_invalid_stream = true;
        }
        if let Some(target) = target.shared {
            self.shared.insert(target);
        }
        if let Some(backend) = target.own {
            for mirror in &backend.mirrors {
                self.shared.insert(mirror.target.clone());
            }
            self.own.entry(backend.name.clone()).or_insert(backend);
        }
    }

    /// Puts the tables into the frontends and the model.
    fn finish(mut self, model: &mut Model, mut frontends: BTreeMap<u16, Frontend>) {
        for (port, frontend) in &mut frontends {
            let entries = |table: Option<BTreeMap<String, String>>| {
                table.unwrap_or_default().into_iter().map(|(key, value)| MapEntry { key, value }).collect()
            };
            frontend.exact_entries = entries(self.exact.remove(port));
            frontend.prefix_entries = entries(self.prefix.remove(port));
            let mut rules = self.conditional.remove(port).unwrap_or_default();
            rules.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)));
            frontend.conditional = rules.into_iter().map(|(.., rule)| rule).collect();
        }
        if self.uses_invalid {
            let invalid = RuleBackend {
                name: INVALID_BACKEND.into(),
                mode: "http",
                fixed_status: Some(500),
                ..RuleBackend::default()
            };
            self.own.insert(INVALID_BACKEND.into(), invalid);
        }
        if self.uses_invalid_stream {
            let invalid = RuleBackend {
                name: INVALID_STREAM_BACKEND.into(),
                mode: "tcp",
                reject: true,
                ..RuleBackend::default()
            };
            self.own.insert(INVALID_STREAM_BACKEND.into(), invalid);
        }
        model.frontends = frontends.into_values().collect();
        model.service_backends = self.shared.into_iter().collect();
        model.rule_backends = self.own.into_values().collect();
    }
}

/// Each Gateway's status: its conditions, addresses and listeners.
fn gateway_statuses(
    settings: &GatewaySettings,
    inputs: &Inputs,
    gateways: &[&Gateway],
    listeners: &[ListenerState<'_>],
) -> Vec<ObjectStatus> {
    let shared = if settings.addresses.is_empty() { inputs.pod_ips.clone() } else { settings.addresses.clone() };
    let mut statuses = Vec::new();
    for (index, gateway) in gateways.iter().enumerate() {
        let mine: Vec<&ListenerState<'_>> = listeners.iter().filter(|l| l.gateway == index).collect();
        let listener_statuses: Vec<ListenerStatus> = mine.iter().map(|l| listener_status(l)).collect();
        let served = mine.iter().filter(|l| l.served()).count();
        let (addresses, service) = match &settings.gateway_services {
            Some(services) => {
                let name = super::gateway_service_name(&gateway.metadata.namespace, &gateway.metadata.name);
                let given = inputs.service_addresses.get(&name).cloned().unwrap_or_default();
                (given, Some(format!("{}/{name}", services.namespace)))
            }
            None => (shared.clone(), None),
        };
        let unaddressed = service.filter(|_| served > 0 && addresses.is_empty());
        let conditions = if let Some(service) = unaddressed {
            let why = format!("Service {service} has no address yet");
            let accepted = if served == mine.len() { "Accepted" } else { "ListenersNotValid" };
            vec![
                Condition::yes("Accepted", accepted, "listeners are served"),
                Condition::no("Programmed", "AddressNotAssigned", why),
            ]
        } else if served == mine.len() {
            vec![
                Condition::yes("Accepted", "Accepted", "every listener is served"),
                Condition::yes("Programmed", "Programmed", "rendered into the HAProxy configuration"),
            ]
        } else if served > 0 {
            vec![
                Condition::yes("Accepted", "ListenersNotValid", "some listeners are not served"),
                Condition::yes("Programmed", "Programmed", "rendered into the HAProxy configuration"),
            ]
        } else {
            vec![
                Condition::no("Accepted", "ListenersNotValid", "no listener can be served"),
                Condition::no("Programmed", "Invalid", "nothing to serve"),
            ]
        };
        statuses.push(ObjectStatus {
            kind: "Gateway",
            namespace: gateway.metadata.namespace.clone(),
            name: gateway.metadata.name.clone(),
            generation: gateway.metadata.generation,
            body: Body::Gateway { conditions, addresses, listeners: listener_statuses },
        });
    }
    statuses
}

fn listener_status(state: &ListenerState<'_>) -> ListenerStatus {
    let mut conditions = Vec::new();
    match (&state.refused, state.protocol) {
        (Some((reason, message)), _) => conditions.push(Condition::no("Accepted", reason, message.clone())),
        (None, None) => conditions.push(Condition::no("Accepted", "UnsupportedProtocol", "not served")),
        (None, Some(_)) => conditions.push(Condition::yes("Accepted", "Accepted", "served")),
    }
    match &state.conflict {
        Some((reason, message)) => conditions.push(Condition::yes("Conflicted", reason, message.clone())),
        None => conditions.push(Condition::no("Conflicted", "NoConflicts", "no conflict")),
    }
    match &state.unresolved {
        Some((reason, message)) => conditions.push(Condition::no("ResolvedRefs", reason, message.clone())),
        None => conditions.push(Condition::yes("ResolvedRefs", "ResolvedRefs", "every reference resolved")),
    }
    if state.served() {
        conditions.push(Condition::yes("Programmed", "Programmed", "rendered into the HAProxy configuration"));
    } else {
        conditions.push(Condition::no("Programmed", "Invalid", "not served"));
    }
    ListenerStatus {
        name: state.listener.name.clone(),
        supported_kinds: state.kinds.clone(),
        attached_routes: state.attached,
        conditions,
    }
}

/// Attaches a route to the listeners of one Gateway its parent reference selects; on failure,
/// the reason the spec names.
fn attach(
    inputs: &Inputs,
    ctx: &RouteContext<'_>,
    gateway: &Gateway,
    gateway_index: usize,
    parent: &ParentReference,
    listeners: &[ListenerState<'_>],
    attachments: &mut Vec<Attachment>,
) -> (bool, (&'static str, String)) {
    let meta = &ctx.route.metadata;
    let candidates: Vec<usize> = listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.gateway == gateway_index)
        .filter(|(_, l)| parent.section_name.as_ref().is_none_or(|s| *s == l.listener.name))
        .filter(|(_, l)| parent.port.is_none_or(|p| p == i64::from(l.port)))
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return (false, ("NoMatchingParent", "no listener has that name or port".into()));
    }
    let mut reason = ("NoMatchingParent", "no listener of the Gateway is served".to_owned());
    let mut attached = false;
    for index in candidates {
        let listener = &listeners[index];
        if !listener.attachable() {
            continue;
        }
        if !listener.kinds.contains(&ctx.kind) {
            reason =
                ("NotAllowedByListeners", format!("listener {} does not take {}s", listener.listener.name, ctx.kind));
            continue;
        }
        let from = listener
            .listener
            .allowed_routes
            .as_ref()
            .and_then(|a| a.namespaces.as_ref())
            .and_then(|n| n.from.clone())
            .unwrap_or_else(|| "Same".into());
        let allowed = match from.as_str() {
            "All" => true,
            "Same" => meta.namespace == gateway.metadata.namespace,
            "Selector" => {
                let selector = listener
                    .listener
                    .allowed_routes
                    .as_ref()
                    .and_then(|a| a.namespaces.as_ref())
                    .and_then(|n| n.selector.as_ref());
                let labels = inputs.namespaces.get(&meta.namespace);
                match (selector, labels) {
                    (Some(selector), Some(labels)) => selector.matches(labels),
                    _ => false,
                }
            }
            _ => false,
        };
        if !allowed {
            reason = (
                "NotAllowedByListeners",
                format!("listener {} does not take routes from namespace {}", listener.listener.name, meta.namespace),
            );
            continue;
        }
        let hosts = if ctx.kind == TCP_ROUTE {
            vec![None]
        } else {
            let valid: Vec<String> = ctx.route.spec.hostnames.iter().filter(|h| valid_hostname(h)).cloned().collect();
            hostnames::intersect(listener.hostname.as_deref(), &valid)
        };
        if hosts.is_empty() {
            if reason.0 != "NotAllowedByListeners" {
                reason = ("NoMatchingListenerHostname", "no hostname of the route is the listener's".into());
            }
            continue;
        }
        attachments.push(Attachment { listener: index, hosts });
        attached = true;
    }
    (attached, reason)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn settings() -> GatewaySettings {
        GatewaySettings {
            controller_name: "haptic.dev/test".into(),
            reserved_ports: vec![8080],
            shared_http_port: None,
            addresses: vec![],
            gateway_services: None,
        }
    }

    fn inputs(gateways: serde_json::Value, routes: serde_json::Value) -> Inputs {
        let class = json!({"metadata": {"name": "c"}, "spec": {"controllerName": "haptic.dev/test"}});
        let mut inputs = Inputs {
            classes: vec![serde_json::from_value(class).unwrap()],
            gateways: serde_json::from_value(gateways).unwrap(),
            http_routes: serde_json::from_value(routes).unwrap(),
            ..Inputs::default()
        };
        for name in ["a", "b"] {
            let service = json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"ports": [{"port": 80}]}});
            inputs.services.insert(("ns".into(), name.into()), serde_json::from_value(service).unwrap());
        }
        inputs
    }

    fn gateway(listeners: serde_json::Value) -> serde_json::Value {
        json!([{"metadata": {"namespace": "ns", "name": "gw"}, "spec": {"gatewayClassName": "c", "listeners": listeners}}])
    }

    fn http_route(
        name: &str,
        created: &str,
        hostnames: serde_json::Value,
        rules: serde_json::Value,
    ) -> serde_json::Value {
        json!({"metadata": {"namespace": "ns", "name": name, "creationTimestamp": created},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": hostnames, "rules": rules}})
    }

    fn route_condition(model: &Model, name: &str, kind: &str) -> (bool, &'static str) {
        let status = model.status.iter().find(|s| s.name == name).expect("a status");
        let Body::Route(parents) = &status.body else { panic!("not a route") };
        let condition = parents[0].conditions.iter().find(|c| c.kind == kind).expect("the condition");
        (condition.status, condition.reason)
    }

    #[test]
    fn plain_rules_become_map_entries_ranked_by_host_then_path() {
        let model = build(
            &settings(),
            &inputs(
                gateway(json!([{"name": "web", "port": 80, "protocol": "HTTP"}])),
                json!([http_route(
                    "r",
                    "2026-01-01T00:00:00Z",
                    json!(["a.example.com"]),
                    json!([
                        {"matches": [{"path": {"type": "Exact", "value": "/x"}}], "backendRefs": [{"name": "a", "port": 80}]},
                        {"matches": [{"path": {"type": "PathPrefix", "value": "/y/"}}], "backendRefs": [{"name": "b", "port": 80}]},
                    ])
                )]),
            ),
        );
        let frontend = &model.frontends[0];
        assert_eq!(frontend.name, "gw_80");
        assert_eq!(frontend.exact_entries[0].key, "ns_gw_web|a.example.com/x");
        assert!(frontend.exact_entries[0].value.ends_with(":ns_a_80"));
        assert_eq!(frontend.prefix_entries[0].key, "ns_gw_web|a.example.com/y/");
        assert!(frontend.conditional.is_empty());
        assert_eq!(model.service_backends.len(), 2);
        assert!(model.rule_backends.is_empty());
        assert_eq!(route_condition(&model, "r", "Accepted"), (true, "Accepted"));
    }

    #[test]
    fn the_older_route_keeps_a_contested_key_and_conditional_rules_follow_precedence() {
        let rules = |backend: &str| {
            json!([
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": backend, "port": 80}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/p"}, "headers": [{"name": "x", "value": "1"}]}],
                 "backendRefs": [{"name": backend, "port": 80}]},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/longer"}, "method": "GET"}],
                 "backendRefs": [{"name": backend, "port": 80}]},
            ])
        };
        let model = build(
            &settings(),
            &inputs(
                gateway(json!([{"name": "web", "port": 80, "protocol": "HTTP"}])),
                json!([
                    http_route("young", "2026-02-01T00:00:00Z", json!([]), rules("b")),
                    http_route("old", "2026-01-01T00:00:00Z", json!([]), rules("a")),
                ]),
            ),
        );
        let frontend = &model.frontends[0];
        assert_eq!(frontend.prefix_entries.len(), 1);
        assert!(frontend.prefix_entries[0].value.ends_with(":ns_a_80"), "the older route wins the tie");
        let order: Vec<(&str, &str)> =
            frontend.conditional.iter().map(|r| (r.path.as_str(), r.value.rsplit(':').next().unwrap_or(""))).collect();
        // Longer prefix first; on equal rank, the older route first.
        assert_eq!(order, vec![("/longer", "ns_a_80"), ("/longer", "ns_b_80"), ("/p", "ns_a_80"), ("/p", "ns_b_80")]);
        assert!(frontend.conditional[0].rank > frontend.conditional[2].rank);
    }

    fn listener_reason(model: &Model, gateway: &str, name: &str, kind: &str) -> (bool, &'static str) {
        let status = model.status.iter().find(|s| s.kind == "Gateway" && s.name == gateway).expect("gateway status");
        let Body::Gateway { listeners, .. } = &status.body else { panic!("not a Gateway") };
        let l = listeners.iter().find(|l| l.name == name).expect("listener");
        l.conditions.iter().find(|c| c.kind == kind).map(|c| (c.status, c.reason)).expect("condition")
    }

    fn gateway_condition(model: &Model, gateway: &str, kind: &str) -> (bool, &'static str) {
        let status = model.status.iter().find(|s| s.kind == "Gateway" && s.name == gateway).expect("gateway status");
        let Body::Gateway { conditions, .. } = &status.body else { panic!("not a Gateway") };
        conditions.iter().find(|c| c.kind == kind).map(|c| (c.status, c.reason)).expect("condition")
    }

    #[test]
    fn indistinct_listeners_of_a_gateway_all_conflict_and_reserved_ports_are_refused() {
        let model = build(
            &settings(),
            &inputs(
                gateway(json!([
                    {"name": "a", "port": 80, "protocol": "HTTP"},
                    {"name": "b", "port": 80, "protocol": "HTTP"},
                    {"name": "c", "port": 90, "protocol": "HTTP", "hostname": "x.example.com"},
                    {"name": "d", "port": 90, "protocol": "TCP"},
                    {"name": "f", "port": 8080, "protocol": "HTTP"},
                    {"name": "e", "port": 81, "protocol": "UDP"},
                    {"name": "g", "port": 91, "protocol": "HTTP"},
                ])),
                json!([]),
            ),
        );
        // The spec: no indistinct listener is picked as the winner.
        assert_eq!(listener_reason(&model, "gw", "a", "Conflicted"), (true, "HostnameConflict"));
        assert_eq!(listener_reason(&model, "gw", "b", "Conflicted"), (true, "HostnameConflict"));
        assert_eq!(listener_reason(&model, "gw", "c", "Conflicted"), (true, "ProtocolConflict"));
        assert_eq!(listener_reason(&model, "gw", "d", "Conflicted"), (true, "ProtocolConflict"));
        assert_eq!(listener_reason(&model, "gw", "f", "Accepted"), (false, "PortUnavailable"));
        assert_eq!(listener_reason(&model, "gw", "e", "Accepted"), (false, "UnsupportedProtocol"));
        assert_eq!(listener_reason(&model, "gw", "g", "Conflicted"), (false, "NoConflicts"));
        assert_eq!(gateway_condition(&model, "gw", "Accepted"), (true, "ListenersNotValid"));
        assert_eq!(model.frontends.len(), 1);
    }

    fn two_gateways_on_port_80(names: &[&str]) -> serde_json::Value {
        let gateways: Vec<serde_json::Value> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                json!({"metadata": {"namespace": "ns", "name": name, "creationTimestamp": format!("2026-01-01T00:{i:02}:00Z")},
                       "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
            })
            .collect();
        json!(gateways)
    }

    fn with_services() -> GatewaySettings {
        GatewaySettings {
            gateway_services: Some(crate::config::GatewayServices {
                namespace: "haptic".into(),
                selector: [("app".to_owned(), "haproxy".to_owned())].into(),
                service_type: "LoadBalancer".into(),
                annotations: BTreeMap::new(),
                first_port: 20000,
                last_port: 20009,
            }),
            ..settings()
        }
    }

    #[test]
    fn routes_attach_to_a_listener_only_its_missing_certificate_keeps_unserved_and_are_counted_not_served() {
        let listeners = json!([{"name": "tls", "port": 443, "protocol": "HTTPS",
                                "tls": {"certificateRefs": [{"name": "does-not-exist"}]}}]);
        let route = json!({"metadata": {"namespace": "ns", "name": "r", "creationTimestamp": "2026-01-01T00:00:00Z"},
                           "spec": {"parentRefs": [{"name": "gw", "sectionName": "tls"}],
                                    "rules": [{"backendRefs": [{"name": "a", "port": 80}]}]}});
        let model = build(&settings(), &inputs(gateway(listeners), json!([route])));
        let status = model.status.iter().find(|s| s.kind == "Gateway").expect("gateway status");
        let Body::Gateway { listeners, .. } = &status.body else { panic!("not a Gateway") };
        assert_eq!(listeners[0].attached_routes, 1);
        assert_eq!(listener_reason(&model, "gw", "tls", "Programmed"), (false, "Invalid"));
        assert_eq!(listener_reason(&model, "gw", "tls", "ResolvedRefs"), (false, "InvalidCertificateRef"));
        assert!(model.frontends.is_empty(), "nothing is served without a certificate");
    }

    #[test]
    fn every_mirror_filter_of_a_rule_sends_its_own_copies() {
        let mirror = |name: &str, extra: serde_json::Value| {
            let mut filter =
                json!({"type": "RequestMirror", "requestMirror": {"backendRef": {"name": name, "port": 80}}});
            if let (Some(settings), Some(extra)) = (filter["requestMirror"].as_object_mut(), extra.as_object()) {
                settings.extend(extra.clone());
            }
            filter
        };
        let rules = json!([{"filters": [mirror("a", json!({})), mirror("b", json!({"percent": 25}))],
                            "backendRefs": [{"name": "a", "port": 80}]}]);
        let model = build(
            &settings(),
            &inputs(
                gateway(json!([{"name": "web", "port": 80, "protocol": "HTTP"}])),
                json!([http_route("r", "2026-01-01T00:00:00Z", json!([]), rules)]),
            ),
        );
        let backend = model.rule_backends.iter().find(|b| !b.mirrors.is_empty()).expect("a mirroring backend");
        let copies: Vec<(&str, u32)> = backend.mirrors.iter().map(|m| (m.target.backend.as_str(), m.share)).collect();
        assert_eq!(copies, vec![("ns_a_80", 10_000), ("ns_b_80", 2_500)]);
        assert!(model.service_backends.iter().any(|s| s.backend == "ns_b_80"), "the mirror's backend exists");
    }

    #[test]
    fn a_tls_route_without_a_valid_backend_closes_the_connection_rather_than_answering_http() {
        let listeners = json!([{"name": "tls", "port": 443, "protocol": "TLS", "tls": {"mode": "Passthrough"}}]);
        let mut inputs = inputs(gateway(listeners), json!([]));
        let route = json!({"metadata": {"namespace": "ns", "name": "t", "creationTimestamp": "2026-01-01T00:00:00Z"},
                           "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["example.com"],
                                    "rules": [{"backendRefs": [{"name": "nonexistent", "port": 443}]}]}});
        inputs.tls_routes = vec![serde_json::from_value(route).unwrap()];
        let model = build(&settings(), &inputs);
        let invalid = model.rule_backends.iter().find(|b| b.name == INVALID_STREAM_BACKEND).expect("the stream's");
        assert!(invalid.reject && invalid.mode == "tcp" && invalid.fixed_status.is_none());
        assert!(model.rule_backends.iter().all(|b| b.name != INVALID_BACKEND), "no HTTP answer on a TLS listener");
        let entry = &model.frontends[0].exact_entries[0];
        assert!(entry.value.ends_with(INVALID_STREAM_BACKEND), "{entry:?}");
    }

    #[test]
    fn gateways_sharing_the_pods_ports_leave_a_contested_hostname_to_the_older() {
        let model = build(&settings(), &inputs(two_gateways_on_port_80(&["old", "young"]), json!([])));
        assert_eq!(listener_reason(&model, "old", "http", "Conflicted"), (false, "NoConflicts"));
        assert_eq!(listener_reason(&model, "young", "http", "Conflicted"), (true, "HostnameConflict"));
        assert!(model.gateway_services.is_empty());
    }

    #[test]
    fn with_gateway_services_each_gateway_gets_fleet_ports_and_a_service_of_its_own() {
        let settings = with_services();
        let mut inputs = inputs(two_gateways_on_port_80(&["old", "young"]), json!([]));
        let model = build(&settings, &inputs);
        assert_eq!(listener_reason(&model, "old", "http", "Conflicted"), (false, "NoConflicts"));
        assert_eq!(listener_reason(&model, "young", "http", "Conflicted"), (false, "NoConflicts"));
        let ports: Vec<u16> = model.frontends.iter().map(|f| f.port).collect();
        assert_eq!(ports.len(), 2);
        assert!(ports.iter().all(|p| (20000..=20009).contains(p)) && ports[0] != ports[1], "{ports:?}");
        let services = &model.gateway_services;
        assert_eq!(services.len(), 2);
        assert_eq!(services[0].name, crate::gateway::gateway_service_name("ns", "old"));
        assert_eq!(services[0].ports.len(), 1);
        assert_eq!(services[0].ports[0].0, 80);
        assert!(ports.contains(&services[0].ports[0].1));
        // No address yet: served, not programmed.
        assert_eq!(gateway_condition(&model, "old", "Programmed"), (false, "AddressNotAssigned"));
        inputs.service_addresses.insert(services[0].name.clone(), vec!["127.0.7.1".into()]);
        let model = build(&settings, &inputs);
        assert_eq!(gateway_condition(&model, "old", "Programmed"), (true, "Programmed"));
        let status = model.status.iter().find(|s| s.name == "old").expect("status");
        let Body::Gateway { addresses, .. } = &status.body else { panic!() };
        assert_eq!(addresses, &vec!["127.0.7.1".to_owned()]);
    }

    #[test]
    fn a_gateways_fleet_port_stays_as_other_gateways_come_and_go() {
        let settings = with_services();
        let alone = build(&settings, &inputs(two_gateways_on_port_80(&["a"]), json!([])));
        let port_alone = alone.gateway_services[0].ports[0].1;
        for others in [vec!["a", "b"], vec!["a", "b", "c", "d"]] {
            let model = build(&settings, &inputs(two_gateways_on_port_80(&others), json!([])));
            assert_eq!(model.gateway_services[0].ports[0].1, port_alone, "with {others:?}");
        }
        // A full range refuses the listener that finds no port, and only it.
        let many: Vec<String> = (0..11).map(|i| format!("g{i:02}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let model = build(&settings, &inputs(two_gateways_on_port_80(&names), json!([])));
        assert_eq!(model.gateway_services.len(), 10);
        assert_eq!(listener_reason(&model, "g10", "http", "Accepted"), (false, "PortUnavailable"));
    }

    #[test]
    fn http_listeners_share_the_ingress_port_and_other_protocols_are_refused_there() {
        let settings = GatewaySettings { shared_http_port: Some(8080), ..settings() };
        let model = build(
            &settings,
            &inputs(
                gateway(json!([
                    {"name": "web", "port": 8080, "protocol": "HTTP", "hostname": "a.example.com"},
                    {"name": "raw", "port": 8080, "protocol": "TCP"},
                ])),
                json!([]),
            ),
        );
        assert_eq!(model.frontends.len(), 1);
        assert!(model.frontends[0].shared);
        let gateway = model.status.iter().find(|s| s.kind == "Gateway").expect("gateway status");
        let Body::Gateway { listeners, .. } = &gateway.body else { panic!() };
        let accepted = |name: &str| {
            let l = listeners.iter().find(|l| l.name == name).expect("listener");
            l.conditions.iter().find(|c| c.kind == "Accepted").map(|c| (c.status, c.reason)).expect("condition")
        };
        assert_eq!(accepted("web"), (true, "Accepted"));
        assert_eq!(accepted("raw"), (false, "PortUnavailable"));
    }

    #[test]
    fn references_resolve_or_say_why_and_bad_rules_refuse_their_route_alone() {
        let model = build(
            &settings(),
            &inputs(
                gateway(json!([{"name": "web", "port": 80, "protocol": "HTTP"}])),
                json!([
                    http_route(
                        "cross",
                        "t1",
                        json!([]),
                        json!([{"backendRefs": [{"name": "a", "namespace": "other", "port": 80}]}])
                    ),
                    http_route("missing", "t2", json!([]), json!([{"backendRefs": [{"name": "zz", "port": 80}]}])),
                    http_route(
                        "kind",
                        "t3",
                        json!([]),
                        json!([{"backendRefs": [{"kind": "Pod", "name": "a", "port": 80}]}])
                    ),
                    http_route(
                        "bad",
                        "t4",
                        json!([]),
                        json!([{"filters": [{"type": "ExtensionRef"}], "backendRefs": [{"name": "a", "port": 80}]}])
                    ),
                    http_route(
                        "good",
                        "t5",
                        json!(["g.example.com"]),
                        json!([{"backendRefs": [{"name": "a", "port": 80}]}])
                    ),
                ]),
            ),
        );
        assert_eq!(route_condition(&model, "cross", "ResolvedRefs"), (false, "RefNotPermitted"));
        assert_eq!(route_condition(&model, "missing", "ResolvedRefs"), (false, "BackendNotFound"));
        assert_eq!(route_condition(&model, "kind", "ResolvedRefs"), (false, "InvalidKind"));
        assert_eq!(route_condition(&model, "bad", "Accepted"), (false, "UnsupportedValue"));
        assert_eq!(route_condition(&model, "good", "Accepted"), (true, "Accepted"));
        assert!(model.rule_backends.iter().any(|b| b.name == INVALID_BACKEND && b.fixed_status == Some(500)));
        let keys: Vec<&str> = model.frontends[0].prefix_entries.iter().map(|e| e.key.as_str()).collect();
        assert!(keys.contains(&"ns_gw_web|g.example.com/"));
    }

    #[test]
    fn weights_and_filters_give_a_rule_its_own_backend() {
        let model = build(
            &settings(),
            &inputs(
                gateway(json!([{"name": "web", "port": 80, "protocol": "HTTP"}])),
                json!([http_route(
                    "r",
                    "t",
                    json!([]),
                    json!([
                        {"backendRefs": [{"name": "a", "port": 80, "weight": 3}, {"name": "b", "port": 80, "weight": 1}]},
                        {"matches": [{"path": {"type": "PathPrefix", "value": "/old/"}}],
                         "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}],
                         "backendRefs": [{"name": "a", "port": 80}]},
                    ])
                )]),
            ),
        );
        let weighted = model.rule_backends.iter().find(|b| b.name == "http_ns_r_r1").expect("rule backend");
        assert!(weighted.weighted);
        assert_eq!(weighted.refs.iter().map(|r| r.weight).collect::<Vec<_>>(), vec![3, 1]);
        let rewrite = model.rule_backends.iter().find(|b| b.name == "http_ns_r_r2").expect("rule backend");
        let path = rewrite.rewrite_path.as_ref().expect("rewrite");
        assert_eq!((path.pattern.as_str(), path.replacement.as_str()), ("^/old(/.*)?$", "/new\\1"));
    }

    #[test]
    fn durations_read_as_the_gateway_api_writes_them() {
        assert_eq!(duration_ms("1h30m"), Some(5_400_000));
        assert_eq!(duration_ms("500ms"), Some(500));
        assert_eq!(duration_ms("10s"), Some(10_000));
        assert_eq!(duration_ms("0s"), Some(0));
        assert_eq!(duration_ms("10x"), None);
    }
}

/// The model checked against the spec: HAProxy's evaluation of the model (listener, map lookups
/// stage by stage, then the conditional rules in order) picks, for random routes and requests,
/// the backend the Gateway API's precedence picks from all routes directly.
#[cfg(test)]
mod precedence {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    const HOSTS: [&str; 4] = ["a.example.com", "b.a.example.com", "c.example.com", "other.org"];
    const ROUTE_HOSTS: [&str; 4] = ["a.example.com", "*.example.com", "*.a.example.com", "b.a.example.com"];
    const PATHS: [&str; 4] = ["/", "/x", "/x/y", "/xy"];
    const REQUEST_PATHS: [&str; 7] = ["/", "/x", "/x/", "/x/y", "/x/y/z", "/xy", "/xyz"];

    #[derive(Clone, Debug)]
    struct RuleSpec {
        exact: bool,
        path: usize,
        header: bool,
        post: bool,
        service: usize,
    }

    #[derive(Clone, Debug)]
    struct RouteSpec {
        hosts: Vec<usize>,
        rules: Vec<RuleSpec>,
    }

    fn rule_spec() -> impl Strategy<Value = RuleSpec> {
        (any::<bool>(), 0..PATHS.len(), prop::bool::weighted(0.3), prop::bool::weighted(0.2), 0..6usize)
            .prop_map(|(exact, path, header, post, service)| RuleSpec { exact, path, header, post, service })
    }

    fn route_spec() -> impl Strategy<Value = RouteSpec> {
        (prop::collection::vec(0..ROUTE_HOSTS.len(), 0..3), prop::collection::vec(rule_spec(), 1..4))
            .prop_map(|(hosts, rules)| RouteSpec { hosts, rules })
    }

    fn inputs(routes: &[RouteSpec]) -> Inputs {
        let mut inputs = Inputs {
            classes: vec![
                serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"controllerName": "t"}})).unwrap(),
            ],
            gateways: vec![
                serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": "gw"}, "spec": {
                "gatewayClassName": "c", "listeners": [{"name": "web", "port": 80, "protocol": "HTTP"}]}}))
                .unwrap(),
            ],
            ..Inputs::default()
        };
        for service in 0..6 {
            let name = format!("s{service}");
            let object = json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"ports": [{"port": 80}]}});
            inputs.services.insert(("ns".into(), name), serde_json::from_value(object).unwrap());
        }
        for (index, route) in routes.iter().enumerate() {
            let mut hostnames: Vec<&str> = route.hosts.iter().map(|h| ROUTE_HOSTS[*h]).collect();
            hostnames.dedup();
            let rules: Vec<serde_json::Value> = route
                .rules
                .iter()
                .map(|rule| {
                    let mut m = json!({"path": {"type": if rule.exact { "Exact" } else { "PathPrefix" }, "value": PATHS[rule.path]}});
                    if rule.header {
                        m["headers"] = json!([{"name": "h", "value": "1"}]);
                    }
                    if rule.post {
                        m["method"] = json!("POST");
                    }
                    json!({"matches": [m], "backendRefs": [{"name": format!("s{}", rule.service), "port": 80}]})
                })
                .collect();
            let object = json!({"metadata": {"namespace": "ns", "name": format!("r{index}"),
                                             "creationTimestamp": format!("2026-01-01T00:00:{:02}Z", index % 3)},
                                "spec": {"parentRefs": [{"name": "gw"}], "hostnames": hostnames, "rules": rules}});
            inputs.http_routes.push(serde_json::from_value(object).unwrap());
        }
        inputs
    }

    /// HAProxy's evaluation of the library's frontend for one request.
    fn haproxy(frontend: &Frontend, host: &str, path: &str, header: bool, post: bool) -> String {
        let listener = &frontend.listeners[0].id;
        let exact: BTreeMap<&str, &str> =
            frontend.exact_entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
        let prefixes: Vec<(&str, &str)> =
            frontend.prefix_entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
        let levels = ["", "^[^.]*", "^[^.]*.[^.]*", "^[^.]*.[^.]*.[^.]*"];
        let mut stages: Vec<String> = levels
            .iter()
            .map(|pattern| {
                if pattern.is_empty() {
                    host.to_owned()
                } else {
                    regex::Regex::new(pattern).unwrap().replace(host, "*").into_owned()
                }
            })
            .collect();
        stages.push(String::new());
        let mut found: Option<String> = None;
        for stage in &stages {
            let key = format!("{listener}|{stage}{path}");
            if let Some(value) = exact.get(key.as_str()) {
                found = Some((*value).to_owned());
                break;
            }
            let key = format!("{key}/");
            // map_beg: the longest key the looked-up string starts with.
            if let Some((_, value)) = prefixes.iter().filter(|(k, _)| key.starts_with(k)).max_by_key(|(k, _)| k.len()) {
                found = Some((*value).to_owned());
                break;
            }
        }
        let mut chosen = found.unwrap_or_else(|| "-1:not_found".into());
        for rule in &frontend.conditional {
            let current: i64 = chosen.split(':').next().unwrap().parse().unwrap();
            let host_ok = match rule.host_kind {
                HostKind::Exact => rule.host.as_deref() == Some(host),
                HostKind::Wildcard => host.ends_with(rule.suffix.as_deref().unwrap()),
                HostKind::None => true,
            };
            let path_ok = match rule.path_kind {
                "exact" => path == rule.path,
                _ => format!("{path}/").starts_with(&rule.prefix_key),
            };
            let method_ok = rule.method.as_deref().is_none_or(|m| (m == "POST") == post);
            let headers_ok = rule.headers.iter().all(|_| header);
            if host_ok && path_ok && method_ok && headers_ok && rule.listener == *listener && current < rule.rank as i64
            {
                chosen = rule.value.clone();
            }
        }
        chosen.split(':').nth(1).unwrap().to_owned()
    }

    /// The spec's criteria in order: hostname, path type, path length, method, header matches.
    type Precedence = (u64, u8, usize, bool, usize);

    /// The Gateway API's own answer: of every rule that matches, the one its precedence puts
    /// first.
    fn spec(routes: &[RouteSpec], host: &str, path: &str, header: bool, post: bool) -> String {
        let mut order: Vec<usize> = (0..routes.len()).collect();
        order.sort_by_key(|i| (i % 3, format!("r{i}")));
        let mut best: Option<(Precedence, String)> = None;
        for index in order {
            let route = &routes[index];
            let mut hostnames: Vec<Option<&str>> = route.hosts.iter().map(|h| Some(ROUTE_HOSTS[*h])).collect();
            if hostnames.is_empty() {
                hostnames.push(None);
            }
            for rule in &route.rules {
                let rule_path = PATHS[rule.path];
                let path_ok = if rule.exact {
                    path == rule_path
                } else {
                    let trimmed = rule_path.trim_end_matches('/');
                    path == trimmed || path.starts_with(&format!("{trimmed}/")) || trimmed.is_empty()
                };
                if !path_ok || (rule.header && !header) || (rule.post && !post) {
                    continue;
                }
                for name in &hostnames {
                    if !name.is_none_or(|n| hostnames::matches(n, host)) {
                        continue;
                    }
                    let key = (
                        hostnames::specificity(*name),
                        if rule.exact { 2 } else { 1 },
                        rule_path.trim_end_matches('/').len(),
                        rule.post,
                        usize::from(rule.header),
                    );
                    // Strictly better only: on ties the first (older route, earlier rule) stays.
                    if best.as_ref().is_none_or(|(b, _)| key > *b) {
                        best = Some((key, format!("ns_s{}_80", rule.service)));
                    }
                }
            }
        }
        best.map_or_else(|| "not_found".into(), |(_, backend)| backend)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn maps_and_conditional_rules_choose_as_the_spec_orders(
            routes in prop::collection::vec(route_spec(), 1..6),
            requests in prop::collection::vec((0..HOSTS.len(), 0..REQUEST_PATHS.len(), any::<bool>(), any::<bool>()), 1..12),
        ) {
            let model = build(&GatewaySettings { controller_name: "t".into(), reserved_ports: vec![], shared_http_port: None, addresses: vec![], gateway_services: None }, &inputs(&routes));
            let frontend = &model.frontends[0];
            for (host, path, header, post) in requests {
                let (host, path) = (HOSTS[host], REQUEST_PATHS[path]);
                prop_assert_eq!(
                    haproxy(frontend, host, path, header, post),
                    spec(&routes, host, path, header, post),
                    "{} {} header={} post={}", host, path, header, post
                );
            }
        }
    }
}
