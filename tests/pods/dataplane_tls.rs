//! TLS to the Dataplane API (issue #12): the environment's `haproxy-tls` pod serves its
//! Dataplane API over https (Basic auth as usual) and `haproxy-mtls` also requires a client
//! certificate; the real `haptic` binary deploys to them with the CA, client certificate and
//! server name of `spec.dataplane.tls`, and says which pod and why when it cannot.

use crate::env;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch, deployment_namespace_with, own_template};
use env::{EnvPod, Manifest};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);

fn tls_pod<'a>(env: &'a Manifest, name: &str) -> &'a EnvPod {
    env.tls_pods.iter().find(|pod| pod.name == name).unwrap_or_else(|| panic!("env.json has no TLS pod {name}"))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// A namespace holding `pods`, the credentials Secret, a TLS Secret with `tls_data` and the
/// configuration `test` reaching pods with it.
async fn tls_namespace(
    env: &Manifest,
    test: &str,
    pods: &[EnvPod],
    tls_data: serde_json::Value,
    tag: &str,
) -> Result<(kube::Client, String)> {
    let server_name = pods[0].tls.as_ref().context("a TLS pod")?.server_name.clone();
    let dataplane = json!({"driftPreventionInterval": "60s",
                           "tls": {"secretRef": {"name": "dataplane-tls"}, "serverName": server_name}});
    let templates = json!({"haproxyConfig": own_template(env, tag, ""), "maps": {"tag.map": format!("{tag} 1\n")}});
    let (client, namespace) = deployment_namespace_with(env, test, pods, dataplane, templates).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = serde_json::from_value(json!({"metadata": {"name": "dataplane-tls"}, "stringData": tls_data}))?;
    secrets.create(&PostParams::default(), &secret).await?;
    Ok((client, namespace))
}

fn launch(env: &Manifest, namespace: &str, journal_dir: &Path) -> Result<ControllerProcess> {
    let dir = tempfile::tempdir()?;
    ControllerProcess::launch(env, namespace, "test", dir, journal_dir, &Launch::traced(env, "haptic-tls-test"))
}

/// Every file below `dir`, as bytes (the journal is binary).
fn all_bytes_below(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push((path.display().to_string(), std::fs::read(&path)?));
            }
        }
    }
    Ok(found)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}

#[tokio::test]
async fn tls_pods_deploy_and_the_password_and_keys_appear_in_no_log_trace_event_journal_or_answer() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let pods: Vec<EnvPod> = ["haproxy-tls", "haproxy-mtls"].iter().map(|name| tls_pod(env, name).clone()).collect();
    let tls = pods[0].tls.clone().context("TLS pod")?;
    let client_key = read(&tls.client_key)?;
    let tag = format!("tls-{}", std::process::id());
    let (client, namespace) = tls_namespace(
        env,
        "tls-deploys",
        &pods,
        json!({"ca.crt": read(&tls.ca_crt)?, "tls.crt": read(&tls.client_crt)?, "tls.key": client_key}),
        &tag,
    )
    .await?;
    let journal = tempfile::tempdir()?;
    let controller = launch(env, &namespace, journal.path())?;
    let views = controller.wait_all_in_sync(pods.len(), WITHIN).await?;
    for pod in &pods {
        let config = read(&pod.config_file)?;
        ensure!(config.contains(&format!("# test {tag}")), "{}: not deployed over TLS:\n{config}", pod.name);
        let map = read(&pod.dir.join("maps/tag.map"))?;
        ensure!(map == format!("{tag} 1\n"), "{}: map {map:?}", pod.name);
    }

    // What must never be shown: the password, and the client key (each line of its body).
    let mut secrets = vec![("the Dataplane password", env.dataplane.password.clone())];
    for line in client_key.lines().filter(|line| !line.starts_with("-----") && line.len() >= 16) {
        secrets.push(("the client key", line.to_owned()));
    }
    let api = controller.api_url().await?;
    let http = reqwest::Client::new();
    let mut answers = vec![("views of the pods".to_owned(), serde_json::to_vec(&views)?)];
    for path in ["/api/v1/pods", "/api/v1/config", "/api/v1/config/files/haproxy.cfg", "/metrics"] {
        let body = http.get(format!("{api}{path}")).send().await?.bytes().await?;
        answers.push((format!("API answer {path}"), body.to_vec()));
    }
    for pod in &pods {
        let path = format!("/api/v1/pods/{namespace}/{}", pod.name);
        let body = http.get(format!("{api}{path}")).send().await?.bytes().await?;
        answers.push((format!("API answer {path}"), body.to_vec()));
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    answers.push(("Events".into(), serde_json::to_vec(&events.list(&Default::default()).await?.items)?));
    answers.push(("the controller's log".into(), controller.log_text().into_bytes()));
    // Every trace the collector received so far, from this test's controller and all others.
    answers.push(("traces".into(), std::fs::read(&env.otlp.traces_file).unwrap_or_default()));
    answers.extend(all_bytes_below(journal.path())?);
    answers.extend(all_bytes_below(&controller.render_dir)?);
    let mut leaks = Vec::new();
    for (place, bytes) in &answers {
        for (what, secret) in &secrets {
            if contains(bytes, secret) {
                leaks.push(format!("{what} in {place}"));
            }
        }
    }
    ensure!(leaks.is_empty(), "secrets shown: {leaks:?}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_ca_fails_with_an_error_naming_the_pod_and_writes_nothing() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let pod = tls_pod(env, "haproxy-tls").clone();
    let before = env.writes(&pod).await?;
    // A real CA, but not the one that signed the pod's certificate: the API server's.
    let wrong_ca = read(&env.kubeconfig.parent().context("kubeconfig dir")?.join("pki/ca.crt"))?;
    let tag = format!("wrong-ca-{}", std::process::id());
    let (_, namespace) =
        tls_namespace(env, "tls-wrong-ca", std::slice::from_ref(&pod), json!({"ca.crt": wrong_ca}), &tag).await?;
    let journal = tempfile::tempdir()?;
    let controller = launch(env, &namespace, journal.path())?;
    let views = controller
        .wait_for_pods("the pod's certificate refused", 1, WITHIN, |view| {
            view["lastError"].as_str().is_some_and(|error| error.contains("invalid peer certificate"))
        })
        .await?;
    let error = views[0]["lastError"].as_str().unwrap_or_default();
    ensure!(error.contains(&pod.ip) && error.contains("UnknownIssuer"), "names the pod and the reason: {error}");
    ensure!(views[0]["name"] == pod.name.as_str(), "{views:?}");
    let log = controller.log_text();
    ensure!(
        log.lines().any(|line| line.contains("UnknownIssuer") && line.contains(&pod.name)),
        "the log names the pod and the reason:\n{}",
        controller.log_tail()
    );
    ensure!(env.writes(&pod).await? == before, "a pod whose certificate was refused was written to");
    Ok(())
}

#[tokio::test]
async fn a_pod_requiring_a_client_certificate_says_so_when_none_is_given_and_the_others_deploy() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let pods: Vec<EnvPod> = ["haproxy-tls", "haproxy-mtls"].iter().map(|name| tls_pod(env, name).clone()).collect();
    let tls = pods[0].tls.clone().context("TLS pod")?;
    let tag = format!("no-client-cert-{}", std::process::id());
    let (_, namespace) =
        tls_namespace(env, "tls-no-client-cert", &pods, json!({"ca.crt": read(&tls.ca_crt)?}), &tag).await?;
    let journal = tempfile::tempdir()?;
    let controller = launch(env, &namespace, journal.path())?;
    let views = controller
        .wait_for_pods("haproxy-tls InSync, haproxy-mtls refusing", 2, WITHIN, |view| match view["name"].as_str() {
            Some("haproxy-tls") => view["state"] == "InSync",
            _ => view["lastError"].as_str().is_some_and(|error| error.contains("client certificate")),
        })
        .await?;
    let refused = views.iter().find(|view| view["name"] == "haproxy-mtls").context("haproxy-mtls")?;
    let error = refused["lastError"].as_str().unwrap_or_default();
    ensure!(error.contains(&pods[1].ip) && error.contains("tls.crt"), "names the pod and the fix: {error}");
    ensure!(read(&pods[0].config_file)?.contains(&format!("# test {tag}")), "haproxy-tls deployed");
    Ok(())
}

#[test]
fn haptic_probe_speaks_tls_with_a_ca_a_client_certificate_and_a_server_name_and_names_a_wrong_ca() -> Result<()> {
    let env = env::environment();
    let probe = |pod: &EnvPod, ca: &Path, client: bool| -> Result<std::process::Output> {
        let tls = pod.tls.as_ref().context("a TLS pod")?;
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_haptic"));
        command
            .args(["probe", &pod.dataplane_url, "--username", &env.dataplane.username, "--ca-file"])
            .arg(ca)
            .args(["--server-name", &tls.server_name])
            .env("HAPTIC_DATAPLANE_PASSWORD", &env.dataplane.password);
        if client {
            command.arg("--client-cert").arg(&tls.client_crt).arg("--client-key").arg(&tls.client_key);
        }
        Ok(command.output()?)
    };
    for name in ["haproxy-tls", "haproxy-mtls"] {
        let pod = tls_pod(env, name);
        let ca = pod.tls.as_ref().context("a TLS pod")?.ca_crt.clone();
        let answered = probe(pod, &ca, true)?;
        let stdout = String::from_utf8_lossy(&answered.stdout);
        ensure!(answered.status.success() && stdout.contains("dataplane_api: v3.2.7"), "{name}: {stdout}");
    }
    let pod = tls_pod(env, "haproxy-tls");
    let wrong_ca = env.kubeconfig.parent().context("kubeconfig dir")?.join("pki/ca.crt");
    let refused = probe(pod, &wrong_ca, false)?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(!refused.status.success() && stderr.contains("UnknownIssuer") && stderr.contains(&pod.ip), "{stderr}");
    ensure!(!stderr.contains(&env.dataplane.password), "the password reached the error");
    Ok(())
}
