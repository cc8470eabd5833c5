//! The planner against a model of a pod's running HAProxy: for random pairs of configurations
//! (one derived from the other by random changes of every kind), applying a runtime plan to
//! the model of the first gives the model of the second, in an order the Runtime API accepts;
//! and a full sync is chosen exactly when something differs that the Runtime API cannot do.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use super::*;

/// One server slot: address octet, port, weight, disabled.
type Slot = (u8, u16, u8, bool);

const MAPS: [&str; 2] = ["exact.map", "prefix.map"];

/// What a render is made from.
#[derive(Clone, Debug)]
struct World {
    backends: BTreeMap<String, Vec<Slot>>,
    maps: BTreeMap<String, BTreeMap<String, String>>,
    certs: BTreeMap<String, String>,
    timeout: u8,
}

/// What a running HAProxy holds that the Runtime API can change or read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Running {
    servers: BTreeMap<(String, String), (String, String, String, bool)>,
    maps: BTreeMap<String, BTreeMap<String, String>>,
    certs: BTreeMap<String, String>,
}

impl World {
    fn render(&self) -> FileSet {
        let mut config = format!(
            "global\n    maxconn 100\n\ndefaults\n    mode http\n    timeout client {}s\n\nfrontend http\n    bind :80\n",
            self.timeout
        );
        for map in MAPS {
            config.push_str(&format!("    use_backend %[path,map({map})] if {{ path,map({map}) -m found }}\n"));
        }
        for (name, slots) in &self.backends {
            config.push_str(&format!("\nbackend {name}\n    balance roundrobin\n"));
            for (i, (ip, port, weight, disabled)) in slots.iter().enumerate() {
                let state = if *disabled { " disabled" } else { "" };
                config.push_str(&format!("    server s{i} 10.0.0.{ip}:{port} weight {weight}{state}\n"));
            }
        }
        // Lines in an order of their own: the answer must not depend on it.
        let maps = self
            .maps
            .iter()
            .map(|(name, entries)| {
                let text: String = entries.iter().rev().map(|(key, value)| format!("{key} {value}\n")).collect();
                (name.clone(), RenderedFile::new(text))
            })
            .collect();
        let certs = self.certs.iter().map(|(name, pem)| (name.clone(), RenderedFile::sensitive(pem.clone()))).collect();
        FileSet { haproxy_cfg: RenderedFile::new(config), maps, files: BTreeMap::new(), certs }
    }

    fn running(&self) -> Running {
        let mut servers = BTreeMap::new();
        for (backend, slots) in &self.backends {
            for (i, (ip, port, weight, disabled)) in slots.iter().enumerate() {
                servers.insert(
                    (backend.clone(), format!("s{i}")),
                    (format!("10.0.0.{ip}"), port.to_string(), weight.to_string(), *disabled),
                );
            }
        }
        Running { servers, maps: self.maps.clone(), certs: self.certs.clone() }
    }
}

impl Running {
    /// Applies one action as the Runtime API would, refusing what it would refuse.
    fn apply(&mut self, action: &RuntimeAction, desired: &FileSet) -> Result<(), String> {
        let missing = || format!("{action}: no such server");
        match action {
            RuntimeAction::SetAddress { backend, server: name, address, port } => {
                let entry = self.servers.get_mut(&(backend.clone(), name.clone())).ok_or_else(missing)?;
                entry.0 = address.clone();
                entry.1 = port.clone();
            }
            RuntimeAction::SetWeight { backend, server: name, weight } => {
                self.servers.get_mut(&(backend.clone(), name.clone())).ok_or_else(missing)?.2 = weight.clone();
            }
            RuntimeAction::SetState { backend, server: name, ready } => {
                self.servers.get_mut(&(backend.clone(), name.clone())).ok_or_else(missing)?.3 = !ready;
            }
            RuntimeAction::AddServer { backend, server, address, port, weight, ready } => {
                if !self.backends().contains(backend) {
                    return Err(format!("{action}: no such backend"));
                }
                let state = (address.clone(), port.clone(), weight.clone().unwrap_or_default(), !ready);
                if self.servers.insert((backend.clone(), server.clone()), state).is_some() {
                    return Err(format!("{action}: the server exists"));
                }
            }
            RuntimeAction::ReplaceServer { backend, server: name, address, port, weight } => {
                let entry = self.servers.get_mut(&(backend.clone(), name.clone())).ok_or_else(missing)?;
                if !entry.3 {
                    return Err(format!("{action}: del server refuses a server in traffic"));
                }
                *entry = (address.clone(), port.clone(), weight.clone().unwrap_or_default(), false);
            }
            RuntimeAction::AddMapEntry { map, key, value } => {
                let entries = self.maps.get_mut(map).ok_or("no such map")?;
                if entries.insert(key.clone(), value.clone()).is_some() {
                    return Err(format!("{action}: the key is there already (HAProxy would hold it twice)"));
                }
            }
            RuntimeAction::SetMapEntry { map, key, value } => {
                *self.maps.get_mut(map).ok_or("no such map")?.get_mut(key).ok_or("set map: no such key")? =
                    value.clone();
            }
            RuntimeAction::DeleteMapEntry { map, key } => {
                self.maps.get_mut(map).ok_or("no such map")?.remove(key).ok_or("del map: no such key")?;
            }
            RuntimeAction::RenewCertificate { name } => {
                let renewed = desired.certs.get(name).ok_or("renewing a certificate not desired")?;
                *self.certs.get_mut(name).ok_or("set ssl cert: no such certificate")? = renewed.content.to_string();
            }
        }
        Ok(())
    }

    /// The backends whose servers exist.
    fn backends(&self) -> BTreeSet<String> {
        self.servers.keys().map(|(backend, _)| backend.clone()).collect()
    }
}

/// One random change to a world.
#[derive(Clone, Debug)]
enum Change {
    Server(usize, usize, Slot),
    Route(usize, u8, Option<usize>),
    Renew(usize, u8),
    RemoveBackend(usize),
    AddBackend(u8),
    /// A slot added at the end of a backend (a dynamic server).
    AddServer(usize),
    Timeout(u8),
    AddCertificate(u8),
    RemoveCertificate(usize),
}

fn slot() -> impl Strategy<Value = Slot> {
    (1u8..6, prop_oneof![Just(80u16), Just(8080u16)], 1u8..4, any::<bool>())
}

fn world() -> impl Strategy<Value = World> {
    (
        proptest::collection::btree_map("be_[a-e]", proptest::collection::vec(slot(), 1..4), 1..5),
        proptest::collection::vec((0usize..2, 0u8..8, any::<prop::sample::Index>()), 0..10),
        proptest::collection::btree_map("[a-c]\\.pem", "pem-[0-9]", 0..3),
        1u8..4,
    )
        .prop_map(|(backends, routes, certs, timeout)| {
            let names: Vec<String> = backends.keys().cloned().collect();
            let mut maps: BTreeMap<String, BTreeMap<String, String>> =
                MAPS.iter().map(|m| ((*m).to_owned(), BTreeMap::new())).collect();
            for (map, key, backend) in routes {
                maps.get_mut(MAPS[map]).map(|m| m.insert(format!("/p{key}/"), backend.get(&names).clone()));
            }
            World { backends, maps, certs, timeout }
        })
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (any::<usize>(), any::<usize>(), slot()).prop_map(|(b, s, slot)| Change::Server(b, s, slot)),
        4 => (any::<usize>(), 0u8..8, proptest::option::of(any::<usize>())).prop_map(|(m, k, b)| Change::Route(m, k, b)),
        2 => (any::<usize>(), 0u8..10).prop_map(|(c, v)| Change::Renew(c, v)),
        1 => any::<usize>().prop_map(Change::RemoveBackend),
        1 => (0u8..3).prop_map(Change::AddBackend),
        1 => any::<usize>().prop_map(Change::AddServer),
        1 => (1u8..4).prop_map(Change::Timeout),
        1 => (0u8..3).prop_map(Change::AddCertificate),
        1 => any::<usize>().prop_map(Change::RemoveCertificate),
    ]
}

impl World {
    fn change(&mut self, change: &Change) {
        let names: Vec<String> = self.backends.keys().cloned().collect();
        match *change {
            Change::Server(b, s, new) => {
                let slots = self.backends.get_mut(&names[b % names.len()]).expect("listed");
                let len = slots.len();
                slots[s % len] = new;
            }
            Change::Route(map, key, backend) => {
                let entries = self.maps.get_mut(MAPS[map % 2]).expect("both maps exist");
                match backend {
                    Some(b) => entries.insert(format!("/p{key}/"), names[b % names.len()].clone()),
                    None => entries.remove(&format!("/p{key}/")),
                };
            }
            Change::Renew(c, version) => {
                let count = self.certs.len().max(1);
                if let Some(pem) = self.certs.values_mut().nth(c % count) {
                    *pem = format!("pem-{version}");
                }
            }
            Change::RemoveBackend(b) if names.len() > 1 => {
                let gone = &names[b % names.len()];
                self.backends.remove(gone);
                // The library never routes to a backend it does not render.
                for entries in self.maps.values_mut() {
                    entries.retain(|_, backend| backend != gone);
                }
            }
            Change::RemoveBackend(_) => {}
            Change::AddBackend(n) => {
                self.backends.entry(format!("be_new{n}")).or_insert_with(|| vec![(9, 80, 1, false)]);
            }
            Change::AddServer(b) => {
                // A slot taken at once, or a free one (disabled).
                self.backends.get_mut(&names[b % names.len()]).expect("listed").push((9, 80, 1, b % 2 == 0));
            }
            Change::Timeout(t) => self.timeout = t,
            Change::AddCertificate(n) => {
                self.certs.entry(format!("new{n}.pem")).or_insert_with(|| "pem-new".into());
            }
            Change::RemoveCertificate(c) => {
                if let Some(name) = self.certs.keys().nth(c % self.certs.len().max(1)).cloned() {
                    self.certs.remove(&name);
                }
            }
        }
    }
}

/// Whether every server in traffic in `running` is at an address it has in traffic before or
/// after the change: between two actions a server never takes requests where no endpoint is (a
/// free slot's placeholder, say).
fn serving_only_endpoints(running: &Running, before: &World, after: &World) -> bool {
    let (before, after) = (before.running(), after.running());
    let serving_at = |world: &Running, server: &(String, String)| {
        world.servers.get(server).filter(|state| !state.3).map(|state| (state.0.clone(), state.1.clone()))
    };
    running.servers.iter().filter(|(_, state)| !state.3).all(|(server, state)| {
        let at = Some((state.0.clone(), state.1.clone()));
        at == serving_at(&before, server) || at == serving_at(&after, server)
    })
}

/// Whether going from `a` to `b` needs something the Runtime API cannot do.
fn needs_reload(a: &World, b: &World) -> bool {
    b.backends.keys().any(|name| !a.backends.contains_key(name))
        || b.backends.iter().any(|(name, slots)| a.backends[name].len() > slots.len())
        || a.timeout != b.timeout
        || !a.certs.keys().eq(b.certs.keys())
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(512)
    })]

    /// Applying a runtime plan to the running state of the pushed files gives the running state
    /// of the desired ones (a removed backend may stay, unused); map entries only ever point at
    /// backends that run when they are written; no removal precedes an addition. A full sync
    /// is chosen exactly when the Runtime API cannot make the change.
    #[test]
    fn a_runtime_plan_applied_to_the_running_pod_gives_the_desired_state(
        before in world(),
        changes in proptest::collection::vec(change(), 0..8),
    ) {
        let mut after = before.clone();
        for change in &changes {
            after.change(change);
        }
        let (pushed, desired) = (before.render(), after.render());
        match plan(&pushed, &desired, AddressChanges::Followed) {
            Plan::Full => prop_assert!(needs_reload(&before, &after), "a full sync for a runtime change"),
            Plan::NoOp => prop_assert_eq!(pushed, desired),
            Plan::Runtime(actions) => {
                prop_assert!(!needs_reload(&before, &after), "a runtime plan for {:?}", changes);
                let mut running = before.running();
                let mut removing = false;
                for action in &actions {
                    if let RuntimeAction::AddMapEntry { value, .. } | RuntimeAction::SetMapEntry { value, .. } = action {
                        prop_assert!(running.backends().contains(value), "{} before its backend runs", action);
                        prop_assert!(!removing, "{} after a removal", action);
                    }
                    removing |= matches!(action, RuntimeAction::DeleteMapEntry { .. });
                    running.apply(action, &desired).map_err(TestCaseError::fail)?;
                    prop_assert!(serving_only_endpoints(&running, &before, &after), "after {}: a server in traffic at an address no endpoint holds", action);
                }
                let wanted = after.running();
                prop_assert_eq!(&running.maps, &wanted.maps);
                prop_assert_eq!(&running.certs, &wanted.certs);
                for (server, state) in &wanted.servers {
                    prop_assert_eq!(running.servers.get(server), Some(state), "server {:?}", server);
                }
                prop_assert!(running.backends().is_superset(&wanted.backends()));
            }
        }
    }
}
