//! Leader election between two real controller processes on the real API server: exactly
//! one deploys; a leader partitioned from the API server stops deploying before its Lease
//! could be taken, and the other replica takes over; a SIGKILLed leader is replaced within
//! the lease duration. The pods are Ready in Kubernetes with no Dataplane API behind them
//! (docs/environment.md), so "deploying" is seen as the drivers' journaled attempts; that a
//! new leader leaves in-sync pods alone is shown by the state machine's unit tests.

use crate::env;

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use env::controller::{ControllerProcess, Launch, create_test_config, ensure_haptic_crd};
use env::proxy::{CuttableProxy, apiserver_address};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::{Value, json};

const LEASE: &str = "haptic-election-test";
const DURATION_SECS: u64 = 6;
const GRACE_SECS: u64 = 2;

fn launch(identity: &str, kubeconfig: Option<std::path::PathBuf>) -> Launch {
    Launch {
        args: vec![
            "--leader-election-lease".into(),
            LEASE.into(),
            "--leader-election-identity".into(),
            identity.into(),
            "--lease-duration-seconds".into(),
            DURATION_SECS.to_string(),
            "--lease-grace-seconds".into(),
            GRACE_SECS.to_string(),
        ],
        kubeconfig,
        ..Launch::default()
    }
}

async fn leads(api: &str) -> Result<bool> {
    let text = reqwest::get(format!("{api}/metrics")).await?.text().await?;
    let line = text.lines().find(|l| l.starts_with("haptic_leader ")).context("no haptic_leader metric")?;
    Ok(line.trim_end().ends_with(" 1"))
}

async fn wait_until_leading(api: &str, expected: bool, within: Duration) -> Result<Instant> {
    let deadline = Instant::now() + within;
    loop {
        // An API that does not answer is no follower: the replica must say it does not lead.
        let answer = leads(api).await;
        if answer.as_ref().is_ok_and(|leading| *leading == expected) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            let role = if expected { "leader" } else { "follower" };
            bail!("{api} did not become {role} within {within:?} (last answer: {answer:?})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every transition a replica's journal holds, over its API.
async fn transitions(api: &str, namespace: &str) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    for pod in ["ghost-0", "ghost-1"] {
        let answer = reqwest::get(format!("{api}/api/v1/pods/{namespace}/{pod}?limit=1000")).await?;
        if answer.status() == reqwest::StatusCode::NOT_FOUND {
            continue;
        }
        let answer: Value = answer.json().await?;
        all.extend(answer["transitions"].as_array().cloned().unwrap_or_default());
    }
    Ok(all)
}

fn at(transition: &Value) -> SystemTime {
    let text = transition["at"].as_str().unwrap_or_default();
    let stamp: k8s_openapi::jiff::Timestamp = text.parse().unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    SystemTime::from(stamp)
}

#[tokio::test]
async fn one_leader_deploys_a_partitioned_leader_steps_down_first_and_a_killed_one_is_replaced() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "election").await?;
    env::fixtures::dataplane_secret(&client, &namespace, "admin", "election-secret").await?;
    for (name, ip) in [("ghost-0", "127.1.9.31"), ("ghost-1", "127.1.9.32")] {
        env::fixtures::ghost_pod(&client, &namespace, name, ip, "election").await?;
    }
    create_test_config(
        &client,
        &namespace,
        json!({
            "podSelector": {"matchLabels": {"haptic.dev/test": "election"}},
            "watchedResources": {"services": {"apiVersion": "v1", "kind": "Service", "namespaces": [namespace]}},
            "dataplane": {"credentialsSecretRef": {"name": "dataplane"}},
            "templates": {"haproxyConfig": "global\n    maxconn 100\n"}
        }),
    )
    .await?;

    // Replica A reaches the API server through a proxy the test can cut.
    let proxy = CuttableProxy::start(apiserver_address(&env.kubeconfig)?).await?;
    let dir_a = tempfile::tempdir()?;
    let kubeconfig_a = dir_a.path().join("kubeconfig");
    proxy.kubeconfig(&env.kubeconfig, &kubeconfig_a)?;
    let journal_a = dir_a.path().join("journal");
    let mut a = ControllerProcess::launch(
        env,
        &namespace,
        "test",
        dir_a,
        &journal_a,
        &launch("replica-a", Some(kubeconfig_a)),
    )?;
    let api_a = a.api_url().await?;
    wait_until_leading(&api_a, true, Duration::from_secs(30)).await.with_context(|| a.log_tail())?;
    let dir_b = tempfile::tempdir()?;
    let journal_b = dir_b.path().join("journal");
    let b = ControllerProcess::launch(env, &namespace, "test", dir_b, &journal_b, &launch("replica-b", None))?;
    let api_b = b.api_url().await?;
    b.wait_for_config("replica B's render", Duration::from_secs(30), |cfg| cfg.contains("maxconn 100")).await?;

    // Exactly one deploys: A's drivers journal their attempts, B renders but touches no pod.
    env::holds_throughout(Duration::from_secs(3), "both replicas lead", || async { Ok(!leads(&api_b).await?) }).await?;
    let a_attempts = transitions(&api_a, &namespace).await?;
    ensure!(!a_attempts.is_empty(), "the leader deploys: {}", a.log_tail());
    ensure!(transitions(&api_b, &namespace).await?.is_empty(), "the follower must not deploy");
    let lease: Lease = Api::namespaced(client.clone(), &namespace).get(LEASE).await?;
    let term_a = lease.spec.and_then(|s| s.lease_transitions).unwrap_or_default();
    ensure!(a_attempts.iter().all(|t| t["term"] == term_a), "A's records carry its term {term_a}: {a_attempts:?}");

    // Partition A from the API server: it must step down before B may take the Lease.
    let cut_at = Instant::now();
    proxy.cut().await;
    let a_down = wait_until_leading(&api_a, false, Duration::from_secs(DURATION_SECS + 5)).await?;
    let a_down_wall = SystemTime::now();
    let b_up = wait_until_leading(&api_b, true, Duration::from_secs(DURATION_SECS + 10))
        .await
        .with_context(|| b.log_tail())?;
    ensure!(a_down < b_up, "the partitioned leader still led when the other took over");
    ensure!(
        a_down.duration_since(cut_at) <= Duration::from_secs(DURATION_SECS),
        "A stepped down {:?} after the cut",
        a_down.duration_since(cut_at)
    );
    eprintln!(
        "partition: A stepped down after {:?}, B took over after {:?}",
        a_down.duration_since(cut_at),
        b_up.duration_since(cut_at)
    );
    env::holds_throughout(Duration::from_secs(2), "A went on deploying after stepping down", || async {
        Ok(transitions(&api_a, &namespace).await?.iter().all(|t| at(t) <= a_down_wall))
    })
    .await?;
    let b_attempts = transitions(&api_b, &namespace).await?;
    ensure!(!b_attempts.is_empty(), "the new leader deploys: {}", b.log_tail());
    ensure!(
        b_attempts.iter().all(|t| t["term"].as_i64().unwrap_or_default() > i64::from(term_a)),
        "B deploys in a later term than A's {term_a}: {b_attempts:?}"
    );

    // Heal A (it stays a follower: B holds the Lease), then SIGKILL B: A takes over in time.
    proxy.heal();
    env::holds_throughout(Duration::from_secs(2), "A leads while B holds the Lease", || async {
        Ok(!leads(&api_a).await?)
    })
    .await?;
    let killed_at = Instant::now();
    drop(b.kill());
    let a_up = wait_until_leading(&api_a, true, Duration::from_secs(DURATION_SECS + 10))
        .await
        .with_context(|| a.log_tail())?;
    let takeover = a_up.duration_since(killed_at);
    eprintln!("SIGKILL: A took over after {takeover:?}");
    ensure!(takeover <= Duration::from_secs(DURATION_SECS + 2), "takeover took {takeover:?}");

    // A replica stopped as Kubernetes stops it (SIGTERM) hands the Lease back on its way out:
    // a third replica takes over well before the lease would have expired.
    let dir_c = tempfile::tempdir()?;
    let journal_c = dir_c.path().join("journal");
    let c = ControllerProcess::launch(env, &namespace, "test", dir_c, &journal_c, &launch("replica-c", None))?;
    let api_c = c.api_url().await?;
    c.wait_for_config("replica C's render", Duration::from_secs(30), |cfg| cfg.contains("maxconn 100")).await?;
    let terminated_at = Instant::now();
    ensure!(a.terminate(Duration::from_secs(15)).await, "A did not exit cleanly on SIGTERM");
    let lease: Lease = Api::namespaced(client.clone(), &namespace).get(LEASE).await?;
    ensure!(
        lease.spec.as_ref().is_none_or(|s| s.holder_identity.as_deref() != Some("replica-a")),
        "A left without handing the Lease back: {:?}\n{}",
        lease.spec,
        a.log_tail()
    );
    let c_up = wait_until_leading(&api_c, true, Duration::from_secs(DURATION_SECS + 10))
        .await
        .with_context(|| c.log_tail())?;
    let handover = c_up.duration_since(terminated_at);
    eprintln!("SIGTERM: C took over after {handover:?}");
    ensure!(handover < Duration::from_secs(DURATION_SECS), "the Lease was not handed back: C waited {handover:?}");
    Ok(())
}

/// One write to a pod as its Dataplane API logged it (chart/files/dataplaneapi.yaml's access
/// log): which replica (from the User-Agent), when it began and ended, what it was.
#[derive(Debug, Clone)]
struct LoggedWrite {
    replica: String,
    began: SystemTime,
    ended: SystemTime,
    #[allow(dead_code, reason = "shown in failure messages")]
    request: String,
}

/// Every request but GETs that a replica (`haptic/... (<replica>)`) sent, from the log.
fn logged_writes(log: &str) -> Vec<LoggedWrite> {
    let mut writes = Vec::new();
    for line in log.lines() {
        let line = line.replace("\\\"", "\"");
        let Some(access) = line.split_once("msg=\"access ").map(|(_, rest)| rest) else { continue };
        // <client> "<agent>" <begin ms> <µs> "<request line>" <status>
        let mut quoted = access.split('"');
        let (Some(_), Some(agent), Some(times), Some(request)) =
            (quoted.next(), quoted.next(), quoted.next(), quoted.next())
        else {
            continue;
        };
        let Some(replica) = agent.split_once('(').and_then(|(_, r)| r.strip_suffix(')')) else { continue };
        if request.starts_with("GET ") {
            continue;
        }
        let mut numbers = times.split_whitespace().filter_map(|n| n.parse::<u64>().ok());
        let (Some(begin_ms), Some(took_us)) = (numbers.next(), numbers.next()) else { continue };
        let began = SystemTime::UNIX_EPOCH + Duration::from_millis(begin_ms);
        writes.push(LoggedWrite {
            replica: replica.to_owned(),
            began,
            ended: began + Duration::from_micros(took_us),
            request: request.to_owned(),
        });
    }
    writes
}

#[tokio::test]
async fn a_blackholed_leader_writes_nothing_once_its_lease_could_be_taken_over_in_every_round() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let pod = env.pods[0].clone();
    let tag = format!("fenced-{}", std::process::id());
    let (client, namespace) = env::controller::deployment_namespace_with(
        env,
        "fenced",
        std::slice::from_ref(&pod),
        json!({"driftPreventionInterval": "1s"}),
        json!({"haproxyConfig": env::controller::own_template(env, &tag, "")}),
    )
    .await?;

    // Two replicas, each reaching the API server through a proxy of its own.
    let upstream = apiserver_address(&env.kubeconfig)?;
    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b"] {
        let proxy = CuttableProxy::start(upstream).await?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        proxy.kubeconfig(&env.kubeconfig, &kubeconfig)?;
        let journal = dir.path().join("journal");
        let process =
            ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch(name, Some(kubeconfig)))?;
        let api = process.api_url().await?;
        if name == "replica-a" {
            wait_until_leading(&api, true, Duration::from_secs(30)).await.with_context(|| process.log_tail())?;
            process.wait_all_in_sync(1, Duration::from_secs(30)).await?;
            // One fleet per term: a render that saw the leadership first started it, and the
            // leadership change that followed must not stop and start it again.
            let starts = process.log_text().matches("fleet started").count();
            ensure!(starts == 1, "the fleet was started {starts} times in one term:\n{}", process.log_tail());
        }
        replicas.push((name, proxy, process, api));
    }

    // Someone keeps changing the pod by hand (without a reload), so whoever leads wants to write
    // it back at every drift check. The edit keeps the file one every HAProxy takes: from 3.x
    // on, `haproxy -c` refuses a configuration without a listener (exit 2, "will not start"),
    // so the Dataplane API would refuse the edit and there would be nothing to write back.
    let dataplane = env.dataplane(&pod);
    let meddler = tokio::spawn(async move {
        loop {
            if let Ok(stored) = dataplane.raw_configuration().await {
                let body: Vec<&str> = stored
                    .text
                    .lines()
                    // Comments go, haptic's mark of the render it pushed among them: a
                    // replica with no record of the pod trusts a file that carries it.
                    .filter(|l| !l.trim_start().starts_with('#'))
                    .collect();
                let edited = format!("# changed by hand\n{}\n", body.join("\n"));
                let _ = dataplane.push_raw_runtime(&edited, stored.version, "").await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    // The Lease as the API server has it, every 100 ms: who renewed it last, when.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let renewals = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, SystemTime)>::new()));
    let watcher = tokio::spawn({
        let renewals = renewals.clone();
        async move {
            loop {
                if let Ok(lease) = leases.get(LEASE).await
                    && let Some(spec) = lease.spec
                    && let (Some(holder), Some(renewed)) = (spec.holder_identity, spec.renew_time)
                    && let Ok(mut seen) = renewals.lock()
                {
                    let renewed = SystemTime::from(renewed.0);
                    if seen.last() != Some(&(holder.clone(), renewed)) {
                        seen.push((holder, renewed));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    let mut leader = 0;
    let mut figures = Vec::new();
    // One partition in `make test`, five in `make soak`.
    for round in 1..=env::repetitions(1, 5) {
        let follower = 1 - leader;
        let (leader_name, leader_proxy, leader_process, leader_api) = &replicas[leader];
        let (follower_name, _, follower_process, follower_api) = &replicas[follower];
        tokio::time::sleep(Duration::from_secs(2)).await; // the leader at work, writing back
        let partitioned_at = SystemTime::now();
        leader_proxy.blackhole();
        wait_until_leading(follower_api, true, Duration::from_secs(DURATION_SECS * 3)).await.with_context(|| {
            format!("round {round}: {follower_name} never took over\n{}", follower_process.log_tail())
        })?;
        tokio::time::sleep(Duration::from_secs(3)).await; // the new leader at work
        let log = std::fs::read_to_string(pod.dir.join("dataplaneapi.log"))?;
        let writes: Vec<LoggedWrite> =
            logged_writes(&log).into_iter().filter(|w| w.began >= partitioned_at - Duration::from_secs(3)).collect();
        // The old leader's lease could be taken over from its last renewal plus the duration.
        let last_renewal = renewals
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .iter()
            .filter(|(holder, _)| holder == leader_name)
            .map(|(_, renewed)| *renewed)
            .max()
            .context("the leader never renewed")?;
        let takeover_possible = last_renewal + Duration::from_secs(DURATION_SECS);
        let old: Vec<&LoggedWrite> = writes.iter().filter(|w| w.replica == *leader_name).collect();
        let new: Vec<&LoggedWrite> = writes.iter().filter(|w| w.replica == *follower_name).collect();
        let late: Vec<&&LoggedWrite> = old.iter().filter(|w| w.ended >= takeover_possible).collect();
        ensure!(
            late.is_empty(),
            "round {round}: {leader_name} wrote after its lease could be taken over ({takeover_possible:?}): {late:#?}\n{}",
            leader_process.log_tail()
        );
        let first_new = new.iter().map(|w| w.began).min().with_context(|| {
            format!("round {round}: the new leader {follower_name} never wrote\n{}", follower_process.log_tail())
        })?;
        ensure!(first_new >= takeover_possible, "round {round}: {follower_name} wrote before the lease was free");
        let last_old = old.iter().map(|w| w.ended).max();
        figures.push(format!(
            "round {round}: {leader_name} last wrote {} before the takeover point, {follower_name} first wrote {:?} after it",
            last_old.and_then(|t| takeover_possible.duration_since(t).ok()).map_or("nothing".into(), |d| format!("{d:?}")),
            first_new.duration_since(takeover_possible).unwrap_or_default(),
        ));
        // Heal: the old leader comes back as a follower (the other holds the Lease).
        leader_proxy.heal();
        wait_until_leading(leader_api, false, Duration::from_secs(5)).await?;
        leader = follower;
    }
    meddler.abort();
    watcher.abort();
    for line in &figures {
        eprintln!("{line}");
    }
    Ok(())
}
