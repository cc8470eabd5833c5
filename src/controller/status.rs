//! The `Valid` condition of the configuration resource, written only when it changes.

use kube::api::{Api, Patch, PatchParams};
use tracing::warn;

use crate::config::{Condition, HAProxyTemplateConfig, HAProxyTemplateConfigStatus};

/// The `Valid` condition for one generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidCondition {
    /// The generation it judges.
    pub generation: i64,
    /// Whether that generation is in force.
    pub valid: bool,
    /// A CamelCase reason.
    pub reason: String,
    /// What is wrong, or that it was accepted.
    pub message: String,
}

impl ValidCondition {
    /// The generation is in force.
    pub fn accepted(generation: i64) -> Self {
        Self { generation, valid: true, reason: "Accepted".into(), message: "the configuration is in force".into() }
    }

    /// The generation was refused; the previous valid one stays in force.
    pub fn refused(generation: i64, reason: &str, message: String) -> Self {
        Self {
            generation,
            valid: false,
            reason: reason.into(),
            message: format!("{message} (the previous valid configuration stays in force)"),
        }
    }
}

/// Writes the status subresource, skipping writes that would change nothing.
pub(crate) struct StatusWriter {
    api: Api<HAProxyTemplateConfig>,
    name: String,
    last: Option<ValidCondition>,
}

impl StatusWriter {
    pub(crate) fn new(api: Api<HAProxyTemplateConfig>, name: String) -> Self {
        Self { api, name, last: None }
    }

    pub(crate) async fn write(&mut self, generation: i64, condition: ValidCondition) {
        if self.last.as_ref() == Some(&condition) {
            return;
        }
        let status = HAProxyTemplateConfigStatus {
            observed_generation: Some(generation),
            conditions: vec![Condition {
                type_: "Valid".into(),
                status: if condition.valid { "True" } else { "False" }.into(),
                reason: condition.reason.clone(),
                message: condition.message.clone(),
                last_transition_time: Some(now_rfc3339()),
            }],
        };
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        match self.api.patch_status(&self.name, &PatchParams::default(), &patch).await {
            Ok(_) => self.last = Some(condition),
            Err(error) => warn!(%error, "could not write the configuration's status"),
        }
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
