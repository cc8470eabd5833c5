//! Test support: the local environment of real components, as Rust integration tests see it.
//!
//! The environment is started by `tests/env/envctl.py` (through `make test`, or on first use
//! here when it is not running) and described in `<state dir>/env.json`. Each test gets a
//! fresh namespace in which the environment's HAProxy pods are registered as Ready Pods,
//! because the API server has no controller manager to clean namespaces up between tests.

#![allow(dead_code)] // Each test binary uses a different part of this module.

pub mod chart;
pub mod controller;
pub mod fixtures;
pub mod gateway;
pub mod h2c;
pub mod measure;
pub mod otlp;
pub mod proxy;
pub mod standalone;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use std::io::{Read, Write};

use anyhow::{Context, Result, bail, ensure};
use haptic::dataplane::{Access, Credentials, DataplaneClient, Endpoint, TlsSettings};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Deserialize;

/// The environment description written by `envctl.py up`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// Where the environment keeps its files.
    pub state_dir: PathBuf,
    /// The admin kubeconfig of the API server.
    pub kubeconfig: PathBuf,
    /// The namespace the simulated pods are registered in.
    pub namespace: String,
    /// Dataplane API port and credentials, the same on every pod.
    pub dataplane: DataplaneAccess,
    /// The simulated HAProxy pods.
    pub pods: Vec<EnvPod>,
    /// Pods whose Dataplane API speaks TLS (`haproxy-tls`; `haproxy-mtls` also requires a client
    /// certificate), registered only by the tests that use them.
    pub tls_pods: Vec<EnvPod>,
    /// The controller pod's `validator` container: a Dataplane API with no HAProxy running,
    /// which the admission webhook has check its renders.
    pub validator: Validator,
    /// The HTTP backends.
    pub backends: Vec<Backend>,
    /// The host of the environment's own that backends named in EndpointSlices run on.
    pub backend_host: BackendHost,
    /// The OpenTelemetry Collector.
    pub otlp: Otlp,
    /// Tools built with the environment.
    pub tools: Tools,
}

/// A network namespace of the environment's own, joined to the machine by a veth pair: a
/// host with a non-loopback address (198.18.N.2) that is neither the machine's nor routed
/// anywhere else.
#[derive(Debug, Clone, Deserialize)]
pub struct BackendHost {
    /// The network namespace (`ip netns exec <namespace> ...`).
    pub namespace: String,
    /// Its address, reachable from the machine.
    pub address: String,
}

/// Command-line tools the environment built.
#[derive(Debug, Clone, Deserialize)]
pub struct Tools {
    /// Helm v3, built from its Go module.
    pub helm: PathBuf,
}

/// The environment's OpenTelemetry Collector: where to send OTLP and where it writes.
#[derive(Debug, Clone, Deserialize)]
pub struct Otlp {
    /// The OTLP/HTTP endpoint, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub http_endpoint: String,
    /// Every batch received, one OTLP JSON document a line.
    pub traces_file: PathBuf,
}

/// The validator's Dataplane API and its own user.
#[derive(Debug, Clone, Deserialize)]
pub struct Validator {
    /// Its base URL.
    pub dataplane_url: String,
    /// Its user.
    pub username: String,
    /// Its password.
    pub password: String,
    /// Its directory (storage below `run/`, its log).
    pub dir: PathBuf,
}

/// Dataplane API access shared by all pods.
#[derive(Debug, Clone, Deserialize)]
pub struct DataplaneAccess {
    /// The port every Dataplane API listens on.
    pub port: u16,
    /// The user.
    pub username: String,
    /// The password.
    pub password: String,
}

/// One simulated HAProxy pod: a real HAProxy and a real Dataplane API on one loopback address.
#[derive(Debug, Clone, Deserialize)]
pub struct EnvPod {
    /// The Pod name it is registered under.
    pub name: String,
    /// Its loopback address, used as `status.podIP`.
    pub ip: String,
    /// Its Dataplane API base URL.
    pub dataplane_url: String,
    /// `ip:port` of HAProxy's HTTP frontend.
    pub http_address: String,
    /// The HAProxy version it runs, e.g. `2.8.25`.
    pub haproxy_version: String,
    /// Its directory (config, maps, logs).
    pub dir: PathBuf,
    /// HAProxy's configuration file.
    pub config_file: PathBuf,
    /// HAProxy's master CLI socket.
    pub master_socket: PathBuf,
    /// The file holding the HAProxy master's pid.
    pub pid_file: PathBuf,
    /// Its Dataplane API's TLS, when it speaks TLS.
    #[serde(default)]
    pub tls: Option<PodTls>,
}

/// The TLS of a pod's Dataplane API, from the environment's PKI.
#[derive(Debug, Clone, Deserialize)]
pub struct PodTls {
    /// The DNS name its certificate is issued for (besides its IP).
    pub server_name: String,
    /// Whether it requires a client certificate.
    pub client_certificates: bool,
    /// The CA that signed its certificate and the client certificate.
    pub ca_crt: PathBuf,
    /// A client certificate it accepts.
    pub client_crt: PathBuf,
    /// That certificate's key.
    pub client_key: PathBuf,
}

/// What has been written to a pod: its configuration version (every write through the
/// Dataplane API adds one) and the reloads its HAProxy master has done (its own count, from
/// `show proc` on the master CLI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writes {
    /// The Dataplane API's configuration version.
    pub version: u64,
    /// Reloads of the HAProxy master since it started.
    pub reloads: u64,
}

impl EnvPod {
    /// How many times the HAProxy master reloaded, as it counts them (`show proc`).
    ///
    /// A reload the Dataplane API started may still be under way when a test asks (the reload
    /// command returns before the master has re-executed, and on HAProxy 2.6 the master CLI
    /// refuses connections while it does): the question is asked again for up to ten seconds.
    pub fn reloads(&self) -> Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.reloads_once() {
                Ok(count) => return Ok(count),
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Err(error) => return Err(error.context(format!("{}: master CLI unanswered for 10 s", self.name))),
            }
        }
    }

    fn reloads_once(&self) -> Result<u64> {
        let mut socket = std::os::unix::net::UnixStream::connect(&self.master_socket)
            .with_context(|| format!("connecting to {}", self.master_socket.display()))?;
        socket.write_all(b"show proc\n")?;
        socket.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        socket.read_to_string(&mut answer)?;
        // "<pid> master <reloads> [failed: N] <uptime> <version>"
        let master = answer.lines().find(|line| line.split_whitespace().nth(1) == Some("master"));
        master
            .and_then(|line| line.split_whitespace().nth(2))
            .and_then(|count| count.parse().ok())
            .with_context(|| format!("{}: no reload count in `show proc`: {answer}", self.name))
    }
}

/// Pushes `config` to a pod as a client of the Dataplane API does: at the version it reads
/// first, and again at the new one when another write landed in between (a version conflict
/// writes nothing). A controller a previous test killed may have left a request that the
/// Dataplane API finishes after the next test began.
pub async fn push_raw_at_current_version(
    dataplane: &DataplaneClient,
    config: &str,
    mode: haptic::dataplane::PushMode,
) -> Result<haptic::dataplane::PushOutcome> {
    let mut attempts = 0;
    loop {
        let version = dataplane.configuration_version().await?;
        match dataplane.push_raw(config, version, mode).await {
            Err(haptic::dataplane::DataplaneError::VersionConflict { .. }) if attempts < 5 => attempts += 1,
            other => return Ok(other?),
        }
    }
}

impl Manifest {
    /// Puts a pod back to how it started, through its Dataplane API: the chart's bootstrap
    /// configuration (503 everywhere, readiness included), reloaded at once.
    pub async fn reset_to_bootstrap(&self, pod: &EnvPod) -> Result<()> {
        let bootstrap = std::fs::read_to_string(pod.dir.join("bootstrap.cfg"))?;
        push_raw_at_current_version(&self.dataplane(pod), &bootstrap, haptic::dataplane::PushMode::ForceReload).await?;
        Ok(())
    }

    /// Restarts one pod's Dataplane API with `password` for its user, as a credentials
    /// rotation does (the environment's own password puts it back).
    #[allow(dead_code)]
    pub fn rotate_dataplane_password(&self, pod: &EnvPod, password: &str) -> Result<()> {
        self.dataplane_process(pod, "stop")?;
        let status = Command::new("python3")
            .arg(repo_root().join("tests/env/envctl.py"))
            .args(["dataplane", "start", "--pod", &pod.name, "--password", password, "--state-dir"])
            .arg(&self.state_dir)
            .status()
            .context("running tests/env/envctl.py dataplane start --password")?;
        ensure!(status.success(), "envctl.py dataplane start --password on {} failed ({status})", pod.name);
        Ok(())
    }

    /// Stops (`"stop"`, SIGKILL, as a crashed sidecar) or starts (`"start"`) one pod's Dataplane API.
    pub fn dataplane_process(&self, pod: &EnvPod, action: &str) -> Result<()> {
        let status = Command::new("python3")
            .arg(repo_root().join("tests/env/envctl.py"))
            .args(["dataplane", action, "--pod", &pod.name, "--state-dir"])
            .arg(&self.state_dir)
            .status()
            .context("running tests/env/envctl.py dataplane")?;
        ensure!(status.success(), "envctl.py dataplane {action} --pod {} failed ({status})", pod.name);
        Ok(())
    }

    /// The writes a pod has had so far, to compare before and after.
    pub async fn writes(&self, pod: &EnvPod) -> Result<Writes> {
        let version = self.dataplane(pod).configuration_version().await?.0;
        Ok(Writes { version, reloads: pod.reloads()? })
    }
}

/// One HTTP backend that answers `backend=<name> ...`.
#[derive(Debug, Clone, Deserialize)]
pub struct Backend {
    /// Its name, echoed in every answer.
    pub name: String,
    /// Its loopback address.
    pub ip: String,
    /// Its port.
    pub port: u16,
}

/// Checks `holds` every 100 ms for `period` and fails, saying `what` and when, the first time
/// it does not: a negative check ("nothing is written") that also sees a change that comes and
/// goes, where one look after a fixed sleep would miss it.
pub async fn holds_throughout<F, Fut>(period: Duration, what: &str, mut holds: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let started = Instant::now();
    loop {
        if !holds().await? {
            bail!("{what} (seen {:?} into {period:?})", started.elapsed());
        }
        let left = period.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
}

/// Whether this is a soak run (`make soak`, `HAPTIC_SOAK=1`): the issue-sized repetitions.
/// `make test` runs each kind of case, fewer times.
pub fn soak() -> bool {
    std::env::var_os("HAPTIC_SOAK").is_some()
}

/// `in_test` repetitions in `make test`, `in_soak` in `make soak`.
pub fn repetitions(in_test: usize, in_soak: usize) -> usize {
    if soak() { in_soak } else { in_test }
}

/// Serialises tests that change what the shared pods run, so their configuration versions and
/// answers are their own. Hold the guard for the whole test.
pub async fn exclusive_pods() -> tokio::sync::MutexGuard<'static, ()> {
    static PODS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    PODS.lock().await
}

/// Serialises tests whose controller validates through the environment's validator (its one
/// Dataplane API and storage, which each controller brings to its own render). A test that
/// also holds `exclusive_pods` takes that first.
pub async fn exclusive_validator() -> tokio::sync::MutexGuard<'static, ()> {
    static VALIDATOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    VALIDATOR.lock().await
}

/// The running environment, started on first use if needed.
pub fn environment() -> &'static Manifest {
    static MANIFEST: OnceLock<Manifest> = OnceLock::new();
    MANIFEST.get_or_init(|| match load_or_start() {
        Ok(manifest) => manifest,
        Err(error) => panic!("the test environment is not available: {error:#}"),
    })
}

/// Where `envctl.py` keeps what it builds and fetches (`HAPTIC_ENV_CACHE`, else
/// `~/.cache/haptic-env`), as envctl.py's `CACHE_DIR`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("HAPTIC_ENV_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/haptic-env"))
}

/// The repository's root (where Cargo.toml is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn state_dir() -> PathBuf {
    std::env::var_os("HAPTIC_ENV_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/test-env"))
}

fn load_or_start() -> Result<Manifest> {
    let dir = state_dir();
    // A second environment beside the usual one (20 pods for a bench, say) takes another net.
    let net = std::env::var("HAPTIC_ENV_NET").unwrap_or_else(|_| "1".into());
    // `up` returns at once when the environment in `dir` is already running.
    let status = Command::new("python3")
        .arg(repo_root().join("tests/env/envctl.py"))
        .args(["up", "--quiet", "--net", &net, "--state-dir"])
        .arg(&dir)
        .status()
        .context("running tests/env/envctl.py")?;
    if !status.success() {
        bail!("tests/env/envctl.py up --state-dir {} failed ({status})", dir.display());
    }
    read_manifest(&dir)
}

/// Reads `env.json` from a state directory.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join("env.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

impl Manifest {
    /// A Kubernetes client authenticated as the environment's admin.
    pub async fn kube_client(&self) -> Result<kube::Client> {
        haptic::tls::install_crypto_provider();
        let config = self.kube_config().await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The admin client configuration, for tests that adjust it (impersonation, say).
    pub async fn kube_config(&self) -> Result<kube::Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A Dataplane client for one pod, with the environment's credentials (and, for a TLS
    /// pod, its CA, server name and the client certificate).
    pub fn dataplane(&self, pod: &EnvPod) -> DataplaneClient {
        let endpoint = Endpoint::parse(&pod.dataplane_url).expect("env.json holds valid URLs");
        let credentials = Credentials::new(&self.dataplane.username, &self.dataplane.password);
        let tls = pod.tls.as_ref().map(|tls| {
            let read = |path: &Path| std::fs::read(path).expect("the environment's PKI files exist");
            let (certificate, key) = (read(&tls.client_crt), read(&tls.client_key));
            TlsSettings::from_pem(&read(&tls.ca_crt), Some((&certificate, &key)), Some(&tls.server_name))
                .expect("the environment's PKI is valid")
        });
        Access { credentials, previous_credentials: None, tls, request_timeout: None }
            .client(endpoint)
            .expect("a client for an environment pod")
    }

    /// Creates a namespace of its own for one test, with every environment pod registered in it.
    pub async fn fresh_namespace(&self, client: &kube::Client, test: &str) -> Result<String> {
        self.fresh_namespace_with(client, test, &self.pods).await
    }

    /// Creates a namespace of its own for one test, with these pods registered in it.
    pub async fn fresh_namespace_with(&self, client: &kube::Client, test: &str, pods: &[EnvPod]) -> Result<String> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{}-{}-{}",
            test.replace('_', "-").chars().take(40).collect::<String>().trim_end_matches('-'),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        namespaces.create(&PostParams::default(), &namespace).await.with_context(|| format!("creating {name}"))?;
        for pod in pods {
            register_pod(client, &name, pod).await?;
        }
        Ok(name)
    }
}

/// Registers one environment pod as a Ready Pod, from the template `envctl.py` uses too.
pub async fn register_pod(client: &kube::Client, namespace: &str, pod: &EnvPod) -> Result<Pod> {
    let template = std::fs::read_to_string(repo_root().join("tests/env/pod.json"))?;
    let filled = template
        .replace("$POD_NAME", &pod.name)
        .replace("$NAMESPACE", namespace)
        .replace("$POD_IP", &pod.ip)
        .replace("$HAPROXY_VERSION", &pod.haproxy_version);
    let mut manifest: serde_json::Value = serde_json::from_str(&filled)?;
    let status = manifest.as_object_mut().and_then(|m| m.remove("status")).context("pod.json has a status")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &serde_json::from_value(manifest)?).await?;
    let patched = pods
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(serde_json::json!({ "status": status })))
        .await?;
    Ok(patched)
}

/// A configuration that sends every request to one backend (`templates/route-to-backend.cfg`,
/// which the demo uses too).
pub fn config_routing_to(backend: &Backend) -> String {
    include_str!("templates/route-to-backend.cfg")
        .replace("{{BACKEND_NAME}}", &backend.name)
        .replace("{{BACKEND_IP}}", &backend.ip)
        .replace("{{BACKEND_PORT}}", &backend.port.to_string())
}

/// Asks every pod for `host` (polling each every `poll`) until each answers from `backend`.
pub async fn every_pod_answers(env: &Manifest, host: &str, backend: &str, poll: Duration) -> Result<()> {
    every_pod_answers_each(env, host, backend, poll).await.map(drop)
}

/// As `every_pod_answers`, with how long each pod took (in the manifest's order) to answer
/// from `backend`, counted from the call. The pods not yet answering are asked in turn, one
/// request at a time, and the round starts again after `poll`: the load stays that of one
/// poller however many pods there are, and no pod's time includes waiting for another's.
pub async fn every_pod_answers_each(
    env: &Manifest,
    host: &str,
    backend: &str,
    poll: Duration,
) -> Result<Vec<Duration>> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let mut answered: Vec<Option<Duration>> = vec![None; env.pods.len()];
    let wanted = format!("backend={backend} ");
    loop {
        for (pod, took) in env.pods.iter().zip(answered.iter_mut()).filter(|(_, took)| took.is_none()) {
            let url = format!("http://{}/hello", pod.http_address);
            let answer = match http.get(&url).header("Host", host).send().await {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(error) => error.to_string(),
            };
            if answer.contains(&wanted) {
                *took = Some(started.elapsed());
            } else {
                ensure!(Instant::now() < deadline, "{} never answered {host} from {backend}: {answer}", pod.name);
            }
        }
        if answered.iter().all(Option::is_some) {
            return Ok(answered.into_iter().flatten().collect());
        }
        tokio::time::sleep(poll).await;
    }
}

/// Asks every pod at once (each is its own HAProxy) with `ask` and returns the common answer,
/// or, when they differ, each pod's prefixed with its HAProxy version: a conformance row passes
/// only when every version of the environment answers as expected.
pub async fn on_every_pod<'a, F, Fut>(pods: &'a [EnvPod], ask: F) -> String
where
    F: Fn(&'a EnvPod) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let answers = futures::future::join_all(pods.iter().map(|pod| {
        let answer = ask(pod);
        async move { (pod.haproxy_version.as_str(), answer.await) }
    }))
    .await;
    match answers.first() {
        Some((_, first)) if answers.iter().all(|(_, answer)| answer == first) => first.clone(),
        _ => answers.iter().map(|(version, answer)| format!("{version}: {answer}")).collect::<Vec<_>>().join("; "),
    }
}

/// The subject of the certificate `pod` serves on `port` for an SNI name (`openssl s_client`).
pub fn served_subject(pod: &EnvPod, port: u16, server_name: &str) -> String {
    let script = format!(
        "openssl s_client -connect {}:{port} -servername {server_name} </dev/null 2>/dev/null | openssl x509 -noout -subject",
        pod.ip
    );
    match Command::new("sh").arg("-c").arg(script).output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().trim_start_matches("subject=").to_owned(),
        Err(error) => format!("openssl: {error}"),
    }
}

/// An HTTPS request to `pod` with curl (`--resolve`, so SNI and Host are the name): status and
/// the backend's `X-Backend`.
pub fn curl_https(pod: &EnvPod, host: &str, port: u16, path: &str) -> String {
    let output = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code} %header{x-backend}", "--resolve"])
        .arg(format!("{host}:{port}:{}", pod.ip))
        .arg(format!("https://{host}:{port}{path}"))
        .output();
    match output {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Err(error) => format!("curl: {error}"),
    }
}

/// GETs `/hello` through HAProxy at `address` until `backend` answers (reloads take a moment).
pub async fn get_until_answered_by(http: &reqwest::Client, address: &str, backend: &str) -> Result<String> {
    let url = format!("http://{address}/hello");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = String::new();
    while Instant::now() < deadline {
        match http.get(&url).send().await {
            Ok(response) => {
                last = response.text().await.unwrap_or_default();
                if last.contains(&format!("backend={backend} ")) {
                    return Ok(last);
                }
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url} was not answered by {backend} within 15s (last answer: {last})")
}
