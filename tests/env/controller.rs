//! Test support for running the real `haptic` binary against the environment's API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use haptic::config::HAProxyTemplateConfig;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::Manifest;

/// Creates a CRD (if absent) and waits until the API server serves it.
pub async fn ensure_crd(client: &kube::Client, crd: CustomResourceDefinition) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().context("CRD name")?;
    // Server-side apply, so a CRD left by an older build of the tests is brought up to date.
    crds.patch(&name, &PatchParams::apply("haptic-tests").force(), &Patch::Apply(&crd))
        .await
        .with_context(|| format!("applying CRD {name}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = crds.get(&name).await?;
        let established = current
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRD {name} not established within 30s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the HAProxyTemplateConfig `test` in `namespace` with this `spec`.
pub async fn create_test_config(
    client: &kube::Client,
    namespace: &str,
    spec: serde_json::Value,
) -> Result<Api<HAProxyTemplateConfig>> {
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), namespace);
    let config: HAProxyTemplateConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyTemplateConfig",
        "metadata": {"name": "test", "namespace": namespace},
        "spec": spec
    }))?;
    configs.create(&kube::api::PostParams::default(), &config).await.context("creating the test configuration")?;
    Ok(configs)
}

/// A namespace of its own with no pod and the configuration `test` watching the namespace's
/// Ingresses with the pod selector of the environment, `spec`'s fields added over that.
#[allow(dead_code)]
pub async fn ingress_test_namespace(
    env: &Manifest,
    test: &str,
    spec: serde_json::Value,
) -> Result<(kube::Client, String, Api<HAProxyTemplateConfig>)> {
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace_with(&client, test, &[]).await?;
    let mut full = serde_json::json!({
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
        "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                           "namespaces": [namespace]}}
    });
    if let (Some(full), serde_json::Value::Object(extra)) = (full.as_object_mut(), spec) {
        full.extend(extra);
    }
    let configs = create_test_config(&client, &namespace, full).await?;
    Ok((client, namespace, configs))
}

/// A namespace of its own for a deployment test: the environment's pods registered in it, the
/// Dataplane credentials Secret `dataplane`, and the configuration `test` rendering `template`
/// from the namespace's Ingresses, drift checked every `drift`.
pub async fn deployment_test_namespace(
    env: &Manifest,
    test: &str,
    template: &str,
    drift: &str,
) -> Result<(kube::Client, String)> {
    let dataplane = serde_json::json!({"driftPreventionInterval": drift});
    deployment_namespace_with(env, test, &env.pods, dataplane, serde_json::json!({"haproxyConfig": template})).await
}

/// A namespace of its own for a deployment test on `pods`: the Dataplane credentials Secret
/// `dataplane`, and the configuration `test` watching the namespace's Ingresses, with these
/// `dataplane` settings (beside the credentials) and `templates`.
pub async fn deployment_namespace_with(
    env: &Manifest,
    test: &str,
    pods: &[super::EnvPod],
    dataplane: serde_json::Value,
    templates: serde_json::Value,
) -> Result<(kube::Client, String)> {
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace_with(&client, test, pods).await?;
    super::fixtures::dataplane_secret(&client, &namespace, &env.dataplane.username, &env.dataplane.password).await?;
    let mut dataplane = dataplane;
    dataplane["credentialsSecretRef"] = serde_json::json!({"name": "dataplane"});
    create_test_config(
        &client,
        &namespace,
        serde_json::json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                               "namespaces": [namespace]}},
            "dataplane": dataplane,
            "templates": templates
        }),
    )
    .await?;
    Ok((client, namespace))
}

/// A configuration routing to backend-0 that is `tag`'s own (pods already running a render are
/// adopted without a push, and deployment tests count pushes), with `extra` sections and one
/// backend section per Ingress: a change only a reload applies (a comment alone is written
/// without one).
pub fn own_template(env: &Manifest, tag: &str, extra: &str) -> String {
    format!(
        "# test {tag}\n{}{extra}{{% for i in resources.ingresses.list() %}}backend ingress_{{{{ i.metadata.name | bare_word }}}}\n{{% endfor %}}",
        super::config_routing_to(&env.backends[0])
    )
}

/// Installs haptic's own CRD.
pub async fn ensure_haptic_crd(client: &kube::Client) -> Result<()> {
    ensure_crd(client, HAProxyTemplateConfig::crd()).await
}

/// Extra environment and arguments for a controller process.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// Arguments after the usual ones.
    pub args: Vec<String>,
    /// A kubeconfig other than the environment's (one through a proxy, say).
    pub kubeconfig: Option<PathBuf>,
}

impl Launch {
    /// A replica `identity` electing a leader on the Lease `lease`, with a short lease (6 s, 2 s
    /// of grace) so a test sees a takeover quickly.
    #[allow(dead_code)]
    pub fn elected(lease: &str, identity: &str) -> Self {
        let args = ["--leader-election-lease", lease, "--leader-election-identity", identity].into_iter().chain([
            "--lease-duration-seconds",
            "6",
            "--lease-grace-seconds",
            "2",
        ]);
        Self { args: args.map(String::from).collect(), ..Self::default() }
    }

    /// Trace export to the environment's OpenTelemetry Collector, as `service`, flushed every
    /// 100 ms so a test need not wait for the default 5 s batches.
    pub fn traced(env: &Manifest, service: &str) -> Self {
        Self {
            env: vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), env.otlp.http_endpoint.clone()),
                ("OTEL_SERVICE_NAME".into(), service.to_owned()),
                ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
            ],
            ..Self::default()
        }
    }

    /// The environment's validator (an HAProxy and its Dataplane API, as the chart runs beside
    /// the controller) checking renders and running validation tests' requests, with `args`.
    #[allow(dead_code)]
    pub fn validated(env: &Manifest, args: &[&str]) -> Self {
        let validator = &env.validator;
        let mut all = vec!["--validation-dataplane".to_owned(), validator.dataplane_url.clone()];
        all.extend(args.iter().map(|arg| (*arg).to_owned()));
        Self {
            args: all,
            env: vec![
                ("HAPTIC_VALIDATION_DATAPLANE_USERNAME".into(), validator.username.clone()),
                ("HAPTIC_VALIDATION_DATAPLANE_PASSWORD".into(), validator.password.clone()),
            ],
            ..Self::default()
        }
    }
}

/// A running `haptic run`, stopped when dropped.
pub struct ControllerProcess {
    child: Child,
    /// Where renders are written (`renders.log`, `haproxy.cfg`, ...).
    pub render_dir: PathBuf,
    /// The controller's log.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ControllerProcess {
    /// Starts the controller on the configuration `namespace/name`, with a journal of its own.
    pub fn start(env: &Manifest, namespace: &str, name: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let journal = dir.path().join("journal");
        Self::start_in(env, namespace, name, dir, &journal)
    }

    /// Starts the controller with the journal at `journal` (to restart on the same journal).
    pub fn start_in(
        env: &Manifest,
        namespace: &str,
        name: &str,
        dir: tempfile::TempDir,
        journal: &Path,
    ) -> Result<Self> {
        Self::launch(env, namespace, name, dir, journal, &Launch::default())
    }

    /// Starts the controller with extra environment variables and arguments.
    pub fn launch(
        env: &Manifest,
        namespace: &str,
        name: &str,
        dir: tempfile::TempDir,
        journal: &Path,
        extra: &Launch,
    ) -> Result<Self> {
        let render_dir = dir.path().join("renders");
        let log = dir.path().join(format!("haptic-{}.log", std::process::id()));
        // `HAPTIC_WRAP="heaptrack -o /tmp/haptic"` (say) runs the controller under a profiler;
        // its pid is then the wrapper's, so RSS figures read from /proc are the wrapper's too.
        let wrap = std::env::var("HAPTIC_WRAP").unwrap_or_default();
        let mut wrap = wrap.split_whitespace();
        let mut command = match wrap.next() {
            Some(program) => {
                let mut command = Command::new(program);
                command.args(wrap).arg(env!("CARGO_BIN_EXE_haptic"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_haptic")),
        };
        let child = command
            .args(["run", "--config-namespace", namespace, "--config-name", name, "--render-dir"])
            .arg(&render_dir)
            .arg("--journal-dir")
            .arg(journal)
            .args(["--api-address", "127.0.0.1:0", "--health-address", "127.0.0.1:0"])
            .args(&extra.args)
            .env("KUBECONFIG", extra.kubeconfig.as_ref().unwrap_or(&env.kubeconfig))
            .env("RUST_LOG", "info,haptic=debug")
            // Tests read the API without a token and over http; `tests/cluster/api.rs` turns
            // authentication and TLS back on.
            .env("HAPTIC_API_AUTH", "none")
            .env("HAPTIC_API_PLAINTEXT", "true")
            .envs(extra.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting haptic run")?;
        Ok(Self { child, render_dir, log, _dir: dir })
    }

    /// Starts the controller on the chart's configuration (`haptic`) with its journal at `journal`.
    pub fn launch_library(env: &Manifest, namespace: &str, journal: &Path) -> Result<Self> {
        Self::launch(env, namespace, "haptic", tempfile::tempdir()?, journal, &Launch::default())
    }

    /// The process id (its memory and CPU time are read from /proc).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every render so far, as recorded in `renders.log`.
    pub fn renders(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.render_dir.join("renders.log")).unwrap_or_default();
        text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    /// A rendered file's current content.
    pub fn file(&self, relative: &str) -> String {
        std::fs::read_to_string(self.render_dir.join(relative)).unwrap_or_default()
    }

    /// Waits until `done` holds for the current `haproxy.cfg`; fails with the log's tail.
    pub async fn wait_for_config(&self, what: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if done(&self.file("haproxy.cfg")) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "{what}: not rendered within {timeout:?}\n--- haproxy.cfg ---\n{}\n--- log ---\n{}",
            self.file("haproxy.cfg"),
            self.log_tail()
        )
    }

    /// The last lines of the controller's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The controller's whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The HTTP API's base URL, once the controller has logged where it listens.
    pub async fn api_url(&self) -> Result<String> {
        self.listening_url("HTTP API listening").await
    }

    /// The base URL of the health port (`/healthz`, `/readyz`), read from the log.
    pub async fn health_url(&self) -> Result<String> {
        self.listening_url("health listening").await
    }

    /// The `host:port` the controller said it listens on in the log line `message`.
    #[allow(dead_code)]
    pub async fn listening_address(&self, message: &str) -> Result<String> {
        Ok(self.listening_url(message).await?.trim_start_matches("http://").to_owned())
    }

    async fn listening_url(&self, message: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let log = self.log_text();
            if let Some(line) = log.lines().find(|line| line.contains(message)) {
                let address = line
                    .split("address=")
                    .nth(1)
                    .context("address field")?
                    .split_whitespace()
                    .next()
                    .unwrap_or_default();
                let scheme =
                    if line.contains("scheme=https") || line.contains("scheme=\"https\"") { "https" } else { "http" };
                return Ok(format!("{scheme}://{address}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the controller never said {message:?}:\n{}", self.log_tail())
    }

    /// The path of the log, for messages.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The pods as the HTTP API shows them (`/api/v1/pods`).
    pub async fn pods_view(&self) -> Result<Vec<serde_json::Value>> {
        let api = self.api_url().await?;
        let answer: serde_json::Value = reqwest::get(format!("{api}/api/v1/pods")).await?.json().await?;
        Ok(answer["pods"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until the API shows `count` pods, each satisfying `done`; fails with what it shows.
    pub async fn wait_for_pods(
        &self,
        what: &str,
        count: usize,
        within: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<Vec<serde_json::Value>> {
        let deadline = Instant::now() + within;
        loop {
            let pods = self.pods_view().await?;
            if pods.len() == count && pods.iter().all(&done) {
                return Ok(pods);
            }
            if Instant::now() > deadline {
                bail!("{what}: not within {within:?}: {pods:#?}\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the API shows `count` pods, all InSync.
    pub async fn wait_all_in_sync(&self, count: usize, within: Duration) -> Result<Vec<serde_json::Value>> {
        self.wait_for_pods("every pod InSync", count, within, |pod| pod["state"] == "InSync").await
    }
}

impl ControllerProcess {
    /// Stops the controller as Kubernetes would (SIGTERM), waits for it to exit (killing it
    /// after `grace`), and says whether it exited on its own and with success.
    /// (Async: the test's own runtime, and any proxy on it, must keep running meanwhile.)
    pub async fn terminate(&mut self, grace: Duration) -> bool {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    /// Kills the controller (SIGKILL) and hands back its directory, e.g. to restart on it.
    pub fn kill(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let placeholder = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self._dir, placeholder)
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The checksums of the controller's latest render (configuration, maps, general files), by the
/// names the API's `pushedChecksums` use. The controller rewrites its render directory file by
/// file (each through a `.tmp` file and a rename) on every render, so a directory read while it
/// writes may mix two renders or list a `.tmp` file: only two equal reads in a row count.
pub fn rendered(controller: &ControllerProcess) -> Result<BTreeMap<String, String>> {
    let mut last = read_render_dir(controller)?;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let again = read_render_dir(controller)?;
        if again == last {
            return Ok(again);
        }
        last = again;
    }
}

fn read_render_dir(controller: &ControllerProcess) -> Result<BTreeMap<String, String>> {
    let files = haptic::offline::load_render_dir(&controller.render_dir)?;
    Ok(files.entries().map(|(name, file)| (name, file.checksum.to_string())).collect())
}

/// Waits for a render other than `previous`, then for every pod to run it, InSync.
pub async fn every_pod_runs_next_render(
    controller: &ControllerProcess,
    pods: usize,
    previous: &BTreeMap<String, String>,
    within: Duration,
) -> Result<BTreeMap<String, String>> {
    let deadline = Instant::now() + within;
    let render = loop {
        let render = rendered(controller)?;
        if render != *previous {
            break render;
        }
        ensure!(Instant::now() < deadline, "no new render within {within:?}\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    every_pod_runs(controller, pods, &render, within).await?;
    Ok(render)
}

/// Waits for every pod to run exactly `files`, InSync.
pub async fn every_pod_runs(
    controller: &ControllerProcess,
    pods: usize,
    files: &BTreeMap<String, String>,
    within: Duration,
) -> Result<()> {
    controller
        .wait_for_pods("every pod running the render", pods, within, |pod| {
            let pushed: BTreeMap<String, String> = pod["pushedChecksums"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| Some((f["name"].as_str()?.to_owned(), f["checksum"].as_str()?.to_owned())))
                .collect();
            pod["state"] == "InSync" && files.iter().all(|(name, sum)| pushed.get(name) == Some(sum))
        })
        .await?;
    Ok(())
}
