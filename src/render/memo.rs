//! Incremental rendering: `render_each(template, items, name, with)` renders a template once
//! per item, and remembers each block's output together with everything the block read (the
//! stored objects it looked up, as they were) and did (collector pushes and claims, server
//! slots, files). The next render reuses a block whose item, inputs and reads are unchanged,
//! replaying what it did instead of rendering it: a change to one Ingress re-renders the
//! blocks that read it, not the 10,000 others.
//!
//! A block sees only what it is given: `resources`, `extraContext`, `shared`, its item under
//! `name`, and the entries of `with`. That is what makes its key (template, item, `with`) and
//! its reads the whole of its inputs. A block that reads what cannot be checked later (a
//! shared collector's items, which depend on the order of everything before it) is rendered
//! every time. A reused block gives byte for byte what rendering it would (a property test
//! holds the incremental render to a full one).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex};

use minijinja::value::{Enumerator, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use crate::files::{Checksum, RenderedFile};
use crate::plan::slots::SlotTable;

/// A 128-bit digest of a value, a block's item or its key: equal values, equal fingerprints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fingerprint(u128);

/// Two foldhash streams with different random seeds, for 128 bits (a 64-bit key among tens of
/// thousands of blocks per render, render after render, is too near a collision to trust).
/// Seeded at random once per process, and fingerprints never leave it: values from the cluster
/// cannot be aimed at a collision without seeds nothing reveals (SipHash with its fixed keys,
/// before, was no stronger against that). foldhash, not SipHash: a reused block's key was a
/// fifth of its cost, SipHash most of that.
pub(crate) struct Digest(foldhash::quality::FoldHasher<'static>, foldhash::quality::FoldHasher<'static>);

/// The two streams' seeds, drawn at the first fingerprint.
static DIGEST_SEEDS: std::sync::OnceLock<(foldhash::quality::RandomState, foldhash::quality::RandomState)> =
    std::sync::OnceLock::new();

impl Digest {
    fn new() -> Self {
        use std::hash::BuildHasher;
        let (first, second) = DIGEST_SEEDS.get_or_init(Default::default);
        Self(first.build_hasher(), second.build_hasher())
    }

    fn finish(&self) -> Fingerprint {
        Fingerprint((u128::from(self.0.finish()) << 64) | u128::from(self.1.finish()))
    }
}

impl Hasher for Digest {
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }

    fn write_u8(&mut self, value: u8) {
        self.0.write_u8(value);
        self.1.write_u8(value);
    }

    fn write_u64(&mut self, value: u64) {
        self.0.write_u64(value);
        self.1.write_u64(value);
    }

    fn write_u128(&mut self, value: u128) {
        self.0.write_u128(value);
        self.1.write_u128(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.0.write_usize(value);
        self.1.write_usize(value);
    }

    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// What stands for a stored object in a fingerprint or a read: its content checksum (noise
/// left out) and the fingerprint of its ignored fields, which templates can still read.
pub(crate) type Identity = (Checksum, Option<std::num::NonZeroU64>);

/// Values that fingerprint as something other than their plain content.
pub(crate) trait Fingerprinted {
    /// Feeds the value's identity; false when it has none that can be trusted across renders.
    fn feed(&self, digest: &mut Digest) -> bool;
}

/// The fingerprint of a value: strings (with whether a filter vetted them), numbers, lists and
/// maps by content; stored objects and routes by their identity. `None` for what has no
/// identity across renders (collectors, the shared state, functions).
pub(crate) fn fingerprint(value: &Value) -> Option<Fingerprint> {
    let mut digest = Digest::new();
    feed(value, &mut digest, 0).then(|| digest.finish())
}

/// The fingerprint of a text (a rendered file).
pub(crate) fn text_fingerprint(text: &str) -> Fingerprint {
    combine(|digest| text.hash(digest))
}

/// The fingerprint of a shared name (a claim): a render claims ~20,000 names, each kept by the
/// block that claimed it, and a set of fingerprints is hashed once per claim, never compared
/// as text, and freed as one allocation (the names themselves, looked up among collectors and
/// then in a set of text, were a seventh of a render that reused every block).
pub(crate) fn name_fingerprint(name: &str) -> Fingerprint {
    text_fingerprint(name)
}

/// Fingerprints in a set, not hashed again.
pub(crate) type FingerprintSet = std::collections::HashSet<Fingerprint, BuildHasherDefault<KeyHasher>>;

/// The fingerprint of parts already fingerprinted (a route of an Ingress of some identity).
pub(crate) fn combine(parts: impl FnOnce(&mut Digest)) -> Fingerprint {
    let mut digest = Digest::new();
    parts(&mut digest);
    digest.finish()
}

fn feed(value: &Value, digest: &mut Digest, depth: usize) -> bool {
    if depth > 64 {
        return false;
    }
    if value.as_object().is_some() {
        if let Some(known) = super::context::fingerprinted(value) {
            digest.write_u8(10);
            return known.feed(digest);
        }
        if let Some(lines) = value.downcast_object_ref::<super::filters::VettedLines>() {
            digest.write_u8(11);
            lines.0.hash(digest);
            return true;
        }
        // haptic's own live objects (the stores, the shared state, collectors, settings) have
        // no content to fingerprint; lists and maps (minijinja's, or parts of stored objects)
        // are fingerprinted by their entries below.
        if super::context::is_live(value) || value.downcast_object_ref::<super::annotations::Settings>().is_some() {
            return false;
        }
    }
    match value.kind() {
        ValueKind::Undefined => digest.write_u8(0),
        ValueKind::None => digest.write_u8(1),
        ValueKind::Bool => {
            digest.write_u8(2);
            value.is_true().hash(digest);
        }
        ValueKind::Number => {
            digest.write_u8(3);
            value.hash(digest);
        }
        ValueKind::String => {
            digest.write_u8(4);
            value.is_safe().hash(digest);
            value.as_str().unwrap_or_default().hash(digest);
        }
        ValueKind::Bytes => {
            digest.write_u8(5);
            value.as_bytes().unwrap_or_default().hash(digest);
        }
        ValueKind::Seq => {
            digest.write_u8(6);
            let Ok(items) = value.try_iter() else { return false };
            for item in items {
                if !feed(&item, digest, depth + 1) {
                    return false;
                }
            }
            digest.write_u8(0xff);
        }
        ValueKind::Map => {
            digest.write_u8(7);
            let Ok(keys) = value.try_iter() else { return false };
            for key in keys {
                let Ok(item) = value.get_item(&key) else { return false };
                if !feed(&key, digest, depth + 1) || !feed(&item, digest, depth + 1) {
                    return false;
                }
            }
            digest.write_u8(0xff);
        }
        _ => return false,
    }
    true
}

/// A store generation that a check may move forward in place (blocks are shared, immutable
/// otherwise).
#[derive(Debug, Default)]
pub(crate) struct AtomicGeneration(std::sync::atomic::AtomicU64);

impl AtomicGeneration {
    /// A generation.
    pub(crate) fn new(generation: u64) -> Self {
        Self(std::sync::atomic::AtomicU64::new(generation))
    }

    fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, generation: u64) {
        self.0.store(generation, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clone for AtomicGeneration {
    fn clone(&self) -> Self {
        Self::new(self.get())
    }
}

/// Something a block read, with what it found, to be checked before the block is reused.
#[derive(Clone, Debug)]
pub(crate) enum Read {
    /// `resources.<alias>.get(...)` or `fetch(...)`: the objects found under an index key.
    Lookup {
        /// The store's alias.
        alias: Arc<str>,
        /// The store's generation when the lookup last found the same: the same one now needs
        /// no second look (moved forward in place when a later check finds the same again).
        generation: AtomicGeneration,
        /// The index key looked up (the store's own copy when it found something).
        key: crate::store::IndexKey,
        /// The key's digest, checked against the store's changes before the key itself.
        digest: crate::store::KeyDigest,
        /// Who was found, in order.
        found: Box<[Identity]>,
    },
    /// Every object of a store (`list()`, a loop over it).
    Whole {
        /// The store's alias.
        alias: Arc<str>,
        /// The store's generation then.
        generation: u64,
    },
}

/// Something a block did to the render's shared state, replayed when the block is reused.
#[derive(Clone, Debug)]
pub(crate) enum Effect {
    /// A value pushed onto a shared collector.
    Push {
        /// The collector's name.
        collector: Arc<str>,
        /// The value.
        value: Value,
    },
    /// A shared name claimed (a shared collector's, or `distinct`'s), and whether this block
    /// was first.
    Claim {
        /// The name's fingerprint ([`name_fingerprint`]).
        name: Fingerprint,
        /// True when the claim was won.
        won: bool,
    },
    /// A backend's server slots, as the block left them (its lines printed from them).
    Slots {
        /// The backend.
        backend: Arc<str>,
        /// The table after the block.
        table: Arc<SlotTable>,
    },
    /// A general file registered (`ca_file`).
    File {
        /// Its name.
        name: String,
        /// Its content (boxed: every effect is as large as the largest kind, and pushes and
        /// claims, tens of thousands of them kept, are half the size of a file).
        file: Box<RenderedFile>,
    },
    /// A Warning about an object, served as it is (`ingress_routes` on annotations it ignores).
    Notice(Box<crate::render::Notice>),
    /// A certificate registered (`tls_certificate`).
    Cert {
        /// Its name.
        name: String,
        /// Its content (boxed, as a general file's).
        file: Box<RenderedFile>,
    },
}

/// What one block read and did while it was rendered.
#[derive(Debug, Default)]
struct Recording {
    reads: Vec<Read>,
    effects: Vec<Effect>,
    /// False once the block read something that cannot be checked later.
    cacheable: bool,
}

/// The recordings of the blocks being rendered, and emptied ones whose room the next block
/// records into.
struct Recordings {
    /// The blocks being rendered, innermost last.
    active: Vec<Recording>,
    /// Recordings a finished block left empty, their room kept: a block's reads and effects
    /// are copied out at their exact length, and recording the next block into a fresh vector
    /// that grew by doubling, then shrinking it to its length, cost an allocation and a copy
    /// per growth and per shrink, for each of a full render's 30,000 blocks.
    spare: Vec<Recording>,
}

/// The most reads or effects a spare recording keeps room for: a block that holds a whole call
/// of blocks (nested `render_each`) records thousands, room a thread should not keep.
const SPARE_ROOM: usize = 256;

/// The most spare recordings a thread keeps (blocks nest a few deep).
const SPARE_RECORDINGS: usize = 8;

/// What a finished block read and did, at its exact length.
struct Recorded {
    reads: Box<[Read]>,
    effects: Box<[Effect]>,
    cacheable: bool,
}

thread_local! {
    /// Renders are synchronous on one thread: its blocks' recordings.
    static RECORDINGS: RefCell<Recordings> = const { RefCell::new(Recordings { active: Vec::new(), spare: Vec::new() }) };
}

/// Starts recording a block being rendered (inside any block being rendered already).
fn start_recording() {
    RECORDINGS.with(|recordings| {
        let mut recordings = recordings.borrow_mut();
        let mut recording = recordings.spare.pop().unwrap_or_default();
        recording.cacheable = true;
        recordings.active.push(recording);
    });
}

/// What the innermost block being rendered read and did, its recording ended.
fn finish_recording() -> Recorded {
    RECORDINGS.with(|recordings| {
        let mut recordings = recordings.borrow_mut();
        let Some(mut recording) = recordings.active.pop() else {
            return Recorded { reads: Box::default(), effects: Box::default(), cacheable: false };
        };
        let recorded = Recorded {
            reads: recording.reads.drain(..).collect(),
            effects: recording.effects.drain(..).collect(),
            cacheable: recording.cacheable,
        };
        if recording.reads.capacity() <= SPARE_ROOM
            && recording.effects.capacity() <= SPARE_ROOM
            && recordings.spare.len() < SPARE_RECORDINGS
        {
            recordings.spare.push(recording);
        }
        recorded
    })
}

/// Notes a read of the block being rendered, if any (`read` runs only then).
pub(crate) fn record_read(read: impl FnOnce() -> Read) {
    RECORDINGS.with(|recordings| {
        if let Some(recording) = recordings.borrow_mut().active.last_mut() {
            recording.reads.push(read());
        }
    });
}

/// Notes an effect of the block being rendered, if any.
pub(crate) fn record_effect(effect: impl FnOnce() -> Effect) {
    RECORDINGS.with(|recordings| {
        if let Some(recording) = recordings.borrow_mut().active.last_mut() {
            recording.effects.push(effect());
        }
    });
}

/// Marks the block being rendered, if any, as one to render every time.
pub(crate) fn record_uncacheable() {
    RECORDINGS.with(|recordings| {
        if let Some(recording) = recordings.borrow_mut().active.last_mut() {
            recording.cacheable = false;
        }
    });
}

/// Forgets any recording a failed render left behind.
pub(crate) fn reset_recordings() {
    RECORDINGS.with(|recordings| recordings.borrow_mut().active.clear());
}

/// A rendered block: its output, and what it read and did. Reads and effects are kept at
/// their exact length: recorded into vectors that grow by doubling (four places for the first
/// one), 30,000 blocks at 10,000 Ingresses held ~10 MiB of room nothing used.
#[derive(Debug)]
pub(crate) struct Block {
    reads: Box<[Read]>,
    effects: Box<[Effect]>,
    output: Box<str>,
    /// The item it was rendered for, when that is a stored object or a route (immutable, so
    /// the same object has the same fingerprint): held so that its address stays its own.
    item: Option<Value>,
}

/// Keys are fingerprints already: hashing them again would be wasted work.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = value as u64;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type BlockMap = HashMap<Fingerprint, Arc<Block>, BuildHasherDefault<KeyHasher>>;

/// A block and its key.
type KeyedBlock = (Fingerprint, Arc<Block>);

/// One `render_each` call's blocks, in the order it rendered them, and the length of the text
/// they made together (the next call's text is given that room at once: grown by doubling,
/// the megabytes of a call's text were copied again and again).
#[derive(Debug, Default)]
struct Run {
    blocks: Vec<KeyedBlock>,
    output_len: usize,
}

/// A `render_each` call within a render: the fingerprint of its template, name and `with`, and
/// how many calls with that fingerprint came before it in the render.
type Call = (Fingerprint, usize);

/// How far past its place in the last render's order an item's block is looked for before it
/// is looked up by key: an item added or removed moves the rest by one, a changed item is a
/// block of its own.
const LOOKAHEAD: usize = 4;

/// The blocks one successful render used, by the call that rendered them, which the next
/// render may reuse.
#[derive(Debug, Default)]
pub(crate) struct Blocks(HashMap<Call, Run, foldhash::quality::RandomState>);

impl Blocks {
    /// How many blocks are kept.
    pub(crate) fn len(&self) -> usize {
        self.0.values().map(|run| run.blocks.len()).sum()
    }
}

/// One render's view of the blocks: those the last render used, and those this one uses (which
/// replace them if this render is kept). A call finds its blocks in the order it rendered them
/// last time, without hashing; only a call the last render did not make looks blocks up by key.
#[derive(Debug, Default)]
pub(crate) struct RenderBlocks {
    previous: Arc<Blocks>,
    /// Every previous block by key, made the first time a call has no run of its own.
    by_key: std::sync::OnceLock<BlockMap>,
    /// How many calls with each fingerprint this render made so far.
    calls: Mutex<HashMap<Fingerprint, usize, BuildHasherDefault<KeyHasher>>>,
    used: Mutex<Blocks>,
    counts: Mutex<BlockCounts>,
}

/// How many blocks a render reused and how many it rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    /// Blocks replayed from the last render: nothing they read had changed.
    pub reused: u64,
    /// Blocks rendered: new or changed items, or items whose reads changed.
    pub rendered: u64,
}

impl RenderBlocks {
    /// A render that may reuse `previous`.
    pub(crate) fn reusing(previous: Arc<Blocks>) -> Self {
        Self { previous, ..Self::default() }
    }

    /// The blocks this render used, to be reused by the next.
    pub(crate) fn take_used(&self) -> Blocks {
        self.used.lock().map(|mut used| std::mem::take(&mut *used)).unwrap_or_default()
    }

    /// How many blocks this render reused and rendered so far.
    pub(crate) fn counts(&self) -> BlockCounts {
        self.counts.lock().map(|counts| *counts).unwrap_or_default()
    }

    /// The next call with this fingerprint.
    fn call(&self, prefix: Fingerprint) -> Call {
        let Ok(mut calls) = self.calls.lock() else { return (prefix, usize::MAX) };
        let count = calls.entry(prefix).or_default();
        *count += 1;
        (prefix, *count - 1)
    }

    /// Any previous block with this key (a call with no run of its own).
    fn by_key(&self, key: Fingerprint) -> Option<Arc<Block>> {
        let map = self.by_key.get_or_init(|| {
            let mut map = BlockMap::with_capacity_and_hasher(self.previous.len(), Default::default());
            for (key, block) in self.previous.0.values().flat_map(|run| &run.blocks) {
                map.insert(*key, block.clone());
            }
            map
        });
        map.get(&key).cloned()
    }

    fn keep(&self, call: Call, run: Run) {
        if let Ok(mut used) = self.used.lock() {
            used.0.insert(call, run);
        }
    }
}

/// Where a call finds its blocks from the last render: its own run, in order, or by key.
struct Finder<'a> {
    blocks: &'a RenderBlocks,
    run: Option<&'a [KeyedBlock]>,
    /// Where in `run` the next item's block is expected.
    cursor: usize,
    /// Where each block of `run` is, made once the rest of the run was searched
    /// [`SEARCHES_BEFORE_PLACES`] times.
    places: Option<HashMap<Fingerprint, usize, BuildHasherDefault<KeyHasher>>>,
    /// How many times the rest of the run was searched for an item not near the cursor.
    searches: usize,
}

/// How many items not near the cursor a call searches the rest of its run for, one after the
/// other, before it maps the run's keys to their places instead. A search is a scan of keys
/// (microseconds at 10,000 items); the map cost a tenth of a millisecond per thousand items,
/// which a call with one changed item (its block nowhere to be found) paid for nothing.
const SEARCHES_BEFORE_PLACES: usize = 4;

impl<'a> Finder<'a> {
    fn new(blocks: &'a RenderBlocks, run: Option<&'a [KeyedBlock]>) -> Self {
        Self { blocks, run, cursor: 0, places: None, searches: 0 }
    }

    /// The block at the cursor, and its key, when it was rendered for this very item (the same
    /// object, whose fingerprint is then the same without computing it: most items of a render
    /// after a few changes are the objects the last render had, in the same order).
    fn same_item_at_cursor(&mut self, item: &Value) -> Option<KeyedBlock> {
        let address = super::context::object_address(item)?;
        let (key, block) = self.run?.get(self.cursor)?;
        let was = block.item.as_ref().and_then(super::context::object_address)?;
        (was == address).then(|| {
            self.cursor += 1;
            (*key, block.clone())
        })
    }

    fn find(&mut self, key: Fingerprint) -> Option<Arc<Block>> {
        let Some(run) = self.run else { return self.blocks.by_key(key) };
        for (ahead, (found, block)) in run.iter().skip(self.cursor).take(LOOKAHEAD).enumerate() {
            if *found == key {
                self.cursor += ahead + 1;
                return Some(block.clone());
            }
        }
        // Not near the cursor: a changed or new item (no block to find), or the first item
        // after a stretch of changed, added or removed ones longer than the look-ahead (its
        // block further on). Looking no further lost the place for good: every item after five
        // edited Ingresses in a row was rendered again, and under churn most renders rendered
        // nearly every block.
        let place = if self.places.is_none() && self.searches < SEARCHES_BEFORE_PLACES {
            self.searches += 1;
            // Past the cursor first (items added or removed move the rest along), then before it.
            let after = self.cursor.min(run.len());
            let found = |(place, (found, _)): (usize, &KeyedBlock)| (*found == key).then_some(place);
            run[after..]
                .iter()
                .enumerate()
                .find_map(found)
                .map(|place| after + place)
                .or_else(|| run[..after].iter().enumerate().find_map(found))?
        } else {
            let places = self
                .places
                .get_or_insert_with(|| run.iter().enumerate().map(|(place, (key, _))| (*key, place)).collect());
            *places.get(&key)?
        };
        self.cursor = place + 1;
        Some(run[place].1.clone())
    }
}

/// What checking and replaying a block needs of the render: the stores as they are now, and
/// the shared state to replay effects into.
pub(crate) trait RenderState {
    /// The generation of a store now (`None`: no such alias).
    fn generation(&self, alias: &Arc<str>) -> Option<u64>;
    /// Whether no change since `generation` touched an index key of a store (`None`: unknown).
    fn untouched_since(
        &self,
        alias: &Arc<str>,
        generation: u64,
        key: &crate::store::IndexKey,
        digest: crate::store::KeyDigest,
    ) -> Option<bool>;
    /// Whether a store holds exactly `found` under an index key now.
    fn finds(&self, alias: &Arc<str>, key: &crate::store::IndexKey, found: &[Identity]) -> bool;
    /// Makes a block's claims (among its effects) as they came out before, all or none: false,
    /// and nothing claimed, when one would come out otherwise (a name it won taken already, or
    /// one it lost still free).
    fn claim_as_before(&self, effects: &[Effect]) -> bool;
    /// Whether a backend's server slots are `table` now.
    fn slots_are(&self, backend: &str, table: &Arc<SlotTable>) -> bool;
    /// Replays one effect.
    fn replay(&self, effect: &Effect);
}

/// Whether `block`'s reads still find what they found, and its claims and slots would come out
/// the same. A lookup whose store moved on but still finds the same objects notes the store's
/// generation now, so the next check is quick. The claims are made by the check when it passes
/// (see `RenderState::claim_as_before`): checked, then made, each was looked for twice in a set
/// of 20,000 names.
fn still_valid(block: &Block, now: &dyn RenderState) -> bool {
    for read in &block.reads {
        match read {
            Read::Whole { alias, generation } => {
                if now.generation(alias) != Some(*generation) {
                    return false;
                }
            }
            Read::Lookup { alias, generation, key, digest, found } => {
                let Some(current) = now.generation(alias) else { return false };
                if current == generation.get() {
                    continue;
                }
                // The store's recent history usually says the key was not touched; a key that
                // was may still hold the same objects.
                if now.untouched_since(alias, generation.get(), key, *digest) != Some(true)
                    && !now.finds(alias, key, found)
                {
                    return false;
                }
                generation.set(current);
            }
        }
    }
    let slots_kept = block.effects.iter().all(|effect| match effect {
        Effect::Slots { backend, table } => now.slots_are(backend, table),
        _ => true,
    });
    slots_kept && now.claim_as_before(&block.effects)
}

/// The claims among a block's effects: (name, won).
pub(crate) fn claims(effects: &[Effect]) -> impl Iterator<Item = (Fingerprint, bool)> + '_ {
    effects.iter().filter_map(|effect| match effect {
        Effect::Claim { name, won } => Some((*name, *won)),
        _ => None,
    })
}

/// `render_each(template, items, name, with)`: the template rendered once per item (the item
/// as `name`, `with`'s entries beside it), the outputs joined; each block reused from the last
/// render when nothing it read or was given changed.
pub(crate) fn render_each(
    state: &State,
    blocks: &RenderBlocks,
    now: &dyn RenderState,
    template: &str,
    items: &Value,
    name: &str,
    with: Option<&Value>,
) -> Result<super::filters::VettedLines, Error> {
    let compiled = state.env().get_template(template)?;
    let with_fingerprint = match with {
        Some(with) => fingerprint(with),
        None => Some(combine(|_| {})),
    };
    let mut given: BTreeMap<String, Value> = BTreeMap::new();
    for global in ["resources", "extraContext", "shared"] {
        if let Some(value) = state.lookup(global) {
            given.insert(global.to_owned(), value);
        }
    }
    if let Some(with) = with.filter(|with| !with.is_undefined() && !with.is_none()) {
        let keys = with.try_iter().map_err(|_| {
            Error::new(ErrorKind::InvalidOperation, "render_each: `with` is a map of the values the blocks are given")
        })?;
        for key in keys {
            let Some(text) = key.as_str() else { continue };
            given.insert(text.to_owned(), with.get_item(&key)?);
        }
    }
    given.remove(name);
    let given: Arc<[(String, Value)]> = given.into_iter().collect();
    let name_shared: Arc<str> = name.into();
    let prefix = with_fingerprint.map(|with| {
        combine(|digest| {
            template.hash(digest);
            name.hash(digest);
            with.hash(digest);
        })
    });
    let call = prefix.map(|prefix| blocks.call(prefix));
    let previous = call.and_then(|call| blocks.previous.0.get(&call));
    let mut finder = Finder::new(blocks, previous.map(|run| &run.blocks[..]));
    let mut run: Vec<KeyedBlock> = Vec::with_capacity(previous.map_or(0, |run| run.blocks.len()));
    let mut output = String::with_capacity(previous.map_or(0, |run| run.output_len));
    let mut counts = BlockCounts::default();
    let mut each = |item: &Value| -> Result<(), Error> {
        let (key, found) = match finder.same_item_at_cursor(item) {
            Some((key, block)) => (Some(key), Some(block)),
            None => {
                let key = prefix.zip(fingerprint(item)).map(|(prefix, item)| {
                    combine(|digest| {
                        prefix.hash(digest);
                        item.hash(digest);
                    })
                });
                (key, key.and_then(|key| finder.find(key)))
            }
        };
        if let Some(key) = key
            && let Some(block) = found
            && still_valid(&block, now)
        {
            for effect in &block.effects {
                now.replay(effect);
            }
            output.push_str(&block.output);
            hand_to_parent(&block);
            run.push((key, block));
            counts.reused += 1;
            return Ok(());
        }
        counts.rendered += 1;
        let context = BlockContext { given: given.clone(), name: name_shared.clone(), item: item.clone() };
        start_recording();
        let rendered = compiled.render(Value::from_object(context));
        let recording = finish_recording();
        let rendered = rendered?;
        output.push_str(&rendered);
        let block = Arc::new(Block {
            reads: recording.reads,
            effects: recording.effects,
            output: rendered.into_boxed_str(),
            item: super::context::object_address(item).map(|_| item.clone()),
        });
        hand_to_parent(&block);
        if !recording.cacheable {
            record_uncacheable();
        } else if let Some(key) = key {
            run.push((key, block));
        }
        Ok(())
    };
    // Lists and listings are read in place: each item taken out as a value of its own was a
    // count up and down on a shared object, tens of thousands of them per render (a fifth of a
    // render that reused every block was such counts, on objects far apart in memory).
    if let Some(list) = super::context::list_items(items) {
        list.iter().try_for_each(&mut each)?;
    } else if let Some(listing) = super::context::listed_items(items) {
        listing.iter().try_for_each(&mut each)?;
    } else if let Some(mut picked) = super::context::picked_items(items) {
        picked.try_for_each(&mut each)?;
    } else {
        let items = items.try_iter().map_err(|_| {
            Error::new(ErrorKind::InvalidOperation, "render_each: items is a list to render a block for")
        })?;
        for item in items {
            each(&item)?;
        }
    }
    if let Some(call) = call {
        blocks.keep(call, Run { blocks: run, output_len: output.len() });
    }
    if let Ok(mut total) = blocks.counts.lock() {
        total.reused += counts.reused;
        total.rendered += counts.rendered;
    }
    Ok(super::filters::VettedLines(output))
}

/// What one block sees: its item under its name, and what every block of the call is given
/// (the render's globals and `with`'s entries), shared by the call's blocks. Built as a map for
/// every block, the context was a twentieth of a full render (its keys copied, its entries
/// hashed, its values cloned into a map of minijinja's, each block).
#[derive(Debug)]
struct BlockContext {
    /// The globals and `with`'s entries, `with` over the globals, the item's name left out.
    given: Arc<[(String, Value)]>,
    name: Arc<str>,
    item: Value,
}

impl Object for BlockContext {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get_value_by_str(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        if key == &*self.name {
            return Some(self.item.clone());
        }
        self.given.iter().find(|(given, _)| given == key).map(|(_, value)| value.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let keys = std::iter::once(Value::from(&*self.name))
            .chain(self.given.iter().map(|(key, _)| Value::from(key.as_str())));
        Enumerator::Values(keys.collect())
    }
}

/// A block's reads and effects become its enclosing block's too, when blocks nest.
fn hand_to_parent(block: &Block) {
    RECORDINGS.with(|recordings| {
        if let Some(parent) = recordings.borrow_mut().active.last_mut() {
            parent.reads.extend(block.reads.iter().cloned());
            parent.effects.extend(block.effects.iter().cloned());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's last run of blocks, keys 0 to `len - 1` in order.
    fn previous_run(len: u128) -> (RenderBlocks, Call) {
        let call = (Fingerprint(7), 0);
        let blocks: Vec<KeyedBlock> = (0..len)
            .map(|key| {
                let block =
                    Block { reads: Box::new([]), effects: Box::new([]), output: key.to_string().into(), item: None };
                (Fingerprint(key), Arc::new(block))
            })
            .collect();
        let mut previous = Blocks::default();
        previous.0.insert(call, Run { blocks, output_len: 0 });
        (RenderBlocks::reusing(Arc::new(previous)), call)
    }

    /// Which of `keys`, in this order, find their block of the last render.
    fn found(keys: &[u128], len: u128) -> Vec<u128> {
        let (blocks, call) = previous_run(len);
        let mut finder = Finder::new(&blocks, blocks.previous.0.get(&call).map(|run| &run.blocks[..]));
        keys.iter().copied().filter(|key| finder.find(Fingerprint(*key)).is_some()).collect()
    }

    /// Edits come in runs: the bench's churn edits Ingresses one after the other by name, and a
    /// render takes in twenty changes. Items after a stretch of changed, added or removed ones
    /// longer than the look-ahead still find their blocks.
    #[test]
    fn blocks_are_found_after_any_stretch_of_changed_added_or_removed_items() {
        let unchanged: Vec<u128> = (0..40).collect();
        assert_eq!(found(&unchanged, 40), unchanged);
        let changed: Vec<u128> = (0..40).map(|key| if (10..20).contains(&key) { 1000 + key } else { key }).collect();
        let expected: Vec<u128> = (0..40).filter(|key| !(10..20).contains(key)).collect();
        assert_eq!(found(&changed, 40), expected);
        let removed: Vec<u128> = (0..40).filter(|key| !(5..15).contains(key)).collect();
        assert_eq!(found(&removed, 40), removed);
        let added: Vec<u128> = (0..10).chain(1000..1010).chain(10..40).collect();
        assert_eq!(found(&added, 40), unchanged);
        let reordered: Vec<u128> = (20..40).chain(0..20).collect();
        assert_eq!(found(&reordered, 40), reordered);
    }

    /// Blocks keep effects by the tens of thousands: a rare kind (a file) must not make every
    /// push and claim as large as itself.
    #[test]
    fn an_effect_is_no_larger_than_a_push() {
        let size = std::mem::size_of::<super::Effect>();
        assert!(size <= 48, "an Effect takes {size} bytes");
    }
}
