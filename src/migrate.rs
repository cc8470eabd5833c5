//! What haptic makes of Ingresses written for other controllers (`haptic migrate-check`): for
//! every Ingress and every annotation of a known controller, whether haptic serves it the same,
//! close to it (and what differs), without it (with a Warning), or refuses the Ingress, and
//! why. The verdicts are the render's own (`render::judge_annotation`), so what the check says
//! is what the controller will do.

use serde::Serialize;
use serde_json::Value as Json;

use crate::render::{Outcome, judge_annotation};

/// One annotation of one Ingress, judged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// `namespace/name`.
    pub ingress: String,
    /// The annotation (never its value, which may hold a token).
    pub annotation: String,
    /// The verdict.
    pub outcome: Outcome,
    /// The haptic setting it sets, when it is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setting: Option<&'static str>,
    /// Why, or what differs.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// What becomes of one Ingress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fate {
    /// Served as its controller serves it (or close to it, as the rows say).
    Served,
    /// Served without some annotations, each named in a Warning.
    ServedWithWarnings,
    /// Not served while it carries an annotation the rows name.
    Refused,
}

/// One Ingress's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IngressVerdict {
    /// `namespace/name`.
    pub ingress: String,
    /// Its class (`spec.ingressClassName`, else the legacy annotation), when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// What becomes of it.
    pub fate: Fate,
}

/// Every Ingress's verdict and every annotation's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// One per Ingress, in the order given.
    pub ingresses: Vec<IngressVerdict>,
    /// One per annotation of a known controller.
    pub annotations: Vec<Row>,
}

/// Judges every Ingress among `objects` (other kinds are passed over); `snippets` says whether
/// the configuration allows raw snippets.
pub fn check<'a>(objects: impl IntoIterator<Item = &'a Json>, snippets: bool) -> Report {
    let mut report = Report::default();
    for object in objects {
        if object.get("kind").and_then(Json::as_str) != Some("Ingress") {
            continue;
        }
        let text = |pointer: &str| object.pointer(pointer).and_then(Json::as_str).map(str::to_owned);
        let ingress = format!(
            "{}/{}",
            text("/metadata/namespace").unwrap_or_else(|| "default".into()),
            text("/metadata/name").unwrap_or_default()
        );
        let class = text("/spec/ingressClassName").or_else(|| {
            object
                .pointer("/metadata/annotations/kubernetes.io~1ingress.class")
                .and_then(Json::as_str)
                .map(str::to_owned)
        });
        let annotations = object.pointer("/metadata/annotations").and_then(Json::as_object);
        let mut fate = Fate::Served;
        for (name, value) in annotations.into_iter().flatten() {
            let value = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
            let Some(judgement) = judge_annotation(name, &value, snippets) else { continue };
            fate = match (fate, judgement.outcome) {
                (_, Outcome::Refused) | (Fate::Refused, _) => Fate::Refused,
                (_, Outcome::Ignored | Outcome::Unknown) => Fate::ServedWithWarnings,
                (fate, _) => fate,
            };
            report.annotations.push(Row {
                ingress: ingress.clone(),
                annotation: name.clone(),
                outcome: judgement.outcome,
                setting: judgement.setting,
                detail: judgement.detail,
            });
        }
        if let Some(row) = nginx_redirect_default(object, &ingress, class.as_deref()) {
            report.annotations.push(row);
        }
        report.ingresses.push(IngressVerdict { ingress, class, fate });
    }
    report
}

/// ingress-nginx redirects plain HTTP to HTTPS for an Ingress with TLS unless told not to;
/// haptic redirects only when asked. For an ingress-nginx Ingress (its class `nginx`, or its
/// annotations) with TLS and no word on redirects, a row saying so.
fn nginx_redirect_default(object: &Json, ingress: &str, class: Option<&str>) -> Option<Row> {
    let annotations = object.pointer("/metadata/annotations").and_then(Json::as_object);
    let names = || annotations.into_iter().flat_map(|a| a.keys());
    let nginx = class == Some("nginx") || names().any(|name| name.starts_with(crate::render::NGINX_PREFIX));
    let tls = object.pointer("/spec/tls").and_then(Json::as_array).is_some_and(|tls| !tls.is_empty());
    let redirect_said = names().any(|name| name.ends_with("/ssl-redirect") || name.ends_with("/force-ssl-redirect"));
    (nginx && tls && !redirect_said).then(|| Row {
        ingress: ingress.to_owned(),
        annotation: "(HTTP to HTTPS redirect, by default)".into(),
        outcome: Outcome::Differs,
        setting: Some("ssl-redirect"),
        detail: format!(
            "ingress-nginx redirects HTTP to HTTPS for an Ingress with TLS; haptic only when asked: {}ssl-redirect: \"true\"",
            crate::render::NGINX_PREFIX
        ),
    })
}

impl Report {
    /// How many Ingresses would not be served.
    pub fn refused(&self) -> usize {
        self.ingresses.iter().filter(|verdict| verdict.fate == Fate::Refused).count()
    }

    /// The report for people: a table of annotations, then each Ingress's fate and a count.
    pub fn table(&self) -> String {
        let outcome = |outcome: Outcome| match outcome {
            Outcome::Same => "same",
            Outcome::Converted => "converted",
            Outcome::Differs => "differs",
            Outcome::Ignored => "ignored",
            Outcome::Unknown => "unknown",
            Outcome::Refused => "REFUSED",
        };
        let fate = |fate: Fate| match fate {
            Fate::Served => "served",
            Fate::ServedWithWarnings => "served, with warnings",
            Fate::Refused => "REFUSED",
        };
        let width = |texts: &mut dyn Iterator<Item = usize>, header: &str| texts.max().unwrap_or(0).max(header.len());
        let ingress_width = width(&mut self.ingresses.iter().map(|v| v.ingress.len()), "INGRESS");
        let annotation_width = width(&mut self.annotations.iter().map(|r| r.annotation.len()), "ANNOTATION");
        let mut out =
            format!("{:ingress_width$}  {:annotation_width$}  {:9}  DETAIL\n", "INGRESS", "ANNOTATION", "HAPTIC");
        for row in &self.annotations {
            let detail = match (row.setting, row.detail.as_str()) {
                (Some(setting), "") => format!("as {setting}"),
                (Some(setting), detail) => format!("as {setting}: {detail}"),
                (None, detail) => detail.to_owned(),
            };
            out.push_str(
                format!(
                    "{:ingress_width$}  {:annotation_width$}  {:9}  {detail}",
                    row.ingress,
                    row.annotation,
                    outcome(row.outcome)
                )
                .trim_end(),
            );
            out.push('\n');
        }
        out.push_str(&format!("\n{:ingress_width$}  FATE\n", "INGRESS"));
        for verdict in &self.ingresses {
            out.push_str(&format!("{:ingress_width$}  {}\n", verdict.ingress, fate(verdict.fate)));
        }
        let count = |wanted: Fate| self.ingresses.iter().filter(|v| v.fate == wanted).count();
        out.push_str(&format!(
            "\n{} Ingresses: {} served, {} served with warnings, {} refused\n",
            self.ingresses.len(),
            count(Fate::Served),
            count(Fate::ServedWithWarnings),
            count(Fate::Refused)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_ingress_is_refused_by_any_refused_annotation_and_warned_of_ignored_ones() {
        let ingresses = [
            json!({"kind": "Ingress", "metadata": {"namespace": "a", "name": "plain"}}),
            json!({"kind": "Ingress", "metadata": {"namespace": "a", "name": "tuned", "annotations": {
                "nginx.ingress.kubernetes.io/proxy-read-timeout": "120",
                "nginx.ingress.kubernetes.io/proxy-buffering": "on",
                "cert-manager.io/cluster-issuer": "letsencrypt"}}}),
            json!({"kind": "Ingress", "metadata": {"namespace": "a", "name": "login", "annotations": {
                "nginx.ingress.kubernetes.io/modsecurity-snippet": "SecRule oauth2-proxy",
                "nginx.ingress.kubernetes.io/limit-rps": "ten"}}}),
            json!({"kind": "Service", "metadata": {"namespace": "a", "name": "svc"}}),
        ];
        let report = check(&ingresses, false);
        let fates: Vec<Fate> = report.ingresses.iter().map(|v| v.fate).collect();
        assert_eq!(fates, [Fate::Served, Fate::ServedWithWarnings, Fate::Refused]);
        assert_eq!(report.refused(), 1);
        let outcomes: Vec<(&str, Outcome)> =
            report.annotations.iter().map(|row| (row.annotation.as_str(), row.outcome)).collect();
        assert_eq!(
            outcomes,
            [
                ("nginx.ingress.kubernetes.io/proxy-buffering", Outcome::Ignored),
                ("nginx.ingress.kubernetes.io/proxy-read-timeout", Outcome::Same),
                ("nginx.ingress.kubernetes.io/limit-rps", Outcome::Refused),
                ("nginx.ingress.kubernetes.io/modsecurity-snippet", Outcome::Refused),
            ]
        );
        assert!(!report.table().contains("oauth2-proxy"), "values never reach the report");
    }
}
