//! The status the Gateway API owes each object, as plain data ([`ObjectStatus`]), and how it
//! becomes the object's `status` ([`ObjectStatus::merged_into`]): transition times kept while
//! a condition holds, and other controllers' route parents left as they are.

use serde_json::{Value as Json, json};

use super::resources::ParentReference;

/// One condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// Its type (`Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`).
    pub kind: &'static str,
    /// True or False.
    pub status: bool,
    /// The spec's reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Condition {
    /// A condition that holds.
    pub fn yes(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind, status: true, reason, message: message.into() }
    }

    /// A condition that does not.
    pub fn no(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self { kind, status: false, reason, message: message.into() }
    }
}

/// A listener's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerStatus {
    /// The listener's name.
    pub name: String,
    /// Route kinds it takes.
    pub supported_kinds: Vec<&'static str>,
    /// How many routes attached.
    pub attached_routes: i64,
    /// Its conditions.
    pub conditions: Vec<Condition>,
}

/// A route's status for one parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentStatus {
    /// The parent as the route names it.
    pub parent_ref: ParentReference,
    /// Its conditions.
    pub conditions: Vec<Condition>,
}

/// What an object's status holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A GatewayClass.
    Class {
        /// Its conditions.
        conditions: Vec<Condition>,
        /// The conformance features served (`status.supportedFeatures`), sorted.
        features: Vec<&'static str>,
    },
    /// A Gateway.
    Gateway {
        /// Its conditions.
        conditions: Vec<Condition>,
        /// Where it is served.
        addresses: Vec<String>,
        /// Each listener.
        listeners: Vec<ListenerStatus>,
    },
    /// A route: one entry per parent of this controller.
    Route(Vec<ParentStatus>),
}

/// The status one object is owed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectStatus {
    /// Its kind.
    pub kind: &'static str,
    /// Its namespace (empty for GatewayClasses).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The generation judged.
    pub generation: i64,
    /// The status.
    pub body: Body,
}

/// Every object's status, in a stable order.
pub type StatusSet = Vec<ObjectStatus>;

fn conditions_json(conditions: &[Condition], generation: i64, previous: Option<&Json>, now: &str) -> Json {
    let list: Vec<Json> = conditions
        .iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let before = previous
                .and_then(Json::as_array)
                .and_then(|list| list.iter().find(|p| p.get("type").and_then(Json::as_str) == Some(c.kind)));
            let time = before
                .filter(|p| p.get("status").and_then(Json::as_str) == Some(status))
                .and_then(|p| p.get("lastTransitionTime").cloned())
                .unwrap_or_else(|| json!(now));
            json!({
                "type": c.kind, "status": status, "reason": c.reason, "message": c.message,
                "observedGeneration": generation, "lastTransitionTime": time,
            })
        })
        .collect();
    Json::Array(list)
}

impl ObjectStatus {
    /// The object's whole new `status`, from its current one: what this controller owns is
    /// replaced, transition times stay while a condition's status does, and route parents of
    /// other controllers are kept.
    pub fn merged_into(&self, current: &Json, controller_name: &str, now: &str) -> Json {
        let previous_conditions = current.get("conditions");
        match &self.body {
            Body::Class { conditions, features } => {
                let mut status = current.clone();
                if !status.is_object() {
                    status = json!({});
                }
                status["conditions"] = conditions_json(conditions, self.generation, previous_conditions, now);
                status["supportedFeatures"] = features.iter().map(|name| json!({"name": name})).collect();
                status
            }
            Body::Gateway { conditions, addresses, listeners } => {
                let previous_listeners = current.get("listeners").and_then(Json::as_array);
                let listeners: Vec<Json> = listeners
                    .iter()
                    .map(|listener| {
                        let before = previous_listeners.and_then(|list| {
                            list.iter().find(|p| p.get("name").and_then(Json::as_str) == Some(&listener.name))
                        });
                        json!({
                            "name": listener.name,
                            "supportedKinds": listener.supported_kinds.iter()
                                .map(|kind| json!({"group": super::resources::GROUP, "kind": kind}))
                                .collect::<Vec<_>>(),
                            "attachedRoutes": listener.attached_routes,
                            "conditions": conditions_json(&listener.conditions, self.generation,
                                before.and_then(|b| b.get("conditions")), now),
                        })
                    })
                    .collect();
                json!({
                    "addresses": addresses.iter().map(|a| json!({"type": address_type(a), "value": a})).collect::<Vec<_>>(),
                    "conditions": conditions_json(conditions, self.generation, previous_conditions, now),
                    "listeners": listeners,
                })
            }
            Body::Route(parents) => {
                let previous: Vec<Json> = current.get("parents").and_then(Json::as_array).cloned().unwrap_or_default();
                let ours = |p: &Json| p.get("controllerName").and_then(Json::as_str) == Some(controller_name);
                let mut out: Vec<Json> = previous.iter().filter(|p| !ours(p)).cloned().collect();
                for parent in parents {
                    let reference = serde_json::to_value(&parent.parent_ref).unwrap_or_default();
                    let before =
                        previous.iter().find(|p| ours(p) && same_parent(p.get("parentRef"), &parent.parent_ref));
                    out.push(json!({
                        "parentRef": reference,
                        "controllerName": controller_name,
                        "conditions": conditions_json(&parent.conditions, self.generation,
                            before.and_then(|b| b.get("conditions")), now),
                    }));
                }
                json!({"parents": out})
            }
        }
    }
}

fn same_parent(json: Option<&Json>, reference: &ParentReference) -> bool {
    json.and_then(|j| serde_json::from_value::<ParentReference>(j.clone()).ok()).as_ref() == Some(reference)
}

fn address_type(address: &str) -> &'static str {
    if address.parse::<std::net::IpAddr>().is_ok() { "IPAddress" } else { "Hostname" }
}

/// The status without its transition times, to tell a real change from a re-sent copy.
pub fn without_times(status: &Json) -> Json {
    match status {
        Json::Object(map) => Json::Object(
            map.iter()
                .filter(|(key, _)| key.as_str() != "lastTransitionTime")
                .map(|(key, value)| (key.clone(), without_times(value)))
                .collect(),
        ),
        Json::Array(items) => Json::Array(items.iter().map(without_times).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(conditions: Vec<Condition>) -> ObjectStatus {
        ObjectStatus {
            kind: "HTTPRoute",
            namespace: "ns".into(),
            name: "r".into(),
            generation: 3,
            body: Body::Route(vec![ParentStatus {
                parent_ref: ParentReference { name: "gw".into(), ..Default::default() },
                conditions,
            }]),
        }
    }

    #[test]
    fn a_class_publishes_its_supported_features_sorted_as_named_objects() {
        let class = ObjectStatus {
            kind: "GatewayClass",
            namespace: String::new(),
            name: "c".into(),
            generation: 1,
            body: Body::Class {
                conditions: vec![Condition::yes("Accepted", "Accepted", "served")],
                features: super::super::supported_features(),
            },
        };
        let status = class.merged_into(&json!({}), "haptic.dev/x", "2026-12-07T00:00:00Z");
        let names: Vec<&str> =
            status["supportedFeatures"].as_array().into_iter().flatten().filter_map(|f| f["name"].as_str()).collect();
        assert!(names.contains(&"HTTPRoute") && names.contains(&"Gateway") && names.contains(&"ReferenceGrant"));
        assert!(names.windows(2).all(|pair| pair[0] < pair[1]), "sorted and unique: {names:?}");
        assert!(names.len() <= 64, "the CRD allows 64");
    }

    #[test]
    fn other_controllers_parents_stay_and_times_hold_while_the_status_does() {
        let current = json!({"parents": [
            {"parentRef": {"name": "other"}, "controllerName": "example.com/other", "conditions": []},
            {"parentRef": {"name": "gw"}, "controllerName": "haptic.dev/gateway", "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "earlier"}
            ]},
        ]});
        let status = route(vec![Condition::yes("Accepted", "Accepted", "attached")]);
        let merged = status.merged_into(&current, "haptic.dev/gateway", "now");
        let parents = merged["parents"].as_array().unwrap();
        assert_eq!(parents.len(), 2);
        assert_eq!(parents[0]["controllerName"], "example.com/other");
        assert_eq!(parents[1]["conditions"][0]["lastTransitionTime"], "earlier");
        assert_eq!(parents[1]["conditions"][0]["observedGeneration"], 3);

        let refused = route(vec![Condition::no("Accepted", "NotAllowedByListeners", "no")]);
        let merged = refused.merged_into(&current, "haptic.dev/gateway", "now");
        assert_eq!(merged["parents"][1]["conditions"][0]["lastTransitionTime"], "now");
        assert_ne!(without_times(&merged), without_times(&status.merged_into(&current, "haptic.dev/gateway", "x")));
    }
}
