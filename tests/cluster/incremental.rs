//! Incremental rendering (issue #17): a renderer that reuses the blocks of its last render
//! (`shared.render_each`) gives, after any sequence of changes, exactly what a renderer
//! rendering everything afresh gives: the same files, the same server slots, the same error.
//! Run on the chart's default library, over a small cluster changed at random: Ingresses of
//! every shape added, edited and removed, endpoints scaled, Services renamed, TLS Secrets and
//! the default certificate coming and going, the IngressClass becoming the default.

use crate::chart_config;
use crate::synthetic;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use haptic::config::HAProxyTemplateConfig;
use haptic::render::Renderer;
use haptic::store::Stores;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{Value as Json, json};

const INGRESSES: usize = 16;
const NAMESPACES: [&str; 2] = ["shop", "blog"];
const SERVICES: usize = 5;
const SECRETS: usize = 3;

/// The chart's configuration; the test fails, saying why, without Helm.
fn config() -> &'static HAProxyTemplateConfig {
    static CONFIG: OnceLock<HAProxyTemplateConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        chart_config::chart_config_with(&[]).expect(
            "the chart's configuration renders (Helm at $HAPTIC_HELM or ~/.cache/haptic-env/bin/helm: make env-install)",
        )
    })
}

/// A certificate and its key, made once with openssl.
fn certificate() -> &'static (String, String) {
    static PAIR: OnceLock<(String, String)> = OnceLock::new();
    PAIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=shop.example.com", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs (needed to make a test certificate)");
        assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
        (std::fs::read_to_string(cert).expect("cert"), std::fs::read_to_string(key).expect("key"))
    })
}

/// The cluster, as the few choices that shape it.
#[derive(Clone, Debug, Default)]
struct World {
    /// Each Ingress slot: absent, or one of its shapes.
    ingresses: [Option<u8>; INGRESSES],
    /// Ready endpoints of each (namespace, Service), and an offset moving their addresses.
    endpoints: [[(u8, u8); SERVICES]; 2],
    /// Whether each Service names its port `web` instead of `http`.
    renamed_ports: [[bool; SERVICES]; 2],
    /// Which TLS Secrets exist in each namespace.
    secrets: [[bool; SECRETS]; 2],
    /// Whether the default certificate's Secret exists.
    default_certificate: bool,
    /// Whether the IngressClass says it is the cluster's default.
    default_class: bool,
}

/// One change to the cluster.
#[derive(Clone, Debug)]
enum Change {
    Ingress(usize, Option<u8>),
    Endpoints(usize, usize, u8, u8),
    RenamePort(usize, usize, bool),
    Secret(usize, usize, bool),
    DefaultCertificate(bool),
    DefaultClass(bool),
}

impl World {
    fn apply(&mut self, change: &Change) {
        match *change {
            Change::Ingress(slot, shape) => self.ingresses[slot] = shape,
            Change::Endpoints(ns, service, count, offset) => self.endpoints[ns][service] = (count, offset),
            Change::RenamePort(ns, service, renamed) => self.renamed_ports[ns][service] = renamed,
            Change::Secret(ns, secret, present) => self.secrets[ns][secret] = present,
            Change::DefaultCertificate(present) => self.default_certificate = present,
            Change::DefaultClass(default) => self.default_class = default,
        }
    }

    /// Every object of the world.
    fn objects(&self) -> Vec<Json> {
        let mut objects = vec![json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "haproxy", "annotations": if self.default_class {
                json!({"ingressclass.kubernetes.io/is-default-class": "true"})
            } else { json!({}) }},
            "spec": {"controller": "haptic.dev/ingress-controller"}
        })];
        let (cert, key) = certificate();
        let tls_secret = |namespace: &str, name: &str| {
            use base64::Engine;
            let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                   "metadata": {"namespace": namespace, "name": name},
                   "data": {"tls.crt": b64(cert), "tls.key": b64(key)}})
        };
        if self.default_certificate {
            objects.push(tls_secret("default", "t-haptic-default-cert"));
        }
        for (n, namespace) in NAMESPACES.iter().enumerate() {
            for service in 0..SERVICES {
                let port_name = if self.renamed_ports[n][service] { "web" } else { "http" };
                objects.push(json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"namespace": namespace, "name": format!("svc-{service}")},
                    "spec": {"ports": [{"name": port_name, "port": 80, "targetPort": 8080}]}
                }));
                let (count, offset) = self.endpoints[n][service];
                objects.push(json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"namespace": namespace, "name": format!("svc-{service}-abcde"),
                                 "labels": {"kubernetes.io/service-name": format!("svc-{service}")}},
                    "addressType": "IPv4",
                    "ports": [{"name": port_name, "port": 8080}],
                    "endpoints": (0..count).map(|k| json!({
                        "addresses": [format!("198.18.{n}.{}", service * 40 + usize::from(offset) + usize::from(k))],
                        "conditions": {"ready": true}
                    })).collect::<Vec<_>>()
                }));
            }
            for secret in 0..SECRETS {
                if self.secrets[n][secret] {
                    objects.push(tls_secret(namespace, &format!("tls-{secret}")));
                }
            }
        }
        for (slot, shape) in self.ingresses.iter().enumerate() {
            if let Some(shape) = shape {
                objects.push(ingress(slot, *shape));
            }
        }
        objects
    }
}

/// Ingress `slot` in one of its shapes: the shape picks its host, paths, Service, class,
/// annotations, TLS and default backend.
fn ingress(slot: usize, shape: u8) -> Json {
    let shape = usize::from(shape);
    let namespace = NAMESPACES[slot % 2];
    let service = (slot + shape) % SERVICES;
    let host = match shape % 4 {
        0 => json!(format!("h{}.example.com", slot % 5)),
        1 => json!(format!("*.w{}.example.com", slot % 3)),
        2 => json!(null),
        _ => json!("shop.example.com"),
    };
    let port = if shape % 3 == 0 { json!({"name": "http"}) } else { json!({"number": 80}) };
    let path_type = ["Prefix", "Exact", "ImplementationSpecific"][shape % 3];
    let mut paths = vec![json!({"path": format!("/p{}", shape % 4), "pathType": path_type,
                                "backend": {"service": {"name": format!("svc-{service}"), "port": port}}})];
    if shape % 5 == 0 {
        paths.push(json!({"path": "/", "pathType": "Prefix",
                          "backend": {"service": {"name": format!("svc-{}", (service + 1) % SERVICES), "port": {"number": 80}}}}));
    }
    let annotations = match shape % 9 {
        0 => json!({}),
        1 => json!({"haptic.dev/ssl-redirect": "true"}),
        2 => json!({"haptic.dev/rewrite-target": "/app"}),
        3 => json!({"haptic.dev/ssl-passthrough": "true"}),
        4 => json!({"haptic.dev/health-check": "true", "haptic.dev/backend-protocol": "h2"}),
        5 => json!({"haptic.dev/deny-list": "10.0.0.0/8"}),
        // A value no setting takes: the render refuses this Ingress.
        6 => json!({"haptic.dev/timeout-server": "soon"}),
        7 => json!({"haproxy.org/rate-limit-requests": "10"}),
        _ => json!({"kubernetes.io/ingress.class": "haproxy"}),
    };
    let mut spec = json!({"rules": [{"host": host, "http": {"paths": paths}}]});
    match shape % 7 {
        0..=3 => spec["ingressClassName"] = json!("haproxy"),
        4 => spec["ingressClassName"] = json!("other"),
        _ => {}
    }
    if shape % 4 == 3 {
        spec["tls"] = json!([{"hosts": ["shop.example.com"], "secretName": format!("tls-{}", shape % SECRETS)}]);
    }
    if shape % 6 == 1 {
        spec["defaultBackend"] = json!({"service": {"name": format!("svc-{service}"), "port": {"number": 80}}});
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
           "metadata": {"namespace": namespace, "name": format!("ing-{slot}"), "annotations": annotations},
           "spec": spec})
}

/// Stores of `objects`. With `previous`, each store whose objects changed is changed in place,
/// object by object, as the watcher changes them (its history then tells a renderer which keys
/// moved), and a store whose objects did not is kept as it was; without, every store is new.
fn stores(objects: &[Json], previous: Option<&Stores>) -> Stores {
    let sourced: Vec<_> = objects.iter().map(|o| (PathBuf::from("world"), o.clone())).collect();
    let built = haptic::offline::build_stores(&config().spec, &sourced).expect("stores build");
    let Some(previous) = previous else { return built };
    let by_key: HashMap<(String, String, String), &Json> = objects
        .iter()
        .map(|o| {
            let text = |pointer: &str| o.pointer(pointer).and_then(Json::as_str).unwrap_or_default().to_owned();
            ((text("/kind"), text("/metadata/namespace"), text("/metadata/name")), o)
        })
        .collect();
    let mut next = previous.clone();
    for (alias, fresh) in &built {
        let Some(kept) = next.get_mut(alias) else {
            next.insert(alias.clone(), Arc::clone(fresh));
            continue;
        };
        let same = kept.len() == fresh.len()
            && fresh.iter().all(|object| {
                kept.by_key(&object.reference.key)
                    .is_some_and(|old| old.content == object.content && old.ignored == object.ignored)
            });
        if same {
            continue;
        }
        let store = Arc::make_mut(kept);
        let gone: Vec<_> = store
            .iter()
            .filter(|old| fresh.by_key(&old.reference.key).is_none())
            .map(|old| old.reference.key.clone())
            .collect();
        for key in gone {
            store.delete(&key);
        }
        for object in fresh.iter() {
            let key = &object.reference.key;
            let unchanged =
                store.by_key(key).is_some_and(|old| old.content == object.content && old.ignored == object.ignored);
            if !unchanged {
                let json = by_key[&(fresh.kind().to_owned(), key.namespace.to_string(), key.name.to_string())];
                store.apply(json.clone()).expect("applies");
            }
        }
    }
    next
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        6 => (0..INGRESSES, prop::option::weighted(0.85, 0u8..40)).prop_map(|(slot, shape)| Change::Ingress(slot, shape)),
        3 => (0..2usize, 0..SERVICES, 0u8..5, 0u8..3).prop_map(|(n, s, count, offset)| Change::Endpoints(n, s, count, offset)),
        1 => (0..2usize, 0..SERVICES, any::<bool>()).prop_map(|(n, s, renamed)| Change::RenamePort(n, s, renamed)),
        1 => (0..2usize, 0..SECRETS, any::<bool>()).prop_map(|(n, s, present)| Change::Secret(n, s, present)),
        1 => any::<bool>().prop_map(Change::DefaultCertificate),
        1 => any::<bool>().prop_map(Change::DefaultClass),
    ]
}

/// A world to start from: most Ingresses present, every Service with endpoints.
fn start() -> impl Strategy<Value = World> {
    (prop::array::uniform16(prop::option::weighted(0.8, 0u8..40)), any::<bool>()).prop_map(
        |(ingresses, default_certificate)| World {
            ingresses,
            endpoints: [[(2, 0); SERVICES]; 2],
            secrets: [[true, false, true]; 2],
            default_certificate,
            ..World::default()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    })]

    /// After every change of a random sequence, the renderer that reuses blocks gives what a
    /// renderer rendering every block afresh (from the same server slots) gives.
    #[test]
    fn an_incremental_render_equals_a_full_render(
        mut world in start(),
        changes in prop::collection::vec((change(), prop::bool::weighted(0.15)), 1..14),
    ) {
        let incremental = Renderer::compile(&config().spec).expect("the chart's configuration compiles");
        let mut current = stores(&world.objects(), None);
        let _ = incremental.render_leaving_out(&current, &[], 8);
        for (change, rebuilt) in &changes {
            world.apply(change);
            // Now and then every store anew (a re-list, or another renderer's stores): no
            // history links them to the blocks' lookups.
            current = stores(&world.objects(), (!rebuilt).then_some(&current));
            let full = Renderer::compile(&config().spec).expect("compiles");
            full.seed_slots(incremental.slots());
            // As the controller renders: an Ingress whose value is refused is left out.
            let reused = incremental.render_leaving_out(&current, &[], 8);
            let afresh = full.render_leaving_out(&current, &[], 8);
            match (reused, afresh) {
                (Ok(reused), Ok(afresh)) => {
                    let text = |errors: &[haptic::render::RenderError]| errors.iter().map(ToString::to_string).collect::<Vec<_>>();
                    prop_assert_eq!(text(&reused.left_out), text(&afresh.left_out), "left out after {:?}", change);
                    prop_assert_eq!(&reused.files.haproxy_cfg.content, &afresh.files.haproxy_cfg.content, "haproxy.cfg after {:?}", change);
                    prop_assert_eq!(reused.files, afresh.files, "files after {:?}", change);
                    prop_assert_eq!(&reused.slots, &afresh.slots, "server slots after {:?}", change);
                    prop_assert_eq!(incremental.slots(), reused.slots, "the slots kept are the render's, after {:?}", change);
                }
                (Err(reused), Err(afresh)) => prop_assert_eq!(reused.to_string(), afresh.to_string()),
                (reused, afresh) => prop_assert!(false, "after {:?}: reusing blocks {:?}, afresh {:?}", change, reused.err(), afresh.err()),
            }
        }
    }
}

/// Renders of `objects` by `config` as it is and by `config` keeping whole objects, with what
/// haptic itself reads of the Services (their `status.loadBalancer`: publishService's address).
fn rendered_kept_and_whole(config: &HAProxyTemplateConfig, objects: &[Json]) -> [String; 2] {
    let whole = synthetic::keeping_whole_objects(config);
    [config, &whole].map(|config| {
        let sourced: Vec<_> = objects.iter().map(|o| (PathBuf::from("served"), o.clone())).collect();
        let stores = haptic::offline::build_stores(&config.spec, &sourced).expect("stores build");
        let renderer = Renderer::compile(&config.spec).expect("the chart's configuration compiles");
        let balancers: Vec<Json> = stores["services"]
            .iter()
            .map(|service| serde_json::to_value(&service.value).expect("a value")["status"]["loadBalancer"].clone())
            .collect();
        match renderer.render_leaving_out(&stores, &[], 8) {
            Ok(render) => format!(
                "{:#?}\nleft out: {:?}\nload balancers: {balancers:?}",
                render.files,
                render.left_out.iter().map(ToString::to_string).collect::<Vec<_>>()
            ),
            Err(error) => format!("refused: {error}"),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    })]

    /// The chart's `fields` keep everything its library reads: objects as an API server serves
    /// them render the same whether their stores keep those fields or the whole objects.
    #[test]
    fn the_fields_the_chart_keeps_render_what_whole_objects_render(
        mut world in start(),
        changes in prop::collection::vec(change(), 0..8),
    ) {
        for change in &changes {
            world.apply(change);
        }
        prop_assume!(config().spec.watched_resources.values().any(|watched| !watched.fields.is_empty()));
        let objects = synthetic::served(world.objects());
        let [kept, whole] = rendered_kept_and_whole(config(), &objects);
        prop_assert_eq!(kept, whole);
    }
}

/// The same with the Gateway API on: HTTPRoutes to Services whose ports name protocols.
#[test]
fn the_fields_the_chart_keeps_serve_the_gateway_api_as_whole_objects_do() {
    let config =
        chart_config::chart_config_with(&["gatewayAPI.enabled=true"]).expect("the chart's configuration renders");
    let objects = synthetic::served(synthetic::httproute_fleet(30));
    let [kept, whole] = rendered_kept_and_whole(&config, &objects);
    assert!(kept.contains("backend"), "the routes are served: {kept}");
    assert_eq!(kept, whole);
}
