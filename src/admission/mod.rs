//! Admission: what an object not yet stored would do to the render, judged before the API
//! server stores it. The configuration is rendered with the proposed object in place of the
//! stored one (a dry run: nothing of it is kept); the object is refused when the render would
//! leave it out (a value HAProxy cannot take, as the controller would refuse it after the fact)
//! or would fail, and when HAProxy would refuse the result. The same for a new version of the
//! followed `HAProxyTemplateConfig`: its checks, its validation tests, and its render of the
//! current objects. Pure but for the HAProxy check, which `Validator` leaves to the caller: a
//! local HAProxy binary (`LocalHaproxy`) or a scratch Dataplane API beside the controller
//! (`checks::validator::ValidatorApi`).

pub mod culprits;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;

use crate::config::HAProxyTemplateConfigSpec;
use crate::files::FileSet;
use crate::render::{PodInfo, Renderer};
use crate::store::{ObjectKey, ResourceStore, Stores, object_key};

/// How many objects already refused a review's render may leave out (as the controller's).
const MAX_LEFT_OUT: usize = 100;

/// What the controller renders from, as the webhook sees it at one instant.
#[derive(Clone)]
pub struct Snapshot {
    /// The configuration version in force.
    pub generation: i64,
    /// Its spec.
    pub spec: HAProxyTemplateConfigSpec,
    /// Its templates.
    pub renderer: Arc<Renderer>,
    /// The stores now.
    pub stores: Stores,
    /// The ready HAProxy pods now.
    pub pods: Vec<PodInfo>,
}

/// The change asked for.
#[derive(Clone, Debug)]
pub struct Proposal {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    /// The object as it would be stored (absent for a deletion).
    pub object: Option<Json>,
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through; the note says why when nothing was rendered.
    Allowed(Option<String>),
    /// Refuse it, saying why.
    Denied(String),
    /// Let it through, with Warnings for whoever wrote it (annotations haptic does not implement).
    Warned(Vec<String>),
}

/// The render a proposal leads to, still to be checked by HAProxy; or the verdict already.
pub enum Judged {
    /// A render to validate, and the Warnings the object earns if it is admitted.
    Render(FileSet, Vec<String>),
    /// Decided without HAProxy.
    Decided(Verdict),
}

/// Whether the watched resource `alias` takes `object` (type, namespaces, selectors).
fn takes(spec: &HAProxyTemplateConfigSpec, alias: &str, object: &Json) -> bool {
    let Some(watched) = spec.watched_resources.get(alias) else { return false };
    let text = |pointer: &str| object.pointer(pointer).and_then(Json::as_str).unwrap_or_default();
    if text("/apiVersion") != watched.api_version || text("/kind") != watched.kind {
        return false;
    }
    let namespace = text("/metadata/namespace");
    if watched.namespaces.as_ref().is_some_and(|n| !n.iter().any(|n| n == namespace)) {
        return false;
    }
    let labels = crate::store::selector::LabelSelector::parse(watched.label_selector.as_deref().unwrap_or_default());
    let fields = crate::store::selector::FieldSelector::parse(watched.field_selector.as_deref().unwrap_or_default());
    matches!((labels, fields), (Ok(labels), Ok(fields)) if labels.matches(object) && fields.matches(object))
}

/// Renders `snapshot` with `proposal` in place of the stored object.
pub fn judge_object(snapshot: &Snapshot, proposal: &Proposal) -> Judged {
    let Some(object) = proposal.object.as_ref().filter(|_| proposal.operation != "DELETE") else {
        return Judged::Decided(Verdict::Allowed(Some("deletions are not judged".into())));
    };
    let aliases: Vec<&String> =
        snapshot.spec.watched_resources.keys().filter(|alias| takes(&snapshot.spec, alias, object)).collect();
    if aliases.is_empty() {
        return Judged::Decided(Verdict::Allowed(Some("not watched by this configuration".into())));
    }
    let Some(key) = object_key(object) else {
        return Judged::Decided(Verdict::Denied("the object has no name".into()));
    };
    let mut stores = snapshot.stores.clone();
    for alias in aliases {
        if let Some(store) = stores.get_mut(alias) {
            let mut proposed = ResourceStore::clone(store);
            if let Err(error) = proposed.apply(object.clone()) {
                return Judged::Decided(Verdict::Denied(format!("it cannot be read: {error}")));
            }
            *store = Arc::new(proposed);
        }
    }
    let kind = object.get("kind").and_then(Json::as_str).unwrap_or_default();
    match snapshot.renderer.render_dry_leaving_out(&stores, &snapshot.pods, MAX_LEFT_OUT) {
        Ok(render) => {
            let own = render.left_out.iter().find(|error| is(error.offending_object(), kind, &key));
            match own {
                Some(error) => Judged::Decided(Verdict::Denied(format!("haptic would leave it out: {error}"))),
                None => {
                    let warnings = render
                        .notices
                        .iter()
                        .filter(|notice| is(Some(&notice.object), kind, &key))
                        .map(|notice| notice.message.clone())
                        .collect();
                    Judged::Render(render.files, warnings)
                }
            }
        }
        Err(error) => Judged::Decided(Verdict::Denied(format!("the configuration would not render with it: {error}"))),
    }
}

fn is(object: Option<&crate::store::ObjectRef>, kind: &str, key: &ObjectKey) -> bool {
    object.is_some_and(|object| &*object.kind == kind && object.key == *key)
}

/// Judges a new version of the followed configuration: its checks, its templates, its
/// validation tests' file assertions, and its render of the current objects (still to be
/// checked by HAProxy).
pub fn judge_config(spec: &HAProxyTemplateConfigSpec, current: Option<&Snapshot>) -> Judged {
    let problems = crate::config::validate::problems(spec);
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Judged::Decided(Verdict::Denied(lines.join("; ")));
    }
    let renderer = match Renderer::compile(spec) {
        Ok(renderer) => renderer,
        Err(error) => return Judged::Decided(Verdict::Denied(error.to_string())),
    };
    // The same file checks the controller runs before activating it (no HAProxy is asked:
    // nothing here awaits anything but the renders).
    let report = futures::executor::block_on(crate::checks::run(spec, &renderer, &[], None));
    if !report.passed() {
        return Judged::Decided(Verdict::Denied(report.summary()));
    }
    // Its render of the objects in the stores now, when the watched types are the same.
    let Some(current) = current.filter(|c| c.spec.watched_resources == spec.watched_resources) else {
        return Judged::Decided(Verdict::Allowed(Some("its render waits for its own watches".into())));
    };
    renderer.seed_slots(current.renderer.slots());
    match renderer.render_dry_leaving_out(&current.stores, &current.pods, MAX_LEFT_OUT) {
        Ok(render) => Judged::Render(render.files, Vec::new()),
        Err(error) => Judged::Decided(Verdict::Denied(format!("it would not render the current objects: {error}"))),
    }
}

/// What a validator made of a render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// HAProxy accepts it.
    Accepted,
    /// HAProxy refuses it: its alerts, at the rendered file's lines.
    Refused(String),
    /// The validator could not be asked (it is down, or cannot run): the render stays unchecked,
    /// which is haptic's trouble, not the object's.
    Unavailable(String),
}

/// Checks a render with HAProxy, the last step of a judgement.
pub trait Validator: Send + Sync {
    /// What HAProxy makes of `files`.
    fn validate<'a>(
        &'a self,
        files: &'a FileSet,
        spec: &'a HAProxyTemplateConfigSpec,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Check> + Send + 'a>>;
}

/// Validation by a local HAProxy binary (`haproxy -c` on the render, made runnable here).
pub struct LocalHaproxy(pub std::path::PathBuf);

impl Validator for LocalHaproxy {
    fn validate<'a>(
        &'a self,
        files: &'a FileSet,
        spec: &'a HAProxyTemplateConfigSpec,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Check> + Send + 'a>> {
        use crate::checks::haproxy::HaproxyError;
        Box::pin(async move {
            match crate::checks::haproxy::check(Path::new(&self.0), files, &spec.dataplane).await {
                Ok(()) => Check::Accepted,
                Err(error @ (HaproxyError::Spawn { .. } | HaproxyError::Scratch { .. })) => {
                    Check::Unavailable(error.to_string())
                }
                Err(error) => Check::Refused(error.to_string()),
            }
        })
    }
}

impl Validator for crate::checks::validator::ValidatorApi {
    fn validate<'a>(
        &'a self,
        files: &'a FileSet,
        _spec: &'a HAProxyTemplateConfigSpec,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Check> + Send + 'a>> {
        use crate::checks::validator::Verdict as Checked;
        Box::pin(async move {
            match self.check(files).await {
                Ok(Checked::Accepted) => Check::Accepted,
                Ok(Checked::Refused(message)) => Check::Refused(message),
                Err(error) => Check::Unavailable(format!("the validator's Dataplane API: {error}")),
            }
        })
    }
}

/// `judge`, for an object: when HAProxy refuses the render with it, the render of the objects
/// as they are (`current`) is checked too, and when HAProxy refuses that as well the object is
/// not what breaks it and is let through (the controller leaves the objects HAProxy refuses
/// out, with an Event on each). One tenant's bad object cannot make every other write refused.
pub async fn judge_beside_current(judged: Judged, current: Snapshot, validator: Option<&dyn Validator>) -> Verdict {
    let verdict = judge(judged, &current.spec, validator).await;
    let (Verdict::Denied(_), Some(validator), true) = (&verdict, validator, refused_by_haproxy(&verdict)) else {
        return verdict;
    };
    let spec = current.spec.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        current.renderer.render_dry_leaving_out(&current.stores, &current.pods, MAX_LEFT_OUT)
    })
    .await;
    let Ok(Ok(render)) = rendered else { return verdict };
    match validator.validate(&render.files, &spec).await {
        Check::Refused(_) => Verdict::Allowed(Some(
            "HAProxy refuses the render of the current objects too: this object is not what breaks it".into(),
        )),
        Check::Accepted | Check::Unavailable(_) => verdict,
    }
}

/// The prefix of a denial HAProxy made (not haptic's own refusals).
const HAPROXY_DENIES: &str = "HAProxy refuses the render: ";

fn refused_by_haproxy(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Denied(why) if why.starts_with(HAPROXY_DENIES))
}

/// The whole judgement of one proposal: render, then HAProxy when there is a render.
pub async fn judge(judged: Judged, spec: &HAProxyTemplateConfigSpec, validator: Option<&dyn Validator>) -> Verdict {
    match judged {
        Judged::Decided(verdict) => verdict,
        Judged::Render(files, warnings) => match checked(&files, spec, validator).await {
            Verdict::Allowed(_) if !warnings.is_empty() => Verdict::Warned(warnings),
            verdict => verdict,
        },
    }
}

/// HAProxy's judgement of a render.
async fn checked(files: &FileSet, spec: &HAProxyTemplateConfigSpec, validator: Option<&dyn Validator>) -> Verdict {
    match validator {
        None => Verdict::Allowed(Some("rendered; not checked by HAProxy (no validator)".into())),
        Some(validator) => match validator.validate(files, spec).await {
            Check::Accepted => Verdict::Allowed(None),
            Check::Refused(alerts) => {
                let alerts = alerts.strip_prefix(HAPROXY_DENIES).unwrap_or(&alerts);
                Verdict::Denied(format!("{HAPROXY_DENIES}{alerts}"))
            }
            Check::Unavailable(why) => {
                tracing::warn!(%why, "a render was admitted unchecked by HAProxy: the validator cannot be asked");
                Verdict::Allowed(Some(format!("rendered; not checked by HAProxy: {why}")))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A validator that refuses any render with a line `timeout server banana`, naming its line.
    struct NoBananas;

    impl Validator for NoBananas {
        fn validate<'a>(
            &'a self,
            files: &'a FileSet,
            _spec: &'a HAProxyTemplateConfigSpec,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Check> + Send + 'a>> {
            let content = files.haproxy_cfg.content.clone();
            Box::pin(async move {
                match content.lines().position(|line| line.contains("banana")) {
                    Some(at) => Check::Refused(format!("parsing [haproxy.cfg:{}] : 'banana' is no time", at + 1)),
                    None => Check::Accepted,
                }
            })
        }
    }

    const TEMPLATE: &str = "{% for i in resources.ingresses.list() %}backend {{ i.metadata.name | bare_word }}\n    timeout server {{ i.metadata.annotations['t'] | bare_word }}\n{% endfor %}";

    fn ingress(name: &str, timeout: &str, created: &str) -> Json {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
               "metadata": {"name": name, "namespace": "ns", "uid": name, "creationTimestamp": created,
                            "annotations": {"t": timeout}}})
    }

    fn snapshot(objects: &[Json]) -> Snapshot {
        let spec: HAProxyTemplateConfigSpec = serde_json::from_value(json!({
            "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress"}},
            "podSelector": {"matchLabels": {"app": "haproxy"}},
            "templates": {"haproxyConfig": TEMPLATE}
        }))
        .expect("a spec");
        let objects: Vec<(std::path::PathBuf, Json)> = objects.iter().map(|o| ("test".into(), o.clone())).collect();
        let stores = crate::offline::build_fixture_stores(&spec, &objects).expect("stores");
        let renderer = Arc::new(Renderer::compile(&spec).expect("templates"));
        Snapshot { generation: 1, spec, renderer, stores, pods: Vec::new() }
    }

    fn proposal(object: Json) -> Proposal {
        Proposal { operation: "CREATE".into(), object: Some(object) }
    }

    #[tokio::test]
    async fn a_proposal_is_refused_only_for_what_it_breaks_itself() {
        let good = ingress("good", "5s", "2026-01-01T00:00:00Z");
        // Nothing stored is refused: a bad proposal is.
        let clean = snapshot(std::slice::from_ref(&good));
        let judged = judge_object(&clean, &proposal(ingress("new", "banana", "2026-01-02T00:00:00Z")));
        let verdict = judge_beside_current(judged, clean.clone(), Some(&NoBananas)).await;
        assert!(matches!(&verdict, Verdict::Denied(why) if why.contains("haproxy.cfg:")), "{verdict:?}");
        // A stored object HAProxy refuses already: a good proposal is not to blame, and let through.
        let spoiled = snapshot(&[good, ingress("stored-bad", "banana", "2026-01-01T00:00:00Z")]);
        let judged = judge_object(&spoiled, &proposal(ingress("new", "7s", "2026-01-02T00:00:00Z")));
        let verdict = judge_beside_current(judged, spoiled, Some(&NoBananas)).await;
        assert!(matches!(&verdict, Verdict::Allowed(Some(why)) if why.contains("not what breaks it")), "{verdict:?}");
    }

    #[tokio::test]
    async fn the_culprits_of_a_refused_render_are_the_objects_haproxy_names() {
        let mut objects: Vec<Json> =
            (0..20).map(|i| ingress(&format!("ok-{i}"), "5s", "2026-01-01T00:00:00Z")).collect();
        objects.push(ingress("bad-old", "banana", "2025-01-01T00:00:00Z"));
        objects.push(ingress("bad-new", "banana", "2026-06-01T00:00:00Z"));
        let current = snapshot(&objects);
        let outcome =
            culprits::find(&current.renderer, &current.spec, &current.stores, &current.pods, &NoBananas, 10).await;
        let culprits::Outcome::Found(found) = outcome else { panic!("{outcome:?}") };
        let mut names: Vec<&str> = found.iter().map(|c| c.suspect.key.name.as_ref()).collect();
        names.sort_unstable();
        assert_eq!(names, ["bad-new", "bad-old"]);
        assert!(found.iter().all(|c| c.refusal.contains("'banana'")));
    }
}
