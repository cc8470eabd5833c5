//! Deployment wiring: the fleet of pod drivers, fed with each successful render and the
//! current HAProxy pods, journaled in the journal directory.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::HAProxyTemplateConfigSpec;
use crate::dataplane::{Access, Credentials, TlsSettings};
use crate::election::Fence;
use crate::files::FileSet;
use crate::fleet::supervisor::FleetPods;
use crate::fleet::{ActionSlots, DataplaneActions, Desired, Pacing, PodTarget, supervisor};
use crate::journal::Journal;
use crate::pod::{LeaderTerm, PodUid};
use crate::telemetry::traces::TraceParent;
use crate::watch::HaproxyPod;

/// The running fleet.
pub(crate) struct Deployer {
    journal: Arc<Journal>,
    term: LeaderTerm,
    fence: Arc<Fence>,
    fleet: Option<Fleet>,
    tasks: crate::tasks::TaskTree,
}

struct Fleet {
    pods: watch::Sender<FleetPods>,
    desired: watch::Sender<Arc<Desired>>,
    actions: Arc<DataplaneActions>,
    slots: ActionSlots,
    task: crate::tasks::OwnedTask,
    /// Answers when the fleet's task has ended.
    ended: tokio::sync::oneshot::Receiver<()>,
}

impl Deployer {
    /// A fleet journaling in `journal`, deploying in leader term `term` while `fence` allows;
    /// its task runs under `tasks`.
    pub(crate) fn new(
        journal: Arc<Journal>,
        term: LeaderTerm,
        fence: Arc<Fence>,
        tasks: crate::tasks::TaskTree,
    ) -> Self {
        Self { journal, term, fence, fleet: None, tasks }
    }

    /// The leader term this fleet deploys in.
    pub(crate) fn term(&self) -> LeaderTerm {
        self.term
    }

    /// Hands a successful render and the current pods to the fleet, starting it on first use:
    /// it deploys to the pods that can be deployed to, and keeps the journal records of all.
    pub(crate) fn deploy(
        &mut self,
        spec: &HAProxyTemplateConfigSpec,
        access: &Access,
        files: FileSet,
        pods: &[HaproxyPod],
        trace: Option<TraceParent>,
    ) {
        let port = spec.dataplane.port;
        let targets = pods
            .iter()
            .filter(|pod| pod.deployable)
            .map(|pod| PodTarget {
                uid: PodUid(pod.info.uid.clone()),
                namespace: pod.info.namespace.clone(),
                name: pod.info.name.clone(),
                endpoint: endpoint(access.scheme(), &pod.info.ip, port),
            })
            .collect();
        let present = pods.iter().map(|pod| PodUid(pod.info.uid.clone())).collect();
        let targets = FleetPods { targets, present };
        let desired =
            Arc::new(Desired::new(files).traced(trace).requiring(spec.dataplane.minimum_haproxy()).paced(pacing(spec)));
        let max_parallel = spec.dataplane.max_parallel as usize;
        match &self.fleet {
            Some(fleet) => {
                // The configuration's settings take effect with its renders: the timing
                // travels in the render, the bound on actions in flight is resized here.
                fleet.slots.resize(max_parallel);
                fleet.actions.set_access(access.clone());
                fleet.desired.send_replace(desired);
                fleet.pods.send_replace(targets);
            }
            None => {
                let guard = Arc::new(crate::fleet::LeaseGuard::new(self.fence.clone(), self.term));
                let actions = Arc::new(DataplaneActions::new(access.clone(), self.journal.clone(), guard));
                let (pods_tx, pods_rx) = watch::channel(targets);
                let (desired_tx, desired_rx) = watch::channel(desired);
                let slots = ActionSlots::new(max_parallel);
                let (task, ended) = self.tasks.spawn_returning(
                    "fleet",
                    supervisor::run(
                        self.journal.clone(),
                        actions.clone(),
                        slots.clone(),
                        self.term,
                        pods_rx,
                        desired_rx,
                    ),
                );
                info!(max_parallel, "fleet started");
                self.fleet = Some(Fleet { pods: pods_tx, desired: desired_tx, actions, slots, task, ended });
            }
        }
    }

    /// Stops every driver at once, abandoning in-flight actions (leadership lost).
    pub(crate) fn abort(self) {
        // Dropping the fleet's task handle stops it.
        drop(self.fleet);
    }

    /// Stops every driver; in-flight actions are abandoned at their next step.
    pub(crate) async fn stop(self) {
        if let Some(fleet) = self.fleet {
            drop(fleet.pods);
            drop(fleet.desired);
            let _task = fleet.task;
            if tokio::time::timeout(Duration::from_secs(10), fleet.ended).await.is_err() {
                warn!("fleet did not stop within 10s");
            }
        }
    }
}

/// The timing a configuration gives its pods' drivers.
fn pacing(spec: &HAProxyTemplateConfigSpec) -> Pacing {
    Pacing {
        drift_interval: spec.dataplane.drift_prevention_interval.get(),
        min_reload_interval: spec.dataplane.min_deployment_interval.get(),
        // No write takes longer than a deployment may: by then any of the last term's has
        // landed or never will.
        write_settle: spec.dataplane.deployment_timeout.get(),
    }
}

fn endpoint(scheme: &str, ip: &str, port: u16) -> String {
    if ip.contains(':') { format!("{scheme}://[{ip}]:{port}/v3") } else { format!("{scheme}://{ip}:{port}/v3") }
}

/// Reads what pods are reached with from the Secrets the configuration names: credentials
/// (keys `dataplane_username` and `dataplane_password`, and during a rotation
/// `dataplane_password_previous`, the password pods not yet rolled hold) and, when `spec.dataplane.tls` is set,
/// the CA bundle (`ca.crt`) and optional client certificate (`tls.crt`, `tls.key`). When TLS
/// is asked for and its Secret cannot be used, there is no access at all: never clear text
/// instead. Errors name Secrets and keys, never their content.
pub(crate) async fn access(
    client: &kube::Client,
    spec: &HAProxyTemplateConfigSpec,
    namespace: &str,
) -> Result<Access, String> {
    let reference = spec
        .dataplane
        .credentials_secret_ref
        .as_ref()
        .ok_or("spec.dataplane.credentialsSecretRef is not set, so no pod can be deployed to")?;
    let credentials = read_secret(client, reference, namespace).await?;
    let text = |key: &str| credentials.required(key).map(|bytes| String::from_utf8_lossy(bytes).into_owned());
    let username = text("dataplane_username")?;
    // During a rotation the Secret may keep the password the pods not yet rolled started with.
    let previous =
        credentials.optional("dataplane_password_previous").map(|bytes| String::from_utf8_lossy(bytes).into_owned());
    let previous_credentials = previous.filter(|p| !p.is_empty()).map(|p| Credentials::new(username.clone(), p));
    let credentials = Credentials::new(username, text("dataplane_password")?);
    let tls = match &spec.dataplane.tls {
        Some(tls) => {
            let secret = read_secret(client, &tls.secret_ref, namespace).await?;
            let client_pair = match (secret.optional("tls.crt"), secret.optional("tls.key")) {
                (Some(certificate), Some(key)) => Some((certificate, key)),
                (None, None) => None,
                _ => return Err(format!("Secret {} has only one of tls.crt and tls.key", secret.name)),
            };
            let settings = TlsSettings::from_pem(secret.required("ca.crt")?, client_pair, tls.server_name.as_deref())
                .map_err(|e| format!("Secret {} (spec.dataplane.tls): {e}", secret.name))?;
            Some(settings)
        }
        None => None,
    };
    Ok(Access {
        credentials,
        previous_credentials,
        tls,
        request_timeout: Some(spec.dataplane.deployment_timeout.get()),
    })
}

/// A Secret's data, named `namespace/name` in messages.
struct SecretData {
    name: String,
    data: std::collections::BTreeMap<String, k8s_openapi::ByteString>,
}

impl SecretData {
    fn optional(&self, key: &str) -> Option<&[u8]> {
        self.data.get(key).map(|bytes| bytes.0.as_slice()).filter(|bytes| !bytes.is_empty())
    }

    fn required(&self, key: &str) -> Result<&[u8], String> {
        self.optional(key).ok_or_else(|| format!("Secret {} has no {key}", self.name))
    }
}

async fn read_secret(
    client: &kube::Client,
    reference: &crate::config::SecretRef,
    namespace: &str,
) -> Result<SecretData, String> {
    let namespace = reference.namespace.as_deref().unwrap_or(namespace);
    let name = format!("{namespace}/{}", reference.name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // An API server that stopped answering must not hold up activation for minutes.
    let secret = tokio::time::timeout(Duration::from_secs(10), secrets.get(&reference.name))
        .await
        .map_err(|_| format!("reading Secret {name}: no answer within 10s"))?
        .map_err(|e| format!("reading Secret {name}: {e}"))?;
    Ok(SecretData { name, data: secret.data.unwrap_or_default() })
}
