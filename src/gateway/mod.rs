//! The Gateway API, as a plain function from the watched objects to what HAProxy must serve
//! and the status every object is owed.
//!
//! [`build`] reads GatewayClasses, Gateways, HTTPRoutes, GRPCRoutes, TLSRoutes, TCPRoutes and
//! ReferenceGrants (with the Services, Secrets and Namespaces they name), decides which
//! listener each route attaches to, which hostnames it serves there, which backends it may
//! reach, and the order the spec's precedence puts its rules in. The result is a [`Model`]:
//! frontends by port with their map entries and conditional rules, and backends, which the
//! library's templates print; and a [`status::StatusSet`], which the controller writes.
//! Nothing here does IO; the same model feeds the render and the status, so what a status says
//! is what the configuration does.

pub mod hostnames;
mod model;
pub mod resources;
pub mod status;

use std::collections::BTreeMap;

use serde::Serialize;

pub use model::{build, stable_hash};

/// The watched-resource aliases the model reads (each may be absent: nothing of that kind).
pub mod aliases {
    /// GatewayClasses.
    pub const GATEWAY_CLASSES: &str = "gatewayclasses";
    /// Gateways.
    pub const GATEWAYS: &str = "gateways";
    /// HTTPRoutes.
    pub const HTTP_ROUTES: &str = "httproutes";
    /// GRPCRoutes.
    pub const GRPC_ROUTES: &str = "grpcroutes";
    /// TLSRoutes.
    pub const TLS_ROUTES: &str = "tlsroutes";
    /// TCPRoutes.
    pub const TCP_ROUTES: &str = "tcproutes";
    /// ReferenceGrants.
    pub const REFERENCE_GRANTS: &str = "referencegrants";
    /// Namespaces (for `allowedRoutes` selectors).
    pub const NAMESPACES: &str = "namespaces";
    /// Services (backends).
    pub const SERVICES: &str = "services";
    /// Secrets (listener certificates).
    pub const SECRETS: &str = "secrets";
}

/// The Gateway API conformance features haptic serves (v1.6.3 names), each passed by the
/// official suite (`make conformance`, docs/conformance/), published on every GatewayClass it
/// serves (`status.supportedFeatures`), from which the suite reads what to run.
const SUPPORTED_FEATURES: &[&str] = &[
    "GRPCRoute",
    "Gateway",
    "GatewayHTTPListenerIsolation",
    "GatewayPort8080",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendTimeout",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
    "TLSRoute",
];

/// [`SUPPORTED_FEATURES`], sorted as the spec asks.
pub fn supported_features() -> Vec<&'static str> {
    let mut features = SUPPORTED_FEATURES.to_vec();
    features.sort_unstable();
    features
}

/// What a frontend of the model speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Protocol {
    /// HTTP, routed by HTTPRoutes and GRPCRoutes.
    #[serde(rename = "HTTP")]
    Http,
    /// HTTPS, terminated here, routed by HTTPRoutes and GRPCRoutes.
    #[serde(rename = "HTTPS")]
    Https,
    /// TLS passed through, routed by SNI (TLSRoutes).
    #[serde(rename = "TLS")]
    TlsPassthrough,
    /// TCP (TCPRoutes).
    #[serde(rename = "TCP")]
    Tcp,
}

/// The kind of a host pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostKind {
    /// One name.
    Exact,
    /// `*.suffix`.
    Wildcard,
    /// Any host.
    None,
}

impl HostKind {
    fn of(host: Option<&str>) -> Self {
        match host {
            None => Self::None,
            Some(h) if hostnames::is_wildcard(h) => Self::Wildcard,
            Some(_) => Self::Exact,
        }
    }
}

/// Everything the templates print for the Gateway API.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Model {
    /// One frontend per listener port, by port.
    pub frontends: Vec<Frontend>,
    /// Service ports reached by plain rules: the library's shared backends
    /// (`be_<namespace>_<service>_<port>`, as for Ingress routes).
    pub service_backends: Vec<ServiceTarget>,
    /// Backends of rules that need one of their own (filters, weights, gRPC, TLS and TCP).
    pub rule_backends: Vec<RuleBackend>,
    /// The Service each served Gateway is given (`gatewayServices`), which the controller
    /// makes and keeps.
    #[serde(skip)]
    pub gateway_services: Vec<GatewayService>,
    /// What the controller writes into each object's status.
    #[serde(skip)]
    pub status: status::StatusSet,
}

/// What a render owes the API server for the Gateway API.
#[derive(Clone, Debug, Default)]
pub struct Owed {
    /// Every object's status.
    pub status: status::StatusSet,
    /// The Gateways' Services (`gatewayServices`; empty without).
    pub services: Vec<GatewayService>,
}

/// The Service giving one Gateway its address: each listener port to the Gateway's fleet port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayService {
    /// The Gateway's namespace.
    pub gateway_namespace: String,
    /// The Gateway's name.
    pub gateway_name: String,
    /// The Service's name (in `gatewayServices.namespace`).
    pub name: String,
    /// (listener port, fleet port), by listener port.
    pub ports: Vec<(u16, u16)>,
}

/// The name of the Service of Gateway `namespace`/`name`: a DNS label, `gw-<name>-<hash>`,
/// unique per Gateway whatever its namespace.
pub fn gateway_service_name(namespace: &str, name: &str) -> String {
    let readable: String =
        name.chars().take(40).map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let hash = model::stable_hash(&format!("{namespace}/{name}")) & 0xffff_ffff;
    format!("gw-{}-{hash:08x}", readable.trim_matches('-'))
}

/// A frontend: the listeners of every Gateway on one port.
#[derive(Clone, Debug, Serialize)]
pub struct Frontend {
    /// `gw_<port>`.
    pub name: String,
    /// The port it binds on the pods.
    pub port: u16,
    /// The port clients reach it on: its listeners' own, which differs from `port` where a
    /// Gateway's Service maps it to a fleet port (redirects name it).
    pub public_port: u16,
    /// What it speaks.
    pub protocol: Protocol,
    /// Its listeners, most specific hostname first: the first that matches the request's host
    /// (or SNI) takes it.
    pub listeners: Vec<ListenerModel>,
    /// Certificates served (HTTPS): Secrets as (namespace, name), the first the default.
    pub certificates: Vec<SecretKey>,
    /// Map entries looked up by `<listener>|<host><path>` (HTTP) or `<listener>|<host>` (TLS).
    pub exact_entries: Vec<MapEntry>,
    /// Map entries looked up by prefix: `<listener>|<host><path>/`.
    pub prefix_entries: Vec<MapEntry>,
    /// Rules a map cannot express (methods, headers, query parameters, regular expressions),
    /// highest precedence first.
    pub conditional: Vec<ConditionalRule>,
    /// TCP: the backend of the route that serves the port.
    pub tcp_backend: Option<String>,
    /// Served inside the configuration's own HTTP frontend (`spec.gatewayAPI.sharedHttpPort`).
    pub shared: bool,
}

/// A Secret by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct SecretKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// A listener as the frontend selects it.
#[derive(Clone, Debug, Serialize)]
pub struct ListenerModel {
    /// `<namespace>_<gateway>_<listener>`: the first part of its routes' map keys.
    pub id: String,
    /// Its hostname.
    pub hostname: Option<String>,
    /// The kind of its hostname.
    pub host_kind: HostKind,
    /// For a wildcard, the suffix a host must end with (`.example.com`).
    pub suffix: Option<String>,
}

/// One map line: `key value`, where the value is `<rank>:<backend>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapEntry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

/// A match the maps cannot express, as ACLs.
#[derive(Clone, Debug, Serialize)]
pub struct ConditionalRule {
    /// The listener id.
    pub listener: String,
    /// The host pattern.
    pub host: Option<String>,
    /// Its kind.
    pub host_kind: HostKind,
    /// For a wildcard host, the suffix.
    pub suffix: Option<String>,
    /// `exact`, `prefix` or `regex`.
    pub path_kind: &'static str,
    /// The path (or regular expression).
    pub path: String,
    /// For `prefix`, the path without trailing slashes plus `/`.
    pub prefix_key: String,
    /// The method, if any.
    pub method: Option<String>,
    /// Header matches.
    pub headers: Vec<ValueCondition>,
    /// Query parameter matches.
    pub query: Vec<ValueCondition>,
    /// `<rank>:<backend>`, as a map entry's value.
    pub value: String,
    /// The rank alone.
    pub rank: u64,
}

/// A header or query parameter condition.
#[derive(Clone, Debug, Serialize)]
pub struct ValueCondition {
    /// The name.
    pub name: String,
    /// `exact` or `regex`.
    pub kind: &'static str,
    /// The value or expression.
    pub value: String,
}

/// A Service port a shared backend serves.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ServiceTarget {
    /// `<namespace>_<service>_<port>`.
    pub backend: String,
    /// The Service's namespace.
    pub namespace: String,
    /// `{name, port: {number}}`, as an Ingress backend's `service`.
    pub service: ServiceRef,
}

/// A Service and port, shaped like an Ingress backend's `service`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ServiceRef {
    /// Name.
    pub name: String,
    /// `{number}`.
    pub port: PortNumber,
}

/// `{number}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PortNumber {
    /// The port.
    pub number: u16,
}

/// A backend of its own for one rule.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RuleBackend {
    /// Its name, without `be_`.
    pub name: String,
    /// `http` or `tcp`.
    pub mode: &'static str,
    /// Servers speak HTTP/2 in clear text (gRPC).
    pub h2: bool,
    /// The Services, each with its share.
    pub refs: Vec<WeightedRef>,
    /// Whether servers carry weights (more than one Service).
    pub weighted: bool,
    /// Requests answered with this status instead (500: no valid backend).
    pub fixed_status: Option<u16>,
    /// Rejects every connection (a TLS or TCP rule without a valid backend).
    pub reject: bool,
    /// Request headers set, added, removed.
    pub request_headers: HeaderChanges,
    /// Response headers set, added, removed.
    pub response_headers: HeaderChanges,
    /// A redirect instead of a backend.
    pub redirect: Option<RedirectModel>,
    /// The host to rewrite to.
    pub rewrite_host: Option<String>,
    /// The path rewrite.
    pub rewrite_path: Option<PathRewrite>,
    /// `timeout server`, as a Gateway API duration.
    pub timeout: Option<String>,
    /// Where copies of the requests go: one copy per mirror filter.
    pub mirrors: Vec<Mirror>,
}

/// One RequestMirror filter: where its copies go and how many.
#[derive(Clone, Debug, Serialize)]
pub struct Mirror {
    /// The mirror Service's shared backend.
    pub target: ServiceTarget,
    /// The share of requests copied, in parts per 10,000 (10,000: all).
    pub share: u32,
}

/// A Service and its weight in a rule backend.
#[derive(Clone, Debug, Serialize)]
pub struct WeightedRef {
    /// Namespace.
    pub namespace: String,
    /// `{name, port: {number}}`.
    pub service: ServiceRef,
    /// Its weight.
    pub weight: u32,
}

/// Header changes of a filter.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HeaderChanges {
    /// Set (replacing).
    pub set: Vec<(String, String)>,
    /// Added.
    pub add: Vec<(String, String)>,
    /// Removed.
    pub remove: Vec<String>,
}

/// A redirect.
#[derive(Clone, Debug, Serialize)]
pub struct RedirectModel {
    /// The scheme, or the request's.
    pub scheme: Option<String>,
    /// The host, or the request's.
    pub hostname: Option<String>,
    /// The port, or as the spec derives it.
    pub port: Option<u16>,
    /// The path rewrite, or the request's path.
    pub path: Option<PathRewrite>,
    /// The status code.
    pub code: u16,
}

/// A path rewrite: the whole path, or the matched prefix replaced (`replace-path`).
#[derive(Clone, Debug, Serialize)]
pub struct PathRewrite {
    /// `full` or `prefix`.
    pub kind: &'static str,
    /// For `full`: the new path.
    pub value: String,
    /// For `prefix`: the regular expression matching the prefix and capturing the rest.
    pub pattern: String,
    /// For `prefix`: the replacement (`\1` is the rest).
    pub replacement: String,
    /// For `prefix` to `/`: the path that becomes `/` (the prefix itself).
    pub whole: Option<String>,
}

/// Parsed objects a build reads, by kind. Built from the stores by [`Inputs::from_stores`].
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// GatewayClasses.
    pub classes: Vec<resources::GatewayClass>,
    /// Gateways.
    pub gateways: Vec<resources::Gateway>,
    /// HTTPRoutes.
    pub http_routes: Vec<resources::Route>,
    /// GRPCRoutes.
    pub grpc_routes: Vec<resources::Route>,
    /// TLSRoutes.
    pub tls_routes: Vec<resources::Route>,
    /// TCPRoutes.
    pub tcp_routes: Vec<resources::Route>,
    /// ReferenceGrants.
    pub grants: Vec<resources::ReferenceGrant>,
    /// Namespace labels, by name.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Services by (namespace, name).
    pub services: BTreeMap<(String, String), resources::Service>,
    /// Secrets by (namespace, name), without their content.
    pub secrets: BTreeMap<(String, String), resources::SecretSummary>,
    /// The HAProxy pods' IPs (Gateway addresses when none are configured).
    pub pod_ips: Vec<String>,
    /// The addresses each Gateway's Service was given, by Service name (`gatewayServices`).
    pub service_addresses: BTreeMap<String, Vec<String>>,
}

impl Inputs {
    /// Reads the Gateway API's objects from the render's stores. Services and Secrets are read
    /// only where Gateway objects name them; an object that does not parse is skipped.
    pub fn from_stores(
        stores: &crate::store::Stores,
        pod_ips: Vec<String>,
        services: Option<&crate::config::GatewayServices>,
    ) -> Self {
        fn parse<T: serde::de::DeserializeOwned>(object: &crate::store::StoredObject) -> Option<T> {
            // Straight from the stored template value: no JSON in between.
            T::deserialize(object.value.clone()).ok()
        }
        fn all<T: serde::de::DeserializeOwned>(stores: &crate::store::Stores, alias: &str) -> Vec<T> {
            stores.get(alias).map(|store| store.iter().filter_map(|o| parse(o)).collect()).unwrap_or_default()
        }
        let mut inputs = Self {
            classes: all(stores, aliases::GATEWAY_CLASSES),
            gateways: all(stores, aliases::GATEWAYS),
            http_routes: all(stores, aliases::HTTP_ROUTES),
            grpc_routes: all(stores, aliases::GRPC_ROUTES),
            tls_routes: all(stores, aliases::TLS_ROUTES),
            tcp_routes: all(stores, aliases::TCP_ROUTES),
            grants: all(stores, aliases::REFERENCE_GRANTS),
            pod_ips,
            ..Self::default()
        };
        if inputs.gateways.is_empty() {
            return inputs;
        }
        for namespace in all::<resources::Namespace>(stores, aliases::NAMESPACES) {
            inputs.namespaces.insert(namespace.metadata.name, namespace.metadata.labels);
        }
        let get = |alias: &str, namespace: &str, name: &str| {
            let key = crate::store::ObjectKey { namespace: namespace.into(), name: name.into() };
            stores.get(alias).and_then(|store| store.by_key(&key).cloned())
        };
        let routes =
            inputs.http_routes.iter().chain(&inputs.grpc_routes).chain(&inputs.tls_routes).chain(&inputs.tcp_routes);
        let mut wanted = Vec::new();
        for route in routes {
            for rule in &route.spec.rules {
                let refs = rule
                    .backend_refs
                    .iter()
                    .chain(rule.filters.iter().filter_map(|f| f.request_mirror.as_ref()).map(|m| &m.backend_ref));
                for backend in refs {
                    let namespace = backend.namespace.clone().unwrap_or_else(|| route.metadata.namespace.clone());
                    wanted.push((namespace, backend.name.clone()));
                }
            }
        }
        for (namespace, name) in wanted {
            if let Some(service) = get(aliases::SERVICES, &namespace, &name).and_then(|o| parse(&o)) {
                inputs.services.insert((namespace, name), service);
            }
        }
        if let Some(services) = services {
            for gateway in &inputs.gateways {
                let name = gateway_service_name(&gateway.metadata.namespace, &gateway.metadata.name);
                let service = get(aliases::SERVICES, &services.namespace, &name).and_then(|o| parse(&o));
                let addresses = service.map(|s: resources::Service| s.load_balancer_addresses()).unwrap_or_default();
                inputs.service_addresses.insert(name, addresses);
            }
        }
        let mut certificates = Vec::new();
        for gateway in &inputs.gateways {
            for listener in &gateway.spec.listeners {
                for reference in listener.tls.iter().flat_map(|tls| &tls.certificate_refs) {
                    let namespace = reference.namespace.clone().unwrap_or_else(|| gateway.metadata.namespace.clone());
                    certificates.push((namespace, reference.name.clone()));
                }
            }
        }
        for (namespace, name) in certificates {
            if let Some(secret) = get(aliases::SECRETS, &namespace, &name).and_then(|o| parse(&o)) {
                inputs.secrets.insert((namespace, name), secret);
            }
        }
        inputs
    }
}
