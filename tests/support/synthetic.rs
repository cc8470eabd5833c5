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
