//! Functions an ingress library needs often enough that they are worth doing in Rust:
//! correct once, and fast when a template calls them for every route.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, Value};
use minijinja::{Error, ErrorKind};

use crate::store::compact::{self, Node};

/// One address of one endpoint, for one port (`endpoints(...)`).
#[derive(Debug)]
struct Endpoint {
    address: Value,
    port: Value,
    ready: bool,
    serving: bool,
    terminating: bool,
}

impl Object for Endpoint {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get_value_by_str(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        Some(match key {
            "address" => self.address.clone(),
            "port" => self.port.clone(),
            "ready" => Value::from(self.ready),
            "serving" => Value::from(self.serving),
            "terminating" => Value::from(self.terminating),
            _ => return None,
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["address", "port", "ready", "serving", "terminating"])
    }
}

fn attr(value: &Value, name: &str) -> Option<Value> {
    value.get_attr(name).ok().filter(|v| !v.is_undefined() && !v.is_none())
}

fn flag(conditions: Option<&Value>, name: &str) -> Option<bool> {
    conditions.and_then(|c| attr(c, name)).map(|v| v.is_true())
}

/// `endpoints(slices, port_name)`: every address of the given EndpointSlices with the port
/// named `port_name` (or the slices' unnamed port when it is none or empty), and its
/// conditions as the EndpointSlice API defines them: an absent `ready` means ready, an absent
/// `serving` means the same as `ready`, an absent `terminating` means not terminating.
/// Slices without that port contribute nothing. Order: slices as given, endpoints as listed.
pub(crate) fn endpoints(slices: &Value, port_name: Option<&Value>) -> Result<Value, Error> {
    let wanted = port_name.and_then(Value::as_str).filter(|name| !name.is_empty());
    let iter = slices.try_iter().map_err(|_| {
        Error::new(ErrorKind::InvalidOperation, "endpoints(slices, port_name): slices must be a list of EndpointSlices")
    })?;
    let mut found = Vec::new();
    for slice in iter {
        // A stored slice is read in place: at 10,000 Services, making a template value of each
        // of its parts was a tenth of the default library's render.
        if let Some(members) = super::context::stored_members(&slice) {
            stored_slice_endpoints(&slice, members, wanted, &mut found)?;
            continue;
        }
        let Some(ports) = attr(&slice, "ports") else { continue };
        let Some(port) = ports.try_iter().ok().into_iter().flatten().find(|port| {
            let name = attr(port, "name");
            match wanted {
                Some(wanted) => name.as_ref().and_then(Value::as_str) == Some(wanted),
                None => name.as_ref().and_then(Value::as_str).is_none_or(str::is_empty),
            }
        }) else {
            continue;
        };
        let Some(port_number) = attr(&port, "port") else { continue };
        let Some(endpoints) = attr(&slice, "endpoints") else { continue };
        for (endpoint_index, endpoint) in endpoints.try_iter().ok().into_iter().flatten().enumerate() {
            let conditions = attr(&endpoint, "conditions");
            let ready = flag(conditions.as_ref(), "ready").unwrap_or(true);
            let serving = flag(conditions.as_ref(), "serving").unwrap_or(ready);
            let terminating = flag(conditions.as_ref(), "terminating").unwrap_or(false);
            let Some(addresses) = attr(&endpoint, "addresses") else { continue };
            for (address_index, address) in addresses.try_iter().ok().into_iter().flatten().enumerate() {
                let address = endpoint_address(&slice, address, endpoint_index, address_index)?;
                found.push(Value::from_object(Endpoint {
                    address,
                    port: port_number.clone(),
                    ready,
                    serving,
                    terminating,
                }));
            }
        }
    }
    Ok(Value::from(found))
}

/// An endpoint's address as HAProxy is given it: an IP address in its plain form, never a
/// name (an FQDN EndpointSlice would have HAProxy resolve whatever it holds: its own Dataplane
/// API, a cloud metadata service) and never a loopback, link-local, unspecified or multicast
/// address (the HAProxy pod's own ports, the metadata service), as Kubernetes refuses them in
/// Endpoints. Any other is refused, the EndpointSlice blamed, so the controller leaves it out.
fn endpoint_address(slice: &Value, address: Value, endpoint: usize, index: usize) -> Result<Value, Error> {
    let text = address.as_str().unwrap_or_default();
    let usable = match text.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => {
            !(ip.is_loopback() || ip.is_link_local() || ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast())
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            let link_local = ip.segments()[0] & 0xffc0 == 0xfe80;
            let mapped = ip.to_ipv4_mapped().is_some();
            !(ip.is_loopback() || link_local || ip.is_unspecified() || ip.is_multicast() || mapped)
        }
        Err(_) => false,
    };
    if !usable {
        let field = format!("endpoints[{endpoint}].addresses[{index}]");
        return Err(super::context::refuse(
            slice,
            &field,
            "endpoints: the address is not one HAProxy may be sent to (an IP address, not a name, \
             not loopback, link-local, unspecified or multicast)",
        ));
    }
    // The plain form (`::ffff:…` and zero-padded IPv6 written as HAProxy reads them).
    let plain = text.parse::<std::net::IpAddr>().map(|ip| ip.to_string()).unwrap_or_default();
    Ok(if plain == text { address } else { Value::from(plain) })
}

/// `endpoints(...)` of one stored EndpointSlice, read from its compact tree; the same answers
/// as the template-value walk above (a unit test holds them together).
fn stored_slice_endpoints(
    slice: &Value,
    members: &[(Arc<str>, Node)],
    wanted: Option<&str>,
    found: &mut Vec<Value>,
) -> Result<(), Error> {
    let present = |key: &str| compact::member(members, key).filter(|node| !matches!(node, Node::Null));
    let Some(ports) = present("ports") else { return Ok(()) };
    let Some(port) = ports.items().iter().find(|port| {
        let name = port.get("name").and_then(Node::as_str);
        match wanted {
            Some(wanted) => name == Some(wanted),
            None => name.is_none_or(str::is_empty),
        }
    }) else {
        return Ok(());
    };
    let Some(port_number) = port.get("port").map(Node::to_value) else { return Ok(()) };
    let Some(endpoints) = present("endpoints") else { return Ok(()) };
    for (endpoint_index, endpoint) in endpoints.items().iter().enumerate() {
        let conditions = endpoint.get("conditions");
        let flag = |name: &str| conditions.and_then(|c| c.get(name)).map(|v| v.to_value().is_true());
        let ready = flag("ready").unwrap_or(true);
        let serving = flag("serving").unwrap_or(ready);
        let terminating = flag("terminating").unwrap_or(false);
        let Some(addresses) = endpoint.get("addresses") else { continue };
        for (address_index, address) in addresses.items().iter().enumerate() {
            found.push(Value::from_object(Endpoint {
                address: endpoint_address(slice, address.to_value(), endpoint_index, address_index)?,
                port: port_number.clone(),
                ready,
                serving,
                terminating,
            }));
        }
    }
    Ok(())
}

/// One (rule, path) of an Ingress, as `ingress_routes(...)` gives it.
#[derive(Debug)]
pub(crate) struct Route {
    namespace: Value,
    ingress: Value,
    /// The Ingress itself, as `ingress_routes` was given it: a backend's block reads its
    /// settings from it without looking it up again (a route is made anew whenever its
    /// Ingress changes, so a block keyed by the route never holds a stale one).
    ingress_object: Value,
    host: Value,
    path: Value,
    path_length: usize,
    /// When its Ingress was created (seconds since the epoch; `u32::MAX` when it does not say):
    /// the oldest Ingress keeps a host and path, or an SSL-passthrough host, that several ask for.
    created: u32,
    path_type: Value,
    prefix_key: Value,
    host_kind: &'static str,
    rule: usize,
    index: usize,
    service: Value,
    id: Value,
    backend: Value,
    /// Whether its Ingress asks for SSL passthrough (TLS to the Service by SNI, not terminated).
    passthrough: bool,
    /// For a www twin (`from-to-www-redirect`), the host it redirects to; none otherwise.
    www_of: Value,
    /// Whether its Ingress is a canary (`canary`): its routes take requests from another
    /// Ingress's routes of the same host and path, not from the maps.
    canary: bool,
    /// Its Ingress's fingerprint with the rule and path indexes: everything above follows from
    /// them (none when the Ingress has no fingerprint).
    fingerprint: Option<super::memo::Fingerprint>,
    /// The fingerprint of the name `distinct` last claimed for its backend, with that of the
    /// claim's prefix: a route of an unchanged Ingress is the same object render after render
    /// (replayed by its Ingress's block), and `distinct` claims a name for each of 10,000.
    backend_claim: std::sync::OnceLock<(super::memo::Fingerprint, super::memo::Fingerprint)>,
}

impl Route {
    /// The backend the route goes to.
    pub(crate) fn backend(&self) -> &Value {
        &self.backend
    }

    /// The fingerprint of the name `prefix ~ backend` (`prefix_fingerprint` being the
    /// prefix's own), as `memo::name_fingerprint` makes it; kept for the next render's asking.
    pub(crate) fn backend_claim(
        &self,
        prefix: &str,
        prefix_fingerprint: super::memo::Fingerprint,
    ) -> super::memo::Fingerprint {
        if let Some((for_prefix, claim)) = self.backend_claim.get()
            && *for_prefix == prefix_fingerprint
        {
            return *claim;
        }
        let mut name = String::with_capacity(prefix.len() + self.backend.as_str().map_or(0, str::len));
        name.push_str(prefix);
        name.push_str(self.backend.as_str().unwrap_or_default());
        let claim = super::memo::name_fingerprint(&name);
        // A route asked under another prefix keeps its first answer: right, just not kept.
        let _ = self.backend_claim.set((prefix_fingerprint, claim));
        claim
    }
}

/// The route the value is, if it is one.
pub(crate) fn as_route(value: &Value) -> Option<&Route> {
    value.downcast_object_ref::<Route>()
}

impl super::memo::Fingerprinted for Route {
    fn feed(&self, digest: &mut super::memo::Digest) -> bool {
        use std::hash::Hash;
        let Some(fingerprint) = self.fingerprint else { return false };
        fingerprint.hash(digest);
        true
    }
}

/// The route's own fingerprint, when the value is a route.
pub(crate) fn route_fingerprinted(value: &Value) -> Option<&dyn super::memo::Fingerprinted> {
    value.downcast_object_ref::<Route>().map(|route| route as &dyn super::memo::Fingerprinted)
}

impl Object for Route {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get_value_by_str(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        Some(match key {
            "namespace" => self.namespace.clone(),
            "ingress" => self.ingress.clone(),
            "ingress_object" => self.ingress_object.clone(),
            "host" => self.host.clone(),
            "path" => self.path.clone(),
            "path_length" => Value::from(self.path_length),
            "created" => Value::from(self.created),
            "precedence" => Value::from(precedence(self.path_length, self.created)),
            "path_type" => self.path_type.clone(),
            "prefix_key" => self.prefix_key.clone(),
            "host_kind" => Value::from(self.host_kind),
            "rule" => Value::from(self.rule),
            "index" => Value::from(self.index),
            "service" => self.service.clone(),
            "id" => self.id.clone(),
            "backend" => self.backend.clone(),
            "passthrough" => Value::from(self.passthrough),
            "www_of" => self.www_of.clone(),
            "canary" => Value::from(self.canary),
            _ => return None,
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&[
            "namespace",
            "ingress",
            "ingress_object",
            "host",
            "path",
            "path_length",
            "created",
            "precedence",
            "path_type",
            "prefix_key",
            "host_kind",
            "rule",
            "index",
            "service",
            "id",
            "backend",
            "passthrough",
            "www_of",
            "canary",
        ])
    }
}

/// `ingress_tls(ingress)`: the Ingress's `spec.tls` entries as `{secretName, hosts, created}`,
/// each host one its own rules route. An entry without hosts is for the hosts of the
/// Ingress's rules (never for whatever names its certificate holds: that would let it serve
/// hosts other Ingresses route). A host none of its rules routes (a wildcard counts for the
/// hosts one label under it) is refused, the Ingress blamed: a certificate is served only for
/// a host the Ingress routes. `created` orders entries oldest first (see `precedence`).
pub(crate) fn ingress_tls(ingress: &Value) -> Result<Value, Error> {
    let spec = attr(ingress, "spec");
    let tls = spec.as_ref().and_then(|spec| attr(spec, "tls"));
    // Most Ingresses have no TLS entry: their rules' hosts need no reading (at 10,000
    // Ingresses, reading and checking them anyway was a tenth of a full render).
    if tls.as_ref().is_none_or(|tls| tls.len() == Some(0)) {
        return Ok(Value::from(Vec::<Value>::new()));
    }
    let metadata = attr(ingress, "metadata");
    let mut routed: Vec<String> = Vec::new();
    let rules = spec.as_ref().and_then(|spec| attr(spec, "rules"));
    for rule in rules.iter().flat_map(|r| r.try_iter().ok()).flatten() {
        if let Some(host) = attr(&rule, "host").filter(|h| !h.to_string().is_empty()) {
            routed.push(super::filters::hostname(&host.to_string())?);
        }
    }
    let created = created_at(metadata.as_ref());
    let mut entries = Vec::new();
    for (entry_index, entry) in tls.iter().flat_map(|t| t.try_iter().ok()).flatten().enumerate() {
        let mut hosts = Vec::new();
        let listed = attr(&entry, "hosts");
        for (host_index, host) in listed.iter().flat_map(|h| h.try_iter().ok()).flatten().enumerate() {
            let host = super::filters::hostname(&host.to_string())?;
            if !routed.iter().any(|rule_host| tls_host_covers(&host, rule_host)) {
                let field = format!("spec.tls[{entry_index}].hosts[{host_index}]");
                return Err(super::context::refuse(
                    ingress,
                    &field,
                    "ingress_tls: the TLS host is not a host of this Ingress's rules; a certificate is served only for hosts the Ingress routes",
                ));
            }
            hosts.push(Value::from(host));
        }
        if hosts.is_empty() {
            hosts = routed.iter().map(|host| Value::from(host.as_str())).collect();
        }
        let secret_name = attr(&entry, "secretName").unwrap_or_else(|| Value::from(""));
        let fields = [("secretName", secret_name), ("hosts", Value::from(hosts)), ("created", Value::from(created))];
        entries.push(Value::from(fields.into_iter().collect::<std::collections::BTreeMap<_, _>>()));
    }
    Ok(Value::from(entries))
}

/// Whether a certificate for `tls_host` may serve `rule_host`: the same name, or a wildcard
/// one label above it (`*.example.com` for `shop.example.com`, as TLS wildcards match).
fn tls_host_covers(tls_host: &str, rule_host: &str) -> bool {
    tls_host == rule_host
        || tls_host
            .strip_prefix("*.")
            .is_some_and(|suffix| rule_host.split_once('.').is_some_and(|(label, rest)| label != "*" && rest == suffix))
}

/// When an object was created, in seconds since the epoch, from its metadata's
/// `creationTimestamp` (`u32::MAX`, the newest, when it does not say, as in offline renders).
fn created_at(metadata: Option<&Value>) -> u32 {
    metadata
        .and_then(|m| attr(m, "creationTimestamp"))
        .and_then(|t| t.as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()))
        .map_or(u32::MAX, |t| u32::try_from(t.as_second().max(0)).unwrap_or(u32::MAX))
}

/// When a stored object was created, in seconds since the epoch (`u32::MAX` when it does not say).
pub(crate) fn created_seconds(object: &Value) -> u32 {
    created_at(attr(object, "metadata").as_ref())
}

/// `created_at(object)`: when the object was created, in seconds since the epoch (`u32::MAX`
/// when it does not say): contested things go to the oldest object that asks for them.
pub(crate) fn object_created(object: &Value) -> Value {
    Value::from(created_at(attr(object, "metadata").as_ref()))
}

/// A route's place among the routes of a map, highest first: longest path first, then oldest
/// Ingress first. The first route to claim a host and path keeps it, so a later Ingress in
/// any namespace cannot take a host and path an older one routes (as the Gateway API decides
/// between routes: oldest, then by namespace and name, the order routes are pushed in).
fn precedence(path_length: usize, created: u32) -> i64 {
    let length = i64::try_from(path_length.min(u32::MAX as usize)).unwrap_or(i64::from(u32::MAX));
    (length << 32) | i64::from(u32::MAX - created)
}

/// `ingress_routes(ingress)`: one route per (rule, path) of a `networking.k8s.io/v1` Ingress,
/// with `id` = `<namespace>_<name>_<rule>_<path>` (1-based; unique, and stable while the
/// Ingress is unchanged). A host or path that cannot be written into a map file is refused and
/// the Ingress blamed, so the controller can leave it out. Rules without `http` give no route;
/// a path without `path` is `/`. `prefix_key` is the path without trailing slashes plus one
/// `/`: matched against the request path plus `/`, a string prefix match becomes the Ingress
/// spec's element-wise one (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`). `host_kind`
/// is `exact`, `wildcard` (`*.example.com`) or `none`. `backend` names the backend the route
/// goes to: `<namespace>_<service>_<port>`, shared by every route to that Service port, so
/// that adding or removing a route to a Service that already has a backend changes map
/// entries only; an Ingress with `haptic.dev/` annotations (settings of its backends) has
/// backends of its own, `<namespace>_<service>_<port>_<ingress>`. A route without a Service
/// backend goes to one named by its `id`.
pub(crate) fn ingress_routes(ingress: &Value) -> Result<Value, Error> {
    let text = |v: Option<Value>| v.map(|v| v.to_string()).unwrap_or_default();
    let metadata = attr(ingress, "metadata");
    let namespace = text(metadata.as_ref().and_then(|m| attr(m, "namespace")));
    let name = text(metadata.as_ref().and_then(|m| attr(m, "name")));
    let annotations = metadata.as_ref().and_then(|m| attr(m, "annotations"));
    // An Ingress asking for what haptic does not do, where serving it without would leave it
    // open (external auth, client certificates, a WAF...), is refused whatever else it asks.
    if let Some(annotations) = &annotations {
        super::annotations::refuse_unsupported(annotations)
            .map_err(super::annotations::AnnotationError::into_render_error)?;
    }
    let extras = HostExtras::of(annotations.as_ref())?;
    let on = |key: &str| annotation_on(annotations.as_ref(), key);
    let (passthrough, canary) = (on("ssl-passthrough"), on("canary"));
    let regex_paths = on("use-regex") || annotation_value(annotations.as_ref(), "regex-rewrite-target").is_some();
    let own_backends =
        annotations.as_ref().and_then(|annotations| annotations.try_iter().ok()).is_some_and(|mut keys| {
            keys.any(|key| {
                key.as_str().is_some_and(|k| k.starts_with("haptic.dev/") || super::annotations::is_setting(k))
            })
        });
    let made = RouteMaker {
        namespace_value: Value::from(namespace.as_str()),
        name_value: Value::from(name.as_str()),
        ingress,
        ingress_fingerprint: super::memo::fingerprint(ingress),
        created: created_at(metadata.as_ref()),
        passthrough,
        canary,
    };
    let mut routes = Vec::new();
    let rules = attr(ingress, "spec").and_then(|spec| attr(&spec, "rules"));
    for (rule_index, rule) in rules.iter().flat_map(|r| r.try_iter().ok()).flatten().enumerate() {
        let host = match attr(&rule, "host") {
            Some(host) => super::filters::hostname(&host.to_string())?,
            None => String::new(),
        };
        let paths = attr(&rule, "http").and_then(|http| attr(&http, "paths"));
        for (path_index, path) in paths.iter().flat_map(|p| p.try_iter().ok()).flatten().enumerate() {
            let prefix = attr(&path, "path").map(|p| p.to_string()).unwrap_or_else(|| "/".to_owned());
            let path_type = attr(&path, "pathType").map(|t| t.to_string()).unwrap_or_else(|| "Prefix".to_owned());
            // ingress-nginx's regex paths (use-regex, or a rewrite-target of its): any but Exact.
            let regex = regex_paths && path_type != "Exact";
            let prefix = if regex { path_regex(&prefix)? } else { super::filters::url_path(&prefix)? };
            let service = attr(&path, "backend").and_then(|b| attr(&b, "service")).unwrap_or_default();
            let id = format!("{namespace}_{name}_{}_{}", rule_index + 1, path_index + 1);
            let backend = match service_backend(&service) {
                Some(shared) if own_backends => format!("{namespace}_{shared}_{name}"),
                Some(shared) => format!("{namespace}_{shared}"),
                None => id.clone(),
            };
            let path_type = Value::from(if regex { "Regex" } else { path_type.as_str() });
            let place = RoutePlace { rule: rule_index + 1, index: path_index + 1, path_type, prefix: &prefix };
            for (variant, (variant_host, www_of)) in extras.hosts(&host).into_iter().enumerate() {
                routes.push(made.route(&place, variant, variant_host, www_of, service.clone(), &id, &backend));
            }
        }
    }
    Ok(Value::from(routes))
}

/// An Ingress path as ingress-nginx's regex (use-regex): a regular expression the `regex`
/// crate and PCRE both read alike enough, without whitespace (a map key), at most
/// `MAP_KEY_LIMIT` bytes, starting with `/` (after an optional `^`).
fn path_regex(path: &str) -> Result<String, Error> {
    let refused = |why: &str| {
        super::context::blame_value(path);
        Error::new(ErrorKind::InvalidOperation, format!("the path is not a regular expression haptic can route: {why}"))
    };
    if path.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\'') {
        return Err(refused("it holds a space, a control character or a quote"));
    }
    if path.len() > super::filters::MAP_KEY_LIMIT {
        return Err(refused("it is too long"));
    }
    if !path.trim_start_matches('^').starts_with('/') {
        return Err(refused("it does not start with /"));
    }
    regex::Regex::new(path).map_err(|_| refused("it does not parse"))?;
    Ok(path.to_owned())
}

/// `canary_stride(total)`: the step through a cycle of `total` requests that spreads a canary's
/// share evenly: the first number from 0.618 of the total on that shares no factor with it (so
/// every residue is visited once a cycle).
fn canary_stride(total: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let start = (total as f64 * 0.618) as u64;
    (start.max(1)..=total.max(1)).find(|stride| gcd(*stride, total) == 1).unwrap_or(1)
}

/// `regex_map_key(route)`: the key of a regex route in `regex.map` (looked up with `map_reg`
/// on host+path): case-insensitive, anchored, its host as the route's host kind says.
fn regex_map_key(route: &Value) -> Result<Value, Error> {
    let text = |name: &str| route.get_attr(name).ok().map(|v| v.to_string()).unwrap_or_default();
    let host = text("host");
    let host_pattern = match host.strip_prefix("*.") {
        _ if host.is_empty() => "[^/]*".to_owned(),
        Some(domain) => format!("[^./]+\\.{}", regex::escape(domain)),
        None => regex::escape(&host),
    };
    let key = format!("(?i)^{host_pattern}{}", text("path").trim_start_matches('^'));
    super::filters::map_key(&key).map(Value::from_safe_string)
}

/// The hosts an Ingress's annotations add to each of its rules' hosts: aliases
/// (`server-alias`) and the www twin (`from-to-www-redirect`), each routed as the rule is.
#[derive(Default)]
struct HostExtras {
    aliases: Vec<String>,
    www: bool,
}

impl HostExtras {
    fn of(annotations: Option<&Value>) -> Result<Self, Error> {
        let aliases = match annotation_value(annotations, "server-alias").map(|value| value.to_string()) {
            Some(list) => list
                .split([',', ' ', '\n'])
                .filter(|host| !host.trim().is_empty())
                .map(|host| super::filters::hostname(&host.trim().to_ascii_lowercase()))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let www = annotation_on(annotations, "from-to-www-redirect");
        Ok(Self { aliases, www })
    }

    /// `host` first, then its aliases and its www twin (with the host the twin redirects to);
    /// a rule without a host gets none.
    fn hosts(&self, host: &str) -> Vec<(String, Option<String>)> {
        let mut hosts = vec![(host.to_owned(), None)];
        if host.is_empty() {
            return hosts;
        }
        hosts.extend(self.aliases.iter().filter(|alias| alias.as_str() != host).map(|alias| (alias.clone(), None)));
        if self.www && !host.starts_with("*.") {
            let twin = match host.strip_prefix("www.") {
                Some(bare) => bare.to_owned(),
                None => format!("www.{host}"),
            };
            hosts.push((twin, Some(host.to_owned())));
        }
        hosts
    }
}

/// Where a route comes from in its Ingress: rule and path (both from 1), the path and its text.
struct RoutePlace<'a> {
    rule: usize,
    index: usize,
    /// `Exact`, `Prefix`, `ImplementationSpecific`, or `Regex` (a path of ingress-nginx's regex).
    path_type: Value,
    prefix: &'a str,
}

/// What every route of one Ingress shares.
struct RouteMaker<'a> {
    namespace_value: Value,
    name_value: Value,
    ingress: &'a Value,
    ingress_fingerprint: Option<super::memo::Fingerprint>,
    created: u32,
    passthrough: bool,
    canary: bool,
}

impl RouteMaker<'_> {
    /// The route of `place` for one of its hosts (`variant` 0 is the rule's own; an alias or a
    /// www twin yields to any Ingress that names the host itself).
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        place: &RoutePlace<'_>,
        variant: usize,
        host: String,
        www_of: Option<String>,
        service: Value,
        id: &str,
        backend: &str,
    ) -> Value {
        let host_kind = match host.as_str() {
            "" => "none",
            h if h.starts_with("*.") => "wildcard",
            _ => "exact",
        };
        let id = if variant == 0 { id.to_owned() } else { format!("{id}_{variant}") };
        Value::from_object(Route {
            namespace: self.namespace_value.clone(),
            ingress: self.name_value.clone(),
            ingress_object: self.ingress.clone(),
            host: Value::from(host),
            path_length: place.prefix.len(),
            created: if variant == 0 { self.created } else { u32::MAX },
            path: Value::from(place.prefix),
            path_type: place.path_type.clone(),
            prefix_key: Value::from(format!("{}/", place.prefix.trim_end_matches('/'))),
            host_kind,
            rule: place.rule,
            index: place.index,
            service,
            id: Value::from(id),
            backend: Value::from(backend),
            passthrough: self.passthrough,
            canary: self.canary,
            www_of: www_of.map(Value::from).unwrap_or_else(|| Value::from(())),
            fingerprint: self.ingress_fingerprint.map(|ingress| {
                super::memo::combine(|digest| {
                    use std::hash::Hash;
                    ingress.hash(digest);
                    (place.rule, place.index, variant).hash(digest);
                })
            }),
            backend_claim: std::sync::OnceLock::new(),
        })
    }
}

/// `<service>_<port>` of an Ingress backend's `service` (`port.number`, else `port.name`), when
/// both are plain names a backend's name can carry.
fn service_backend(service: &Value) -> Option<String> {
    let plain =
        |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    let name = attr(service, "name")?.as_str().filter(|name| plain(name))?.to_owned();
    let port = attr(service, "port")?;
    let port = match attr(&port, "number") {
        Some(number) => u16::try_from(number).ok()?.to_string(),
        None => attr(&port, "name")?.as_str().filter(|name| plain(name))?.to_owned(),
    };
    Some(format!("{name}_{port}"))
}

/// `tls_certificate(secret)`: registers the certificate of a `kubernetes.io/tls` Secret as a
/// file of this render (its `tls.crt` then its `tls.key`, decoded from the Secret's base64)
/// named `<namespace>_<name>.pem`, and gives that name. The name stays when the Secret is
/// renewed, so a renewal is the same file with new content: a Runtime API change, no reload.
/// A Secret without both keys, whose keys are not PEM, or whose key is not its certificate's
/// is refused and blamed before any pod sees it; no error ever quotes the Secret's content.
pub(crate) fn tls_certificate(secret: &Value) -> Result<(String, String), Error> {
    use base64::Engine as _;
    let metadata = attr(secret, "metadata");
    let field = |name: &str| metadata.as_ref().and_then(|m| attr(m, name)).map(|v| v.to_string()).unwrap_or_default();
    let (namespace, name) = (field("namespace"), field("name"));
    let refuse = |why: &str| {
        super::context::blame_field("data");
        Error::new(ErrorKind::InvalidOperation, format!("tls_certificate: Secret {namespace}/{name} {why}"))
    };
    if secret.is_undefined() || secret.is_none() {
        return Err(Error::new(ErrorKind::InvalidOperation, "tls_certificate: no such Secret (is it watched?)"));
    }
    let data = attr(secret, "data").ok_or_else(|| refuse("has no data"))?;
    let decode = |key: &str| -> Result<String, Error> {
        let encoded = attr(&data, key).ok_or_else(|| refuse(&format!("has no {key}")))?.to_string();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| refuse(&format!("has a {key} that is not base64")))?;
        let text = String::from_utf8(bytes).map_err(|_| refuse(&format!("has a {key} that is not PEM text")))?;
        if !text.contains("-----BEGIN ") {
            return Err(refuse(&format!("has a {key} that is not PEM")));
        }
        Ok(text)
    };
    let (certificate, key) = (decode("tls.crt")?, decode("tls.key")?);
    crate::tls::check_pair(&certificate, &key).map_err(|error| refuse(&format!("cannot be served: {error}")))?;
    let mut pem = certificate;
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem.push_str(&key);
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    let file = super::filters::map_key(&format!("{namespace}_{name}.pem"))?;
    Ok((file, pem))
}

/// The data of a Secret, decoded, by key; errors blame the Secret's `data` and never quote it.
fn secret_data(secret: &Value, function: &str) -> Result<(String, Vec<(String, String)>), Error> {
    use base64::Engine as _;
    if secret.is_undefined() || secret.is_none() {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("{function}: no such Secret (is it watched?)")));
    }
    let metadata = attr(secret, "metadata");
    let field = |name: &str| metadata.as_ref().and_then(|m| attr(m, name)).map(|v| v.to_string()).unwrap_or_default();
    let label = format!("{}/{}", field("namespace"), field("name"));
    let refuse = |why: String| {
        super::context::blame_field("data");
        Error::new(ErrorKind::InvalidOperation, format!("{function}: Secret {label} {why}"))
    };
    let data = attr(secret, "data").ok_or_else(|| refuse("has no data".into()))?;
    let mut entries = Vec::new();
    for key in data.try_iter().map_err(|_| refuse("has no data".into()))? {
        let name = key.as_str().unwrap_or_default().to_owned();
        let encoded = data.get_item(&key).map(|v| v.to_string()).unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| refuse(format!("has a {name} that is not base64")))?;
        let text = String::from_utf8(bytes).map_err(|_| refuse(format!("has a {name} that is not text")))?;
        entries.push((name, text));
    }
    Ok((label, entries))
}

/// `ca_file(secret)`: the certificates (only those: never a key) of a Secret's `ca.crt` (else
/// `tls.crt`), as a general file `ca_<namespace>_<name>.pem`; gives that name. A CA bundle is
/// public, so it travels as a plain file, not with the private keys.
pub(crate) fn ca_bundle(secret: &Value) -> Result<(String, String), Error> {
    let (label, entries) = secret_data(secret, "ca_file")?;
    let refuse = |why: &str| {
        super::context::blame_field("data");
        Error::new(ErrorKind::InvalidOperation, format!("ca_file: Secret {label} {why}"))
    };
    let text = ["ca.crt", "tls.crt"]
        .iter()
        .find_map(|wanted| entries.iter().find(|(key, _)| key == wanted).map(|(_, text)| text))
        .ok_or_else(|| refuse("has neither ca.crt nor tls.crt"))?;
    let mut bundle = String::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line == "-----BEGIN CERTIFICATE-----" {
            inside = true;
        }
        if inside {
            bundle.push_str(line);
            bundle.push('\n');
        }
        if line == "-----END CERTIFICATE-----" {
            inside = false;
        }
    }
    if bundle.is_empty() || inside {
        return Err(refuse("holds no complete PEM certificate"));
    }
    let file = super::filters::map_key(&format!("ca_{}.pem", label.replace('/', "_")))?;
    Ok((file, bundle))
}

/// `basic_auth_users(secret, ingress)`: `[user, crypt hash, SHA-1 digest]` from a Secret (one
/// of the two empty), in either peer's form: an `auth` key holding htpasswd lines
/// (`user:hash`, haproxy-ingress and ingress-nginx), or one key per user holding its hash
/// (haproxytech, ingress-nginx's auth-map). Hashes must be crypt(3) forms HAProxy checks (`$5$`,
/// `$6$`, `$2b$`/`$2y$`, `$y$`, `$1$`) or htpasswd's `{SHA}`; its default `$apr1$` is neither,
/// and refuses the Ingress (`ingress`, when given) saying so.
pub(crate) fn basic_auth_users(secret: &Value, ingress: &Value) -> Result<Value, Error> {
    let (label, entries) = secret_data(secret, "basic_auth_users")?;
    // The Ingress asking is refused, saying what is wrong with its Secret: the Secret itself
    // is no one's error until an Ingress reads it as users.
    let refuse = |why: &str| {
        if ingress.is_undefined() || ingress.is_none() {
            super::context::blame_field("data");
        } else {
            super::context::blame_object_field(ingress, "metadata.annotations");
        }
        Error::new(ErrorKind::InvalidOperation, format!("basic_auth_users: Secret {label} {why}"))
    };
    let pairs: Vec<(String, String)> = match entries.iter().find(|(key, _)| key == "auth") {
        Some((_, htpasswd)) => htpasswd
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                line.split_once(':')
                    .map(|(u, h)| (u.to_owned(), h.to_owned()))
                    .ok_or_else(|| refuse("has an auth line that is not user:hash"))
            })
            .collect::<Result<_, _>>()?,
        None => entries.iter().map(|(user, hash)| (user.clone(), hash.trim().to_owned())).collect(),
    };
    let user_ok =
        |u: &str| !u.is_empty() && u.len() <= 64 && u.chars().all(|c| c.is_ascii_alphanumeric() || "._-@".contains(c));
    let hash_ok = |h: &str| {
        ["$1$", "$5$", "$6$", "$2a$", "$2b$", "$2y$", "$y$"].iter().any(|p| h.starts_with(p))
            && h.len() <= 256
            && h.chars().all(|c| c.is_ascii_alphanumeric() || "./$=".contains(c))
    };
    let mut users = Vec::new();
    for (user, hash) in pairs {
        if !user_ok(&user) {
            return Err(refuse("has a user name that is not letters, digits and ._-@"));
        }
        // htpasswd -s: `{SHA}` and the base64 of the password's SHA-1, which HAProxy checks
        // itself (http_auth_pass,sha1,base64) rather than through a userlist.
        if let Some(digest) = hash.strip_prefix("{SHA}") {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD.decode(digest);
            if decoded.map(|bytes| bytes.len()) != Ok(20) {
                return Err(refuse("has a {SHA} hash that is not the base64 of a SHA-1 digest"));
            }
            users.push(Value::from(vec![
                Value::from_safe_string(user),
                Value::from_safe_string(String::new()),
                Value::from_safe_string(format!("'{digest}'")),
            ]));
            continue;
        }
        if hash.starts_with("$apr1$") {
            return Err(refuse(
                "has an $apr1$ hash (htpasswd's default), which HAProxy cannot check: use htpasswd -B, or mkpasswd -m sha-512",
            ));
        }
        if !hash_ok(&hash) {
            return Err(refuse(
                "has a password that is not a crypt(3) hash HAProxy checks ($5$, $6$, $2b$, $2y$, $y$) or {SHA}",
            ));
        }
        users.push(Value::from(vec![
            Value::from_safe_string(user),
            Value::from_safe_string(hash),
            Value::from_safe_string(String::new()),
        ]));
    }
    if users.is_empty() {
        return Err(refuse("names no user"));
    }
    Ok(Value::from(users))
}

/// `tcp_services(configmap, taken_ports)`: the TCP services a ConfigMap names, in the peers'
/// form: each key a port HAProxy listens on (not one of `taken_ports`), each value
/// `<namespace>/<service>:<port>` (the Service's port number or name). Sorted by port.
///
/// An entry that does not fit fails the render, naming the ConfigMap and the entry: the
/// ConfigMap is the operator's, and leaving it out would drop every TCP service, so the pods
/// keep the last good configuration until it is fixed.
pub(crate) fn tcp_services(configmap: &Value, taken_ports: &[u16]) -> Result<Value, Error> {
    if configmap.is_undefined() || configmap.is_none() {
        return Ok(Value::from(Vec::<Value>::new()));
    }
    let Some(data) = attr(configmap, "data") else { return Ok(Value::from(Vec::<Value>::new())) };
    let label = |key: &str| key.chars().filter(|c| c.is_ascii_alphanumeric()).take(8).collect::<String>();
    let metadata = attr(configmap, "metadata");
    let field = |name: &str| metadata.as_ref().and_then(|m| attr(m, name)).map(|v| v.to_string()).unwrap_or_default();
    let where_ = format!("{}/{}", field("namespace"), field("name"));
    let mut services = Vec::new();
    for key in
        data.try_iter().map_err(|_| Error::new(ErrorKind::InvalidOperation, "tcp_services: data is not a map"))?
    {
        let name = key.as_str().unwrap_or_default().to_owned();
        let value = data.get_item(&key).map(|v| v.to_string()).unwrap_or_default();
        let refuse = |why: &str| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("tcp_services: ConfigMap {where_}, entry {}: {why}", label(&name)),
            )
        };
        let port =
            name.trim().parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| refuse("the key is not a port number"))?;
        if taken_ports.contains(&port) {
            return Err(refuse("the port is one HAProxy already serves (HTTP, HTTPS, health or metrics)"));
        }
        let (target, service_port) =
            value.trim().rsplit_once(':').ok_or_else(|| refuse("the value is not namespace/service:port"))?;
        let (namespace, service) =
            target.split_once('/').ok_or_else(|| refuse("the value is not namespace/service:port"))?;
        let label_ok = crate::syntax::is_dns_label;
        if !label_ok(namespace) || !label_ok(service) || !label_ok(service_port) {
            return Err(refuse("the value is not namespace/service:port"));
        }
        // As an Ingress backend names a Service port (what service_endpoints takes).
        let service_port = match service_port.parse::<u16>() {
            Ok(number) => Value::from(std::collections::BTreeMap::from([("number", Value::from(number))])),
            Err(_) => Value::from(std::collections::BTreeMap::from([("name", Value::from(service_port))])),
        };
        let mut entry = std::collections::BTreeMap::new();
        entry.insert("port", Value::from(port));
        entry.insert("namespace", Value::from(namespace));
        entry.insert("service", Value::from(service));
        entry.insert("service_port", service_port);
        entry.insert("backend", Value::from_safe_string(format!("tcp_{port}_{namespace}_{service}")));
        services.push((port, Value::from(entry)));
    }
    services.sort_by_key(|(port, _)| *port);
    Ok(Value::from(services.into_iter().map(|(_, entry)| entry).collect::<Vec<_>>()))
}

/// Slots added at a time when a backend runs out: ten servers at once (dynamic servers, added
/// at run time), so the next nine scale-ups change only addresses and states.
pub(crate) const DEFAULT_SLOT_BLOCK: usize = 10;

/// `server_slots(backend, endpoints, block=10, weighted=false)`: the backend's servers with
/// stable names, one per slot: `name` (`srv1`, ...), `address`, `port`, `enabled`, and with
/// `weighted`, `weight` (the endpoint's, as `weigh(...)` gives it; 1 for a free slot). Each endpoint (as
/// `endpoints(...)` or `service_endpoints(...)` give them; only the ready ones should be
/// passed) keeps its slot from render to render; free slots are disabled servers on a
/// placeholder address, ready for the Runtime API to fill without a reload.
pub(crate) fn server_slots(
    shared: &super::context::Shared,
    backend: &str,
    endpoints: &Value,
    block: usize,
    weighted: bool,
) -> Result<Value, Error> {
    let mut keys = Vec::new();
    let mut weights = std::collections::HashMap::new();
    for endpoint in endpoints.try_iter()? {
        let address = attr(&endpoint, "address").map(|a| a.to_string()).unwrap_or_default();
        let port = attr(&endpoint, "port").and_then(|p| u16::try_from(p).ok()).unwrap_or_default();
        if let Some(weight) = attr(&endpoint, "weight").and_then(|w| u32::try_from(w).ok()) {
            weights.insert((address.clone(), port), weight);
        }
        keys.push((address, port));
    }
    let servers: Vec<Value> = shared.with_slots(backend, &keys, block, |table| {
        table
            .slots
            .iter()
            .enumerate()
            .map(|(index, slot)| {
                let name = crate::plan::slots::SlotTable::server_name(index);
                // Free slots carry a weight too in a weighted backend: a weight that appears or
                // disappears is a reload, a weight that changes is not.
                let weight = weighted.then(|| slot.as_ref().and_then(|key| weights.get(key).copied()).unwrap_or(1));
                match slot {
                    Some((address, port)) => minijinja::context! { name, address, port, enabled => true, weight },
                    None => minijinja::context! { name, address => "127.0.0.1", port => 1, enabled => false, weight },
                }
            })
            .collect()
    });
    Ok(Value::from(servers))
}

/// Which of a backend's servers a `server_lines` call writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerSet {
    /// The servers that take the traffic (`srv1`, ...).
    Active,
    /// Backup servers (`bk1`, ...), used only while no active server is: slots of their own.
    Backup,
}

/// `server_lines(backend, endpoints, options="", block=10)`: the backend's
/// `server` lines, as `server_slots` lays them out, written in one go (at 10,000 backends a
/// template loop over 100,000 slots was two fifths of the default library's render). Only the
/// ready endpoints are given servers; each line is `    server <name> <address>:<port><options>`
/// and ` disabled` for a free slot. Addresses pass `bare_word` (a refused one blames its object,
/// as the filter does); `options` must be vetted text (a captured block or a filter's output).
/// `backup_server_lines(backend, endpoints, block=10)` writes backup servers `bk<n>` (` backup`
/// added, no other options), slotted apart from the backend's own.
pub(crate) fn server_lines(
    shared: &super::context::Shared,
    backend: &str,
    endpoints: &Value,
    options: &Value,
    block: usize,
    set: ServerSet,
) -> Result<Value, Error> {
    let options = match options.as_str() {
        None | Some("") => "",
        Some(text) if options.is_safe() && super::filters::forbidden_char(text).is_none() => text,
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "server_lines: options must be vetted text (a captured block or a filter's output)",
            ));
        }
    };
    let mut keys = Vec::new();
    for endpoint in endpoints.try_iter()? {
        let (address, port, ready) = match endpoint.downcast_object_ref::<Endpoint>() {
            Some(known) => (known.address.to_string(), known.port.clone(), known.ready),
            None => (
                attr(&endpoint, "address").map(|a| a.to_string()).unwrap_or_default(),
                attr(&endpoint, "port").unwrap_or_default(),
                attr(&endpoint, "ready").is_some_and(|ready| ready.is_true()),
            ),
        };
        if ready {
            keys.push((address, u16::try_from(port).unwrap_or_default()));
        }
    }
    let (slots_of, name, flag) = match set {
        ServerSet::Active => (Cow::Borrowed(backend), "srv", ""),
        ServerSet::Backup => (Cow::Owned(format!("{backend}/backup")), "bk", " backup"),
    };
    let lines = shared.with_slots(&slots_of, &keys, block, |table| -> Result<String, Error> {
        let mut lines = String::with_capacity(table.slots.len() * (48 + options.len()));
        for (index, slot) in table.slots.iter().enumerate() {
            if index > 0 {
                lines.push('\n');
            }
            // The name `SlotTable::server_name` gives, written in place.
            let number = index + 1;
            match slot {
                Some((address, port)) => {
                    let address = super::filters::bare_word(address)?;
                    let _ = write!(lines, "    server {name}{number} {address}:{port}{options}{flag}");
                }
                None => {
                    let _ = write!(lines, "    server {name}{number} 127.0.0.1:1{options}{flag} disabled");
                }
            }
        }
        Ok(lines)
    })?;
    Ok(Value::from_object(super::filters::VettedLines(lines)))
}

/// `haproxy_peers(pods, port)`: the HAProxy pods that count rate limits together (HAProxy
/// peers), by name: each running pod with an address and not being deleted, as `{name,
/// address}`. A pod finds its own line by its host name, which Kubernetes makes the pod's
/// name. The configuration is the same for every pod, yet HAProxy wants the local peer's line
/// without an address: `address` is `"${HAPTIC_PEER_SELF_<hex of the name>[*]-<ip>:<port>}"`,
/// which the pod itself (whose processes carry that variable, empty) reads as no argument and
/// every other pod as the address. A pod whose name or address HAProxy could not read is left
/// out (it counts alone), never printed.
pub(crate) fn haproxy_peers(pods: &Value, port: u16) -> Result<Value, Error> {
    let mut peers = std::collections::BTreeMap::new();
    for pod in pods.try_iter()? {
        let metadata = attr(&pod, "metadata");
        let status = attr(&pod, "status");
        let name = metadata.as_ref().and_then(|m| attr(m, "name")).map(|n| n.to_string()).unwrap_or_default();
        let deleting = metadata.as_ref().and_then(|m| attr(m, "deletionTimestamp")).is_some_and(|d| !d.is_none());
        let running = status.as_ref().and_then(|s| attr(s, "phase")).is_some_and(|p| p.as_str() == Some("Running"));
        let address: Option<std::net::IpAddr> =
            status.as_ref().and_then(|s| attr(s, "podIP")).and_then(|ip| ip.as_str()?.parse().ok());
        let readable = !name.is_empty() && name.len() <= 63 && super::filters::bare_word(&name).is_ok();
        if let (true, true, false, Some(address)) = (readable, running, deleting, address) {
            let address = if address.is_ipv6() { format!("[{address}]") } else { address.to_string() };
            let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
            let address = format!("\"${{HAPTIC_PEER_SELF_{hex}[*]-{address}:{port}}}\"");
            peers.insert(name.clone(), minijinja::context! { name, address => Value::from_safe_string(address) });
        }
    }
    Ok(Value::from(peers.into_values().collect::<Vec<_>>()))
}

/// HAProxy's largest server weight.
const MAX_WEIGHT: f64 = 256.0;

/// `weigh(groups)`: the endpoints of several Services sharing one backend, each with the server
/// weight that gives its Service its share: `groups` is a list of `[weight, endpoints]`, and an
/// endpoint's share is its group's weight divided among the group's endpoints. Weights are
/// scaled so the largest per-endpoint share is HAProxy's largest weight (256), and are at
/// least 1. Groups of weight 0 contribute nothing.
pub(crate) fn weigh(groups: &Value) -> Result<Value, Error> {
    let mut parsed = Vec::new();
    for group in groups.try_iter()? {
        let weight = group.get_item(&Value::from(0)).ok().and_then(|w| u32::try_from(w).ok()).unwrap_or(0);
        let endpoints: Vec<Value> = group.get_item(&Value::from(1))?.try_iter()?.collect();
        if weight > 0 && !endpoints.is_empty() {
            parsed.push((f64::from(weight) / endpoints.len() as f64, endpoints));
        }
    }
    let largest = parsed.iter().map(|(share, _)| *share).fold(0.0, f64::max);
    let mut out = Vec::new();
    for (share, endpoints) in parsed {
        let weight = ((share / largest) * MAX_WEIGHT).round().clamp(1.0, MAX_WEIGHT) as u32;
        for endpoint in endpoints {
            out.push(minijinja::context! {
                address => attr(&endpoint, "address"),
                port => attr(&endpoint, "port"),
                ready => true,
                weight,
            });
        }
    }
    Ok(Value::from(out))
}

/// The port of a Service that an Ingress backend's `port` (`{number}` or `{name}`) refers to:
/// its name (possibly empty) when the Service has such a port.
fn service_port_name(service: &Value, wanted: &Value) -> Option<Option<Value>> {
    let number = attr(wanted, "number");
    let name = attr(wanted, "name");
    // A stored Service is read in place, as stored slices are: at 10,000 Ingresses, making
    // template values of its spec and ports was a sixth of what `service_endpoints` cost.
    if let Some(members) = super::context::stored_members(service) {
        let ports = compact::member(members, "spec")?.get("ports")?;
        let port = ports.items().iter().find(|port| {
            let field = |key: &str| port.get(key).map(Node::to_value);
            match (&number, &name) {
                (Some(number), _) => field("port").as_ref() == Some(number),
                (None, Some(name)) => field("name").as_ref() == Some(name),
                (None, None) => false,
            }
        })?;
        return Some(port.get("name").map(Node::to_value));
    }
    let ports = attr(&attr(service, "spec")?, "ports")?;
    let port = ports.try_iter().ok()?.find(|port| match (&number, &name) {
        (Some(number), _) => attr(port, "port").as_ref() == Some(number),
        (None, Some(name)) => attr(port, "name").as_ref() == Some(name),
        (None, None) => false,
    })?;
    Some(attr(&port, "name"))
}

/// `service_endpoints(service, port, slices)`: the endpoints (as `endpoints(...)` gives them)
/// behind an Ingress backend: `service` is the Service object (or none), `port` the backend's
/// `{number}` or `{name}`, `slices` the Service's EndpointSlices. Empty when the Service or the
/// port does not exist, which is how an Ingress to a missing Service is served: by no server.
pub(crate) fn service_endpoints(service: &Value, port: &Value, slices: &Value) -> Result<Value, Error> {
    if service.is_undefined() || service.is_none() {
        return Ok(Value::from(Vec::<Value>::new()));
    }
    match service_port_name(service, port) {
        Some(port_name) => endpoints(slices, port_name.as_ref()),
        None => Ok(Value::from(Vec::<Value>::new())),
    }
}

/// `service_address(service, port)`: the Service's cluster IP and port as the one endpoint
/// (ingress-nginx's `service-upstream`): kube-proxy spreads the connections, so a Pod's
/// coming and going never changes HAProxy's configuration. Empty for a Service without a
/// cluster IP (headless, or an ExternalName) or without that port.
pub(crate) fn service_address(service: &Value, wanted: &Value) -> Result<Value, Error> {
    let none = || Ok(Value::from(Vec::<Value>::new()));
    let Some(spec) = attr(service, "spec") else { return none() };
    let Some(ip) =
        attr(&spec, "clusterIP").filter(|ip| ip.as_str().is_some_and(|ip| ip.parse::<std::net::IpAddr>().is_ok()))
    else {
        return none();
    };
    let (number, name) = (attr(wanted, "number"), attr(wanted, "name"));
    let port = attr(&spec, "ports").and_then(|ports| {
        ports.try_iter().ok()?.find(|port| match (&number, &name) {
            (Some(number), _) => attr(port, "port").as_ref() == Some(number),
            (None, Some(name)) => attr(port, "name").as_ref() == Some(name),
            (None, None) => false,
        })
    });
    let Some(port) = port.and_then(|port| attr(&port, "port")) else { return none() };
    let address = endpoint_address(service, ip, 0, 0)?;
    Ok(Value::from(vec![Value::from_object(Endpoint {
        address,
        port,
        ready: true,
        serving: true,
        terminating: false,
    })]))
}

/// `ingress_annotation(ingress, setting)`: the value of the first of the setting's annotation
/// names the Ingress sets (unchecked: for deciding, never for printing), else none.
fn ingress_annotation(ingress: &Value, key: &str) -> Value {
    let annotations = attr(ingress, "metadata").and_then(|metadata| attr(&metadata, "annotations"));
    annotation_value(annotations.as_ref(), key).unwrap_or_else(|| Value::from(()))
}

/// The value of the first of the setting `key`'s annotation names set among `annotations`.
fn annotation_value(annotations: Option<&Value>, key: &str) -> Option<Value> {
    let annotations = annotations?;
    super::annotations::names_of(key)
        .iter()
        .find_map(|name| annotations.get_attr(name).ok().filter(|v| !v.is_undefined() && !v.is_none()))
}

/// Whether the setting `key` is switched on (`true`) among `annotations`.
fn annotation_on(annotations: Option<&Value>, key: &str) -> bool {
    annotation_value(annotations, key)
        .is_some_and(|v| v.as_str().is_some_and(|v| v.trim().eq_ignore_ascii_case("true")))
}

/// Notes a Warning on an Ingress served without annotations of known controllers haptic does
/// not implement (or does not know), naming each and why.
fn note_ignored_annotations(state: &minijinja::State, ingress: &Value) {
    let Some(annotations) = attr(ingress, "metadata").and_then(|metadata| attr(&metadata, "annotations")) else {
        return;
    };
    let ignored = super::annotations::ignored_annotations(&annotations);
    // Touched last by the lookup above: the Ingress itself, when it is a stored object.
    let (false, Some(object), Ok(shared)) =
        (ignored.is_empty(), super::context::last_object(), super::shared_state(state, "ingress_routes"))
    else {
        return;
    };
    let named: Vec<String> = ignored.into_iter().map(|(name, why)| format!("{name} ({why})")).collect();
    shared.add_notice(super::Notice {
        object,
        message: format!("served without annotations haptic does not implement: {}", named.join("; ")),
    });
}

/// Adds the default library's functions to `env`; paths it prints are under `dirs`.
pub(super) fn register(env: &mut minijinja::Environment<'static>, dirs: &crate::config::DataplaneSettings) {
    let vetted = |result: Result<String, minijinja::Error>| result.map(Value::from_safe_string);
    env.add_function("collector", || Value::from_object(super::context::Collector::default()));
    env.add_function("endpoints", |slices: Value, port_name: Option<Value>| endpoints(&slices, port_name.as_ref()));
    env.add_function("ingress_routes", |state: &minijinja::State, ingress: Value| {
        let routes = ingress_routes(&ingress)?;
        note_ignored_annotations(state, &ingress);
        Ok::<_, Error>(routes)
    });
    env.add_function("ingress_tls", |ingress: Value| ingress_tls(&ingress));
    env.add_function("ingress_annotation", |ingress: Value, key: &str| ingress_annotation(&ingress, key));
    env.add_function("regex_map_key", |route: Value| regex_map_key(&route));
    env.add_function("canary_stride", canary_stride);
    env.add_function("created_at", |object: Value| object_created(&object));
    env.add_function("ingress_settings", |ingress: Value, snippets: Option<bool>, class_parameters: Option<Value>| {
        super::annotations::ingress_settings(&ingress, snippets.unwrap_or(false), &class_parameters.unwrap_or_default())
    });
    env.add_function(
        "server_slots",
        |state: &minijinja::State, backend: &str, endpoints: Value, block: Option<usize>, weighted: Option<bool>| {
            let shared = super::shared_state(state, "server_slots")?;
            let block = block.unwrap_or(DEFAULT_SLOT_BLOCK);
            server_slots(&shared, backend, &endpoints, block, weighted.unwrap_or(false))
        },
    );
    env.add_function(
        "server_lines",
        |state: &minijinja::State, backend: &str, endpoints: Value, options: Option<Value>, block: Option<usize>| {
            let shared = super::shared_state(state, "server_lines")?;
            let block = block.unwrap_or(DEFAULT_SLOT_BLOCK);
            server_lines(&shared, backend, &endpoints, &options.unwrap_or_default(), block, ServerSet::Active)
        },
    );
    env.add_function(
        "backup_server_lines",
        |state: &minijinja::State, backend: &str, endpoints: Value, block: Option<usize>| {
            let shared = super::shared_state(state, "backup_server_lines")?;
            let block = block.unwrap_or(DEFAULT_SLOT_BLOCK);
            server_lines(&shared, backend, &endpoints, &Value::from(""), block, ServerSet::Backup)
        },
    );
    env.add_function("weigh", |groups: Value| weigh(&groups));
    env.add_function("haproxy_peers", |pods: Value, port: u16| haproxy_peers(&pods, port));
    env.add_function("service_endpoints", |service: Value, port: Value, slices: Value| {
        service_endpoints(&service, &port, &slices)
    });
    env.add_function("service_address", |service: Value, port: Value| service_address(&service, &port));
    env.add_function("refuse", |object: Value, field: &str, message: &str| -> Result<Value, minijinja::Error> {
        Err(super::context::refuse(&object, field, message))
    });
    env.add_function("basic_auth_users", |secret: Value, ingress: Option<Value>| {
        basic_auth_users(&secret, &ingress.unwrap_or_default())
    });
    env.add_function("tcp_services", |configmap: Value, taken: Option<Vec<u16>>| {
        tcp_services(&configmap, &taken.unwrap_or_default())
    });
    let general_dir = dirs.general_dir.trim_end_matches('/').to_owned();
    env.add_function("ca_file", move |state: &minijinja::State, secret: Value| {
        let (name, pem) = ca_bundle(&secret)?;
        let shared = state.lookup("shared").ok_or_else(|| {
            minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, "ca_file needs the render's shared state")
        })?;
        if let Some(shared) = shared.downcast_object_ref::<super::context::Shared>() {
            shared.add_file(name.clone(), pem);
        }
        vetted(super::filters::bare_word(&format!("{general_dir}/{name}")))
    });
    let certs_dir = dirs.certs_dir.trim_end_matches('/').to_owned();
    env.add_function("tls_certificate", move |state: &minijinja::State, secret: Value| {
        let (name, pem) = tls_certificate(&secret)?;
        let shared = state.lookup("shared").ok_or_else(|| {
            minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "tls_certificate needs the render's shared state",
            )
        })?;
        if let Some(shared) = shared.downcast_object_ref::<super::context::Shared>() {
            shared.add_cert(name.clone(), pem);
        }
        Ok(Value::from_safe_string(format!("{certs_dir}/{name}")))
    });
    for (function, dir) in
        [("map_path", &dirs.maps_dir), ("file_path", &dirs.general_dir), ("cert_path", &dirs.certs_dir)]
    {
        let dir = dir.trim_end_matches('/').to_owned();
        env.add_function(function, move |name: &str| -> Result<Value, minijinja::Error> {
            super::check_file_name(name)
                .map_err(|detail| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, detail))?;
            vetted(super::filters::bare_word(&format!("{dir}/{name}")))
        });
    }
}

#[cfg(test)]
mod tests {
    use minijinja::value::Serde;
    use serde_json::json;

    use super::*;

    fn render(slices: serde_json::Value, port: Option<&str>) -> Vec<String> {
        let slices = Value::from(Serde(slices));
        let port = port.map(Value::from);
        let list = endpoints(&slices, port.as_ref()).unwrap();
        list.try_iter()
            .unwrap()
            .map(|e| {
                let get = |k: &str| e.get_attr(k).unwrap().to_string();
                let flag = |k: &str| e.get_attr(k).unwrap().is_true();
                format!(
                    "{}:{} r={} s={} t={}",
                    get("address"),
                    get("port"),
                    flag("ready"),
                    flag("serving"),
                    flag("terminating")
                )
            })
            .collect()
    }

    #[test]
    fn routes_put_a_longer_path_first_then_an_older_ingress() {
        let route = |created: &str, path: &str| {
            let ingress = Value::from(Serde(json!({
                "metadata": {"namespace": "zzz", "name": "shop", "creationTimestamp": created},
                "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [{"path": path}]}}]}
            })));
            let routes = ingress_routes(&ingress).unwrap();
            routes.get_item(&Value::from(0)).unwrap().get_attr("precedence").unwrap().as_i64().unwrap()
        };
        let old = route("2026-01-01T00:00:00Z", "/");
        let new = route("2026-06-01T00:00:00Z", "/");
        assert!(old > new, "the older Ingress goes first");
        assert!(route("2026-06-01T00:00:00Z", "/shop") > old, "a longer path goes first whatever its age");
        assert!(route("not a time", "/") < new, "an Ingress that does not say when it was made goes last");
        let made = |created: &str| {
            object_created(&Value::from(Serde(json!({"metadata": {"creationTimestamp": created}})))).as_i64().unwrap()
        };
        assert_eq!(made("2026-01-01T00:00:00Z"), 1_767_225_600);
        assert_eq!(made("yesterday"), i64::from(u32::MAX));
    }

    #[test]
    fn tls_hosts_are_the_hosts_an_ingress_routes_and_no_other() {
        let ingress = |tls: serde_json::Value| {
            Value::from(Serde(json!({
                "metadata": {"namespace": "aaa", "name": "shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"rules": [{"host": "shop.example.com"}, {"host": "*.apps.example.com"}], "tls": tls}
            })))
        };
        let hosts = |tls| -> Vec<String> {
            let entries = ingress_tls(&ingress(tls)).unwrap();
            let entry = entries.get_item(&Value::from(0)).unwrap();
            entry.get_attr("hosts").unwrap().try_iter().unwrap().map(|h| h.to_string()).collect()
        };
        assert_eq!(hosts(json!([{"secretName": "s", "hosts": ["shop.example.com"]}])), ["shop.example.com"]);
        assert_eq!(
            hosts(json!([{"secretName": "s"}])),
            ["shop.example.com", "*.apps.example.com"],
            "an entry without hosts is for the hosts the Ingress routes, not for its certificate's names"
        );
        assert_eq!(hosts(json!([{"secretName": "s", "hosts": ["*.example.com"]}])), ["*.example.com"]);
        for stolen in ["victim.example.org", "*.other.example.com", "a.b.example.com"] {
            let refused = ingress_tls(&ingress(json!([{"secretName": "s", "hosts": ["shop.example.com", stolen]}])))
                .unwrap_err()
                .to_string();
            assert!(refused.contains("not a host of this Ingress's rules"), "{stolen}: {refused}");
            assert!(!refused.contains(stolen), "a refusal never quotes the value: {refused}");
        }
    }

    #[test]
    fn routes_carry_element_wise_prefix_keys_and_the_kind_of_their_host() {
        let ingress = Value::from(Serde(json!({
            "metadata": {"namespace": "web", "name": "shop"},
            "spec": {"rules": [
                {"host": "shop.example.com", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix"}, {"path": "/foo/", "pathType": "Prefix"},
                    {"path": "/exact", "pathType": "Exact"}]}},
                {"host": "*.example.com", "http": {"paths": [{"path": "/a//", "pathType": "Prefix"}]}},
                {"http": {"paths": [{"pathType": "ImplementationSpecific"}]}}
            ]}
        })));
        let routes = ingress_routes(&ingress).unwrap();
        let seen: Vec<String> = routes
            .try_iter()
            .unwrap()
            .map(|r| {
                let get = |k: &str| r.get_attr(k).unwrap().to_string();
                format!("{} {} {} {}", get("id"), get("host_kind"), get("path"), get("prefix_key"))
            })
            .collect();
        assert_eq!(
            seen,
            [
                "web_shop_1_1 exact / /",
                "web_shop_1_2 exact /foo/ /foo/",
                "web_shop_1_3 exact /exact /exact/",
                "web_shop_2_1 wildcard /a// /a/",
                "web_shop_3_1 none / /",
            ]
        );
    }

    #[test]
    fn conditions_default_as_the_endpointslice_api_says() {
        let slices = json!([{
            "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
            "endpoints": [
                {"addresses": ["10.0.0.1"]},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.0.0.3", "10.0.0.4"], "conditions": {"ready": false}}
            ]
        }]);
        assert_eq!(
            render(slices, Some("http")),
            [
                "10.0.0.1:8080 r=true s=true t=false",
                "10.0.0.2:8080 r=false s=true t=true",
                "10.0.0.3:8080 r=false s=false t=false",
                "10.0.0.4:8080 r=false s=false t=false",
            ]
        );
    }

    #[test]
    fn a_collector_sorted_by_an_attribute_is_stable_and_orders_integers_and_other_keys_alike() {
        let env = minijinja::Environment::new();
        let sorted = |items: &str, attribute: &str, reverse: bool| {
            let shared = Value::from_object(super::super::context::Shared::default());
            let template = format!(
                "{{% set c = shared.collector(\"c\") %}}{{% for item in {items} %}}{{% set _ = c.push(item) %}}{{% endfor %}}\
                 {{{{ c.sorted(\"{attribute}\", {reverse}) | map(attribute=\"n\") | join(\",\") }}}}"
            );
            env.render_str(&template, minijinja::context! { shared }).unwrap()
        };
        let lengths = r#"[{"n": "a", "l": 2}, {"n": "b", "l": 10}, {"n": "c", "l": 2}, {"n": "d", "l": -1}]"#;
        assert_eq!(sorted(lengths, "l", false), "d,a,c,b");
        // Longest first; equal keys keep the order they were pushed in.
        assert_eq!(sorted(lengths, "l", true), "b,a,c,d");
        let mixed = r#"[{"n": "a", "l": "x"}, {"n": "b", "l": 1}, {"n": "c"}, {"n": "d", "l": "w"}]"#;
        let generic = sorted(mixed, "l", false);
        assert_eq!(generic.split(',').count(), 4);
        assert!(generic.find('d') < generic.find('a'), "{generic}");
    }

    #[test]
    fn server_lines_give_ready_endpoints_stable_slots_and_vet_what_they_print() {
        let shared = super::super::context::Shared::default();
        let slices = |addresses: &[(&str, bool)]| {
            let endpoints: Vec<_> =
                addresses.iter().map(|(a, ready)| json!({"addresses": [a], "conditions": {"ready": ready}})).collect();
            Value::from(Serde(json!([{"ports": [{"port": 8080}], "endpoints": endpoints}])))
        };
        let lines = |slices: &Value, options: Value, block: usize| -> Result<String, Error> {
            let endpoints = endpoints(slices, None)?;
            let written = server_lines(&shared, "be_web", &endpoints, &options, block, ServerSet::Active)?;
            Ok(written
                .downcast_object_ref::<crate::render::filters::VettedLines>()
                .map(|l| l.0.clone())
                .unwrap_or_default())
        };
        let options = Value::from_safe_string(" check".into());
        let first = lines(&slices(&[("10.0.0.1", true), ("10.0.0.2", false), ("10.0.0.3", true)]), options.clone(), 3);
        assert_eq!(
            first.unwrap(),
            "    server srv1 10.0.0.1:8080 check\n    server srv2 10.0.0.3:8080 check\n    server srv3 127.0.0.1:1 check disabled"
        );
        // The first endpoint gone: the second keeps its slot, the freed one is disabled.
        let second = lines(&slices(&[("10.0.0.3", true)]), Value::from(""), 3).unwrap();
        assert_eq!(
            second,
            "    server srv1 127.0.0.1:1 disabled\n    server srv2 10.0.0.3:8080\n    server srv3 127.0.0.1:1 disabled"
        );
        // An address that is not an IP address never reaches the lines (`endpoints` refuses it).
        let hostile = lines(&slices(&[("10.0.0.1 backup", true)]), Value::from(""), 3).unwrap_err();
        assert!(hostile.to_string().contains("not one HAProxy may be sent to"), "{hostile}");
        let unvetted = lines(&slices(&[("10.0.0.1", true)]), Value::from(" check"), 3).unwrap_err();
        assert!(unvetted.to_string().contains("vetted"), "{unvetted}");
        // Backup servers have names and slots of their own: the active ones above are untouched.
        let endpoints = endpoints(&slices(&[("10.0.0.9", true)]), None).unwrap();
        let backup = server_lines(&shared, "be_web", &endpoints, &Value::from(""), 2, ServerSet::Backup).unwrap();
        let backup = backup.downcast_object_ref::<crate::render::filters::VettedLines>().map(|l| l.0.clone());
        assert_eq!(
            backup.as_deref(),
            Some("    server bk1 10.0.0.9:8080 backup\n    server bk2 127.0.0.1:1 backup disabled")
        );
        assert_eq!(lines(&slices(&[("10.0.0.3", true)]), Value::from(""), 3).unwrap(), second);
    }

    #[test]
    fn haproxy_peers_are_the_running_pods_each_reading_its_own_line_without_an_address() {
        let pods = Value::from(Serde(json!([
            {"metadata": {"name": "haproxy-b"}, "status": {"phase": "Running", "podIP": "10.0.0.2"}},
            {"metadata": {"name": "haproxy-a"}, "status": {"phase": "Running", "podIP": "fd00::1"}},
            {"metadata": {"name": "haproxy-new"}, "status": {"phase": "Pending"}},
            {"metadata": {"name": "haproxy-gone", "deletionTimestamp": "2026-12-08T00:00:00Z"},
             "status": {"phase": "Running", "podIP": "10.0.0.3"}},
            {"metadata": {"name": "bad name"}, "status": {"phase": "Running", "podIP": "10.0.0.4"}},
            {"metadata": {"name": "haproxy-c"}, "status": {"phase": "Running", "podIP": "10.0.0.5 backup"}},
        ])));
        let peers = haproxy_peers(&pods, 10000).unwrap();
        let lines: Vec<String> = peers
            .try_iter()
            .unwrap()
            .map(|peer| format!("{} {}", peer.get_attr("name").unwrap(), peer.get_attr("address").unwrap()))
            .collect();
        assert_eq!(
            lines,
            [
                r#"haproxy-a "${HAPTIC_PEER_SELF_686170726f78792d61[*]-[fd00::1]:10000}""#,
                r#"haproxy-b "${HAPTIC_PEER_SELF_686170726f78792d62[*]-10.0.0.2:10000}""#,
            ]
        );
    }

    #[test]
    fn stored_slices_give_the_same_endpoints_as_template_values() {
        let slices = [
            json!({"metadata": {"name": "a", "namespace": "web"}, "ports": [{"name": "http", "port": 8080}, {"port": 81}],
                   "endpoints": [{"addresses": ["10.0.0.1", "10.0.0.2"]},
                                 {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "terminating": true}},
                                 {"addresses": ["10.0.0.4"], "conditions": {"ready": null, "serving": false}},
                                 {"conditions": {"ready": true}}]}),
            json!({"metadata": {"name": "b", "namespace": "web"}, "ports": [{"name": "", "port": 82}],
                   "endpoints": [{"addresses": ["10.0.1.1"]}]}),
            json!({"metadata": {"name": "c", "namespace": "web"}, "endpoints": [{"addresses": ["10.0.2.1"]}]}),
            json!({"metadata": {"name": "d", "namespace": "web"}, "ports": [{"name": "http", "port": null}],
                   "endpoints": [{"addresses": ["10.0.3.1"]}]}),
        ];
        let store = crate::store::ResourceStore::new("EndpointSlice", vec![]);
        let stored: Vec<Value> = slices
            .iter()
            .map(|slice| super::super::context::tracked_value(&store.prepare(slice.clone()).unwrap()))
            .collect();
        let as_json: Vec<Value> = slices.iter().map(|slice| Value::from(Serde(slice))).collect();
        let describe = |list: Value| -> Vec<String> {
            list.try_iter()
                .unwrap()
                .map(|e| {
                    let get = |k: &str| e.get_attr(k).unwrap().to_string();
                    format!(
                        "{} {} {} {} {}",
                        get("address"),
                        get("port"),
                        get("ready"),
                        get("serving"),
                        get("terminating")
                    )
                })
                .collect()
        };
        for wanted in [None, Some("http"), Some(""), Some("other")] {
            let wanted = wanted.map(Value::from);
            let from_stores = describe(endpoints(&Value::from(stored.clone()), wanted.as_ref()).unwrap());
            let from_json = describe(endpoints(&Value::from(as_json.clone()), wanted.as_ref()).unwrap());
            assert_eq!(from_stores, from_json, "port {wanted:?}");
        }
        let http = describe(endpoints(&Value::from(stored), Some(&Value::from("http"))).unwrap());
        assert_eq!(http.len(), 4, "a port without a number gives no endpoint: {http:?}");
    }

    #[test]
    fn endpoint_addresses_are_ip_addresses_haproxy_may_be_sent_to() {
        let slice = |address: &str| {
            json!({"metadata": {"name": "s", "namespace": "web"}, "addressType": "FQDN",
                   "ports": [{"port": 80}], "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": [address]}]})
        };
        let store = crate::store::ResourceStore::new("EndpointSlice", vec![]);
        let both = |address: &str| {
            let stored = super::super::context::tracked_value(&store.prepare(slice(address)).unwrap());
            [Value::from(vec![stored]), Value::from(vec![Value::from(Serde(slice(address)))])]
        };
        for refused in
            ["dataplane.haptic.svc", "127.0.0.1", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::ffff:127.0.0.1"]
        {
            for slices in both(refused) {
                let error = endpoints(&slices, None).unwrap_err().to_string();
                assert!(error.contains("not one HAProxy may be sent to"), "{refused}: {error}");
                assert!(!error.contains(refused), "a refusal never quotes the value: {error}");
            }
        }
        for (given, plain) in [("10.0.0.2", "10.0.0.2"), ("2001:db8:0:0:0:0:0:1", "2001:db8::1")] {
            for slices in both(given) {
                let list = endpoints(&slices, None).unwrap();
                let address = list.get_item(&Value::from(1)).unwrap().get_attr("address").unwrap();
                assert_eq!(address.to_string(), plain);
            }
        }
    }

    #[test]
    fn service_endpoints_resolve_the_backend_port_by_number_or_name() {
        let service = Value::from(Serde(json!({"spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080}, {"name": "admin", "port": 81}]}})));
        let slices = Value::from(Serde(json!([{
            "ports": [{"name": "http", "port": 8080}, {"name": "admin", "port": 9000}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]
        }])));
        let ports = |wanted: serde_json::Value| -> Vec<String> {
            let list = service_endpoints(&service, &Value::from(Serde(wanted)), &slices).unwrap();
            list.try_iter().unwrap().map(|e| e.get_attr("port").unwrap().to_string()).collect()
        };
        assert_eq!(ports(json!({"number": 80})), ["8080"]);
        assert_eq!(ports(json!({"name": "admin"})), ["9000"]);
        assert!(ports(json!({"number": 443})).is_empty(), "a port the Service lacks has no endpoints");
        let none = service_endpoints(&Value::from(()), &Value::from(Serde(json!({"number": 80}))), &slices).unwrap();
        assert_eq!(none.len(), Some(0), "a missing Service has no endpoints");
    }

    /// Routes and endpoints answer a name (`route.host`, how templates read them) as they
    /// answer the same name as a key (`route["host"]`), and a name they lack with nothing.
    #[test]
    fn a_canary_stride_visits_every_request_of_its_cycle_once() {
        for total in [1, 2, 5, 100, 1000, 1024, 999_983] {
            let stride = canary_stride(total);
            if total <= 1024 {
                let visited: std::collections::BTreeSet<u64> = (0..total).map(|n| n * stride % total).collect();
                assert_eq!(visited.len() as u64, total, "{total}");
            }
            // Spread: of the first tenth of a cycle, about a tenth falls below a 10% weight.
            if total == 100 {
                let early = (0..10).filter(|n| n * stride % total < 10).count();
                assert!(early <= 2, "{early}");
            }
        }
    }

    #[test]
    fn routes_and_endpoints_answer_a_name_as_they_answer_the_key() {
        let ingress = Value::from(Serde(json!({
            "metadata": {"namespace": "web", "name": "shop"},
            "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}]}
        })));
        let route = ingress_routes(&ingress).unwrap().get_item(&Value::from(0)).unwrap();
        let slices =
            Value::from(Serde(json!([{"endpoints": [{"addresses": ["198.18.0.1"]}], "ports": [{"port": 8080}]}])));
        let endpoint = endpoints(&slices, None).unwrap().get_item(&Value::from(0)).unwrap();
        for object in [route, endpoint] {
            let names: Vec<Value> = object.try_iter().unwrap().collect();
            assert!(names.len() >= 5, "{names:?}");
            for name in names.iter().chain([&Value::from("missing")]) {
                let by_name = object.get_attr(name.as_str().unwrap()).unwrap();
                let by_key = object.get_item(name).unwrap();
                assert_eq!(by_name, by_key, "{name}");
                assert_eq!(by_name.is_undefined(), name.as_str() == Some("missing"), "{name}");
            }
        }
    }

    /// The claim a route keeps for its backend is the name's own fingerprint, whichever
    /// prefix asks, first or again.
    #[test]
    fn a_routes_kept_backend_claim_is_its_names_fingerprint() {
        let ingress = Value::from(Serde(json!({
            "metadata": {"namespace": "web", "name": "shop"},
            "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [
                {"path": "/", "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}]}
        })));
        let routes = ingress_routes(&ingress).unwrap();
        let route = routes.get_item(&Value::from(0)).unwrap();
        let route = as_route(&route).unwrap();
        assert_eq!(route.backend().as_str(), Some("web_shop_80"));
        let named = |prefix: &str| super::super::memo::name_fingerprint(&format!("{prefix}web_shop_80"));
        for prefix in ["backend/", "backend/", "other/", "backend/", "other/"] {
            let asked = route.backend_claim(prefix, super::super::memo::name_fingerprint(prefix));
            assert_eq!(asked, named(prefix), "prefix {prefix}");
        }
    }

    /// A stored Service, read in place, resolves a backend's port as its template value does.
    #[test]
    fn stored_services_resolve_ports_as_template_values_do() {
        let services = [
            json!({"metadata": {"name": "a", "namespace": "web"}, "spec": {"ports": [
                {"name": "http", "port": 80}, {"port": 81}, {"name": "admin", "port": 82}, {"name": null, "port": 83}]}}),
            json!({"metadata": {"name": "b", "namespace": "web"}, "spec": {"ports": null}}),
            json!({"metadata": {"name": "c", "namespace": "web"}, "spec": {}}),
            json!({"metadata": {"name": "d", "namespace": "web"}}),
        ];
        let store = crate::store::ResourceStore::new("Service", vec![]);
        let wanted = [
            json!({"number": 80}),
            json!({"number": 81}),
            json!({"number": 83}),
            json!({"number": 443}),
            json!({"name": "admin"}),
            json!({"name": "http", "number": 82}),
            json!({"name": "missing"}),
            json!({}),
        ];
        for service in &services {
            let stored = super::super::context::tracked_value(&store.prepare(service.clone()).unwrap());
            let as_json = Value::from(Serde(service));
            for wanted in &wanted {
                let wanted = Value::from(Serde(wanted));
                assert_eq!(
                    service_port_name(&stored, &wanted),
                    service_port_name(&as_json, &wanted),
                    "{service} {wanted}"
                );
            }
        }
    }

    #[test]
    fn unnamed_ports_match_when_no_name_is_asked_and_slices_without_the_port_are_skipped() {
        let slices = json!([
            {"ports": [{"port": 80}], "endpoints": [{"addresses": ["10.0.0.1"]}]},
            {"ports": [{"name": "http", "port": 81}], "endpoints": [{"addresses": ["10.0.0.2"]}]},
            {"endpoints": [{"addresses": ["10.0.0.3"]}]}
        ]);
        assert_eq!(render(slices.clone(), None), ["10.0.0.1:80 r=true s=true t=false"]);
        assert_eq!(render(slices.clone(), Some("")), ["10.0.0.1:80 r=true s=true t=false"]);
        assert_eq!(render(slices, Some("http")), ["10.0.0.2:81 r=true s=true t=false"]);
    }
}
