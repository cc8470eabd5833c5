//! Synthetic cluster content for render tests and benchmarks: N Ingresses, each with its
//! Service and an EndpointSlice of 3 ready endpoints, spread over a few namespaces.
#![allow(dead_code)] // Tests and benchmarks each use part of it.

use serde_json::{Value, json};

/// The objects for `count` Ingresses with one path each (`/` to the app's Service by port
/// number): Ingress, Service and EndpointSlice per app.
pub fn ingress_fleet(count: usize) -> Vec<Value> {
    ingress_fleet_with_paths(count, 1)
}

/// As [`ingress_fleet`], with `paths` paths per Ingress (`/`, then `/api1`, `/api2`, ... by
/// port name), all to the app's Service.
pub fn ingress_fleet_with_paths(count: usize, paths: usize) -> Vec<Value> {
    let mut objects = Vec::with_capacity(count * 3);
    for i in 0..count {
        let namespace = format!("team-{}", i % 17);
        let app = format!("app-{i}");
        objects.push(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"namespace": namespace, "name": app, "uid": format!("ing-{i}"),
                         "resourceVersion": "1", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"ingressClassName": "haproxy", "rules": [{
                "host": format!("{app}.example.com"),
                "http": {"paths": (0..paths).map(|p| if p == 0 {
                    json!({"path": "/", "pathType": "Prefix",
                           "backend": {"service": {"name": app, "port": {"number": 80}}}})
                } else {
                    json!({"path": format!("/api{p}"), "pathType": "Prefix",
                           "backend": {"service": {"name": app, "port": {"name": "http"}}}})
                }).collect::<Vec<_>>()}
            }]}
        }));
        objects.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": namespace, "name": app},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        }));
        let base = i * 3;
        objects.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": namespace, "name": format!("{app}-abcde"),
                         "labels": {"kubernetes.io/service-name": app}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": (0..3).map(|k| json!({
                "addresses": [format!("10.{}.{}.{}", (base + k) / 65536 % 256, (base + k) / 256 % 256, (base + k) % 256)],
                "conditions": {"ready": true}
            })).collect::<Vec<_>>()
        }));
    }
    objects
}

/// As [`ingress_fleet`], with every `every`-th Ingress carrying ingress-nginx annotations as
/// its users write them (one of a few bundles in turn: redirects and body size; timeouts and an
/// allow list; CORS and a rate limit; sticky sessions and a hash; backend TLS and auth).
pub fn ingress_fleet_annotated(count: usize, every: usize) -> Vec<Value> {
    let nginx = |pairs: &[(&str, &str)]| -> Value {
        pairs
            .iter()
            .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), json!(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let bundles = [
        nginx(&[("ssl-redirect", "true"), ("force-ssl-redirect", "true"), ("proxy-body-size", "8m")]),
        nginx(&[
            ("proxy-connect-timeout", "10"),
            ("proxy-read-timeout", "120"),
            ("whitelist-source-range", "10.0.0.0/8,192.168.0.0/16"),
        ]),
        nginx(&[
            ("enable-cors", "true"),
            ("cors-allow-origin", "https://a.example.com, https://*.example.net"),
            ("limit-rps", "20"),
        ]),
        nginx(&[("affinity", "cookie"), ("session-cookie-name", "route"), ("upstream-hash-by", "$request_uri")]),
        nginx(&[
            ("backend-protocol", "HTTPS"),
            ("proxy-ssl-verify", "off"),
            ("app-root", "/app"),
            ("x-forwarded-prefix", "/shop"),
        ]),
    ];
    let mut objects = ingress_fleet(count);
    for (n, ingress) in objects.iter_mut().filter(|o| o["kind"] == "Ingress").enumerate() {
        if n % every == 0 {
            ingress["metadata"]["annotations"] = bundles[(n / every) % bundles.len()].clone();
        }
    }
    objects
}

/// The objects for `count` HTTPRoutes attached to one Gateway (`web`, HTTP on 18080, routes
/// from all namespaces) of the GatewayClass `haptic` (controller `haptic.dev/gateway-controller`,
/// the chart's default), each with its own hostname, Service and EndpointSlice of 3 endpoints
/// (as [`ingress_fleet`]). Every tenth route also matches a header (a rule the maps cannot
/// hold), and every tenth, offset by five, splits its traffic 80/20 with the next app.
pub fn httproute_fleet(count: usize) -> Vec<Value> {
    let mut objects: Vec<Value> = ingress_fleet(count).into_iter().filter(|o| o["kind"] != "Ingress").collect();
    objects.push(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "haptic"}, "spec": {"controllerName": "haptic.dev/gateway-controller"}
    }));
    objects.push(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"namespace": "gw-system", "name": "web"},
        "spec": {"gatewayClassName": "haptic", "listeners": [{"name": "http", "port": 18080, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}
    }));
    for i in 0..count {
        let namespace = format!("team-{}", i % 17);
        let app = format!("app-{i}");
        let mut rules = vec![json!({"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                    "backendRefs": [{"name": app, "port": 80}]})];
        if i % 10 == 0 {
            rules.push(json!({"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                                           "headers": [{"name": "x-canary", "value": "1"}]}],
                              "backendRefs": [{"name": app, "port": 80}]}));
        }
        if i % 10 == 5 && i + 1 < count && (i + 1) % 17 == i % 17 {
            rules[0]["backendRefs"] = json!([{"name": app, "port": 80, "weight": 80},
                                             {"name": format!("app-{}", i + 1), "port": 80, "weight": 20}]);
        }
        objects.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"namespace": namespace, "name": app, "creationTimestamp": format!("2026-01-01T00:00:{:02}Z", i % 60)},
            "spec": {"parentRefs": [{"name": "web", "namespace": "gw-system"}],
                     "hostnames": [format!("{app}.example.com")], "rules": rules}
        }));
    }
    objects
}

/// `objects` as an API server (and the EndpointSlice controller) would hand them over (see
/// [`as_served`]).
pub fn served(objects: Vec<Value>) -> Vec<Value> {
    objects.into_iter().enumerate().map(|(n, object)| as_served(object, n)).collect()
}

/// `config` with no watched resource keeping only some `fields`: whole objects in every store.
pub fn keeping_whole_objects(config: &haptic::config::HAProxyTemplateConfig) -> haptic::config::HAProxyTemplateConfig {
    let mut whole = config.clone();
    for watched in whole.spec.watched_resources.values_mut() {
        watched.fields.clear();
    }
    whole
}

/// `object` as an API server (and the EndpointSlice controller) would hand it over: with the
/// fields the chart's `fields` drop (identity, defaults, status, target refs, node names, zones,
/// trigger times), endpoints in every condition, and ports with an application protocol.
fn as_served(mut object: Value, n: usize) -> Value {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let metadata = &mut object["metadata"];
    metadata["uid"] = json!(format!("4c5e1d2a-0000-4000-8000-{n:012}"));
    metadata["creationTimestamp"] = json!("2026-12-04T10:00:00Z");
    metadata["generation"] = json!(n % 7 + 1);
    match kind.as_str() {
        "Service" => {
            metadata["labels"] = json!({"app": "shop"});
            let spec = &mut object["spec"];
            for key in ["clusterIP", "clusterIPs", "ipFamilies"] {
                spec[key] = if key == "clusterIP" { json!("10.96.0.10") } else { json!(["10.96.0.10"]) };
            }
            spec["ipFamilies"] = json!(["IPv4"]);
            spec["ipFamilyPolicy"] = json!("SingleStack");
            spec["sessionAffinity"] = json!("None");
            spec["type"] = json!("ClusterIP");
            spec["internalTrafficPolicy"] = json!("Cluster");
            spec["selector"] = json!({"app": "shop"});
            if let Some(port) = spec["ports"].get_mut(0) {
                port["protocol"] = json!("TCP");
                if n.is_multiple_of(3) {
                    port["appProtocol"] = json!("kubernetes.io/h2c");
                }
            }
            object["status"] = if n.is_multiple_of(5) {
                json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}})
            } else {
                json!({"loadBalancer": {}})
            };
        }
        "EndpointSlice" => {
            metadata["labels"]["endpointslice.kubernetes.io/managed-by"] = json!("endpointslice-controller.k8s.io");
            metadata["annotations"] =
                json!({"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-04T10:00:00Z"});
            metadata["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Service", "name": "svc", "uid": "1"}]);
            if let Some(endpoints) = object["endpoints"].as_array_mut() {
                for (k, endpoint) in endpoints.iter_mut().enumerate() {
                    endpoint["nodeName"] = json!(format!("node-{k}"));
                    endpoint["zone"] = json!("z1");
                    endpoint["targetRef"] =
                        json!({"kind": "Pod", "namespace": "web", "name": format!("pod-{k}"), "uid": "2"});
                    endpoint["conditions"] = match (n + k) % 4 {
                        0 => json!({"ready": true, "serving": true, "terminating": false}),
                        1 => json!({"ready": false, "serving": true, "terminating": true}),
                        2 => json!({"ready": false}),
                        _ => json!({}),
                    };
                }
            }
        }
        _ => {}
    }
    object
}
