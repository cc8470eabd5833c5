//! Command line: flags are parsed here into plain values; the work happens in library modules.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use kube::CustomResourceExt;

use crate::config::HAProxyTemplateConfig;
use crate::dataplane::{Access, Credentials, Endpoint, TlsSettings};
use crate::render::Renderer;
use crate::telemetry::LogFormat;

/// haptic: a Kubernetes ingress controller for a fleet of HAProxy load balancers.
#[derive(Debug, Parser)]
#[command(name = "haptic", version, about, long_about = None)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value = "text", env = "HAPTIC_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check that an HAProxy pod's Dataplane API answers, and print its versions.
    Probe(ProbeArgs),
    /// Print the HAProxyTemplateConfig CustomResourceDefinition as YAML.
    Crd,
    /// Render the files from a configuration and resource files, without a cluster.
    Render(RenderArgs),
    /// What taking a pod from one render to another takes: nothing, Runtime API changes (no
    /// reload, each listed), or a reload (and why).
    Diff(DiffArgs),
    /// Run a configuration's validation tests offline: render each test's fixtures, check its
    /// assertions, and send its requests through a local HAProxy running the render.
    Validate(ValidateArgs),
    /// Run the controller: follow one HAProxyTemplateConfig, watch what it names, render.
    Run(Box<RunArgs>),
    /// Print the per-pod state machine as a Mermaid state diagram (from the transition table).
    StateDiagram,
    /// Before moving Ingresses from another controller (ingress-nginx, haproxy-ingress,
    /// haproxytech): what haptic will do with each of their annotations. Exits non-zero when
    /// an Ingress would be refused.
    MigrateCheck(MigrateCheckArgs),
}

/// Arguments of `haptic migrate-check`.
#[derive(Debug, Args)]
pub struct MigrateCheckArgs {
    /// A directory of manifests (YAML or JSON); without it, every Ingress of the cluster the
    /// kubeconfig names.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Only Ingresses of this class (`spec.ingressClassName` or the legacy annotation).
    #[arg(long)]
    pub class: Option<String>,
    /// Only Ingresses of these namespaces (repeat for several); all without it.
    #[arg(long, short = 'n')]
    pub namespace: Vec<String>,
    /// Judge as a configuration that allows raw HAProxy snippets would.
    #[arg(long)]
    pub allow_snippets: bool,
    /// `table` for people, `json` for CI.
    #[arg(long, value_enum, default_value = "table")]
    pub format: ReportFormat,
}

/// How `haptic migrate-check` prints its report.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ReportFormat {
    /// Columns for people.
    Table,
    /// One JSON document.
    Json,
}

/// `haptic migrate-check`: prints the report; fails when an Ingress would be refused.
pub async fn migrate_check(args: MigrateCheckArgs) -> Result<()> {
    let objects: Vec<serde_json::Value> = match &args.dir {
        Some(dir) => crate::offline::load_objects(dir)?.into_iter().map(|(_, object)| object).collect(),
        None => {
            use k8s_openapi::api::networking::v1::Ingress;
            let client = kube::Client::try_default().await.context("connecting to the Kubernetes API server")?;
            let apis: Vec<kube::Api<Ingress>> = match args.namespace.as_slice() {
                [] => vec![kube::Api::all(client)],
                namespaces => namespaces.iter().map(|ns| kube::Api::namespaced(client.clone(), ns)).collect(),
            };
            let mut items = Vec::new();
            for api in apis {
                items.extend(api.list(&kube::api::ListParams::default()).await.context("listing Ingresses")?.items);
            }
            items
                .into_iter()
                .map(|ingress| {
                    let mut object = serde_json::to_value(ingress)?;
                    object["kind"] = "Ingress".into();
                    Ok(object)
                })
                .collect::<Result<_, serde_json::Error>>()?
        }
    };
    let class_of = |object: &serde_json::Value| {
        object
            .pointer("/spec/ingressClassName")
            .or_else(|| object.pointer("/metadata/annotations/kubernetes.io~1ingress.class"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let namespace_of = |object: &serde_json::Value| {
        object.pointer("/metadata/namespace").and_then(serde_json::Value::as_str).unwrap_or("default").to_owned()
    };
    let chosen = objects.iter().filter(|object| {
        (args.class.is_none() || class_of(object) == args.class)
            && (args.namespace.is_empty() || args.namespace.contains(&namespace_of(object)))
    });
    let report = crate::migrate::check(chosen, args.allow_snippets);
    match args.format {
        ReportFormat::Table => print!("{}", report.table()),
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    let refused = report.refused();
    if refused > 0 {
        bail!("{refused} of {} Ingresses would be refused (see the rows marked REFUSED)", report.ingresses.len());
    }
    Ok(())
}

/// Arguments of `haptic run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Namespace of the HAProxyTemplateConfig to follow.
    #[arg(long, env = "HAPTIC_CONFIG_NAMESPACE")]
    pub config_namespace: String,
    /// Name of the HAProxyTemplateConfig to follow.
    #[arg(long, env = "HAPTIC_CONFIG_NAME")]
    pub config_name: String,
    /// Also write every render to this directory (files and renders.log), for inspection.
    #[arg(long, env = "HAPTIC_RENDER_DIR")]
    pub render_dir: Option<PathBuf>,
    /// How many objects with values HAProxy cannot take a render may leave out before failing.
    #[arg(long, default_value_t = 100)]
    pub max_left_out: usize,
    /// Where the journal of what each pod was given lives (a PVC in a cluster).
    #[arg(long, env = "HAPTIC_JOURNAL_DIR", default_value = "/var/lib/haptic")]
    pub journal_dir: PathBuf,
    /// Render only: deploy to no pod and open no journal.
    #[arg(long)]
    pub render_only: bool,
    /// Transitions kept per pod in the journal's log.
    #[arg(long, default_value_t = 100)]
    pub journal_retention: u64,
    /// Where the read-only HTTP API (pods, render, metrics) listens.
    #[arg(long, env = "HAPTIC_API_ADDRESS", default_value = "0.0.0.0:8080")]
    pub api_address: std::net::SocketAddr,
    /// The HTTP API's certificate and key (`tls.crt`, `tls.key` in this directory); without
    /// it, a self-signed certificate is made at start and its fingerprint logged.
    #[arg(long, env = "HAPTIC_API_TLS_DIR")]
    pub api_tls_dir: Option<PathBuf>,
    /// Serve the HTTP API over plain http (local use, or behind a proxy that terminates TLS).
    #[arg(long, env = "HAPTIC_API_PLAINTEXT", conflicts_with = "api_tls_dir")]
    pub api_plaintext: bool,
    /// Where `/healthz` and `/readyz` are served, without authentication (probes carry no
    /// token), on a port of their own so that a network policy can open only them.
    #[arg(long, env = "HAPTIC_HEALTH_ADDRESS", default_value = "0.0.0.0:8081")]
    pub health_address: std::net::SocketAddr,
    /// Who may read `/api/v1/*` and `/metrics`: `kubernetes` (a bearer token whose user may
    /// `get` `fleet.haptic.dev`, checked with TokenReview and SubjectAccessReview) or `none`
    /// (anyone who can reach the port: local use only). Health is always open, on its own port.
    #[arg(long, env = "HAPTIC_API_AUTH", value_enum, default_value_t = ApiAuth::Kubernetes)]
    pub api_auth: ApiAuth,
    /// The audience a reader's token must be issued for (`kubectl create token NAME --audience
    /// haptic`): a token for the API server itself is refused, so the controller can never be
    /// handed one it could replay there.
    #[arg(long, env = "HAPTIC_API_TOKEN_AUDIENCE", default_value = "haptic")]
    pub api_token_audience: String,
    /// Elect a leader among replicas on this Lease (in the configuration's namespace); only
    /// the leader deploys. Without it, this replica deploys alone.
    #[arg(long, env = "HAPTIC_LEADER_ELECTION_LEASE")]
    pub leader_election_lease: Option<String>,
    /// This replica's identity in the Lease (default: the pod name from POD_NAME, else the
    /// host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// Seconds a Lease holds without renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds before expiry the leader renews; a leader that cannot renew stops writing to
    /// pods half this long before another replica may take over.
    #[arg(long, default_value_t = 5)]
    pub lease_grace_seconds: u64,
    /// An HAProxy binary to run the configuration's validation-test requests through; without
    /// it, only their file assertions gate a configuration (`haptic validate` runs them all).
    #[arg(long, env = "HAPTIC_VALIDATION_HAPROXY")]
    pub validation_haproxy: Option<PathBuf>,
    /// A Dataplane API that serves no traffic, to check the webhook's renders with its HAProxy
    /// (`only_validate`, its storage holding the render's files): the chart's `validator`
    /// container beside the controller. Preferred over `--validation-haproxy` for the webhook.
    #[arg(long, env = "HAPTIC_VALIDATION_DATAPLANE")]
    pub validation_dataplane: Option<String>,
    /// The user of `--validation-dataplane`; its password is read from the environment only
    /// (`HAPTIC_VALIDATION_DATAPLANE_PASSWORD`: a flag would show in the process list).
    #[arg(long, env = "HAPTIC_VALIDATION_DATAPLANE_USERNAME", default_value = "admin")]
    pub validation_dataplane_username: String,
    /// Create the Dataplane credentials Secret of this name (in the configuration's namespace)
    /// with a random password when it does not exist; never change an existing one.
    #[arg(long, env = "HAPTIC_CREATE_DATAPLANE_SECRET")]
    pub create_dataplane_secret: Option<String>,
    /// Create the Dataplane TLS Secret of this name (in the configuration's namespace: a CA and
    /// a certificate for `--dataplane-server-name`) when it does not exist; never change one.
    #[arg(long, env = "HAPTIC_CREATE_DATAPLANE_TLS")]
    pub create_dataplane_tls: Option<String>,
    /// The DNS name the certificate `--create-dataplane-tls` makes is for (the configuration's
    /// `spec.dataplane.tls.serverName` must name it).
    #[arg(long, env = "HAPTIC_DATAPLANE_SERVER_NAME", default_value = "dataplane.haptic.internal")]
    pub dataplane_server_name: String,
    /// The user name put in a Secret `--create-dataplane-secret` creates.
    #[arg(long, env = "HAPTIC_DATAPLANE_USERNAME", default_value = "admin")]
    pub dataplane_username: String,
    /// Serve the validating admission webhook (HTTPS, `POST /validate`) on this address.
    #[arg(long, env = "HAPTIC_WEBHOOK_ADDRESS")]
    pub webhook_address: Option<std::net::SocketAddr>,
    /// The webhook's certificate and key: `tls.crt` and `tls.key` in this directory.
    #[arg(long, env = "HAPTIC_WEBHOOK_CERT_DIR", default_value = "/etc/haptic/webhook")]
    pub webhook_cert_dir: PathBuf,
}

/// Arguments of `haptic render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// A full HAProxyTemplateConfig (YAML or JSON).
    #[arg(long)]
    pub config: PathBuf,
    /// A directory of resource files (YAML or JSON, several documents per file allowed).
    #[arg(long)]
    pub resources: PathBuf,
    /// Where to write haproxy.cfg, maps/ and files/; without it, a listing goes to stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Arguments of `haptic diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The render a pod runs (a directory `haptic render --out` or `--render-dir` wrote).
    #[arg(long, required_unless_present = "controller", conflicts_with = "controller")]
    pub before: Option<PathBuf>,
    /// A running controller's API (`https://haptic:8080`) in place of `--before`: the render its
    /// pods run, and for each pod what the change takes on it (by its own HAProxy version).
    #[arg(long)]
    pub controller: Option<String>,
    /// A bearer token for the controller's API (a user allowed to `get` `fleet.haptic.dev`).
    #[arg(long, env = "HAPTIC_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA (PEM) that signed the controller's API certificate.
    #[arg(long, conflicts_with = "controller_insecure")]
    pub controller_ca: Option<PathBuf>,
    /// Do not check the controller's API certificate (its default one is self-signed: compare
    /// the fingerprint it logged at start).
    #[arg(long)]
    pub controller_insecure: bool,
    /// The render it would take.
    #[arg(long)]
    pub after: PathBuf,
    /// The pod's HAProxy version: before 2.7, a server in traffic changes address by a reload.
    #[arg(long, default_value = "2.8")]
    pub haproxy_version: String,
}

/// Arguments of `haptic validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// A full HAProxyTemplateConfig (YAML or JSON) with `spec.validationTests`.
    #[arg(long)]
    pub config: PathBuf,
    /// A directory of resource files added to every test's fixtures.
    #[arg(long)]
    pub resources: Option<PathBuf>,
    /// The HAProxy binary the requests run through (a name is looked up in PATH).
    #[arg(long, env = "HAPTIC_VALIDATION_HAPROXY", default_value = "haproxy")]
    pub haproxy: PathBuf,
    /// Check the files only and skip the requests (no HAProxy needed).
    #[arg(long)]
    pub no_requests: bool,
}

/// Arguments of `haptic probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Base URL of the Dataplane API, e.g. http://10.0.0.7:5555/v3.
    pub endpoint: String,
    /// Dataplane API user.
    #[arg(long, env = "HAPTIC_DATAPLANE_USERNAME", default_value = "admin")]
    pub username: String,
    /// Dataplane API password.
    #[arg(long, env = "HAPTIC_DATAPLANE_PASSWORD", hide_env_values = true)]
    pub password: String,
    /// Speak TLS, checking the pod's certificate against this PEM CA bundle only.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate (chain) to present, with `--client-key`.
    #[arg(long, requires = "client_key", requires = "ca_file")]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's PEM private key.
    #[arg(long, requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// The name the pod's certificate is issued for (default: the endpoint's host).
    #[arg(long, requires = "ca_file")]
    pub server_name: Option<String>,
}

/// Runs `haptic probe`: one line per fact, so scripts and operators can read it.
pub async fn probe(args: ProbeArgs) -> Result<()> {
    let endpoint = Endpoint::parse(&args.endpoint)?;
    let read = |path: &PathBuf| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let tls = match &args.ca_file {
        Some(ca_file) => {
            let client_pair = match (&args.client_cert, &args.client_key) {
                (Some(certificate), Some(key)) => Some((read(certificate)?, read(key)?)),
                _ => None,
            };
            let pair = client_pair.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
            Some(TlsSettings::from_pem(&read(ca_file)?, pair, args.server_name.as_deref())?)
        }
        None => None,
    };
    let access = Access {
        credentials: Credentials::new(args.username, args.password),
        previous_credentials: None,
        tls,
        request_timeout: None,
    };
    let client = access.client(endpoint)?;
    let info = client.info().await.context("reading the Dataplane API's identity")?;
    let health = client.health().await.context("reading HAProxy's health")?;
    let version = client.configuration_version().await.context("reading the configuration version")?;
    println!("endpoint: {}", client.endpoint());
    println!("dataplane_api: {}", info.version);
    println!("haproxy: {health:?}");
    println!("configuration_version: {version}");
    Ok(())
}

/// Runs `haptic crd`.
pub fn crd() -> Result<()> {
    print!("{}", serde_saphyr::to_string(&HAProxyTemplateConfig::crd())?);
    Ok(())
}

/// Runs `haptic render`: every error names its file, field, template or object.
pub fn render(args: RenderArgs) -> Result<()> {
    let config = crate::offline::load_config(&args.config)?;
    let problems = crate::config::validate::problems(&config.spec);
    if !problems.is_empty() {
        let lines: Vec<_> = problems.iter().map(ToString::to_string).collect();
        bail!("{} is not a usable configuration:\n  {}", args.config.display(), lines.join("\n  "));
    }
    let renderer = Renderer::compile(&config.spec).with_context(|| format!("in {}", args.config.display()))?;
    let objects = crate::offline::load_objects(&args.resources)?;
    let stores = crate::offline::build_stores(&config.spec, &objects)?;
    let pods = crate::offline::pods(&config.spec, &objects);
    let files = renderer.render(&stores, &pods)?.files;
    match args.out {
        Some(out) => {
            for (relative, file) in files.entries() {
                let path = out.join(&relative);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
                }
                std::fs::write(&path, file.content.as_bytes())
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        None => {
            for (relative, file) in files.entries() {
                println!("{relative}\t{} bytes\tsha256:{}", file.content.len(), file.checksum);
            }
        }
    }
    Ok(())
}

/// Runs `haptic validate`: one line per test, then every failure; fails when any test did.
pub async fn validate(args: ValidateArgs) -> Result<()> {
    let config = crate::offline::load_config(&args.config)?;
    let problems = crate::config::validate::problems(&config.spec);
    if !problems.is_empty() {
        let lines: Vec<_> = problems.iter().map(ToString::to_string).collect();
        bail!("{} is not a usable configuration:\n  {}", args.config.display(), lines.join("\n  "));
    }
    if config.spec.validation_tests.is_empty() {
        println!("{}: no validation tests", args.config.display());
        return Ok(());
    }
    let renderer = Renderer::compile(&config.spec).with_context(|| format!("in {}", args.config.display()))?;
    let shared = match &args.resources {
        Some(dir) => crate::offline::load_objects(dir)?,
        None => Vec::new(),
    };
    let haproxy = (!args.no_requests).then(|| crate::checks::Requests::Local(args.haproxy.clone()));
    let report = crate::checks::run(&config.spec, &renderer, &shared, haproxy.as_ref()).await;
    for test in &report.tests {
        let verdict = if test.failures.is_empty() { "ok  " } else { "FAIL" };
        let skipped = if test.skipped > 0 { format!(", {} request(s) skipped", test.skipped) } else { String::new() };
        println!("{verdict} {} ({} assertion(s) checked{skipped})", test.name, test.checked);
        for failure in &test.failures {
            println!("     {failure}");
        }
    }
    let failed = report.tests.iter().filter(|t| !t.failures.is_empty()).count();
    if failed > 0 {
        bail!("{failed} of {} validation tests failed: {}", report.tests.len(), report.summary());
    }
    Ok(())
}

/// Runs `haptic diff`: prints `no change`, `runtime: ...` with one action per line, or
/// `reload: <reason>`; against a controller, once per pod.
pub async fn diff(args: DiffArgs) -> Result<()> {
    let mut after = crate::offline::load_render_dir(&args.after)?;
    let Some(url) = &args.controller else {
        let before = args.before.as_deref().context("--before or --controller")?;
        let before = crate::offline::load_render_dir(before)?;
        print!("{}", describe_change(&before, &after, &args.haproxy_version));
        return Ok(());
    };
    let trust = match (&args.controller_ca, args.controller_insecure) {
        (Some(file), _) => crate::api::client::ApiTrust::Ca(
            std::fs::read(file).with_context(|| format!("reading --controller-ca {}", file.display()))?,
        ),
        (None, true) => crate::api::client::ApiTrust::Anything,
        (None, false) => crate::api::client::ApiTrust::SystemRoots,
    };
    let client = crate::api::client::ApiClient::new(url, args.token.clone(), trust)?;
    let current = client.render().await.context("reading the controller's render")?;
    // The API shows userlists' password hashes redacted: the new render is compared alike.
    let shown = crate::files::redact_password_hashes(&after.haproxy_cfg.content).into_owned();
    after.haproxy_cfg = crate::files::RenderedFile::new(shown);
    println!("from the controller's render (generation {}) to {}", current.generation, args.after.display());
    if after.certs.is_empty() && !current.files.certs.is_empty() {
        // A render directory never holds private keys.
        println!("certificates: not in {}, taken as unchanged", args.after.display());
        after.certs = current.files.certs.clone();
    }
    let pods = client.pods().await.context("reading the controller's pods")?;
    if pods.is_empty() {
        print!("{}", describe_change(&current.files, &after, &args.haproxy_version));
    }
    for pod in pods {
        let version = pod.haproxy_version.clone().unwrap_or_else(|| args.haproxy_version.clone());
        if !pod.runs_current {
            println!(
                "pod {}/{} ({}): does not run the current render: a full sync, whatever the change",
                pod.namespace, pod.name, pod.state
            );
            continue;
        }
        println!("pod {}/{} (HAProxy {version}, {}):", pod.namespace, pod.name, pod.state);
        for line in describe_change(&current.files, &after, &version).lines() {
            println!("  {line}");
        }
    }
    Ok(())
}

/// What `haptic diff` says for a pod running `before` that is to run `after`.
pub fn describe_change(before: &crate::files::FileSet, after: &crate::files::FileSet, haproxy_version: &str) -> String {
    use crate::plan::{AddressChanges, Plan};
    let address_changes = AddressChanges::of_version(haproxy_version);
    match crate::plan::plan(before, after, address_changes) {
        Plan::NoOp => "no change\n".to_owned(),
        Plan::Runtime(actions) if actions.is_empty() => {
            "runtime: the files change in comments or layout only, no action, no reload\n".to_owned()
        }
        Plan::Runtime(actions) => {
            let mut text = format!("runtime: {} action(s), no reload\n", actions.len());
            for action in actions {
                text.push_str(&format!("  {action}\n"));
            }
            text
        }
        Plan::Full => {
            let reason = crate::plan::reload_reason(Some(before), after, address_changes);
            format!("reload: {}\n", reason.as_str())
        }
    }
}

/// Runs `haptic run` until interrupted; the cluster comes from KUBECONFIG or the in-cluster
/// service account.
pub async fn run(args: RunArgs) -> Result<()> {
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API server")?;
    if let Some(name) = &args.create_dataplane_secret {
        let created = crate::controller::credentials::ensure_secret(
            &client,
            &args.config_namespace,
            name,
            &args.dataplane_username,
        )
        .await
        .map_err(|why| anyhow::anyhow!("--create-dataplane-secret: {why}"))?;
        if created {
            tracing::info!(secret = %name, "created the Dataplane credentials Secret with a random password");
        }
    }
    if let Some(name) = &args.create_dataplane_tls {
        let server_name = &args.dataplane_server_name;
        let created =
            crate::controller::credentials::ensure_tls_secret(&client, &args.config_namespace, name, server_name)
                .await
                .map_err(|why| anyhow::anyhow!("--create-dataplane-tls: {why}"))?;
        if created {
            tracing::info!(secret = %name, %server_name, "created the Dataplane TLS Secret (a CA and the pods' certificate)");
        }
    }
    let identity = args.leader_election_identity.clone().unwrap_or_else(default_identity);
    crate::dataplane::set_replica_name(&identity);
    let election = match &args.leader_election_lease {
        Some(lease_name) => {
            let settings = crate::election::ElectionSettings {
                namespace: args.config_namespace.clone(),
                lease_name: lease_name.clone(),
                identity: identity.clone(),
                duration: std::time::Duration::from_secs(args.lease_duration_seconds),
                grace: std::time::Duration::from_secs(args.lease_grace_seconds),
            };
            settings.check()?;
            Some(settings)
        }
        None => None,
    };
    // One HAProxy for the webhook's checks and the validation tests' requests (they take turns
    // on the validator): the validator's when given, else a local binary.
    let validation = match &args.validation_dataplane {
        Some(endpoint) => {
            let password = std::env::var("HAPTIC_VALIDATION_DATAPLANE_PASSWORD").unwrap_or_default();
            let credentials = crate::dataplane::Credentials::new(args.validation_dataplane_username.clone(), password);
            let api = crate::checks::validator::ValidatorApi::new(endpoint, credentials)
                .with_context(|| format!("--validation-dataplane {endpoint}"))?;
            Some(crate::checks::Requests::Validator(std::sync::Arc::new(api)))
        }
        None => args.validation_haproxy.map(crate::checks::Requests::Local),
    };
    let options = crate::controller::ControllerOptions {
        namespace: args.config_namespace,
        name: args.config_name,
        render_dir: args.render_dir,
        max_left_out: args.max_left_out,
        journal_dir: (!args.render_only).then_some(args.journal_dir),
        journal_retention: args.journal_retention,
        api_address: Some(args.api_address),
        api_tls: match (args.api_plaintext, args.api_tls_dir.clone()) {
            (true, _) => crate::controller::ApiTls::Plaintext,
            (false, Some(dir)) => crate::controller::ApiTls::Directory(dir),
            (false, None) => crate::controller::ApiTls::SelfSigned,
        },
        health_address: Some(args.health_address),
        api_auth: (args.api_auth == ApiAuth::Kubernetes).then(|| args.api_token_audience.clone()),
        election,
        webhook: args.webhook_address.map(|address| crate::api::webhook::WebhookSettings {
            address,
            certificate_dir: args.webhook_cert_dir.clone(),
            validator: validation.clone(),
        }),
        validation_requests: validation,
    };
    Ok(crate::controller::run(client, options, shutdown_signal()).await?)
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match terminate.as_mut() { Some(signal) => { signal.recv().await; } None => std::future::pending().await } } => {}
    }
    tracing::info!("shutting down");
}

/// Who may read the HTTP API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiAuth {
    /// A Kubernetes bearer token allowed to `get` `fleet.haptic.dev`.
    Kubernetes,
    /// No check at all (local use).
    None,
}
