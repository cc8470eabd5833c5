//! The Helm chart with a real Helm (built from its Go module) against the real API server:
//! lint and render; the CRD it ships is the one the binary generates; every rendered manifest
//! is accepted by the API server; the controller's ServiceAccount may do exactly what the
//! controller does (SubjectAccessReviews: each needed verb allowed, a sample of others denied);
//! and the real binary, authenticated as that ServiceAccount, runs the chart's default
//! configuration: accepted, rendered, status written, Lease taken.

use crate::env;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use env::chart::{apply_all, chart_dir, haproxy_binaries, helm, render_chart};
use env::controller::{ControllerProcess, Launch};
use haptic::config::HAProxyTemplateConfig;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Secure by default (#45, defect 9): every container of the chart runs without privileges on
/// a read-only root filesystem, and the internet-facing HAProxy container cannot read the
/// Dataplane API's password (not on its volumes, no shared process namespace).
#[test]
fn every_container_is_unprivileged_and_haproxy_cannot_read_the_dataplane_password() -> Result<()> {
    for values in [&[][..], &["--set", "haproxy.dataplane.runtimeCommands=statsSocket"][..]] {
        let documents = render_chart("rel", "haptic-system", values)?;
        for document in documents.iter().filter(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet") {
            let pod = &document["spec"]["template"]["spec"];
            let name = document["metadata"]["name"].as_str().unwrap_or_default();
            ensure!(pod["securityContext"]["runAsNonRoot"] == true, "{name}: may run as root");
            let containers = pod["containers"].as_array().into_iter().flatten();
            for container in containers.chain(pod["initContainers"].as_array().into_iter().flatten()) {
                let context = &container["securityContext"];
                let what = format!("{name}/{}", container["name"]);
                ensure!(context["readOnlyRootFilesystem"] == true, "{what}: writable root filesystem");
                ensure!(context["allowPrivilegeEscalation"] == false, "{what}: may escalate privileges");
                ensure!(context["capabilities"]["drop"] == json!(["ALL"]), "{what}: keeps capabilities");
            }
            if name.ends_with("-haproxy") {
                let haproxy = pod["containers"].as_array().into_iter().flatten().find(|c| c["name"] == "haproxy");
                let haproxy = haproxy.context("no haproxy container")?;
                let mounts: Vec<&str> = haproxy["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["name"].as_str())
                    .collect();
                ensure!(!mounts.contains(&"dataplane-config"), "HAProxy mounts the Dataplane API's config: {mounts:?}");
                let shared = pod["shareProcessNamespace"] == true;
                ensure!(
                    shared == values.contains(&"haproxy.dataplane.runtimeCommands=statsSocket"),
                    "one process namespace only where HAProxy 2.6 is reloaded by a signal"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn the_chart_lints_and_renders_in_every_shape_and_ships_the_binarys_crd() -> Result<()> {
    let chart = chart_dir().display().to_string();
    helm(&["lint", &chart, "--strict", "--kube-version", "1.36.3"])?;
    helm(&[
        "lint",
        &chart,
        "--strict",
        "--kube-version",
        "1.36.3",
        "--set",
        "controller.replicas=3",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "ingressClass.default=true",
        "--set",
        "networkPolicy.enabled=false",
        "--set",
        "haproxy.dataplane.existingSecret=mine",
    ])?;
    let kinds = |docs: &[serde_json::Value]| -> Vec<String> {
        docs.iter().map(|d| d["kind"].as_str().unwrap_or_default().to_owned()).collect()
    };
    let plain = render_chart("rel", "haptic-system", &[])?;
    for kind in [
        "StatefulSet",
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "IngressClass",
        "Secret",
        "HAProxyTemplateConfig",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ] {
        ensure!(kinds(&plain).iter().any(|k| k == kind), "no {kind} in {:?}", kinds(&plain));
    }
    // The controller's API is closed to the internet-facing HAProxy pods of its namespace.
    let api_policy = plain
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "rel-haptic-controller")
        .context("the controller's NetworkPolicy")?;
    let own_namespace = &api_policy["spec"]["ingress"][0]["from"][0]["podSelector"];
    ensure!(
        own_namespace["matchExpressions"][0]
            == json!({"key": "app.kubernetes.io/name", "operator": "NotIn", "values": ["haproxy"]}),
        "HAProxy pods may reach the controller's API: {api_policy}"
    );
    let statefulset = plain.iter().find(|d| d["kind"] == "StatefulSet").context("statefulset")?;
    let pod = &statefulset["spec"]["template"]["spec"];
    ensure!(pod["securityContext"]["runAsNonRoot"] == true, "controller runs as non-root");
    ensure!(pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] == true, "read-only root");
    ensure!(statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "journal", "journal PVC");
    // The Gateway API: watched types, RBAC for their status, the GatewayClass; CRDs only when asked.
    let gateway = render_chart("rel", "haptic-system", &["--set", "gatewayAPI.enabled=true"])?;
    ensure!(kinds(&gateway).iter().any(|k| k == "GatewayClass"), "no GatewayClass: {:?}", kinds(&gateway));
    ensure!(!kinds(&gateway).iter().any(|k| k == "Job"), "CRDs installed without being asked");
    ensure!(!kinds(&plain).iter().any(|k| k == "GatewayClass"), "the Gateway API is on by default");
    let config = gateway.iter().find(|d| d["kind"] == "HAProxyTemplateConfig").context("configuration")?;
    ensure!(config["spec"]["gatewayAPI"]["controllerName"] == "haptic.dev/gateway-controller");
    ensure!(config["spec"]["watchedResources"]["httproutes"]["kind"] == "HTTPRoute");
    let status_rule = gateway
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .find(|rule| rule["resources"].as_array().is_some_and(|r| r.iter().any(|r| r == "httproutes/status")));
    ensure!(status_rule.is_some_and(|rule| rule["verbs"].as_array().is_some_and(|v| v.iter().any(|v| v == "patch"))));
    let with_crds = render_chart(
        "rel",
        "haptic-system",
        &[
            "--set",
            "gatewayAPI.enabled=true",
            "--set",
            "gatewayAPI.installCRDs=true",
            "--set",
            "gatewayAPI.crds.channel=experimental",
        ],
    )?;
    let job = with_crds.iter().find(|d| d["kind"] == "Job").context("the CRD Job")?;
    let args = job["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    ensure!(
        args.contains(
            "https://github.com/kubernetes-sigs/gateway-api/releases/download/v1.6.3/experimental-install.yaml"
        ),
        "the Job applies {args}"
    );
    ensure!(job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade");
    let shaped = render_chart(
        "rel",
        "haptic-system",
        &["--set", "serviceMonitor.enabled=true", "--set", "haproxy.dataplane.existingSecret=mine"],
    )?;
    ensure!(kinds(&shaped).iter().any(|k| k == "ServiceMonitor"));
    ensure!(
        !shaped.iter().any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "rel-haptic-dataplane"),
        "an existing Secret is used, not generated"
    );
    ensure!(
        plain.iter().any(|d| d["kind"] == "Secret" && d["type"] == "kubernetes.io/tls"),
        "a default certificate is generated"
    );

    // The validator: an HAProxy and its Dataplane API from the HAProxy image beside the
    // controller, on the pod's loopback, its storage at the pods' paths, with a user of its own.
    let container = |name: &str| {
        pod["containers"].as_array().into_iter().flatten().find(|c| c["name"] == name).cloned().unwrap_or_default()
    };
    let validator = container("validator");
    ensure!(validator["image"] == "haproxytech/haproxy-debian:3.2", "the validator runs the pods' image: {validator}");
    ensure!(validator["securityContext"]["readOnlyRootFilesystem"] == true, "{validator}");
    let validator_haproxy = container("validator-haproxy");
    ensure!(validator_haproxy["command"][0] == "haproxy" && validator_haproxy["image"] == validator["image"]);
    let environment = container("controller")["env"].to_string();
    ensure!(
        environment.contains("http://127.0.0.1:5555/v3") && environment.contains("rel-haptic-validator"),
        "{environment}"
    );
    let validator_config = plain
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "rel-haptic-validator-bootstrap")
        .and_then(|d| d["data"]["dataplaneapi.yaml"].as_str())
        .context("the validator's dataplaneapi.yaml")?;
    for line in [
        "host: 127.0.0.1\n",
        "maps_dir: /etc/haproxy/maps\n",
        "ssl_certs_dir: /etc/haproxy/ssl\n",
        "master_runtime: \"/var/run/haproxy/master.sock\"\n",
    ] {
        ensure!(validator_config.contains(line), "no {line:?} in\n{validator_config}");
    }
    ensure!(plain.iter().any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "rel-haptic-validator"));
    let without = render_chart("rel", "haptic-system", &["--set", "webhook.validator.enabled=false"])?;
    let without_pod =
        &without.iter().find(|d| d["kind"] == "StatefulSet").context("statefulset")?["spec"]["template"]["spec"];
    ensure!(without_pod["containers"].as_array().is_some_and(|c| c.len() == 1), "{without_pod}");
    ensure!(!without_pod.to_string().contains("HAPTIC_VALIDATION_DATAPLANE"), "{without_pod}");

    // HAProxy 2.6 pods get runtime commands through the stats socket (master_runtime empty);
    // a misspelt choice fails the install rather than silently picking one.
    let dataplane_config = |docs: &[serde_json::Value]| -> Result<String> {
        let bootstrap = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "rel-haptic-haproxy-bootstrap")
            .context("no ConfigMap holds the pods' dataplaneapi.yaml")?;
        Ok(bootstrap["data"]["dataplaneapi.yaml"].as_str().unwrap_or_default().to_owned())
    };
    ensure!(dataplane_config(&plain)?.contains("master_runtime: \"/var/run/haproxy/master.sock\""));
    let stats = render_chart("rel", "haptic-system", &["--set", "haproxy.dataplane.runtimeCommands=statsSocket"])?;
    ensure!(dataplane_config(&stats)?.contains("master_runtime: \"\"\n"), "{}", dataplane_config(&stats)?);
    let misspelt = render_chart("rel", "haptic-system", &["--set", "haproxy.dataplane.runtimeCommands=stats"]);
    ensure!(
        misspelt.as_ref().is_err_and(|e| format!("{e:#}").contains("masterSocket or statsSocket")),
        "a misspelt haproxy.dataplane.runtimeCommands was rendered: {misspelt:?}"
    );

    // TLS to the Dataplane API: the pods serve https with their Secret (and require a client
    // certificate when asked), the controller's config names its CA Secret and may read it.
    let tls_values = [
        "--set",
        "haproxy.dataplane.tls.enabled=true",
        "--set",
        "haproxy.dataplane.tls.podSecretName=pods-tls",
        "--set",
        "haproxy.dataplane.tls.controllerSecretName=controller-tls",
        "--set",
        "haproxy.dataplane.tls.serverName=dataplane.example",
        "--set",
        "haproxy.dataplane.tls.requireClientCertificate=true",
    ];
    let tls = render_chart("rel", "haptic-system", &tls_values)?;
    let served = dataplane_config(&tls)?;
    for line in [
        "- https",
        "tls_certificate: \"/etc/haproxy-dataplane-tls/tls.crt\"",
        "tls_ca: \"/etc/haproxy-dataplane-tls/ca.crt\"",
    ] {
        ensure!(served.contains(line), "no {line:?} in\n{served}");
    }
    ensure!(dataplane_config(&plain)?.contains("tls_ca: \"\"\n"), "plain pods must not skip Basic auth");
    // TLS to the Dataplane API is on by default, with a Secret the controller makes once.
    ensure!(dataplane_config(&plain)?.contains("- https"), "the pods serve their Dataplane API over https by default");
    let plain_config = plain.iter().find(|d| d["kind"] == "HAProxyTemplateConfig").context("config")?;
    ensure!(
        plain_config["spec"]["dataplane"]["tls"]
            == json!({"secretRef": {"name": "rel-haptic-dataplane-tls"}, "serverName": "dataplane.haptic.internal"}),
        "{}",
        plain_config["spec"]["dataplane"]
    );
    let controller_args = plain
        .iter()
        .find(|d| d["kind"] == "StatefulSet")
        .map(|d| d["spec"]["template"]["spec"]["containers"][0]["args"].to_string())
        .unwrap_or_default();
    ensure!(
        controller_args.contains("--create-dataplane-tls=rel-haptic-dataplane-tls")
            && controller_args.contains("--dataplane-server-name=dataplane.haptic.internal"),
        "the controller makes the Secret: {controller_args}"
    );
    let tls_config = tls.iter().find(|d| d["kind"] == "HAProxyTemplateConfig").context("config")?;
    ensure!(
        tls_config["spec"]["dataplane"]["tls"]
            == json!({"secretRef": {"name": "controller-tls"}, "serverName": "dataplane.example"}),
        "{}",
        tls_config["spec"]["dataplane"]
    );
    let deployment = tls.iter().find(|d| d["kind"] == "Deployment").context("haproxy deployment")?;
    ensure!(
        deployment["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["secret"]["secretName"] == "pods-tls"),
        "the pods' certificate is mounted: {deployment}"
    );
    ensure!(
        tls.iter().any(|d| d["kind"] == "Role"
            && d["rules"].as_array().into_iter().flatten().any(|r| r["resources"][0] == "secrets"
                && r["resourceNames"].as_array().is_some_and(|n| n.contains(&json!("controller-tls"))))),
        "the controller may read its TLS Secret"
    );
    let half = render_chart("rel", "haptic-system", &tls_values[..4]);
    ensure!(
        half.as_ref().is_err_and(|e| format!("{e:#}").contains("controllerSecretName")),
        "TLS without the controller's Secret was rendered: {half:?}"
    );

    // Adding a watched type adds its RBAC rule, cluster-wide or in the namespaces it names.
    let watched = render_chart(
        "rel",
        "haptic-system",
        &[
            "--set",
            "config.watchedResources.widgets.apiVersion=example.com/v1",
            "--set",
            "config.watchedResources.widgets.kind=Widget",
            "--set",
            "config.watchedResources.gateways.apiVersion=gateway.networking.k8s.io/v1",
            "--set",
            "config.watchedResources.gateways.kind=Gateway",
            "--set",
            "config.watchedResources.gateways.namespaces={team-a}",
        ],
    )?;
    let cluster_role = watched.iter().find(|d| d["kind"] == "ClusterRole").context("cluster role")?;
    ensure!(
        cluster_role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["apiGroups"][0] == "example.com" && r["resources"][0] == "widgets"),
        "{cluster_role}"
    );
    let team_role = watched
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == "team-a")
        .context("team-a role")?;
    ensure!(team_role["rules"][0]["resources"][0] == "gateways", "{team_role}");
    let config = watched.iter().find(|d| d["kind"] == "HAProxyTemplateConfig").context("config")?;
    ensure!(config["spec"]["watchedResources"]["widgets"]["kind"] == "Widget");
    ensure!(
        config["spec"]["watchedResources"]["ingresses"].get("resource").is_none(),
        "RBAC hints stay out of the config"
    );

    // The CRD the chart ships is exactly what the binary generates.
    let generated = Command::new(env!("CARGO_BIN_EXE_haptic")).arg("crd").output()?;
    let shipped = std::fs::read_to_string(chart_dir().join("crds/haproxytemplateconfigs.haptic.dev.yaml"))?;
    ensure!(
        shipped == String::from_utf8(generated.stdout)?,
        "chart/crds is stale: regenerate it with `haptic crd > chart/crds/haproxytemplateconfigs.haptic.dev.yaml`"
    );
    Ok(())
}

async fn review(client: &kube::Client, user: &str, groups: &[String], attributes: serde_json::Value) -> Result<bool> {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}
    }))?;
    let answer = reviews.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[tokio::test]
async fn the_rendered_chart_is_accepted_and_its_service_account_can_do_exactly_what_the_controller_does() -> Result<()>
{
    let env = env::environment();
    let client = env.kube_client().await?;
    env::chart::apply_chart_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "chart").await?;
    let release = format!("r{}", namespace.rsplit('-').take(2).collect::<Vec<_>>().join(""));
    let documents = render_chart(&release, &namespace, &[])?;
    apply_all(&client, &documents).await?;
    let fullname = format!("{release}-haptic");

    let user = format!("system:serviceaccount:{namespace}:{fullname}");
    let groups = vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".to_owned(),
    ];
    let attributes = |verb: &str,
                      group: &str,
                      resource: &str,
                      ns: Option<&str>,
                      name: Option<&str>,
                      sub: Option<&str>| {
        json!({"verb": verb, "group": group, "resource": resource, "namespace": ns, "name": name, "subresource": sub})
    };
    let ns = Some(namespace.as_str());
    let secret = format!("{fullname}-dataplane");
    let tcp_services = format!("{fullname}-tcp-services");
    let allowed = [
        ("list", "networking.k8s.io", "ingresses", None, None, None),
        ("watch", "networking.k8s.io", "ingresses", None, None, None),
        ("list", "", "services", None, None, None),
        ("watch", "discovery.k8s.io", "endpointslices", None, None, None),
        ("list", "", "pods", ns, None, None),
        ("watch", "", "pods", ns, None, None),
        ("watch", "haptic.dev", "haproxytemplateconfigs", ns, None, None),
        ("patch", "haptic.dev", "haproxytemplateconfigs", ns, Some("haptic"), Some("status")),
        ("get", "", "secrets", ns, Some(secret.as_str()), None),
        // The credentials Secret, watched by name: a rotation is deployed with at once.
        ("watch", "", "secrets", ns, Some(secret.as_str()), None),
        // TLS certificates of Ingresses (listed with a type=kubernetes.io/tls field selector).
        ("list", "", "secrets", None, None, None),
        ("watch", "", "secrets", None, None, None),
        // No password given: the controller creates the credentials Secret once, if missing.
        ("create", "", "secrets", ns, None, None),
        ("create", "coordination.k8s.io", "leases", ns, None, None),
        ("patch", "coordination.k8s.io", "leases", ns, Some(fullname.as_str()), None),
        ("create", "events.k8s.io", "events", ns, None, None),
        // The TCP services ConfigMap, by name only (a list or watch with a metadata.name selector).
        ("list", "", "configmaps", ns, Some(tcp_services.as_str()), None),
        ("watch", "", "configmaps", ns, Some(tcp_services.as_str()), None),
        // A refused Ingress gets its Event in its own namespace.
        ("create", "events.k8s.io", "events", Some("team-b"), None, None),
        // The HTTP API checks its readers' tokens.
        ("create", "authentication.k8s.io", "tokenreviews", None, None, None),
        ("create", "authorization.k8s.io", "subjectaccessreviews", None, None, None),
    ];
    for (verb, group, resource, ns, name, sub) in allowed {
        ensure!(
            review(&client, &user, &groups, attributes(verb, group, resource, ns, name, sub)).await?,
            "{user} must be allowed to {verb} {group}/{resource} {name:?} {sub:?} in {ns:?}"
        );
    }
    let denied = [
        ("create", "", "secrets", Some("kube-system"), None, None),
        ("update", "", "secrets", ns, Some(secret.as_str()), None),
        ("delete", "", "secrets", Some("kube-system"), Some("any"), None),
        ("delete", "", "pods", ns, Some("haproxy-0"), None),
        ("list", "", "pods", Some("kube-system"), None, None),
        ("patch", "networking.k8s.io", "ingresses", ns, Some("web"), None),
        ("update", "haptic.dev", "haproxytemplateconfigs", ns, Some("haptic"), None),
        ("create", "apps", "deployments", ns, None, None),
        ("patch", "coordination.k8s.io", "leases", ns, Some("kube-controller-manager"), None),
        ("create", "rbac.authorization.k8s.io", "clusterroles", None, None, None),
        ("list", "", "configmaps", ns, None, None),
        ("get", "", "configmaps", ns, Some("kube-root-ca.crt"), None),
    ];
    for (verb, group, resource, ns, name, sub) in denied {
        ensure!(
            !review(&client, &user, &groups, attributes(verb, group, resource, ns, name, sub)).await?,
            "{user} must be denied to {verb} {group}/{resource} {name:?} in {ns:?}"
        );
    }

    // The real controller, authenticated as the ServiceAccount, runs the chart's configuration.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    // For the API server (no audience), or for haptic's HTTP API (audience `haptic`).
    let token_for = |account: String, audiences: Vec<&'static str>| {
        let accounts = accounts.clone();
        async move {
            let mut spec = json!({"expirationSeconds": 3600});
            if !audiences.is_empty() {
                spec["audiences"] = json!(audiences);
            }
            let request: TokenRequest = serde_json::from_value(json!({"spec": spec}))?;
            anyhow::Ok(
                accounts
                    .create_subresource::<TokenRequest, TokenRequest>(
                        "token",
                        &account,
                        &PostParams::default(),
                        &request,
                    )
                    .await?
                    .status
                    .context("no token issued")?
                    .token,
            )
        }
    };
    let token = token_for(fullname.clone(), vec![]).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let admin = std::fs::read_to_string(&env.kubeconfig)?;
    let admin_token =
        admin.lines().find_map(|l| l.trim().strip_prefix("token:")).context("admin token")?.trim().to_owned();
    std::fs::write(&kubeconfig, admin.replace(&admin_token, &token))?;
    // As the chart runs it when given no password: the credentials Secret made once, here.
    let launch = Launch {
        args: vec![
            "--leader-election-lease".into(),
            fullname.clone(),
            "--create-dataplane-secret".into(),
            secret.clone(),
            "--dataplane-username".into(),
            "haptic".into(),
            "--create-dataplane-tls".into(),
            format!("{fullname}-dataplane-tls"),
        ],
        kubeconfig: Some(kubeconfig),
        // The API as the chart runs it: over TLS (a certificate made at start), readers need a
        // token allowed by the reader role.
        env: vec![("HAPTIC_API_AUTH".into(), "kubernetes".into()), ("HAPTIC_API_PLAINTEXT".into(), "false".into())],
    };
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "haptic", dir, &journal, &launch)?;
    controller
        .wait_for_config("the chart's default configuration", Duration::from_secs(60), |cfg| {
            cfg.contains("frontend health")
        })
        .await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = configs.get_status("haptic").await?.status.unwrap_or_default();
        let has = |t: &str, s: &str| status.conditions.iter().any(|c| c.type_ == t && c.status == s);
        if has("Valid", "True") && has("Rendered", "True") {
            break;
        }
        if Instant::now() > deadline {
            bail!("the ServiceAccount's controller did not report its status: {status:?}\n{}", controller.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = controller.log_text();
    ensure!(
        log.contains("became the leader"),
        "the ServiceAccount could not take the Lease:\n{}",
        controller.log_tail()
    );
    ensure!(!log.contains("forbidden") && !log.contains("Forbidden"), "a request was forbidden:\n{log}");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &namespace);
    let made = secrets.get(&secret).await.context("the controller made no credentials Secret")?;
    let password = made.data.as_ref().and_then(|d| d.get("dataplane_password")).context("no password")?.0.clone();
    ensure!(password.len() == 32, "a password of {} bytes", password.len());
    ensure!(log.contains("created the Dataplane credentials Secret"), "the creation was not said");
    let tls = secrets.get(&format!("{fullname}-dataplane-tls")).await.context("the controller made no TLS Secret")?;
    ensure!(tls.type_.as_deref() == Some("kubernetes.io/tls"), "{:?}", tls.type_);
    let keys: Vec<&String> = tls.data.as_ref().map(|d| d.keys().collect()).unwrap_or_default();
    ensure!(keys == ["ca.crt", "tls.crt", "tls.key"], "{keys:?}");
    ensure!(log.contains("created the Dataplane TLS Secret"), "the creation was not said");

    // Its API: open health; pods and metrics only with a token of a user the chart's reader
    // role is bound to (real ServiceAccount tokens, reviewed by the real API server).
    for account in ["reader", "stranger"] {
        let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": account}}))?;
        accounts.create(&PostParams::default(), &account).await?;
    }
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    let binding_name = format!("{fullname}-{namespace}-reader");
    let binding = serde_json::from_value(json!({
        "metadata": {"name": binding_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{fullname}-api-reader")},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]
    }))?;
    bindings.create(&PostParams::default(), &binding).await?;
    let reader = token_for("reader".into(), vec!["haptic"]).await?;
    let stranger = token_for("stranger".into(), vec!["haptic"]).await?;
    // The reader's token for the API server itself: never haptic's to accept (nor to replay).
    let reader_for_apiserver = token_for("reader".into(), vec![]).await?;
    let api = controller.api_url().await?;
    ensure!(api.starts_with("https://"), "the API speaks TLS by default: {api}");
    ensure!(
        log.contains("self-signed certificate") && log.contains("sha256="),
        "its certificate's fingerprint is logged"
    );
    let plain = reqwest::Client::new().get(format!("{}/metrics", api.replacen("https", "http", 1))).send().await;
    ensure!(plain.is_err(), "plain http is not answered: {plain:?}");
    // The certificate is self-signed: the fingerprint in the log is what an operator compares.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).danger_accept_invalid_certs(true).build()?;
    let status_of = |path: &str, token: Option<&str>| {
        let mut request = http.get(format!("{api}{path}"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { anyhow::Ok(request.send().await?.status().as_u16()) }
    };
    let health = controller.health_url().await?;
    for path in ["/healthz", "/readyz"] {
        let status = http.get(format!("{health}{path}")).send().await?.status().as_u16();
        ensure!(status == 200, "{path} must stay open on the health port: {status}");
    }
    ensure!(status_of("/healthz", None).await? == 404, "health is not on the API port");
    for path in ["/api/v1/pods", "/api/v1/config", "/metrics"] {
        let cases = [
            (None, 401, "no token"),
            (Some("not-a-token"), 401, "a token the cluster does not know"),
            // Bound to haptic's audience, but for /metrics, which Prometheus reads with its own.
            (
                Some(reader_for_apiserver.as_str()),
                if path == "/metrics" { 200 } else { 401 },
                "a reader's token for the API server",
            ),
            (Some(stranger.as_str()), 403, "a ServiceAccount without the reader role"),
            (Some(reader.as_str()), 200, "a ServiceAccount with the reader role"),
        ];
        for (token, expected, who) in cases {
            let got = status_of(path, token).await?;
            ensure!(got == expected, "{path} with {who}: {got}, expected {expected}");
        }
    }
    let log = controller.log_text();
    for secret in [&reader, &stranger] {
        ensure!(!log.contains(secret.as_str()), "a token reached the controller's log");
    }
    bindings.delete(&binding_name, &Default::default()).await?;
    Ok(())
}

#[test]
fn the_default_library_renders_the_example_ingresses_of_its_class_into_a_config_haproxy_accepts() -> Result<()> {
    let documents = render_chart("rel", "haptic-system", &[])?;
    let mut config = documents.into_iter().find(|d| d["kind"] == "HAProxyTemplateConfig").context("no config")?;
    let out = tempfile::tempdir()?;
    config["spec"]["dataplane"]["mapsDir"] = json!(out.path().join("maps").display().to_string());
    config["spec"]["dataplane"]["generalDir"] = json!(out.path().join("files").display().to_string());
    let config_file = out.path().join("config.json");
    std::fs::write(&config_file, serde_json::to_string(&config)?)?;
    // The examples plus an Ingress of another class, which the library must ignore.
    let resources = out.path().join("resources");
    std::fs::create_dir_all(&resources)?;
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/resources"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), resources.join(entry.file_name()))?;
    }
    std::fs::write(
        resources.join("other-class.json"),
        serde_json::to_string(&json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "elsewhere", "namespace": "web"},
            "spec": {"ingressClassName": "nginx", "rules": [{"host": "other.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}]}
        }))?,
    )?;
    let rendered = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["render", "--config"])
        .arg(&config_file)
        .arg("--resources")
        .arg(&resources)
        .arg("--out")
        .arg(out.path())
        .output()?;
    ensure!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    let host_map = std::fs::read_to_string(out.path().join("maps/host-prefix.map"))?;
    ensure!(host_map.contains("shop.example.com/api/ "), "{host_map}");
    ensure!(!host_map.contains("other.example.com"), "an Ingress of another class was routed:\n{host_map}");
    // Long-lived connections: old workers keep theirs after a reload, tunnels their idle limit.
    let config = std::fs::read_to_string(out.path().join("haproxy.cfg"))?;
    for line in ["hard-stop-after 30m", "timeout tunnel 1h"] {
        ensure!(config.contains(line), "no {line:?} in the library's haproxy.cfg");
    }
    for haproxy in haproxy_binaries()? {
        let check = Command::new(&haproxy).arg("-c").arg("-f").arg(out.path().join("haproxy.cfg")).output()?;
        ensure!(
            check.status.success(),
            "{} -c refused the library's render:\n{}{}",
            haproxy.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    Ok(())
}

/// `haptic validate` on `config` with `haproxy`: (success, stdout, stderr).
fn validate(config: &serde_json::Value, haproxy: &std::path::Path) -> Result<(bool, String, String)> {
    let dir = tempfile::tempdir()?;
    let config_file = dir.path().join("config.json");
    std::fs::write(&config_file, serde_json::to_string(config)?)?;
    let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["validate", "--config"])
        .arg(&config_file)
        .arg("--haproxy")
        .arg(haproxy)
        .output()?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    Ok((output.status.success(), text(&output.stdout), text(&output.stderr)))
}

/// The library's own validation tests (chart/library/validation-tests.yaml) ship in the
/// chart's configuration and pass, requests included, on every HAProxy of the environment.
#[test]
fn the_default_library_ships_validation_tests_that_pass_on_every_haproxy() -> Result<()> {
    let config_with = |values: &[&str]| -> Result<serde_json::Value> {
        render_chart("rel", "haptic-system", values)?
            .into_iter()
            .find(|d| d["kind"] == "HAProxyTemplateConfig")
            .context("no config")
    };
    let config = config_with(&[])?;
    let tests = config["spec"]["validationTests"].as_array().map_or(0, Vec::len);
    ensure!(tests >= 4, "the chart's configuration ships {tests} validation tests");
    let binaries = haproxy_binaries()?;
    for haproxy in &binaries {
        let (passed, stdout, stderr) = validate(&config, haproxy)?;
        ensure!(
            passed && stdout.lines().filter(|l| l.starts_with("ok ")).count() == tests,
            "the library's validation tests with {}:\n{stdout}{stderr}",
            haproxy.display()
        );
        ensure!(!stdout.contains("skipped"), "every request ran:\n{stdout}");
    }
    // Another IngressClass: the shipped fixtures follow it.
    let (passed, stdout, _) = validate(&config_with(&["--set", "ingressClass.name=internal"])?, &binaries[0])?;
    ensure!(passed, "with class internal:\n{stdout}");
    // The tests do catch a broken library: a route that loses its prefix.
    let mut broken = config.clone();
    ensure!(broken["spec"]["templates"]["maps"]["host-prefix.map"].as_str().is_some_and(|t| !t.is_empty()));
    broken["spec"]["templates"]["maps"]["host-prefix.map"] = json!("");
    let (passed, _, stderr) = validate(&broken, &binaries[0])?;
    ensure!(!passed, "a library without prefix routes passed its tests");
    ensure!(
        stderr.contains("validation test \"host-and-prefix-routing\", assertion 0: maps/host-prefix.map has no entry \"shop.example.com/api/\"")
            && stderr.contains("GET shop.example.com/api/orders?page=2: no backend took it"),
        "{stderr}"
    );
    Ok(())
}

/// The same tests as the chart's controller runs them inside a cluster: requests through the
/// validator (the environment's, configured as the chart's containers are; the chart's paths
/// moved to where the environment's pods and validator keep their files).
#[tokio::test]
async fn the_default_library_tests_pass_through_the_validator() -> Result<()> {
    let env = env::environment();
    let paths = [
        "haproxy.paths.maps=/var/run/haproxy/maps",
        "haproxy.paths.general=/var/run/haproxy/general",
        "haproxy.paths.certs=/var/run/haproxy/ssl",
    ];
    let values: Vec<&str> = paths.iter().flat_map(|set| ["--set", set]).collect();
    let config = render_chart("rel", "haptic-system", &values)?
        .into_iter()
        .find(|d| d["kind"] == "HAProxyTemplateConfig")
        .context("no config")?;
    let config: HAProxyTemplateConfig = serde_json::from_value(config)?;
    let renderer = haptic::render::Renderer::compile(&config.spec)?;
    let credentials = haptic::dataplane::Credentials::new(&env.validator.username, &env.validator.password);
    let api = haptic::checks::validator::ValidatorApi::new(&env.validator.dataplane_url, credentials)?;
    let requests = haptic::checks::Requests::Validator(std::sync::Arc::new(api));
    let report = haptic::checks::run(&config.spec, &renderer, &[], Some(&requests)).await;
    ensure!(report.passed(), "{}", report.summary());
    let skipped: usize = report.tests.iter().map(|t| t.skipped).sum();
    ensure!(report.tests.len() >= 4 && skipped == 0, "{} tests, {skipped} requests skipped", report.tests.len());
    Ok(())
}

/// The environment's simulated pods (tests/env/pod.json) are probed as the chart's pods are:
/// same containers' readiness probes and the ports they name, so the prober (kubelet's part in
/// the environment) judges them as kubelet would judge the chart's.
#[test]
fn the_simulated_pods_declare_the_charts_readiness_probes() -> Result<()> {
    let values = ["--set", "haproxy.ports.http=8080", "--set", "haproxy.ports.health=8404"];
    let deployment = render_chart("rel", "haptic-system", &values)?
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .context("the chart has no HAProxy Deployment")?;
    let simulated: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/pod.json"))?)?;
    let probes = |containers: &serde_json::Value| -> Vec<(String, serde_json::Value, Vec<serde_json::Value>)> {
        containers
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let named: Vec<serde_json::Value> = c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["name"] != "https" && p["name"] != "http")
                    .cloned()
                    .collect();
                (c["name"].as_str().unwrap_or_default().to_owned(), c["readinessProbe"].clone(), named)
            })
            .collect()
    };
    let chart = probes(&deployment["spec"]["template"]["spec"]["containers"]);
    let env = probes(&simulated["spec"]["containers"]);
    assert_eq!(env, chart, "tests/env/pod.json must declare the chart's probes");
    Ok(())
}

/// `haptic diff` between renders of the chart's library: the same render is no change; a new
/// route to a Service that has a backend is map entries only; a Service scaled within its slots
/// is server changes only; an Ingress with settings of its own (a new backend) is a reload.
#[test]
fn haptic_diff_names_map_server_and_reload_changes_between_renders() -> Result<()> {
    let documents = render_chart("rel", "haptic-system", &[])?;
    let config = documents.into_iter().find(|d| d["kind"] == "HAProxyTemplateConfig").context("no config")?;
    let work = tempfile::tempdir()?;
    let config_file = work.path().join("config.json");
    std::fs::write(&config_file, serde_json::to_string(&config)?)?;
    let resources = work.path().join("resources");
    std::fs::create_dir_all(&resources)?;
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/resources"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), resources.join(entry.file_name()))?;
    }
    let render = |name: &str| -> Result<std::path::PathBuf> {
        let out = work.path().join(name);
        let rendered = Command::new(env!("CARGO_BIN_EXE_haptic"))
            .args(["render", "--config"])
            .arg(&config_file)
            .arg("--resources")
            .arg(&resources)
            .arg("--out")
            .arg(&out)
            .output()?;
        ensure!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
        Ok(out)
    };
    let diff = |before: &std::path::Path, after: &std::path::Path| -> Result<String> {
        let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
            .args(["diff", "--before"])
            .arg(before)
            .arg("--after")
            .arg(after)
            .output()?;
        ensure!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        Ok(String::from_utf8(output.stdout)?)
    };
    let add = |file: &str, object: serde_json::Value| std::fs::write(resources.join(file), object.to_string());
    let first = render("first")?;
    ensure!(diff(&first, &first)? == "no change\n", "the same render is a change");

    add(
        "route.json",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "more", "namespace": "web"},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": "more.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "storefront", "port": {"number": 80}}}}]}}]}
        }),
    )?;
    let routed = render("routed")?;
    let said = diff(&first, &routed)?;
    ensure!(
        said.starts_with("runtime:")
            && said.contains("add map host-prefix.map more.example.com/")
            && !said.contains("server"),
        "a new route to a Service with a backend:\n{said}"
    );

    add(
        "scaled.json",
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "storefront-more", "namespace": "web", "labels": {"kubernetes.io/service-name": "storefront"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.0.1.12"], "conditions": {"ready": true}}]
        }),
    )?;
    let scaled = render("scaled")?;
    let said = diff(&routed, &scaled)?;
    ensure!(
        said.starts_with("runtime:") && said.contains("10.0.1.12") && !said.contains("map"),
        "a Service scaled within its slots:\n{said}"
    );

    add(
        "settings.json",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "slow", "namespace": "web", "annotations": {"haptic.dev/timeout-server": "5s"}},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": "slow.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "storefront", "port": {"number": 80}}}}]}}]}
        }),
    )?;
    let reloading = render("reloading")?;
    let said = diff(&scaled, &reloading)?;
    ensure!(said == "reload: configuration\n", "an Ingress with a backend of its own:\n{said}");
    Ok(())
}
