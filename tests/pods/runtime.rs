//! Issue #13, live: route, certificate and scale changes reach every pod through the Runtime
//! API without a reload, against the environment's real Dataplane API v3.2.7 and real HAProxy
//! 2.8 and 2.6 pods, with the real `haptic` binary and the chart's default library. Reloads
//! are counted from each pod's own HAProxy master; every change is checked by a request
//! through every pod (and a renewed certificate by the serial HAProxy serves).

use crate::env;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use env::controller::{ControllerProcess, every_pod_runs, every_pod_runs_next_render, rendered};
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, endpoint_slice, ingress_to, library_namespace,
    service_with_endpoints, start_backends,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
/// The Services routes move among, each a backend process answering with its name.
const SERVICES: [&str; 4] = ["s0", "s1", "s2", "s3"];
const SERVICE_PORT: u16 = 18900;
/// The Service that scales, and its endpoints' ports (the third comes and goes).
const WEB_PORTS: [u16; 3] = [18910, 18911, 18912];
/// Endpoints that take the web Service past its ten slots.
const GROWTH_PORTS: [u16; 9] = [18913, 18914, 18915, 18916, 18917, 18918, 18919, 18920, 18921];
/// The churned Ingresses, and the hosts and paths they take.
const CHURN: usize = 8;
const HOSTS: usize = 10;
const PATHS: [&str; 3] = ["/", "/a", "/b/c"];

/// A small deterministic generator (xorshift), so a failing sequence can be replayed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as usize
    }

    fn below(&mut self, n: usize) -> usize {
        self.next() % n
    }
}

/// A self-signed certificate for `host`: PEM certificate, PEM key, serial as openssl prints it.
fn certificate(dir: &Path, host: &str) -> Result<(String, String, String)> {
    let (cert, key) = env::fixtures::self_signed(dir, host, &["ec", "-pkeyopt", "ec_paramgen_curve:P-256"])?;
    let serial =
        Command::new("openssl").args(["x509", "-noout", "-serial", "-in"]).arg(dir.join("cert.pem")).output()?;
    let serial = String::from_utf8(serial.stdout)?.trim().trim_start_matches("serial=").to_owned();
    Ok((cert, key, serial))
}

/// The serial of the certificate a pod's HAProxy serves for `host`.
fn served_serial(pod: &env::EnvPod, host: &str) -> Result<String> {
    let script = format!(
        "openssl s_client -connect {}:8443 -servername {host} </dev/null 2>/dev/null | openssl x509 -noout -serial",
        pod.ip
    );
    let output = Command::new("sh").arg("-c").arg(script).output()?;
    Ok(String::from_utf8(output.stdout)?.trim().trim_start_matches("serial=").to_owned())
}

/// The file the library makes of a TLS Secret, and its checksum as the API shows it.
fn certificate_file_checksum(cert: &str, key: &str) -> String {
    let mut pem = cert.to_owned();
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem.push_str(key);
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    haptic::files::Checksum::of(pem.as_bytes()).to_string()
}

fn tls_secret(name: &str, cert: &str, key: &str) -> Result<Secret> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert, "tls.key": key}
    }))?)
}

fn route_ingress(name: &str, host: &str, path: &str, service: &str) -> Result<Ingress> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": [
            {"path": path, "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}
    }))?)
}

/// What a pod answers for `host` and `path`: `backend=<name>` or the status.
async fn answer(http: &reqwest::Client, pod: &env::EnvPod, host: &str, path: &str) -> String {
    match http.get(format!("http://{}{path}", pod.http_address)).header("Host", host).send().await {
        Ok(response) if response.status() == 200 => {
            let text = response.text().await.unwrap_or_default();
            text.split_whitespace().next().unwrap_or_default().to_owned()
        }
        Ok(response) => response.status().as_u16().to_string(),
        Err(error) => error.to_string(),
    }
}

/// The churned routes as the Ingress spec routes them: the longest matching prefix of the host.
fn expected(routes: &[Option<(String, String, String)>], host: &str, path: &str) -> String {
    routes
        .iter()
        .flatten()
        .filter(|(h, p, _)| h == host && (p == "/" || path == p || path.starts_with(&format!("{p}/"))))
        .max_by_key(|(_, p, _)| p.len())
        .map(|(_, _, service)| format!("backend={service}"))
        .unwrap_or_else(|| "404".into())
}

/// A streaming answer read as it comes: when its last chunk came, and how it ended.
struct Stream {
    last_chunk: Arc<Mutex<Instant>>,
    task: tokio::task::JoinHandle<String>,
}

fn open_stream(pod: &env::EnvPod, host: &str) -> Stream {
    let last_chunk = Arc::new(Mutex::new(Instant::now()));
    let seen = last_chunk.clone();
    let url = format!("http://{}/stream?seconds=3600", pod.http_address);
    let host = host.to_owned();
    let task = tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut response = match http.get(url).header("Host", host).send().await {
            Ok(response) => response,
            Err(error) => return format!("not opened: {error}"),
        };
        loop {
            match response.chunk().await {
                Ok(Some(_)) => *seen.lock().expect("not poisoned") = Instant::now(),
                Ok(None) => return "ended".into(),
                Err(error) => return format!("cut: {error}"),
            }
        }
    });
    Stream { last_chunk, task }
}

#[tokio::test]
async fn routes_certificates_and_scale_steps_in_random_order_reload_no_pod_and_are_served_everywhere() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "runtime").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let mut specs: Vec<(String, u16)> =
        SERVICES.iter().enumerate().map(|(i, name)| ((*name).to_owned(), SERVICE_PORT + i as u16)).collect();
    specs.extend(WEB_PORTS.iter().chain(&GROWTH_PORTS).map(|port| ("web".to_owned(), *port)));
    let _backends = start_backends(work.path(), &address, &specs)?;
    for (i, service) in SERVICES.iter().enumerate() {
        service_with_endpoints(&client, &namespace, service, &address, SERVICE_PORT + i as u16).await?;
    }
    service_with_endpoints(&client, &namespace, "web", &address, WEB_PORTS[0]).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let web_slice = |port: u16| endpoint_slice(&format!("web-{port}"), "web", &address, port);
    slices.create(&PostParams::default(), &web_slice(WEB_PORTS[1])?).await?;

    // Every Service keeps a route of its own (so it keeps its backend), three hosts have TLS.
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for service in SERVICES {
        ingresses
            .create(&PostParams::default(), &ingress_to(service, &format!("{service}.rt.example"), service)?)
            .await?;
    }
    ingresses.create(&PostParams::default(), &ingress_to("web", "web.rt.example", "web")?).await?;
    let tls_hosts: Vec<String> = (0..3).map(|i| format!("tls{i}.rt.example")).collect();
    let mut serials = Vec::new();
    for (i, host) in tls_hosts.iter().enumerate() {
        let (cert, key, serial) = certificate(work.path(), host)?;
        secrets.create(&PostParams::default(), &tls_secret(&format!("tls{i}"), &cert, &key)?).await?;
        serials.push(serial);
        let mut ingress = ingress_to(&format!("tls{i}"), host, SERVICES[i])?;
        ingress.spec.as_mut().context("spec")?.tls =
            Some(vec![serde_json::from_value(json!({"hosts": [host], "secretName": format!("tls{i}")}))?]);
        ingresses.create(&PostParams::default(), &ingress).await?;
    }
    apply_library_config_for_pods(&client, &namespace, "runtime").await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    let pods = env.pods.len();
    controller.wait_all_in_sync(pods, WITHIN).await?;
    for service in SERVICES {
        env::every_pod_answers(env, &format!("{service}.rt.example"), service, Duration::from_millis(100)).await?;
    }
    let mut render = rendered(&controller)?;
    every_pod_runs(&controller, pods, &render, WITHIN).await?;

    // A streaming answer through every pod, open across every change.
    let streams: Vec<(String, Stream)> =
        env.pods.iter().map(|pod| (pod.name.clone(), open_stream(pod, "s0.rt.example"))).collect();

    // Route changes, certificate renewals and in-slot scale steps in a random order: 30, 4 and
    // 4 in `make test`; the 100, 20 and 20 in `make soak`.
    let (route_changes, renewals, scale_steps) = if env::soak() { (100, 20, 20) } else { (30, 4, 4) };
    let changes = route_changes + renewals + scale_steps;
    let seed = std::env::var("HAPTIC_RUNTIME_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_1313_u64);
    let mut random = Random(seed);
    let mut ops: Vec<u8> = [vec![0u8; route_changes], vec![1u8; renewals], vec![2u8; scale_steps]].concat();
    for i in (1..ops.len()).rev() {
        ops.swap(i, random.below(i + 1));
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let mut routes: Vec<Option<(String, String, String)>> = vec![None; CHURN];
    let mut web_scaled = false;
    let before = {
        let mut writes = Vec::new();
        for pod in &env.pods {
            writes.push(env.writes(pod).await?);
        }
        writes
    };
    let started = Instant::now();
    for (step, op) in ops.iter().enumerate() {
        match op {
            0 => {
                // A route: created, moved to another Service or path, or removed.
                let slot = random.below(CHURN);
                let name = format!("r{slot}");
                let taken = |routes: &[Option<(String, String, String)>], host: &str, path: &str| {
                    routes.iter().flatten().any(|(h, p, _)| h == host && p == path)
                };
                let mut checks: Vec<(String, String)> = Vec::new();
                match routes[slot].clone() {
                    None => {
                        let (host, path) = loop {
                            let host = format!("h{}.rt.example", random.below(HOSTS));
                            let path = PATHS[random.below(PATHS.len())].to_owned();
                            if !taken(&routes, &host, &path) {
                                break (host, path);
                            }
                        };
                        let service = SERVICES[random.below(SERVICES.len())].to_owned();
                        ingresses
                            .create(&PostParams::default(), &route_ingress(&name, &host, &path, &service)?)
                            .await?;
                        checks.push((host.clone(), path.clone()));
                        routes[slot] = Some((host, path, service));
                    }
                    Some((host, path, service)) => match random.below(3) {
                        0 => {
                            let others: Vec<&str> = SERVICES.iter().copied().filter(|s| *s != service).collect();
                            let moved = others[random.below(others.len())].to_owned();
                            let patch = route_ingress(&name, &host, &path, &moved)?;
                            ingresses
                                .replace(&name, &PostParams::default(), &with_version(&ingresses, &name, patch).await?)
                                .await?;
                            checks.push((host.clone(), path.clone()));
                            routes[slot] = Some((host, path, moved));
                        }
                        1 => {
                            let free: Vec<&str> = PATHS.iter().copied().filter(|p| !taken(&routes, &host, p)).collect();
                            if free.is_empty() {
                                ingresses.delete(&name, &DeleteParams::default()).await?;
                                routes[slot] = None;
                            } else {
                                let new_path = free[random.below(free.len())].to_owned();
                                let patch = route_ingress(&name, &host, &new_path, &service)?;
                                ingresses
                                    .replace(
                                        &name,
                                        &PostParams::default(),
                                        &with_version(&ingresses, &name, patch).await?,
                                    )
                                    .await?;
                                checks.push((host.clone(), new_path.clone()));
                                routes[slot] = Some((host.clone(), new_path, service));
                            }
                            checks.push((host, path));
                        }
                        _ => {
                            ingresses.delete(&name, &DeleteParams::default()).await?;
                            routes[slot] = None;
                            checks.push((host, path));
                        }
                    },
                }
                render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
                for pod in &env.pods {
                    for (host, path) in &checks {
                        let got = answer(&http, pod, host, path).await;
                        let wanted = expected(&routes, host, path);
                        ensure!(
                            got == wanted,
                            "step {step}: {} answered {host}{path} with {got}, not {wanted}",
                            pod.name
                        );
                    }
                }
            }
            1 => {
                // A certificate renewed: the same Secret, a new certificate.
                let i = random.below(tls_hosts.len());
                let (cert, key, serial) = certificate(work.path(), &tls_hosts[i])?;
                let name = format!("tls{i}");
                secrets
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"stringData": {"tls.crt": cert, "tls.key": key}})),
                    )
                    .await?;
                let file = format!("certs/{namespace}_{name}.pem");
                let mut wanted = render.clone();
                wanted.insert(file, certificate_file_checksum(&cert, &key));
                every_pod_runs(&controller, pods, &wanted, WITHIN).await?;
                for pod in &env.pods {
                    let served = served_serial(pod, &tls_hosts[i])?;
                    ensure!(
                        served == serial,
                        "step {step}: {} serves {served} for {}, not {serial}",
                        pod.name,
                        tls_hosts[i]
                    );
                }
                serials[i] = serial;
            }
            _ => {
                // The web Service scales within its backend's slots.
                if web_scaled {
                    slices.delete(&format!("web-{}", WEB_PORTS[2]), &DeleteParams::default()).await?;
                } else {
                    slices.create(&PostParams::default(), &web_slice(WEB_PORTS[2])?).await?;
                }
                web_scaled = !web_scaled;
                render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
                for pod in &env.pods {
                    let got = answer(&http, pod, "web.rt.example", "/").await;
                    ensure!(got == "backend=web", "step {step}: {} answered web.rt.example with {got}", pod.name);
                }
            }
        }
    }
    // The web Service grows past its backend's slots (the chart adds one at a time where
    // HAProxy can add it at run time): nine more servers, added to the running backends as
    // dynamic servers, in traffic, no reload.
    for port in GROWTH_PORTS {
        slices.create(&PostParams::default(), &web_slice(port)?).await?;
    }
    render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    let config = std::fs::read_to_string(controller.render_dir.join("haproxy.cfg"))?;
    let web_ports = WEB_PORTS[..2].iter().chain(WEB_PORTS[2..].iter().filter(|_| web_scaled)).chain(&GROWTH_PORTS);
    for port in web_ports {
        ensure!(
            config.contains(&format!(" {address}:{port}\n")),
            "the web backend has no server for port {port}:\n{config}"
        );
    }
    for pod in &env.pods {
        let got = answer(&http, pod, "web.rt.example", "/").await;
        ensure!(got == "backend=web", "{} answered web.rt.example with {got} after the growth", pod.name);
    }
    let elapsed = started.elapsed();
    let mut after = Vec::new();
    for pod in &env.pods {
        after.push(env.writes(pod).await?);
    }
    let metrics = reqwest::get(format!("{}/metrics", controller.api_url().await?)).await?.text().await?;
    let reasons: Vec<&str> = metrics.lines().filter(|l| l.starts_with("haptic_reloads_total")).collect();
    for ((pod, before), after) in env.pods.iter().zip(&before).zip(&after) {
        let reloads = after.reloads - before.reloads;
        println!("{}: {reloads} reloads over {changes} changes and a growth past the slots in {elapsed:.1?}", pod.name);
        ensure!(
            reloads == 0,
            "{}: {reloads} reloads over {route_changes} route changes, {renewals} renewals and {scale_steps} scale steps; by reason:\n{}\n{}",
            pod.name,
            reasons.join("\n"),
            controller.log_tail()
        );
    }
    for (name, stream) in &streams {
        ensure!(!stream.task.is_finished(), "{name}: the streaming answer ended during the changes");
        let quiet = stream.last_chunk.lock().expect("not poisoned").elapsed();
        ensure!(quiet < Duration::from_secs(2), "{name}: the streaming answer has been silent for {quiet:?}");
    }
    let metrics = reqwest::get(format!("{}/metrics", controller.api_url().await?)).await?.text().await?;
    for kind in ["map-add", "map-set", "map-delete", "certificate", "server-state", "server-add", "server-replace"] {
        let count = env::measure::metric_sum(&metrics, &format!("haptic_runtime_actions_total{{kind=\"{kind}\"}}"));
        ensure!(count > 0.0, "no runtime action of kind {kind} counted");
    }

    // A runtime action that fails (its map entry deleted by hand in between) falls back to a
    // full sync on that pod alone, which ends InSync and serves the change.
    let (host, service) = ("fallback.rt.example", "s0");
    ingresses.create(&PostParams::default(), &route_ingress("fallback", host, "/", service)?).await?;
    render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    let victim = &env.pods[0];
    env.dataplane(victim).delete_runtime_map_entry("host-prefix.map", &format!("{host}/")).await?;
    let before = env.writes(victim).await?;
    let patch = route_ingress("fallback", host, "/", "s1")?;
    ingresses.replace("fallback", &PostParams::default(), &with_version(&ingresses, "fallback", patch).await?).await?;
    every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    let after = env.writes(victim).await?;
    ensure!(
        after.reloads == before.reloads + 1,
        "{}: the fallback was not one reload: {before:?} → {after:?}",
        victim.name
    );
    for pod in &env.pods {
        let got = answer(&http, pod, host, "/").await;
        ensure!(got == "backend=s1", "{} answered {host} with {got} after the fallback", pod.name);
    }
    let metrics = reqwest::get(format!("{}/metrics", controller.api_url().await?)).await?.text().await?;
    ensure!(
        env::measure::declared_metric_sum(&metrics, "haptic_reloads_total{reason=\"retry\"}")? >= 1.0,
        "the fallback's reload is not counted as a retry:\n{}",
        metrics.lines().filter(|l| l.starts_with("haptic_reloads")).collect::<Vec<_>>().join("\n")
    );
    for (_, stream) in streams {
        stream.task.abort();
    }
    Ok(())
}

/// `object` with the stored one's resource version, for a replace.
async fn with_version(api: &Api<Ingress>, name: &str, mut object: Ingress) -> Result<Ingress> {
    object.metadata.resource_version = api.get(name).await?.metadata.resource_version;
    Ok(object)
}

#[tokio::test]
async fn a_burst_of_fifty_ingresses_to_new_services_reloads_each_pod_at_most_once_per_pace() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "newsvc").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("blue".into(), 18920)])?;
    service_with_endpoints(&client, &namespace, "blue", &address, 18920).await?;
    for i in 0..50 {
        service_with_endpoints(&client, &namespace, &format!("n{i}"), &address, 18920).await?;
    }
    apply_library_config_for_pods(&client, &namespace, "newsvc").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("first", "first.newsvc.example", "blue")?).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    let pods = env.pods.len();
    controller.wait_all_in_sync(pods, WITHIN).await?;
    env::every_pod_answers(env, "first.newsvc.example", "blue", Duration::from_millis(100)).await?;

    // 50 Ingresses, each to a Service without a backend (each a new backend: a reload), as fast
    // as the API server takes them.
    let mut before = Vec::new();
    for pod in &env.pods {
        before.push(env.writes(pod).await?);
    }
    let started = Instant::now();
    for i in 0..50 {
        let host = format!("n{i}.newsvc.example");
        ingresses.create(&PostParams::default(), &ingress_to(&format!("n{i}"), &host, &format!("n{i}"))?).await?;
    }
    let created = started.elapsed();
    let deadline = Instant::now() + WITHIN;
    loop {
        let config = controller.file("haproxy.cfg");
        if (0..50).all(|i| config.contains(&format!("_n{i}_80\n"))) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the 50 backends were not rendered within {WITHIN:?}\n{}", controller.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let render = rendered(&controller)?;
    every_pod_runs(&controller, pods, &render, WITHIN).await?;
    let settled = started.elapsed();
    for i in 0..50 {
        env::every_pod_answers(env, &format!("n{i}.newsvc.example"), "blue", Duration::from_millis(100)).await?;
    }
    let pace = Duration::from_secs(2);
    let allowed = 1 + (settled.as_secs_f64() / pace.as_secs_f64()).floor() as u64;
    for (pod, before) in env.pods.iter().zip(&before) {
        let after = env.writes(pod).await?;
        let reloads = after.reloads - before.reloads;
        println!(
            "{}: {reloads} reloads for 50 Ingresses to new Services (created in {created:.1?}, all served in {settled:.1?})",
            pod.name
        );
        ensure!(
            (1..=allowed).contains(&reloads),
            "{}: {reloads} reloads in {settled:.1?}: more than one per {pace:?}",
            pod.name
        );
    }
    Ok(())
}
