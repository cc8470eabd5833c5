//! `shared`: state that lives for one render and is seen by every template of it, and what a
//! kept render carries to the next (slots, blocks, sorted views, listings, collectors' items).

use super::*;

/// What a successful kept render hands the next: its server slots, its blocks, the sorted
/// views of its shared collectors, and how many names it made. A dry or failed render hands
/// nothing on.
#[derive(Clone, Debug, Default)]
pub(crate) struct Carried {
    /// Server slots of every backend: `server_slots(...)` keeps each endpoint's server name
    /// from one render to the next (see `plan::slots`); seeded from the journal at a start.
    pub(crate) slots: Arc<crate::plan::slots::Slots>,
    /// The backends whose slots the render that left `slots` and `blocks` assigned anew: a
    /// block of that render whose backend is not among them left the table `slots` holds.
    /// `None` when the slots came from elsewhere (the journal), and every block's are checked.
    pub(crate) slots_moved: Option<Arc<BackendNames>>,
    /// The blocks of `render_each`, reused where nothing they read changed.
    pub(crate) blocks: Arc<crate::render::memo::Blocks>,
    /// Sorted views of shared collectors, reused where a collector holds the same items.
    sorted_views: Arc<SortedViews>,
    /// How many shared names the render made, to size the next one's maps.
    name_counts: NameCounts,
    /// The stores the render listed, as it listed them.
    pub(crate) listings: Arc<Listings>,
    /// The items of the render's shared collectors, which the next render's collectors write
    /// over (see `CollectorItems`); taken by the render that uses them.
    collector_items: Arc<std::sync::Mutex<Names<Vec<Value>>>>,
}

/// How many collectors and claimed names a render made.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NameCounts {
    collectors: usize,
    claimed_names: usize,
}

/// Backends by name.
pub(crate) type BackendNames = std::collections::HashSet<String, foldhash::fast::RandomState>;

/// The names a render claimed, by fingerprint.
pub(super) type ClaimedNames = std::sync::Mutex<crate::render::memo::FingerprintSet>;

/// Maps by name that templates fill by the tens of thousands per render.
pub(super) type Names<V> = std::collections::HashMap<Arc<str>, V, foldhash::quality::RandomState>;

/// `shared`: state that lives for one render and is seen by every template of it, so work
/// done for one file (a route table, say) is not redone for the next.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    collectors: std::sync::Mutex<Names<Arc<Collector>>>,
    /// Every name claimed (shared collectors' and `distinct`'s), by fingerprint: a claim is
    /// only a name, and a collector object made for each of a render's ~20,000 claims was a
    /// tenth of a render that reused every block. Shared collectors claim here too.
    pub(super) claimed_names: Arc<ClaimedNames>,
    /// Certificates registered by `tls_certificate(...)`, by file name.
    certs: std::sync::Mutex<std::collections::BTreeMap<String, crate::files::RenderedFile>>,
    /// General files registered by functions (`ca_file(...)`), by file name.
    files: std::sync::Mutex<std::collections::BTreeMap<String, crate::files::RenderedFile>>,
    /// Warnings about objects served as they are, in the order the render made them.
    notices: std::sync::Mutex<Vec<crate::render::Notice>>,
    /// Server slots of every backend as the last kept render left them: shared, not copied
    /// (10,000 backends' names copied at every render was 3% of a render that reused all).
    slots_before: Arc<crate::plan::slots::Slots>,
    /// The backends the render that left `slots_before` assigned anew (see `Carried`).
    slots_moved_before: Option<Arc<BackendNames>>,
    /// Sorted views of shared collectors, the last kept render's and this one's.
    sorted_views: Arc<SortedCarry>,
    /// The backends whose slots this render assigned anew, over `slots_before`.
    slots_assigned: std::sync::Mutex<crate::plan::slots::Slots>,
    /// The blocks of `render_each` this render may reuse, and those it uses.
    blocks: crate::render::memo::RenderBlocks,
    /// The last render's shared collectors' items, each taken by this render's collector of
    /// the same name when it is made.
    collector_items_before: Arc<std::sync::Mutex<Names<Vec<Value>>>>,
}

impl Shared {
    /// Shared state for a render that starts from what the last kept render handed on.
    pub(crate) fn starting_from(carried: Carried) -> Self {
        // As many names as the last render had: sized once, not grown by rehashing.
        let expected = carried.name_counts;
        Self {
            collectors: std::sync::Mutex::new(Names::with_capacity_and_hasher(expected.collectors, Default::default())),
            claimed_names: Arc::new(std::sync::Mutex::new(
                crate::render::memo::FingerprintSet::with_capacity_and_hasher(
                    expected.claimed_names,
                    Default::default(),
                ),
            )),
            slots_before: carried.slots,
            slots_moved_before: carried.slots_moved,
            sorted_views: Arc::new(SortedCarry { before: carried.sorted_views, now: Default::default() }),
            blocks: crate::render::memo::RenderBlocks::reusing(carried.blocks),
            collector_items_before: carried.collector_items,
            ..Self::default()
        }
    }

    /// How many blocks this render reused and rendered.
    pub(crate) fn block_counts(&self) -> crate::render::memo::BlockCounts {
        self.blocks.counts()
    }

    /// What this render hands the next, taken (the render is over), with the stores it listed.
    pub(crate) fn take_carried(&self, listings: Listings) -> Carried {
        let (slots, moved) = self.take_slots();
        Carried {
            slots,
            slots_moved: Some(Arc::new(moved)),
            blocks: Arc::new(self.blocks.take_used()),
            sorted_views: Arc::new(
                self.sorted_views.now.lock().map(|mut now| std::mem::take(&mut *now)).unwrap_or_default(),
            ),
            name_counts: NameCounts {
                collectors: self.collectors.lock().map(|collectors| collectors.len()).unwrap_or_default(),
                claimed_names: self.claimed_names.lock().map(|claims| claims.len()).unwrap_or_default(),
            },
            listings: Arc::new(listings),
            collector_items: Arc::new(std::sync::Mutex::new(self.take_collector_items())),
        }
    }

    /// The shared collectors' items, taken (the render is over), for the next render's.
    fn take_collector_items(&self) -> Names<Vec<Value>> {
        let Ok(collectors) = self.collectors.lock() else { return Names::default() };
        collectors
            .iter()
            .filter_map(|(name, collector)| {
                let mut items = collector.items.lock().ok()?;
                let values = std::mem::take(items.settled());
                (!values.is_empty()).then(|| (name.clone(), values))
            })
            .collect()
    }

    /// Assigns a backend's endpoints to its slots (once per render: a backend rendered twice,
    /// in two files, gets the same answer) and hands the table to `read`. The table is read in
    /// place: at 10,000 backends, copying each one in and out was a tenth of a render.
    pub(crate) fn with_slots<R>(
        &self,
        backend: &str,
        endpoints: &[crate::plan::slots::EndpointKey],
        block: usize,
        read: impl FnOnce(&crate::plan::slots::SlotTable) -> R,
    ) -> R {
        use crate::plan::slots::{SlotTable, assign};
        let table = {
            let Ok(mut assigned) = self.slots_assigned.lock() else {
                return read(&assign(&SlotTable::default(), endpoints, block));
            };
            match self.table_in(&assigned, backend) {
                Some(table) if table.holds_exactly(endpoints) => table.clone(),
                current => {
                    let table =
                        Arc::new(assign(current.map_or(&SlotTable::default(), |table| table), endpoints, block));
                    assigned.insert(backend.to_owned(), table.clone());
                    table
                }
            }
        };
        crate::render::memo::record_effect(|| crate::render::memo::Effect::Slots {
            backend: backend.into(),
            table: table.clone(),
        });
        read(&table)
    }

    /// A backend's slots now: as this render assigned them, else as they were.
    fn table_in<'a>(
        &'a self,
        assigned: &'a crate::plan::slots::Slots,
        backend: &str,
    ) -> Option<&'a Arc<crate::plan::slots::SlotTable>> {
        assigned.get(backend).or_else(|| self.slots_before.get(backend))
    }

    /// The server slots after this render (the render is over: nothing assigns more), and the
    /// backends it assigned anew. The same tables as before, not a copy, when no backend's
    /// endpoints moved.
    fn take_slots(&self) -> (Arc<crate::plan::slots::Slots>, BackendNames) {
        let assigned =
            self.slots_assigned.lock().map(|mut assigned| std::mem::take(&mut *assigned)).unwrap_or_default();
        if assigned.is_empty() {
            return (self.slots_before.clone(), BackendNames::default());
        }
        let moved = assigned.keys().cloned().collect();
        let mut slots = crate::plan::slots::Slots::clone(&self.slots_before);
        slots.extend(assigned);
        (Arc::new(slots), moved)
    }

    /// Registers a certificate file of this render (the same name twice keeps one).
    pub(crate) fn add_cert(&self, name: String, pem: String) {
        self.add_cert_file(name, crate::files::RenderedFile::sensitive(pem));
    }

    fn add_cert_file(&self, name: String, file: crate::files::RenderedFile) {
        crate::render::memo::record_effect(|| crate::render::memo::Effect::Cert {
            name: name.clone(),
            file: Box::new(file.clone()),
        });
        self.keep_cert_file(name, file);
    }

    fn keep_cert_file(&self, name: String, file: crate::files::RenderedFile) {
        if let Ok(mut certs) = self.certs.lock() {
            certs.entry(name).or_insert(file);
        }
    }

    /// Registers a general file of this render (the same name twice keeps one).
    pub(crate) fn add_file(&self, name: String, content: String) {
        self.add_general_file(name, crate::files::RenderedFile::new(content));
    }

    fn add_general_file(&self, name: String, file: crate::files::RenderedFile) {
        crate::render::memo::record_effect(|| crate::render::memo::Effect::File {
            name: name.clone(),
            file: Box::new(file.clone()),
        });
        self.keep_general_file(name, file);
    }

    fn keep_general_file(&self, name: String, file: crate::files::RenderedFile) {
        if let Ok(mut files) = self.files.lock() {
            files.entry(name).or_insert(file);
        }
    }

    /// Notes a Warning about an object this render serves.
    pub(crate) fn add_notice(&self, notice: crate::render::Notice) {
        crate::render::memo::record_effect(|| crate::render::memo::Effect::Notice(Box::new(notice.clone())));
        self.keep_notice(notice);
    }

    fn keep_notice(&self, notice: crate::render::Notice) {
        if let Ok(mut notices) = self.notices.lock() {
            notices.push(notice);
        }
    }

    /// The Warnings noted so far.
    pub(crate) fn notices(&self) -> Vec<crate::render::Notice> {
        self.notices.lock().map(|notices| notices.clone()).unwrap_or_default()
    }

    /// The general files registered so far.
    pub(crate) fn files(&self) -> std::collections::BTreeMap<String, crate::files::RenderedFile> {
        self.files.lock().map(|files| files.clone()).unwrap_or_default()
    }

    /// The certificates registered so far.
    pub(crate) fn certs(&self) -> std::collections::BTreeMap<String, crate::files::RenderedFile> {
        self.certs.lock().map(|certs| certs.clone()).unwrap_or_default()
    }

    /// The shared collector of this name, made on first use.
    fn collector(&self, name: &str) -> Result<Arc<Collector>, Error> {
        self.collector_named(name, || name.into())
    }

    /// The shared collector of this name, made on first use under the name `owned` gives.
    fn collector_named(&self, name: &str, owned: impl FnOnce() -> Arc<str>) -> Result<Arc<Collector>, Error> {
        // Templates ask for tens of thousands of names (a claim per backend and map key):
        // hashed, and a name's copy made only when it is new.
        let mut collectors = self.collectors.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
        if let Some(collector) = collectors.get(name) {
            return Ok(collector.clone());
        }
        let name = owned();
        let before = self.collector_items_before.lock().ok().and_then(|mut before| before.remove(&name));
        let collector = Arc::new(Collector {
            items: std::sync::Mutex::new(CollectorItems::writing_over(before.unwrap_or_default())),
            claim: Some((crate::render::memo::name_fingerprint(&name), self.claimed_names.clone())),
            name: Some(name.clone()),
            sorted_views: Some(self.sorted_views.clone()),
            ..Collector::default()
        });
        collectors.insert(name, collector.clone());
        Ok(collector)
    }

    /// `distinct(collector, attribute, claim_prefix)`: the collector's items ordered by one
    /// attribute, the first of each value only, and only those whose `claim_prefix ~ value`
    /// collector this call claims (a backend rendered once whichever loop reaches it first).
    fn distinct(&self, collector: &str, attribute: &Value, claim_prefix: &str) -> Result<Value, Error> {
        let sorted = self.collector(collector)?.sorted(attribute, false)?;
        let attribute = attribute.as_str().unwrap_or_default();
        let mut chosen = Vec::new();
        let mut last: Option<Value> = None;
        let mut name = String::from(claim_prefix);
        // Routes by backend (the library's backends) are read, and their names fingerprinted,
        // in the route itself: once per route, not once per render.
        let routes_by_backend = attribute == "backend";
        let prefix_fingerprint = crate::render::memo::name_fingerprint(claim_prefix);
        // One lock for the call's thousands of claims (nothing below claims by another way).
        let mut claims = self.claimed_names.lock().map_err(|_| Error::from(ErrorKind::InvalidOperation))?;
        // Read in place (see `memo::render_each`), and answered as places in the sorted view:
        // the items chosen are not copied out of it either.
        // (`Collector::sorted` always answers with a listing.)
        let items = listed_items(&sorted).ok_or_else(|| Error::from(ErrorKind::InvalidOperation))?;
        for (place, item) in items.iter().enumerate() {
            let route = crate::render::library::as_route(item).filter(|_| routes_by_backend);
            let value = match route {
                Some(route) => route.backend().clone(),
                None => item.get_attr(attribute).unwrap_or_default(),
            };
            if last.as_ref() == Some(&value) {
                continue;
            }
            let claimed = match route {
                Some(route) => route.backend_claim(claim_prefix, prefix_fingerprint),
                None => {
                    name.truncate(claim_prefix.len());
                    name.push_str(value.as_str().unwrap_or_default());
                    crate::render::memo::name_fingerprint(&name)
                }
            };
            let won = claims.insert(claimed);
            crate::render::memo::record_effect(|| crate::render::memo::Effect::Claim { name: claimed, won });
            if won {
                chosen.push(u32::try_from(place).map_err(|_| Error::from(ErrorKind::InvalidOperation))?);
            }
            last = Some(value);
        }
        drop(claims);
        Ok(Value::from_object(Picked { from: sorted, places: chosen }))
    }
}

/// `distinct`'s answer: the items it chose, as places in the sorted view they came from (a
/// sequence to templates). Copied out, the 10,000 routes chosen were each counted up, and down
/// again when the render was over.
#[derive(Debug)]
pub(super) struct Picked {
    /// A listing (a sorted view's).
    from: Value,
    /// Ascending: `distinct` walks the view in turn.
    places: Vec<u32>,
}

impl Picked {
    fn source(&self) -> Option<&imbl::Vector<Value>> {
        listed_items(&self.from)
    }
}

impl Object for Picked {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let place = *self.places.get(key.as_usize()?)?;
        self.source()?.get(place as usize).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.places.len())
    }
}

/// The items `distinct` chose, read in place, the view walked in turn (`None`: the value is
/// not its answer).
pub(crate) fn picked_items(value: &Value) -> Option<impl Iterator<Item = &Value>> {
    let picked = value.downcast_object_ref::<Picked>()?;
    let mut places = picked.places.iter().map(|place| *place as usize).peekable();
    let items = picked.source()?.iter().enumerate();
    Some(items.filter_map(move |(at, item)| places.next_if_eq(&at).map(|_| item)))
}

/// The render as blocks being checked and replayed see it.
pub(crate) struct RenderNow<'a> {
    resources: &'a Resources,
    shared: &'a Shared,
    /// The collectors pushes were last replayed into: a call's blocks push into the same few
    /// (every Ingress into `routes` and one of `routes/<hosts>/<match>`), and looking each
    /// push's collector up by name was a tenth of a render that reused every block.
    recent_collectors: AtHand<Arc<Collector>>,
    /// The stores reads were last checked against: a block's reads name their store, and
    /// finding it by name for each of a render's tens of thousands of reads compared strings
    /// in the map of aliases every time.
    recent_stores: AtHand<&'a StoreView>,
}

/// The last few things found by name, kept at hand: names are shared copies, so most are
/// recognised by address.
pub(super) struct AtHand<T>(std::cell::RefCell<[Option<Named<T>>; 4]>);

/// A thing and the name it was found by.
pub(super) type Named<T> = (Arc<str>, T);

impl<T: Clone> AtHand<T> {
    pub(super) fn new() -> Self {
        Self(std::cell::RefCell::new([const { None }; 4]))
    }

    /// The thing of this name: at hand, or found by `find` and kept at hand.
    pub(super) fn get(&self, name: &Arc<str>, find: impl FnOnce() -> Option<T>) -> Option<T> {
        self.with(name, find, T::clone)
    }

    /// `with` given the thing of this name (see `get`), lent rather than copied: a copy of a
    /// shared collector counted it up and down for each of a render's tens of thousands of
    /// replayed pushes.
    fn with<R>(&self, name: &Arc<str>, find: impl FnOnce() -> Option<T>, with: impl FnOnce(&T) -> R) -> Option<R> {
        let mut recent = self.0.borrow_mut();
        let at_hand = recent.iter().flatten().find(|(known, _)| Arc::ptr_eq(known, name) || **known == **name);
        if let Some((_, thing)) = at_hand {
            return Some(with(thing));
        }
        let thing = find()?;
        recent.rotate_right(1);
        let (_, thing) = recent[0].insert((name.clone(), thing));
        Some(with(thing))
    }
}

impl<'a> RenderNow<'a> {
    pub(super) fn new(resources: &'a Resources, shared: &'a Shared) -> Self {
        Self { resources, shared, recent_collectors: AtHand::new(), recent_stores: AtHand::new() }
    }

    /// `with` given the shared collector of this name.
    fn with_collector<R>(&self, name: &Arc<str>, with: impl FnOnce(&Collector) -> R) -> Option<R> {
        self.recent_collectors.with(
            name,
            || self.shared.collector_named(name, || name.clone()).ok(),
            |collector| with(collector),
        )
    }

    /// The store of this alias.
    fn view(&self, alias: &Arc<str>) -> Option<&'a StoreView> {
        self.recent_stores.get(alias, || self.resources.store(alias))
    }
}

impl crate::render::memo::RenderState for RenderNow<'_> {
    fn generation(&self, alias: &Arc<str>) -> Option<u64> {
        Some(self.view(alias)?.store.generation())
    }

    fn untouched_since(
        &self,
        alias: &Arc<str>,
        generation: u64,
        key: &crate::store::IndexKey,
        digest: crate::store::KeyDigest,
    ) -> Option<bool> {
        self.view(alias)?.store.untouched_since(generation, key, digest)
    }

    fn finds(&self, alias: &Arc<str>, key: &crate::store::IndexKey, found: &[crate::render::memo::Identity]) -> bool {
        self.view(alias).is_some_and(|view| view.finds(key, found))
    }

    fn claim_as_before(&self, effects: &[crate::render::memo::Effect]) -> bool {
        let mut claims = crate::render::memo::claims(effects).peekable();
        if claims.peek().is_none() {
            return true;
        }
        let Ok(mut claimed) = self.shared.claimed_names.lock() else { return false };
        let made = claims.position(|(name, won)| !(if won { claimed.insert(name) } else { claimed.contains(&name) }));
        let Some(failed) = made else { return true };
        // Taken back: the block is rendered instead, and claims again as it goes.
        for (name, won) in crate::render::memo::claims(effects).take(failed) {
            if won {
                claimed.remove(&name);
            }
        }
        false
    }

    fn slots_are(&self, backend: &str, table: &Arc<crate::plan::slots::SlotTable>) -> bool {
        let Ok(assigned) = self.shared.slots_assigned.lock() else { return false };
        // Blocks checked here are the last kept render's. A backend neither that render nor
        // this one assigned anew still has the table each of its blocks left (a block rendered
        // found it in place, a block reused was checked against it), so there is no need to
        // look it up: looking up every reused block's backend was a tenth of a render after one
        // change.
        let untouched = (assigned.is_empty() || !assigned.contains_key(backend))
            && self
                .shared
                .slots_moved_before
                .as_ref()
                .is_some_and(|moved| moved.is_empty() || !moved.contains(backend));
        // `Arc`'s equality of `Eq` contents answers at once for the same table.
        untouched || self.shared.table_in(&assigned, backend) == Some(table)
    }

    fn replay(&self, effect: &crate::render::memo::Effect) {
        use crate::render::memo::Effect;
        match effect {
            // Replayed without recording: the block's effects reach an enclosing block, if any,
            // as the block's own (`memo::render_each` hands them on), not a second time here.
            Effect::Push { collector, value } => {
                self.with_collector(collector, |collector| {
                    if let Ok(mut items) = collector.items.lock() {
                        items.push_ref(value);
                    }
                });
            }
            // Made by the check (`claim_as_before`).
            Effect::Claim { .. } => {}
            // A block is reused only when the backend's slots are already what it left them
            // (`slots_are`): nothing to write.
            Effect::Slots { .. } => {}
            Effect::File { name, file } => self.shared.keep_general_file(name.clone(), (**file).clone()),
            Effect::Cert { name, file } => self.shared.keep_cert_file(name.clone(), (**file).clone()),
            Effect::Notice(notice) => self.shared.keep_notice((**notice).clone()),
        }
    }
}

impl Object for Shared {
    fn call_method(self: &Arc<Self>, state: &mut State<'_, '_>, method: &str, args: &[Value]) -> Result<Value, Error> {
        match (method, args) {
            ("collector", [name]) => self.collector(name.as_str().unwrap_or_default()).map(Value::from_dyn_object),
            ("distinct", [collector, attribute, claim_prefix]) => self.distinct(
                collector.as_str().unwrap_or_default(),
                attribute,
                claim_prefix.as_str().unwrap_or_default(),
            ),
            ("render_each", [template, items, name, rest @ ..]) if rest.len() <= 1 => {
                let resources = state.lookup("resources");
                let resources =
                    resources.as_ref().and_then(|r| r.downcast_object_ref::<Resources>()).ok_or_else(|| {
                        Error::new(ErrorKind::InvalidOperation, "render_each needs the render's resources")
                    })?;
                let now = RenderNow::new(resources, self);
                let template = template.as_str().unwrap_or_default();
                let name = name.as_str().unwrap_or("item");
                let lines =
                    crate::render::memo::render_each(state, &self.blocks, &now, template, items, name, rest.first())?;
                Ok(Value::from_object(lines))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!(
                    "shared has collector(name), distinct(collector, attribute, claim_prefix) and render_each(template, items, name, with); {method} with {} arguments is not one",
                    args.len()
                ),
            )),
        }
    }
}
