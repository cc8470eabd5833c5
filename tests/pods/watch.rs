//! Watching and rendering against the real API server, through the real `haptic run`:
//! the CRD's schema, renders following a built-in and a custom resource type, coalescing of
//! bursts, and an invalid configuration reported while the previous one keeps working.

use crate::env;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use env::controller::{ControllerProcess, ensure_crd, ensure_haptic_crd};
use haptic::config::HAProxyTemplateConfig;
use haptic::dataplane::PushMode;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const TEMPLATE: &str = "{% for s in resources.services %}service {{ s.metadata.name | bare_word }} {{ s.spec.ports[0].port }}\n{% endfor %}\
{% for w in resources.widgets %}widget {{ w.metadata.name | bare_word }} {{ w.spec.size }}\n{% endfor %}";

fn config(namespace: &str, template: &str) -> Value {
    json!({
        "apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyTemplateConfig",
        "metadata": {"name": "test", "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "watchedResources": {
                "services": {"apiVersion": "v1", "kind": "Service", "namespaces": [namespace]},
                "widgets": {"apiVersion": "test.haptic.dev/v1", "kind": "Widget", "namespaces": [namespace]}
            },
            "dataplane": {"debounce": {"window": "300ms", "maxDelay": "2s"}},
            "templates": {"haproxyConfig": template}
        }
    })
}

async fn ensure_widget_crd(client: &kube::Client) -> Result<()> {
    let crd = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.haptic.dev"},
        "spec": {
            "group": "test.haptic.dev", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }}}]
        }
    }))?;
    ensure_crd(client, crd).await
}

fn widgets(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("test.haptic.dev", "v1", "Widget"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

fn service(name: &str, port: u16) -> Result<Service> {
    Ok(serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"ports": [{"port": port}]}}))?)
}

async fn create_config(client: &kube::Client, namespace: &str, template: &str) -> Result<Api<HAProxyTemplateConfig>> {
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), namespace);
    configs.create(&PostParams::default(), &serde_json::from_value(config(namespace, template))?).await?;
    Ok(configs)
}

#[tokio::test]
async fn the_crd_schema_refuses_malformed_configurations() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "crd-schema").await?;
    // Sent as raw objects: our own types would refuse these before the API server sees them.
    let raw: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyTemplateConfig")),
    );
    let malformed = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut value = config(&namespace, "x");
        value["metadata"]["name"] = json!(name);
        edit(&mut value);
        value
    };
    let cases = [
        ("port 70000", malformed("bad-port", &|v| v["spec"]["dataplane"]["port"] = json!(70000))),
        (
            "alias Bad-Alias",
            malformed("bad-alias", &|v| {
                v["spec"]["watchedResources"]["Bad-Alias"] = v["spec"]["watchedResources"]["services"].clone()
            }),
        ),
        (
            "duration 'a minute'",
            malformed("bad-duration", &|v| v["spec"]["dataplane"]["driftPreventionInterval"] = json!("a minute")),
        ),
        (
            "no templates",
            malformed("no-templates", &|v| {
                v["spec"].as_object_mut().map(|spec| spec.remove("templates"));
            }),
        ),
        ("empty podSelector labels", malformed("no-labels", &|v| v["spec"]["podSelector"]["matchLabels"] = json!({}))),
    ];
    for (what, value) in cases {
        match raw.create(&PostParams::default(), &serde_json::from_value(value)?).await {
            Err(kube::Error::Api(status)) if status.code == 422 => {}
            other => bail!("{what} should be refused by the API server, got {other:?}"),
        }
    }
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let valid: HAProxyTemplateConfig = serde_json::from_value(config(&namespace, "global\n"))?;
    configs.create(&PostParams::default(), &valid).await.context("a valid configuration is accepted")?;
    Ok(())
}

#[tokio::test]
async fn renders_follow_a_builtin_and_a_custom_resource_and_bursts_coalesce() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    ensure_widget_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "renders-follow").await?;
    create_config(&client, &namespace, TEMPLATE).await?;
    let controller = ControllerProcess::start(env, &namespace, "test")?;
    let long = Duration::from_secs(30);
    controller.wait_for_config("the first render", long, |_| !controller.renders().is_empty()).await?;

    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    services.create(&PostParams::default(), &service("alpha", 80)?).await?;
    controller.wait_for_config("a created Service", long, |cfg| cfg.contains("service alpha 80")).await?;

    let widgets = widgets(&client, &namespace);
    let widget = serde_json::from_value(json!({"apiVersion": "test.haptic.dev/v1", "kind": "Widget",
                                               "metadata": {"name": "gear"}, "spec": {"size": 3}}))?;
    widgets.create(&PostParams::default(), &widget).await?;
    controller.wait_for_config("a created Widget", long, |cfg| cfg.contains("widget gear 3")).await?;
    widgets.patch("gear", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 5}}))).await?;
    controller.wait_for_config("a changed Widget", long, |cfg| cfg.contains("widget gear 5")).await?;
    widgets.delete("gear", &DeleteParams::default()).await?;
    controller.wait_for_config("a deleted Widget", long, |cfg| !cfg.contains("widget gear")).await?;

    // A burst of 30 creations: the first renders at once, the rest together at the end.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = controller.renders().len();
    for i in 0..30 {
        services.create(&PostParams::default(), &service(&format!("burst-{i:02}"), 8000 + i)?).await?;
    }
    controller
        .wait_for_config("the burst", long, |cfg| (0..30).all(|i| cfg.contains(&format!("service burst-{i:02} "))))
        .await?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let burst_renders = controller.renders().len() - before;
    assert!(
        (1..=3).contains(&burst_renders),
        "30 changes in a burst gave {burst_renders} renders (expected a leading and a trailing one, and at most one \
         more at maxDelay)\n{}",
        controller.log_tail()
    );
    Ok(())
}

async fn wait_for_condition(
    configs: &Api<HAProxyTemplateConfig>,
    generation: i64,
    status: &str,
    reason: &str,
) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let config = configs.get_status("test").await?;
        if let Some(found) = config.status.as_ref().filter(|s| s.observed_generation == Some(generation))
            && let Some(valid) = found.conditions.iter().find(|c| c.type_ == "Valid")
            && valid.status == status
            && valid.reason == reason
        {
            return Ok(valid.message.clone());
        }
        if std::time::Instant::now() > deadline {
            bail!("no Valid={status} ({reason}) for generation {generation}: {:?}", config.status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_invalid_configuration_is_reported_and_the_previous_one_keeps_working() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    ensure_widget_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "invalid-config").await?;
    let configs = create_config(&client, &namespace, TEMPLATE).await?;
    let controller = ControllerProcess::start(env, &namespace, "test")?;
    wait_for_condition(&configs, 1, "True", "Accepted").await?;

    let broken = Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": "{% for s in %}"}}}));
    configs.patch("test", &PatchParams::default(), &broken).await?;
    let message = wait_for_condition(&configs, 2, "False", "TemplateError").await?;
    assert!(message.contains("template haproxy.cfg line 1"), "{message}");
    assert!(message.contains("previous valid configuration stays in force"), "{message}");

    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    services.create(&PostParams::default(), &service("still-served", 80)?).await?;
    controller
        .wait_for_config("a change under the previous configuration", Duration::from_secs(30), |cfg| {
            cfg.contains("service still-served 80")
        })
        .await?;

    let unknown = Patch::Merge(json!({"spec": {
        "watchedResources": {"gadgets": {"apiVersion": "test.haptic.dev/v1", "kind": "Gadget"}},
        "templates": {"haproxyConfig": TEMPLATE}}}));
    configs.patch("test", &PatchParams::default(), &unknown).await?;
    let message = wait_for_condition(&configs, 3, "False", "UnknownResource").await?;
    assert!(message.contains("spec.watchedResources.gadgets"), "{message}");

    let fixed = Patch::Merge(json!({"spec": {
        "watchedResources": {"gadgets": null},
        "templates": {"haproxyConfig": "fixed\n{% for s in resources.services %}svc {{ s.metadata.name | bare_word }}\n{% endfor %}"}}}));
    configs.patch("test", &PatchParams::default(), &fixed).await?;
    wait_for_condition(&configs, 4, "True", "Accepted").await?;
    controller
        .wait_for_config("the fixed configuration", Duration::from_secs(30), |cfg| {
            cfg.starts_with("fixed\nsvc still-served")
        })
        .await?;
    Ok(())
}

#[tokio::test]
async fn templates_see_the_ready_haproxy_pods_and_follow_their_readiness() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    ensure_widget_crd(&client).await?;
    // Readiness comes from the pods' real probes (the environment's prober, as kubelet): a pod
    // whose HAProxy answers its readiness port is Ready.
    for (pod, backend) in env.pods.iter().zip(env.backends.iter().cycle()) {
        let dataplane = env.dataplane(pod);
        env::push_raw_at_current_version(&dataplane, &env::config_routing_to(backend), PushMode::ForceReload).await?;
    }
    let namespace = env.fresh_namespace(&client, "pods-context").await?;
    let template = "{% for p in pods %}pod {{ p.name | bare_word }} {{ p.ip | bare_word }}\n{% endfor %}";
    create_config(&client, &namespace, template).await?;
    let controller = ControllerProcess::start(env, &namespace, "test")?;
    let long = Duration::from_secs(30);
    let all: Vec<String> = env.pods.iter().map(|p| format!("pod {} {}\n", p.name, p.ip)).collect();
    controller.wait_for_config("every registered pod", long, |cfg| cfg == all.concat()).await?;

    // Its HAProxy back on the bootstrap configuration, the first pod fails its probe.
    let first = &env.pods[0];
    env.reset_to_bootstrap(first).await?;
    controller
        .wait_for_config("a pod that is no longer Ready", long, |cfg| {
            !cfg.contains(&format!("pod {} ", first.name)) && cfg.lines().count() == env.pods.len() - 1
        })
        .await?;
    Ok(())
}
