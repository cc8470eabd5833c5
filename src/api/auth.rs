//! Who may read the API: a Kubernetes bearer token, authenticated with a TokenReview and
//! authorized with a SubjectAccessReview for `get` on haptic's `fleet` resource (group
//! `haptic.dev`), as kube-rbac-proxy does. The chart's reader ClusterRole grants that verb.
//!
//! Decisions are kept for a short while by the token's SHA-256 (never the token itself), so a
//! scraper polling `/metrics` does not cost two API-server calls a scrape.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::files::Checksum;

/// The API group of the resource a reader must be allowed to `get`.
pub const GROUP: &str = "haptic.dev";
/// The resource a reader must be allowed to `get`.
pub const RESOURCE: &str = "fleet";
/// How long a decision is kept.
const KEEP: Duration = Duration::from_secs(30);
/// Tokens remembered at most (a flood of random tokens cannot grow the cache without bound).
const MAX_REMEMBERED: usize = 1024;

/// What the reviews said about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Authenticated and allowed.
    Allowed,
    /// Not a valid token.
    Unauthenticated,
    /// A valid token whose user may not read the API.
    Forbidden {
        /// The user the token belongs to.
        user: String,
    },
}

/// Why a token could not be reviewed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The API server did not answer a review.
    #[error("the {review} could not be made: {source}")]
    Review {
        /// TokenReview or SubjectAccessReview.
        review: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer a review in time.
    #[error("the {review} got no answer within {seconds}s")]
    TimedOut {
        /// TokenReview or SubjectAccessReview.
        review: &'static str,
        /// How long it waited.
        seconds: u64,
    },
}

/// How long a review may take: a reader gets 503 rather than a request hanging on an API
/// server that stopped answering.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

async fn bounded<T>(
    review: &'static str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, AuthError> {
    tokio::time::timeout(REVIEW_TIMEOUT, call)
        .await
        .map_err(|_| AuthError::TimedOut { review, seconds: REVIEW_TIMEOUT.as_secs() })?
        .map_err(|source| AuthError::Review { review, source })
}

/// Reviews tokens against the Kubernetes API server.
pub struct KubeAuthorizer {
    client: kube::Client,
    /// The audience tokens must be issued for.
    audience: String,
    remembered: Mutex<HashMap<Checksum, (Decision, Instant)>>,
}

impl KubeAuthorizer {
    /// An authorizer that asks the API server `client` talks to, for tokens issued for
    /// `audience`.
    pub fn new(client: kube::Client, audience: &str) -> Self {
        Self { client, audience: audience.to_owned(), remembered: Mutex::new(HashMap::new()) }
    }

    /// Whether `token` may read the API; `bound`, only when issued for haptic's audience (the
    /// API's pod and configuration answers), else for the API server's as well (`/metrics`,
    /// which Prometheus reads with its own ServiceAccount token, as kube-rbac-proxy allows).
    pub async fn review(&self, token: &str, bound: bool) -> Result<Decision, AuthError> {
        let key = Checksum::of(format!("{bound}:{token}").as_bytes());
        if let Ok(remembered) = self.remembered.lock()
            && let Some((decision, at)) = remembered.get(&key)
            && at.elapsed() < KEEP
        {
            return Ok(decision.clone());
        }
        let decision = self.ask(token, bound).await?;
        if let Ok(mut remembered) = self.remembered.lock() {
            remembered.retain(|_, (_, at)| at.elapsed() < KEEP);
            if remembered.len() < MAX_REMEMBERED {
                remembered.insert(key, (decision.clone(), Instant::now()));
            }
        }
        Ok(decision)
    }

    async fn ask(&self, token: &str, bound: bool) -> Result<Decision, AuthError> {
        // A token for haptic's audience serves everywhere; one for the API server's only where
        // the path is not bound.
        match self.ask_once(token, true).await? {
            Decision::Unauthenticated if !bound => self.ask_once(token, false).await,
            decision => Ok(decision),
        }
    }

    async fn ask_once(&self, token: &str, bound: bool) -> Result<Decision, AuthError> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: bound.then(|| vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let reviewed = bounded("TokenReview", reviews.create(&PostParams::default(), &review)).await?;
        let status = reviewed.status.unwrap_or_default();
        // The API server answers with the audiences the token has among those asked: a token
        // for any other (the API server's own) is not haptic's to accept.
        let for_us = !bound || status.audiences.as_ref().is_some_and(|audiences| audiences.contains(&self.audience));
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true) && for_us) else {
            return Ok(Decision::Unauthenticated);
        };
        let access: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let question = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.to_owned()),
                    resource: Some(RESOURCE.to_owned()),
                    verb: Some("get".to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = bounded("SubjectAccessReview", access.create(&PostParams::default(), &question)).await?;
        if answer.status.is_some_and(|status| status.allowed) {
            Ok(Decision::Allowed)
        } else {
            Ok(Decision::Forbidden { user: user.username.unwrap_or_default() })
        }
    }
}

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_non_empty_bearer_token_is_taken() {
        assert_eq!(bearer_token("Bearer abc.def"), Some("abc.def"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic YWRtaW46YWRtaW4="), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }
}
