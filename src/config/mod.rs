//! The configuration resource `HAProxyTemplateConfig` (group `haptic.dev`): what to watch,
//! which pods to manage, how to reach them, and the templates to render.
//!
//! The CRD is generated from these types (`haptic crd`), so the OpenAPI schema the API server
//! enforces and the Rust types cannot drift apart. Checks the schema cannot express (template
//! syntax, index keys) live in [`validate`], whose problems end up in the resource's status.

mod duration;
pub mod validate;
mod version;

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use duration::ConfigDuration;
pub use version::{HaproxyVersion, meets_minimum};

/// API group of haptic's resources.
pub const GROUP: &str = "haptic.dev";

/// The desired state of one haptic installation.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "haptic.dev",
    version = "v1alpha1",
    kind = "HAProxyTemplateConfig",
    namespaced,
    status = "HAProxyTemplateConfigStatus",
    shortname = "htc",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HAProxyTemplateConfigSpec {
    /// Resource types to watch, by the alias templates use (`resources.<alias>`).
    #[x_kube(validation = Rule::new("self.all(alias, alias.matches('^[a-z][a-zA-Z0-9_]*$'))")
        .message("aliases start with a lowercase letter and hold only letters, digits and '_'"))]
    pub watched_resources: BTreeMap<String, WatchedResource>,
    /// Labels that select the HAProxy pods to manage.
    pub pod_selector: PodSelector,
    /// How pods are reached and deployed to.
    #[serde(default)]
    pub dataplane: DataplaneSettings,
    /// The templates that produce `haproxy.cfg`, map files and general files.
    pub templates: Templates,
    /// Serve the Gateway API: templates get the `gateway` model and the controller writes the
    /// Gateway API objects' status. Off when absent.
    #[serde(default, rename = "gatewayAPI", skip_serializing_if = "Option::is_none")]
    pub gateway_api: Option<GatewaySettings>,
    /// Write `status.loadBalancer` of the Ingresses this configuration serves (the leader
    /// does). Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_status: Option<IngressStatusSettings>,
    /// Tests of the templates: fixtures rendered in place of the cluster's objects, and what
    /// the result must hold. A version whose tests fail is not activated (`haptic validate`
    /// runs them offline, requests included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_tests: Vec<ValidationTest>,
    /// Leader election timings for the controller's replicas, in place of their flags
    /// (`--lease-duration-seconds`, `--lease-grace-seconds`); read when a replica starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_election: Option<LeaderElectionSettings>,
    /// The controller's log filter while this version is in force (`info`, `debug`,
    /// `haptic=debug,kube=warn`); absent: the controller's own (`RUST_LOG`, else `info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
}

/// How long the Lease holds and how early its holder renews it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElectionSettings {
    /// How long a Lease holds without renewal.
    pub lease_duration: ConfigDuration,
    /// How long before expiry the holder renews; a leader that cannot renew stops writing to
    /// pods half this long before another replica may take over. Shorter than the duration.
    pub lease_grace: ConfigDuration,
}

/// One named validation test: its fixtures are rendered with the configuration's templates, and
/// every assertion must hold.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidationTest {
    /// The test's name, unique in the configuration.
    #[schemars(length(min = 1))]
    pub name: String,
    /// What it checks, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Kubernetes objects in place of the cluster's, each taken by the watched resource of its
    /// apiVersion and kind (as `haptic render --resources` does); Pods are the HAProxy pods.
    #[serde(default)]
    #[schemars(schema_with = "free_form_objects")]
    pub fixtures: Vec<serde_json::Value>,
    /// What the render must hold.
    #[schemars(length(min = 1))]
    pub assertions: Vec<Assertion>,
}

/// One assertion. Exactly one of `contains`, `notContains`, `matches`, `mapEntry` and
/// `request` is set; the first three read `file`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assertion {
    /// The rendered file read: `haproxy.cfg` (the default), `maps/<name>`, `files/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The file holds this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contains: Option<String>,
    /// The file does not hold this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_contains: Option<String>,
    /// A line of the file matches this regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<String>,
    /// A map file has this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_entry: Option<MapEntryAssertion>,
    /// A request through HAProxy running the render gets this answer (run by `haptic
    /// validate`, and by the controller when it has an HAProxy binary: `--validation-haproxy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestAssertion>,
}

/// A map file's entry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapEntryAssertion {
    /// The map's name (`host.map`).
    pub map: String,
    /// The key.
    pub key: String,
    /// Its value; any value when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A plain-HTTP request through the rendered configuration, and the answer it must get.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestAssertion {
    /// The port of the rendered configuration's `bind` the request goes to; when absent, the
    /// first plain (not `ssl`) bind of a frontend that routes (`use_backend`, `default_backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The method (`GET` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The Host header.
    pub host: String,
    /// The path, with its query (`/` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The answer expected.
    pub expect: ExpectedAnswer,
}

/// What a request must be answered with; at least one field is set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExpectedAnswer {
    /// The backend section that takes the request (every HTTP backend answers in its name,
    /// after its own rules: a redirect, a deny or an auth challenge answers first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Response headers (name → exact value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// Which Ingresses get `status.loadBalancer`, and what it says.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressStatusSettings {
    /// The IngressClass served: Ingresses naming it (`spec.ingressClassName` or the
    /// `kubernetes.io/ingress.class` annotation).
    #[schemars(length(min = 1))]
    pub ingress_class: String,
    /// Also Ingresses naming no class.
    #[serde(default)]
    pub default_class: bool,
    /// The addresses written (IPs, or hostnames). When empty: the load-balancer addresses of
    /// `service`, else the HAProxy pods' IPs.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// The Service in front of the HAProxy pods, whose `status.loadBalancer` is written when no
    /// addresses are configured (it must be among the watched Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
}

/// A Service by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ServiceRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// One watched resource type.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchedResource {
    /// `group/version` (or `v1` for the core group), as in a manifest.
    #[schemars(length(min = 1))]
    pub api_version: String,
    /// The kind, as in a manifest (`Ingress`, `EndpointSlice`, a custom kind...).
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Namespaces to watch; all namespaces when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// A label selector in `kubectl` syntax (`app=web,tier!=cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// A field selector in `kubectl` syntax (`metadata.name=foo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
    /// Field paths whose values form the lookup key of `resources.<alias>.get(...)`,
    /// e.g. `["metadata.namespace", "metadata.name"]`.
    #[serde(default = "default_index_by")]
    #[schemars(length(min = 1))]
    pub index_by: Vec<String>,
    /// Field paths whose changes alone trigger no render, e.g. `["status"]` of the Ingresses
    /// whose status haptic itself writes; templates still see their latest values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_fields: Vec<String>,
    /// Field paths of each object the templates read (`spec.ports`, `endpoints[*].addresses`:
    /// `[*]` for every item of a list); when set, the rest is dropped as objects arrive (less
    /// memory, and a change only there causes no render). `metadata.namespace`,
    /// `metadata.name` and the `indexBy` and `ignoreFields` paths are always kept. Empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

fn default_index_by() -> Vec<String> {
    vec!["metadata.namespace".into(), "metadata.name".into()]
}

/// Labels that select the HAProxy pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSelector {
    /// Every label here must match.
    #[schemars(extend("minProperties" = 1))]
    pub match_labels: BTreeMap<String, String>,
}

/// How pods are reached and deployed to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DataplaneSettings {
    /// Dataplane API port on each pod.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// How often every pod is checked against what was last pushed to it.
    pub drift_prevention_interval: ConfigDuration,
    /// The least time between two reloads of one pod: a render needing a reload sooner waits,
    /// and renders meanwhile coalesce into that reload. Runtime patches are not paced.
    pub min_deployment_interval: ConfigDuration,
    /// The Secret holding `dataplane_username` and `dataplane_password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    /// TLS to the pods' Dataplane APIs; clear text when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<DataplaneTls>,
    /// Where map files live on the pods.
    #[schemars(length(min = 1))]
    pub maps_dir: String,
    /// Where general files (error pages...) live on the pods.
    #[schemars(length(min = 1))]
    pub general_dir: String,
    /// Where certificates live on the pods.
    #[schemars(length(min = 1))]
    pub certs_dir: String,
    /// How many pods are deployed to at once.
    #[schemars(range(min = 1))]
    pub max_parallel: u32,
    /// How long one request to a pod's Dataplane API may take (a validation, a push and its
    /// reload): past it the action fails and is retried with backoff.
    pub deployment_timeout: ConfigDuration,
    /// How watched changes are coalesced into renders.
    pub debounce: DebounceSettings,
    /// The oldest HAProxy the templates are written for (`2.8` or `2.8.5`): a pod whose HAProxy
    /// is older, or does not say, is refused (nothing is deployed to it) and shown so.
    #[serde(rename = "minimumHAProxyVersion", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))]
    pub minimum_haproxy_version: Option<String>,
}

impl DataplaneSettings {
    /// The minimum HAProxy version, when one is stated (and readable: `validate` reports it otherwise).
    pub fn minimum_haproxy(&self) -> Option<HaproxyVersion> {
        self.minimum_haproxy_version.as_deref().and_then(HaproxyVersion::parse)
    }
}

impl Default for DataplaneSettings {
    fn default() -> Self {
        Self {
            port: 5555,
            drift_prevention_interval: ConfigDuration::from_secs(60),
            min_deployment_interval: ConfigDuration::from_secs(2),
            credentials_secret_ref: None,
            tls: None,
            maps_dir: "/etc/haproxy/maps".into(),
            general_dir: "/etc/haproxy/general".into(),
            certs_dir: "/etc/haproxy/ssl".into(),
            max_parallel: 10,
            deployment_timeout: ConfigDuration::from_secs(30),
            debounce: DebounceSettings::default(),
            minimum_haproxy_version: None,
        }
    }
}

/// TLS to the pods' Dataplane APIs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneTls {
    /// The Secret holding `ca.crt` (the CA bundle pods' certificates are checked against) and,
    /// for Dataplane APIs that require a client certificate, `tls.crt` and `tls.key`.
    pub secret_ref: SecretRef,
    /// The DNS name the pods' certificates are issued for; when empty, each pod's certificate
    /// must name the pod's IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

/// A reference to a Secret; the namespace defaults to the configuration's own.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The Secret's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Coalescing of watched changes: the first change after a quiet `window` renders at once; later
/// ones are batched until `window` passes without a change, but never beyond `maxDelay`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DebounceSettings {
    /// Quiet time that ends a burst.
    pub window: ConfigDuration,
    /// Longest any change waits for its render.
    pub max_delay: ConfigDuration,
}

impl Default for DebounceSettings {
    fn default() -> Self {
        Self { window: ConfigDuration::from_millis(500), max_delay: ConfigDuration::from_secs(5) }
    }
}

/// The templates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Templates {
    /// The template of `haproxy.cfg`.
    #[schemars(length(min = 1))]
    pub haproxy_config: String,
    /// Map files by name (`host.map`) → template.
    #[serde(default)]
    pub maps: BTreeMap<String, String>,
    /// General files by name (`500.http`) → template.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Reusable pieces, included as `{% include "snippets/<name>" %}`.
    #[serde(default)]
    pub snippets: BTreeMap<String, String>,
    /// Free data offered to templates as `extraContext`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub extra_context: Option<serde_json::Value>,
}

fn free_form_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// What the controller last concluded about the configuration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HAProxyTemplateConfigStatus {
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Valid` (and, in later versions, `Rendered`, `Synced`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A status condition, shaped like Kubernetes' own.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's name.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase word for machines.
    pub reason: String,
    /// A sentence for people.
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// `spec.gatewayAPI` of the configuration: serve the Gateway API for this controller name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySettings {
    /// GatewayClasses whose `spec.controllerName` is this are served (and their status written).
    #[schemars(length(min = 1))]
    pub controller_name: String,
    /// Ports a listener may not take, because the rest of the configuration binds them (the
    /// Ingress frontends, the health port): such a listener is refused with `PortUnavailable`.
    #[serde(default)]
    pub reserved_ports: Vec<u16>,
    /// The port of the configuration's own HTTP frontend (the Ingress routes'): HTTP listeners
    /// on it are served in that frontend, their routes before the Ingress routes (a request no
    /// Gateway API route takes goes on to them); other protocols are refused there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_http_port: Option<u16>,
    /// Addresses written into Gateways' `status.addresses` (the HAProxy Service's, say);
    /// the HAProxy pods' IPs when empty. Not used with `gatewayServices`.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// One address per Gateway: each Gateway's listeners get fleet ports of their own and a
    /// Service of its own maps each listener port to them; the Gateway's addresses are that
    /// Service's. Without it, every Gateway shares the pods' ports and `addresses`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_services: Option<GatewayServices>,
}

/// The Services that give each Gateway an address of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServices {
    /// The namespace the Services are made in: the HAProxy pods' own (a Service selects Pods
    /// of its namespace only).
    #[schemars(length(min = 1))]
    pub namespace: String,
    /// The pod labels each Service selects; the configuration's `podSelector.matchLabels`
    /// when empty.
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    /// The Services' type: `LoadBalancer` (the default), `NodePort` or `ClusterIP`.
    #[serde(default = "load_balancer")]
    pub service_type: String,
    /// Annotations put on every such Service (a cloud's load balancer settings, say).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The first fleet port handed to a listener.
    pub first_port: u16,
    /// The last fleet port handed to a listener (the range must not hold the configuration's
    /// own ports).
    pub last_port: u16,
}

fn load_balancer() -> String {
    "LoadBalancer".into()
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn crd_is_namespaced_in_our_group_with_a_status_subresource() {
        let crd = HAProxyTemplateConfig::crd();
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "HAProxyTemplateConfig");
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
    }

    #[test]
    fn defaults_fill_an_almost_empty_spec() {
        let spec: HAProxyTemplateConfigSpec = serde_json::from_value(serde_json::json!({
            "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress"}},
            "podSelector": {"matchLabels": {"app": "haproxy"}},
            "templates": {"haproxyConfig": "global\n"}
        }))
        .unwrap();
        assert_eq!(spec.dataplane.port, 5555);
        assert_eq!(spec.dataplane.drift_prevention_interval, ConfigDuration::from_secs(60));
        assert_eq!(spec.watched_resources["ingresses"].index_by, ["metadata.namespace", "metadata.name"]);
    }
}
