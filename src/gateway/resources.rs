//! The Gateway API objects as the model reads them: only the fields it uses, every one
//! optional or defaulted, so an object the API server accepted always reads (a field the model
//! needs and does not find is a status reason, not a parse error).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The API group of the Gateway API.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// The API resource of a Gateway API kind at `v1` (plurals are the lowercase kind plus `s`, or
/// `es` after an `s`: `gatewayclasses`, `httproutes`).
pub fn api_resource(kind: &str) -> kube::api::ApiResource {
    let lower = kind.to_ascii_lowercase();
    let plural = if lower.ends_with('s') { format!("{lower}es") } else { format!("{lower}s") };
    kube::api::ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: kind.into(),
        plural,
    }
}

/// `metadata` of any object.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Meta {
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`, which status conditions observe.
    pub generation: i64,
    /// RFC 3339 creation time: older routes take precedence on ties.
    pub creation_timestamp: String,
    /// Labels (namespaces are selected by them).
    pub labels: BTreeMap<String, String>,
}

/// A GatewayClass.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct GatewayClass {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: GatewayClassSpec,
}

/// `GatewayClass.spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayClassSpec {
    /// The controller that owns the class.
    pub controller_name: String,
}

/// A Gateway.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Gateway {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: GatewaySpec,
}

/// `Gateway.spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The class.
    pub gateway_class_name: String,
    /// Listeners.
    pub listeners: Vec<Listener>,
}

/// One listener of a Gateway.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Listener {
    /// Its name (a section name routes can attach to).
    pub name: String,
    /// The hostname it serves (exact or `*.` wildcard); all when absent.
    pub hostname: Option<String>,
    /// The port.
    pub port: i64,
    /// HTTP, HTTPS, TLS, TCP or UDP.
    pub protocol: String,
    /// TLS settings.
    pub tls: Option<ListenerTls>,
    /// Which routes may attach.
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `listener.tls`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerTls {
    /// Terminate (the default) or Passthrough.
    pub mode: Option<String>,
    /// The certificates to serve (Terminate).
    pub certificate_refs: Vec<ObjectReference>,
}

/// `listener.allowedRoutes`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// Namespaces routes may come from.
    pub namespaces: Option<RouteNamespaces>,
    /// Route kinds allowed; by protocol when empty.
    pub kinds: Vec<RouteGroupKind>,
}

/// `allowedRoutes.namespaces`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// Same (the default), All or Selector.
    pub from: Option<String>,
    /// The namespaces' label selector, for `Selector`.
    pub selector: Option<LabelSelector>,
}

/// A label selector (matchLabels and matchExpressions).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be equal.
    pub match_labels: BTreeMap<String, String>,
    /// Expressions that must hold.
    pub match_expressions: Vec<LabelExpression>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct LabelExpression {
    /// The label.
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    /// The values for In and NotIn.
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether `labels` are selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(key, value)| labels.get(key) == Some(value))
            && self.match_expressions.iter().all(|expression| {
                let value = labels.get(&expression.key);
                match expression.operator.as_str() {
                    "In" => value.is_some_and(|v| expression.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !expression.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// A route kind (`allowedRoutes.kinds`, `supportedKinds`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RouteGroupKind {
    /// The group; the Gateway API's when absent.
    pub group: Option<String>,
    /// The kind.
    pub kind: String,
}

/// A reference to an object (certificateRefs, ReferenceGrant targets).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ObjectReference {
    /// The group (the core group when absent or empty).
    pub group: Option<String>,
    /// The kind (Secret when absent, for certificates).
    pub kind: Option<String>,
    /// The name.
    pub name: String,
    /// The namespace; the referrer's when absent.
    pub namespace: Option<String>,
}

/// A route's reference to its parent.
#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ParentReference {
    /// The group (the Gateway API's when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The kind (Gateway when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The namespace; the route's when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The parent's name.
    pub name: String,
    /// A listener's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// A listener's port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
}

/// A reference from a route to a backend.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct BackendRef {
    /// The group (core when absent or empty).
    pub group: Option<String>,
    /// The kind (Service when absent).
    pub kind: Option<String>,
    /// The name.
    pub name: String,
    /// The namespace; the route's when absent.
    pub namespace: Option<String>,
    /// The Service port.
    pub port: Option<i64>,
    /// The share of traffic (1 when absent).
    pub weight: Option<i64>,
}

/// A route of any kind, as the model reads it: HTTPRoute, GRPCRoute, TLSRoute, TCPRoute.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Route {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: RouteSpec,
}

/// The spec fields every route kind shares, and the rules of all of them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteSpec {
    /// The parents it attaches to.
    pub parent_refs: Vec<ParentReference>,
    /// Hostnames (HTTPRoute, GRPCRoute, TLSRoute).
    pub hostnames: Vec<String>,
    /// Rules.
    pub rules: Vec<RouteRule>,
}

/// A rule of any route kind.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteRule {
    /// Matches (HTTPRoute: path, headers, query, method; GRPCRoute: method, headers).
    pub matches: Vec<RouteMatch>,
    /// Filters.
    pub filters: Vec<Filter>,
    /// Backends.
    pub backend_refs: Vec<BackendRef>,
    /// Timeouts (HTTPRoute).
    pub timeouts: Option<Timeouts>,
}

/// A match of an HTTPRoute or GRPCRoute rule.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteMatch {
    /// The path (HTTPRoute).
    pub path: Option<PathMatch>,
    /// Header matches.
    pub headers: Vec<ValueMatch>,
    /// Query parameter matches (HTTPRoute).
    pub query_params: Vec<ValueMatch>,
    /// The method: a string for HTTPRoute, an object for GRPCRoute.
    pub method: Option<serde_json::Value>,
}

/// `match.path`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct PathMatch {
    /// Exact, PathPrefix (the default) or RegularExpression.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The path (`/` when absent).
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ValueMatch {
    /// Exact (the default) or RegularExpression.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The header's or parameter's name.
    pub name: String,
    /// The value.
    pub value: String,
}

/// A filter of a rule.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Filter {
    /// Its type.
    #[serde(rename = "type")]
    pub kind: String,
    /// RequestHeaderModifier.
    pub request_header_modifier: Option<HeaderModifier>,
    /// ResponseHeaderModifier.
    pub response_header_modifier: Option<HeaderModifier>,
    /// RequestRedirect.
    pub request_redirect: Option<Redirect>,
    /// URLRewrite.
    pub url_rewrite: Option<Rewrite>,
    /// RequestMirror.
    pub request_mirror: Option<Mirror>,
}

/// A header modifier.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct HeaderModifier {
    /// Headers set (replacing any).
    pub set: Vec<Header>,
    /// Headers added.
    pub add: Vec<Header>,
    /// Headers removed.
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Header {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `requestRedirect`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Redirect {
    /// http or https.
    pub scheme: Option<String>,
    /// The host.
    pub hostname: Option<String>,
    /// The path.
    pub path: Option<PathModifier>,
    /// The port.
    pub port: Option<i64>,
    /// 301, 302 (the default), 303, 307 or 308.
    pub status_code: Option<i64>,
}

/// `urlRewrite`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Rewrite {
    /// The host.
    pub hostname: Option<String>,
    /// The path.
    pub path: Option<PathModifier>,
}

/// A path modifier of a redirect or rewrite.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathModifier {
    /// ReplaceFullPath or ReplacePrefixMatch.
    #[serde(rename = "type")]
    pub kind: String,
    /// The full path.
    pub replace_full_path: Option<String>,
    /// The prefix.
    pub replace_prefix_match: Option<String>,
}

/// `requestMirror`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
#[serde(rename_all = "camelCase")]
pub struct Mirror {
    /// The mirror's backend.
    pub backend_ref: BackendRef,
    /// The share of requests copied, in percent (all when absent).
    pub percent: Option<i64>,
    /// The share of requests copied, as a fraction.
    pub fraction: Option<Fraction>,
}

/// `numerator / denominator` (denominator 100 when absent).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Fraction {
    /// Numerator.
    pub numerator: i64,
    /// Denominator.
    pub denominator: Option<i64>,
}

/// `rule.timeouts`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Timeouts {
    /// The whole request.
    pub request: Option<String>,
    /// One request to the backend.
    pub backend_request: Option<String>,
}

/// A ReferenceGrant.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReferenceGrant {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: ReferenceGrantSpec,
}

/// `ReferenceGrant.spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReferenceGrantSpec {
    /// Who may refer.
    pub from: Vec<GrantFrom>,
    /// To what.
    pub to: Vec<GrantTo>,
}

/// `ReferenceGrant.spec.from[]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct GrantFrom {
    /// The referrer's group.
    pub group: String,
    /// The referrer's kind.
    pub kind: String,
    /// The referrer's namespace.
    pub namespace: String,
}

/// `ReferenceGrant.spec.to[]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct GrantTo {
    /// The target's group (core when empty).
    pub group: String,
    /// The target's kind.
    pub kind: String,
    /// One target by name; every one of the kind when absent.
    pub name: Option<String>,
}

/// A Service, for its ports.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Service {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: ServiceSpec,
    /// Status.
    pub status: ServiceStatus,
}

impl Service {
    /// The addresses its load balancer was given (IPs or hostnames), in order.
    pub fn load_balancer_addresses(&self) -> Vec<String> {
        self.status
            .load_balancer
            .ingress
            .iter()
            .filter_map(|ingress| ingress.ip.clone().or_else(|| ingress.hostname.clone()))
            .collect()
    }
}

/// `Service.status`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceStatus {
    /// Its load balancer.
    pub load_balancer: LoadBalancerStatus,
}

/// `Service.status.loadBalancer`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct LoadBalancerStatus {
    /// The addresses it was given.
    pub ingress: Vec<LoadBalancerIngress>,
}

/// One `Service.status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct LoadBalancerIngress {
    /// An IP.
    pub ip: Option<String>,
    /// A hostname.
    pub hostname: Option<String>,
}

/// `Service.spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ServiceSpec {
    /// Ports.
    pub ports: Vec<ServicePort>,
}

/// One Service port.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServicePort {
    /// Its name.
    pub name: Option<String>,
    /// Its number.
    pub port: i64,
    /// Its application protocol (kubernetes.io/h2c, grpc...).
    pub app_protocol: Option<String>,
}

/// A namespace, for its labels.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Namespace {
    /// Metadata.
    pub metadata: Meta,
}

/// A Secret, for whether it holds a certificate (its content is never read here).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct SecretSummary {
    /// Metadata.
    pub metadata: Meta,
    /// The Secret's type.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The keys it holds (values are ignored).
    pub data: BTreeMap<String, serde::de::IgnoredAny>,
}
