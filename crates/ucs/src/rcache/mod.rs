//! Memory registration cache (UCX's `ucs_rcache`).
//!
//! Registering memory with a device (`ibv_reg_mr`) pins pages and costs tens of microseconds;
//! applications send from and receive into the same buffers again and again. [`Rcache`] keeps
//! registrations after their users are done and hands them out again when a later request
//! falls inside one. It is generic over the registration itself ([`RegBackend`]) and
//! single-threaded (`!Send`, like the rest of uct).
//!
//! # Rules
//! - **Alignment**: a request `[addr, addr + len)` is aligned out to
//!   [`RcacheParams::alignment`] (a power of two from 16 bytes to the page size).
//! - **Hit**: a cached region covering the aligned request whose access flags include the
//!   requested ones (a superset satisfies) is returned with one more user; found by one
//!   ordered-map lookup (O(log n)).
//! - **Miss and merge**: otherwise a new region is registered that spans the request and every
//!   cached region overlapping or adjacent to it, with the union of their access flags; those
//!   regions leave the index at once and are deregistered when their last user releases them.
//!   Repeated registrations of overlapping buffers so converge to one region. If registering
//!   the merged span fails (e.g. a neighbour's memory does not allow the combined access), the
//!   request alone is registered and only the regions overlapping it leave the index. If that
//!   fails too, the error is returned and the cache is unchanged.
//! - **Users**: a [`RcacheHandle`] is one user (clones are more). When the last user of a cached
//!   region drops, the region goes to the back of the LRU list, still registered.
//! - **Limits**: when the cache holds more than [`RcacheParams::max_regions`] regions or
//!   [`RcacheParams::max_size`] bytes, unused regions are deregistered, least recently released
//!   first. Regions in use are never deregistered under their users (the cache may exceed its
//!   limits while they are in use).
//! - **Invalidation**: [`Rcache::invalidate`], [`RcacheHandle::invalidate`] and unmap events
//!   remove every overlapping region from the index at once (no later `get` returns it); an
//!   unused one is deregistered at once, one in use when its last user releases it.
//! - **Unmap events**: each `get` first drains the process-wide events of
//!   [`memhooks`] (two atomic loads when there are none), rounded out to whole
//!   pages, so memory unmapped since the previous call is never served from the cache.
//!
//! # Without unmap events
//! With [`UnmapEvents::Required`] (the default), a cache created where the hooks cannot be
//! installed (other C library, `UCX_MEM_EVENTS=n`, ...) is **disabled**: every `get`
//! registers afresh and the registration ends with its last user, as UCX's memory domains
//! fall back to direct registration. [`UnmapEvents::BestEffort`] (`UCX_RCACHE_UNSAFE_NO_EVENTS=y`)
//! caches anyway: only safe for programs that never unmap or release registered memory while
//! it is cached (or that invalidate it themselves).
//!
//! # Configuration
//! [`RcacheConfig`] reads UCX's `UCX_RCACHE_*` variables; see `docs/ucs/rcache.md`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::mem::ManuallyDrop;
use std::rc::Rc;

use crate::config::{MemUnits, TimeValue, UlUnits};
use crate::memhooks::{self, EventCursor, UnmapEvent};
use crate::Status;

/// Smallest alignment (UCX's `UCS_RCACHE_MIN_ALIGNMENT`, the page table's 16 bytes).
pub const MIN_ALIGNMENT: usize = 16;

/// Granularity of unmap events: the kernel unmaps whole pages.
const EVENT_PAGE: usize = 4096;

/// One registration request, as the cache passes it to [`RegBackend::register`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegRequest {
    /// Start, aligned to the cache's alignment.
    pub addr: usize,
    /// Length, a multiple of the cache's alignment.
    pub len: usize,
    /// Access flags (opaque to the cache; a region with a superset serves a request).
    pub access: u32,
    /// True when the range spans merged regions: the cache retries with the request alone if
    /// this fails, so the backend should not report the failure as an error
    /// (`UCS_RCACHE_MEM_REG_HIDE_ERRORS`).
    pub merged: bool,
}

/// The registration the cache manages (`ucs_rcache_ops_t`): e.g. `ibv_reg_mr`/`ibv_dereg_mr`.
pub trait RegBackend {
    /// A registration (memory region handle, keys).
    type Reg;

    /// Registers `[req.addr, req.addr + req.len)` with `req.access`. May fail (memory not
    /// mapped, access not allowed, resources); must not panic on bad addresses.
    fn register(&self, req: &RegRequest) -> Result<Self::Reg, Status>;

    /// Deregisters. Called exactly once per successful [`register`](Self::register), never
    /// while a handle to the registration exists.
    fn deregister(&self, reg: Self::Reg);
}

/// What a cache does about process-wide unmap events ([`memhooks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnmapEvents {
    /// Install the hooks and consume the events; where hooks are unavailable, do not cache
    /// (every `get` registers, every release deregisters). UCX's behaviour.
    #[default]
    Required,
    /// Install the hooks and consume the events if possible, and cache even without hooks.
    /// Unsafe: memory unmapped and mapped again at the same address may be served with the
    /// old registration. (`UCX_RCACHE_UNSAFE_NO_EVENTS=y`.)
    BestEffort,
    /// Neither install nor consume events: the owner invalidates what it unmaps. For tests
    /// and for memory the owner controls.
    Ignore,
}

/// Cache parameters (`ucs_rcache_params_t`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RcacheParams {
    /// Name for logs.
    pub name: String,
    /// Requests are aligned out to this (power of two, [`MIN_ALIGNMENT`]..=page size).
    pub alignment: usize,
    /// Most regions kept (`UCX_RCACHE_MAX_REGIONS`, default unlimited).
    pub max_regions: usize,
    /// Most bytes kept (`UCX_RCACHE_MAX_SIZE`, default unlimited).
    pub max_size: usize,
    /// Unmap event policy.
    pub events: UnmapEvents,
}

impl Default for RcacheParams {
    fn default() -> Self {
        RcacheParams {
            name: "rcache".into(),
            alignment: MIN_ALIGNMENT,
            max_regions: usize::MAX,
            max_size: usize::MAX,
            events: UnmapEvents::Required,
        }
    }
}

impl RcacheParams {
    /// Parameters from the `UCX_RCACHE_*` configuration.
    pub fn from_config(name: &str, config: &RcacheConfig) -> Self {
        let max_regions = match config.max_regions {
            UlUnits::Value(v) => usize::try_from(v).unwrap_or(usize::MAX),
            UlUnits::Inf | UlUnits::Auto => usize::MAX,
        };
        RcacheParams {
            name: name.to_string(),
            alignment: config.addr_align,
            max_regions,
            max_size: config.max_size.get(usize::MAX, usize::MAX),
            events: if config.unsafe_no_events { UnmapEvents::BestEffort } else { UnmapEvents::Required },
        }
    }
}

crate::config_table! {
    /// Registration cache configuration: UCX's `uct_md_config_rcache_table` (read it with the
    /// memory domain's prefixes, e.g. `&["IB_", ""]` for `UCX_IB_RCACHE_*` then `UCX_RCACHE_*`).
    /// `RCACHE_ADDR_ALIGN` defaults to the IB memory domain's 16 (UCX's other domains use the
    /// cache line size).
    pub struct RcacheConfig {
        pub mem_prio: u32 = ("RCACHE_MEM_PRIO", "1000",
            "Registration cache memory event priority (accepted; events are consumed in order)."),
        pub overhead: TimeValue = ("RCACHE_OVERHEAD", "auto", "Registration cache lookup overhead."),
        pub addr_align: usize = ("RCACHE_ADDR_ALIGN", "16",
            "Registration cache address alignment, must be power of 2 between 16 and system page size."),
        pub max_regions: UlUnits = ("RCACHE_MAX_REGIONS", "inf", "Maximal number of regions in the registration cache."),
        pub max_size: MemUnits = ("RCACHE_MAX_SIZE", "inf", "Maximal total size of registration cache regions."),
        pub max_unreleased: MemUnits = ("RCACHE_MAX_UNRELEASED", "512M",
            "Maximal size of total memory regions in invalidate queue and garbage (accepted; invalidated \
             regions are released as soon as their users are done)."),
        pub purge_on_fork: bool = ("RCACHE_PURGE_ON_FORK", "y", "Purge registration cache upon fork (accepted; not implemented)."),
        pub unsafe_no_events: bool = ("RCACHE_UNSAFE_NO_EVENTS", "n",
            "ucx-rs: keep caching when memory unmap events are unavailable (unsafe if registered memory is \
             unmapped while cached)."),
    }
}

/// Counters (UCX's rcache statistics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcacheStats {
    /// `get` calls.
    pub gets: u64,
    /// Requests served by a cached region.
    pub hits: u64,
    /// Requests that registered.
    pub misses: u64,
    /// Cached regions absorbed into a new, larger region.
    pub merges: u64,
    /// Unused regions deregistered to respect the limits.
    pub evictions: u64,
    /// Regions removed by invalidation (explicit or unmap events).
    pub invalidations: u64,
    /// Unmap events consumed.
    pub unmap_events: u64,
    /// Times events were lost and everything was invalidated.
    pub overflows: u64,
    /// Successful registrations.
    pub regs: u64,
    /// Deregistrations.
    pub deregs: u64,
    /// Failed registrations (a failed merged attempt counts too).
    pub reg_failures: u64,
}

struct Region<R> {
    start: usize,
    end: usize,
    access: u32,
    reg: R,
    /// Handles alive.
    users: Cell<usize>,
    /// In the index (can be returned by `get`).
    cached: Cell<bool>,
    /// Key in the LRU map while unused and cached; 0 otherwise.
    lru_stamp: Cell<u64>,
}

impl<R> Region<R> {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

type RegionRc<R> = Rc<Region<R>>;

struct State<R> {
    /// Cached regions by start address; they never overlap.
    index: BTreeMap<usize, RegionRc<R>>,
    /// Unused cached regions by release order.
    lru: BTreeMap<u64, RegionRc<R>>,
    next_stamp: u64,
    total_size: usize,
    cursor: Option<EventCursor>,
    stats: RcacheStats,
}

impl<R> State<R> {
    /// The cached region covering `[start, end)` with `access`, if any.
    fn lookup(&self, start: usize, end: usize, access: u32) -> Option<&RegionRc<R>> {
        let (_, r) = self.index.range(..=start).next_back()?;
        (r.end >= end && r.access & access == access).then_some(r)
    }

    /// Takes a region out of the index; an unused one goes to `garbage`.
    fn uncache(&mut self, region: RegionRc<R>, garbage: &mut Vec<RegionRc<R>>) {
        self.index.remove(&region.start);
        region.cached.set(false);
        self.total_size -= region.len();
        let stamp = region.lru_stamp.replace(0);
        if stamp != 0 {
            self.lru.remove(&stamp);
        }
        if region.users.get() == 0 {
            garbage.push(region);
        }
    }

    /// First cached region overlapping `[start, end)`.
    fn first_overlap(&self, start: usize, end: usize) -> Option<RegionRc<R>> {
        if let Some((_, r)) = self.index.range(..start).next_back() {
            if r.end > start {
                return Some(r.clone());
            }
        }
        self.index.range(start..end).next().map(|(_, r)| r.clone())
    }

    /// Uncaches every region overlapping `[start, end)`; returns how many.
    fn invalidate(&mut self, start: usize, end: usize, garbage: &mut Vec<RegionRc<R>>) -> usize {
        let mut n = 0;
        while let Some(r) = self.first_overlap(start, end) {
            self.uncache(r, garbage);
            n += 1;
        }
        n
    }

    fn invalidate_all(&mut self, garbage: &mut Vec<RegionRc<R>>) -> usize {
        let n = self.index.len();
        for (_, r) in std::mem::take(&mut self.index) {
            r.cached.set(false);
            r.lru_stamp.set(0);
            if r.users.get() == 0 {
                garbage.push(r);
            }
        }
        self.lru.clear();
        self.total_size = 0;
        n
    }

    /// Applies the unmap events since the last call.
    fn drain_events(&mut self, garbage: &mut Vec<RegionRc<R>>) {
        let Some(mut cursor) = self.cursor.take() else { return };
        if cursor.has_events() {
            let mut invalidated = 0;
            let mut overflows = 0;
            let n = cursor.poll(|event| match event {
                UnmapEvent::Range { addr, len } => {
                    let start = addr & !(EVENT_PAGE - 1);
                    let end = addr.saturating_add(len).checked_next_multiple_of(EVENT_PAGE).unwrap_or(usize::MAX);
                    invalidated += self.invalidate(start, end, garbage);
                }
                UnmapEvent::All => {
                    overflows += 1;
                    invalidated += self.invalidate_all(garbage);
                }
            });
            self.stats.unmap_events += n as u64;
            self.stats.overflows += overflows;
            self.stats.invalidations += invalidated as u64;
        }
        self.cursor = Some(cursor);
    }

    /// Deregisters unused regions, least recently released first, while over a limit.
    fn evict(&mut self, max_regions: usize, max_size: usize, garbage: &mut Vec<RegionRc<R>>) {
        while self.index.len() > max_regions || self.total_size > max_size {
            let Some((_, r)) = self.lru.pop_first() else { break };
            r.lru_stamp.set(0);
            self.uncache(r, garbage);
            self.stats.evictions += 1;
        }
    }
}

struct Shared<B: RegBackend> {
    backend: B,
    params: RcacheParams,
    /// Why the cache does not cache, if it does not.
    disabled: Option<String>,
    state: RefCell<State<B::Reg>>,
}

impl<B: RegBackend> Shared<B> {
    /// Deregisters regions that left every structure (outside any borrow of the state).
    fn free(&self, garbage: Vec<RegionRc<B::Reg>>) {
        if garbage.is_empty() {
            return;
        }
        self.state.borrow_mut().stats.deregs += garbage.len() as u64;
        for region in garbage {
            match Rc::into_inner(region) {
                Some(region) => self.backend.deregister(region.reg),
                None => debug_assert!(false, "rcache: a region to deregister is still referenced"),
            }
        }
    }

    fn handle(self: &Rc<Self>, region: RegionRc<B::Reg>) -> RcacheHandle<B> {
        RcacheHandle { shared: self.clone(), region: ManuallyDrop::new(region) }
    }

    /// Registers `req`; records the outcome.
    fn register(&self, req: &RegRequest) -> Result<B::Reg, Status> {
        let result = self.backend.register(req);
        let mut st = self.state.borrow_mut();
        match result {
            Ok(_) => st.stats.regs += 1,
            Err(_) => st.stats.reg_failures += 1,
        }
        result
    }
}

/// A memory registration cache. See the [module documentation](self).
pub struct Rcache<B: RegBackend> {
    shared: Rc<Shared<B>>,
}

impl<B: RegBackend> Rcache<B> {
    /// Creates a cache (`ucs_rcache_create`). Fails with `InvalidParam` for a bad alignment.
    /// Installs the unmap hooks unless `params.events` is [`UnmapEvents::Ignore`]; see
    /// [`UnmapEvents`] for what happens when they are unavailable.
    pub fn new(backend: B, params: RcacheParams) -> Result<Self, Status> {
        let page = page_size();
        if !params.alignment.is_power_of_two() || params.alignment < MIN_ALIGNMENT || params.alignment > page {
            tracing::error!(
                "{}: invalid rcache alignment ({}): must be a power of 2 between {MIN_ALIGNMENT} and {page}",
                params.name,
                params.alignment
            );
            return Err(Status::InvalidParam);
        }
        let (disabled, cursor) = match params.events {
            UnmapEvents::Ignore => (None, None),
            policy => {
                // The cursor starts before the hooks exist: nothing is cached yet anyway.
                let cursor = Some(EventCursor::new());
                match memhooks::install() {
                    Ok(()) => (None, cursor),
                    Err(_) => {
                        let why = memhooks::status().reason().unwrap_or("memory hooks unavailable").to_string();
                        if policy == UnmapEvents::BestEffort {
                            tracing::warn!("{}: caching without memory unmap events ({why}): unsafe", params.name);
                            (None, cursor)
                        } else {
                            tracing::debug!("{}: registration cache disabled: {why}", params.name);
                            (Some(why), None)
                        }
                    }
                }
            }
        };
        let state = State {
            index: BTreeMap::new(),
            lru: BTreeMap::new(),
            next_stamp: 1,
            total_size: 0,
            cursor,
            stats: RcacheStats::default(),
        };
        Ok(Rcache { shared: Rc::new(Shared { backend, params, disabled, state: RefCell::new(state) }) })
    }

    /// Returns a registration covering `[addr, addr + len)` with at least `access`, from the
    /// cache or newly registered (`ucs_rcache_get`). `InvalidParam` for an empty or wrapping
    /// range; a registration error is returned as is (the cache is then unchanged).
    pub fn get(&self, addr: usize, len: usize, access: u32) -> Result<RcacheHandle<B>, Status> {
        let sh = &self.shared;
        let align = sh.params.alignment;
        if len == 0 {
            return Err(Status::InvalidParam);
        }
        let start = addr & !(align - 1);
        let end = addr.checked_add(len).and_then(|e| e.checked_next_multiple_of(align)).ok_or(Status::InvalidParam)?;
        if sh.disabled.is_some() {
            return self.get_uncached(start, end, access);
        }

        let mut garbage = Vec::new();
        let mut st = sh.state.borrow_mut();
        st.stats.gets += 1;
        st.drain_events(&mut garbage);
        if let Some(region) = st.lookup(start, end, access).cloned() {
            st.stats.hits += 1;
            let users = region.users.get();
            region.users.set(users + 1);
            let stamp = region.lru_stamp.replace(0);
            if stamp != 0 {
                st.lru.remove(&stamp);
            }
            drop(st);
            sh.free(garbage);
            return Ok(sh.handle(region));
        }

        // Miss: span the request and every region overlapping or adjacent to it.
        let (mut m_start, mut m_end, mut m_access) = (start, end, access);
        if let Some((_, r)) = st.index.range(..start).next_back() {
            if r.end >= start {
                m_start = r.start;
                m_end = m_end.max(r.end);
                m_access |= r.access;
            }
        }
        for (_, r) in st.index.range(start..=end) {
            m_end = m_end.max(r.end);
            m_access |= r.access;
        }
        st.stats.misses += 1;
        drop(st);
        sh.free(garbage);

        let merged = (m_start, m_end, m_access) != (start, end, access);
        let req = RegRequest { addr: m_start, len: m_end - m_start, access: m_access, merged };
        let (reg, req) = match sh.register(&req) {
            Ok(reg) => (reg, req),
            Err(e) if !merged => return Err(e),
            Err(_) => {
                tracing::debug!(
                    "{}: registering merged {m_start:#x}..{m_end:#x} failed, retrying alone",
                    sh.params.name
                );
                let req = RegRequest { addr: start, len: end - start, access, merged: false };
                (sh.register(&req)?, req)
            }
        };

        let region = Rc::new(Region {
            start: req.addr,
            end: req.addr + req.len,
            access: req.access,
            reg,
            users: Cell::new(1),
            cached: Cell::new(true),
            lru_stamp: Cell::new(0),
        });
        let mut garbage = Vec::new();
        let mut st = sh.state.borrow_mut();
        // Recomputed now, so the index stays free of overlaps whatever the backend did.
        while let Some(old) = st.first_overlap(region.start, region.end) {
            st.uncache(old, &mut garbage);
            st.stats.merges += 1;
        }
        st.index.insert(region.start, region.clone());
        st.total_size += region.len();
        st.evict(sh.params.max_regions, sh.params.max_size, &mut garbage);
        drop(st);
        sh.free(garbage);
        Ok(sh.handle(region))
    }

    fn get_uncached(&self, start: usize, end: usize, access: u32) -> Result<RcacheHandle<B>, Status> {
        let sh = &self.shared;
        {
            let mut st = sh.state.borrow_mut();
            st.stats.gets += 1;
            st.stats.misses += 1;
        }
        let req = RegRequest { addr: start, len: end - start, access, merged: false };
        let reg = sh.register(&req)?;
        let region = Rc::new(Region {
            start,
            end,
            access,
            reg,
            users: Cell::new(1),
            cached: Cell::new(false),
            lru_stamp: Cell::new(0),
        });
        Ok(sh.handle(region))
    }

    /// Removes every cached region overlapping `[addr, addr + len)` (unused ones are
    /// deregistered now, others when released); returns how many.
    pub fn invalidate(&self, addr: usize, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let mut garbage = Vec::new();
        let n = {
            let mut st = self.shared.state.borrow_mut();
            let n = st.invalidate(addr, addr.saturating_add(len), &mut garbage);
            st.stats.invalidations += n as u64;
            n
        };
        self.shared.free(garbage);
        n
    }

    /// Removes every cached region (UCX's purge); returns how many.
    pub fn invalidate_all(&self) -> usize {
        let mut garbage = Vec::new();
        let n = {
            let mut st = self.shared.state.borrow_mut();
            let n = st.invalidate_all(&mut garbage);
            st.stats.invalidations += n as u64;
            n
        };
        self.shared.free(garbage);
        n
    }

    /// Applies pending unmap events now (every `get` does it first).
    pub fn poll_events(&self) {
        let mut garbage = Vec::new();
        self.shared.state.borrow_mut().drain_events(&mut garbage);
        self.shared.free(garbage);
    }

    /// Counters.
    pub fn stats(&self) -> RcacheStats {
        self.shared.state.borrow().stats
    }

    /// Regions in the cache (in use or not).
    pub fn num_regions(&self) -> usize {
        self.shared.state.borrow().index.len()
    }

    /// Regions in the cache that no handle uses (the LRU list).
    pub fn unused_regions(&self) -> usize {
        self.shared.state.borrow().lru.len()
    }

    /// Bytes covered by the regions in the cache.
    pub fn total_size(&self) -> usize {
        self.shared.state.borrow().total_size
    }

    /// False when the cache was created disabled (see [`UnmapEvents::Required`]).
    pub fn is_caching(&self) -> bool {
        self.shared.disabled.is_none()
    }

    /// Why the cache is disabled, if it is.
    pub fn disabled_reason(&self) -> Option<&str> {
        self.shared.disabled.as_deref()
    }

    /// True when the cache consumes unmap events with the hooks installed.
    pub fn has_unmap_events(&self) -> bool {
        self.shared.state.borrow().cursor.is_some() && memhooks::status().is_installed()
    }

    /// The parameters it was created with.
    pub fn params(&self) -> &RcacheParams {
        &self.shared.params
    }

    /// The registration backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }
}

impl<B: RegBackend> Drop for Rcache<B> {
    /// Deregisters the unused regions; regions still in use are deregistered when their last
    /// handle drops (handles keep the backend alive).
    fn drop(&mut self) {
        let mut garbage = Vec::new();
        self.shared.state.borrow_mut().invalidate_all(&mut garbage);
        self.shared.free(garbage);
    }
}

impl<B: RegBackend> fmt::Debug for Rcache<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.borrow();
        f.debug_struct("Rcache")
            .field("name", &self.shared.params.name)
            .field("caching", &self.is_caching())
            .field("regions", &st.index.len())
            .field("total_size", &st.total_size)
            .field("stats", &st.stats)
            .finish()
    }
}

/// One user of a registered region (`ucs_rcache_region_t` held by `ucs_rcache_get`, released
/// by `ucs_rcache_region_put` on drop). Clones are more users of the same region.
pub struct RcacheHandle<B: RegBackend> {
    shared: Rc<Shared<B>>,
    /// Taken out only in `drop`.
    region: ManuallyDrop<RegionRc<B::Reg>>,
}

impl<B: RegBackend> RcacheHandle<B> {
    /// The registration.
    pub fn reg(&self) -> &B::Reg {
        &self.region.reg
    }

    /// Start of the registered region (may be below the requested address).
    pub fn address(&self) -> usize {
        self.region.start
    }

    /// Length of the registered region.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Always false: regions are never empty. (For `len`'s sake.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// End (exclusive) of the registered region.
    pub fn end(&self) -> usize {
        self.region.end
    }

    /// Access flags the region was registered with.
    pub fn access(&self) -> u32 {
        self.region.access
    }

    /// True while the region is in the cache (not invalidated, merged away or evicted).
    pub fn is_cached(&self) -> bool {
        self.region.cached.get()
    }

    /// Removes the region from the cache (`ucs_rcache_region_invalidate`): no later `get`
    /// returns it, and it is deregistered when its last handle drops.
    pub fn invalidate(&self) {
        if !self.region.cached.get() {
            return;
        }
        let mut garbage = Vec::new();
        {
            let mut st = self.shared.state.borrow_mut();
            st.uncache(RegionRc::clone(&self.region), &mut garbage);
            st.stats.invalidations += 1;
        }
        debug_assert!(garbage.is_empty(), "a region with a handle is in use");
    }
}

impl<B: RegBackend> Clone for RcacheHandle<B> {
    fn clone(&self) -> Self {
        self.region.users.set(self.region.users.get() + 1);
        RcacheHandle { shared: self.shared.clone(), region: ManuallyDrop::new(RegionRc::clone(&self.region)) }
    }
}

impl<B: RegBackend> Drop for RcacheHandle<B> {
    fn drop(&mut self) {
        // SAFETY: `region` is taken exactly once, here, and not used afterwards.
        let region = unsafe { ManuallyDrop::take(&mut self.region) };
        let users = region.users.get() - 1;
        region.users.set(users);
        if users > 0 {
            return;
        }
        let sh = &self.shared;
        let mut garbage = Vec::new();
        if region.cached.get() {
            let mut st = sh.state.borrow_mut();
            let stamp = st.next_stamp;
            st.next_stamp += 1;
            region.lru_stamp.set(stamp);
            st.lru.insert(stamp, region);
            st.evict(sh.params.max_regions, sh.params.max_size, &mut garbage);
        } else {
            garbage.push(region);
        }
        sh.free(garbage);
    }
}

impl<B: RegBackend> fmt::Debug for RcacheHandle<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RcacheHandle")
            .field("address", &format_args!("{:#x}", self.region.start))
            .field("len", &self.region.len())
            .field("access", &format_args!("{:#x}", self.region.access))
            .field("cached", &self.region.cached.get())
            .field("users", &self.region.users.get())
            .finish()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).ok().filter(|p| p.is_power_of_two()).unwrap_or(EVENT_PAGE)
}

#[cfg(test)]
mod tests;
