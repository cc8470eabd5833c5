//! Culprits: the stored objects behind a render HAProxy refuses although haptic's own checks
//! accepted every value (a CA bundle whose PEM holds garbage, a regular expression Rust reads and
//! PCRE does not, a certificate chain OpenSSL cannot load). Without this, one such object makes
//! every pod refuse every render, endpoint changes included, until its owner notices.
//!
//! The search (`search`) is pure over a check it is given: suspects are left out of the render
//! in growing prefixes of their blame order (newest first, so of two objects that clash the
//! later one is blamed), and a binary search finds the shortest prefix HAProxy accepts; its last
//! object is a culprit. Repeated until the render without the culprits is accepted: about
//! log2(suspects) checks per culprit. `find` is its IO edge: dry renders of the current stores
//! checked by the validator.

use std::future::Future;

use super::{Check, Validator};
use crate::config::HAProxyTemplateConfigSpec;
use crate::render::{PodInfo, Renderer};
use crate::store::{ObjectRef, Stores};

/// Kinds whose objects hold data others point at (a Secret's certificate, a Service's ports):
/// blamed only when leaving every other suspect out does not help, so that the object that
/// asked for the bad value (an Ingress naming the Secret) is the one left out and told.
const DATA_KINDS: [&str; 5] = ["Secret", "ConfigMap", "Service", "EndpointSlice", "Endpoints"];

/// At most this many checks in one search: a bound on the validator's work, whatever the render.
const MAX_CHECKS: usize = 200;

/// One culprit, with what HAProxy said while it was in the render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Culprit<T> {
    /// The suspect.
    pub suspect: T,
    /// HAProxy's refusal of the render that still held it (and no earlier culprit).
    pub refusal: String,
}

/// How a search ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// HAProxy accepts the render as it is: nothing to leave out.
    Innocent,
    /// HAProxy accepts the render without these.
    Found(Vec<Culprit<T>>),
    /// HAProxy refuses the render even without every suspect: the fault is not in an object
    /// (the templates, or a file of the configuration's own).
    NotAnObject(String),
    /// The search stopped: the check could not be made, or the bound on culprits or checks was
    /// reached.
    Stopped(String),
}

/// Finds the culprits among `suspects` (in blame order: the first is blamed first). `check`
/// judges the render with the given suspects left out; leaving more out must never make a
/// render HAProxy accepted refused. At most `max_culprits` are blamed.
pub async fn search<T, C, F>(suspects: &[T], max_culprits: usize, mut check: C) -> Outcome<T>
where
    T: Clone,
    C: FnMut(Vec<T>) -> F,
    F: Future<Output = Check>,
{
    let mut checks = 0usize;
    let mut ask = |left_out: Vec<T>| {
        checks += 1;
        let over = checks > MAX_CHECKS;
        let future = check(left_out);
        async move { if over { Check::Unavailable(format!("more than {MAX_CHECKS} checks")) } else { future.await } }
    };
    let mut refusal = match ask(Vec::new()).await {
        Check::Accepted => return Outcome::Innocent,
        Check::Refused(message) => message,
        Check::Unavailable(why) => return Outcome::Stopped(why),
    };
    match ask(suspects.to_vec()).await {
        Check::Accepted => {}
        Check::Refused(message) => return Outcome::NotAnObject(message),
        Check::Unavailable(why) => return Outcome::Stopped(why),
    }
    let mut culprits: Vec<Culprit<T>> = Vec::new();
    let mut remaining = suspects.to_vec();
    loop {
        // Known: culprits + remaining[..accepted] left out is accepted; culprits +
        // remaining[..refused] is refused, with `refusal`.
        let (mut refused, mut accepted) = (0, remaining.len());
        while accepted - refused > 1 {
            let middle = refused + (accepted - refused) / 2;
            let left_out = culprits.iter().map(|c| c.suspect.clone()).chain(remaining[..middle].iter().cloned());
            match ask(left_out.collect()).await {
                Check::Accepted => accepted = middle,
                Check::Refused(message) => (refused, refusal) = (middle, message),
                Check::Unavailable(why) => return Outcome::Stopped(why),
            }
        }
        let Some(suspect) = remaining.get(refused).cloned() else {
            return Outcome::Stopped("the check contradicted itself".into());
        };
        culprits.push(Culprit { suspect, refusal: std::mem::take(&mut refusal) });
        remaining.truncate(refused);
        if culprits.len() >= max_culprits {
            return Outcome::Stopped(format!("{} objects are refused by HAProxy, the most left out", culprits.len()));
        }
        // Whatever remains after the culprit was not needed with it left out.
        match ask(culprits.iter().map(|c| c.suspect.clone()).collect()).await {
            Check::Accepted => return Outcome::Found(culprits),
            Check::Refused(message) => refusal = message,
            Check::Unavailable(why) => return Outcome::Stopped(why),
        }
    }
}

/// The objects of `stores` in blame order: those that point at data first, then the data
/// kinds; within each, the newest first (creationTimestamp, then namespace and name), so of
/// two objects that clash the later one is blamed, as the oldest keeps a contested host.
pub fn suspects(stores: &Stores) -> Vec<ObjectRef> {
    let mut all: Vec<(bool, u32, ObjectRef)> = Vec::new();
    for store in stores.values() {
        let data = DATA_KINDS.contains(&store.kind());
        for object in store.iter() {
            all.push((data, crate::render::created_seconds(&object.value), object.reference.clone()));
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1)).then_with(|| a.2.key.cmp(&b.2.key)));
    all.dedup_by(|a, b| a.2 == b.2);
    all.into_iter().map(|(_, _, object)| object).collect()
}

/// The culprits of the render of `stores`: each candidate render is a dry one (nothing of it
/// kept), checked by `validator`.
pub async fn find(
    renderer: &Renderer,
    spec: &HAProxyTemplateConfigSpec,
    stores: &Stores,
    pods: &[PodInfo],
    validator: &dyn Validator,
    max_culprits: usize,
) -> Outcome<ObjectRef> {
    let suspects = suspects(stores);
    search(&suspects, max_culprits, |left_out| async move {
        let candidate = crate::store::without(stores, &left_out);
        match renderer.render_dry_leaving_out(&candidate, pods, max_culprits) {
            Ok(render) => validator.validate(&render.files, spec).await,
            // A render without objects that fails is no verdict on them.
            Err(error) => Check::Unavailable(format!("the render failed: {error}")),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A check that refuses while any culprit is in, naming the first one in.
    fn oracle(culprits: &BTreeSet<u32>, left_out: &[u32]) -> Check {
        match culprits.iter().find(|c| !left_out.contains(c)) {
            Some(c) => Check::Refused(format!("line of {c}")),
            None => Check::Accepted,
        }
    }

    fn run(suspects: &[u32], culprits: &BTreeSet<u32>) -> (Outcome<u32>, usize) {
        let mut checks = 0;
        let outcome = futures::executor::block_on(search(suspects, 100, |left_out: Vec<u32>| {
            checks += 1;
            std::future::ready(oracle(culprits, &left_out))
        }));
        (outcome, checks)
    }

    #[test]
    fn one_culprit_among_fifty_is_found_in_a_handful_of_checks() {
        let suspects: Vec<u32> = (0..50).collect();
        let (outcome, checks) = run(&suspects, &BTreeSet::from([37]));
        assert_eq!(outcome, Outcome::Found(vec![Culprit { suspect: 37, refusal: "line of 37".into() }]));
        assert!(checks <= 9, "{checks} checks");
    }

    #[test]
    fn a_render_haproxy_accepts_has_no_culprit() {
        assert_eq!(run(&[1, 2, 3], &BTreeSet::new()).0, Outcome::Innocent);
    }

    #[test]
    fn a_fault_outside_the_objects_is_said_so() {
        let outcome =
            futures::executor::block_on(search(&[1, 2], 10, |_| std::future::ready(Check::Refused("x".into()))));
        assert_eq!(outcome, Outcome::NotAnObject("x".into()));
    }

    #[test]
    fn of_two_objects_that_clash_the_first_in_blame_order_is_left_out() {
        // Refused while both are in: leaving either out helps; the first (the newest) is blamed.
        let outcome = futures::executor::block_on(search(&[7, 3, 5], 10, |left_out: Vec<u32>| {
            let both_in = !left_out.contains(&7) && !left_out.contains(&3);
            std::future::ready(if both_in { Check::Refused("clash".into()) } else { Check::Accepted })
        }));
        assert_eq!(outcome, Outcome::Found(vec![Culprit { suspect: 7, refusal: "clash".into() }]));
    }

    #[test]
    fn a_validator_that_cannot_be_asked_stops_the_search() {
        let outcome =
            futures::executor::block_on(search(&[1], 10, |_| std::future::ready(Check::Unavailable("down".into()))));
        assert_eq!(outcome, Outcome::Stopped("down".into()));
    }

    proptest! {
        /// Whatever the culprits among the suspects, exactly they are found, each with the
        /// refusal it caused, in about log2(suspects) checks each.
        #[test]
        fn exactly_the_culprits_are_found(
            count in 1u32..120,
            picks in proptest::collection::btree_set(0u32..120, 0..6),
        ) {
            let suspects: Vec<u32> = (0..count).collect();
            let culprits: BTreeSet<u32> = picks.into_iter().filter(|p| *p < count).collect();
            let (outcome, checks) = run(&suspects, &culprits);
            if culprits.is_empty() {
                prop_assert_eq!(outcome, Outcome::Innocent);
            } else {
                let Outcome::Found(found) = outcome else { panic!("{outcome:?}") };
                let named: BTreeSet<u32> = found.iter().map(|c| c.suspect).collect();
                prop_assert_eq!(&named, &culprits);
                for culprit in &found {
                    prop_assert_eq!(&culprit.refusal, &format!("line of {}", culprit.suspect));
                }
                let log = (u32::BITS - count.leading_zeros()) as usize;
                prop_assert!(checks <= 2 + culprits.len() * (log + 1), "{} checks", checks);
            }
        }
    }
}
