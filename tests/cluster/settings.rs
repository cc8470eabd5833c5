//! Settings in the configuration (#16) that a replica reads when it starts, live: the leader
//! election timings stated in `spec.leaderElection` take the place of the flags', as the Lease
//! the replica holds shows.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use env::controller::{ControllerProcess, Launch};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;

#[tokio::test]
async fn the_configurations_leader_election_timings_replace_the_flags() -> Result<()> {
    let env = env::environment();
    let (client, namespace, _) = env::controller::ingress_test_namespace(env, "settings", json!({"leaderElection": {"leaseDuration": "9s", "leaseGrace": "3s"}, "templates": {"haproxyConfig": "global\n"}})).await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    // The flags say 6 s and 2 s.
    let controller =
        ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::elected("settings", "replica-a"))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = leases
            .get_opt("settings")
            .await?
            .and_then(|lease| lease.spec)
            .filter(|spec| spec.holder_identity.as_deref() == Some("replica-a"));
        if let Some(spec) = held {
            ensure!(spec.lease_duration_seconds == Some(9), "the Lease holds for {:?} s", spec.lease_duration_seconds);
            break;
        }
        ensure!(Instant::now() < deadline, "replica-a never held the Lease:\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        controller.log_text().contains("leader election timings from the configuration"),
        "{}",
        controller.log_tail()
    );
    Ok(())
}
